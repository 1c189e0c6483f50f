"""Copy and modify, as docs/copy-and-modify.md shows it: each diff on that page, applied to a copy of its trainer in a
directory outside the repository and run from there, trains, names its run and its checkpoints after the copy,
records the file, and behaves as the page says (which files read its checkpoints, what export writes). The page's
diff of ppo_continuous.py against ppo_vla.py is checked against the files as they are."""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cleanrl_embodied import export, ppo_continuous, shared
from tests.checks import exits_in_one_line

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "copy-and-modify.md"
TINY = ["--num-envs", "8", "--num-steps", "10", "--num-minibatches", "2", "--update-epochs", "1", "--num-eval-envs",
        "2", "--num-eval-episodes", "2", "--eval-freq", "0", "--save-freq", "0", "--no-cuda", "--compile", "off",
        "--total-timesteps", "160", "--hidden-sizes", "32", "32"]  # fmt: skip
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:FutureWarning")


def page_diffs() -> dict[str, tuple[str, str]]:
    """{copy's name: (its original, the diff)} of every `<!-- tested: ORIGINAL -> COPY -->` block of the page."""
    found = re.findall(r"<!-- tested: (\S+) -> (\S+) -->\n```diff\n(.*?)\n```", PAGE.read_text(), re.S)
    return {copy: (original, diff) for original, copy, diff in found}


def apply(diff: str, text: str) -> str:
    """`text` with each hunk of a unified `diff` applied: its context and removed lines must occur exactly once."""
    hunks = re.split(r"^@@[^\n]*@@\n", diff, flags=re.M)[1:]
    for hunk in hunks:
        lines = hunk.splitlines()
        before = "".join(line[1:] + "\n" for line in lines if line[:1] in (" ", "-") or line == "")
        after = "".join(line[1:] + "\n" for line in lines if line[:1] in (" ", "+") or line == "")
        assert text.count(before) == 1, f"a hunk of the page's diff no longer fits its trainer:\n{before}"
        text = text.replace(before, after)
    return text


def make_copy(tmp_path: Path, name: str) -> Path:
    original, diff = page_diffs()[name]
    copy = tmp_path / "lab" / name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(apply(diff, (REPO / "cleanrl_embodied" / original).read_text()))
    return copy


def run_copy(copy: Path, *flags: str) -> Path:
    """Train the copy from its own directory (outside the repository), as a user runs it; its run directory."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, copy.name, *TINY, "--output-dir", "runs", *flags], cwd=copy.parent,
                         capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (run_dir,) = (copy.parent / "runs").iterdir()
    return run_dir


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"copy_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def original_args(tmp_path: Path, **overrides) -> ppo_continuous.Args:
    tiny = dict(num_envs=8, num_steps=10, num_minibatches=2, update_epochs=1, num_eval_envs=2, num_eval_episodes=2,
                eval_freq=0, save_freq=0, cuda=False, compile="off", total_timesteps=160,
                hidden_sizes=(32, 32))  # fmt: skip
    return ppo_continuous.Args(**{**tiny, "output_dir": str(tmp_path), **overrides})


def test_the_page_has_the_three_modifications():
    assert set(page_diffs()) == {"my_ppo_shared_memory.py", "my_ppo_lambda.py", "my_ppo_aux.py"}


def check_record(run_dir: Path, copy: Path) -> dict:
    """The run is named after the copy and records the copy, outside any repository."""
    assert f"__{copy.stem}__" in run_dir.name
    summary = json.loads((run_dir / "summary.json").read_text())
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    for record in (summary["trainer"], ckpt["trainer"]):
        assert record["script"] == copy.stem and record["path"] == str(copy.resolve())
        assert record["sha256"] == shared.describe_trainer(copy)["sha256"]
        assert record["git"]["state"] == "not in this repository"
    assert summary["script"] == ckpt["script"] == summary["args"]["exp_name"] == copy.stem
    return ckpt


def test_an_auxiliary_loss_changes_the_network_and_exports_its_own_actor(tmp_path):
    """The copy with a reward head trains from outside the repository and logs its auxiliary loss; ppo_continuous.py
    refuses its checkpoints in one line naming both files; export.py writes actor.pt and actor.onnx of the copy's
    network, which act as the copy's own deterministic evaluation does."""
    copy = make_copy(tmp_path, "my_ppo_aux.py")
    run_dir = run_copy(copy, "--aux-coef", "1.0")
    ckpt = check_record(run_dir, copy)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["train"]["losses/aux_loss"] > 0 and any(k.startswith("reward_head.") for k in ckpt["model"])
    checkpoint = str(run_dir / "checkpoints" / "last.pt")

    message = exits_in_one_line(lambda: ppo_continuous.main(original_args(tmp_path / "o", eval_checkpoint=checkpoint)))
    assert str(copy.resolve()) in message and str(Path(ppo_continuous.__file__).resolve()) in message
    assert "Agent (changed)" in message

    description = export.main(export.Args(checkpoint=checkpoint, out=str(tmp_path / "exported")))
    assert description["source"]["script"] == "my_ppo_aux" and description["source"]["trainer"]["path"] == str(copy)
    mine = load_module(copy)
    targs = mine.Args(**{k: tuple(v) if isinstance(v, list) else v for k, v in ckpt["args"].items()})
    envs = shared.make_env("PushCubeRL", num_envs=5, seed=11)
    agent = mine.make_agent(envs, targs)
    agent.load_state_dict(ckpt["model"])
    obs, _ = envs.reset(seed=11)
    obs = torch.cat([obs, envs.step(torch.rand(5, 7) * 2 - 1)[0]])
    with torch.no_grad():
        expected = mine.eval_action(agent, obs, None, None, True).clamp(-1, 1)
        traced = torch.jit.load(str(tmp_path / "exported" / "actor.pt"))(obs)
    torch.testing.assert_close(traced, expected, rtol=0, atol=1e-5)
    if os.environ.get("CI") or importlib.util.find_spec("onnxruntime"):
        import onnxruntime

        session = onnxruntime.InferenceSession(str(tmp_path / "exported" / "actor.onnx"))
        onnx_actions = torch.from_numpy(session.run(None, {"obs": obs.numpy()})[0])
        torch.testing.assert_close(onnx_actions, expected, rtol=0, atol=1e-5)


