"""Speed suite on PushCubeRL: env-only throughput, training SPS eager vs --compile, and where an iteration's time goes.

    uv run python -m benchmarks.speed.speed                             # ~10 min on a 2-core CPU; CUDA too when present
    uv run python -m benchmarks.speed.speed --parts env --env-threads 1 2 --env-num-envs 4096 16384
    uv run python -m benchmarks.speed.speed --parts train --scripts ppo_continuous --num-envs 1024 \\
        --extra="--num-steps 50"

Parts, measured one after another in this one invocation (threads pinned, warm-up left out):

1. env: PushCubeRL `step()` alone (autoreset and episode statistics included) with random actions drawn up
   front, vs num_envs, on the CPU at each of `--env-threads` and on CUDA.
2. train: each script's CLI in its own process (`--eval-freq 0 --save-freq 0`), eager and then `--compile`
   with the same flags; steady-state SPS = median over iterations after `--skip` of batch / the time between
   consecutive `charts/SPS` TensorBoard events; end-to-end SPS (compilation included) from summary.json.
3. breakdown: each script's real `main()` runs in this process, timed through public seams only (nothing
   of the trainer module is replaced): the agent comes from the policy hook (`--policy
   benchmarks.speed.speed:timed_agent`, the script's own network whose no-grad calls are timed, and so is the sampling
   from the distributions they return, up to the action's log-prob: policy), the envs that `shared.build_env` makes time
   their `step`/`reset` (env step), and the update runs from the rollout's last forward to the iteration's
   `RunLogger.log` (advantages + epochs of minibatch loss/backward/step). The iteration is the time between two `log`
   calls; the rest (overhead) is what is left: storage writes, the TensorDict the policy step returns, finite checks,
   episode statistics, logging, progress bar, and the timers' own calls (a few microseconds per env step; plain function
   calls, no synchronization on the CPU). In older reports the sampling and log-prob counted as rest (at 1 env on
   HalfCheetah that was most of a 20% rest). On CUDA the timers synchronize at every boundary. Profilers were not
   used: cProfile's per-call cost inflates exactly the Python-heavy parts (env wrappers, TensorDict) whose share
   we want to know.

4. gym (`--parts gym`, CPU): Gymnasium ids (HalfCheetah-v5 1 env x 2048 steps and 8 x 256, Pendulum-v1 16 x 256),
   each measured side by side in this process, repeats interleaved: env-only, the raw Gymnasium vector env with
   numpy actions vs `make_env` with the same actions ("contract overhead", target <= 10%; and EnvPool when
   installed); a rollout as ppo_continuous does it, through its public `Agent`/`policy_step` and the shared
   storage/bookkeeping, vs `make_env` plus one batched `policy_step` per step ("rollout overhead", target <= 15%);
   and part 3's breakdown of the real main() with benchmarks/suite/configs/ppo_continuous__HalfCheetah-v5.txt's flags.
   Alone it writes `speed-gym-cpu` (results folder and docs/benchmarks.md section):
       uv run python -m benchmarks.speed.speed --parts gym

Writes `speed.png`, `speed.md` and `speed.json` to `--out` (default docs/results/speed-<cpu|cuda>/) and
replaces the `speed-<cpu|cuda>` section of docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import tyro
from gymnasium.vector import VectorWrapper

from benchmarks.common import (
    CONFIG_DIR,
    REPO,
    RESULTS_DIR,
    RESULTS_MD,
    SCRIPTS_DIR,
    env_throughput,
    fail,
    git_info,
    invocation,
    machine_info,
    md_table,
    merge_flags,
    package_versions,
    record_lines,
    shell_command,
    steady_sps,
    sync,
    write_section,
)
from benchmarks.suite import provenance

GYM_SETTINGS = (("HalfCheetah-v5", 1, 2048), ("HalfCheetah-v5", 8, 256), ("Pendulum-v1", 16, 256))
"""(env id, num_envs, steps per env) of the gym part: CleanRL's HalfCheetah setting, 8 envs, a tiny physics"""
STEPS_PER_ENV = {"ppo_continuous": 20, "ppo_ddp": 20, "grpo": 50}  # rollout length per iteration (grpo: the horizon)
PHASES = ("env", "policy", "update", "rest")


