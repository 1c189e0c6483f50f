"""benchmarks/gpu_check.py, the prepared GPU check: its CPU dry run (every part at tiny sizes, ppo_ddp launched by
torchrun on gloo) writes the report and the JSON with a status and a wall time for each part, and nothing in it
fails; the host-sync counter and the micro-batch search on made-up input."""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
import warnings
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check

REPO = Path(__file__).resolve().parents[1]

TRAINERS = ["ppo_continuous", "grpo", "ppo_ddp", "ppo_recurrent", "ppo_vla", "grpo_vla", "ppo_vla_async", "ppo_vla_ddp"]


def vla_extra() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("peft", "transformers"))


@pytest.mark.skipif(not vla_extra() and not os.environ.get("CI"), reason="the VLA parts need the vla extra")
def test_the_dry_run_writes_a_report_and_every_part_passes(tmp_path):
    data = gpu_check.main(gpu_check.Args(dry_run=True, out=str(tmp_path)))
    report, saved = tmp_path / "report.md", json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved == json.loads(json.dumps(data, default=str))
    assert "DRY RUN on the CPU" in report.read_text()
    assert saved["dry_run"] and {"name", "driver", "torch", "cuda"} <= set(saved["device"])
    assert set(saved["parts"]) == {*gpu_check.PARTS, *gpu_check.OWN_RUN_PARTS}
    assert saved["parts"]["mjlab"]["status"] == "skipped"  # a run of its own (`--parts mjlab`)
    info = saved["info"]  # what ran: read inside the worker (an import error there would leave only "error")
    assert "error" not in info and info["versions"]["torch"] == torch.__version__ and info["git"]["git_sha"], info
    for name, part in ((n, saved["parts"][n]) for n in gpu_check.PARTS):
        assert isinstance(part["wall_s"], float), name
        assert part["status"] == "ok", (name, part.get("error"), [(i["name"], i.get("error")) for i in part["items"]])
        for item in part["items"]:
            assert item["status"] in ("ok", "skipped") and isinstance(item["wall_s"], float), (name, item)
    tests = saved["parts"]["tests"]["items"][0]["metrics"]
    assert tests["tests"] > 0 and tests["skipped"] == tests["tests"]  # `-m cuda` finds the CUDA tests; no CUDA here
    trainers = {item["name"]: item for item in saved["parts"]["trainers"]["items"]}
    assert set(trainers) == {*TRAINERS, "ppo_vla_ddp --fsdp"}
    assert trainers["ppo_ddp"]["launcher"] == "torchrun, 1 rank (gloo)"
    for item in trainers.values():  # ran 2 iterations, resumed for a third, and found its rollout loop
        assert item["checks"] == {"runs": True, "rollout_loop_found": True, "resumes": True}, item["name"]
    ppo = {item["name"]: item for item in saved["parts"]["ppo"]["items"]}
    assert ppo["eager"]["metrics"]["steady_sps"] > 0 and ppo["compile + cudagraphs"]["status"] == "skipped"
    assert ppo["cudagraphs"]["status"] == "skipped" and ppo["compile"]["status"] == "skipped"
    assert ppo["--compile auto's choice"]["status"] == "skipped"  # (no compiled figure to compare on the CPU)
    assert [e[0] for e in ppo["time to eval success 0.9 (eager)"]["metrics"]["evals"]] == [64, 128]
    for item in saved["parts"]["vla"]["items"]:
        assert item["metrics"]["micro_batch_size"] == item["metrics"]["minibatch_size"]
        assert item["checks"] == {"checkpointing_as_asked": True}
    to_success = ppo["time to eval success 0.9 (eager)"]["metrics"]  # the training episodes' crossing, for rsl_rl's
    assert {"train_env_steps_to_0_9", "train_s_to_0_9"} <= set(to_success)
    rsl_rl = {item["name"]: item for item in saved["parts"]["rsl_rl"]["items"]}
    assert list(rsl_rl) == list(gpu_check.RSL_RL_MODES)
    assert all("-m benchmarks.peers.rsl_rl_push_cube --device cpu" in i["command"] for i in rsl_rl.values())
    assert rsl_rl['rsl_rl, torch_compile_mode="default"']["status"] == "skipped"  # no compiling in the dry run
    assert "## 6. rsl_rl" in report.read_text()


@pytest.mark.parametrize("script", TRAINERS)
def test_each_trainer_has_one_rollout_loop_for_the_sync_count(script):
    assert len(gpu_check.rollout_loop_lines(REPO / "cleanrl_embodied" / f"{script}.py")) == 1


SOURCE = """
import warnings


def run(message):
    warnings.warn(message)  # before the loop
    for step in range(3):
        warnings.warn(message)
    warnings.warn("something else")
"""


