"""Whether and how a trainer compiles its pure functions (``--compile`` auto/on/off).

``compile_choice`` is the rule per device; ``Compiler`` wraps the functions and, under ``auto`` on the CPU, decides
from what the run measures: the second iteration is timed eager, and the run compiles when what compiling would save
over the iterations left exceeds what compiling costs. The compiled iteration's speed and the compile's cost come
from earlier runs of the same configuration on this machine (a small JSON file, ``compile_times_path``: the medians
of the last ``HISTORY`` runs of each mode), or, with none, from our own measurement (``CPU_COMPILED_RATIO``,
``CPU_COMPILE_S``). Every run adds what it measured.

Compiled code draws its random numbers as eager code does (Inductor's ``fallback_random``), so the choice changes
what a run computes only by float rounding; a resumed run keeps the choice its checkpoint recorded."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import torch

from cleanrl_embodied.shared.atomic_files import atomic_write
from cleanrl_embodied.shared.device import device_name

__all__ = ["QUIET_COMPILE_WARNINGS", "Compiler", "compile_choice", "compile_times_path"]

CPU_COMPILED_RATIO = 0.73
"""A compiled iteration's time over an eager one's, on the CPU, where no earlier run of the configuration measured
it: ppo_continuous on PushCubeRL at its defaults, 0.146 s against 0.200 s per iteration on a 2-core CPU
(docs/benchmarks.md, "Compiling on the CPU: what it costs and saves")."""

CPU_COMPILE_S = 12.0
"""What compiling costs on the CPU, in seconds of the first compiled iterations over the steady ones, where no
earlier run of the configuration measured it: ppo_continuous at its defaults with Inductor's caches empty, on the
quiet 2-core CPU. With its caches warm it was about 2 s; with the machine loaded 35-61 s cold and 8-10 s warm
(docs/benchmarks.md, "Compiling on the CPU: what it costs and saves")."""

WINDOW = 8
"""Iterations a run times in a mode (eager, or compiled from its first compiled iteration) before it records them:
the median is the steady iteration, and what the iterations took beyond it is the compile's cost."""

HISTORY = 5
"""Runs of each mode (eager, compiled) whose measurements a configuration keeps; the decision uses their medians.
One run's figures move with the machine's load (on the loaded 2-core CPU, compiled over eager from 0.89x to 1.02x
in three paired runs) and with Inductor's on-disk cache (cold or warm: 35-61 s or 8-10 s of compiling there), so a
single run beside another job must not decide the next ones."""

NOT_WORK = frozenset(
    {
        "seed", "total_timesteps", "exp_name", "output_dir", "track", "wandb_project_name", "wandb_entity",
        "capture_video", "eval_freq", "save_freq", "resume", "eval_checkpoint", "compile", "num_eval_envs",
        "num_eval_episodes", "eval_deterministic", "eval_env_kwargs", "max_consecutive_skips", "learning_rate",
        "anneal_lr", "target_kl", "torch_deterministic", "cuda", "trust_remote_code",
    }
)  # fmt: skip
"""Flags that leave what one training iteration does unchanged: runs that differ only in them share their
measurements (the seed, the length of the run, where it goes, how it is evaluated and kept)."""


