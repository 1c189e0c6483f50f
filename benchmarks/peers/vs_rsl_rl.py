"""Our ppo_continuous.py against rsl_rl 5.5.1's PPO on PushCubeRL at our defaults, side by side, on the CPU.

    uv pip install --target /tmp/rsl_rl --no-deps rsl-rl-lib==5.5.1 gitpython==3.2.1 gitdb==4.0.12 smmap==5.0.3
    uv run --extra export python -m benchmarks.peers.vs_rsl_rl --rsl-rl-path /tmp/rsl_rl  # 3 pairs: ~15 min, 2-core CPU
    uv run python -m benchmarks.peers.vs_rsl_rl --dry-run       # print the commands, run nothing
    uv run python -m benchmarks.peers.vs_rsl_rl --report-only   # the report again from runs.json

rsl_rl is installed as its users install it (`pip install rsl-rl-lib`), into a temporary target, never into this
project: its other requirements (torch, tensordict, numpy, tensorboard, onnx, onnxscript) are this project's
environment's with the `export` extra (the same torch on both sides), so only the package and GitPython (which its
logger imports) go to the target; its runs get it through PYTHONPATH. Its side is benchmarks/peers/rsl_rl_push_cube.py:
our VecEnv adapter around the same PushCubeRL and rsl_rl's OnPolicyRunner with ppo_continuous.py's defaults (that file
says what maps onto rsl_rl's configuration and how: linear annealing and orthogonal initialization by small hooks).
What cannot be matched: rsl_rl bootstraps a time-out with gamma * V(s_t) added to the reward (the value of the
observation the last action was taken in), ours with V(final observation); ours stops an update's epochs early when
their mean approximate KL exceeds 0.1 (rsl_rl has no such stop); ours clips the gradient norm over all parameters,
rsl_rl the actor's and the critic's apart (0.5 each); Adam's epsilon is 1e-5 in ours, torch's 1e-8 in rsl_rl (its
optimizer takes no options); rsl_rl draws one permutation of the batch for all 4 epochs, ours one per epoch; ours
evaluates every 25 iterations during training (its default `--eval-freq 25`: 7 evaluations of 64 episodes inside its
loop), rsl_rl never does.

Per pair (seed = the pair's number), every method runs in its own process with one thread (OMP_NUM_THREADS=1):

- `ours`: `ppo_continuous.py --env-id PushCubeRL --total-timesteps N --seed S --save-freq 0 --no-cuda`, the defaults
  as a user runs them (`--compile auto`); `ours_off` and `ours_on` add `--compile off` / `--compile on`. Each run
  keeps its compile measurements in a file of its own (CLEANRL_EMBODIED_COMPILE_TIMES, empty at the start), so
  `--compile auto` decides as on a machine where no run measured it yet, and every run's record is read back.
- `rsl_rl_eager` / `rsl_rl_compiled`: rsl_rl_push_cube.py with `--compile none` / `--compile default` (rsl_rl's
  `torch_compile_mode`).

The runs go one at a time, the order reversed from one pair to the next so that a drift of the machine falls on all
alike. Not at the same time: this machine has 2 cores, and a run is more than its one compute thread (TensorBoard's
writer thread, Inductor's compile workers, the interpreter's start-up reading files); two runs at once would take
those from each other, by amounts that depend on which phase of each run meets which. One at a time, each has the
machine as a user has it. Inductor's on-disk caches are left as they are (both sides alike).

Measured per run: the whole process (from the driver starting it to its exit, as the user waits); the steady-state
iteration, (wall time of the last iteration's TensorBoard event - that of iteration `--skip`) / (iterations - skip),
of ours' `charts/SPS` and rsl_rl's `Loss/learning_rate` (both logged once per iteration after the update; ours'
includes its periodic evaluations; the median iteration is given too, and rsl_rl's own timers); the final
deterministic evaluation's success over 64 episodes on 64 envs (rsl_rl's by the same `evaluate` from the same
starts); where the time goes (ours from its TensorBoard events and compile record, rsl_rl from its phase times).
After the pairs, a probe on one thread: the interpreter's and ours' imports alone, a float32 matmul's rate at the
update's shapes and at 1024^3, and ours' minibatch update (640 samples) eager and compiled, against its FLOPs. Ratios
are rsl_rl's time over ours (above 1: ours is faster), pair by pair; the headline takes, per measure, rsl_rl's faster
configuration in the run. Before the pairs, every module either side imports is compiled to bytecode (`python -m
compileall` over the environment's site-packages, the rsl_rl target and this repository's code): an installer does
that (pip; uv with `--compile-bytecode`) or Python at a module's first import, except where PYTHONDONTWRITEBYTECODE
is set, as on this project's machines, where every process would otherwise compile torch's source anew at its
start (about 10 s more start-up on each side). Writes `--out`: report.md, runs.json (after every run),
provenance.json, and the `vs-rsl-rl-cpu` section of docs/benchmarks.md; run directories go to `--out`/runs/ (not
committed).
"""

