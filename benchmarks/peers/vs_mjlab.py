"""Our ppo_continuous.py against mjlab's own train script (rsl_rl 5.4.2 with the task's recipe) on mjlab's tasks.

    uv sync --locked --extra mjlab                       # mjlab 1.6.0 (it replaces the mujoco extra in .venv)
    uv run python -m benchmarks.peers.vs_mjlab             # Cartpole Swingup and Balance, 3 seeds: ~2.5-3 h, 2-core CPU
    uv run python -m benchmarks.peers.vs_mjlab --tasks Mjlab-Cartpole-Swingup --seeds 1 --no-smoke
    uv run python -m benchmarks.peers.vs_mjlab --dry-run       # print the commands, run nothing
    uv run python -m benchmarks.peers.vs_mjlab --report-only   # the report again from runs.json
    uv sync --extra mujoco --extra vla --extra export    # back to the usual environment afterwards
    # or keep .venv as it is: UV_PROJECT_ENVIRONMENT=.venv-mjlab before the first two (and `uv run --extra mjlab`)

On each Cartpole task, three methods with the same number of envs (64, mjlab's CPU figure) and env steps (the
recipe's 500 iterations of 32 steps per env: 1,024,000), 3 seeds each:

1. `rsl_rl`: `python -m mjlab.scripts.train <task>` (mjlab's script: rsl_rl's OnPolicyRunner through mjlab's
   RslRlVecEnvWrapper, auto-reset inside mjlab's step, `init_at_random_ep_len=True`), its recipe as registered.
2. `ppo_continuous`: ours on `--env-id mjlab:<task>` with the recipe mapped onto its flags (`RECIPES` below:
   envs, steps per env, epochs, minibatches, learning rate, gamma, lambda, entropy, clipping, value loss, gradient
   norm, widths, initial std, observation normalization, the critic group as the privileged critic), the
   episodes started at random points as rsl_rl's are (`init_at_random_ep_len`). A time-out is bootstrapped from
   V(final observation), the true terminal state.
3. `timeouts_terminal`: ours with time-outs treated as terminations (`is_finite_horizon: true`, mjlab's own option:
   the same env, its time limit reported as a true end), the defect our contract avoids. Cartpole's episodes only
   ever end at their 1000-step time limit, so every episode end is one.

What still differs between 1 and 2, and cannot be mapped: rsl_rl's adaptive learning rate (desired KL 0.01) against
ours' linear annealing with an early stop at KL 0.1; ELU against tanh; a scalar std against a log-std; advantages
normalized over the batch against per minibatch; rsl_rl bootstraps a time-out by adding gamma * V(s_t) (the
value of the state the last action was taken in) to its reward, ours with V(final obs).

Returns: each method's training return (mean over the finished episodes, dt-scaled rewards as mjlab's env gives
them: at most 50 per 1000-step Cartpole episode) against env steps and against wall time from the process start;
rsl_rl's `Train/mean_reward` (the mean of its last 100 finished episodes), ours' `charts/episodic_return` (the
episodes finished in each iteration); ours also evaluate deterministically at the end (16 episodes). Speed: the
median over iterations after `--skip` of env steps per second between successive per-iteration TensorBoard events
(rsl_rl `Loss/learning_rate`, ours `charts/SPS`). Every run is its own process, one at a time, with
OMP_NUM_THREADS=1 and CUDA_VISIBLE_DEVICES="" (mjlab on the CPU); within each task the order of the methods
alternates from seed to seed. After the Cartpole runs, a smoke run of ppo_continuous on `Mjlab-Lift-Cube-Yam` and
`Mjlab-Velocity-Flat-Unitree-Go1` (a few iterations with their recipes, a short evaluation) logs success and mjlab's
episode metrics. Writes `--out`: report.md, runs.json (after every run), provenance.json, one plot per task; the run
directories go to `--out`/runs/ (not committed). `--tiny`: a few iterations of everything (a test of the harness).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import tyro

from benchmarks.common import (
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
    package_versions,
    read_scalars,
    record_lines,
    save_runs,
    saved_runs,
    scalar_wall_times,
    shell_command,
    write_report,
)
from benchmarks.suite import provenance

MJLAB_VERSION = "1.6.0"
INSTALL = "uv sync --locked --extra mjlab"
CPU_ENV = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
TASKS = ("Mjlab-Cartpole-Swingup", "Mjlab-Cartpole-Balance")
SMOKE_TASKS = ("Mjlab-Lift-Cube-Yam", "Mjlab-Velocity-Flat-Unitree-Go1")
METHODS = ("rsl_rl", "ppo_continuous", "timeouts_terminal")
LABELS = {
    "rsl_rl": "mjlab train.py (rsl_rl 5.4.2)",
    "ppo_continuous": "ppo_continuous (time-outs bootstrapped)",
    "timeouts_terminal": "ppo_continuous, time-outs as terminations",
}

# The rsl_rl recipes of mjlab 1.6.0 (mjlab.tasks.registry.load_rl_cfg(task), the values that map onto our flags);
# a run checks them against the installed mjlab (`check_recipes`).
_CARTPOLE = dict(num_steps_per_env=32, max_iterations=500, num_learning_epochs=5, num_mini_batches=4,
                 learning_rate=1e-3, gamma=0.99, lam=0.95, entropy_coef=0.01, clip_param=0.2, value_loss_coef=1.0,
                 use_clipped_value_loss=True, max_grad_norm=1.0, hidden_dims=(64, 64), init_std=1.0,
                 obs_normalization=False)  # fmt: skip
_LEGGED = dict(_CARTPOLE, num_steps_per_env=24, hidden_dims=(512, 256, 128), obs_normalization=True)
RECIPES = {
    "Mjlab-Cartpole-Swingup": _CARTPOLE,
    "Mjlab-Cartpole-Balance": _CARTPOLE,
    "Mjlab-Velocity-Flat-Unitree-Go1": dict(_LEGGED, max_iterations=10000),
    "Mjlab-Lift-Cube-Yam": dict(_LEGGED, max_iterations=5000, entropy_coef=0.005),
}


@dataclass
class Args:
    tasks: tuple[str, ...] = TASKS
    """the tasks of the comparison (mjlab ids with a recipe in RECIPES)"""
    seeds: int = 3
    """seeds 1..N of every method"""
    methods: tuple[str, ...] = METHODS
    """rsl_rl, ppo_continuous, timeouts_terminal"""
    num_envs: int = 64
    """envs of every run (both sides)"""
    iterations: int | None = None
    """iterations of every run (default: the recipe's max_iterations, 500 for Cartpole)"""
    skip: int = 3
    """iterations left out at the start of each run's speed measurement"""
    smoke: bool = True
    """also a smoke run of ppo_continuous on Mjlab-Lift-Cube-Yam and Mjlab-Velocity-Flat-Unitree-Go1"""
    smoke_iterations: int = 3
    """iterations of each smoke run"""
    out: str = str(RESULTS_DIR / "vs-mjlab-cpu")
    """output folder: report.md, runs.json, provenance.json, plots, runs/"""
    cuda: bool = False
    """both sides on the GPU (mjlab's `--gpu-ids 0`, ours `--cuda`; for benchmarks/gpu_check.py), not the CPU"""
    tiny: bool = False
    """a few iterations of 8 envs with short episodes for every run (--skip 0): tests the harness, measures nothing"""
    dry_run: bool = False
    """print the commands in the order they would run, and run nothing"""
    report_only: bool = False
    """run nothing: the report again from --out/runs.json"""
    keep_finished: bool = False
    """keep the runs --out/runs.json finished with these settings (same task, method and seed) and run only the
    others: more seeds (`--seeds 3` after a run of `--seeds 1`), or the rest of a stopped run"""
    results_md: str = ""
    """a markdown file (e.g. docs/benchmarks.md) whose section named after --out's folder is replaced ('': none)"""


@dataclass
class RunSpec:
    task: str
    method: str  # one of METHODS, or "smoke"
    seed: int
    position: int  # the method's place in its seed's order (0 first)
    command: list[str]  # the run directory is added per run (rsl_rl: --log-root, ours: --output-dir)
    env: dict[str, str] = field(default_factory=dict)
    env_steps: int = 0


# ---- the commands -------------------------------------------------------------------------------------------------
def recipe_flags(task: str, num_envs: int) -> list[str]:
    """The task's rsl_rl recipe as ppo_continuous flags (what maps; the module docstring says what does not).
    rsl_rl's value loss is the mean squared error times value_loss_coef, ours half of it times vf_coef: twice."""
    r = RECIPES[task]
    flags = ["--env-id", f"mjlab:{task}", "--num-envs", str(num_envs), "--num-steps", str(r["num_steps_per_env"]),
             "--update-epochs", str(r["num_learning_epochs"]), "--num-minibatches", str(r["num_mini_batches"]),
             "--learning-rate", f"{r['learning_rate']:g}", "--gamma", f"{r['gamma']:g}", "--gae-lambda",
             f"{r['lam']:g}", "--ent-coef", f"{r['entropy_coef']:g}", "--clip-coef", f"{r['clip_param']:g}",
             "--vf-coef", f"{2 * r['value_loss_coef']:g}", "--max-grad-norm", f"{r['max_grad_norm']:g}",
             "--hidden-sizes", *map(str, r["hidden_dims"]), "--init-logstd", f"{math.log(r['init_std']):g}",
             "--privileged-critic"]  # fmt: skip
    flags += ["--clip-vloss"] if r["use_clipped_value_loss"] else []
    flags += ["--norm-obs"] if r["obs_normalization"] else []
    return flags


def iterations_of(args: Args, task: str) -> int:
    if args.tiny:
        return 2
    return args.iterations or RECIPES[task]["max_iterations"]


def steps_per_env(args: Args, task: str) -> int:
    return 8 if args.tiny else RECIPES[task]["num_steps_per_env"]


def num_envs_of(args: Args) -> int:
    return 8 if args.tiny else args.num_envs


def device_env(args: Args) -> dict[str, str]:
    """The variables of every run: on the CPU one thread and no GPU; on the GPU none."""
    return {} if args.cuda else dict(CPU_ENV)


TINY_EPISODE_S = 1.0  # --tiny: Cartpole episodes of 20 steps, so that they end within the run


def method_command(args: Args, task: str, method: str, seed: int) -> tuple[list[str], dict[str, str], int]:
    """The command of one run (without its run directory), its environment variables, and its env steps."""
    iterations, steps, envs = iterations_of(args, task), steps_per_env(args, task), num_envs_of(args)
    env_steps = iterations * steps * envs
    if method == "rsl_rl":
        command = [sys.executable, "-m", "mjlab.scripts.train", task, "--env.scene.num-envs", str(envs),
                   "--gpu-ids", "0" if args.cuda else "None", "--agent.logger", "tensorboard",
                   "--agent.seed", str(seed), "--agent.max-iterations", str(iterations),
                   "--agent.run-name", f"seed{seed}"]  # fmt: skip
        if args.tiny:
            command += ["--agent.num-steps-per-env", str(steps), "--env.episode-length-s", f"{TINY_EPISODE_S:g}"]
        return command, {**device_env(args), "WANDB_MODE": "disabled"}, env_steps
    env_kwargs = {"init_at_random_ep_len": True}
    if method == "timeouts_terminal":
        env_kwargs["is_finite_horizon"] = True
    if args.tiny:
        env_kwargs["episode_length_s"] = TINY_EPISODE_S
    flags = recipe_flags(task, envs)
    if args.tiny:
        flags[flags.index("--num-steps") + 1] = str(steps)
    flags += ["--env-kwargs", json.dumps(env_kwargs), "--total-timesteps", str(env_steps), "--seed", str(seed),
              "--cuda" if args.cuda else "--no-cuda", "--eval-freq", "0", "--num-eval-envs", "4" if args.tiny else "16",
              "--num-eval-episodes", "4" if args.tiny else "16"]  # fmt: skip
    return [sys.executable, str(SCRIPTS_DIR / "ppo_continuous.py"), *flags], device_env(args), env_steps


def smoke_command(args: Args, task: str) -> tuple[list[str], dict[str, str], int]:
    """A few iterations of ppo_continuous with the task's recipe, then 4 evaluation episodes of 2 s (100 steps)."""
    envs = 4 if args.tiny else args.num_envs
    iterations = 1 if args.tiny else args.smoke_iterations
    steps = 4 if args.tiny else RECIPES[task]["num_steps_per_env"]
    flags = recipe_flags(task, envs)
    flags[flags.index("--num-steps") + 1] = str(steps)
    episode = {"episode_length_s": 0.2 if args.tiny else 2.0}
    flags += ["--total-timesteps", str(iterations * steps * envs), "--seed", "1", "--no-cuda", "--eval-freq", "0",
              "--save-freq", "0", "--num-eval-envs", "2" if args.tiny else "4", "--num-eval-episodes",
              "2" if args.tiny else "4", "--eval-env-kwargs", json.dumps(episode)]  # fmt: skip
    if args.tiny:
        flags += ["--hidden-sizes", "16", "16"]
    return [sys.executable, str(SCRIPTS_DIR / "ppo_continuous.py"), *flags], dict(CPU_ENV), iterations * steps * envs


def plan(args: Args) -> list[RunSpec]:
    """Every run in the order it runs: task by task, seed by seed, the methods' order alternating; the smoke runs
    last."""
    unknown = [t for t in args.tasks if t not in RECIPES] + [m for m in args.methods if m not in METHODS]
    if unknown:
        fail(f"unknown task or method {', '.join(unknown)}: tasks {', '.join(RECIPES)}; methods {', '.join(METHODS)}")
    if args.seeds < 1 or args.num_envs < 1 or (args.iterations is not None and args.iterations < 1):
        fail("--seeds, --num-envs and --iterations must be positive")
    specs = []
    for task in args.tasks:
        methods = [m for m in METHODS if m in args.methods]
        for seed in range(1, args.seeds + 1):
            for position, method in enumerate(methods if seed % 2 else methods[::-1]):
                command, env, steps = method_command(args, task, method, seed)
                specs.append(RunSpec(task, method, seed, position, command, env, steps))
    for task in SMOKE_TASKS if args.smoke else ():
        command, env, steps = smoke_command(args, task)
        specs.append(RunSpec(task, "smoke", 1, 0, command, env, steps))
    return specs


def check_recipes(tasks) -> None:
    """The recipes above against the installed mjlab's (a run of another mjlab version would map another recipe)."""
    from mjlab.tasks.registry import load_rl_cfg

    for task in tasks:
        cfg = load_rl_cfg(task)
        a, actor = cfg.algorithm, cfg.actor
        theirs = dict(num_steps_per_env=cfg.num_steps_per_env, max_iterations=cfg.max_iterations,
                      num_learning_epochs=a.num_learning_epochs, num_mini_batches=a.num_mini_batches,
                      learning_rate=a.learning_rate, gamma=a.gamma, lam=a.lam, entropy_coef=a.entropy_coef,
                      clip_param=a.clip_param, value_loss_coef=a.value_loss_coef,
                      use_clipped_value_loss=a.use_clipped_value_loss, max_grad_norm=a.max_grad_norm,
                      hidden_dims=tuple(actor.hidden_dims), init_std=(actor.distribution_cfg or {}).get("init_std"),
                      obs_normalization=actor.obs_normalization)  # fmt: skip
        differs = {k: (v, theirs[k]) for k, v in RECIPES[task].items() if theirs[k] != v}
        if differs:
            fail(f"{task}: the installed mjlab's recipe differs from mjlab {MJLAB_VERSION}'s (ours, theirs): {differs}")


# ---- running and reading back -------------------------------------------------------------------------------------
def steady_rate(steps: list[float], walls: list[float], skip: int) -> float | None:
    """Median over the iterations after `skip` of env steps per second between successive per-iteration events."""
    rates = [(steps[i] - steps[i - 1]) / (walls[i] - walls[i - 1])
             for i in range(max(1, skip), len(steps)) if walls[i] > walls[i - 1]]  # fmt: skip
    return statistics.median(rates) if rates else None


def rsl_rl_metrics(log_root: Path, collection: int, started: float, skip: int) -> dict:
    """rsl_rl's TensorBoard scalars (step = iteration) as env steps: training return, speed, wall times."""
    events = sorted(log_root.rglob("events.out.tfevents.*"))
    if not events:
        raise RuntimeError(f"no TensorBoard events under {log_root}")
    run_dir = events[0].parent
    scalars = read_scalars(run_dir)
    its, walls = scalar_wall_times(run_dir, "Loss/learning_rate")
    steps = [(i + 1) * collection for i in its]
    ret_its, returns = scalars.get("Train/mean_reward", ([], []))
    _, ret_walls = scalar_wall_times(run_dir, "Train/mean_reward") if ret_its else ([], [])
    fps = scalars.get("Perf/total_fps", ([], []))[1]
    return {
        "env_steps": steps[-1] if steps else 0,
        "steady_sps": steady_rate(steps, walls, skip),
        "median_total_fps": statistics.median(fps) if fps else None,
        "curve": {
            "step": [(i + 1) * collection for i in ret_its],
            "value": list(returns),
            "time_s": [round(w - started, 2) for w in ret_walls],
        },
        "loop_s": round(walls[-1] - walls[0], 2) if walls else None,
        "run_dir": str(run_dir),
    }


def ours_metrics(run_dir: Path, started: float, skip: int) -> dict:
    summary = json.loads(next(run_dir.glob("*/summary.json")).read_text())
    tb = next(run_dir.glob("*/summary.json")).parent
    scalars = read_scalars(tb)
    sps_steps, sps_walls = scalar_wall_times(tb, "charts/SPS")
    ret_steps, returns = scalars.get("charts/episodic_return", ([], []))
    _, ret_walls = scalar_wall_times(tb, "charts/episodic_return") if ret_steps else ([], [])
    explained = scalars.get("losses/explained_variance", ([], []))
    return {
        "env_steps": summary["global_step"],
        "steady_sps": steady_rate(sps_steps, sps_walls, skip),
        "sps": summary["sps"],
        "train_s": summary["wall_time_s"],
        "eval": summary["eval"],
        "curve": {
            "step": list(ret_steps),
            "value": list(returns),
            "time_s": [round(w - started, 2) for w in ret_walls],
        },
        "explained_variance": {"step": list(explained[0]), "value": list(explained[1])},
        "summary": {k: summary.get(k) for k in ("global_step", "wall_time_s", "sps", "eval", "versions")},
    }


def last_share(curve: dict, share: float = 0.1) -> float | None:
    """Mean of a curve's points in its last `share` of env steps (the final return of a run)."""
    if not curve["step"]:
        return None
    start = curve["step"][-1] * (1 - share)
    values = [v for s, v in zip(curve["step"], curve["value"]) if s >= start]
    return statistics.fmean(values)


def run_one(spec: RunSpec, run_dir: Path, skip: int) -> dict:
    """Run one spec in its own process; its record for runs.json."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    flag = "--log-root" if spec.method == "rsl_rl" else "--output-dir"
    command = [*spec.command, flag, str(run_dir)]
    shown = [*spec.command, flag, os.path.relpath(run_dir, REPO) if run_dir.is_relative_to(REPO) else str(run_dir)]
    started, start = time.time(), time.perf_counter()
    with open(run_dir / "stdout.log", "w") as log:
        env = {**os.environ, **spec.env, "WANDB_MODE": "disabled"}
        rc = subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    record = {
        "task": spec.task, "method": spec.method, "seed": spec.seed, "position": spec.position,
        "command": shell_command(shown, spec.env), "returncode": rc, "started": round(started, 1),
        "process_s": round(time.perf_counter() - start, 2), "planned_env_steps": spec.env_steps,
    }  # fmt: skip
    lines = (run_dir / "stdout.log").read_text(errors="replace").strip().splitlines()
    try:
        if rc:
            raise RuntimeError(" / ".join(lines[-3:]))
        if spec.method == "rsl_rl":
            envs = int(spec.command[spec.command.index("--env.scene.num-envs") + 1])
            per_env = RECIPES[spec.task]["num_steps_per_env"]
            if "--agent.num-steps-per-env" in spec.command:
                per_env = int(spec.command[spec.command.index("--agent.num-steps-per-env") + 1])
            metrics = rsl_rl_metrics(run_dir, envs * per_env, started, skip)
        else:
            metrics = ours_metrics(run_dir, started, skip)
    except Exception as e:  # noqa: BLE001 - a failed run is recorded, the next one runs
        return {**record, "returncode": rc or 1, "error": f"{type(e).__name__}: {e}"[:500]}
    metrics["final_return"] = last_share(metrics["curve"])
    return {**record, "metrics": metrics}


def progress(r: dict) -> str:
    head = f"{r['task']} {r['method']} seed {r['seed']}:"
    if r["returncode"]:
        return f"{head} FAILED (exit {r['returncode']}): {r.get('error', '')}"
    m = r["metrics"]
    final = "n/a" if m.get("final_return") is None else f"{m['final_return']:.2f}"
    sps = "n/a" if m.get("steady_sps") is None else f"{m['steady_sps']:,.0f}"
    return f"{head} training return {final}, {m['env_steps']:,} steps, steady {sps} steps/s, {r['process_s']:.0f} s"


# ---- the report ---------------------------------------------------------------------------------------------------
def mean_std(values: list[float], digits: int) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    m = statistics.fmean(values)
    if len(values) == 1:  # one seed has no spread to show
        return f"{m:,.{digits}f}"
    return f"{m:,.{digits}f} ± {statistics.stdev(values):,.{digits}f}"


def per_seed(runs: list[dict], value, digits: int) -> str:
    out = []
    for r in sorted(runs, key=lambda r: r["seed"]):
        v = value(r)
        out.append("-" if v is None else f"{v:,.{digits}f}")
    return ", ".join(out)


def plot(task: str, runs: list[dict], path: Path) -> None:
    """Training return against env steps and against wall time from the process start, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    colors = dict(zip(METHODS, ("tab:gray", "tab:blue", "tab:orange")))
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        for i, r in enumerate(sorted(mine, key=lambda r: r["seed"])):
            c = r["metrics"]["curve"]
            for ax, x in zip(axes, ("step", "time_s")):
                label = f"{LABELS[method]} ({len(mine)} seeds)" if i == 0 and x == "step" else None
                ax.plot(c[x], c["value"], color=colors[method], alpha=0.8, linewidth=1, label=label)
    for ax, xlabel in zip(axes, ("env steps", "wall time from the process start (s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training return")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize=8)
    fig.suptitle(f"{task}: training return, one line per seed", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def task_section(task: str, runs: list[dict], data: dict, out: Path, image_prefix: str) -> list[str]:
    rows = []
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        if not mine:
            continue
        m = [r["metrics"] for r in mine]
        evals = [x["eval"]["episodic_return"] for x in m if x.get("eval")]
        rows.append([
            LABELS[method], str(len(mine)), f"{max(x['env_steps'] for x in m):,}",
            mean_std([x["final_return"] for x in m], 2), per_seed(mine, lambda r: r["metrics"]["final_return"], 2),
            mean_std(evals, 2) if evals else "-", mean_std([x["steady_sps"] for x in m], 0),
            mean_std([r["process_s"] for r in mine], 0),
        ])  # fmt: skip
    image = f"{task}.png"
    plot(task, runs, out / image)
    header = ["method", "seeds", "env steps", "final training return (mean ± std)", "per seed",
              "eval return (ours, deterministic)", f"steady env steps/s (after {data['args']['skip']} it.)",
              "whole process (s)"]  # fmt: skip
    lines = [f"## {task}", "", f"![{task}]({image_prefix}{image})", "", md_table(header, rows), ""]
    order = sorted(runs, key=lambda r: (r["seed"], r["position"]))
    seeds = sorted({r["seed"] for r in runs})
    lines.append("Order: " + "; ".join(f"seed {s}: " + ", ".join(r["method"] for r in order if r["seed"] == s)
                                       for s in seeds) + ".")  # fmt: skip
    lines += ["", *bootstrap_lines(runs)]
    return lines


def bootstrap_lines(runs: list[dict]) -> list[str]:
    """What bootstrapping time-outs from the true final observation changes: ours against the same trainer with
    time-outs as terminations, seed by seed (final training return, eval return, the critic's explained variance
    over the last 10% of the run)."""
    ours = {r["seed"]: r["metrics"] for r in runs if r["method"] == "ppo_continuous"}
    terminal = {r["seed"]: r["metrics"] for r in runs if r["method"] == "timeouts_terminal"}
    seeds = sorted(ours.keys() & terminal.keys())
    if not seeds:
        return []
    diff = [ours[s]["final_return"] - terminal[s]["final_return"] for s in seeds]
    ev = [(last_share(ours[s]["explained_variance"]), last_share(terminal[s]["explained_variance"])) for s in seeds]
    evals = [(ours[s]["eval"]["episodic_return"], terminal[s]["eval"]["episodic_return"]) for s in seeds]
    spread = max(abs(d) for d in diff)
    verdict = (
        "bootstrapped is ahead on every seed"
        if all(d > 0 for d in diff)
        else "time-outs-as-terminations is ahead on every seed"
        if all(d < 0 for d in diff)
        else "the sign differs between seeds"
    )
    return [
        f"Bootstrapping: final training return, bootstrapped minus time-outs-as-terminations, per seed "
        f"{', '.join(f'{d:+.2f}' for d in diff)} (mean {statistics.fmean(diff):+.2f}; largest {spread:.2f}): "
        f"{verdict}. Eval return (bootstrapped / terminal): {', '.join(f'{a:.2f} / {b:.2f}' for a, b in evals)}. "
        f"The critic's explained variance over the last 10% of the run (bootstrapped / terminal): "
        f"{', '.join(f'{a:.3f} / {b:.3f}' for a, b in ev if a is not None and b is not None)}. Treating a time-out as "
        "an end teaches the critic that value falls to 0 at the limit, which the observation (no clock in it) cannot "
        "predict.",
    ]


def smoke_section(runs: list[dict]) -> list[str]:
    rows = []
    for r in runs:
        m = r["metrics"]
        ev = m.get("eval") or {}
        metrics = {k: v for k, v in ev.items() if "/" in k and isinstance(v, (int, float))}
        shown = ", ".join(f"{k} {v:.3g}" for k, v in list(metrics.items())[:8])
        success = ev.get("success_rate")
        episodic_return = ev.get("episodic_return", float("nan"))
        rows.append([r["task"], f"{m['env_steps']:,}", "-" if success is None else f"{success:.2f}",
                     f"{episodic_return:.3f}", shown or "-", f"{r['process_s']:.0f}"])  # fmt: skip
    return [
        "## Smoke runs: Lift-Cube-Yam and Velocity-Flat-Unitree-Go1",
        "",
        "ppo_continuous with each task's recipe for a few iterations, then 4 deterministic evaluation episodes of 2 s "
        "(`--eval-env-kwargs '{\"episode_length_s\": 2.0}'`): the task's success signal (Lift-Cube-Yam's "
        "`compute_success`) and the episode metrics mjlab logs (its first few shown) reach the evaluation.",
        "",
        md_table(["task", "env steps", "eval success", "eval return", "eval metrics", "whole process (s)"], rows),
    ]


def report(data: dict, out: Path, image_prefix: str = "") -> str:
    ok = [r for r in data["runs"] if r["returncode"] == 0]
    failed = [r for r in data["runs"] if r["returncode"] != 0]
    a = data["args"]
    lines = [
        f"{'**Tiny mode: a test of the harness, not a measurement.** ' if a['tiny'] else ''}"
        f"{len(ok)} runs ({len(failed)} failed), one at a time with OMP_NUM_THREADS=1 on the CPU, "
        f"{data['total_s'] / 60:.1f} min in all, finished "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(data['finished']))} UTC.",
        "",
        *record_lines(
            data["command"],
            data["machine"],
            data["load_avg_end"],
            data["git"],
            data["versions"],
            note=f" (mjlab {data['versions'].get('mjlab')} installed with `{INSTALL}`)",
        ),
        "- the same envs and env steps on both sides; ours maps mjlab's rsl_rl recipe onto its flags "
        "(benchmarks/peers/vs_mjlab.py says what maps and what cannot); mean ± std over seeds (sample std); "
        "final training "
        "return: the mean of each run's training-return points in its last 10% of env steps.",
    ]  # fmt: skip
    for task in a["tasks"]:
        runs = [r for r in ok if r["task"] == task and r["method"] != "smoke"]
        if runs:
            lines += ["", *task_section(task, runs, data, out, image_prefix)]
    smoke = [r for r in ok if r["method"] == "smoke"]
    if smoke:
        lines += ["", *smoke_section(smoke)]
    lines += failed_lines(failed)
    lines += commands_block([r["command"] for r in data["runs"]])
    return "\n".join(lines)


