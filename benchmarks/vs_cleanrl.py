"""Our ppo_continuous.py against CleanRL's ppo_continuous_action.py on CleanRL's own MuJoCo settings, side by side.

    uv venv -p 3.11 /tmp/cleanrl-venv   # CleanRL's script needs Gymnasium 0.29 (its autoreset): a venv of its own
    uv pip install --python /tmp/cleanrl-venv/bin/python "gymnasium[mujoco]==0.29.1" tyro tensorboard "numpy<2" torch
    uv pip install --python /tmp/cleanrl-venv/bin/python --no-deps cleanrl
    uv run python benchmarks/vs_cleanrl.py --cleanrl-python /tmp/cleanrl-venv/bin/python

Both scripts train the same task (HalfCheetah-v4: the id Gymnasium 0.29 has; our venv's Gymnasium 1.x has it
too) with the same hyperparameters: CleanRL's defaults, which benchmarks/configs/ppo_continuous__HalfCheetah-v5.txt
copies (1 env x 2048 steps, 10 epochs x 32 minibatches, 64x64 MLPs, observation and reward normalization).
Ours runs with `--compile on`, what its default (`--compile auto`) picks for CleanRL's 1M-step runs but not for
these short ones; the compilation (~10 s) falls in the first iterations, outside the steady state and inside the
whole-process times, which are reported too. Runs alternate (ours, CleanRL, CleanRL, ours, ...) one at a time with
one thread each (OMP_NUM_THREADS=1), so drift of the machine falls on both alike. Speed is steady-state: env steps
per second of wall time between the iteration after `--skip` and the last one, from the TensorBoard event times of
`charts/learning_rate`, which both scripts log once per iteration after the update. Process start-up (imports,
Python compilation, env creation) and our final evaluation are outside it; whole-process times are reported too.
Writes `--out`/vs_cleanrl.json and the `vs-cleanrl-cpu` section of docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (  # noqa: E402
    BENCH,
    REPO,
    RESULTS_DIR,
    RESULTS_MD,
    describe_machine,
    git_info,
    machine_info,
    md_table,
    merge_flags,
    package_versions,
    read_flags,
    scalar_wall_times,
    write_section,
)


@dataclass
class Args:
    cleanrl_python: str | None = None
    """the Python of a venv with the `cleanrl` package and Gymnasium 0.29 (see the module docstring)"""
    env_id: str = "HalfCheetah-v4"
    """a MuJoCo id both Gymnasium versions have"""
    total_timesteps: int = 40_960
    """env steps per run (20 iterations of 2048)"""
    pairs: int = 2
    """(ours, CleanRL) pairs, run in the order ours, CleanRL, CleanRL, ours, ..."""
    skip: int = 2
    """iterations left out at the start of each run's steady-state measurement"""
    out: str = str(RESULTS_DIR / "vs-cleanrl-cpu")
    """folder for vs_cleanrl.json"""
    results_md: str = str(RESULTS_MD)
    """markdown file whose vs-cleanrl-cpu section is replaced ('' to skip)"""


def steady_sps(run_dir: Path, skip: int) -> tuple[float, int]:
    """Env steps per second between the iteration after `skip` and the last one (event wall times of the
    per-iteration `charts/learning_rate` scalar), and the number of iterations that span covers."""
    events = sorted(run_dir.rglob("events.out.tfevents.*"))
    if not events:
        raise RuntimeError(f"no TensorBoard events under {run_dir}")
    steps, times = scalar_wall_times(events[0].parent, "charts/learning_rate")
    if len(steps) < skip + 2:
        raise RuntimeError(f"{run_dir}: {len(steps)} iterations logged, need more than --skip {skip} + 1")
    return (steps[-1] - steps[skip]) / (times[-1] - times[skip]), len(steps) - 1 - skip


def commands(args: Args, out_dir: Path, script: str, cleanrl_script: str = "") -> list[str]:
    """The command line of one run: CleanRL's script (it writes runs/ under its working directory) or ours."""
    if script == "cleanrl":
        return [
            args.cleanrl_python,
            cleanrl_script,
            "--env-id",
            args.env_id,
            "--total-timesteps",
            str(args.total_timesteps),
            "--seed",
            "1",
            "--cuda",
            "False",
        ]
    flags = merge_flags(
        read_flags(BENCH / "configs" / "ppo_continuous__HalfCheetah-v5.txt"),
        [
            "--env-id",
            args.env_id,
            "--total-timesteps",
            str(args.total_timesteps),
            "--seed",
            "1",
            "--eval-freq",
            "0",
            "--save-freq",
            "0",
            "--num-eval-envs",
            "1",
            "--num-eval-episodes",
            "1",
            "--compile",  # what --compile auto picks for the 1M-step runs of these settings (156,000 updates)
            "on",
            "--output-dir",
            str(out_dir),
        ],
    )
    return [sys.executable, str(REPO / "cleanrl_embodied" / "ppo_continuous.py"), *flags]


