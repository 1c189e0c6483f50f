"""Preallocated rollout storage and minibatch pieces: ``rollout_storage`` ([T, N] TensorDicts shaped by the spaces,
images kept uint8), ``zeros_like_space`` and ``micro_batches`` (a minibatch in pieces of ``--micro-batch-size``)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["micro_batches", "rollout_storage", "zeros_like_space"]


def zeros_like_space(space: gym.Space, batch_shape: tuple[int, ...], device) -> torch.Tensor | TensorDict:
    """Zeros shaped like ``batch_shape`` observations of ``space``, in its dtypes (uint8 images stay uint8): a
    tensor for a Box, a TensorDict of the same nesting for a Dict."""
    if isinstance(space, gym.spaces.Dict):
        return TensorDict(
            {key: zeros_like_space(sub, batch_shape, device) for key, sub in space.spaces.items()},
            batch_size=batch_shape,
            device=device,
        )
    dtype = torch.from_numpy(np.zeros((), space.dtype)).dtype
    return torch.zeros((*batch_shape, *space.shape), dtype=dtype, device=device)


def micro_batches(mb: TensorDict, size: int) -> tuple[TensorDict, ...]:
    """``mb`` in pieces of at most ``size`` samples (``--micro-batch-size``: gradients accumulated over the pieces);
    ``(mb,)`` itself when it fits in one, which spares the split's per-call cost on every minibatch."""
    return (mb,) if size >= mb.shape[0] else mb.split(size)


def rollout_storage(
    num_steps: int,
    num_envs: int,
    device: torch.device | str,
    **fields: tuple[tuple[int, ...], torch.dtype] | gym.Space,
) -> TensorDict:
    """Preallocate a [num_steps, num_envs] TensorDict with zeros per field: ``(shape, dtype)``, or a Gymnasium
    space (a Box, or a Dict that becomes a nested TensorDict with each leaf in its own dtype).

    Example: ``rollout_storage(T, N, dev, obs=envs.single_observation_space, done=((), torch.bool))``.
    """
    batch = (num_steps, num_envs)
    return TensorDict(
        {
            name: zeros_like_space(spec, batch, device)
            if isinstance(spec, gym.Space)
            else torch.zeros((*batch, *spec[0]), dtype=spec[1], device=device)
            for name, spec in fields.items()
        },
        batch_size=batch,
        device=device,
    )
