"""Memory where one observation is not enough: ppo_recurrent.py on partially observed tasks, three experiments, one
report (docs/results/pomdp-cpu/).

    uv pip install --target /tmp/sb3 --no-deps sb3-contrib==2.9.2 stable-baselines3==2.9.2   # the peer (pendulum)
    uv run python -m benchmarks.experiments.pomdp                                 # all three, 3 seeds: ~1 h, 2-core CPU
    uv run python -m benchmarks.experiments.pomdp --experiment pendulum --seeds 5     # one of them
    uv run python -m benchmarks.experiments.pomdp --dry-run                           # print the commands, run nothing
    uv run python -m benchmarks.experiments.pomdp --report-only                       # the report again from runs.json

1. `pendulum`: PendulumNoVel (Pendulum-v1 without its angular velocity) at 100k env steps, then 10 deterministic
   evaluation episodes: sb3-contrib 2.9.2's RecurrentPPO with RL Zoo's recipe for PendulumNoVel-v1
   (benchmarks/peers/sb3_recurrent_ppo.py, which says where each value comes from), ours
   (benchmarks/suite/configs/pomdp/ppo_recurrent__PendulumNoVel.txt), and two controls with ours' budget and PPO
   settings: ppo_continuous.py's MLP on the same observation (it cannot tell the velocity from one frame) and on 4
   stacked frames (make_env's `frame_stack`; benchmarks/suite/configs/pomdp/ppo_continuous__PendulumNoVel.txt). The
   goal: ours' mean return at least sb3's, in at most a quarter of its training wall time.
2. `dropout`: PushCubeRL with sensor dropout of the cube (`{"dropout_sensor": "cube"}`, the default rate and outage
   lengths): ppo_recurrent.py and ppo_continuous.py at their defaults, and ppo_continuous.py on 4 stacked frames.
3. `full`: the fully observed PushCubeRL default, ppo_recurrent.py against ppo_continuous.py at their defaults: what
   memory costs where it is not needed.
PushCubeRL runs train `--total-timesteps` (default 1M) and evaluate every `--eval-freq` (5) iterations.
The hour is an estimate from short runs on a 2-core CPU (one thread each): sb3's 100k-step runs 6-8 min each (most
of the pendulum part), ours about 0.5 min; at 1M PushCubeRL steps ppo_recurrent about 2.5 min, ppo_continuous 1 min.

sb3 and sb3-contrib are installed into a folder outside the repository without their dependencies (what they need
at run time, torch, gymnasium, numpy and cloudpickle, is this environment's, the same versions our trainers run
with) and reach only the sb3 runner, through PYTHONPATH (`--sb3-path`), as benchmarks/peers/vs_cleanrl.py does with
CleanRL's script. Every run is its own process, one at a time, with OMP_NUM_THREADS=1, on the CPU; within each
experiment the order of the methods alternates from seed to seed (seed 1 in the listed order, seed 2 reversed, ...)
so that drift of the machine falls on all of them alike. Times: the training wall time is sb3's `learn()` alone and
our trainers' `wall_time_s` (summary.json: the training loop with its evaluations, the final one included); the
whole-process time is measured around each process by this driver (interpreter start-up, imports, envs included).
SPS is summary.json's (env steps over that wall time). "Env steps to success >= 0.9" is the first evaluation in
TensorBoard's eval/success_rate at or above 0.9. Writes `--out`: report.md, runs.json (every run's command, metrics
and times), provenance.json, dropout.png and full.png (eval success against env steps and wall time); the run
directories go to `--out`/runs/ (not committed). Each invocation writes the report of the experiments it ran.
`--tiny` runs everything at a few thousand steps with small networks: a test of the harness, not a measurement.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import tyro

from benchmarks.common import (
    CONFIG_DIR,
    REPO,
    RESULTS_DIR,
    SCRIPTS_DIR,
    commands_block,
    fail,
    failed_lines,
    finished,
    git_info,
    invocation,
    machine_info,
    md_table,
    merge_flags,
    package_versions,
    read_flags,
    read_scalars,
    record_lines,
    save_runs,
    saved_runs,
    shell_command,
    write_report,
)
from benchmarks.suite import curves, provenance, rlstats

EXPERIMENTS = ("pendulum", "dropout", "full")
THREADS = {"OMP_NUM_THREADS": "1"}
CONFIGS = CONFIG_DIR / "pomdp"
SB3_RUNNER = "benchmarks.peers.sb3_recurrent_ppo"  # run as a module from the repository root
SB3_INSTALL = "uv pip install --target /tmp/sb3 --no-deps sb3-contrib==2.9.2 stable-baselines3==2.9.2"
SUCCESS = 0.9  # the eval success rate of "env steps to success >= 0.9"
DROPOUT = {"dropout_sensor": "cube"}  # PushCubeRL's defaults: dropout_rate 0.05, dropout_steps [5, 20]
FRAME_STACK = 4

LABELS = {
    "sb3": "sb3-contrib RecurrentPPO (RL Zoo recipe)",
    "ppo_recurrent": "ppo_recurrent (LSTM, ours)",
    "ppo_continuous": "ppo_continuous (MLP)",
    "ppo_continuous_stacked": f"ppo_continuous (MLP), {FRAME_STACK} stacked frames",
}
METHODS = {  # each experiment's methods, in the order of its odd seeds (reversed for the even ones)
    "pendulum": ("sb3", "ppo_recurrent", "ppo_continuous", "ppo_continuous_stacked"),
    "dropout": ("ppo_recurrent", "ppo_continuous", "ppo_continuous_stacked"),
    "full": ("ppo_recurrent", "ppo_continuous"),
}
TINY = {  # --tiny: a few iterations of everything (a test of the harness)
    "pendulum": ["--total-timesteps", "2048"],
    "push": ["--total-timesteps", "2048", "--num-envs", "64", "--num-steps", "8", "--num-minibatches", "2",
             "--update-epochs", "2", "--eval-freq", "1", "--num-eval-envs", "8", "--num-eval-episodes", "8",
             "--hidden-sizes", "32", "32"],
    "ppo_recurrent": ["--rnn-hidden-size", "32"],
}  # fmt: skip


@dataclass
class Args:
    experiment: Literal["pendulum", "dropout", "full", "all"] = "all"
    """pendulum: PendulumNoVel, ours against sb3-contrib's RecurrentPPO and two MLP controls; dropout: PushCubeRL
    with the cube's sensor dropping out; full: fully observed PushCubeRL; all: the three, in this order"""
    seeds: int = 3
    """seeds 1..N of every method"""
    out: str = str(RESULTS_DIR / "pomdp-cpu")
    """output folder: report.md, runs.json, provenance.json, plots, runs/"""
    sb3_path: str = "/tmp/sb3"
    """folder with sb3-contrib 2.9.2 and stable-baselines3 2.9.2 (see the module docstring), PYTHONPATH of the sb3
    runs only"""
    pendulum_timesteps: int = 100_000
    """env steps of every pendulum run (RL Zoo's budget for PendulumNoVel-v1)"""
    total_timesteps: int = 1_000_000
    """env steps of every dropout and full run (PushCubeRL)"""
    eval_freq: int = 5
    """dropout and full: evaluate every this many iterations (64 deterministic episodes, the trainers' default)"""
    methods: tuple[str, ...] = ()
    """only these methods (sb3, ppo_recurrent, ppo_continuous, ppo_continuous_stacked; default: all)"""
    tiny: bool = False
    """a few thousand steps and small networks for every run: tests the harness, measures nothing"""
    dry_run: bool = False
    """print the commands in the order they would run, and run nothing"""
    report_only: bool = False
    """run nothing: the report again from --out/runs.json"""
    results_md: str = ""
    """a markdown file (e.g. docs/benchmarks.md) whose section named after --out's folder (pomdp-cpu) is replaced by
    the report ('': none)"""


