"""One prepared check of the project on a GPU in one command, under 10 min on one H100/H200; a dry run on a CPU.

    uv run python benchmarks/gpu_check.py                  # on a lent GPU: writes docs/results/gpu-<device>-<date>/
    uv run python benchmarks/gpu_check.py --dry-run        # CPU, tiny sizes, seconds: to a new temp folder (CI)
    uv run python benchmarks/gpu_check.py --parts env ppo --timeout.ppo 200
    python benchmarks/gpu_check.py --parts mjlab          # part 7 alone, with mjlab installed (see there)

Parts, each in its own worker process (the dry run: all in one) with its own time budget (`--timeout.<part>`
seconds); inside a part every item is a try-block, so one failure is reported and the rest still runs; a part
that runs past its budget is killed and keeps the items it finished:

1. tests: the test suite's CUDA tests (`pytest -m cuda`: tests/conftest.py marks every test skipped for lack of
   CUDA with `cuda`).
2. trainers: each trainer of both families for 2 iterations on CUDA, then a resume from its last.pt for a third,
   counting the host syncs in the rollout loop (below); ppo_ddp and ppo_vla_ddp (also `--fsdp`) on one rank over
   NCCL under torchrun. The VLA family runs the tiny examples/hf_vla policy with bins, chunks and bf16 autocast.
3. env: PushCubeRL env-steps/s at 4096, 16384 and 65536 envs (common.py's `env_throughput`, speed.py's measure).
4. ppo: ppo_continuous on PushCubeRL at 4096 envs: steady SPS eager, `--cudagraphs` (eager), `--compile on`,
   `--compile on --cudagraphs`, the same sizes each; whether what `--compile auto` picks on this device for a long
   run (shared.compile_choice), without and with `--cudagraphs`, is the faster of the two it picks between; and a
   run with an evaluation every 2 iterations for the env steps and the time to eval success >= 0.9 (capped).
5. vla: a VLA at PaliGemma-3B's widths (Gemma 2B: hidden 2048, MLP 16384, 8 heads of 256, one KV head,
   vocabulary 257216; SigLIP so400m: hidden 1152, MLP 4304, 16 heads, 14-pixel patches of 224x224 images) with 2
   layers each (`--vla-layers`), random bf16 weights, LoRA (rank 16, every linear layer), bf16 autocast: peak GPU
   memory and env-steps/s of a ppo_vla and a grpo_vla iteration with gradient checkpointing, and ppo_vla without,
   each at the largest micro-batch size that fits (tried from the minibatch size down, halving).
6. rsl_rl: rsl_rl 5.5.1's PPO (benchmarks/peers/rsl_rl_push_cube.py, ours' settings, as peers/vs_rsl_rl.py runs it
   on the CPU) on part 4's setting, eager and `torch_compile_mode="default"`: steady SPS, the env steps and seconds
   until its training episodes succeed 90% of the time, its final evaluation; the report sets each side's faster
   variant beside the other's. rsl_rl is not a dependency: on the GPU machine it is installed from wheels, as
   tensordict and tyro are (docs/results/gpu-h200-2026-11-26/README.md); where it is missing the items are skipped.
7. mjlab (only with `--parts mjlab`, a run of its own): `Mjlab-Velocity-Flat-Unitree-Go1` at 4096 envs for 50
   iterations of its recipe, ppo_continuous and then mjlab's own train script (rsl_rl), as peers/vs_mjlab.py pairs
   them on the CPU: steady env steps/s and the training return reached; then `Mjlab-Lift-Cube-Yam` while the budget
   lasts. Not in the default run: mjlab's packages that a GPU image lacks are about 300 MiB of wheels (warp-lang's
   alone 142 MiB), more than one command's transfer to an offline machine holds, and Warp compiles its kernels on
   the first step; `benchmarks/gpu_wheels.py` downloads them at uv.lock's versions in pieces that fit.

Host syncs: the trainers part runs each trainer under `torch.cuda.set_sync_debug_mode("warn")`, which makes every
synchronizing CUDA call that goes through PyTorch's sync check (`.item()`, `.tolist()`, `float(t)`, `if t:`,
device-to-host copies, `nonzero`, boolean-mask indexing, ...) raise a Python warning while the process keeps
running; a `warnings.showwarning` hook takes the Python stack at each one and counts it as in the rollout loop
when a frame of the trainer's file lies inside its `for step in range(...)` loop (found with `ast`; also on the
ppo_vla_async collector thread). Each sync is named by its innermost frame outside Python's and the installed
libraries' files, and counted as the policy's when any frame of the stack is in the --policy code (outside
cleanrl_embodied/, e.g. examples/hf_vla, whose prompt cache documents two syncs per call, also through a shared
helper it calls), else as the trainer's (trainer, shared, envs: these must be zero). Counting
cudaStreamSynchronize calls with the profiler was not chosen: placing them in the
rollout loop needs the loop marked as a region (`record_function`) inside each trainer, which this check leaves
unedited, while the debug mode needs no change to them. Not seen by this one: a sync that does not pass through
PyTorch's check (e.g. a blocking `cudaMemcpy` from pageable host memory).

Writes `report.md` and `gpu_check.json` (device, driver, torch, CUDA, cuDNN and library versions, each part's
status, wall time and figures) to `--out`, and on a GPU the `gpu-check` section of docs/benchmarks.md. The run
directories go to `<out>/runs/` (git-ignored), each item's output to `<out>/logs/`.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import datetime
import functools
import gc
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tyro

from benchmarks import real_width_vla
from benchmarks.common import REPO, RESULTS_MD, md_table, write_section
from benchmarks.real_width_vla import LAST_BUILD, PALIGEMMA_3B

Part = Literal["tests", "trainers", "env", "ppo", "vla", "rsl_rl", "mjlab"]
PARTS: tuple[str, ...] = ("tests", "trainers", "env", "ppo", "vla", "rsl_rl")
"""the default run"""
OWN_RUN_PARTS: tuple[str, ...] = ("mjlab",)
"""parts only `--parts` runs: their packages are more than one transfer to an offline GPU machine carries (part 7)"""
TIMEOUTS = {"tests": 50.0, "trainers": 120.0, "env": 30.0, "ppo": 130.0, "vla": 80.0, "rsl_rl": 90.0, "mjlab": 420.0}
"""seconds per part on one H100/H200: the default parts 500 s, and 8 s of start-up per worker: at most 9.2 minutes
in all (the parts took 176 s of their 440 s on an H200 on 2026-11-26); mjlab alone 7.1 minutes"""
DRY_TIMEOUT = 300.0  # each part of the dry run (a loaded CPU); the whole dry run takes well under a minute
GRACE_S = 8.0  # a worker's start-up (imports) on top of its parts' budgets


@dataclass
class Args:
    dry_run: bool = False
    """on the CPU at tiny sizes (few envs, 1-3 iterations, tiny VLA widths) in seconds, report to a new temp folder
    (unless --out): what CI runs so that this check cannot rot"""
    out: str | None = None
    """report folder (default: docs/results/gpu-<device>-<date>/; with --dry-run a new temp folder)"""
    parts: tuple[Part, ...] = PARTS
    """which parts to run, in order"""
    timeout: dict[str, float] = field(default_factory=lambda: dict(TIMEOUTS))
    """seconds each part may take (its worker is killed past it and keeps the items it finished)"""
    vla_layers: tuple[int, int] = (2, 2)
    """Gemma and SigLIP layers of the real-width VLA (PaliGemma-3B has 18 and 27)"""
    results_md: str = str(RESULTS_MD)
    """markdown file whose gpu-check section a GPU run replaces ('' leaves it alone; the dry run never writes it)"""


# ---- sizes: every part's settings, pinned (GPU, and the dry run's) ---------------------------------------------
ENV_SIZES = {"gpu": ((4096, 16384, 65536), 100, 3), "dry": ((16, 64), 5, 1)}  # num_envs, steps, repeats
"""PushCubeRL env-only: numbers of envs, timed steps per repeat, repeats (median reported)"""

LANG_ENV = {"obs_mode": "state+rgb", "image_size": 32, "action_mode": "ee_delta_pos"}
TINY_VLA = {"lora_rank": 4, "head_hidden": 16}  # examples/hf_vla's default tiny PaliGemma (hidden 64, 2 layers)
DRY_VLA = {"lora_rank": 2, "head_hidden": 8, "hidden_size": 16, "num_layers": 1, "num_heads": 2,
           "intermediate_size": 32, "patch_size": 8}  # fmt: skip


def trainer_plan(dry: bool, cuda: bool) -> list[dict[str, Any]]:
    """The trainers part: (name, script, flags as keyword arguments, torchrun or not) of each trainer; a run is 2
    iterations, its resume a third. Evaluation only at the end, compile off (the ppo part measures compile)."""
    common = dict(eval_freq=0, save_freq=1, compile="off", cuda=cuda, seed=1)
    if dry:
        episode = {"max_episode_steps": 8}  # short evaluations
        classic = dict(common, num_envs=8, num_steps=4, num_minibatches=2, update_epochs=1, num_eval_envs=2,
                       num_eval_episodes=2, hidden_sizes=(16, 16), env_kwargs=json.dumps(episode))  # fmt: skip
        vla = dict(common, num_envs=4, num_steps=2, num_minibatches=2, update_epochs=1, num_eval_envs=2,
                   num_eval_episodes=2, micro_batch_size=2, policy_kwargs=json.dumps(DRY_VLA),
                   env_kwargs=json.dumps({**LANG_ENV, "image_size": 16, **episode}))  # fmt: skip
        group = dict(group_size=2)
    else:
        classic = dict(common, num_envs=1024, num_steps=16, num_minibatches=4, update_epochs=2, num_eval_envs=64,
                       num_eval_episodes=64)  # fmt: skip
        vla = dict(common, num_envs=32, num_steps=4, num_minibatches=2, update_epochs=1, num_eval_envs=8,
                   num_eval_episodes=8, micro_batch_size=16, policy_kwargs=json.dumps(TINY_VLA),
                   env_kwargs=json.dumps({**LANG_ENV, "max_episode_steps": 20}))  # fmt: skip
        group = dict(group_size=4)
    vla.update(env_id="PushCubeLangRL", policy="examples.hf_vla:make_policy", action_head="bins", action_bins=16,
               action_chunk=2, autocast="bf16")  # fmt: skip
    backend = dict(backend="nccl" if cuda else "gloo")
    # ddp: how a DDP trainer is launched: torchrun with one rank (on a GPU over NCCL; the dry run launches ppo_ddp so
    # on gloo, to exercise the launch), or in this process in a world of one (the dry run's VLA ones: a torchrun
    # process would import transformers again, ~10 s on a loaded CPU)
    vla_ddp = "in-process" if dry else "torchrun"
    return [
        dict(name="ppo_continuous", script="ppo_continuous", kwargs=dict(classic, env_id="PushCubeRL")),
        dict(name="grpo", script="grpo", kwargs=dict(classic, env_id="PushCubeRL", **group)),
        dict(name="ppo_ddp", script="ppo_ddp", kwargs=dict(classic, env_id="PushCubeRL", **backend), ddp="torchrun"),
        dict(
            name="ppo_recurrent", script="ppo_recurrent", kwargs=dict(classic, env_id="PushCubeRL", rnn_hidden_size=16)
        ),
        dict(name="ppo_vla", script="ppo_vla", kwargs=vla),
        dict(name="grpo_vla", script="grpo_vla", kwargs=dict(vla, **group)),
        dict(name="ppo_vla_async", script="ppo_vla_async", kwargs=vla),
        dict(name="ppo_vla_ddp", script="ppo_vla_ddp", kwargs=dict(vla, **backend), ddp=vla_ddp),
        dict(name="ppo_vla_ddp --fsdp", script="ppo_vla_ddp", kwargs=dict(vla, fsdp=True, **backend), ddp=vla_ddp),
    ]


def ppo_plan(dry: bool) -> dict[str, Any]:
    """The ppo part: ppo_continuous's PushCubeRL config at 4096 envs (the dry run: 16)."""
    if dry:
        flags = dict(num_envs=16, num_steps=4, num_minibatches=2, update_epochs=1, hidden_sizes=(16, 16),
                     num_eval_envs=4, num_eval_episodes=4, env_kwargs=json.dumps({"max_episode_steps": 8}))  # fmt: skip
        return dict(flags=flags, iterations=3, skip=1, success_iterations=2, eval_every=1, success_cap_s=120)
    flags = dict(num_envs=4096, num_steps=20, num_minibatches=8, update_epochs=4, learning_rate=1e-3, gamma=0.8,
                 gae_lambda=0.9, target_kl=0.1, hidden_sizes=(128, 128), init_logstd=-0.5, num_eval_envs=64,
                 num_eval_episodes=64)  # fmt: skip
    return dict(flags=flags, iterations=12, skip=4, success_iterations=40, eval_every=2, success_cap_s=60)