def compile_times_path() -> Path:
    """Where this machine's compile measurements are kept: ``$CLEANRL_EMBODIED_COMPILE_TIMES``, else
    ``compile_times.json`` under ``$XDG_CACHE_HOME/cleanrl_embodied`` (``~/.cache`` by default)."""
    if os.environ.get("CLEANRL_EMBODIED_COMPILE_TIMES"):
        return Path(os.environ["CLEANRL_EMBODIED_COMPILE_TIMES"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "cleanrl_embodied" / "compile_times.json"


def compile_choice(setting: str, device_type: str, cudagraphs: bool = False) -> bool | None:
    """Whether a run compiles its update and policy step: ``--compile`` (``setting``) ``on`` always, ``off`` never;
    ``auto`` by device type (``device_type``):

    - ``cpu``: ``None``, decided by measurement (``Compiler.after_iteration``). The compiled update was faster in
      steady state on a 2-core CPU, but compiling costs seconds, which a short run does not win back.
    - ``cuda``: compiles only with CUDA graphs (``cudagraphs``: the trainer's ``--cudagraphs``), else eager. On an
      H200, ppo_continuous at 4096 envs ran 221,697 env steps/s eager, 187,905 compiled without CUDA graphs (the
      step is launch-bound there, and compiling alone does not remove the launches) and 277,303 compiled with them
      (docs/results/gpu-h200-2026-11-26). benchmarks/gpu_check.py's ppo part measures these again on every lent
      GPU and checks that this choice is the faster one.
    - any other device: eager (nothing measured)."""
    if setting != "auto":
        return setting == "on"
    if device_type == "cpu":
        return None
    return device_type == "cuda" and cudagraphs


QUIET_COMPILE_WARNINGS = {
    "torch.utils.cpp_extension": "No CUDA runtime is found",  # a CPU machine with a CUDA toolkit installed
    "torch._dynamo.variables.ctx_manager": "Profiler record function",  # the optimizer step's profiler label
}
"""Warnings torch.compile logs on every first compilation that say nothing about the run: the logger and how the
message starts. They are dropped, so that the console shows the run's own lines only."""


class _DropMessages(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def _quiet_compile_warnings() -> None:
    for name, start in QUIET_COMPILE_WARNINGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(start))


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


def _failed_to_compile(error: RuntimeError) -> bool:
    from torch._dynamo.exc import BackendCompilerFailed  # (a missing C++ compiler or Triton: Inductor's errors)

    return isinstance(error, BackendCompilerFailed)


def _run_on_rank_0(decide: Callable[[], bool]) -> bool:
    """``decide()`` on rank 0, its answer on every rank (one broadcast); just ``decide()`` outside torch.distributed.
    Every rank must compile or none: their optimizer steps would otherwise round differently."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return decide()
    box = [decide() if torch.distributed.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(box, src=0)
    return bool(box[0])


class Compiler:
    """Wraps a trainer's pure functions (``compiled = Compiler(...)``, then ``compiled(fn)``) and decides whether they
    run compiled.

    - ``setting``, ``device``, ``cudagraphs``: ``--compile``, the run's device and ``--cudagraphs`` (see
      ``compile_choice``). ``say`` prints one line: the decision and why, or why compiling does not work here.
    - ``trainer`` (``describe_trainer``) and ``flags`` (the run's flags as a dict) name the configuration whose
      measurements are kept and reused: the file's hash and the flags that change what an iteration does.
    - ``decided``: the choice a checkpoint recorded (``self.on``); a resumed ``auto`` run keeps it.

    The trainer calls ``after_iteration(iterations_left)`` once per training iteration, after its update and
    before its evaluation and checkpoint (which then record the choice). A wrapped function runs eager until the run
    decides to compile; compiled, it falls back to eager for good (one line) if torch.compile cannot build code
    here."""

    def __init__(self, setting: str, device: torch.device, say: Callable[[str], None], trainer: dict[str, Any],
                 flags: dict[str, Any], cudagraphs: bool = False, decided: bool | None = None):  # fmt: skip
        self.device, self.say = device, say
        self.on = compile_choice(setting, device.type, cudagraphs)
        if self.on is None and decided is not None:
            self.on = bool(decided)
            say(f"compile: {'on' if self.on else 'off'} (auto: as the run this one resumes decided)")
        work = {k: v for k, v in sorted(flags.items()) if k not in NOT_WORK}
        digest = hashlib.sha256(json.dumps([trainer["sha256"], work], default=str).encode()).hexdigest()[:16]
        self.key = f"{trainer['script']} {digest} on {device_name(device)} with torch {torch.__version__}"
        self.times: list[float] = []  # seconds per iteration in the current mode
        self.mode = None if self.on is None else ("compiled" if self.on else "eager")
        self.iteration_start: float | None = None  # the first wrapped call since the last iteration ended
        self.iterations = 0  # iterations ended
        self.eager_s: float | None = None  # the eager iteration an auto run timed before it compiled
        self.recorded = False

    # ---- the wrapped functions ----
    def __call__(self, fn: Callable, on_cpu: bool = True) -> Callable:
        """``fn``, run compiled once the run compiles (eager until then). ``on_cpu=False``: eager on the CPU whatever
        the run decides, for the rollout's policy step and value function. There compiling them did not pay: on the
        2-core CPU (ppo_continuous at its defaults, one thread, 200 calls each interleaved with the eager function
        in one process), the policy step on 256 observations took 1.03-1.09x as long compiled as eager and 4-9 s to
        compile, V(obs) 1.8x as long and 0.5-0.9 s; the update's functions gained (the loss's forward and backward
        0.77-0.84x, the gradient clipping 0.80x, Adam's step 0.25x). In whole ppo_continuous runs on the loaded
        machine the difference was within noise (docs/benchmarks.md, "Compiling on the CPU"). On CUDA they compile
        with the rest (CUDA graphs capture them compiled)."""
        compiled, eager_here = None, not on_cpu and self.device.type == "cpu"

        def run(*args, **kwargs):  # (its first call after an iteration ends starts the next one's clock)
            nonlocal compiled
            if self.iteration_start is None:
                self.iteration_start = time.perf_counter()
            if not self.on or eager_here:
                return fn(*args, **kwargs)
            try:
                if compiled is None:
                    _quiet_compile_warnings()
                    compiled = torch.compile(fn, options={"fallback_random": True})  # eager's random numbers
                return compiled(*args, **kwargs)
            except RuntimeError as e:  # (torch.compile refusing this Python, or dynamo's BackendCompilerFailed)
                if compiled is not None and not _failed_to_compile(e):
                    raise  # an error of the function itself, not of compiling it
                self.on, self.mode = False, None  # for every wrapped function, from now on
                self.say(f"warning: --compile: torch.compile does not work here ({_one_line(e)}); the run goes eager")
                return fn(*args, **kwargs)

        return run

    # ---- the decision and the measurements ----
    def after_iteration(self, iterations_left: int) -> None:
        """Time the iteration that just ended; under ``auto`` on the CPU decide after the second; record what this
        run measured once ``WINDOW`` iterations of one mode are timed. An iteration runs from its first call of a
        wrapped function (the rollout's first policy step) to this call: the evaluation and checkpoints between
        iterations (which call none) are not part of it. The first eager iteration (warm-up) is not timed; the
        first compiled one is (what it takes beyond the others is the compile's cost)."""
        now = time.perf_counter()
        start, self.iteration_start = self.iteration_start, None
        self.iterations += 1
        if start is not None and (self.mode == "compiled" or self.iterations > 1):
            self.times.append(now - start)
        if self.on is None and self.times:
            self.on = _run_on_rank_0(lambda: self._decide(self.times[-1], iterations_left))
            self.mode = "compiled" if self.on else "eager"
            if self.on:  # the eager iteration is kept with the compiled ones' measurements
                self.eager_s, self.times = self.times[-1], []
        if not self.recorded and self.mode is not None and len(self.times) >= WINDOW:
            self.recorded = True
            if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or (
                torch.distributed.get_rank() == 0
            ):
                self._record(self.times)

    def _decide(self, eager_s: float, iterations_left: int) -> bool:
        known = _read_times().get(self.key, {})
        ratio, cost = known.get("compiled_ratio"), known.get("compile_s")
        measured = (ratio is not None) + (cost is not None)
        source = ["our measurement; none on this machine yet", "partly measured here", "measured here"][measured]
        ratio = CPU_COMPILED_RATIO if ratio is None else ratio
        cost = CPU_COMPILE_S if cost is None else cost
        saving = iterations_left * eager_s * (1.0 - ratio)
        on = saving > cost
        self.say(
            f"compile: {'on' if on else 'off'} (auto: an eager iteration took {eager_s:.3f} s; compiled ones take "
            f"{ratio:.2f}x that and compiling {cost:.1f} s ({source}): {iterations_left} iterations left would save "
            f"{saving:.1f} s)"
        )
        return on

    def _record(self, times: list[float]) -> None:
        steady = statistics.median(times)
        if self.mode == "eager":
            run = {"eager_s": steady}
        else:  # (with the eager iteration an auto run timed: both from one run, on one machine load)
            run = {"compiled_s": steady, "compile_s": sum(max(0.0, t - steady) for t in times),
                   "eager_s_paired": self.eager_s}  # fmt: skip
        try:
            record = _read_times()
            runs = _runs(record.get(self.key, {}))
            runs[self.mode] = [*runs[self.mode], run][-HISTORY:]
            record[self.key] = {**_summary(runs), "runs": runs, "date": date.today().isoformat()}
            atomic_write(compile_times_path(), lambda f: f.write(json.dumps(record, indent=1).encode()))
        except OSError as e:  # a read-only home: the next run decides from our measurement again
            self.say(f"warning: --compile: could not record compile times in {compile_times_path()} ({e})")


def _runs(entry: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The runs a configuration's entry keeps, by mode (none in an entry written before entries kept them)."""
    runs = entry.get("runs") if isinstance(entry.get("runs"), dict) else {}
    return {mode: list(runs.get(mode, [])) for mode in ("eager", "compiled")}


def _summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """The medians a decision uses, those measured: ``eager_s``, ``compiled_s``, ``compile_s``, and
    ``compiled_ratio``, a compiled iteration over an eager one: per compiled run over the eager iteration it timed
    itself where it did (an auto run: both on one machine load), else over the eager runs' median."""
    median = lambda values: statistics.median(values) if values else None  # noqa: E731
    eager = median([r["eager_s"] for r in runs["eager"]])
    compiled = runs["compiled"]
    ratios = [r["compiled_s"] / (r["eager_s_paired"] or eager) for r in compiled if r["eager_s_paired"] or eager]
    summary = {"eager_s": eager, "compiled_s": median([r["compiled_s"] for r in compiled]),
               "compile_s": median([r["compile_s"] for r in compiled]), "compiled_ratio": median(ratios)}  # fmt: skip
    return {name: value for name, value in summary.items() if value is not None}


def _read_times() -> dict[str, dict[str, Any]]:
    try:
        record = json.loads(compile_times_path().read_text())
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}