@dataclass
class RunSpec:
    experiment: str
    method: str
    seed: int
    position: int  # the method's place in its seed's order (0 first)
    command: list[str]  # without --output-dir (added per run)
    env: dict[str, str]  # environment variables besides the inherited ones


# ---- the commands -------------------------------------------------------------------------------------------------
def experiments(args: Args) -> tuple[str, ...]:
    return EXPERIMENTS if args.experiment == "all" else (args.experiment,)


def trainer_flags(args: Args, experiment: str, method: str) -> list[str]:
    """Every flag of one of our runs but --seed and --output-dir."""
    script = "ppo_continuous" if method.startswith("ppo_continuous") else method
    stacked = method == "ppo_continuous_stacked"
    if experiment == "pendulum":
        flags = read_flags(CONFIGS / f"{script}__PendulumNoVel.txt")
        flags = merge_flags(flags, ["--total-timesteps", str(args.pendulum_timesteps), "--save-freq", "0"])
        if stacked:
            flags = merge_flags(
                flags, ["--env-kwargs", json.dumps({"obs_indices": [0, 1], "frame_stack": FRAME_STACK})]
            )
        return merge_flags(flags, TINY["pendulum"]) if args.tiny else flags
    env_kwargs = {**(DROPOUT if experiment == "dropout" else {}), **({"frame_stack": FRAME_STACK} if stacked else {})}
    flags = ["--env-id", "PushCubeRL"] + (["--env-kwargs", json.dumps(env_kwargs)] if env_kwargs else [])
    flags += ["--total-timesteps", str(args.total_timesteps), "--eval-freq", str(args.eval_freq)]
    flags += ["--save-freq", "0", "--no-cuda"]
    if args.tiny:
        flags = merge_flags(flags, TINY["push"], TINY.get(script, []))
    return flags