from __future__ import annotations

import dataclasses
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
    BENCH,
    REPO,
    RESULTS_DIR,
    RESULTS_MD,
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

RSL_RL_VERSION = "5.5.1"
INSTALL = (
    f"uv pip install --target /tmp/rsl_rl --no-deps rsl-rl-lib=={RSL_RL_VERSION} gitpython==3.2.1 gitdb==4.0.12 "
    "smmap==5.0.3"
)
SECTION = "vs-rsl-rl-cpu"
METHODS = ("ours", "ours_off", "ours_on", "rsl_rl_eager", "rsl_rl_compiled")
OURS = ("ours", "ours_off", "ours_on")
RSL_RL = ("rsl_rl_eager", "rsl_rl_compiled")
LABELS = {
    "ours": "ours, `--compile auto` (the default)",
    "ours_off": "ours, `--compile off`",
    "ours_on": "ours, `--compile on`",
    "rsl_rl_eager": "rsl_rl, eager",
    "rsl_rl_compiled": 'rsl_rl, `torch_compile_mode="default"`',
}
THREADS = {"OMP_NUM_THREADS": "1"}
NUM_ENVS, NUM_STEPS, MINIBATCHES, EPOCHS = 256, 20, 8, 4  # ppo_continuous.py's defaults (and rsl_rl's here)
OBS_DIM, ACT_DIM, HIDDEN = 31, 7, (128, 128)  # PushCubeRL's state observation and action; the MLPs' widths
GOAL = 1.5  # issue 55: at least this much faster, whole process and steady state


@dataclass
class Args:
    rsl_rl_path: str = "/tmp/rsl_rl"
    """the folder rsl-rl-lib 5.5.1 was installed into (`uv pip install --target`, the module docstring)"""
    total_timesteps: int = 1_000_000
    """env steps of every run (195 iterations of 256 envs x 20 steps)"""
    pairs: int = 3
    """pairs (rounds) of runs; pair i runs every method with seed i"""
    methods: tuple[str, ...] = METHODS
    """what runs in each pair: ours (--compile auto), ours_off, ours_on, rsl_rl_eager, rsl_rl_compiled"""
    skip: int = 3
    """the steady state is the iterations after this one (its TensorBoard event to the last one's)"""
    compile_bytecode: bool = True
    """before the pairs, compile every module both sides import to bytecode (the module docstring says why)"""
    probe: bool = True
    """after the pairs: the start-up, matmul-rate and minibatch-update probe (one thread, about a minute)"""
    out: str = str(RESULTS_DIR / SECTION)
    """output folder: report.md, runs.json, provenance.json; runs/ (the run directories, not committed)"""
    results_md: str = str(RESULTS_MD)
    """markdown file whose vs-rsl-rl-cpu section is replaced ('' to skip)"""
    dry_run: bool = False
    """print the commands in the order they would run, and run nothing"""
    report_only: bool = False
    """run nothing: the report again from --out/runs.json"""


@dataclass
class RunSpec:
    pair: int
    method: str
    seed: int
    command: list[str]  # without the run's own output paths (added by `run_one`)
    env: dict[str, str] = field(default_factory=dict)


def bytecode_command(args: Args) -> list[str]:
    """`python -m compileall` over what both sides import: site-packages, the rsl_rl target, this repository's code."""
    import sysconfig

    paths = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    return [sys.executable, "-m", "compileall", "-q", "-j", "0", *paths, args.rsl_rl_path,
            str(SCRIPTS_DIR), str(BENCH)]  # fmt: skip


# ---- the commands -------------------------------------------------------------------------------------------------
def method_command(args: Args, method: str, seed: int) -> tuple[list[str], dict[str, str]]:
    """One run's command (the run directory is added by run_one) and its environment variables."""
    if method in OURS:
        command = [sys.executable, str(SCRIPTS_DIR / "ppo_continuous.py"), "--env-id", "PushCubeRL",
                   "--total-timesteps", str(args.total_timesteps), "--seed", str(seed), "--save-freq", "0",
                   "--no-cuda"]  # fmt: skip
        command += {"ours": [], "ours_off": ["--compile", "off"], "ours_on": ["--compile", "on"]}[method]
        return command, dict(THREADS)
    command = [sys.executable, "-m", "benchmarks.peers.rsl_rl_push_cube", "--seed", str(seed), "--total-timesteps",
               str(args.total_timesteps), "--compile", "none" if method == "rsl_rl_eager" else "default"]  # fmt: skip
    return command, {**THREADS, "PYTHONPATH": args.rsl_rl_path}


