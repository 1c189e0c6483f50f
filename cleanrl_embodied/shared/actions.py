"""Action distributions the built-in agents (and your policies) can use, and the helpers around them.

A policy's ``dist(obs)`` is a distribution over its *raw* action, of shape ``[B, *action_shape]``, where
``action_shape`` is the env's ``single_action_space.shape``: ``(D,)``, or ``(K, D)`` for chunks of K actions
(``--action-chunk K``). Trainers store the raw action and ``log_prob(action)`` summed over every non-batch
dimension; the env gets ``policy.env_action(action)``. Two heads:

- Gaussian: ``torch.distributions.Normal`` over the action itself (``env_action`` is the identity; the env clips).
- Bins (OpenVLA's action tokens): :class:`Bins`, an independent categorical over N bins per action entry; the raw
  action is the bin index (stored as float32, exact), decoded to the bin's centre within the action bounds by
  :func:`decode_bins`.

Deterministic evaluation acts with ``dist.mode`` (the Gaussian's mean, the most likely bin): never ``.mean`` of a
categorical, which would be a value between bins.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

__all__ = ["Bins", "bin_bounds", "decode_bins", "sample"]


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


def sample(dist: torch.distributions.Distribution, generator: torch.Generator | None = None) -> torch.Tensor:
    """``dist.sample()``, or the same kind of draw from ``generator`` (the evaluator's and ppo_async's collector's own
    streams): Bins by Gumbel-max, a Normal-like distribution as ``mean + stddev * noise``."""
    if generator is None:
        return dist.sample()
    if isinstance(dist, Bins):
        return dist.sample(generator=generator)
    mean = dist.mean
    return mean + dist.stddev * torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