def test_the_sync_counter_counts_the_syncs_inside_the_loop(tmp_path):
    """The hook as CUDA's sync check drives it (here by hand: no CUDA needed): a warning whose message starts with
    PyTorch's is counted, as in the loop where a frame of the file lies inside `for step in range(...)`; other
    warnings go on as before."""
    path = tmp_path / "fake_trainer.py"
    path.write_text(SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        fake = importlib.import_module("fake_trainer")
    finally:
        sys.path.remove(str(tmp_path))
    counter = gpu_check.SyncCounter(path, cuda=False)
    assert counter.loops == [(7, 8)]
    with pytest.warns(UserWarning, match="something else"), counter:
        fake.run(gpu_check.SYNC_MESSAGE + " (Triggered internally at CUDAFunctions.cpp:1.)")
    assert (counter.total, counter.in_loop, counter.in_loop_trainer) == (4, 3, 0)  # the file is not cleanrl_embodied's
    assert list(counter.where.values()) == [3] and next(iter(counter.where)).endswith("fake_trainer.py:8")
    with warnings.catch_warnings(record=True) as seen:  # the hook is gone
        warnings.simplefilter("always")
        fake.run(gpu_check.SYNC_MESSAGE)
    assert len(seen) == 5 and counter.total == 4


def test_a_sync_is_the_policys_when_its_code_is_on_the_stack():
    """Who owns a sync in the rollout loop: the trainer (and the env, and shared/) unless a frame of the policy's code
    lies between the loop and the sync; a shared helper the policy calls (the prompt cache decoding instructions)
    is the policy's sync, an env step under the loop is the trainer's."""
    trainer = REPO / "cleanrl_embodied" / "ppo_vla.py"
    counter = gpu_check.SyncCounter(trainer, cuda=False)
    ((first, _),) = counter.loops

    def frame(path, line=1):
        return traceback.FrameSummary(str(path), line, "f")

    loop = frame(trainer, first + 1)
    tokenizer = frame(REPO / "examples" / "hf_vla" / "tokenizer.py", 91)
    language = frame(REPO / "cleanrl_embodied" / "shared" / "language.py", 84)
    franka = frame(REPO / "cleanrl_embodied" / "shared" / "envs" / "push_cube" / "franka.py", 78)
    counter.record([loop, tokenizer, language], "x", 1)  # the policy's, though innermost in shared/
    counter.record([loop, franka], "x", 1)  # the env's: the trainer's side
    counter.record([frame(trainer, 1), franka], "x", 1)  # outside the loop
    assert (counter.total, counter.in_loop, counter.in_loop_trainer) == (3, 2, 1)
    assert counter.where == {
        "cleanrl_embodied/shared/language.py:84": 1,
        "cleanrl_embodied/shared/envs/push_cube/franka.py:78": 1,
    }


def test_the_micro_batch_search_halves_until_one_fits():
    def run(size: int) -> str:
        if size > 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return f"ran {size}"

    def is_oom(e: BaseException) -> bool:
        return isinstance(e, torch.OutOfMemoryError)

    assert gpu_check.micro_batch_sizes(64) == [64, 32, 16, 8, 4, 2, 1]
    assert gpu_check.first_that_fits([64, 32, 16, 8, 4], run, is_oom) == (8, "ran 8", [64, 32, 16])
    with pytest.raises(RuntimeError, match="out of memory at every micro-batch size"):
        gpu_check.first_that_fits([64, 32], run, is_oom)

    def broken(size: int) -> None:
        raise ValueError("not a memory problem")

    with pytest.raises(ValueError):  # only running out of memory moves on to a smaller size
        gpu_check.first_that_fits([64, 32], broken, is_oom)


H200 = {"eager": 221_697, "compile": 187_905, "compile + cudagraphs": 277_303}
"""Steady env steps/s of ppo_continuous at 4096 envs on an H200 (docs/results/gpu-h200-2026-11-26): the figures
`--compile auto`'s rule on CUDA comes from (eager with CUDA graphs was not measured then)."""


def test_the_ppo_part_checks_that_compile_auto_picks_the_faster_variant():
    """On the H200's figures, auto's CUDA pick without CUDA graphs (eager) is the faster, and with them (compiled)
    the only one measured; a device where compiling without CUDA graphs were faster would fail the check, as would
    eager CUDA graphs beating the compiled ones. On the CPU each run measures, so there is no pick to judge."""
    metrics, checks = gpu_check.auto_choice("cuda", H200)
    assert metrics["picks (without cudagraphs)"] == "eager" and metrics["faster (without cudagraphs)"] == "eager"
    assert metrics["picks (with cudagraphs)"] == "compile + cudagraphs"
    assert checks == {"picks the faster (without cudagraphs)": True}  # eager CUDA graphs: not measured
    _, checks = gpu_check.auto_choice("cuda", {**H200, "compile": 250_000, "cudagraphs": 290_000})
    assert checks == {"picks the faster (without cudagraphs)": False, "picks the faster (with cudagraphs)": False}
    _, checks = gpu_check.auto_choice("cuda", {**H200, "compile": 226_000, "cudagraphs": 280_000})  # within 3%
    assert checks == {"picks the faster (without cudagraphs)": True, "picks the faster (with cudagraphs)": True}
    metrics, checks = gpu_check.auto_choice("cpu", {"eager": 100.0, "compile": 120.0})
    assert metrics["picks (without cudagraphs)"] == "measured in the run" and checks == {}  # each CPU run decides


def test_a_gpu_report_and_its_section_of_the_benchmarks_page(tmp_path):
    """The report and the docs section of a run on a GPU, from a made-up record (the dry run only writes the CPU's):
    the device and versions, the host-sync cell, and a link the docs site resolves."""
    syncs = {"active": True, "loop_found": True, "total": 9, "rollout_loop": 8, "rollout_loop_trainer": 0,
             "rollout_loop_policy": 8, "rollout_steps": 4, "where": {"examples/hf_vla/tokenizer.py:88": 8}}  # fmt: skip
    item = {"name": "ppo_vla", "status": "ok", "launcher": "in-process", "wall_s": 3.0, "command": "python x.py",
            "checks": {"runs": True, "no_rollout_sync": True}, "metrics": {"sps": 100, "syncs": syncs}}  # fmt: skip
    failed = {"name": "ppo_ddp", "status": "fail", "wall_s": 1.0, "error": "RuntimeError: a | b", "checks": {},
              "metrics": {}}  # fmt: skip
    data = {
        "dry_run": False, "started": "2026-01-01T00:00:00", "wall_s": 400.0, "command": "python gpu_check.py",
        "device": {"name": "Made-up GPU", "driver": "999.1", "memory_gib": 80.0, "torch": "2.x", "cuda": "12.8"},
        "budgets_s": {"trainers": 130.0}, "info": {"versions": {"cudnn": 91000}, "git": {"git_sha": "abc"}},
        "parts": {"trainers": {"status": "fail", "wall_s": 4.0, "items": [item, failed]}},
    }  # fmt: skip
    text = gpu_check.report(data)
    assert text.startswith("# GPU check: Made-up GPU") and "DRY RUN" not in text
    assert "driver: 999.1; torch 2.x, CUDA 12.8, cuDNN 91000" in text
    assert "0 trainer/env + 8 policy in 4 rollout steps (9 in the run): `examples/hf_vla/tokenizer.py:88` x8" in text
    assert "fail: RuntimeError: a \\| b" in text  # a table cell
    out = REPO / "docs" / "results" / "gpu-made-up-gpu-2026-01-01"
    md = tmp_path / "benchmarks.md"
    gpu_check.write_section(md, "gpu-check", gpu_check.section(data, out))
    assert "[report](results/gpu-made-up-gpu-2026-01-01/report.md)" in md.read_text()
    assert gpu_check.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_the_rsl_rl_side_by_side_sets_each_sides_faster_variant_against_the_other():
    """The report's line from made-up parts: ours' fastest steady SPS over rsl_rl's fastest, and the seconds until the
    training episodes succeed 90% of the time (ours from the ppo part's time-to-0.9 run, rsl_rl's quickest); items
    that failed or were skipped count for nothing, and with one side missing the line says so."""

    def item(name, status="ok", **metrics):
        return {"name": name, "status": status, "metrics": metrics}

    parts = {
        "ppo": {"items": [item("eager", steady_sps=200_000), item("compile + cudagraphs", steady_sps=300_000),
                          item("compile", "fail", steady_sps=900_000),
                          item("time to eval success 0.9 (eager)", train_s_to_0_9=10.0)]},
        "rsl_rl": {"items": [item("rsl_rl, eager", steady_sps=150_000, train_s_to_0_9=20.0),
                             item("rsl_rl, compiled", steady_sps=120_000, train_s_to_0_9=25.0)]},
    }  # fmt: skip
    (line, _) = gpu_check.side_by_side(parts)
    assert "ours (compile + cudagraphs) 300,000 against rsl_rl (rsl_rl, eager) 150,000: **2.00x**" in line
    assert "ours (eager) 10 against rsl_rl (rsl_rl, eager) 20: **2.00x**" in line
    parts["rsl_rl"]["items"] = [item("rsl_rl, eager", "skipped")]
    assert gpu_check.side_by_side(parts)[0] == "Side by side: not both sides measured."
    assert gpu_check.first_at([0, 1, 2], [0.5, 0.91, 0.95], [10.0, 11.0, 12.0]) == (1, 11.0)
    assert gpu_check.first_at([0, 1], [0.5, 0.6], [10.0, 11.0]) == (None, None)