def plan(args: Args) -> list[RunSpec]:
    """Every run in the order it runs: pair by pair, the methods' order reversed in every other pair."""
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        fail(f"--methods: unknown {', '.join(unknown)} (choose from {', '.join(METHODS)})")
    if not any(m in OURS for m in args.methods) or not any(m in RSL_RL for m in args.methods):
        fail("--methods: needs one of ours, ours_off, ours_on and one of rsl_rl_eager, rsl_rl_compiled")
    if args.pairs < 1 or args.total_timesteps < 1 or args.skip < 0:
        fail("--pairs and --total-timesteps must be positive, --skip not negative")
    iterations = args.total_timesteps // (NUM_ENVS * NUM_STEPS)
    if iterations < args.skip + 2:
        need = args.skip + 2
        fail(f"--total-timesteps {args.total_timesteps} gives {iterations} iterations; the steady state after "
             f"--skip {args.skip} needs at least {need} ({need * NUM_ENVS * NUM_STEPS} steps)")  # fmt: skip
    methods = [m for m in METHODS if m in args.methods]
    specs = []
    for pair in range(1, args.pairs + 1):
        for method in methods if pair % 2 else methods[::-1]:
            command, env = method_command(args, method, pair)
            specs.append(RunSpec(pair, method, pair, command, env))
    return specs


# ---- reading a run back -------------------------------------------------------------------------------------------
def steady(walls: list[float], skip: int) -> dict:
    """Seconds per iteration after iteration `skip` from per-iteration event times (`walls[i]`: the end of iteration
    i + 1): the mean over iterations skip + 1 .. N, and the median of their own durations."""
    if len(walls) < skip + 2:
        raise RuntimeError(f"{len(walls)} iterations logged, need more than --skip {skip} + 1")
    start = walls[skip - 1] if skip else walls[0]
    count = len(walls) - skip if skip else len(walls) - 1
    durations = [b - a for a, b in zip(walls[max(skip - 1, 0) : -1], walls[max(skip, 1) :])]
    return {"mean_s": (walls[-1] - start) / count, "median_s": statistics.median(durations), "iterations": count}


def first_event_time(run_dir: Path) -> float:
    """When the run's TensorBoard writer was created: the wall time of its event file's first record."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    path = sorted(run_dir.glob("events.out.tfevents.*"))[0]
    return next(iter(EventFileLoader(str(path)).Load())).wall_time


def read_compile_times(path: Path) -> dict:
    """The run's own compile record (the one entry of its CLEANRL_EMBODIED_COMPILE_TIMES file), {} without one."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return next(iter(entries.values()), {}) if isinstance(entries, dict) else {}


def excess(durations: list[float], steady_s: float, window: int = 8) -> float:
    """What the first `window` iterations took beyond the steady one: compiling, mostly."""
    return sum(max(0.0, d - steady_s) for d in durations[:window])


def ours_metrics(run_dir: Path, started: float, ended: float, skip: int) -> dict:
    summary_path = next(run_dir.glob("*/summary.json"))
    summary = json.loads(summary_path.read_text())
    tb = summary_path.parent
    _, walls = scalar_wall_times(tb, "charts/SPS")
    eval_steps, eval_walls = scalar_wall_times(tb, "eval/success_rate")
    state = steady(walls, skip)
    durations = [b - a for a, b in zip(walls, walls[1:])]
    periodic = [w for s, w in zip(eval_steps, eval_walls) if s < summary["global_step"]]
    evals_in_loop = sum(  # an evaluating iteration's time beyond the median one
        max(0.0, b - a - state["median_s"]) for a, b in zip(walls, walls[1:]) if any(a < w <= b for w in periodic)
    )  # fmt: skip
    writer = first_event_time(tb)
    record = read_compile_times(run_dir / "compile_times.json")
    return {
        "iterations": len(walls),
        "steady": state,
        "global_step": summary["global_step"],
        "loop_s": summary["wall_time_s"],
        "compiled": summary.get("compiled"),
        "success": summary["eval"]["success_rate"],
        "eval": summary["eval"],
        "compile_record": record,
        "phases": {  # seconds, in order; they sum to the whole process
            "start-up: interpreter, imports, eval envs, agent (to the TensorBoard writer)": writer - started,
            "train envs, compile wrappers, iteration 1": walls[0] - writer,
            "iterations 2..N (periodic evaluations and any compile included)": walls[-1] - walls[0],
            "last.pt and the final evaluation": eval_walls[-1] - walls[-1],
            "summary.json, closing, interpreter exit": ended - eval_walls[-1],
        },
        "periodic_evals_s": evals_in_loop,
        "compile_s": record.get("compile_s") if summary.get("compiled") else 0.0,
        "first_iterations_excess_s": excess(durations, state["median_s"]),
        "summary": {k: summary.get(k) for k in ("global_step", "wall_time_s", "sps", "eval", "compiled", "versions")},
    }