def test_another_return_estimator_keeps_the_network_so_the_original_evaluates_it(tmp_path):
    """The copy with the critic's own lambda checks its new flag in one line; its network is ppo_continuous.py's, so
    the original evaluates its checkpoint (the same result as the copy's own evaluation) but does not resume it."""
    copy = make_copy(tmp_path, "my_ppo_lambda.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    bad = subprocess.run([sys.executable, copy.name, "--value-lambda", "1.5"], cwd=copy.parent, capture_output=True,
                         text=True, env=env, timeout=120)  # fmt: skip
    assert bad.returncode == 1 and bad.stderr.strip() == "error: --value-lambda must be <= 1, got 1.5"
    run_dir = run_copy(copy, "--value-lambda", "0.5")
    check_record(run_dir, copy)
    checkpoint = str(run_dir / "checkpoints" / "last.pt")
    theirs = json.loads((run_dir / "summary.json").read_text())["eval"]
    evaluated = ppo_continuous.main(original_args(tmp_path / "o", eval_checkpoint=checkpoint))
    assert evaluated["eval"] == theirs
    message = exits_in_one_line(lambda: ppo_continuous.main(original_args(tmp_path / "r", resume=checkpoint)))
    assert message.startswith("error: --resume") and str(copy.resolve()) in message


def test_a_shared_memory_copy_of_ppo_recurrent_trains_and_exports_with_its_memory(tmp_path):
    copy = make_copy(tmp_path, "my_ppo_shared_memory.py")
    run_dir = run_copy(copy, "--rnn-hidden-size", "16", "--env-kwargs", '{"max_episode_steps": 6}')
    ckpt = check_record(run_dir, copy)
    assert not any(k.startswith("critic_rnn.") for k in ckpt["model"])
    assert ckpt["next_state"].shape == (8, 2 * 16)  # one LSTM's h and c for the actor and the critic together
    description = export.main(export.Args(checkpoint=str(run_dir / "checkpoints" / "last.pt"), num_check_envs=2,
                                          out=str(tmp_path / "exported")))  # fmt: skip
    assert description["inputs"][-1]["name"] == "memory" and description["inputs"][-1]["shape"] == ["batch", 32]
    assert description["check"]["steps"] > 6 and description["check"]["torchscript_max_abs_diff"] <= 1e-5


def vla_diff() -> str:
    """The page's diff of `main` from ppo_continuous.py to ppo_vla.py, made from the files: the hunks of the rollout
    and of the update, each cut where the logging starts."""

    def main_of(name: str) -> list[str]:
        text = (REPO / "cleanrl_embodied" / f"{name}.py").read_text()
        return text[text.index("\ndef main") + 1 :].splitlines(keepends=True)

    lines = list(difflib.unified_diff(main_of("ppo_continuous"), main_of("ppo_vla"), "ppo_continuous.py",
                                      "ppo_vla.py"))  # fmt: skip
    hunks, current = [], None
    for line in lines[2:]:
        if line.startswith("@@"):
            current = [line]
            hunks.append(current)
        else:
            current.append(line)
    kept = [h for h in hunks if any('storage["obs"][step]' in line or "perm[start" in line for line in h)]
    out = lines[:2]
    for hunk in kept:
        cut = next((i for i, line in enumerate(hunk) if "# ---- logging" in line), len(hunk))
        out += hunk[:cut] + (["...\n"] if cut < len(hunk) else [])
    return "".join(out).rstrip("\n")


def test_the_pages_diff_of_ppo_continuous_and_ppo_vla_is_the_files_diff():
    block = re.search(r"<!-- generated: diff-begin -->\n```diff\n(.*?)\n```\n<!-- generated: diff-end -->",
                      PAGE.read_text(), re.S)  # fmt: skip
    assert block, "docs/copy-and-modify.md lost its generated diff block"
    expected = vla_diff()
    assert block.group(1) == expected, (
        "docs/copy-and-modify.md's diff of ppo_continuous.py and ppo_vla.py is stale; replace the block between "
        f"<!-- generated: diff-begin --> and <!-- generated: diff-end --> with:\n```diff\n{expected}\n```"
    )


def test_the_pages_step_decision_is_ppo_vla_s():
    import ast

    source = (REPO / "cleanrl_embodied" / "ppo_vla.py").read_text()
    node = next(n for n in ast.parse(source).body if getattr(n, "name", None) == "step_decision")
    block = re.search(r"<!-- generated: step-begin -->\n```python\n(.*?)\n```\n<!-- generated: step-end -->",
                      PAGE.read_text(), re.S)  # fmt: skip
    assert block and block.group(1) == ast.get_source_segment(source, node), "the page's step_decision is stale"