def run_one(args: Args, script: str, cleanrl_script: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
        start = time.perf_counter()
        proc = subprocess.run(
            commands(args, Path(tmp) / "runs", script, cleanrl_script), cwd=tmp, env=env, capture_output=True, text=True
        )
        process_s = time.perf_counter() - start
        if proc.returncode:
            tail = " / ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            sys.exit(f"error: the {script} run failed (exit {proc.returncode}): {tail}")
        sps, iterations = steady_sps(Path(tmp) / "runs", args.skip)
    print(f"{script}: steady {sps:.0f} SPS over {iterations} iterations, process {process_s:.1f} s", flush=True)
    return {"script": script, "steady_sps": sps, "iterations": iterations, "process_s": process_s}


def report(data: dict) -> str:
    rows = [
        [
            str(p["pair"]),
            f"{p['ours']['steady_sps']:.0f}",
            f"{p['cleanrl']['steady_sps']:.0f}",
            f"{p['ours']['steady_sps'] / p['cleanrl']['steady_sps']:.2f}x",
            f"{p['ours']['process_s']:.1f} / {p['cleanrl']['process_s']:.1f}",
        ]
        for p in data["pairs"]
    ]
    ratios = [p["ours"]["steady_sps"] / p["cleanrl"]["steady_sps"] for p in data["pairs"]]
    a = data["args"]
    return "\n".join(
        [
            f"Side by side, {time.strftime('%Y-%m-%d %H:%M', time.localtime(data['finished']))}: "
            "our `ppo_continuous.py` (`--compile on`, what `auto` picks for 1M steps) "
            f"and CleanRL's `ppo_continuous_action.py` (cleanrl {data['cleanrl_version']}, Gymnasium "
            f"{data['cleanrl_gymnasium']}, torch {data['cleanrl_torch']}) on {a['env_id']} with CleanRL's MuJoCo "
            f"settings, {a['total_timesteps']:,} steps per run, one thread each, alternating; steady-state env steps/s "
            f"after {a['skip']} iterations.",
            "",
            "- command: `uv run python benchmarks/vs_cleanrl.py --cleanrl-python <venv>/bin/python "
            f"--pairs {a['pairs']} "
            f"--total-timesteps {a['total_timesteps']}`",
            f"- machine: {describe_machine(data['machine'])}",
            f"- versions (ours): {', '.join(f'{k} {v}' for k, v in data['versions'].items())}",
            f"- git: {data['git']['git_sha']}",
            "",
            md_table(
                ["pair", "ours (SPS)", "CleanRL (SPS)", "ours / CleanRL", "whole process (s), ours / CleanRL"], rows
            ),
            "",
            f"Median ratio over {len(ratios)} pairs: **{statistics.median(ratios):.2f}x** CleanRL's training speed "
            f"(above 1: ours is faster).",
        ]
    )


def main(args: Args) -> dict:
    if not args.cleanrl_python or not Path(args.cleanrl_python).is_file():
        sys.exit(
            f"error: --cleanrl-python must be the python of a venv with cleanrl and Gymnasium 0.29 (see "
            f"benchmarks/vs_cleanrl.py's docstring), got {args.cleanrl_python!r}"
        )
    probe_code = (
        "import cleanrl, gymnasium, torch, importlib.metadata as m; print(m.version('cleanrl'), "
        "gymnasium.__version__, torch.__version__, list(cleanrl.__path__)[0])"
    )
    probe = subprocess.run([args.cleanrl_python, "-c", probe_code], capture_output=True, text=True)
    if probe.returncode:
        sys.exit(f"error: --cleanrl-python {args.cleanrl_python}: cannot import cleanrl and gymnasium there")
    cleanrl_version, cleanrl_gymnasium, cleanrl_torch, cleanrl_dir = probe.stdout.split()
    cleanrl_script = str(Path(cleanrl_dir) / "ppo_continuous_action.py")
    pairs = []
    for i in range(args.pairs):
        order = ("ours", "cleanrl") if i % 2 == 0 else ("cleanrl", "ours")
        pairs.append({"pair": i + 1, **{script: run_one(args, script, cleanrl_script) for script in order}})
    data = {
        "args": vars(args),
        "pairs": pairs,
        "cleanrl_version": cleanrl_version,
        "cleanrl_gymnasium": cleanrl_gymnasium,
        "cleanrl_torch": cleanrl_torch,
        "machine": machine_info(),
        "versions": package_versions(),
        "git": git_info(),
        "finished": time.time(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vs_cleanrl.json").write_text(json.dumps(data, indent=1))
    text = report(data)
    print(text)
    if args.results_md:
        write_section(Path(args.results_md), "vs-cleanrl-cpu", text)
    return data


if __name__ == "__main__":
    main(tyro.cli(Args))
