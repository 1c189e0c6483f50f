"""Token bins as an action distribution: independent categoricals over N bins per action entry, the bounds they
cover and the decoding of a bin index to an action. Pure torch, so the VLA trainers' bins head works with any
``--policy`` (tests/toy_policies.py's ToyVLA, examples/hf_vla) and needs no extra installed."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

__all__ = ["Bins", "bin_bounds", "decode_bins"]


class Bins(torch.distributions.Distribution):
    """Independent categoricals over the last dimension of ``logits`` ``[..., N]``: one per action entry.

    ``sample()`` and ``mode`` give bin indices ``[...]`` as float32 (what the trainers store); ``log_prob`` and
    ``entropy`` are per entry (the trainers sum them over the action). The log-probabilities are computed in
    float32 whatever the logits' dtype (bf16 under autocast)."""

    arg_constraints: dict = {}
    has_enumerate_support = False

    def __init__(self, logits: torch.Tensor):
        self.logits = torch.log_softmax(logits.float(), -1)
        super().__init__(batch_shape=self.logits.shape[:-1], validate_args=False)

    @property
    def num_bins(self) -> int:
        return self.logits.shape[-1]

    def sample(self, sample_shape: tuple[int, ...] = (), generator: torch.Generator | None = None):
        """Bin indices drawn with the Gumbel-max trick (from ``generator`` if given, else torch's global stream)."""
        shape = torch.Size(sample_shape) + self.logits.shape
        uniform = torch.rand(shape, generator=generator, device=self.logits.device, dtype=self.logits.dtype)
        gumbel = -torch.log(-torch.log(uniform.clamp(1e-20, 1.0 - 1e-7)))
        return (self.logits + gumbel).argmax(-1).float()

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return self.logits.gather(-1, value.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        return -(self.logits.exp() * self.logits).sum(-1)

    @property
    def mode(self) -> torch.Tensor:
        return self.logits.argmax(-1).float()


def bin_bounds(space: gym.spaces.Box, num_bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The bounds ``(low, high)`` [*space.shape] that :func:`decode_bins` spreads ``num_bins`` bins over; a
    one-line ValueError when the action space is unbounded (bins need a finite range)."""
    if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise ValueError(
            f"--action-head bins needs a bounded action space, this env's is {space} (use --action-head gaussian)"
        )
    if num_bins < 2:
        raise ValueError(f"--action-bins must be >= 2, got {num_bins}")
    return torch.as_tensor(space.low, dtype=torch.float32), torch.as_tensor(space.high, dtype=torch.float32)


def decode_bins(index: torch.Tensor, low: torch.Tensor, high: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Bin indices [..., *shape] -> the bins' centres: ``low + (index + 1/2) (high - low) / num_bins``, strictly
    inside [low, high] (the N bins split the range into N equal cells)."""
    return low + (index + 0.5) * ((high - low) / num_bins)