def rsl_rl_metrics(run_dir: Path, started: float, ended: float, skip: int) -> dict:
    timings = json.loads((run_dir / "timings.json").read_text())
    t = timings["times"]
    _, walls = scalar_wall_times(run_dir / "tb", "Loss/learning_rate")
    scalars = read_scalars(run_dir / "tb")
    collect, learn = scalars["Perf/collection_time"][1], scalars["Perf/learning_time"][1]
    own = [c + lr for c, lr in zip(collect, learn)]
    state = steady(walls, skip)
    return {
        "iterations": len(walls),
        "steady": state,
        "own_timers": {
            "mean_s": statistics.fmean(own[skip:]),
            "median_s": statistics.median(own[skip:]),
            "learn_median_s": statistics.median(learn[skip:]),
            "collect_median_s": statistics.median(collect[skip:]),
        },  # fmt: skip
        "global_step": timings["global_step"],
        "loop_s": t["learned"] - t["runner_built"],
        "success": timings["eval"]["success_rate"],
        "eval": timings["eval"],
        "phases": {
            "interpreter start-up": t["started"] - started,
            "imports (torch, tensordict, rsl_rl, the env)": t["imported"] - t["started"],
            "envs (training and evaluation)": t["env_built"] - t["imported"],
            "OnPolicyRunner, initialization": t["runner_built"] - t["env_built"],
            "learn() start, iteration 1": walls[0] - t["runner_built"],
            "iterations 2..N": walls[-1] - walls[0],
            "final model save and the evaluation": t["evaluated"] - walls[-1],
            "closing, interpreter exit": ended - t["evaluated"],
        },
        "first_iterations_excess_s": excess(own, statistics.median(own[skip:])),
        "torch_threads": timings.get("torch_threads"),
    }


def run_one(spec: RunSpec, run_dir: Path, skip: int) -> dict:
    """Run one spec in its own process (its output to run_dir/stdout.log); its record for runs.json."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    env = dict(spec.env)
    if spec.method in OURS:
        paths = ["--output-dir", str(run_dir)]
        env["CLEANRL_EMBODIED_COMPILE_TIMES"] = str(run_dir / "compile_times.json")
    else:
        paths = ["--log-dir", str(run_dir / "tb"), "--timings", str(run_dir / "timings.json")]
    shown = [os.path.relpath(p, REPO) if Path(p).is_relative_to(REPO) else p for p in paths]
    record = {"pair": spec.pair, "method": spec.method, "seed": spec.seed,
              "command": shell_command([*spec.command, *shown], spec.env)}  # fmt: skip
    with open(run_dir / "stdout.log", "w") as log:
        started = time.time()
        rc = subprocess.run([*spec.command, *paths], cwd=REPO, env={**os.environ, **env, "WANDB_MODE": "disabled"},
                            stdout=log, stderr=subprocess.STDOUT).returncode  # fmt: skip
        ended = time.time()
    record.update(returncode=rc, started=round(started, 2), process_s=round(ended - started, 3))
    try:
        if rc:
            lines = (run_dir / "stdout.log").read_text(errors="replace").strip().splitlines()
            raise RuntimeError(" / ".join(lines[-3:]))
        read = ours_metrics if spec.method in OURS else rsl_rl_metrics
        record["metrics"] = read(run_dir, started, ended, skip)
    except Exception as e:  # noqa: BLE001 - a failed run is recorded, the next one runs
        record.update(returncode=rc or 1, error=f"{type(e).__name__}: {e}"[:500])
    return record


def progress(r: dict) -> str:
    head = f"pair {r['pair']} {r['method']}:"
    if r["returncode"]:
        return f"{head} FAILED (exit {r['returncode']}): {r.get('error', '')}"
    m = r["metrics"]
    return (f"{head} whole process {r['process_s']:.1f} s, steady {m['steady']['mean_s'] * 1e3:.0f} ms/iteration, "
            f"success {m['success']:.2f}")  # fmt: skip


# ---- the probe: start-up alone, the CPU's matmul rate, the minibatch update ------------------------------------------
def update_flops(batch: int = NUM_ENVS * NUM_STEPS // MINIBATCHES) -> dict:
    """FLOPs of one minibatch update through the actor and critic MLPs: forward 2 * batch * in * out per Linear,
    forward + backward taken as 3x the forward (weight and input gradients; elementwise work left out)."""
    forward = 0
    for out_dim in (ACT_DIM, 1):  # actor, critic
        sizes = (OBS_DIM, *HIDDEN, out_dim)
        forward += sum(2 * batch * a * b for a, b in zip(sizes, sizes[1:]))
    return {"batch": batch, "forward": forward, "update": 3 * forward}


def matmul_gflops(m: int, k: int, n: int, seconds: float = 1.0) -> float:
    """Float32 torch.mm of [m, k] x [k, n] on this process's threads: GFLOP/s, best of 5 timings of repeated calls."""
    import torch

    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(10):
        torch.mm(a, b)
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < 0.1:
        torch.mm(a, b)
        calls += 1
    repeats = max(1, int(calls * seconds / 0.5))  # 5 timings in about `seconds`
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats // 5 or 1):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - start) / (repeats // 5 or 1))
    return 2 * m * k * n / best / 1e9


