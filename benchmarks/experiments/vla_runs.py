"""What the VLA experiments (vla_rl.py, vla_fewshot.py) share: the 0/1 success reward, a step run once with its CPU
time recorded, the deterministic evaluation of saved policies on the same episodes, and the formats of their
intervals over seeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from benchmarks.common import REPO, git_info, shell_command
from benchmarks.suite import rlstats

SPARSE_REWARD = {"reach": 0, "place": 0, "time": 0, "success": 1}  # 1 on success, else 0
FINAL_EVAL_KEY = (
    1000  # the paired final evaluation's seed stream: a spawn key no shared.random_streams.STREAMS entry uses
)


def time_file(runs: Path, name: str) -> Path:
    return runs / f"{name}.time.json"


def run(runs: Path, name: str, cmd: list[str]) -> dict:
    """Run ``cmd`` (one thread), its output to ``runs/<name>.log``; record its CPU (``os.wait4``) and wall seconds and
    the commit it started from (``git``) in its time file
    (vla_rl.py and vla_fewshot.py run their commands with this)."""
    git = git_info()  # the code the run starts with
    log = runs / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": os.environ.get("WANDB_MODE", "disabled")}
    start = time.time()
    with log.open("w") as f:
        process = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise RuntimeError(f"{shell_command(cmd)} exited {process.returncode}; its output is in {log}")
    record = {"cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": time.time() - start, "command": shell_command(cmd),
              "git": git}  # fmt: skip
    time_file(runs, name).write_text(json.dumps(record, indent=1) + "\n")
    print(f"{name}: {record['cpu_s'] / 60:.1f} CPU min, {record['wall_s'] / 60:.1f} wall min", flush=True)
    return record


def recorded(runs: Path, name: str) -> dict | None:
    path = time_file(runs, name)
    return json.loads(path.read_text()) if path.is_file() else None


def evaluate_sources(sources: dict, envs: dict, episodes: int, results: dict, label: str) -> dict:
    """Each source not yet in ``results`` (name -> (model directory, RL checkpoint on it or None)), loaded as
    ``--policy-kwargs '{"model_path": ...}'`` loads it, evaluated deterministically on each of ``envs`` (which ->
    (vector env, reset seed)); the results are added to ``results`` and the envs closed."""
    import torch

    from cleanrl_embodied.shared.checkpoints import load_model_state
    from examples.hf_vla import make_policy
    from examples.hf_vla.bc import evaluate_policy

    head = SimpleNamespace(action_head="bins", action_bins=16, action_chunk=1)
    torch.set_num_threads(1)
    for name, (model_dir, ckpt) in sources.items():
        if name in results:
            continue
        env = next(iter(envs.values()))[0]
        policy = make_policy(env.single_observation_space, env.single_action_space, head, model_path=str(model_dir))
        if ckpt is not None:
            try:  # weights_only: a checkpoint is data; a pickle that would run code is refused, not run
                state = torch.load(ckpt, map_location="cpu", weights_only=True)
            except Exception as e:  # noqa: BLE001 - any unreadable file is refused the same way
                sys.exit(f"error: {ckpt}: not a readable checkpoint ({type(e).__name__}); it is not evaluated")
            load_model_state(policy, state, "checkpoint", str(ckpt))
        with torch.no_grad():
            results[name] = {w: evaluate_policy(policy.eval(), e, episodes, s) for w, (e, s) in envs.items()}
        print(f"{label} {name}: " + ", ".join(f"{r['success_rate']:.3f} ({w})" for w, r in results[name].items()),
              flush=True)  # fmt: skip
    for env, _ in envs.values():
        env.close()
    return results


def interval(values: list[float]) -> str:
    """Mean and 95% t-interval half-width over seeds (`rlstats.t_interval`: Student's t with n - 1 degrees of freedom),
    e.g. "0.62 ± 0.09" (one value: the value alone)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return f"{v.mean():.2f}" if len(v) else ""
    half = rlstats.t_interval(v)[1]
    return f"{v.mean():+.2f} ± {half:.2f}" if (v < 0).any() else f"{v.mean():.2f} ± {half:.2f}"


def signed(values: list[float]) -> str:
    """As :func:`interval`, with the mean's sign always shown (a difference; -0.00 reads +0.00)."""
    v = np.asarray(values, dtype=float)
    if not len(v):
        return ""
    mean = round(float(v.mean()), 2) + 0.0  # (+ 0.0: no negative zero)
    if len(v) < 2:
        return f"{mean:+.2f}"
    half = rlstats.t_interval(v)[1]
    return f"{mean:+.2f} ± {half:.2f}"
