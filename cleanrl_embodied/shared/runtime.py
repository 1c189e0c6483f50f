"""What a running trainer needs besides its algorithm: seeding, the device, the Ctrl-C stop flag and the
watch for non-finite env data."""

from __future__ import annotations

import random
import signal
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from cleanrl_embodied.shared.cli import fail

__all__ = ["NonFiniteWatch", "StopFlag", "pick_device", "seed_everything"]


def pick_device(cuda: bool) -> torch.device:
    """CUDA when asked for and present, else the CPU."""
    return torch.device("cuda" if cuda and torch.cuda.is_available() else "cpu")


def seed_everything(seed: int, torch_deterministic: bool) -> None:
    """Seed Python, NumPy and torch (all devices) with ``seed``; cuDNN deterministic if asked."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic


class StopFlag:
    """Ctrl-C (and the given signals) set ``requested``; the loop checks it once per iteration and ends
    cleanly. A second Ctrl-C raises KeyboardInterrupt at once unless ``absorb_repeats`` (DDP, where
    torchrun forwards the signal again). Use as a context manager: the previous handlers come back.
    """

    def __init__(self, say: Callable[[str], None], signals: tuple[int, ...] = (signal.SIGINT,),
                 absorb_repeats: bool = False):
        self.say, self.signals, self.absorb_repeats = say, signals, absorb_repeats
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.requested and not self.absorb_repeats:
            raise KeyboardInterrupt
        if not self.requested:
            self.say("stop requested: finishing this iteration, then writing last.pt and summary.json")
        self.requested = True

    def __enter__(self) -> StopFlag:
        self._previous = {s: signal.signal(s, self._handle) for s in self.signals}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


class NonFiniteWatch:
    """Remembers, on the device and without host syncs, the first rollout step at which each env produced a
    non-finite observation (the next obs or, where an episode ended, its final obs) or reward. After the
    rollout, ``check`` stops the run with one line naming the tensor, the envs and the global step."""

    def __init__(self, num_envs: int, device: torch.device | str):
        self.first = torch.full((2, num_envs), -1, dtype=torch.long, device=device)  # observation, reward

    def update(self, step: int, obs: torch.Tensor, final_obs: torch.Tensor, reward: torch.Tensor) -> None:
        obs_ok = torch.isfinite(obs).flatten(1).all(-1) & torch.isfinite(final_obs).flatten(1).all(-1)
        bad = torch.stack([~obs_ok, ~torch.isfinite(reward)])
        self.first = torch.where((self.first < 0) & bad, step, self.first)

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