def update_seconds(compiled: bool, rounds: int = 15, calls: int = 20) -> dict:
    """Ours' minibatch update (loss, backward, gradient clipping, Adam step: the trainer's own functions) on 640
    random samples, median seconds per update over `rounds`; compiled as the trainer compiles (loss, clipping, step)."""
    import gymnasium as gym
    import numpy as np
    import torch
    from tensordict import TensorDict

    from cleanrl_embodied import ppo_continuous as ppo

    torch.manual_seed(0)
    a = ppo.Args()
    agent = ppo.Agent(gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32),
                      gym.spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32), a)  # fmt: skip
    n = update_flops()["batch"]
    mb = TensorDict(obs=torch.randn(n, OBS_DIM), action=torch.randn(n, ACT_DIM), logprob=torch.randn(n) - 5,
                    value=torch.randn(n), advantages=torch.randn(n), returns=torch.randn(n),
                    batch_size=[n])  # fmt: skip
    params = [p for p in agent.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=torch.tensor(a.learning_rate), eps=1e-5)
    wrap = (lambda fn: torch.compile(fn, options={"fallback_random": True})) if compiled else (lambda fn: fn)
    loss_fn, clip_fn, step_fn = wrap(ppo.ppo_loss), wrap(ppo.clip_gradients), wrap(optimizer.step)

    def update():
        loss, _ = loss_fn(agent, mb, a)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip_fn(params, a.max_grad_norm)
        step_fn()

    start = time.perf_counter()
    for _ in range(3):
        update()
    first = time.perf_counter() - start
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            update()
        times.append((time.perf_counter() - start) / calls)
    return {"median_s": statistics.median(times), "first_3_calls_s": first}


def probe_main() -> dict:
    """The in-process part of the probe (run with one thread): matmul rates and ours' update."""
    import torch

    torch.set_num_threads(1)
    n = update_flops()["batch"]
    return {
        "torch_threads": torch.get_num_threads(),
        "matmul_gflops": {
            f"{n}x{OBS_DIM} @ {OBS_DIM}x{HIDDEN[0]}": matmul_gflops(n, OBS_DIM, HIDDEN[0]),
            f"{n}x{HIDDEN[0]} @ {HIDDEN[0]}x{HIDDEN[1]}": matmul_gflops(n, HIDDEN[0], HIDDEN[1]),
            "1024x1024 @ 1024x1024": matmul_gflops(1024, 1024, 1024),
        },
        "update_eager": update_seconds(False),
        "update_compiled": update_seconds(True),
    }