def method_command(args: Args, experiment: str, method: str, seed: int) -> tuple[list[str], dict[str, str]]:
    if method == "sb3":
        total = 2048 if args.tiny else args.pendulum_timesteps
        command = [sys.executable, "-m", SB3_RUNNER, "--seed", str(seed), "--total-timesteps", str(total)]
        return [*command, "--eval-episodes", "10"], {**THREADS, "PYTHONPATH": args.sb3_path}
    script = "ppo_continuous" if method.startswith("ppo_continuous") else method
    flags = merge_flags(trainer_flags(args, experiment, method), ["--seed", str(seed)])
    return [sys.executable, str(SCRIPTS_DIR / f"{script}.py"), *flags], dict(THREADS)


def plan(args: Args) -> list[RunSpec]:
    """Every run in the order it runs: experiment by experiment, seed by seed, the methods' order alternating."""
    if args.seeds < 1 or args.pendulum_timesteps < 1 or args.total_timesteps < 1 or args.eval_freq < 0:
        fail("--seeds, --pendulum-timesteps and --total-timesteps must be positive, --eval-freq >= 0")
    unknown = set(args.methods) - set(LABELS)
    if unknown:
        fail(f"--methods: unknown {', '.join(sorted(unknown))}; the methods are {', '.join(LABELS)}")
    specs = []
    for experiment in experiments(args):
        methods = [m for m in METHODS[experiment] if not args.methods or m in args.methods]
        for seed in range(1, args.seeds + 1):
            order = methods if seed % 2 else methods[::-1]
            for position, method in enumerate(order):
                command, env = method_command(args, experiment, method, seed)
                specs.append(RunSpec(experiment, method, seed, position, command, env))
    if not specs:
        fail(f"--methods {' '.join(args.methods)}: none of them is in --experiment {args.experiment}")
    return specs