@dataclass
class Args:
    parts: tuple[Literal["env", "train", "breakdown", "gym"], ...] = ("env", "train", "breakdown")
    """which parts to measure (gym: Gymnasium ids, written to its own speed-gym-cpu section)"""
    scripts: tuple[str, ...] = ("ppo_continuous", "grpo", "ppo_ddp")
    """trainers measured in the train and breakdown parts"""
    env_num_envs: tuple[int, ...] = (64, 256, 1024, 4096)
    """numbers of envs of the env-only part (CUDA adds 16384)"""
    env_threads: tuple[int, ...] = (1,)
    """CPU thread counts of the env-only part (e.g. 1 2 4 on a machine with free cores; on a 2-core machine
    shared with other jobs a second thread waits for a busy core and throughput collapses)"""
    env_steps: int = 200
    """timed env steps per repeat"""
    repeats: int = 5
    """timed repeats of the env-only part; the median is reported"""
    num_envs: tuple[int, ...] = (64, 256, 1024)
    """numbers of envs of the train part on the CPU"""
    cuda_num_envs: tuple[int, ...] = (1024, 4096, 16384)
    """numbers of envs of the train part on CUDA"""
    threads: int = 1
    """CPU threads of the train and breakdown parts (OMP_NUM_THREADS / torch.set_num_threads)"""
    compile: bool = True
    """also measure --compile in the train part"""
    iterations: int = 12
    """iterations per training run"""
    skip: int = 4
    """first iterations left out of steady-state figures (warm-up, compilation)"""
    breakdown_num_envs: int = 256
    """num_envs of the breakdown part (the scripts' default)"""
    cuda: bool = True
    """also measure on CUDA when a GPU is present"""
    extra: str = ""
    """flags added to every training run and breakdown, with "=", e.g. --extra='--num-steps 50'"""
    out: str | None = None
    """output folder (default docs/results/speed-<cpu|cuda>)"""
    results_md: str = str(RESULTS_MD)
    """markdown file whose speed-<cpu|cuda> section is replaced ('' leaves it alone)"""
    gym_settings: tuple[tuple[str, int, int], ...] = GYM_SETTINGS
    """gym part: (env id, num_envs, steps per env) triples"""
    gym_max_steps: int = 100_000
    """gym part: cap on the steps per env of every setting (tests use a few)"""
    gym_breakdown: bool = True
    """gym part: also break a real ppo_continuous iteration down on the HalfCheetah-v5 settings"""
    gym_pairs: int = 3
    """gym part: turns of that breakdown (sync, then envpool when installed, ...); phases are means over turns"""
    report_only: bool = False
    """measure nothing: redraw the plot and tables from <out>/speed.json"""


def devices(args: Args) -> list[str]:
    return ["cpu"] + (["cuda"] if args.cuda and torch.cuda.is_available() else [])


# ---- 1. env-only throughput --------------------------------------------------------------------
def measure_env(args: Args) -> list[dict]:
    rows = []
    for device in devices(args):
        for threads in args.env_threads if device == "cpu" else (args.threads,):
            torch.set_num_threads(threads)
            for n in (*args.env_num_envs, *((16384,) if device == "cuda" else ())):
                rows.append(
                    {
                        "device": device,
                        "threads": threads,
                        "num_envs": n,
                        "steps_per_s": env_throughput(n, device, args.env_steps, args.repeats),
                    }
                )
                print(
                    f"env {device} threads={threads} num_envs={n}: {rows[-1]['steps_per_s']:,.0f} steps/s", flush=True
                )
    torch.set_num_threads(args.threads)
    return rows


# ---- 2. training SPS, eager vs --compile, one process per run ------------------------------------
def training_flags(script: str, num_envs: int, iterations: int, device: str, extra: str) -> list[str]:
    steps = STEPS_PER_ENV[script]
    base = [
        "--env-id",
        "PushCubeRL",
        "--num-envs",
        str(num_envs),
        "--num-steps",
        str(steps),
        "--total-timesteps",
        str(iterations * num_envs * steps),
        "--eval-freq",
        "0",
        "--save-freq",
        "0",
        "--num-eval-envs",
        "8",
        "--num-eval-episodes",
        "8",
        "--cuda" if device == "cuda" else "--no-cuda",
    ]
    return merge_flags(base, extra.split())


