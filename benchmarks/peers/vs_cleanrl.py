"""Our ppo_continuous.py against CleanRL's ppo_continuous_action.py on CleanRL's own MuJoCo settings, side by side.

    uv pip install --target /tmp/cleanrl --no-deps cleanrl==1.2.0    # CleanRL's script (not part of this repository)
    uv run python -m benchmarks.peers.vs_cleanrl --cleanrl-script /tmp/cleanrl/cleanrl/ppo_continuous_action.py

Both scripts run in this project's environment (the same torch, Gymnasium 1.x and MuJoCo) and train the same task
(HalfCheetah-v4) with the same hyperparameters: CleanRL's defaults, which
benchmarks/suite/configs/ppo_continuous__HalfCheetah-v5.txt copies (1 env x 2048 steps, 10 epochs x 32 minibatches,
64x64 MLPs, observation and reward normalization). CleanRL's script is written for Gymnasium 0.29; it runs on 1.x after
two edits, made to a temporary copy (`gymnasium_1_edits`): `TransformObservation` is given the observation space, which
1.x requires, and the episode statistics are read from 1.x's `infos["episode"]` (0.29 put them in
`infos["final_info"]`) so the script logs its returns as it does on 0.29. Under 1.x's default autoreset the step
after an episode's end is a reset step, one transition in 1000 on HalfCheetah: the same work per step.
Ours runs with `--compile on`, what its default (`--compile auto`) picks for CleanRL's 1M-step runs but not for these
short ones; the compilation falls in the first iterations, outside the steady state and inside the whole-process
times, which are reported too. Runs alternate (ours, CleanRL, CleanRL, ours, ...) one at a time with one thread each
(OMP_NUM_THREADS=1), so drift of the machine falls on both alike. Speed is steady-state: env steps per second of wall
time from iteration `--skip` + 1 to the last one, from the TensorBoard event times of `charts/learning_rate`, which both
scripts log once per iteration after the update. Process start-up (imports, env creation) and our final evaluation
are outside it. Writes `--out`/vs_cleanrl.json, its provenance.json and the `vs-cleanrl-cpu` section of
docs/benchmarks.md.
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

from benchmarks.common import (
    CONFIG_DIR,
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
    shell_command,
    write_section,
)
from benchmarks.suite import provenance


@dataclass
class Args:
    cleanrl_script: str | None = None
    """CleanRL's ppo_continuous_action.py (from the `cleanrl` package, see the module docstring)"""
    env_id: str = "HalfCheetah-v4"
    """the MuJoCo id CleanRL's published runs used"""
    total_timesteps: int = 61_440
    """env steps per run (30 iterations of 2048)"""
    pairs: int = 3
    """(ours, CleanRL) pairs, run in the order ours, CleanRL, CleanRL, ours, ..."""
    skip: int = 3
    """iterations left out at the start of each run's steady-state measurement (from iteration skip + 1 on)"""
    out: str = str(RESULTS_DIR / "vs-cleanrl-cpu")
    """folder for vs_cleanrl.json"""
    results_md: str = str(RESULTS_MD)
    """markdown file whose vs-cleanrl-cpu section is replaced ('' to skip)"""


THREADS = {"OMP_NUM_THREADS": "1"}
GYMNASIUM_1_EDITS = [  # (what CleanRL's script says, what it says after the edit)
    (
        "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10))",
        "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)",
    ),
    (
        """            if "final_info" not in infos:
                continue

            for info in infos["final_info"]:
                # Skip the envs that are not done
                if info is None:
                    continue
                print(""",
        """            for i in np.flatnonzero(infos.get("_episode", [])):
                info = {"episode": {k: v[i] for k, v in infos["episode"].items()}}
                print(""",
    ),
]


def gymnasium_1_edits(source: str) -> str:
    """CleanRL's script with the two edits it needs for Gymnasium 1.x (module docstring); a one-line error if the
    script does not read as expected (another CleanRL version)."""
    for before, after in GYMNASIUM_1_EDITS:
        if source.count(before) != 1:
            sys.exit(f"error: --cleanrl-script: expected one '{before.strip().splitlines()[0]}' in it (cleanrl 1.2.0)")
        source = source.replace(before, after)
    return source


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
            sys.executable,
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
        read_flags(CONFIG_DIR / "ppo_continuous__HalfCheetah-v5.txt"),
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
        env = {**os.environ, **THREADS, "WANDB_MODE": "disabled"}
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
            f"Side by side, {time.strftime('%Y-%m-%d %H:%M', time.gmtime(data['finished']))} UTC: "
            "our `ppo_continuous.py` (`--compile on`, what `auto` picks for 1M steps) "
            f"and CleanRL's `ppo_continuous_action.py` (cleanrl {data['cleanrl_version']}, with the two edits it needs "
            f"for Gymnasium 1.x) in the same environment (Gymnasium {data['versions']['gymnasium']}, torch "
            f"{data['versions']['torch']}) on {a['env_id']} with CleanRL's MuJoCo settings, {a['total_timesteps']:,} "
            f"steps per run, one thread each, alternating; steady-state env steps/s from iteration {a['skip'] + 1} on.",
            "",
            f"- command: `{data['command']}`",
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


def cleanrl_version(script: Path) -> str:
    """The version of the cleanrl package the script comes from (its dist-info beside it), or "unknown"."""
    found = sorted(script.resolve().parents[1].glob("cleanrl-*.dist-info"))
    return found[0].name.removeprefix("cleanrl-").removesuffix(".dist-info") if found else "unknown"


def main(args: Args) -> dict:
    script = Path(args.cleanrl_script or "")
    if not args.cleanrl_script or not script.is_file():
        sys.exit(
            "error: --cleanrl-script must be CleanRL's ppo_continuous_action.py (uv pip install --target "
            f"/tmp/cleanrl --no-deps cleanrl==1.2.0; see benchmarks/peers/vs_cleanrl.py), got {args.cleanrl_script!r}"
        )
    command = (
        f"uv run python -m benchmarks.peers.vs_cleanrl --cleanrl-script <cleanrl>/ppo_continuous_action.py "
        f"--env-id {args.env_id} --total-timesteps {args.total_timesteps} --pairs {args.pairs} --skip {args.skip}"
    )
    git = git_info()  # the code the runs ran
    with tempfile.TemporaryDirectory() as tmp:
        cleanrl_script = Path(tmp) / "ppo_continuous_action.py"
        cleanrl_script.write_text(gymnasium_1_edits(script.read_text()))
        pairs = []
        for i in range(args.pairs):
            order = ("ours", "cleanrl") if i % 2 == 0 else ("cleanrl", "ours")
            pairs.append({"pair": i + 1, **{name: run_one(args, name, str(cleanrl_script)) for name in order}})
    data = {
        "args": vars(args),
        "command": command,
        "pairs": pairs,
        "cleanrl_version": cleanrl_version(script),
        "machine": machine_info(),
        "versions": package_versions(),
        "git": git,
        "finished": time.time(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vs_cleanrl.json").write_text(json.dumps(data, indent=1))
    runs = [  # each run's command, as typed in the repository root (the output directory a temporary one)
        shell_command(commands(args, Path("runs"), name, "<edited copy>/ppo_continuous_action.py"), THREADS)
        for name in ("ours", "cleanrl")
    ]
    provenance.record(out, command, runs, data["machine"], data["git"])
    text = report(data)
    print(text)
    if args.results_md:
        write_section(Path(args.results_md), "vs-cleanrl-cpu", text)
    return data


if __name__ == "__main__":
    main(tyro.cli(Args))
