"""What a running trainer needs besides its algorithm: the random streams, the device, the stop flag (Ctrl-C,
SIGTERM) and the watch for non-finite env data."""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import signal
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from cleanrl_embodied.shared.cli import fail
from cleanrl_embodied.shared.tensordict_helpers import finite_rows

__all__ = [
    "STREAMS",
    "NonFiniteWatch",
    "StopFlag",
    "autocast",
    "compile_choice",
    "compiler",
    "pick_device",
    "seed_everything",
    "stream_seed",
]

STREAMS = {
    "torch": "torch's global generator: network init, action sampling in rollouts, minibatch shuffles (per rank)",
    "python": "Python's `random` module (per rank; the trainers draw nothing from it)",
    "numpy": "NumPy's global generator (per rank; the trainers draw nothing from it)",
    "train_envs": "the training envs (per rank; Gymnasium sub-env i gets this seed + i)",
    "eval_envs": "the eval envs' construction (every evaluation then resets them with an eval_resets seed)",
    "eval_resets": "the reset of the evaluation at a global step (fresh, reproducible starts)",
    "eval_actions": "sampled eval actions (--no-eval-deterministic), one stream per evaluation",
    "collector": "ppo_async's collector thread: its action sampling",
    "group_resets": "grpo's group starts of an iteration",
    "group_redraws": "grpo_vla's further group starts of an iteration (dynamic sampling: --min-informative-groups)",
}
"""The run's independent random streams and what each drives (docs/runs.md). Each is seeded by
:func:`stream_seed`, never by ``--seed`` itself."""


def stream_seed(seed: int, stream: str, index: int = 0) -> int:
    """The seed of one random stream of the run with ``--seed`` ``seed``: NumPy's ``SeedSequence(seed)`` spawned
    with the key (the stream's number in :data:`STREAMS`, ``index``), ``index`` being the rank, a global step or
    an iteration. Distinct streams, indices and run seeds give unrelated seeds (a hash, not ``seed + k``, so seed 2
    never replays a stream of seed 1); 30 bits, so that envs can add their sub-env index."""
    key = (list(STREAMS).index(stream), index)
    return int(np.random.SeedSequence(seed, spawn_key=key).generate_state(1)[0] >> 2)


def pick_device(cuda: bool) -> torch.device:
    """CUDA when asked for and present, else the CPU."""
    return torch.device("cuda" if cuda and torch.cuda.is_available() else "cpu")


@functools.cache
def _compile_works(device_type: str) -> str | None:
    """None if torch.compile builds and runs code for this device type here, else why not (one line)."""
    try:
        torch.compile(lambda x: torch.tanh(x) * 2 + 1)(torch.ones(4, device=device_type))
        return None
    except Exception as e:  # noqa: BLE001 - a missing compiler, Triton, an unsupported Python: all mean "eager"
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


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


@functools.cache
def _quiet_compile_warnings() -> None:
    for name, start in QUIET_COMPILE_WARNINGS.items():
        logging.getLogger(name).addFilter(_DropMessages(start))


def compile_choice(setting: str, device_type: str, updates: int, pays_after: int, cudagraphs: bool = False) -> bool:
    """Whether a run compiles its update and policy step: ``--compile`` (``setting``) ``on`` always, ``off`` never,
    and ``auto`` where it was measured to be faster on this kind of device (``device_type``), for a run that plans
    at least ``pays_after`` minibatch updates (``updates``; compiling costs about 10 s once per process):

    - ``cpu``: compiles. The compiled update was 1.1-1.4x faster in steady state on a 2-core CPU
      (docs/benchmarks.md, "Speed, CPU" and "The update, compiled").
    - ``cuda``: compiles only with CUDA graphs (``cudagraphs``: the trainer's ``--cudagraphs``), else eager. On an
      H200, ppo_continuous at 4096 envs ran 221,697 env steps/s eager, 187,905 compiled without CUDA graphs (the
      step is launch-bound there, and compiling alone does not remove the launches) and 277,303 compiled with them
      (docs/results/gpu-h200-2026-11-26). benchmarks/gpu_check.py's ppo part measures these again on every lent GPU
      and checks that this choice is the faster one.
    - any other device: eager (nothing measured)."""
    if setting != "auto":
        return setting == "on"
    if updates < pays_after:
        return False
    return device_type == "cpu" or (device_type == "cuda" and cudagraphs)