def run_training(script: str, flags: list[str], threads: int, tmp: Path, skip: int) -> dict:
    out_dir = Path(tempfile.mkdtemp(dir=tmp))
    env_vars = {"OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, str(SCRIPTS_DIR / f"{script}.py"), *flags, "--output-dir", str(out_dir)]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, **env_vars}, capture_output=True, text=True)
    if proc.returncode:
        fail(f"{shell_command(cmd, env_vars)} exited {proc.returncode}: {proc.stdout[-500:]}{proc.stderr[-500:]}")
    summary_path = next(out_dir.glob("*/summary.json"))
    summary = json.loads(summary_path.read_text())
    return {
        "steady_sps": steady_sps(summary_path.parent, skip),
        "end_to_end_sps": summary["sps"],
        "command": shell_command(cmd[:-2], env_vars),
    }


def measure_training(args: Args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for device in devices(args):
            for script in args.scripts:
                for n in args.num_envs if device == "cpu" else args.cuda_num_envs:
                    row = {"device": device, "script": script, "num_envs": n}
                    flags = training_flags(script, n, args.iterations, device, args.extra)
                    modes = (("eager", ["--compile", "off"]), ("compile", ["--compile", "on"]))[: 1 + args.compile]
                    for mode, mode_flags in modes:
                        row[mode] = run_training(script, flags + mode_flags, args.threads, Path(tmp), args.skip)
                        print(
                            f"train {device} {script} num_envs={n} {mode}: steady {row[mode]['steady_sps']:,.0f} "
                            f"SPS, end-to-end {row[mode]['end_to_end_sps']:,.0f}",
                            flush=True,
                        )
                    rows.append(row)
    return rows


# ---- 3. per-iteration breakdown of the real main() -------------------------------------------------
class PhaseTimer:
    """Accumulates time per phase within an iteration; only the outermost timed call counts.

    The timing is a plain function call (`call`), not a context manager: the breakdown times three calls per env
    step, and a generator-based context manager costs a few microseconds each, which at one env (~1 ms a step)
    lands in "rest" and is the benchmark's, not the trainer's. On the CPU nothing is synchronized."""

    def __init__(self, device: str):
        self.device, self.depth = device, 0
        self.cuda = device == "cuda"
        self.window: dict[str, float] = defaultdict(float)
        self.update_start: float | None = None
        self.rollout_end: float | None = None
        self.last_log: float | None = None
        self.rows: list[dict[str, float]] = []

    def call(self, phase: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, its time added to ``phase`` (unless a timed call is already under way)."""
        if self.depth:
            return fn(*args, **kwargs)
        if self.cuda:
            torch.cuda.synchronize()
        self.depth = 1
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if self.cuda:
                torch.cuda.synchronize()
            self.window[phase] += time.perf_counter() - start
            self.depth = 0

    def iteration_end(self) -> None:
        sync(self.device)
        now = time.perf_counter()
        if self.last_log is not None and self.update_start is not None:
            total = now - self.last_log
            row = {
                "total": total,
                "env": self.window["env"],
                "policy": self.window["policy"],
                "update": now - self.update_start,
            }
            row["rest"] = total - row["env"] - row["policy"] - row["update"]
            self.rows.append(row)
        self.window.clear()
        self.update_start, self.last_log = None, now


class TimedEnv(VectorWrapper):
    def __init__(self, env, timer: PhaseTimer):
        super().__init__(env)
        self.timer = timer

    def step(self, actions):
        return self.timer.call("env", self.env.step, actions)

    def reset(self, **kwargs):
        return self.timer.call("env", self.env.reset, **kwargs)


TIMER: PhaseTimer | None = None
"""The timer of the breakdown in progress, read by `timed_agent` (a --policy factory gets no other handle)."""

_TIMED_DISTRIBUTIONS: dict[type, type] = {}


def _log_prob_timed(cls: type):
    """``cls.log_prob`` that also counts as "policy" the time since the forward that made the distribution ended:
    the trainers' policy step samples the action and takes its log-prob right after the forward, and that is the
    policy's work (timing only the network's forward left it in "rest"). One timed call instead of two (sample
    and log_prob): the instrumentation's own cost lands in "rest"."""

    def log_prob(self, value):
        out = cls.log_prob(self, value)
        if not TIMER.depth:  # not inside another timed call
            sync(TIMER.device)
            now = time.perf_counter()
            TIMER.window["policy"] += now - TIMER.rollout_end
            TIMER.rollout_end = now
        return out

    return log_prob


def _time_sampling(dist) -> None:
    """Give a distribution that a rollout forward returned the timed ``log_prob`` (in place: its class becomes a
    subclass that adds only that method)."""
    cls = type(dist)
    if cls not in _TIMED_DISTRIBUTIONS:
        _TIMED_DISTRIBUTIONS[cls] = type(f"Timed{cls.__name__}", (cls,), {"log_prob": _log_prob_timed(cls)})
    dist.__class__ = _TIMED_DISTRIBUTIONS[cls]


def timed_agent(obs_space, act_space, args):
    """--policy benchmarks.speed.speed:timed_agent: the trainer's own network, with its inference calls timed as
    "policy", and so is the sampling from the distributions they return, up to the log-prob of the sampled action (the
    policy step but for the TensorDict it puts its results in). The update starts at the first training forward after
    the rollout; the work between the rollout's last policy call (V of the last obs) and that point (advantages, batch
    assembly) is counted as update too."""
    base = importlib.import_module(type(args).__module__)
    agent_class = getattr(base, "Agent", None) or base.Actor
    timer = TIMER

    class TimedAgent(agent_class):
        def _timed(self, fn, obs):
            if torch.is_grad_enabled():  # a training forward: the update is under way
                if timer.update_start is None:
                    timer.update_start = timer.rollout_end
                return fn(obs)
            out = timer.call("policy", fn, obs)
            timer.rollout_end = time.perf_counter()
            dist = out[0] if type(out) is tuple else out  # forward: (distribution, value)
            if isinstance(dist, torch.distributions.Distribution):
                _time_sampling(dist)
            return out

        def dist(self, obs):
            return self._timed(super().dist, obs)

        def get_value(self, obs):
            return self._timed(super().get_value, obs)

        def forward(self, obs):
            return self._timed(super().forward, obs)

    return TimedAgent(obs_space, act_space, args)


@contextlib.contextmanager
def instrumented(timer: PhaseTimer):
    """Time the real loop through public seams: the agent comes from `--policy benchmarks.speed.speed:timed_agent`, the
    envs that `shared.build_env` makes are wrapped in `TimedEnv`, and every `RunLogger.log` carrying
    charts/SPS closes an iteration. Nothing of the trainer module is replaced; all is restored afterwards."""
    global TIMER
    from cleanrl_embodied.shared import builders, run_logger

    make_env, log = builders.make_env, run_logger.RunLogger.log

    def timed_log(self, scalars, step):
        if "charts/SPS" in scalars:
            timer.iteration_end()
        log(self, scalars, step)

    TIMER, builders.make_env, run_logger.RunLogger.log = (
        timer,
        lambda *a, **k: TimedEnv(make_env(*a, **k), timer),
        timed_log,
    )
    try:
        yield
    finally:
        TIMER, builders.make_env, run_logger.RunLogger.log = None, make_env, log


def breakdown(script: str, num_envs: int, iterations: int, skip: int, device: str, extra: str) -> dict:
    """Run the script's main() in this process with timers: the mean time (s) per iteration after `skip` of the
    whole iteration, env, policy, update and rest. Means, not medians, so that the parts add up to the whole:
    "overhead <= 10% of wall time" is a statement about sums."""
    module = importlib.import_module(f"cleanrl_embodied.{script}")
    flags = training_flags(script, num_envs, iterations, device, extra) + ["--policy", f"{__name__}:timed_agent"]
    timer = PhaseTimer(device)
    with tempfile.TemporaryDirectory() as tmp, instrumented(timer), contextlib.redirect_stderr(io.StringIO()):
        module.main(tyro.cli(module.Args, args=[*flags, "--output-dir", tmp]))
    rows = timer.rows[max(0, skip - 1) :]
    if not rows:
        fail(f"breakdown of {script}: no steady iterations; raise --iterations above --skip")
    return {**{key: statistics.fmean(r[key] for r in rows) for key in ("total", *PHASES)}, "iterations": len(rows)}


def measure_breakdown(args: Args) -> list[dict]:
    torch.set_num_threads(args.threads)
    rows = []
    for device in devices(args):
        n = args.breakdown_num_envs if device == "cpu" else args.cuda_num_envs[0]
        for script in args.scripts:
            result = breakdown(script, n, args.iterations, args.skip, device, args.extra)
            rows.append({"device": device, "script": script, "num_envs": n, **result})
            print(
                f"breakdown {device} {script} num_envs={n}: "
                + ", ".join(f"{k} {1e3 * result[k]:.1f} ms" for k in ("total", *PHASES)),
                flush=True,
            )
    return rows


# ---- 4. Gymnasium ids: what the contract, the rollout and the iteration add to the simulator --------------------


def gym_config_flags(env_id: str) -> list[str]:
    """ppo_continuous's flags for `env_id` from benchmarks/suite/configs (comments dropped), [] when there is none."""
    path = CONFIG_DIR / f"ppo_continuous__{env_id}.txt"
    if not path.is_file():
        return ["--env-id", env_id]
    return " ".join(line.split("#")[0] for line in path.read_text().splitlines()).split()


def _raw_vector_env(env_id: str, num_envs: int):
    """The plain Gymnasium vector env that make_env wraps (same sub-env wrappers and render mode)."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    from cleanrl_embodied.shared.envs.gymnasium_backend import offers_rgb_array
    from cleanrl_embodied.shared.envs.render import SafeRender

    kwargs = {"render_mode": "rgb_array"} if offers_rgb_array(env_id) else {}
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        wrappers=[SafeRender],
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        **kwargs,
    )


def _interleaved(runs: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds of each call of each timed function, run in turns (A, B, C, A, B, C, ...) for `rounds` rounds
    after one warm-up round, so that the load of other processes falls on all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(rounds + 1):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            if rep:
                times[name].append(time.perf_counter() - start)
    return times


def _paired_ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of a's time over b's in the same round: a slow spell of the machine that falls on
    one round cancels out, where a ratio of medians taken over the whole pass would keep it."""
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def gym_env_and_rollout(env_id: str, num_envs: int, steps: int, repeats: int, chunk: int = 256) -> dict:
    """Seconds per env step (all envs) of, side by side in this process: the raw Gymnasium vector env with
    numpy actions; make_env with the same actions as tensors; a rollout as ppo_continuous does it (its public
    `Agent`/`policy_step`, storage writes, the env step, V(final_obs), its rollout bookkeeping) and the same
    rollout's floor: `make_env` plus one batched `policy_step` per step. When EnvPool is installed,
    make_env(vectorization="envpool") is then timed in a second pass, against the raw env again, with the other
    envs closed: its threads stay out of the first pass. Each call runs `chunk` steps (the rollout: one rollout
    of that length), in `repeats * steps / chunk` rounds; the overheads are medians of per-round ratios."""
    import importlib.util

    import numpy as np

    from cleanrl_embodied import ppo_continuous as ppo
    from cleanrl_embodied.shared import make_env
    from cleanrl_embodied.shared.non_finite import NonFiniteWatch
    from cleanrl_embodied.shared.rollout_stats import RolloutStats
    from cleanrl_embodied.shared.storage import rollout_storage

    raw, ours = _raw_vector_env(env_id, num_envs), make_env(env_id, num_envs, "cpu", seed=0)
    rounds, steps = max(1, repeats * steps // min(chunk, steps)), min(chunk, steps)
    space = raw.single_action_space
    unit = np.random.default_rng(0).uniform(-1, 1, (steps, num_envs, space.shape[0])).astype(np.float32)
    scaled = (space.low + (space.high - space.low) * (unit + 1) / 2).astype(space.dtype)  # what make_env sends
    # one action batch per step, sliced up front on both sides: indexing a tensor (~1 us) is the harness's cost,
    # not the contract's, and indexing the numpy array would cost the raw env less
    scaled, unit_t = list(scaled), list(torch.from_numpy(unit))
    args = tyro.cli(ppo.Args, args=gym_config_flags(env_id))
    act_dim = ours.single_action_space.shape[0]
    agent = ppo.Agent(ours.single_observation_space, ours.single_action_space, args)
    floor_env = make_env(env_id, num_envs, "cpu", seed=0)
    raw.reset(seed=0)
    state = {"obs": ours.reset()[0], "floor_obs": floor_env.reset()[0]}

    def env_raw():
        for t in range(steps):
            raw.step(scaled[t])

    def env_contract(env=ours):
        for t in range(steps):
            env.step(unit_t[t])

    def rollout_floor():  # the env contract plus one batched policy step per env step, nothing else
        with torch.no_grad():
            obs = state["floor_obs"]
            for _ in range(steps):
                obs = floor_env.step(ppo.policy_step(agent, obs)["action"])[0]
            state["floor_obs"] = obs

    def rollout_trainer():  # the body of ppo_continuous's rollout loop (CPU), through its public functions
        storage = rollout_storage(
            steps,
            num_envs,
            "cpu",
            obs=ours.single_observation_space,
            action=((act_dim,), torch.float32),
            logprob=((), torch.float32),
            value=((), torch.float32),
            final_value=((), torch.float32),
            reward=((), torch.float32),
            terminated=((), torch.bool),
            done=((), torch.bool),
        )
        stats, watch, next_obs = RolloutStats("cpu"), NonFiniteWatch(num_envs, "cpu"), state["obs"]
        with torch.no_grad():
            for step in range(steps):
                out = ppo.policy_step(agent, next_obs)
                storage["obs"][step] = next_obs
                for key in ("action", "logprob", "value"):
                    storage[key][step] = out[key]
                next_obs, reward, terminated, truncated, info = ours.step(out["action"])
                storage["reward"][step], storage["terminated"][step] = reward, terminated
                storage["done"][step] = done = terminated | truncated
                stats.add_reward_terms(info)
                if done.any():
                    storage["final_value"][step] = agent.get_value(info["final_obs"])
                    watch.update_final(step, info["final_obs"], done)
                    stats.add_episodes(info)
            watch.update_rollout(storage["obs"], next_obs, storage["reward"])
        state["obs"] = next_obs

    runs = {
        "env_raw": env_raw,
        "env_contract": env_contract,
        "rollout_floor": rollout_floor,
        "rollout_trainer": rollout_trainer,
    }
    times = _interleaved(runs, rounds)
    result = {k: statistics.median(v) / steps for k, v in times.items()}
    result["contract_ratio"] = _paired_ratio(times, "env_contract", "env_raw")
    result["rollout_ratio"] = _paired_ratio(times, "rollout_trainer", "rollout_floor")
    for env in (ours, floor_env):
        env.close()
    if importlib.util.find_spec("envpool") is not None:
        # a pass of its own, so that EnvPool's threads (and the cores they leave busy) cannot touch the others
        pool = make_env(env_id, num_envs, "cpu", seed=0, vectorization="envpool")
        pool.reset()
        pair = _interleaved({"env_raw": env_raw, "env_envpool": lambda: env_contract(pool)}, rounds)
        result["envpool_ratio"] = _paired_ratio(pair, "env_envpool", "env_raw")
        result["env_envpool"] = result["envpool_ratio"] * result["env_raw"]  # on the first pass's scale
        pool.close()
    raw.close()
    return result


def measure_gym(args: Args) -> dict:
    torch.set_num_threads(args.threads)
    rows, breakdown_rows = [], []
    for env_id, n, steps in args.gym_settings:
        steps = min(steps, args.gym_max_steps)
        r = gym_env_and_rollout(env_id, n, steps, args.repeats)
        rows.append({"env_id": env_id, "num_envs": n, "steps": steps, **r})
        print(
            f"gym {env_id} num_envs={n}: raw {1e6 * r['env_raw']:.0f} us/step, contract "
            f"{100 * (r['contract_ratio'] - 1):+.1f}%, rollout {100 * (r['rollout_ratio'] - 1):+.1f}%",
            flush=True,
        )
    import importlib.util

    # the real training loop, with the sync Gymnasium vector env and (when installed) envpool's, one after the other
    vectorizations = ["sync"] + (["envpool"] if importlib.util.find_spec("envpool") is not None else [])
    for env_id, n, steps in args.gym_settings:
        if not args.gym_breakdown or env_id != "HalfCheetah-v5":
            continue
        steps = min(steps, args.gym_max_steps)
        config = merge_flags(gym_config_flags(env_id), ["--num-envs", str(n), "--num-steps", str(steps)])
        quiet = [
            "--total-timesteps",
            str(args.iterations * n * steps),
            "--eval-freq",
            "0",
            "--save-freq",
            "0",
            "--num-eval-envs",
            "1",
            "--num-eval-episodes",
            "1",
            "--eval-env-kwargs",
            '{"max_episode_steps":10}',
        ]
        runs: dict[str, list[dict]] = {v: [] for v in vectorizations}
        for _ in range(args.gym_pairs):  # in turns (sync, envpool, sync, ...): a slow spell falls on both
            for vectorization in vectorizations:
                extra = " ".join(merge_flags(config, quiet, ["--env-vectorization", vectorization], args.extra.split()))
                runs[vectorization].append(breakdown("ppo_continuous", n, args.iterations, args.skip, "cpu", extra))
        for vectorization, results in runs.items():
            result = {key: statistics.fmean(r[key] for r in results) for key in ("total", *PHASES)}
            # training SPS vs sync: the median over turns of sync's iteration time over this one's
            result["sps_vs_sync"] = statistics.median(s["total"] / r["total"] for s, r in zip(runs["sync"], results))
            breakdown_rows.append(
                {
                    "env_id": env_id,
                    "num_envs": n,
                    "num_steps": steps,
                    "vectorization": vectorization,
                    "turns": len(results),
                    "iterations": results[0]["iterations"],
                    **result,
                }
            )
            print(
                f"gym breakdown {env_id} num_envs={n} {vectorization}: "
                + ", ".join(f"{k} {1e3 * result[k]:.1f} ms" for k in ("total", *PHASES))
                + f", training SPS {result['sps_vs_sync']:.2f}x sync",
                flush=True,
            )
    return {"rows": rows, "breakdown": breakdown_rows}


def gym_tables(gym: dict) -> list[str]:
    pct = lambda a, b: f"{100 * (a / b - 1):+.1f}%"
    rows = []
    for r in gym["rows"]:
        contract = r.get("contract_ratio", r["env_contract"] / r["env_raw"])  # older speed.json: medians' ratio
        rollout = r.get("rollout_ratio", r["rollout_trainer"] / r["rollout_floor"])
        envpool = r.get("env_envpool")
        rows.append(
            [
                r["env_id"],
                str(r["num_envs"]),
                f"{1e6 * r['env_raw']:.0f}",
                f"{1e6 * r['env_contract']:.0f}",
                pct(contract, 1) + (" (<= 10%)" if contract <= 1.10 else " (> 10%)"),
                f"{1e6 * envpool:.0f} ({r['env_raw'] / envpool:.1f}x raw)" if envpool else "-",
                f"{1e6 * r['rollout_floor']:.0f}",
                f"{1e6 * r['rollout_trainer']:.0f}",
                pct(rollout, 1) + (" (<= 15%)" if rollout <= 1.15 else " (> 15%)"),
            ]
        )
    parts = [
        "**Gymnasium ids: what the env contract and the trainer's rollout add** (CPU, microseconds per env step "
        "of all envs, medians of interleaved rounds of 256 steps in one process, overheads: medians of the "
        "per-round ratios; env-only: the raw Gymnasium vector env "
        "with numpy actions vs `make_env` with the same actions; rollout: ppo_continuous's rollout body "
        "(`policy_step`, storage writes, env step, V(final_obs), bookkeeping) vs `make_env` plus one batched "
        "`policy_step`):",
        "",
        md_table(
            [
                "env",
                "num_envs",
                "raw env",
                "make_env",
                "contract overhead",
                "envpool",
                "rollout floor",
                "trainer rollout",
                "rollout overhead",
            ],
            rows,
        ),
        "",
    ]
    if gym.get("breakdown"):
        sync = {
            (r["env_id"], r["num_envs"]): r["total"]
            for r in gym["breakdown"]
            if r.get("vectorization", "sync") == "sync"
        }
        rows = [
            [
                r["env_id"],
                str(r["num_envs"]),
                str(r["num_steps"]),
                r.get("vectorization", "sync"),
                f"{1e3 * r['total']:.1f}",
                *[f"{1e3 * r[p]:.1f} ms ({100 * r[p] / r['total']:.0f}%)" for p in PHASES],
                "yes" if r["rest"] <= 0.1 * r["total"] else "no",
                f"{r['sps_vs_sync']:.2f}x"
                if "sps_vs_sync" in r
                # older speed.json: one run each
                else f"{sync[r['env_id'], r['num_envs']] / r['total']:.2f}x"
                if (r["env_id"], r["num_envs"]) in sync
                else "-",
            ]
            for r in gym["breakdown"]
        ]
        parts += [
            "**Where a ppo_continuous iteration's time goes on HalfCheetah-v5** (flags of "
            "benchmarks/suite/configs/ppo_continuous__HalfCheetah-v5.txt, `--env-vectorization` as shown; mean over "
            "the iterations after --skip and over --gym-pairs turns; training SPS vs sync: the median over "
            "turns of the sync iteration's time over this one's, the runs taking turns in one process):",
            "",
            md_table(
                [
                    "env",
                    "num_envs",
                    "num_steps",
                    "vectorization",
                    "iteration (ms)",
                    "env step",
                    "policy (forward + sampling)",
                    "update (advantages + epochs)",
                    "rest (overhead)",
                    "rest <= 10%",
                    "training SPS vs sync",
                ],
                rows,
            ),
            "",
        ]
    return parts


# ---- report -----------------------------------------------------------------------------------------
def tables(data: dict) -> str:
    parts = []
    if data.get("env"):
        parts += [
            "**Env-only throughput** (PushCubeRL `step()`, random actions, median of repeats):",
            "",
            md_table(
                ["device", "threads", "num_envs", "env-steps/s"],
                [[r["device"], str(r["threads"]), str(r["num_envs"]), f"{r['steps_per_s']:,.0f}"] for r in data["env"]],
            ),
            "",
        ]
    if data.get("train"):
        header = [
            "device",
            "script",
            "num_envs",
            "eager SPS (steady)",
            "compile SPS (steady)",
            "compile / eager",
            "eager SPS (end to end)",
            "compile SPS (end to end)",
        ]
        rows = []
        for r in data["train"]:
            c = r.get("compile")
            rows.append(
                [
                    r["device"],
                    r["script"],
                    str(r["num_envs"]),
                    f"{r['eager']['steady_sps']:,.0f}",
                    f"{c['steady_sps']:,.0f}" if c else "-",
                    f"{c['steady_sps'] / r['eager']['steady_sps']:.2f}x" if c else "-",
                    f"{r['eager']['end_to_end_sps']:,.0f}",
                    f"{c['end_to_end_sps']:,.0f}" if c else "-",
                ]
            )
        parts += [
            f"**Training SPS** ({data['threads']} thread(s), {data['iterations']} iterations per run, steady "
            f"state = median after {data['skip']}; end to end includes start-up of the loop and compilation):",
            "",
            md_table(header, rows),
            "",
        ]
    if data.get("breakdown"):
        header = [
            "device",
            "script",
            "num_envs",
            "iteration (ms)",
            "env step",
            "policy (forward + sampling)",
            "update (advantages + epochs)",
            "rest (overhead)",
            "overhead <= 10%",
        ]
        rows = [
            [
                r["device"],
                r["script"],
                str(r["num_envs"]),
                f"{1e3 * r['total']:.1f}",
                *[f"{1e3 * r[p]:.1f} ms ({100 * r[p] / r['total']:.0f}%)" for p in PHASES],
                "yes" if r["rest"] <= 0.1 * r["total"] else "no",
            ]
            for r in data["breakdown"]
        ]
        parts += [
            f"**Where an iteration's time goes** (eager; mean over {data['iterations'] - data['skip']} "
            "iterations of the real training loop; rest = the iteration minus the other three):",
            "",
            md_table(header, rows),
            "",
        ]
    if data.get("gym"):
        parts += gym_tables(data["gym"])
    return "\n".join(parts)


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, LogLocator, NullFormatter, ScalarFormatter

    panels = [p for p in ("env", "train", "breakdown") if data.get(p)]
    if not panels:  # the gym part is a table only
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4), squeeze=False)
    for ax, part in zip(axes[0], panels):
        if part == "env":
            for key in dict.fromkeys((r["device"], r["threads"]) for r in data["env"]):
                rs = [r for r in data["env"] if (r["device"], r["threads"]) == key]
                ax.plot(
                    [r["num_envs"] for r in rs],
                    [r["steps_per_s"] for r in rs],
                    marker="o",
                    label=f"{key[0]}, {key[1]} thread(s)" if key[0] == "cpu" else key[0],
                )
            ax.set(title="PushCubeRL env-only", ylabel="env steps/s")
        elif part == "train":
            for i, key in enumerate(dict.fromkeys((r["device"], r["script"]) for r in data["train"])):
                rs = [r for r in data["train"] if (r["device"], r["script"]) == key]
                for mode, style in (("eager", "-"), ("compile", "--")):
                    if mode in rs[0]:
                        ax.plot(
                            [r["num_envs"] for r in rs],
                            [r[mode]["steady_sps"] for r in rs],
                            style,
                            marker="o",
                            color=f"C{i}",
                            label=f"{key[1]} ({key[0]}, {mode})",
                        )
            ax.set(title=f"training SPS, {data['threads']} thread(s)", ylabel="env steps/s (steady state)")
        else:
            labels = [f"{r['script']}\n{r['device']}, {r['num_envs']} envs" for r in data["breakdown"]]
            left = [0.0] * len(labels)
            for phase, color in zip(PHASES, ("tab:green", "tab:blue", "tab:orange", "tab:gray")):
                share = [100 * max(r[phase], 0.0) / r["total"] for r in data["breakdown"]]
                ax.barh(labels, share, left=left, color=color, label=phase)
                left = [a + b for a, b in zip(left, share)]
            ax.axvline(90, color="black", linestyle=":", linewidth=1)
            ax.set(title="time per iteration (eager; dotted: 90%)", xlabel="% of the iteration")
            ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.14))
            continue
        ax.set(xscale="log", yscale="log", xlabel="num_envs")
        ax.set_xticks(sorted({int(x) for line in ax.lines for x in line.get_xdata()}))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(EngFormatter())
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(data: dict, image: str) -> str:
    header = [
        f"Speed suite, {data['finished']}, {data['total_wall_s'] / 60:.1f} min in all.",
        "",
        *record_lines(data["invocation"], data["machine"], data["load_avg_end"], data["git"], data["versions"]),
        "",
        *([f"![speed]({image})", ""] if image else []),
    ]
    return "\n".join(header) + "\n" + tables(data)