DRY_WIDTHS = dict(
    text_hidden=32, text_intermediate=64, text_heads=2, text_kv_heads=1, head_dim=16, vocab_size=2048,
    vision_hidden=24, vision_intermediate=48, vision_heads=2, patch_size=8, vision_image_size=16,
)  # fmt: skip


def vla_plan(dry: bool, layers: tuple[int, int]) -> dict[str, Any]:
    """The vla part: the real-width VLA (the dry run: tiny widths) on PushCubeLangRL, 2 iterations per run."""
    widths = dict(DRY_WIDTHS if dry else PALIGEMMA_3B, text_layers=1 if dry else layers[0],
                  vision_layers=1 if dry else layers[1], lora_rank=2 if dry else 16)  # fmt: skip
    env = {**LANG_ENV, "image_size": 16 if dry else 64, "max_episode_steps": 8 if dry else 20}
    flags = dict(env_id="PushCubeLangRL", env_kwargs=json.dumps(env), policy="benchmarks.real_width_vla:real_width_vla",
                 action_head="bins", action_bins=256, action_chunk=4, autocast="bf16", compile="off", eval_freq=0,
                 save_freq=0, seed=1, num_envs=4 if dry else 64, num_steps=2 if dry else 4, num_minibatches=2,
                 update_epochs=1, num_eval_envs=2 if dry else 16, num_eval_episodes=2 if dry else 16)  # fmt: skip
    rows = [("ppo_vla", True), ("grpo_vla", True), ("ppo_vla", False)]  # (trainer, gradient checkpointing)
    return dict(widths=widths, flags=flags, rows=rows, group_size=2 if dry else 8, iterations=2)


# ---- host syncs -----------------------------------------------------------------------------------------------
SYNC_MESSAGE = "called a synchronizing CUDA operation"


def rollout_loop_lines(path: str | os.PathLike) -> list[tuple[int, int]]:
    """The (first, last) lines of each `for step in range(...)` loop of a trainer's file: its rollout loop."""
    tree = ast.parse(Path(path).read_text())
    return [
        (node.lineno, node.end_lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.For)
        and isinstance(node.target, ast.Name)
        and node.target.id == "step"
        and isinstance(node.iter, ast.Call)
        and getattr(node.iter.func, "id", None) == "range"
    ]


@functools.lru_cache(maxsize=4096)
def _real(path: str) -> str:
    return os.path.realpath(path)


LIBRARIES = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})


def _code_file(path: str) -> bool:
    """A file of code being checked: not Python's or an installed library's, nor this script's (nor the real-width
    VLA's builder it runs)."""
    real = _real(path)
    own = (_real(__file__), _real(real_width_vla.__file__))
    return not path.startswith("<") and not real.startswith(LIBRARIES) and real not in own