def planned_updates(spec: RunSpec) -> int | None:
    """Minibatch updates one of our runs plans (what `--compile auto` decides on; None for sb3)."""
    if spec.method == "sb3":
        return None
    import importlib

    module = importlib.import_module(f"cleanrl_embodied.{Path(spec.command[1]).stem}")
    a = tyro.cli(module.Args, args=spec.command[2:])
    return max(1, a.total_timesteps // (a.num_envs * a.num_steps)) * a.update_epochs * a.num_minibatches


# ---- running and reading back -------------------------------------------------------------------------------------
def steps_to_success(run_dir: Path, threshold: float = SUCCESS) -> int | None:
    """Env steps at the first evaluation (TensorBoard eval/success_rate) at or above `threshold`; None: never.
    TensorBoard keeps float32: a rate of exactly 0.9 (9 of 10 episodes) reads 0.8999999762, which counts."""
    steps, values = read_scalars(run_dir).get("eval/success_rate", ([], []))
    threshold = float(np.float32(threshold))
    return next((step for step, value in zip(steps, values) if value >= threshold), None)


def run_one(spec: RunSpec, run_dir: Path) -> dict:
    """Run one spec in its own process; its record for runs.json."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    command = spec.command if spec.method == "sb3" else [*spec.command, "--output-dir", str(run_dir)]
    env = {**os.environ, **spec.env, "WANDB_MODE": "disabled"}
    started = time.time()
    start = time.perf_counter()
    with open(run_dir / "stdout.log", "w") as log:
        rc = subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    record = {
        "experiment": spec.experiment,
        "method": spec.method,
        "seed": spec.seed,
        "position": spec.position,
        "command": shell_command(command, spec.env),
        "returncode": rc,
        "started": round(started, 1),
        "process_s": round(time.perf_counter() - start, 2),
        "run_dir": os.path.relpath(run_dir, REPO) if run_dir.is_relative_to(REPO) else str(run_dir),
    }
    lines = (run_dir / "stdout.log").read_text().strip().splitlines()
    summaries = list(run_dir.glob("*/summary.json"))
    if rc or (spec.method != "sb3" and len(summaries) != 1):
        return {**record, "returncode": rc or 1, "error": " / ".join(lines[-3:])}
    if spec.method == "sb3":
        result = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
        metrics = {
            "env_steps": result["env_steps"],
            "train_s": result["train_s"],
            "sps": result["env_steps"] / result["train_s"],
            "eval_return": result["eval_return_mean"],
            "eval_return_std_episodes": result["eval_return_std"],
            "runner_process_s": result["process_s"],
        }
        return {**record, "metrics": metrics, "sb3": result}
    summary = json.loads(summaries[0].read_text())
    ev = summary["eval"]
    metrics = {
        "env_steps": summary["global_step"],
        "train_s": summary["wall_time_s"],
        "sps": summary["sps"],
        "eval_return": ev["episodic_return"],
        "success_rate": ev.get("success_rate"),
        "sensor_missing_fraction": ev.get("sensor_missing_fraction"),
        "steps_to_success": steps_to_success(summaries[0].parent),
        "sensor_missing_fractions": read_scalars(summaries[0].parent).get("eval/sensor_missing_fraction", ([], []))[
            1
        ],  # at every evaluation
        "planned_updates": planned_updates(spec),
    }
    return {
        **record,
        "metrics": metrics,
        "summary": {k: summary.get(k) for k in ("global_step", "wall_time_s", "sps", "eval", "versions", "compiled")},
        "curves": curves.read_curves(summaries[0].parent),
    }


def progress(r: dict) -> str:
    head = f"{r['experiment']} {r['method']} seed {r['seed']}:"
    if r["returncode"]:
        return f"{head} FAILED (exit {r['returncode']}): {r.get('error', '')}"
    m = r["metrics"]
    success = "" if m.get("success_rate") is None else f"success {m['success_rate']:.2f}, "
    return (f"{head} {success}return {m['eval_return']:.1f}, {m['env_steps']:,} steps, train {m['train_s']:.1f} s "
            f"(process {r['process_s']:.1f} s)")  # fmt: skip


# ---- the report ---------------------------------------------------------------------------------------------------
def mean_std(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    m, s = rlstats.mean_std(values)
    return f"{m:,.{digits}f} ± {s:,.{digits}f}"


def per_seed(runs: list[dict], value, digits: int) -> str:
    return ", ".join(f"{value(r):.{digits}f}" for r in sorted(runs, key=lambda r: r["seed"]))


def fmt_steps(step: int | None) -> str:
    return "not reached" if step is None else f"{step / 1e3:.0f}k"


def by_seed(runs: list[dict], method: str) -> dict[int, dict]:
    return {r["seed"]: r for r in runs if r["method"] == method}


def time_ratios(runs: list[dict], numerator: str, denominator: str, key: str) -> list[float]:
    """Per seed where both ran: numerator's `key` metric over denominator's (runs of one seed ran side by side)."""
    a, b = by_seed(runs, numerator), by_seed(runs, denominator)
    return [a[s]["metrics"][key] / b[s]["metrics"][key] for s in sorted(a.keys() & b.keys())]


def order_line(runs: list[dict]) -> str:
    seeds = sorted({r["seed"] for r in runs})
    in_order = sorted(runs, key=lambda r: r["position"])
    orders = [f"seed {s}: " + ", ".join(r["method"] for r in in_order if r["seed"] == s) for s in seeds]
    return "Order of the runs: " + "; ".join(orders) + "."


def methods_of(runs: list[dict], experiment: str) -> list[str]:
    return [m for m in METHODS[experiment] if any(r["method"] == m for r in runs)]


def pendulum_section(runs: list[dict], data: dict) -> list[str]:
    rows = []
    for method in methods_of(runs, "pendulum"):
        mine = [r for r in runs if r["method"] == method]
        returns = [r["metrics"]["eval_return"] for r in mine]
        ratio = time_ratios(runs, method, "sb3", "train_s") if method != "sb3" else []
        rows.append([
            LABELS[method], str(len(mine)), f"{max(r['metrics']['env_steps'] for r in mine):,}",
            mean_std(returns, 1), per_seed(mine, lambda r: r["metrics"]["eval_return"], 1),
            mean_std([r["metrics"]["train_s"] for r in mine], 1), mean_std([r["process_s"] for r in mine], 1),
            mean_std(ratio, 3) + "x" if ratio else "-",
        ])  # fmt: skip
    lines = [
        "## PendulumNoVel: ours against sb3-contrib's RecurrentPPO"
        if any(r["method"] == "sb3" for r in runs)
        else "## PendulumNoVel",
        "",
        "Pendulum-v1 without its angular velocity, "
        + (
            "a tiny budget (2,048 env steps; sb3 one rollout of 4,096)"
            if data["args"]["tiny"]
            else f"{data['args']['pendulum_timesteps']:,} env steps per run"
            + (" (RL Zoo's budget)" if data["args"]["pendulum_timesteps"] == 100_000 else "")
        )
        + ", then 10 "
        "deterministic evaluation episodes. Ours and the controls see [cos θ, sin θ] (`obs_indices [0, 1]`); sb3 sees "
        "RL Zoo's PendulumNoVel-v1, [cos θ, sin θ, 0] (the velocity multiplied by 0, RL Zoo's MaskVelocityWrapper). "
        "Eval return: mean ± std over seeds of each run's mean over its 10 episodes. Training wall time: sb3's "
        "`learn()` alone; ours' summary.json `wall_time_s` (the training loop and the final evaluation). Whole "
        "process: around each process. The ratio is per seed, of runs made side by side in this invocation.",
        "",
        md_table(
            [
                "method",
                "seeds",
                "env steps",
                "eval return (mean ± std)",
                "eval return per seed",
                "training wall time (s)",
                "whole process (s)",
                "training time / sb3's",
            ],
            rows,
        ),  # fmt: skip
        "",
        order_line(runs),
    ]
    ours, sb3 = by_seed(runs, "ppo_recurrent"), by_seed(runs, "sb3")
    if ours and sb3:
        ours_return = rlstats.mean_std([r["metrics"]["eval_return"] for r in ours.values()])[0]
        sb3_return = rlstats.mean_std([r["metrics"]["eval_return"] for r in sb3.values()])[0]
        ratio = sum(ratios := time_ratios(runs, "ppo_recurrent", "sb3", "train_s")) / len(ratios)
        better, faster = ours_return >= sb3_return, ratio <= 0.25
        lines += [
            "",
            f"Goal: ours' mean eval return at least sb3's, in at most a quarter of its training wall time. Return: "
            f"{ours_return:.1f} against {sb3_return:.1f}, {'met' if better else 'not met'}; training time: "
            f"{ratio:.3f}x sb3's (mean of the per-seed ratios "
            f"{', '.join(f'{x:.3f}' for x in ratios)}), {'met' if faster else 'not met'}. "
            f"**{'Goal met.' if better and faster else 'Goal not met.'}**",
        ]
    sb3_run = next((r for r in runs if r["method"] == "sb3"), None)
    if sb3_run:
        s = sb3_run["sb3"]
        lines += [
            "",
            f"sb3 side: sb3-contrib {s['versions']['sb3-contrib']}, stable-baselines3 "
            f"{s['versions']['stable-baselines3']}, in this environment (torch {s['versions']['torch']}, gymnasium "
            f"{s['versions']['gymnasium']}, numpy {s['versions']['numpy']}), installed with `{SB3_INSTALL}` and run "
            "with `PYTHONPATH=/tmp/sb3` (benchmarks/peers/sb3_recurrent_ppo.py). Its recipe, "
            f"{s['recipe_source']}, each value as there: "
            + ", ".join(f"{k} {v}" for k, v in s["recipe"].items())
            + f"; batch_size {s['batch_size']} (not in the recipe: sb3-contrib's default, as are vf_coef 0.5, "
            "max_grad_norm 0.5, log_std_init 0). `normalize: True` is VecNormalize on observations and rewards with "
            "gamma 0.9 (RL Zoo's ExperimentManager); the evaluation env holds a frozen copy of the observation "
            "statistics and no reward normalization. RecurrentPPO trains in whole rollouts of 4 x 1024 steps, so "
            f"its runs take {s['env_steps']:,} env steps.",
        ]
    return lines


def push_table(runs: list[dict], experiment: str) -> str:
    rows = []
    for method in methods_of(runs, experiment):
        mine = sorted((r for r in runs if r["method"] == method), key=lambda r: r["seed"])
        m = [r["metrics"] for r in mine]
        hits = [x["steps_to_success"] for x in m]
        rows.append([
            LABELS[method], str(len(mine)), f"{max(x['env_steps'] for x in m):,}",
            mean_std([x["success_rate"] or 0.0 for x in m], 2),
            per_seed(mine, lambda r: r["metrics"]["success_rate"] or 0.0, 2),
            curves.fmt_hits(hits, "k", 1e3), ", ".join(fmt_steps(h) for h in hits),
            mean_std([x["train_s"] for x in m], 1), mean_std([x["sps"] for x in m], 0),
            mean_std([r["process_s"] for r in mine], 1),
        ])  # fmt: skip
    header = ["method", "seeds", "env steps", "final eval success (mean ± std)", "per seed",
              f"env steps to success ≥ {SUCCESS:g} (reached)", "per seed", "wall time (s)", "SPS",
              "whole process (s)"]  # fmt: skip
    return md_table(header, rows)


def compile_note(runs: list[dict]) -> str:
    """What `--compile auto` picked for these runs: each run's summary.json says (`compiled`); runs from before it
    did were decided by the minibatch updates they planned (10,000 or more compiled)."""
    said = [(r.get("summary") or {}).get("compiled") for r in runs]
    if any(c is not None for c in said):
        compiled = sum(bool(c) for c in said)
        return (f" `--compile auto` (the default) decides by measuring each run's second iteration: {compiled} of "
                f"{len(said)} runs compiled.")  # fmt: skip
    updates = sorted({r["metrics"]["planned_updates"] for r in runs if r["metrics"].get("planned_updates")})
    if not updates:
        return ""
    planned = f"{updates[0]:,}" if len(updates) == 1 else f"{updates[0]:,} to {updates[-1]:,}"
    verdict = "so all ran eager" if updates[-1] < 10_000 else "so those at 10,000 or more compiled"
    return (f" At these runs' commits `--compile auto` (the default) compiled a run that planned 10,000 minibatch "
            f"updates or more; these plan {planned}, {verdict}.")  # fmt: skip


def push_section(runs: list[dict], data: dict, experiment: str, image_prefix: str, out: Path) -> list[str]:
    a = data["args"]
    budget = (
        "tiny" if a["tiny"] else f"{a['total_timesteps']:,} env steps, an evaluation every {a['eval_freq']} iterations"
    )
    if experiment == "dropout":
        title = "## PushCubeRL with the cube's sensor dropping out"
        missing = [x for r in runs for x in r["metrics"]["sensor_missing_fractions"]]
        final = [
            r["metrics"]["sensor_missing_fraction"] for r in runs if r["metrics"]["sensor_missing_fraction"] is not None
        ]
        text = (
            f"`--env-kwargs '{json.dumps(DROPOUT)}'` (dropout_rate 0.05, dropout_steps [5, 20], PushCubeRL's defaults; "
            "the eval envs inherit it): the cube's pose reads zeros, with a `sensor_missing` flag, for stretches of "
            f"steps. The cube was unseen {mean_std(missing, 3) if missing else '-'} of the steps of an evaluation "
            f"episode (env metric `sensor_missing_fraction`, mean ± std over the {len(missing)} evaluations of all "
            f"runs; the final evaluations: {mean_std(final, 3)}); in long episodes the rate gives p·m / (1 + p·m) = "
            f"0.05 · 12.5 / 1.625 = 0.385. The stacked control stacks the last {FRAME_STACK} observations "
            f"(`\"frame_stack\": {FRAME_STACK}` beside the dropout). {budget}; everything else at the trainers' "
            "defaults (`--no-cuda`, `--save-freq 0`)."
        )  # fmt: skip
    else:
        title = "## Fully observed PushCubeRL: what memory costs where it is not needed"
        ratios = time_ratios(runs, "ppo_continuous", "ppo_recurrent", "sps")
        text = (
            f"PushCubeRL's default env, {budget}, both trainers at their defaults (`--no-cuda`, `--save-freq 0`). "
            + (f"Speed: ppo_continuous ran {mean_std(ratios, 2)}x the SPS of ppo_recurrent (per seed, side by side: "
               f"{', '.join(f'{x:.2f}' for x in ratios)})." if ratios else "")
        )  # fmt: skip
    text += compile_note(runs)
    groups = {LABELS[m]: [r["curves"].get("eval/success_rate") for r in runs if r["method"] == m]
              for m in methods_of(runs, experiment)}  # fmt: skip
    plot = f"{experiment}.png"
    curves.plot_groups(
        groups, {}, f"PushCubeRL, {'cube sensor dropout' if experiment == 'dropout' else 'fully observed'}", out / plot
    )
    return [
        title,
        "",
        text,
        "",
        f"![{experiment}]({image_prefix}{plot})",
        "",
        push_table(runs, experiment),
        "",
        order_line(runs),
    ]


def report(data: dict, out: Path, image_prefix: str = "") -> str:
    ok = [r for r in data["runs"] if r["returncode"] == 0]
    failed = [r for r in data["runs"] if r["returncode"] != 0]
    lines = [
        f"{'**Tiny mode: a test of the harness, not a measurement.** ' if data['args']['tiny'] else ''}"
        f"{len(ok)} runs ({len(failed)} failed), one at a time with OMP_NUM_THREADS=1 on the CPU, "
        f"{data['total_s'] / 60:.1f} min in all, finished "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(data['finished']))} UTC.",
        "",
        *record_lines(data["command"], data["machine"], data["load_avg_end"], data["git"], data["versions"]),
        "- mean ± std: over seeds (sample std); the methods of one seed run one after another, their order "
        "alternating from seed to seed.",
    ]  # fmt: skip
    for experiment in EXPERIMENTS:
        runs = [r for r in ok if r["experiment"] == experiment]
        if not runs:
            continue
        lines.append("")
        if experiment == "pendulum":
            lines += pendulum_section(runs, data)
        else:
            lines += push_section(runs, data, experiment, image_prefix, out)
    lines += failed_lines(failed)
    lines += commands_block([r["command"] for r in data["runs"]], "; each run also gets --output-dir")
    return "\n".join(lines)


def write_outputs(data: dict, out: Path, results_md: str) -> None:
    save_runs(data, out)
    title = "# Memory on partially observed tasks (CPU)"
    write_report(out, title, lambda prefix: report(data, out, prefix), results_md)


def main(args: Args) -> dict | list[RunSpec]:
    out = Path(args.out).resolve()
    if args.report_only:
        data = saved_runs(out, "the experiments")
        write_outputs(data, out, args.results_md)
        return data
    specs = plan(args)
    if args.dry_run:
        for spec in specs:
            print(shell_command(spec.command, spec.env))
        return specs
    if any(s.method == "sb3" for s in specs) and not (Path(args.sb3_path) / "sb3_contrib").is_dir():
        fail(f"--sb3-path {args.sb3_path} holds no sb3_contrib: install it with `{SB3_INSTALL}` (or leave sb3 out: "
             "--methods ppo_recurrent ppo_continuous ppo_continuous_stacked)")  # fmt: skip
    command = invocation(__file__, sys.argv[1:])
    data = {
        "args": dataclasses.asdict(args),
        "command": command,
        "machine": machine_info(),
        "versions": package_versions(),
        "git": git_info(),  # the code the runs ran
        "runs": [],
    }
    start = time.time()
    for i, spec in enumerate(specs, 1):
        record = run_one(spec, out / "runs" / f"{spec.experiment}__{spec.method}__{spec.seed}")
        data["runs"].append(record)
        print(f"[{i}/{len(specs)}] {progress(record)}", flush=True)
        save_runs(data, out)
    finished(data, start)
    write_outputs(data, out, args.results_md)
    run_git = provenance.commits_of(data["runs"], data["git"])  # each trainer's own
    provenance.record(out, command, [r["command"] for r in data["runs"]], data["machine"], data["git"], run_git)
    return data


if __name__ == "__main__":
    main(tyro.cli(Args))