def timed(command: list[str], env: dict[str, str], repeats: int = 3) -> float:
    """Median seconds of a command's whole process over `repeats` runs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, cwd=REPO, env={**os.environ, **env}, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def probe(args: Args) -> dict:
    """Start-up alone (a bare interpreter, and one that imports ours' trainer module as `python ppo_continuous.py`
    does), then `probe_main` in a process of its own, one thread."""
    py = sys.executable
    imports = "import sys; sys.path.insert(0, 'cleanrl_embodied'); import ppo_continuous"
    out = {
        "interpreter_s": timed([py, "-c", "pass"], THREADS),
        "ours_imports_s": timed([py, "-c", imports], THREADS),
    }
    code = "import json; from benchmarks.peers import vs_rsl_rl; print(json.dumps(vs_rsl_rl.probe_main()))"
    done = subprocess.run([py, "-c", code], cwd=REPO, env={**os.environ, **THREADS}, capture_output=True, text=True)
    if done.returncode:
        out["error"] = " / ".join(done.stderr.strip().splitlines()[-3:])
        return out
    out.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


# ---- the report ---------------------------------------------------------------------------------------------------
def by_pair(runs: list[dict]) -> dict[int, dict[str, dict]]:
    out: dict[int, dict[str, dict]] = {}
    for r in runs:
        if r["returncode"] == 0:
            out.setdefault(r["pair"], {})[r["method"]] = r
    return out


MEASURES = {  # name -> (what it is, the seconds of one run)
    "whole": ("whole process", lambda r: r["process_s"]),
    "steady": ("steady-state iteration", lambda r: r["metrics"]["steady"]["mean_s"]),
}


def faster_rsl_rl(pairs: dict[int, dict[str, dict]], measure: str) -> str | None:
    """rsl_rl's configuration with the lower median over the pairs of `measure`."""
    seconds = MEASURES[measure][1]
    medians = {m: statistics.median(seconds(p[m]) for p in pairs.values() if m in p)
               for m in RSL_RL if any(m in p for p in pairs.values())}  # fmt: skip
    return min(medians, key=medians.get) if medians else None


def ratios(pairs: dict[int, dict[str, dict]], ours: str, theirs: str, measure: str) -> list[float]:
    """rsl_rl's seconds over ours, per pair that has both (above 1: ours is faster)."""
    seconds = MEASURES[measure][1]
    return [seconds(p[theirs]) / seconds(p[ours]) for _, p in sorted(pairs.items()) if ours in p and theirs in p]


def fmt_ratios(values: list[float]) -> str:
    if not values:
        return "-"
    spread = f" ({min(values):.2f}x-{max(values):.2f}x)" if len(values) > 1 else ""
    return f"**{statistics.median(values):.2f}x**{spread}"