class SyncCounter:
    """Counts the host syncs PyTorch's sync check sees while it is active (`torch.cuda.set_sync_debug_mode("warn")`,
    CUDA only; the hook itself is installed everywhere, so it can be tested on a CPU), and which of them happened
    inside the rollout loop of `trainer_file`. See the module docstring."""

    TRAINER_CODE = str(REPO / "cleanrl_embodied") + os.sep  # the rest is the --policy's (e.g. examples/hf_vla)

    def __init__(self, trainer_file: str | os.PathLike, cuda: bool):
        self.file, self.cuda = _real(str(trainer_file)), cuda
        self.loops = rollout_loop_lines(self.file)
        self.total = self.in_loop = self.in_loop_trainer = 0
        self.where: Counter[str] = Counter()  # innermost frame of checked code of each sync in the loop
        self._lock = threading.Lock()

    def __enter__(self) -> SyncCounter:
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()  # restores the filters and showwarning at exit
        warnings.filterwarnings("always", message=re.escape(SYNC_MESSAGE))
        self._show_before = warnings.showwarning
        warnings.showwarning = self._show
        if self.cuda:
            import torch

            self._mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            import torch

            torch.cuda.set_sync_debug_mode(self._mode)
        self._catch.__exit__(*exc)

    def _show(self, message, category, filename, lineno, file=None, line=None) -> None:
        if not str(message).startswith(SYNC_MESSAGE):
            return self._show_before(message, category, filename, lineno, file, line)
        self.record(traceback.extract_stack()[:-1], filename, lineno)

    def record(self, stack: list[traceback.FrameSummary], filename: str, lineno: int) -> None:
        in_loop = any(_real(f.filename) == self.file and any(a <= f.lineno <= b for a, b in self.loops) for f in stack)
        inner = next((f for f in reversed(stack) if _code_file(f.filename)), None)
        path, line = (inner.filename, inner.lineno) if inner else (filename, lineno)
        try:
            shown = os.path.relpath(_real(path), REPO)
        except ValueError:
            shown = path
        with self._lock:
            self.total += 1
            if in_loop:
                self.in_loop += 1
                # the policy's when any checked frame lies in its code (a shared helper it calls is still its sync)
                by_policy = any(_code_file(f.filename) and not _real(f.filename).startswith(self.TRAINER_CODE)
                                for f in stack)  # fmt: skip
                self.in_loop_trainer += not by_policy
                self.where[f"{shown}:{line}"] += 1

    def summary(self, loop_steps: int) -> dict[str, Any]:
        """What the report shows (without CUDA the sync check was not active: no counts)."""
        if not self.cuda:
            return {"active": False, "loop_found": bool(self.loops)}
        return {
            "active": True,
            "loop_found": bool(self.loops),
            "total": self.total,
            "rollout_loop": self.in_loop,
            "rollout_loop_trainer": self.in_loop_trainer,
            "rollout_loop_policy": self.in_loop - self.in_loop_trainer,
            "rollout_steps": loop_steps,
            "where": dict(self.where.most_common(6)),
        }


# ---- flags -----------------------------------------------------------------------------------------------------
def to_flags(kwargs: dict[str, Any]) -> list[str]:
    """Keyword arguments of a trainer's Args -> its CLI flags (what the report shows and tyro parses back)."""
    flags: list[str] = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, (tuple, list)):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags


def parse(script: str, flags: list[str]):
    """The trainer's Args from its CLI flags, through tyro as on the command line (a renamed flag fails here)."""
    module = importlib.import_module(f"cleanrl_embodied.{script}")
    return module, tyro.cli(module.Args, args=flags)


def shown_command(script: str, flags: list[str], torchrun: bool = False) -> str:
    launcher = "torchrun --standalone --nproc_per_node 1" if torchrun else "python"
    return f"{launcher} cleanrl_embodied/{script}.py {shlex.join(flags)}"


# ---- the worker: runs parts, item by item, and writes what it has after every item -----------------------------
class Worker:
    """Runs parts in this process; each item is a try-block whose record (status, wall time, checks, metrics, error)
    is written to `result` as soon as it ends, so a worker killed at its budget keeps what it finished."""

    def __init__(self, spec: dict[str, Any]):
        self.spec, self.dry, self.out = spec, spec["dry_run"], Path(spec["out"])
        self.result_path = Path(spec["result"])
        self.result: dict[str, Any] = {"parts": {}, "current": None, "info": {}}
        self.part: dict[str, Any] | None = None
        self.deadline = float("inf")
        import torch

        self.torch = torch
        self.cuda = not self.dry and torch.cuda.is_available()
        (self.out / "logs").mkdir(parents=True, exist_ok=True)

    def save(self) -> None:
        tmp = self.result_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, indent=1, default=str))
        tmp.replace(self.result_path)

    def run(self) -> None:
        try:
            self.result["info"] = worker_info(self.cuda)
        except Exception as e:  # noqa: BLE001 - the parts still run
            self.result["info"] = {"error": one_line(e)}
        self.save()
        for name in self.spec["parts"]:
            start = time.time()
            self.deadline = start + self.spec["budgets"][name]
            self.part = self.result["parts"][name] = {"status": "running", "items": [], "wall_s": None}
            try:
                PART_FUNCTIONS[name](self)
                bad = [i for i in self.part["items"] if i["status"] not in ("ok", "skipped")]
                self.part["status"] = "fail" if bad else "ok"
            except BaseException as e:  # noqa: BLE001 - a part's own error is reported, the next part runs
                if isinstance(e, KeyboardInterrupt):
                    raise
                self.part["status"], self.part["error"] = "fail", one_line(e)
                self.part["traceback"] = traceback.format_exc()[-4000:]
            self.part["wall_s"] = round(time.time() - start, 2)
            self.result["current"] = None
            self.save()
            print(f"[gpu_check] {name}: {self.part['status']} in {self.part['wall_s']:.1f} s", flush=True)

    def left(self) -> float:
        return self.deadline - time.time()

    def item(self, name: str, body: Callable[[dict[str, Any]], None], **fields: Any) -> dict[str, Any]:
        """One item of the current part: `body(record)` in a try-block; the record gets the status (ok, fail, or
        skipped where the part's budget is spent or the body set `record["skip"]` to a reason), the wall time, the
        error, and on CUDA the peak GPU memory. A check set to False fails the item."""
        record: dict[str, Any] = {"name": name, "status": "running", "checks": {}, "metrics": {}, **fields}
        self.part["items"].append(record)
        self.result["current"] = name
        self.save()
        start = time.time()
        try:
            if self.cuda:
                self.torch.cuda.reset_peak_memory_stats()
            if self.left() <= 0:
                record["skip"] = "the part's time budget was spent"
            else:
                body(record)
            if record.get("skip"):
                record["status"], record["note"] = "skipped", record.pop("skip")
            else:
                record["status"] = "fail" if any(v is False for v in record["checks"].values()) else "ok"
        except BaseException as e:  # noqa: BLE001 - one item's failure is reported, the next item runs
            if isinstance(e, KeyboardInterrupt):
                raise
            record["status"], record["error"] = "fail", one_line(e)
            record["traceback"] = traceback.format_exc()[-4000:]
        finally:
            record["wall_s"] = round(time.time() - start, 2)
            if self.cuda:  # (a CUDA error that broke the context fails this item, not the part)
                with contextlib.suppress(Exception):
                    peak = record["metrics"].get("peak_gpu_mem_gib") or self.torch.cuda.max_memory_allocated() / 2**30
                    record["metrics"]["peak_gpu_mem_gib"] = round(peak, 3)
                    gc.collect()
                    self.torch.cuda.empty_cache()
            self.save()
            print(f"[gpu_check]   {name}: {record['status']} ({record['wall_s']:.1f} s)", flush=True)
        return record

    @contextlib.contextmanager
    def captured(self, name: str) -> Iterator[Path]:
        """A trainer's console output (run lines, progress bar) to logs/<name>.log instead of this console."""
        log = self.out / "logs" / (re.sub(r"[^\w.-]+", "_", name) + ".log")
        with open(log, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            yield log


def one_line(e: BaseException) -> str:
    text = str(e.code if isinstance(e, SystemExit) else e).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {first}"[:500]


def worker_info(cuda: bool) -> dict[str, Any]:
    """Versions and machine, from inside a worker (what ran)."""
    import torch

    from benchmarks.common import git_info, machine_info, package_versions

    info = {"versions": package_versions(), "git": git_info(), "machine": machine_info()}
    for name in ("transformers", "peft"):
        with contextlib.suppress(ImportError):
            info["versions"][name] = importlib.import_module(name).__version__
    info["versions"]["torch_cuda"] = torch.version.cuda
    info["versions"]["cudnn"] = torch.backends.cudnn.version() if cuda else None
    if cuda:
        props = torch.cuda.get_device_properties(0)
        memory = round(props.total_memory / 2**30, 1)
        info["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}", "memory_gib": memory,
                       "count": torch.cuda.device_count()}  # fmt: skip
    return info


# ---- 1. the CUDA tests -----------------------------------------------------------------------------------------
def cuda_test_files() -> list[str]:
    """Test files that hold a CUDA test (a skipif on CUDA, or an explicit cuda mark): pytest then imports only these
    (collecting the whole suite costs ~10 s); `-m cuda` selects the tests."""
    pattern = re.compile(r"skipif\([^)]*cuda|mark\.cuda\b", re.IGNORECASE)
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py") if pattern.search(p.read_text()))


def part_tests(w: Worker) -> None:
    def body(it: dict[str, Any]) -> None:
        files = cuda_test_files()
        junit = w.out / "logs" / "cuda_tests.xml"
        argv = ["-q", "-m", "cuda", "-p", "no:cacheprovider", f"--junitxml={junit}", *files]
        it["command"] = "pytest " + shlex.join(argv[:3] + argv[6:])
        if w.dry:  # in this process: the dry run's imports are paid once
            import pytest

            with w.captured("cuda_tests"):
                code = int(pytest.main(argv))
        else:
            log = w.out / "logs" / "cuda_tests.log"
            env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
            with open(log, "w") as f:
                code = subprocess.run([sys.executable, "-m", "pytest", *argv], cwd=REPO, env=env, stdout=f,
                                      stderr=subprocess.STDOUT, timeout=max(w.left(), 1)).returncode  # fmt: skip
        counts = junit_counts(junit)
        it["metrics"] = {"exit_code": code, "files": files, **counts}
        it["checks"]["passed"] = code == 0 and counts.get("tests", 0) > 0
        if not w.cuda:  # the selection still finds them: each skipped for want of CUDA
            it["checks"]["skipped_without_cuda"] = counts.get("skipped") == counts.get("tests")

    w.item("pytest -m cuda", body)


def junit_counts(path: Path) -> dict[str, int]:
    import xml.etree.ElementTree as ET

    if not path.is_file():
        return {}
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}


