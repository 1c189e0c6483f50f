"""Observations as the trainers see them: which entries of an observation space are images, instruction tokens,
float state or privileged state (``image_spaces``, ``token_spaces``, ``float_dim``, ``privileged_dim``), the float
part as one tensor (``float_entries``: what a normalizer sees), dict observations flattened (``flatten_obs``,
``flat_dim``), the rows that are finite, and observations in and out of a checkpoint.

Everything here is a pure function over tensors/TensorDicts, so a trainer can wrap its own code with torch.compile
or CUDA graphs without these helpers getting in the way.
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

__all__ = [
    "PRIVILEGED_KEY",
    "finite_rows",
    "flat_dim",
    "flatten_obs",
    "float_entries",
    "image_spaces",
    "is_image",
    "obs_for_checkpoint",
    "obs_from_checkpoint",
    "privileged_dim",
    "privileged_entries",
    "sorted_leaf_keys",
    "float_dim",
    "token_spaces",
]

PRIVILEGED_KEY = "privileged"
"""The top-level observation entry that holds privileged state: what a simulator knows and a robot would not (the
cube's pose, the goal). Only a critic reads it (``--privileged-critic``); float_entries, float_dim and the image
and instruction finders leave it out, so an actor never sees it (docs/env-contract.md)."""


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


def is_image(x: torch.Tensor | gym.spaces.Box, batch_dims: int = 0) -> bool:
    """Whether an observation leaf (a tensor with ``batch_dims`` leading batch dimensions, or a Box) is an image:
    uint8 with three dimensions [C, H, W] past the batch dimensions."""
    if not isinstance(x, (torch.Tensor, gym.spaces.Box)):
        return False
    dtype = x.dtype if isinstance(x, torch.Tensor) else torch.from_numpy(np.zeros((), x.dtype)).dtype
    return dtype == torch.uint8 and len(x.shape) - batch_dims == 3


def image_spaces(space: gym.Space, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], gym.spaces.Box]:
    """{key path: Box} of the image leaves of a (nested) Dict observation space, in sorted key order; {} for a Box."""
    if not isinstance(space, gym.spaces.Dict):
        return {prefix: space} if prefix and is_image(space) else {}
    subs = {name: sub for name, sub in space.spaces.items() if prefix or name != PRIVILEGED_KEY}
    leaves = {key: box for name, sub in subs.items() for key, box in image_spaces(sub, (*prefix, name)).items()}
    return dict(sorted(leaves.items()))


def token_spaces(space: gym.Space, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], gym.spaces.Dict]:
    """{key path: space} of the instruction entries (``shared.language.instruction_space``: token ids and their
    attention mask) of a (nested) Dict observation space, in sorted key order; {} for a Box."""
    from cleanrl_embodied.shared.language import is_instruction_space  # (language imports nothing from here)

    if not isinstance(space, gym.spaces.Dict):
        return {}
    if is_instruction_space(space):
        return {prefix: space}
    subs = {name: sub for name, sub in space.spaces.items() if prefix or name != PRIVILEGED_KEY}
    found = {key: sub for name, sub in subs.items() for key, sub in token_spaces(sub, (*prefix, name)).items()}
    return dict(sorted(found.items()))


def _float_boxes(space: gym.Space, top: bool = True) -> list[gym.spaces.Box]:
    if isinstance(space, gym.spaces.Dict):
        subs = [sub for name, sub in space.spaces.items() if not (top and name == PRIVILEGED_KEY)]
        return [box for sub in subs for box in _float_boxes(sub, top=False)]
    return [space] if np.issubdtype(space.dtype, np.floating) else []


def float_dim(space: gym.Space) -> int:
    """Size of :func:`float_entries` for observations of ``space``: all its float entries (not the images, not the
    instruction tokens, not the privileged entry)."""
    return sum(int(np.prod(box.shape)) for box in _float_boxes(space))


def privileged_dim(space: gym.Space) -> int:
    """Size of :func:`privileged_entries` for observations of ``space`` (0: it has no privileged entry)."""
    if not isinstance(space, gym.spaces.Dict) or PRIVILEGED_KEY not in space.spaces:
        return 0
    return sum(int(np.prod(box.shape)) for box in _float_boxes(space.spaces[PRIVILEGED_KEY], top=False))


def privileged_entries(obs: TensorDict, batch_dims: int = 1) -> torch.Tensor:
    """The privileged entry's floats as one float32 vector per row (sorted key order, as :func:`float_entries`)."""
    entry = obs.get(PRIVILEGED_KEY)
    if isinstance(entry, torch.Tensor):
        return entry.reshape(*entry.shape[:batch_dims], -1).float()
    return float_entries(entry, batch_dims)


def float_entries(obs: TensorDict | torch.Tensor, batch_dims: int = 1) -> torch.Tensor:
    """The float part of an observation as one float32 vector per row: a plain tensor as it is, a TensorDict's
    float leaves concatenated in sorted key order (:func:`flatten_obs`'s order), ``[..., 0]`` if it has none.
    This is what observation normalization and an actor see: images and instruction tokens are never normalized,
    and the privileged entry (:data:`PRIVILEGED_KEY`, a critic's alone) is left out."""
    if isinstance(obs, torch.Tensor):
        return obs
    leaves = [obs.get(key) for key in sorted_leaf_keys(obs) if key[0] != PRIVILEGED_KEY]
    leaves = [leaf.reshape(*leaf.shape[:batch_dims], -1).float() for leaf in leaves if leaf.is_floating_point()]
    return torch.cat(leaves, dim=-1) if leaves else torch.zeros(*obs.shape[:batch_dims], 0, device=obs.device)


def finite_rows(obs: TensorDict | torch.Tensor, batch_dims: int = 1) -> torch.Tensor:
    """bool, shaped like the first ``batch_dims`` dimensions: rows whose every float entry is finite (integer
    leaves such as uint8 images always are)."""
    leaves = [obs] if isinstance(obs, torch.Tensor) else [obs.get(key) for key in sorted_leaf_keys(obs)]
    ok = torch.ones(obs.shape[:batch_dims], dtype=torch.bool, device=obs.device)
    for leaf in leaves:
        if leaf.is_floating_point():
            ok = ok & torch.isfinite(leaf.reshape(*leaf.shape[:batch_dims], -1)).all(-1)
    return ok


def obs_for_checkpoint(obs: TensorDict | torch.Tensor) -> dict | torch.Tensor:
    """An observation as what ``torch.load(weights_only=True)`` reads back: a TensorDict becomes nested dicts."""
    return obs.to_dict() if isinstance(obs, TensorDict) else obs


def obs_from_checkpoint(value: dict | torch.Tensor, device: torch.device | str) -> TensorDict | torch.Tensor:
    """Undo :func:`obs_for_checkpoint` (batch size: the first dimension), on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return TensorDict(value, device=device).auto_batch_size_(batch_dims=1)


def flat_dim(space: gym.Space) -> int:
    """Size of one observation of ``space`` after :func:`flatten_obs` (Box or nested Dict of Boxes)."""
    if isinstance(space, gym.spaces.Dict):
        return sum(flat_dim(s) for s in space.spaces.values())
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    raise TypeError(f"flat_dim: unsupported observation space {space}; expected Box or Dict of Boxes")