def compiler(enabled: bool, device: torch.device, say: Callable[[str], None]) -> Callable:
    """A function that wraps the update's pure functions: ``torch.compile`` when ``enabled`` (the trainer decides
    with :func:`compile_choice`), else, or where compiling does not work on this machine (``say`` tells
    why, once), the identity: the same functions run eager."""
    if not enabled:
        return lambda fn: fn
    _quiet_compile_warnings()
    reason = _compile_works(device.type)
    if reason is not None:
        say(f"warning: --compile: torch.compile does not work here ({reason}); the update runs eager")
        return lambda fn: fn
    return torch.compile


def autocast(setting: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """What ``--autocast`` asks for, as a context factory for the update's forward passes: bf16 autocast on
    ``device`` (weights and optimizer stay fp32), or a no-op, cheaper to enter than a disabled ``torch.autocast``."""
    return (
        functools.partial(torch.autocast, device.type, torch.bfloat16) if setting == "bf16" else contextlib.nullcontext
    )


def seed_everything(seed: int, torch_deterministic: bool, rank: int = 0) -> None:
    """Seed Python, NumPy and torch (all devices) of this process (``rank``) from the run's ``seed``, each from
    its own :func:`stream_seed`; cuDNN deterministic if asked."""
    random.seed(stream_seed(seed, "python", rank))
    np.random.seed(stream_seed(seed, "numpy", rank))
    torch.manual_seed(stream_seed(seed, "torch", rank))
    torch.backends.cudnn.deterministic = torch_deterministic


class StopFlag:
    """Ctrl-C (SIGINT) and SIGTERM (what a cluster scheduler, ``kill`` or ``docker stop`` send) set ``requested``;
    the loop checks it once per iteration and ends cleanly: the iteration finishes, ``last.pt`` and
    ``summary.json`` are written, and the process exits with ``exit_status``, 128 + the signal's number as a shell
    reports a process that signal ended (130 for Ctrl-C, 143 for SIGTERM), so a script or scheduler can tell a
    stop from a finished run (0) and from an error (1). A second signal raises KeyboardInterrupt at once (the hard
    stop) unless ``absorb_repeats`` (DDP, where torchrun forwards the signal again; its grace period is the hard
    stop). Use as a context manager: the previous handlers come back.
    """

    def __init__(self, say: Callable[[str], None], absorb_repeats: bool = False):
        self.say, self.absorb_repeats = say, absorb_repeats
        self.signum: int | None = None  # the first signal received
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_status(self) -> int:
        """The exit status of a run this flag stopped: 128 + the signal's number (130 Ctrl-C, 143 SIGTERM)."""
        return 128 + (self.signum or signal.SIGINT)

    def _handle(self, signum, frame) -> None:
        if self.requested and not self.absorb_repeats:
            raise KeyboardInterrupt
        if not self.requested:
            name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            self.say(f"stop requested ({name}): finishing this iteration, then writing last.pt and summary.json")
            self.signum = signum

    def votes(self) -> list[float]:
        """DDP: whether this process received SIGINT, SIGTERM; sum them over the ranks and pass them to ``agree``."""
        return [float(self.signum == signal.SIGINT), float(self.signum == signal.SIGTERM)]

    def agree(self, summed_votes) -> int:
        """DDP: the world's decision from ``votes`` summed over the ranks, the same on every rank: 0 to go on, or
        the exit status to stop with, SIGTERM's (143) if any rank received one (the scheduler's stop), else
        Ctrl-C's (130)."""
        sigint, sigterm = torch.as_tensor(summed_votes).tolist()  # one host sync
        return 128 + signal.SIGTERM if sigterm > 0 else 128 + signal.SIGINT if sigint > 0 else 0

    def __enter__(self) -> StopFlag:
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


class SkipGuard:
    """Keeps non-finite optimizer steps out of the weights: ``ok`` says whether a step may be taken (one host sync),
    counts the ones it refuses (``skipped``) and stops the run with one line once ``max_consecutive`` come in a
    row (a run that keeps producing them has diverged). ``show``: whether this process prints that line."""

    def __init__(self, max_consecutive: int, show: bool = True):
        self.max_consecutive, self.show = max_consecutive, show
        self.skipped = self.consecutive = 0

    def ok(self, loss: torch.Tensor, grad_norm: torch.Tensor, global_step: int) -> bool:
        if bool(torch.isfinite(grad_norm) & torch.isfinite(loss)):
            self.consecutive = 0
            return True
        self.skipped, self.consecutive = self.skipped + 1, self.consecutive + 1
        if self.consecutive >= self.max_consecutive:
            fail(
                f"{self.consecutive} optimizer steps in a row had a non-finite loss or gradient (last at global "
                f"step {global_step}); lower --learning-rate or check the env",
                self.show,
            )
        return False


class NonFiniteWatch:
    """Remembers, on the device and without host syncs, the first rollout step at which each env produced a
    non-finite observation (a next obs or, where an episode ended, its final obs) or reward. Only float entries
    count (uint8 images are always finite). ``update_final`` runs at the steps where an episode ended,
    ``update_rollout`` once after the rollout over everything stored; then ``check`` stops the run with one
    line naming the tensor, the envs and the global step."""

    def __init__(self, num_envs: int, device: torch.device | str):
        self.first = torch.full((2, num_envs), -1, dtype=torch.long, device=device)  # observation, reward

    def _note(self, kind: int, step: torch.Tensor | int, bad: torch.Tensor) -> None:
        """Record ``step`` [N] (or one int) for the envs where ``bad`` [N], unless an earlier step is recorded."""
        first = self.first[kind]
        self.first[kind] = torch.where(bad & ((first < 0) | (first > step)), step, first)

    def update_final(self, step: int, final_obs: torch.Tensor | TensorDict, done: torch.Tensor) -> None:
        """The final observations of the envs whose episode ended (``done``) at rollout step ``step``."""
        self._note(0, step, done & ~finite_rows(final_obs))

    def update_rollout(
        self, obs: torch.Tensor | TensorDict, last_obs: torch.Tensor | TensorDict, rewards: torch.Tensor
    ) -> None:
        """After a rollout of T steps: ``obs`` [T, N, ...] as stored (``obs[t]`` is what action t saw, so
        ``obs[0]`` came before the rollout: step -1), ``last_obs`` the obs after the last step, ``rewards`` [T, N]."""
        steps = torch.arange(-1, rewards.shape[0], device=rewards.device)
        bad_obs = ~torch.cat([finite_rows(obs, batch_dims=2), finite_rows(last_obs)[None]])  # [T + 1, N]
        for kind, bad, at in ((0, bad_obs, steps), (1, ~torch.isfinite(rewards), steps[1:])):
            first_bad = torch.where(bad, at[:, None], rewards.shape[0]).min(0).values
            self._note(kind, first_bad, first_bad < rewards.shape[0])

    def seen(self) -> torch.Tensor:
        """[2] float: 1 where some env produced a non-finite observation / reward (for an all-reduce)."""
        return (self.first >= 0).any(-1).float()

    def check(self, global_step: int, steps_per_env_step: int, where: str = "") -> None:
        """``global_step`` counts the env steps before this rollout; ``steps_per_env_step`` is how many env
        steps one rollout step adds (num_envs, times the world size in DDP)."""
        for name, first in zip(("observation", "reward"), self.first):
            if bool((first >= 0).any()):
                envs = torch.nonzero(first >= 0).flatten()
                step = global_step + (int(first[envs].min()) + 1) * steps_per_env_step
                fail(f"non-finite {name} from {where}env(s) {envs[:8].tolist()} at global step {step}")


torch.serialization.add_safe_globals([NonFiniteWatch])  # ppo_async checkpoints hold pending rollouts' watches