# ---- 2. every trainer: runs, resumes, no host sync in the rollout loop ------------------------------------------
def steps_per_iteration(kwargs: dict[str, Any]) -> int:
    return kwargs["num_envs"] * kwargs["num_steps"] * kwargs.get("action_chunk", 1)


def check_trainer(w: Worker, plan: dict[str, Any], torchrun: bool = False) -> None:
    """2 iterations (host syncs counted), then a resume from last.pt for a third; the CLI the report shows is what
    tyro parsed."""
    name, script, kwargs = plan["name"], plan["script"], plan["kwargs"]

    def body(it: dict[str, Any]) -> None:
        per_iteration = steps_per_iteration(kwargs)
        root = w.out / "runs" / "trainers" / re.sub(r"[^\w.-]+", "_", name)
        flags = to_flags({**kwargs, "total_timesteps": 2 * per_iteration, "output_dir": str(root / "run")})
        it["command"] = shown_command(script, flags, torchrun)
        module, args = parse(script, flags)
        counter = SyncCounter(module.__file__, w.cuda)
        with w.captured(name), counter:
            first = module.main(args)
        it["checks"]["runs"] = first["global_step"] == 2 * per_iteration
        it["checks"]["rollout_loop_found"] = counter.loops != []  # else no sync could be counted as in the loop
        it["metrics"]["syncs"] = counter.summary(2 * kwargs["num_steps"])
        if counter.cuda:  # none from the trainer, shared code or env (the policy's are listed apart)
            it["checks"]["no_rollout_sync"] = counter.in_loop_trainer == 0
        summary = json.loads((Path(first["run_dir"]) / "summary.json").read_text())
        it["metrics"]["sps"] = round(summary["sps"])
        last = Path(first["run_dir"]) / "checkpoints" / "last.pt"
        resume = {**kwargs, "total_timesteps": 3 * per_iteration, "output_dir": str(root / "resumed")}
        module, args = parse(script, to_flags({**resume, "resume": str(last)}))
        with w.captured(name):
            second = module.main(args)
        it["checks"]["resumes"] = second["global_step"] == 3 * per_iteration
        it["metrics"]["global_steps"] = [first["global_step"], second["global_step"]]

    launcher = "torchrun, 1 rank" if torchrun else ("in-process, world of one" if plan.get("ddp") else "in-process")
    launcher += f" ({plan['kwargs']['backend']})" if plan.get("ddp") else ""
    w.item(name, body, launcher=launcher)


def part_trainers(w: Worker) -> None:
    plans = trainer_plan(w.dry, w.cuda)
    for plan in plans:
        if not plan.get("ddp"):
            check_trainer(w, plan)
    launched = [p for p in plans if p.get("ddp") == "torchrun"]
    if launched:  # one rank (on a GPU over NCCL) under torchrun, all in one launch
        run_torchrun(w, launched)
    here = [p for p in plans if p.get("ddp") == "in-process"]
    if here:  # the same code in this process, a world of one
        run_ddp_items(w, here)


def run_ddp_items(w: Worker, plans: list[dict[str, Any]], torchrun: bool = False) -> None:
    """The DDP trainers in one process group that this function makes (main() keeps a group its caller made, so
    a run and its resume share it): torchrun's (env://) or a world of one."""
    import torch.distributed as dist

    backend = plans[0]["kwargs"]["backend"]
    if "MASTER_ADDR" in os.environ:
        device_id = None
        if backend == "nccl":
            device_id = w.torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            w.torch.cuda.set_device(device_id)
        dist.init_process_group(backend, device_id=device_id)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        for plan in plans:
            check_trainer(w, plan, torchrun)
    finally:
        dist.destroy_process_group()