def med(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def runs_table(pairs: dict[int, dict[str, dict]], methods: list[str]) -> str:
    rows = []
    for method in methods:
        mine = [p[method] for _, p in sorted(pairs.items()) if method in p]
        if not mine:
            continue
        m = [r["metrics"] for r in mine]
        loop = "learn()" if method in RSL_RL else "wall_time_s"
        own = med(x["own_timers"]["mean_s"] for x in m) if method in RSL_RL else None
        chose = ""
        if method == "ours":
            chose = ", ".join("compiled" if x["compiled"] else "eager" for x in m)
        rows.append([
            LABELS[method], str(len(mine)), ", ".join(f"{r['process_s']:.1f}" for r in mine),
            ", ".join(f"{x['steady']['mean_s'] * 1e3:.0f}" for x in m),
            f"{med(x['steady']['median_s'] for x in m) * 1e3:.0f}" + (f" ({own * 1e3:.0f})" if own else ""),
            f"{med(x['loop_s'] for x in m):.1f} ({loop})", ", ".join(f"{x['success']:.2f}" for x in m), chose or "-",
        ])  # fmt: skip
    header = ["method", "pairs", "whole process (s), per pair", "steady ms/iteration (mean), per pair",
              "median iteration (ms) (rsl_rl's own timers)", "loop (s), median", "final success, per pair",
              "`auto` chose"]  # fmt: skip
    return md_table(header, rows)


def ratio_table(pairs: dict[int, dict[str, dict]], methods: list[str]) -> str:
    rows = []
    for ours in [m for m in OURS if m in methods]:
        for theirs in [m for m in RSL_RL if m in methods]:
            rows.append([LABELS[ours], LABELS[theirs],
                         fmt_ratios(ratios(pairs, ours, theirs, "whole")),
                         fmt_ratios(ratios(pairs, ours, theirs, "steady"))])  # fmt: skip
    return md_table(["ours", "against", "whole process, rsl_rl / ours", "steady state, rsl_rl / ours"], rows)


def phases_table(pairs: dict[int, dict[str, dict]], method: str) -> list[str]:
    mine = [p[method]["metrics"] for _, p in sorted(pairs.items()) if method in p]
    if not mine:
        return []
    names = list(mine[0]["phases"])
    rows = [[name, f"{med(m['phases'][name] for m in mine):.1f}"] for name in names]
    rows.append(["whole process", f"{med(p[method]['process_s'] for p in pairs.values() if method in p):.1f}"])
    notes = []
    if method in OURS:
        notes.append(f"of the iterations: periodic evaluations {med(m['periodic_evals_s'] for m in mine):.1f} s "
                     f"(what the evaluating iterations took beyond the median one); compile "
                     f"{med(m['compile_s'] for m in mine) or 0.0:.1f} s (the run's own record)")  # fmt: skip
    else:
        notes.append(f"first 8 iterations beyond the steady one (compiling, mostly): "
                     f"{med(m['first_iterations_excess_s'] for m in mine):.1f} s")  # fmt: skip
    return [f"**{LABELS[method]}** (medians over pairs, seconds; {'; '.join(notes)})", "",
            md_table(["phase", "s"], rows), ""]  # fmt: skip


def probe_lines(data: dict) -> list[str]:
    p = data.get("probe")
    if not p:
        return []
    if "error" in p:
        return ["### Probe", "", f"The probe failed: {p['error']}"]
    flops = update_flops()
    rates = p["matmul_gflops"]
    peak = rates["1024x1024 @ 1024x1024"]
    at_shape = min(v for k, v in rates.items() if not k.startswith("1024"))
    eager, compiled = p["update_eager"]["median_s"], p["update_compiled"]["median_s"]
    floor_peak, floor_shape = flops["update"] / (peak * 1e9), flops["update"] / (at_shape * 1e9)
    pairs = by_pair(data["runs"])
    rsl = [x["metrics"]["own_timers"]["learn_median_s"] / (MINIBATCHES * EPOCHS)
           for p in pairs.values() for m, x in p.items() if m == "rsl_rl_eager"]  # fmt: skip
    rsl_c = [x["metrics"]["own_timers"]["learn_median_s"] / (MINIBATCHES * EPOCHS)
             for p in pairs.values() for m, x in p.items() if m == "rsl_rl_compiled"]  # fmt: skip
    lines = [
        "### How close the update is to what the CPU can do",
        "",
        f"One minibatch update: {flops['batch']} samples through the actor "
        f"({OBS_DIM}-{HIDDEN[0]}-{HIDDEN[1]}-{ACT_DIM}) and the critic ({OBS_DIM}-{HIDDEN[0]}-{HIDDEN[1]}-1), "
        f"forward {flops['forward'] / 1e6:.1f} MFLOP, forward and "
        f"backward about 3x that: **{flops['update'] / 1e6:.0f} MFLOP**. Float32 `torch.mm` on one thread of this CPU: "
        + ", ".join(f"{k}: {v:.1f} GFLOP/s" for k, v in rates.items())
        + f". At the update's own shapes the matrix products alone would take {floor_shape * 1e3:.2f} ms, at the "
        f"large product's rate {floor_peak * 1e3:.2f} ms.",
        "",
        md_table(
            ["minibatch update", "ms", "of which matmul work at the update's shapes", "GFLOP/s achieved"],
            [
                [name, f"{s * 1e3:.2f}", f"{floor_shape / s:.0%}", f"{flops['update'] / s / 1e9:.1f}"]
                for name, s in [
                    ("ours, eager (probe)", eager),
                    ("ours, compiled (probe)", compiled),
                    *([("rsl_rl eager: its learning time / 32 (runs, median)", med(rsl))] if rsl else []),
                    *([("rsl_rl compiled: the same", med(rsl_c))] if rsl_c else []),
                ]
            ],
        ),  # fmt: skip
        "",
        f"Start-up alone: a bare interpreter {p['interpreter_s']:.2f} s, one that imports ours' trainer module "
        f"{p['ours_imports_s']:.2f} s (both whole processes, medians of 3).",
    ]
    return lines


def verdict(pairs: dict[int, dict[str, dict]]) -> list[str]:
    lines = []
    for measure in MEASURES:
        theirs = faster_rsl_rl(pairs, measure)
        values = ratios(pairs, "ours", theirs, measure) if theirs else []
        if not values:
            continue
        m = statistics.median(values)
        n = len(values)
        lines.append(f"{MEASURES[measure][0]}: rsl_rl's faster configuration here is {LABELS[theirs]}; its time over "
                     f"ours at our defaults is {m:.2f}x (median of {n} pair{'s' if n != 1 else ''}; above 1: ours is "
                     f"faster), {'meeting' if m >= GOAL else 'short of'} issue 55's goal of {GOAL}x")  # fmt: skip
    return lines


def report(data: dict) -> str:
    pairs = by_pair(data["runs"])
    failed = [r for r in data["runs"] if r["returncode"]]
    methods = [m for m in METHODS if m in data["args"]["methods"]]
    a = data["args"]
    success = [p[m]["metrics"]["success"] for p in pairs.values() for m in p]
    lines = [
        f"Side by side, finished {time.strftime('%Y-%m-%d %H:%M', time.gmtime(data['finished']))} UTC: our "
        f"`ppo_continuous.py` at its defaults and rsl_rl {data['rsl_rl_version']}'s PPO (its OnPolicyRunner through "
        "benchmarks/peers/rsl_rl_push_cube.py, matched to those defaults) on PushCubeRL, "
        f"{a['total_timesteps']:,} env steps per run, {len(pairs)} pair{'s' if len(pairs) != 1 else ''} (pair i: "
        "seed i), one run at a time, one "
        f"thread each, {data['total_s'] / 60:.1f} min in all. Ratios: rsl_rl's seconds over ours (above 1: ours is "
        f"faster); steady state: the iterations after iteration {a['skip']}.",
        "",
        *record_lines(
            data["command"],
            data["machine"],
            data["load_avg_end"],
            data["git"],
            data["versions"],
            note=f" (rsl_rl installed with `{INSTALL}`)",
        ),
        "",
        *[f"- **{line}**" for line in verdict(pairs)],
        f"- final success (deterministic, 64 episodes): {min(success):.2f}-{max(success):.2f} over every run"
        if success
        else "- no run finished",
        "",
        ratio_table(pairs, methods),
        "",
        "Not matched (benchmarks/peers/vs_rsl_rl.py, benchmarks/peers/rsl_rl_push_cube.py): rsl_rl bootstraps a "
        "time-out with "
        "gamma * V(s_t), ours with V(final observation); ours stops an update's epochs when their mean approximate KL "
        "exceeds 0.1, clips the gradient norm over all parameters (rsl_rl: the actor's and the critic's apart), uses "
        "Adam's epsilon 1e-5 (rsl_rl: 1e-8), draws a permutation per epoch (rsl_rl: one for all 4) and evaluates every "
        "25 iterations inside its loop (rsl_rl: never). Matched through hooks: rsl_rl's linear annealing (its "
        "schedule \"fixed\", the optimizer's rate set before each update) and ours' orthogonal initialization "
        "(rsl_rl's `MLP.init_weights`).",
        "",
        runs_table(pairs, methods),
        "",
        "Where the time goes:",
        "",
    ]
    for method in methods:
        lines += phases_table(pairs, method)
    lines += probe_lines(data)
    lines += failed_lines(failed)
    note = "; each of ours with CLEANRL_EMBODIED_COMPILE_TIMES=&lt;its run directory&gt;/compile_times.json"
    lines += commands_block([r["command"] for r in data["runs"]], note)
    return "\n".join(lines)


def write_outputs(data: dict, out: Path, results_md: str) -> None:
    save_runs(data, out)
    text = report(data)
    write_report(out, "# ppo_continuous against rsl_rl on PushCubeRL (CPU)", lambda _: text, results_md, SECTION)


def rsl_rl_version(path: str) -> str | None:
    found = sorted(Path(path).glob("rsl_rl_lib-*.dist-info"))
    return found[0].name.removeprefix("rsl_rl_lib-").removesuffix(".dist-info") if found else None


def main(args: Args) -> dict | list[RunSpec]:
    out = Path(args.out).resolve()
    if args.report_only:
        data = saved_runs(out, "the benchmark")
        write_outputs(data, out, args.results_md)
        return data
    specs = plan(args)
    if args.dry_run:
        for spec in specs:
            print(shell_command(spec.command, spec.env))
        return specs
    version = rsl_rl_version(args.rsl_rl_path)
    if version != RSL_RL_VERSION:
        fail(f"--rsl-rl-path {args.rsl_rl_path}: no rsl-rl-lib {RSL_RL_VERSION} there (found {version}); `{INSTALL}`")
    command = invocation(__file__, sys.argv[1:], "uv run --extra export python")
    data = {"args": dataclasses.asdict(args), "command": command, "rsl_rl_version": version, "machine": machine_info(),
            "versions": package_versions(), "git": git_info(), "runs": [], "finished": time.time(), "total_s": 0.0,
            "load_avg_end": None}  # fmt: skip
    start = time.time()
    if args.compile_bytecode:
        subprocess.run(bytecode_command(args), cwd=REPO, capture_output=True)  # (a file it cannot compile: no matter)
        data["bytecode_s"] = round(time.time() - start, 1)
        print(f"bytecode compiled in {data['bytecode_s']:.0f} s", flush=True)
    for i, spec in enumerate(specs, 1):
        record = run_one(spec, out / "runs" / f"pair{spec.pair}__{spec.method}", args.skip)
        data["runs"].append(record)
        print(f"[{i}/{len(specs)}] {progress(record)}", flush=True)
        save_runs(data, out)
    if args.probe:
        data["probe"] = probe(args)
    finished(data, start)
    write_outputs(data, out, args.results_md)
    run_git = provenance.commits_of([r.get("metrics") or {} for r in data["runs"]], data["git"])
    provenance.record(out, command, [r["command"] for r in data["runs"]], data["machine"], data["git"], run_git)
    return data


if __name__ == "__main__":
    main(tyro.cli(Args))