SAME_SETTINGS = ("num_envs", "iterations", "skip", "tiny", "cuda")
"""what a kept run must share with the runs planned now (`--keep-finished`)"""


def finished_runs(out: Path, args: Args) -> dict[tuple[str, str, int], dict]:
    """--out/runs.json's finished runs by (task, method, seed), each with the commit it ran at (for provenance);
    one line if they ran with other settings."""
    if not (out / "runs.json").is_file():
        return {}
    saved = json.loads((out / "runs.json").read_text())
    theirs, ours = saved.get("args", {}), dataclasses.asdict(args)
    differs = [k for k in SAME_SETTINGS if theirs.get(k, ours[k]) != ours[k]]
    if differs:
        fail(f"--keep-finished: {out / 'runs.json'} ran with other {', '.join(differs)}; use another --out")
    return {(r["task"], r["method"], r["seed"]): {"git": saved.get("git"), **r}
            for r in saved.get("runs", []) if not r.get("returncode")}  # fmt: skip


def write_outputs(data: dict, out: Path, results_md: str) -> None:
    save_runs(data, out)
    title = "# ppo_continuous against mjlab's rsl_rl (CPU)"
    write_report(out, title, lambda prefix: report(data, out, prefix), results_md)


def main(args: Args) -> dict | list[RunSpec]:
    out = Path(args.out).resolve()
    if args.report_only:
        data = saved_runs(out, "the benchmark")
        write_outputs(data, out, args.results_md)
        return data
    if args.tiny:  # its runs have 2 iterations: the one rate between them is all a speed can be read from
        args = dataclasses.replace(args, skip=0)
    specs = plan(args)
    if args.dry_run:
        for spec in specs:
            print(shell_command(spec.command, spec.env))
        return specs
    if importlib.util.find_spec("mjlab") is None:
        fail(f"mjlab is not installed: `{INSTALL}` (it conflicts with the mujoco extra)")
    check_recipes({s.task for s in specs})
    command = invocation(__file__, sys.argv[1:])
    versions = package_versions()
    for name in ("mjlab", "rsl-rl-lib", "mujoco", "mujoco-warp", "warp-lang"):
        versions[name] = importlib.metadata.version(name)
    data = {"args": dataclasses.asdict(args), "command": command, "machine": machine_info(), "versions": versions,
            "git": git_info(), "runs": []}  # fmt: skip
    kept = finished_runs(out, args) if args.keep_finished else {}
    start = time.time()
    for i, spec in enumerate(specs, 1):
        key = (spec.task, spec.method, spec.seed)
        if key in kept:
            data["runs"].append(kept[key])
            print(f"[{i}/{len(specs)}] kept: {progress(kept[key])}", flush=True)
            continue
        name = f"{spec.task}__{spec.method}__{spec.seed}"
        record = {**run_one(spec, out / "runs" / name, args.skip), "git": data["git"]}
        data["runs"].append(record)
        print(f"[{i}/{len(specs)}] {progress(record)}", flush=True)
        save_runs(data, out)
    finished(data, start)
    write_outputs(data, out, args.results_md)
    run_git = [((r.get("metrics") or {}).get("summary") or {}).get("versions") or r.get("git") or data["git"]
               for r in data["runs"]]  # fmt: skip
    provenance.record(out, command, [r["command"] for r in data["runs"]], data["machine"], data["git"], run_git)
    return data


if __name__ == "__main__":
    main(tyro.cli(Args))