def main(args: Args) -> None:
    if min(args.iterations, args.repeats, args.env_steps, args.threads) < 1 or args.skip < 1:
        fail("--iterations, --repeats, --env-steps, --threads and --skip must be positive")
    unknown = set(args.scripts) - set(STEPS_PER_ENV)
    if unknown:
        fail(f"--scripts: unknown {sorted(unknown)}; choose from {list(STEPS_PER_ENV)}")
    torch.set_num_threads(args.threads)
    kind = devices(args)[-1]
    kind = "gym-cpu" if set(args.parts) == {"gym"} else kind  # the gym part (CPU) alone: its own section
    out = Path(args.out) if args.out else RESULTS_DIR / f"speed-{kind}"
    if args.report_only:
        if not (out / "speed.json").is_file():
            fail(f"--report-only: no {out / 'speed.json'}; run the speed suite first")
        write_outputs(json.loads((out / "speed.json").read_text()), out, kind, args.results_md)
        return
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    data = {
        "invocation": invocation(__file__, sys.argv[1:], join=" ".join),
        "machine": machine_info(),
        "versions": package_versions(),
        "git": git_info(),
        "threads": args.threads,
        "iterations": args.iterations,
        "skip": args.skip,
    }
    measure = {"env": measure_env, "train": measure_training, "breakdown": measure_breakdown, "gym": measure_gym}
    for part in args.parts:
        data[part] = measure[part](args)
    data.update(
        total_wall_s=round(time.time() - start, 1),
        finished=time.strftime("%Y-%m-%d %H:%M"),
        load_avg_end=machine_info()["load_avg_1_5_15"],
    )
    (out / "speed.json").write_text(json.dumps(data, indent=1) + "\n")
    write_outputs(data, out, kind, args.results_md)


def write_outputs(data: dict, out: Path, kind: str, results_md: str) -> None:
    plot(data, out / "speed.png")
    has_plot = any(data.get(p) for p in ("env", "train", "breakdown"))
    (out / "speed.md").write_text(f"# Speed ({kind})\n\n" + report(data, "speed.png" if has_plot else "") + "\n")
    if results_md:
        md = Path(results_md)
        image = os.path.relpath(out / "speed.png", md.resolve().parent).replace(os.sep, "/") if has_plot else ""
        write_section(md, f"speed-{kind}", report(data, image))
    # its runs: the invocation (the env and breakdown parts run in it) and each trainer it timed, so that the report
    # depends on every trainer's fingerprints, not only on the one its own command names
    timed = [row[mode]["command"] for row in data.get("train") or [] for mode in ("eager", "compile") if mode in row]
    provenance.record(out, data["invocation"], [data["invocation"], *timed], data["machine"], data["git"])
    print(tables(data))
    print(f"wrote {out / 'speed.md'}")


if __name__ == "__main__":
    main(tyro.cli(Args))
