"""What numpy backends (Gymnasium sub-envs, EnvPool, ManiSkill's CPU simulation) share on the way to the torch
contract: their spaces in float32 and channels-first, their observations' leaves, and their infos filtered,
merged over SAME_STEP autoresets and turned into [N] tensors (``info_key_filter``, ``last_step_entries``,
``numeric_info_to_torch``), and the task names of multi-task sub-envs."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import iterate

from cleanrl_embodied.shared.language import text_to_instruction_space
from cleanrl_embodied.shared.observations import (
    is_image,
)

__all__ = [
    "INFO_KEYS",
    "TASK_ATTRIBUTES",
    "channels_first",
    "float32_space",
    "info_key_filter",
    "last_step_entries",
    "numeric_info_to_torch",
    "numpy_leaves",
    "sub_env_tasks",
]


def float32_space(space: gym.Space, top: bool = True) -> gym.Space:
    """The same Box / nested Dict of Boxes with float32 dtype (the contract's observation dtype); images (uint8
    [C, H, W] leaves of a Dict) stay uint8, channels-last ones ([H, W, C], Gymnasium's pixel layout) become
    channels-first; a ``Text`` entry of a Dict becomes instruction tokens (``shared.language``: byte ids and
    attention mask)."""
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict(
            [
                (key, channels_first(sub) if is_image(sub) else float32_space(sub, top=False))
                for key, sub in space.spaces.items()
            ]
        )  # keep order
    if isinstance(space, gym.spaces.Text) and not top:
        return text_to_instruction_space(space)
    if isinstance(space, gym.spaces.Box):
        with np.errstate(over="ignore"):
            low, high = space.low.astype(np.float32), space.high.astype(np.float32)
        return gym.spaces.Box(low, high, dtype=np.float32)
    raise ValueError(
        f"observation space {space} is not supported: expected a Box or a nested Dict of Boxes (and Text entries)"
    )


def channels_first(space: gym.spaces.Box) -> gym.spaces.Box:
    """An image space as the contract has it, [C, H, W]: a channels-last one ([H, W, C] with C of 1, 3 or 4 and H
    not: Gymnasium's pixel layout) transposed, any other as it is."""
    height, width, channels = space.shape
    if channels not in (1, 3, 4) or height in (1, 3, 4):
        return space
    return gym.spaces.Box(space.low.transpose(2, 0, 1), space.high.transpose(2, 0, 1), dtype=space.dtype)


@iterate.register(gym.spaces.Text)
def _iterate_text(space: gym.spaces.Text, items):
    """Gymnasium batches Text observations as a tuple of strings but registers no way to iterate over them."""
    return iter(items)


def numpy_leaves(obs) -> list[np.ndarray]:
    """All arrays of a (nested) dict observation, or the observation itself, as a list."""
    if isinstance(obs, dict):
        return [leaf for key in sorted(obs) for leaf in numpy_leaves(obs[key])]
    return [np.asarray(obs)]


INFO_KEYS = ("rewards", "metrics")
"""The sub-envs' own info entries that :class:`GymnasiumToTorch` passes on by default: the contract's optional
``info["rewards"]`` and ``info["metrics"]`` (dicts of numbers)."""


def info_key_filter(info_keys: Sequence[str] | str) -> tuple[bool, frozenset[str]]:
    """``(pass every entry, the entries passed on)`` for a ``make_env`` ``info_keys`` argument: a list of names
    (besides :data:`INFO_KEYS`) or ``"all"``; anything else is a one-line ValueError."""
    names = isinstance(info_keys, (list, tuple, set, frozenset)) and all(isinstance(k, str) for k in info_keys)
    if info_keys != "all" and not names:
        raise ValueError(f"info_keys must be a list of info entry names or 'all', got {info_keys!r}")
    return info_keys == "all", frozenset(INFO_KEYS) | (frozenset() if info_keys == "all" else frozenset(info_keys))


def _merge_rows(top, top_mask, final, final_mask, done: np.ndarray) -> tuple:
    """One batched info entry (an array or a dict of them, with its ``_<key>`` mask) built from ``top`` for the rows
    that did not finish and from ``final`` for those that did (either may be None: not reported)."""
    top_rows = top_mask & ~done if top_mask is not None else np.zeros_like(done)
    final_rows = final_mask & done if final_mask is not None else np.zeros_like(done)
    if isinstance(top if top is not None else final, dict):
        top, final, merged = top or {}, final or {}, {}
        for key in dict.fromkeys([*top, *final]):
            if key[:1] == "_" and (key[1:] in top or key[1:] in final):
                continue  # a mask: built with its entry
            mask_key = f"_{key}"
            merged[key], merged[mask_key] = _merge_rows(
                top.get(key), top.get(mask_key), final.get(key), final.get(mask_key), done
            )
        return merged, top_rows | final_rows
    value = np.zeros_like(final if final is not None else top)
    for source, rows in ((top, top_rows), (final, final_rows)):
        if source is not None:
            value[rows] = source[rows]
    return value, top_rows | final_rows


def last_step_entries(info: dict, final_info: dict, done: np.ndarray) -> dict:
    """``info`` (batched as Gymnasium batches it, with ``_<key>`` masks) with the contract's per-step entries
    (:data:`INFO_KEYS`: ``rewards``, ``metrics``) of the envs that finished at this step taken from their last step
    (``final_info``), not from the reset that followed it: Gymnasium's SAME_STEP top level is the reset's info,
    which would report the new episode's numbers (or none) as the ended one's last terms and metrics."""
    for key in INFO_KEYS:
        if key in info or key in final_info:
            mask_key = f"_{key}"
            info[key], info[mask_key] = _merge_rows(
                info.get(key), info.get(mask_key), final_info.get(key), final_info.get(mask_key), done
            )
    return info


def numeric_info_to_torch(info: dict, tensor, passes=None, nested: bool = False) -> dict:
    """An info dict of numpy arrays -> tensors made by ``tensor`` (float64 arrays become float32 first); nested
    dicts are converted whole, except the ``_<key>`` masks Gymnasium adds next to each entry (inside ``rewards``
    they would read as reward terms), other values (object arrays, strings) dropped. ``passes(key)``: which
    top-level entries to keep (None: all)."""
    out = {}
    for key, value in info.items():
        if passes is not None and not passes(key):
            continue
        if nested and key[:1] == "_" and key[1:] in info:
            continue
        if isinstance(value, dict):
            out[key] = numeric_info_to_torch(value, tensor, nested=True)
        elif isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            out[key] = tensor(value.astype(np.float32) if value.dtype == np.float64 else value)
    return out


TASK_ATTRIBUTES = ("task_name", "task")
"""Sub-env attributes that name the task a sub-env runs: Meta-World's ``task_name`` (its MT ids' sub-envs), the
``task`` of LeRobot's LIBERO envs."""


def sub_env_tasks(env: VectorEnv) -> tuple[str, ...] | None:
    """The name of the task each sub-env of a Gymnasium ``SyncVectorEnv`` / ``AsyncVectorEnv`` runs, where its
    sub-envs tell them apart: the first of :data:`TASK_ATTRIBUTES` that every sub-env has as a string, else (sub-envs
    of a ``SyncVectorEnv``) their spec ids; each only where it gives more than one name. None otherwise (one task,
    or a vector env that cannot be asked about its sub-envs). Asked once, when the env is built."""
    sub_envs = getattr(env, "envs", None)
    if sub_envs is None and not callable(getattr(env, "call", None)):
        return None
    for attribute in TASK_ATTRIBUTES:
        if sub_envs is not None:  # read, not called
            names = [e.get_wrapper_attr(attribute) if e.has_wrapper_attr(attribute) else None for e in sub_envs]
        else:  # AsyncVectorEnv, asked in its workers (first whether it is there: a missing one would stop them)
            names = env.get_attr(attribute) if all(env.call("has_wrapper_attr", attribute)) else []
        if names and all(isinstance(name, str) for name in names) and len(set(names)) > 1:
            return tuple(names)
    names = [getattr(e.spec, "id", None) for e in sub_envs or ()]  # (an async worker's spec may not pickle)
    return tuple(names) if names and all(isinstance(n, str) for n in names) and len(set(names)) > 1 else None
