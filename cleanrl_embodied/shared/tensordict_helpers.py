"""TensorDict helpers: flattening dict observations and preallocated rollout storage.

Everything here is a pure function over tensors/TensorDicts, so a trainer can wrap its
own code with torch.compile or CUDA graphs without these helpers getting in the way.
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict


def sorted_leaf_keys(td: TensorDict) -> list[tuple[str, ...]]:
    """All leaf keys of a (nested) TensorDict as tuples, in sorted order of their full path."""
    keys = [k if isinstance(k, tuple) else (k,) for k in td.keys(include_nested=True, leaves_only=True)]
    return sorted(keys)


def flatten_obs(obs: TensorDict | Mapping | torch.Tensor, batch_dims: int = 1) -> torch.Tensor:
    """Concatenate the leaves of a (nested) dict observation into one float32 tensor.

    Leaves are taken in sorted order of their full key path (("object", "pos") < ("robot", "qpos")),
    and every leaf is flattened past the first ``batch_dims`` dimensions. A plain tensor passes
    through (cast to float32), so callers need not care which kind they hold.
    """
    if isinstance(obs, torch.Tensor):
        return obs.float()
    if not isinstance(obs, TensorDict):
        obs = TensorDict(dict(obs), batch_size=[])
    leaves = []
    for key in sorted_leaf_keys(obs):
        leaf = obs.get(key)
        leaves.append(leaf.reshape(*leaf.shape[:batch_dims], -1).float())
    return torch.cat(leaves, dim=-1)


def flat_dim(space: gym.Space) -> int:
    """Size of one observation of ``space`` after :func:`flatten_obs` (Box or nested Dict of Boxes)."""
    if isinstance(space, gym.spaces.Dict):
        return sum(flat_dim(s) for s in space.spaces.values())
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    raise TypeError(f"flat_dim: unsupported observation space {space}; expected Box or Dict of Boxes")


def rollout_storage(
    num_steps: int, num_envs: int, device: torch.device | str, **fields: tuple[tuple[int, ...], torch.dtype]
) -> TensorDict:
    """Preallocate a [num_steps, num_envs] TensorDict with one zero tensor per field.

    Example: ``rollout_storage(T, N, dev, obs=((obs_dim,), torch.float32), done=((), torch.bool))``.
    """
    return TensorDict(
        {name: torch.zeros((num_steps, num_envs, *shape), dtype=dtype, device=device)
         for name, (shape, dtype) in fields.items()},
        batch_size=[num_steps, num_envs],
        device=device,
    )