def run_torchrun(w: Worker, plans: list[dict[str, Any]]) -> None:
    """`torchrun --nproc_per_node 1 gpu_check.py _job SPEC`: the DDP items in a rank of their own, within what is left
    of the part's budget; their records join this part's (an item a killed or crashed launch left unfinished fails,
    with torchrun's output in logs/torchrun.log)."""
    result = w.out / "logs" / "torchrun_result.json"
    spec = {**w.spec, "parts": [], "result": str(result), "plans": plans, "seconds": w.left()}
    spec_path = w.out / "logs" / "torchrun_spec.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
           str(Path(__file__).resolve()), "_job", str(spec_path)]  # fmt: skip
    start = time.time()
    with open(w.out / "logs" / "torchrun.log", "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
        try:
            code: int | str = proc.wait(timeout=max(w.left(), 1))
        except subprocess.TimeoutExpired:
            code = "timeout"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its rank
            proc.wait()
    done = json.loads(result.read_text())["parts"].get("trainers", {}).get("items", []) if result.is_file() else []
    status = "timeout" if code == "timeout" else "fail"
    for item in done:
        if item["status"] == "running":
            item.update(status=status, error=f"torchrun exited {code}; see logs/torchrun.log")
    for plan in plans[len(done) :]:
        done.append({"name": plan["name"], "status": status, "error": f"torchrun exited {code}; see logs/torchrun.log",
                     "checks": {}, "metrics": {}, "wall_s": round(time.time() - start, 2)})  # fmt: skip
    w.part["items"] += done
    w.save()


def job_main(spec_path: str) -> None:
    """Inside torchrun: the DDP items of the trainers part."""
    spec = json.loads(Path(spec_path).read_text())
    w = Worker(spec)
    w.deadline = time.time() + spec["seconds"]
    w.part = w.result["parts"]["trainers"] = {"status": "running", "items": [], "wall_s": None}
    run_ddp_items(w, spec["plans"], torchrun=True)
    w.save()


# ---- 3. PushCubeRL env-steps/s ---------------------------------------------------------------------------------
def part_env(w: Worker) -> None:
    from benchmarks.common import env_throughput  # PushCubeRL step() alone, warm-up left out

    sizes, steps, repeats = ENV_SIZES["dry" if w.dry else "gpu"]
    device = "cuda" if w.cuda else "cpu"
    for n in sizes:

        def body(it: dict[str, Any], n: int = n) -> None:
            it["command"] = f"env_throughput({n}, {device!r}, steps={steps}, repeats={repeats})"
            rate = env_throughput(n, device, steps, repeats)
            it["metrics"] = {"num_envs": n, "device": device, "env_steps_per_s": round(rate)}

        w.item(f"{n} envs", body)


# ---- 4. ppo_continuous at 4096 envs: eager, compiled, CUDA graphs; time to 0.9 ----------------------------------
AUTO_TOLERANCE = 0.97
"""`--compile auto`'s pick passes when its steady SPS is at least this share of the other's (run-to-run noise)."""
AUTO_PAIRS = {False: ("eager", "compile"), True: ("cudagraphs", "compile + cudagraphs")}
"""--cudagraphs off / on -> the ppo part's variants `--compile auto` chooses between (eager, compiled)."""


def auto_choice(device_type: str, steady: dict[str, float | None]) -> tuple[dict[str, Any], dict[str, bool]]:
    """What `--compile auto` picks on `device_type` (shared.compile_choice: a rule per device on CUDA; on the CPU a
    measurement each run makes, which this part does not judge), without and with --cudagraphs, against the steady
    SPS measured for each variant (`steady`: label -> SPS, None where not run): the metrics (each pick, and the
    faster variant where both were measured) and the checks (the pick's SPS at least AUTO_TOLERANCE times the
    other's)."""
    from cleanrl_embodied import shared

    metrics: dict[str, Any] = {}
    checks: dict[str, bool] = {}
    for graphs, (eager, compiled) in AUTO_PAIRS.items():
        key = "with cudagraphs" if graphs else "without cudagraphs"
        choice = shared.compile_choice("auto", device_type, graphs)
        if choice is None:  # decided by measuring, in the run
            metrics[f"picks ({key})"] = "measured in the run"
            continue
        pick = compiled if choice else eager
        other = eager if pick == compiled else compiled
        metrics[f"picks ({key})"] = pick
        mine, theirs = steady.get(pick), steady.get(other)
        if mine is not None and theirs is not None:
            metrics[f"faster ({key})"] = pick if mine >= theirs else other
            checks[f"picks the faster ({key})"] = mine >= AUTO_TOLERANCE * theirs
    return metrics, checks


def part_ppo(w: Worker) -> None:
    from benchmarks import common

    plan = ppo_plan(w.dry)
    flags = dict(plan["flags"], env_id="PushCubeRL", cuda=w.cuda, seed=1, save_freq=0, eval_freq=0)
    per_iteration = flags["num_envs"] * flags["num_steps"]
    variants = [("eager", dict(compile="off")), ("cudagraphs", dict(compile="off", cudagraphs=True)),
                ("compile", dict(compile="on")),
                ("compile + cudagraphs", dict(compile="on", cudagraphs=True))]  # fmt: skip
    steady: dict[str, float | None] = {}  # label -> steady SPS, for --compile auto's choice

    def sps_run(label: str, extra: dict[str, Any]) -> None:
        """Steady SPS (median over the iterations after `skip`) and end-to-end SPS of one setting."""

        def body(it: dict[str, Any]) -> None:
            kwargs = dict(flags, **extra, total_timesteps=plan["iterations"] * per_iteration,
                          output_dir=str(w.out / "runs" / "ppo" / label.replace(" ", "")))  # fmt: skip
            it["command"] = shown_command("ppo_continuous", to_flags(kwargs))
            module, args = parse("ppo_continuous", to_flags(kwargs))  # the flags exist, also where not run
            if w.dry and (extra.get("compile") == "on" or extra.get("cudagraphs")):
                it["skip"] = "dry run: compiling costs ~10 s on a CPU and --cudagraphs needs CUDA (flags parsed only)"
                return
            import torch._dynamo

            torch._dynamo.reset()  # each variant compiles from scratch (inductor's disk cache may still help)
            with w.captured(f"ppo-{label}") as log:
                out = module.main(args)
            fell_back = "torch.compile does not work here" in log.read_text()
            summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
            it["metrics"] = {
                "num_envs": flags["num_envs"], "iterations": plan["iterations"],
                "steady_sps": round(common.steady_sps(Path(out["run_dir"]), plan["skip"])),
                "end_to_end_sps": round(summary["sps"]), "compile_fell_back_to_eager": fell_back,
            }  # fmt: skip
            if extra.get("compile") == "on":
                it["checks"]["compiled"] = not fell_back
            steady[label] = None if fell_back else it["metrics"]["steady_sps"]

        w.item(label, body)

    def auto(it: dict[str, Any]) -> None:
        it["metrics"], it["checks"] = auto_choice("cuda" if w.cuda else "cpu", steady)
        notes = [f"{k}: {v} ({_fmt(steady.get(v))})" for k, v in it["metrics"].items() if k.startswith("picks")]
        if not it["checks"]:
            it["skip"] = "no pair of figures to compare (" + "; ".join(notes) + ")"
        else:
            it["note"] = "; ".join(notes)

    def to_success(it: dict[str, Any]) -> None:
        root = w.out / "runs" / "ppo" / "to_0.9"
        kwargs = dict(flags, compile="off", eval_freq=plan["eval_every"], output_dir=str(root),
                      total_timesteps=plan["success_iterations"] * per_iteration)  # fmt: skip
        it["command"] = shown_command("ppo_continuous", to_flags(kwargs))
        module, args = parse("ppo_continuous", to_flags(kwargs))
        # then SIGTERM: the trainer finishes the iteration, saves and stops (shared.StopFlag)
        cap = max(min(plan["success_cap_s"], w.left() - 5.0), 5.0)
        stopper = threading.Timer(cap, os.kill, (os.getpid(), signal.SIGTERM))
        start = time.time()
        stopper.start()
        try:
            with w.captured("ppo-to-0.9"):
                out = module.main(args)
        except SystemExit as e:  # 143: stopped at the cap
            if e.code != 143:
                raise
            out = {"run_dir": str(next(p for p in root.iterdir() if p.is_dir()))}
            it["note"] = f"stopped at the {cap:.0f} s cap"
        finally:
            stopper.cancel()
        run_dir = Path(out["run_dir"])
        scalars = common.read_scalars(run_dir)
        eval_steps, success = scalars.get("eval/success_rate", ([], []))
        sps_steps, sps = scalars.get("charts/SPS", ([], []))
        _, eval_walls = common.scalar_wall_times(run_dir, "eval/success_rate") if eval_steps else ([], [])
        hit = next((i for i, s in enumerate(success) if s >= 0.9), None)
        metrics = {"num_envs": flags["num_envs"], "eval_every_iterations": plan["eval_every"],
                   "cap_env_steps": kwargs["total_timesteps"], "cap_s": round(cap),
                   "evals": [[s, round(v, 3)] for s, v in zip(eval_steps, success)]}  # fmt: skip
        train_steps, train_success = scalars.get("charts/success_rate", ([], []))
        _, train_walls = common.scalar_wall_times(run_dir, "charts/success_rate") if train_steps else ([], [])
        train_hit, train_at = first_at(train_steps, train_success, train_walls)  # (as rsl_rl's part reads its own)
        metrics.update(train_env_steps_to_0_9=train_hit,
                       train_s_to_0_9=None if train_at is None else round(train_at - start, 1))  # fmt: skip
        if hit is not None:
            step = eval_steps[hit]
            rate = dict(zip(sps_steps, sps)).get(step)
            metrics.update(env_steps_to_0_9=step, wall_s_to_0_9=round(eval_walls[hit] - start, 1),
                           loop_s_to_0_9=round(step / rate, 1) if rate else None)  # fmt: skip
        it["metrics"] = metrics
        if not w.dry:
            it["checks"]["reached_0.9"] = hit is not None

    # eager first, then the time to 0.9 (eager): the figures that need no compiler come before those that do
    sps_run(*variants[0])
    sps_run(*variants[1])
    w.item("time to eval success 0.9 (eager)", to_success)
    for label, extra in variants[2:]:
        sps_run(label, extra)
    w.item("--compile auto's choice", auto)


# ---- 5. a VLA at real width --------------------------------------------------------------------------------------
def micro_batch_sizes(minibatch: int) -> list[int]:
    """The minibatch size, then halved down to 1."""
    sizes = [minibatch]
    while sizes[-1] > 1:
        sizes.append(sizes[-1] // 2)
    return sizes


def first_that_fits(sizes: list[int], run: Callable[[int], Any], is_oom: Callable[[BaseException], bool]):
    """`run(size)` for each size, large to small, until one does not run out of memory: (size, result, the sizes
    that did not fit)."""
    too_large: list[int] = []
    for size in sizes:
        try:
            return size, run(size), too_large
        except BaseException as e:  # noqa: BLE001 - only running out of memory moves on to the next size
            if not is_oom(e):
                raise
        too_large.append(size)
        gc.collect()
        with contextlib.suppress(Exception):
            import torch

            torch.cuda.empty_cache()
    raise RuntimeError(f"out of memory at every micro-batch size {sizes}")


def part_vla(w: Worker) -> None:
    from benchmarks import common

    plan = vla_plan(w.dry, tuple(w.spec["vla_layers"]))
    torch = w.torch

    def is_oom(e: BaseException) -> bool:
        return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()

    for script, checkpointing in plan["rows"]:
        label = f"{script}, gradient checkpointing {'on' if checkpointing else 'off'}"

        def body(it: dict[str, Any], script: str = script, checkpointing: bool = checkpointing, label: str = label):
            policy_kwargs = json.dumps({**plan["widths"], "gradient_checkpointing": checkpointing})
            kwargs = dict(plan["flags"], cuda=w.cuda, policy_kwargs=policy_kwargs)
            if script == "grpo_vla":
                kwargs["group_size"] = plan["group_size"]
            kwargs["total_timesteps"] = plan["iterations"] * steps_per_iteration(kwargs)
            minibatch = kwargs["num_envs"] * kwargs["num_steps"] // kwargs["num_minibatches"]

            def run(size: int) -> dict:
                root = w.out / "runs" / "vla" / re.sub(r"[^\w.-]+", "_", label) / f"mb{size}"
                module, args = parse(script, to_flags({**kwargs, "micro_batch_size": size, "output_dir": str(root)}))
                if w.cuda:
                    torch.cuda.reset_peak_memory_stats()
                with w.captured(f"vla-{label}"):
                    return module.main(args)

            size, out, too_large = first_that_fits(micro_batch_sizes(minibatch), run, is_oom)
            it["command"] = shown_command(script, to_flags({**kwargs, "micro_batch_size": size}))
            summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
            it["metrics"] = {
                "micro_batch_size": size, "did_not_fit": too_large, "minibatch_size": minibatch,
                "num_envs": kwargs["num_envs"], "params": LAST_BUILD.get("params"),
                "trainable": LAST_BUILD.get("trainable"), "checkpointing": LAST_BUILD.get("checkpointing"),
                "iteration_env_steps_per_s": round(common.steady_sps(Path(out["run_dir"]), 1), 1),
                "end_to_end_env_steps_per_s": round(summary["sps"], 1),
                "peak_gpu_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if w.cuda else None,
                "peak_gpu_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2) if w.cuda else None,
            }  # fmt: skip
            it["checks"]["checkpointing_as_asked"] = LAST_BUILD.get("checkpointing") == checkpointing

        w.item(label, body)


# ---- 6. rsl_rl side by side: its PPO with ppo_continuous's settings, on PushCubeRL at the ppo part's size ---------
RSL_RL_MODES = {"rsl_rl, eager": "none", 'rsl_rl, torch_compile_mode="default"': "default"}
"""label -> rsl_rl_push_cube.py's --compile (rsl_rl's torch_compile_mode)"""


def first_at(steps: list[int], values: list[float], walls: list[float], threshold: float = 0.9):
    """(step, wall time) of the first logged value >= threshold, or (None, None)."""
    return next(((s, t) for s, v, t in zip(steps, values, walls) if v >= threshold), (None, None))


def part_rsl_rl(w: Worker) -> None:
    """rsl_rl 5.5.1's OnPolicyRunner through benchmarks/peers/rsl_rl_push_cube.py (its VecEnv adapter, ours' settings,
    as in peers/vs_rsl_rl.py) on the ppo part's PushCubeRL setting, eager and compiled, each for the ppo part's
    time-to-0.9 run's env steps, in a process of its own: steady SPS (median iteration after the ppo part's skip),
    the env steps and seconds until its training episodes succeed 90% of the time, and the final evaluation. The ppo
    part's runs are ours' side; the report sets the two beside each other."""
    from benchmarks.common import read_scalars, scalar_wall_times
    from benchmarks.peers import vs_rsl_rl

    plan = ppo_plan(w.dry)
    flags = plan["flags"]
    per_iteration = flags["num_envs"] * flags["num_steps"]
    iterations = max(plan["success_iterations"], plan["skip"] + 2)  # (steady needs two after the skipped ones)
    device = "cuda" if w.cuda else "cpu"
    for label, mode in RSL_RL_MODES.items():

        def body(it: dict[str, Any], label: str = label, mode: str = mode) -> None:
            root = w.out / "runs" / "rsl_rl" / slug(label)
            argv = ["--device", device, "--seed", "1", "--num-envs", str(flags["num_envs"]),
                    "--num-steps", str(flags["num_steps"]), "--learning-rate", f"{flags.get('learning_rate', 1e-3):g}",
                    "--total-timesteps", str(iterations * per_iteration), "--compile", mode,
                    "--num-eval-envs", str(flags["num_eval_envs"]), "--num-eval-episodes",
                    str(flags["num_eval_episodes"]), "--log-dir", str(root / "tb"),
                    "--timings", str(root / "timings.json")]  # fmt: skip
            it["command"] = "python -m benchmarks.peers.rsl_rl_push_cube " + shlex.join(argv)
            if importlib.util.find_spec("rsl_rl") is None:
                it["skip"] = f"rsl_rl is not installed (not a dependency): {vs_rsl_rl.INSTALL}, then PYTHONPATH"
                return
            if w.dry and mode != "none":
                it["skip"] = "dry run: compiling costs ~10 s on a CPU"
                return
            root.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "OMP_NUM_THREADS": "1"} if w.dry else dict(os.environ)
            with open(w.out / "logs" / f"{slug(label)}.log", "w") as f:
                subprocess.run([sys.executable, "-m", "benchmarks.peers.rsl_rl_push_cube", *argv], cwd=REPO, env=env,
                               stdout=f, stderr=subprocess.STDOUT, timeout=max(w.left(), 1), check=True)  # fmt: skip
            timings = json.loads((root / "timings.json").read_text())
            _, walls = scalar_wall_times(root / "tb", "Loss/learning_rate")  # one event per iteration
            steady = vs_rsl_rl.steady(walls, plan["skip"])
            steps, success = read_scalars(root / "tb").get("Episode/success_rate", ([], []))
            _, success_walls = scalar_wall_times(root / "tb", "Episode/success_rate") if steps else ([], [])
            hit, at = first_at(steps, success, success_walls)
            it["metrics"] = {
                "num_envs": flags["num_envs"], "iterations": timings["iterations"],
                "steady_sps": round(per_iteration / steady["median_s"]),
                "train_env_steps_to_0_9": None if hit is None else (hit + 1) * per_iteration,  # (rsl_rl: 0-based)
                "train_s_to_0_9": None if at is None else round(at - timings["times"]["imported"], 1),
                "final_eval_success": timings["eval"]["success_rate"], "device": timings.get("device"),
            }  # fmt: skip
            it["checks"]["ran_on_the_device"] = timings.get("device") == device

        w.item(label, body)


# ---- 7. mjlab's Go1 (and YAM arm): ppo_continuous against mjlab's own train script, back to back ------------------
MJLAB_TASKS = ("Mjlab-Velocity-Flat-Unitree-Go1", "Mjlab-Lift-Cube-Yam")
MJLAB_SIZES = {"gpu": dict(num_envs=4096, iterations=50, skip=5), "dry": dict(num_envs=8, iterations=2, skip=0)}
"""envs, iterations (of the task's recipe: 24 env steps each) and the iterations the steady SPS leaves out"""


def part_mjlab(w: Worker) -> None:
    """peers/vs_mjlab.py's two sides on the GPU, seed 1, the task's rsl_rl recipe (ours mapped onto its flags, time-outs
    bootstrapped from the true final observation): mjlab's `python -m mjlab.scripts.train` (rsl_rl 5.4.2) and
    ppo_continuous on `mjlab:<task>`, the same envs and iterations, each in its own process: steady env steps/s and
    the training return at the end (the mean over the last 10% of env steps). Go1 first, then the YAM arm while the
    budget lasts. The dry run: vs_mjlab's `--tiny` sizes on the CPU."""
    from benchmarks.peers import vs_mjlab

    size = MJLAB_SIZES["dry" if w.dry else "gpu"]
    for task in MJLAB_TASKS:
        for method in ("ppo_continuous", "rsl_rl"):

            def body(it: dict[str, Any], task: str = task, method: str = method) -> None:
                if importlib.util.find_spec("mjlab") is None:
                    it["skip"] = f"mjlab is not installed: {vs_mjlab.INSTALL} (its own environment)"
                    return
                args = vs_mjlab.Args(tasks=(task,), num_envs=size["num_envs"], iterations=size["iterations"],
                                     skip=size["skip"], tiny=w.dry, cuda=w.cuda, smoke=False)  # fmt: skip
                command, env, steps = vs_mjlab.method_command(args, task, method, seed=1)
                spec = vs_mjlab.RunSpec(task, method, 1, 0, command, env, steps)
                record = vs_mjlab.run_one(spec, w.out / "runs" / "mjlab" / slug(f"{task}-{method}"), size["skip"])
                it["command"] = record["command"]
                if record["returncode"]:
                    raise RuntimeError(record.get("error") or f"exit {record['returncode']}")
                m = record["metrics"]
                it["metrics"] = {"num_envs": vs_mjlab.num_envs_of(args), "env_steps": m["env_steps"],
                                 "steady_sps": None if m["steady_sps"] is None else round(m["steady_sps"]),
                                 "final_return": m["final_return"], "process_s": record["process_s"]}  # fmt: skip
                it["checks"]["all_env_steps"] = m["env_steps"] == steps

            w.item(f"{task}: {vs_mjlab.LABELS[method]}", body)


PART_FUNCTIONS: dict[str, Callable[[Worker], None]] = {
    "tests": part_tests, "trainers": part_trainers, "env": part_env, "ppo": part_ppo, "vla": part_vla,
    "rsl_rl": part_rsl_rl, "mjlab": part_mjlab,
}  # fmt: skip


def worker_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    if spec["dry_run"]:
        import torch

        torch.set_num_threads(1)
    Worker(spec).run()


# ---- the orchestrator ------------------------------------------------------------------------------------------
def device_info(dry: bool) -> dict[str, Any]:
    """The GPU's name, driver and memory from nvidia-smi (no CUDA context in this process); torch's versions."""
    import torch

    info: dict[str, Any] = {"name": "cpu", "driver": None, "memory_gib": None, "torch": torch.__version__,
                            "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}  # fmt: skip
    if dry:
        return info
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(subprocess.SubprocessError, OSError, ValueError):
            line = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout.splitlines()[0]  # fmt: skip
            name, driver, memory = (s.strip() for s in line.split(","))
            info.update(name=name, driver=driver, memory_gib=round(float(memory) / 1024, 1))
    if info["name"] == "cpu" and torch.cuda.is_available():
        info["name"] = torch.cuda.get_device_name(0)
    return info


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def run_worker(spec: dict[str, Any], out: Path, tag: str) -> dict[str, Any]:
    """One worker process for `spec["parts"]`, killed (its process group) past the sum of their budgets."""
    spec = {**spec, "result": str(out / "logs" / f"worker_{tag}.json")}
    spec_path = out / "logs" / f"worker_{tag}_spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if spec["dry_run"]:
        env["OMP_NUM_THREADS"] = "1"
    budget = sum(spec["budgets"][p] for p in spec["parts"]) + GRACE_S
    cmd = [sys.executable, str(Path(__file__).resolve()), "_worker", str(spec_path)]
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True)
    try:
        code = proc.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        code = "timeout"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the worker and what it started (torchrun, pytest)
        proc.wait()
    path = Path(spec["result"])
    result = json.loads(path.read_text()) if path.is_file() else {"parts": {}, "info": {}, "current": None}
    for name in spec["parts"]:
        part = result["parts"].get(name)
        if part is None:
            result["parts"][name] = {"status": "timeout" if code == "timeout" else "fail", "items": [],
                                     "wall_s": 0.0, "error": f"worker exited {code} before this part"}  # fmt: skip
        elif part["status"] == "running":
            part["status"] = "timeout" if code == "timeout" else "fail"
            part["error"] = f"worker {'ran past its budget' if code == 'timeout' else f'exited {code}'}"
            part["wall_s"] = round(time.time() - start, 2)
            for item in part["items"]:
                if item["status"] == "running":
                    item["status"] = part["status"]
    return result


def command_of(args: Args) -> str:
    """The command line of `args` (the flags that differ from the defaults)."""
    flags, default = [], Args()
    for f in dataclasses.fields(Args):
        value = getattr(args, f.name)
        if f.name == "timeout":
            flags += [f"--timeout.{p}={v:g}" for p, v in value.items() if v != TIMEOUTS.get(p)]
        elif value != getattr(default, f.name) and not (f.name == "out" and args.dry_run and value is None):
            flags += to_flags({f.name: value})
    return shlex.join(["python", "benchmarks/gpu_check.py", *flags])


def main(args: Args) -> dict[str, Any]:
    unknown = sorted(set(args.timeout) - set(TIMEOUTS))
    if unknown:
        raise SystemExit(f"error: --timeout: unknown part(s) {unknown} (parts: {', '.join(TIMEOUTS)})")
    started = datetime.datetime.now()
    device = device_info(args.dry_run)
    if not args.dry_run and not device["cuda_available"]:
        raise SystemExit("error: no CUDA device here; on a CPU run `benchmarks/gpu_check.py --dry-run`")
    if args.out:
        out = Path(args.out)
    elif args.dry_run:
        out = Path(tempfile.mkdtemp(prefix="gpu_check_dry_"))
    else:
        out = REPO / "docs" / "results" / f"gpu-{slug(device['name'])}-{started:%Y-%m-%d}"
    (out / "logs").mkdir(parents=True, exist_ok=True)
    budgets = {p: DRY_TIMEOUT if args.dry_run else float(args.timeout.get(p, TIMEOUTS[p])) for p in TIMEOUTS}
    spec = {"dry_run": args.dry_run, "out": str(out), "budgets": budgets, "vla_layers": list(args.vla_layers)}
    print(f"[gpu_check] {'DRY RUN on the CPU' if args.dry_run else device['name']}: parts {', '.join(args.parts)} "
          f"-> {out}", flush=True)  # fmt: skip
    groups = [list(args.parts)] if args.dry_run else [[p] for p in args.parts]  # dry: one process, imports once
    parts: dict[str, Any] = {}
    info: dict[str, Any] = {}
    for i, group in enumerate(groups):
        result = run_worker({**spec, "parts": group}, out, f"{i}_{'_'.join(group)}")
        parts.update(result["parts"])
        info = info or result.get("info", {})
    for name in (*PARTS, *OWN_RUN_PARTS):
        if name not in parts:
            parts[name] = {"status": "skipped", "items": [], "wall_s": 0.0, "note": "not in --parts"}
    data = {
        "dry_run": args.dry_run,
        "started": started.isoformat(timespec="seconds"),
        "wall_s": round((datetime.datetime.now() - started).total_seconds(), 1),
        "command": command_of(args),
        "device": device,
        "budgets_s": {p: budgets[p] for p in args.parts},
        "info": info,
        "parts": parts,
    }
    (out / "gpu_check.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    (out / "report.md").write_text(report(data))
    if not args.dry_run:  # the commit the worker ran (what staleness is judged by)
        from benchmarks.suite import provenance

        git = info.get("git") if info.get("git", {}).get("git_sha") else None
        provenance.record(out, data["command"], None, (info.get("machine") or None), git)
    if not args.dry_run and args.results_md:
        write_section(Path(args.results_md), "gpu-check", section(data, out))
    for name in args.parts:
        print(f"[gpu_check] {name:9s} {parts[name]['status']:8s} {parts[name]['wall_s']:7.1f} s", flush=True)
    print(f"[gpu_check] total {data['wall_s']:.1f} s; report: {out / 'report.md'}", flush=True)
    return data


# ---- the report --------------------------------------------------------------------------------------------------
def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _syncs(metrics: dict[str, Any]) -> str:
    s = metrics.get("syncs") or {}
    if not s.get("active"):
        return "not counted (no CUDA)" if s else "n/a"
    where = ", ".join(f"`{k}` x{v}" for k, v in s["where"].items())
    return (f"{s['rollout_loop_trainer']} trainer/env + {s['rollout_loop_policy']} policy in "
            f"{s['rollout_steps']} rollout steps ({s['total']} in the run){': ' + where if where else ''}")  # fmt: skip


def _status(item: dict[str, Any]) -> str:
    failed = [k for k, v in item.get("checks", {}).items() if v is False]
    text = item["status"] + (f" ({', '.join(failed)})" if failed else "")
    text += f": {item['error']}" if item.get("error") else ""
    text += f"; {item['note']}" if item.get("note") else ""
    return text.replace("|", "\\|")  # inside a table cell


def _train_to(item: dict[str, Any]) -> str:
    m = item["metrics"]
    return f"{_fmt(m.get('train_env_steps_to_0_9'))} / {_fmt(m.get('train_s_to_0_9'))}" if m else ""


def side_by_side(parts: dict[str, Any]) -> list[str]:
    """Ours (the ppo part) against rsl_rl (the rsl_rl part), each side's faster variant: steady SPS, and the seconds
    until the training episodes succeed 90% of the time (ours eager, the ppo part's time-to-0.9 run)."""

    def ok(part: str) -> dict[str, dict[str, Any]]:
        return {i["name"]: i["metrics"] for i in parts.get(part, {}).get("items", []) if i["status"] == "ok"}

    ours, theirs = ok("ppo"), ok("rsl_rl")
    ours_sps = {k: m["steady_sps"] for k, m in ours.items() if m.get("steady_sps")}
    theirs_sps = {k: m["steady_sps"] for k, m in theirs.items() if m.get("steady_sps")}
    if not ours_sps or not theirs_sps:
        return ["Side by side: not both sides measured.", ""]
    a, b = max(ours_sps, key=ours_sps.get), max(theirs_sps, key=theirs_sps.get)
    lines = [f"Side by side, each side's faster variant: steady SPS ours ({a}) {ours_sps[a]:,} against rsl_rl ({b}) "
             f"{theirs_sps[b]:,}: **{ours_sps[a] / theirs_sps[b]:.2f}x**."]  # fmt: skip
    mine = next((m.get("train_s_to_0_9") for k, m in ours.items() if k.startswith("time to eval")), None)
    other = {k: m["train_s_to_0_9"] for k, m in theirs.items() if m.get("train_s_to_0_9")}
    if mine and other:
        c = min(other, key=other.get)
        lines[-1] += (f" Seconds until the training episodes succeed 90% of the time: ours (eager) {mine:g} against "
                      f"rsl_rl ({c}) {other[c]:g}: **{other[c] / mine:.2f}x**.")  # fmt: skip
    return [*lines, ""]


def report(data: dict[str, Any]) -> str:
    dev, info = data["device"], data.get("info", {})
    versions = info.get("versions", {})
    git = info.get("git", {})
    title = "DRY RUN on the CPU (tiny sizes: no figure here is a GPU figure)" if data["dry_run"] else dev["name"]
    lines = [f"# GPU check: {title}", ""]
    if data["dry_run"]:
        lines += ["> Dry run: every part ran on the CPU at tiny sizes to check that the code paths work. Timings",
                  "> and throughputs below are of that, not of any GPU.", ""]  # fmt: skip
    lines += [
        f"- date: {data['started']}, {data['wall_s']:.0f} s in all",
        f"- command: `{data['command']}`",
        f"- device: {dev['name']}" + (f", {dev['memory_gib']} GiB" if dev.get("memory_gib") else ""),
        f"- driver: {dev.get('driver') or 'n/a'}; torch {dev['torch']}, CUDA {dev.get('cuda') or 'n/a'}, "
        f"cuDNN {versions.get('cudnn') or 'n/a'}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if k not in ("torch_cuda", "cudnn")),
        f"- git: {git.get('git_sha')}" + (" (uncommitted changes)" if git.get("git_dirty") else ""),
        f"- machine: {info.get('machine', {}).get('cpu')}, {info.get('machine', {}).get('logical_cores')} cores",
        "",
        md_table(
            ["part", "status", "wall (s)", "budget (s)"],
            [
                [
                    name,
                    p["status"] + (f": {p['error']}" if p.get("error") else ""),
                    _fmt(p.get("wall_s")),
                    _fmt(data["budgets_s"].get(name)),
                ]
                for name, p in data["parts"].items()
            ],
        ),
        "",
    ]
    parts = data["parts"]
    sections = {
        "tests": ("1. The CUDA tests", ["item", "status", "tests", "failures", "errors", "skipped", "wall (s)"],
                  lambda i: [i["name"], _status(i), *(_fmt(i["metrics"].get(k)) for k in
                             ("tests", "failures", "errors", "skipped")), _fmt(i["wall_s"])]),
        "trainers": ("2. Every trainer: 2 iterations, a resume for a third, host syncs in the rollout loop",
                     ["trainer", "status", "launcher", "SPS (first run)", "peak GPU mem (GiB)", "host syncs",
                      "wall (s)"],
                     lambda i: [i["name"], _status(i), i.get("launcher") or "in-process", _fmt(i["metrics"].get("sps")),
                                _fmt(i["metrics"].get("peak_gpu_mem_gib")), _syncs(i["metrics"]), _fmt(i["wall_s"])]),
        "env": ("3. PushCubeRL env-only throughput", ["num_envs", "status", "device", "env-steps/s", "wall (s)"],
                lambda i: [_fmt(i["metrics"].get("num_envs")), _status(i), i["metrics"].get("device", ""),
                           _fmt(i["metrics"].get("env_steps_per_s")), _fmt(i["wall_s"])]),
        "ppo": ("4. ppo_continuous on PushCubeRL", ["run", "status", "num_envs", "steady SPS", "end-to-end SPS",
                "env steps to 0.9", "wall / loop s to 0.9", "training episodes: env steps / s to 0.9", "wall (s)"],
                lambda i: [i["name"], _status(i), _fmt(i["metrics"].get("num_envs")),
                           _fmt(i["metrics"].get("steady_sps")), _fmt(i["metrics"].get("end_to_end_sps")),
                           _fmt(i["metrics"].get("env_steps_to_0_9")),
                           f"{_fmt(i['metrics'].get('wall_s_to_0_9'))} / {_fmt(i['metrics'].get('loop_s_to_0_9'))}",
                           _train_to(i), _fmt(i["wall_s"])]),
        "vla": ("5. A VLA at PaliGemma-3B's widths (random bf16 weights, LoRA)",
                ["run", "status", "micro-batch (too large)", "params (trainable)", "peak GPU mem (GiB)",
                 "env-steps/s (iteration 2)", "wall (s)"],
                lambda i: [i["name"], _status(i),
                           f"{_fmt(i['metrics'].get('micro_batch_size'))} ({_fmt(i['metrics'].get('did_not_fit'))})",
                           f"{_fmt(i['metrics'].get('params'))} ({_fmt(i['metrics'].get('trainable'))})",
                           _fmt(i["metrics"].get("peak_gpu_mem_gib")),
                           _fmt(i["metrics"].get("iteration_env_steps_per_s")), _fmt(i["wall_s"])]),
        "rsl_rl": ("6. rsl_rl 5.5.1 on the same setting (its PPO, ours' settings)",
                   ["run", "status", "num_envs", "steady SPS", "training episodes: env steps / s to 0.9",
                    "final eval success", "wall (s)"],
                   lambda i: [i["name"], _status(i), _fmt(i["metrics"].get("num_envs")),
                              _fmt(i["metrics"].get("steady_sps")), _train_to(i),
                              _fmt(i["metrics"].get("final_eval_success")), _fmt(i["wall_s"])]),
        "mjlab": ("7. mjlab's tasks: ppo_continuous against mjlab's train script (rsl_rl 5.4.2), the task's recipe",
                  ["run", "status", "num_envs", "env steps", "steady env steps/s", "training return (end)",
                   "process (s)"],
                  lambda i: [i["name"], _status(i), _fmt(i["metrics"].get("num_envs")),
                             _fmt(i["metrics"].get("env_steps")), _fmt(i["metrics"].get("steady_sps")),
                             _fmt(i["metrics"].get("final_return")), _fmt(i["metrics"].get("process_s"))]),
    }  # fmt: skip
    for name, (heading, header, row) in sections.items():
        part = parts.get(name, {})
        if not part.get("items"):
            continue
        lines += [f"## {heading}", "", md_table(header, [row(i) for i in part["items"]]), ""]
        lines += side_by_side(parts) if name == "rsl_rl" else []
        lines += ["Commands:", "", "```bash", *(i["command"] for i in part["items"] if i.get("command")), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def section(data: dict[str, Any], out: Path) -> str:
    """The gpu-check section of docs/benchmarks.md: where the last GPU report is, and its part table."""
    docs, path = REPO / "docs", (out / "report.md").resolve()
    where = f"[report]({path.relative_to(docs)})" if path.is_relative_to(docs) else f"`{path}`"
    rows = [[n, p["status"], _fmt(p.get("wall_s"))] for n, p in data["parts"].items()]
    return (f"Last run {data['started']} on {data['device']['name']} (driver {data['device'].get('driver')}, torch "
            f"{data['device']['torch']}, CUDA {data['device'].get('cuda')}): {where}.\n\n"
            + md_table(["part", "status", "wall (s)"], rows))  # fmt: skip


if __name__ == "__main__":
    from benchmarks import gpu_check  # this file as a module: one copy of its state, whoever imports it

    if len(sys.argv) == 3 and sys.argv[1] == "_worker":
        gpu_check.worker_main(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "_job":
        gpu_check.job_main(sys.argv[2])
    else:
        data = gpu_check.main(tyro.cli(gpu_check.Args))
        sys.exit(0 if all(p["status"] in ("ok", "skipped") for p in data["parts"].values()) else 1)
