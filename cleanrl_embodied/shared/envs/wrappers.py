"""Torch vector-env wrappers that turn any env into the project's env contract, and the Gymnasium backend.

- :func:`make_gymnasium_env`: ``make_env``'s backend for registered numpy Gymnasium ids (``gym.make_vec``
  sub-envs, sync or async, then :func:`numpy_vector_to_torch`).
- :func:`numpy_vector_to_torch`: a numpy Gymnasium vector env -> the full contract (:class:`GymnasiumToTorch`
  with actions rescaled and clipped and episode statistics, :class:`FlattenDictObservation` for Dict spaces).
- :class:`GymnasiumToTorch`: a numpy Gymnasium vector env (SAME_STEP autoreset) -> torch tensors on a device,
  with a dense ``info["final_obs"]``, a correct ``info["success"]`` and group resets for GRPO; it steps a
  ``SyncVectorEnv``'s sub-envs itself, and its per-step work is numpy plus one ``torch.from_numpy`` per output
  (the contract costs little next to the physics).
- :class:`RenderFirstEnv`, :class:`SafeRender`: ``render()`` gives the first sub-env's frame, or ``None`` with one
  warning, and never raises.
- :class:`FlattenDictObservation`: TensorDict observations -> one float32 ``[N, D]`` tensor.
- :class:`SelectObservation`: only the chosen entries of the observation (make_env's ``obs_indices``, ``obs_keys``).
- :class:`FrameStack`: the latest K observations side by side, oldest first (make_env's ``frame_stack``).
- :class:`EpisodeStatistics`: episode return / length / success, kept on the env's device (torch envs).

See ``docs/env-contract.md`` and ``docs/internals.md``.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate
from gymnasium.wrappers.utils import rescale_box
from tensordict import TensorDict

from cleanrl_embodied.shared.language import encode_instructions, is_instruction_space, text_to_instruction_space
from cleanrl_embodied.shared.tensordict_helpers import (
    PRIVILEGED_KEY,
    flat_dim,
    flatten_obs,
    image_spaces,
    is_image,
    token_spaces,
)


class EpisodeStatistics(VectorWrapper):
    """Adds ``info["episode"] = {"r", "l", "success"}`` and ``info["_episode"]`` to every step.

    Running return (float32) and length (int32) live on the env's device and are updated with pure
    tensor ops (no ``.item()``, no boolean indexing), so there is no host sync per step. Values in
    ``info["episode"]`` are valid in the rows where ``info["_episode"]`` (terminated | truncated) is True.
    Episode success is ``info["success"]`` at the episode's last step, 0 if the env has no success signal; an
    env that reports ``info["task_id"]`` (several tasks) gets the finished episode's task in ``episode["task_id"]``.
    ``reset(options={"reset_mask": mask})`` (a partial reset) restarts the statistics of the envs in ``mask`` only.
    """

    def __init__(self, env: VectorEnv):
        super().__init__(env)
        # Allocated lazily from the first reward tensor, so the wrapper needs no device argument.
        self._return: torch.Tensor | None = None
        self._length: torch.Tensor | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset all envs and all running statistics (with a ``reset_mask``, those of the envs in it)."""
        mask = (options or {}).get("reset_mask")
        if mask is None:
            self._return = None
            self._length = None
        elif self._return is not None:
            mask = torch.as_tensor(mask, device=self._return.device)
            self._return = torch.where(mask, 0.0, self._return)
            self._length = torch.where(mask, 0, self._length).to(torch.int32)
        return self.env.reset(seed=seed, options=options)

    def step(self, actions):
        """Step the env and report the statistics of the episodes that finished at this step."""
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if self._return is None:
            self._return = torch.zeros(self.num_envs, dtype=torch.float32, device=reward.device)
            self._length = torch.zeros(self.num_envs, dtype=torch.int32, device=reward.device)
        done = terminated | truncated
        episode_return = self._return + reward.float()
        episode_length = self._length + 1
        success = info.get("success")
        success = success.float() if success is not None else torch.zeros_like(episode_return)
        info["episode"] = {"r": episode_return, "l": episode_length, "success": success}
        if "task_id" in info:
            info["episode"]["task_id"] = info["task_id"]
        info["_episode"] = done
        # Finished envs start their next episode from zero (SAME_STEP autoreset already happened).
        self._return = torch.where(done, 0.0, episode_return)
        self._length = torch.where(done, 0, episode_length).to(torch.int32)
        return obs, reward, terminated, truncated, info

    def state_dict(self) -> dict[str, torch.Tensor | None]:
        """Return and length so far of every env's current episode (None before the first step)."""
        return {"return": self._return, "length": self._length}

    def load_state_dict(self, state: dict[str, torch.Tensor | None]) -> None:
        """Restore :meth:`state_dict` (tensors on any device: they go to the raw env's device)."""
        device = getattr(self.unwrapped, "device", None)
        self._return, self._length = (None if t is None else t.to(device) for t in (state["return"], state["length"]))


def _sorted_box_leaves(space: gym.spaces.Dict, prefix: tuple[str, ...] = ()) -> list:
    """(key path, Box) for every leaf of a nested Dict space, sorted by key path like ``flatten_obs``."""
    leaves = []
    for key, sub in space.spaces.items():
        if isinstance(sub, gym.spaces.Dict):
            leaves.extend(_sorted_box_leaves(sub, (*prefix, key)))
        else:
            leaves.append(((*prefix, key), sub))
    return sorted(leaves, key=lambda leaf: leaf[0])


class FlattenDictObservation(VectorWrapper):
    """Turns TensorDict observations (and ``info["final_obs"]``) into float32 ``[N, D]`` tensors.

    Leaves are concatenated in sorted order of their key path (``tensordict_helpers.flatten_obs``);
    the observation spaces become Boxes whose bounds are the leaves' bounds in that same order.
    """

    def __init__(self, env: VectorEnv):
        super().__init__(env)
        space = env.single_observation_space
        if not isinstance(space, gym.spaces.Dict):
            raise ValueError(f"FlattenDictObservation needs a Dict observation space, got {space}")
        leaves = _sorted_box_leaves(space)
        for path, leaf in leaves:
            if not isinstance(leaf, gym.spaces.Box):
                raise ValueError(f"FlattenDictObservation: leaf {'/'.join(path)} is {leaf}, expected a Box")
        with np.errstate(over="ignore"):  # float64 bounds beyond float32 range become +-inf
            low = np.concatenate([np.broadcast_to(b.low, b.shape).reshape(-1) for _, b in leaves])
            high = np.concatenate([np.broadcast_to(b.high, b.shape).reshape(-1) for _, b in leaves])
            low, high = low.astype(np.float32), high.astype(np.float32)
        assert low.shape == (flat_dim(space),)
        self.single_observation_space = gym.spaces.Box(low, high, dtype=np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        return flatten_obs(obs), info

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if "final_obs" in info:
            info["final_obs"] = flatten_obs(info["final_obs"])
        return flatten_obs(obs), reward, terminated, truncated, info


def _key_paths(space: gym.spaces.Dict, prefix: tuple[str, ...] = ()) -> list[str]:
    """Every entry of a nested Dict space (groups and leaves) as a '/'-joined key path, in the space's order."""
    paths = []
    for key, sub in space.spaces.items():
        paths.append("/".join((*prefix, key)))
        if isinstance(sub, gym.spaces.Dict):
            paths.extend(_key_paths(sub, (*prefix, key)))
    return paths


def _select_space(space: gym.spaces.Dict, paths: list[tuple[str, ...]]) -> gym.spaces.Dict:
    """The part of a nested Dict space that holds the entries at ``paths`` (their nesting kept, the space's order)."""
    kept = {}
    for key, sub in space.spaces.items():
        if any(path == (key,) for path in paths):
            kept[key] = sub
        elif deeper := [path[1:] for path in paths if path[0] == key and len(path) > 1]:
            kept[key] = _select_space(sub, deeper)
    return gym.spaces.Dict(kept)


def observation_indices(value: Any) -> list[int]:
    """``obs_indices`` as a list of integers, or one ValueError line (the range is checked against the space)."""
    ok = isinstance(value, (list, tuple)) and all(isinstance(i, (int, np.integer)) and not isinstance(i, bool)
                                                  for i in value)  # fmt: skip
    if not ok:
        raise ValueError(f"obs_indices must be a list of integers (entries of the flat observation), got {value!r}")
    return [int(i) for i in value]


def observation_keys(value: Any) -> list[str]:
    """``obs_keys`` as a list of key paths, or one ValueError line (the keys are checked against the space)."""
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(k, str) and k for k in value):
        raise ValueError(
            f"obs_keys must be a non-empty list of observation keys ('/'-joined paths, e.g. ['robot', "
            f"'object/cube_pos']), got {value!r}"
        )
    if len(set(value)) != len(value):
        raise ValueError(f"obs_keys must name each entry once, got {value!r}")
    return list(value)


class SelectObservation(VectorWrapper):
    """Keeps only chosen entries of the observation (and of ``info["final_obs"]``): make_env's ``obs_indices`` and
    ``obs_keys``, for partially observed tasks (POMDPs) on any env.

    ``indices``: positions in a flat Box observation ``[N, D]``, in the order given (negative ones, repeats, ones
    outside ``[0, D)`` and an empty list are refused); the Box's bounds are sliced alike. ``keys``: entries of a
    Dict (TensorDict) observation as '/'-joined key paths (``"robot"``, ``"object/cube_pos"``); the kept part keeps
    its nesting, and its Dict space is the matching part of the env's. Each refuses the other kind of observation,
    and a bad value is one ValueError line. ``reset`` (options included: partial resets pass through, and
    ``supports_partial_reset`` asks the env below), ``step`` and everything else pass through; it holds no state.
    """

    def __init__(self, env: VectorEnv, indices: Sequence[int] | None = None, keys: Sequence[str] | None = None):
        super().__init__(env)
        if (indices is None) == (keys is None):
            raise ValueError("SelectObservation: give indices or keys")
        space = env.single_observation_space
        self._index = self._paths = None
        if indices is not None:
            indices = observation_indices(indices)
            if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
                if isinstance(space, gym.spaces.Dict):
                    what = (f"a Dict ({', '.join(space.spaces)}); obs_keys keeps entries of a Dict, and "
                            "flatten_obs=true flattens one first")  # fmt: skip
                else:
                    what = f"a {type(space).__name__} of shape {space.shape}"
                raise ValueError(f"obs_indices selects entries of a flat Box observation; this one is {what}")
            size = space.shape[0]
            if not indices or len(set(indices)) != len(indices) or not all(0 <= i < size for i in indices):
                raise ValueError(
                    f"obs_indices must be a non-empty list of distinct integers in [0, {size - 1}] (the flat "
                    f"observation has {size} entries), got {indices!r}"
                )
            self._index = torch.tensor(indices, dtype=torch.long)
            self.single_observation_space = gym.spaces.Box(space.low[indices], space.high[indices], dtype=space.dtype)
        else:
            keys = observation_keys(keys)
            if not isinstance(space, gym.spaces.Dict):
                raise ValueError(
                    f"obs_keys keeps entries of a Dict observation; this one is a {type(space).__name__} of shape "
                    f"{space.shape} (obs_indices keeps entries of a flat vector)"
                )
            known = _key_paths(space)
            unknown = [key for key in keys if key not in known]
            if unknown:
                raise ValueError(f"obs_keys: unknown key {unknown[0]!r}; the observation's keys are {', '.join(known)}")
            paths = [tuple(key.split("/")) for key in keys]
            for path in paths:  # an instruction's token ids and attention mask only make sense together
                inside = [
                    token for token in token_spaces(space) if len(path) > len(token) and path[: len(token)] == token
                ]
                if inside:
                    raise ValueError(f"obs_keys: keep the instruction entry {'/'.join(inside[0])!r} whole")
            self._paths = paths
            self.single_observation_space = _select_space(space, paths)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)

    @property
    def indices(self) -> list[int] | None:
        """The kept positions of a flat observation (obs_indices), None when it keeps Dict entries."""
        return None if self._index is None else self._index.tolist()

    def _select(self, obs):
        if self._paths is not None:
            return obs.select(*self._paths)
        if self._index.device != obs.device:  # (moved once, at the first observation)
            self._index = self._index.to(obs.device)
        return obs.index_select(-1, self._index)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        return self._select(obs), info

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if "final_obs" in info:
            info["final_obs"] = self._select(info["final_obs"])
        return self._select(obs), reward, terminated, truncated, info


def frame_stack_size(value: Any) -> int:
    """``frame_stack`` as an integer >= 1, or one ValueError line."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(
            f"frame_stack must be an integer >= 1 (how many of the latest observations a policy sees; 1: only the "
            f"newest, no stacking), got {value!r}"
        )
    return int(value)


def _stacked_box(space: gym.spaces.Box, k: int) -> gym.spaces.Box:
    """The Box of ``k`` observations of ``space`` joined along their first axis (a scalar's stack is a vector)."""
    low, high = (np.reshape(bound, bound.shape or (1,)) for bound in (space.low, space.high))
    return gym.spaces.Box(np.concatenate([low] * k), np.concatenate([high] * k), dtype=space.dtype)


def _frames(x: torch.Tensor) -> torch.Tensor:
    """An observation leaf ``[N, ...]`` as ``[N, s0, ...]``: the axis frames are joined along (scalars get one)."""
    return x if x.dim() > 1 else x[:, None]


def _append(stack: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``stack`` ``[N, k * s0, ...]`` without its oldest frame, the leaf ``x`` appended as the newest."""
    x = _frames(x)
    return torch.cat((stack[:, x.shape[1] :], x), dim=1)


def _rows(mask: torch.Tensor, a, b):
    """``a`` in the rows of ``mask`` ([N] bool), ``b`` elsewhere (tensors or TensorDicts)."""
    if isinstance(a, TensorDict):
        return torch.where(mask, a, b)
    return torch.where(mask.view(-1, *([1] * (a.dim() - 1))), a, b)


class FrameStack(VectorWrapper):
    """The latest ``k`` observations side by side (make_env's ``frame_stack``): a policy without memory sees the recent
    past, the usual alternative to a recurrent policy on a partially observed task.

    The frames are joined along each observation's first axis, **oldest first, newest last**: a flat Box ``[N, D]``
    becomes ``[N, k * D]`` (entries ``[(k - 1 - j) * D, (k - j) * D)`` are the observation of ``j`` steps ago), and
    its bounds are tiled. Dict (TensorDict) observations are stacked entry by entry the same way: a float vector
    ``[N, d]`` becomes ``[N, k * d]``, an image (uint8 ``[C, H, W]``) ``[N, k * C, H, W]`` (frames along channels);
    instruction tokens (``shared.language``: ``input_ids`` and ``attention_mask``) are not stacked, they hold the
    newest observation's (an instruction changes only at a reset). A Dict entry that is not a Box is refused.

    Resets follow the SAME_STEP contract: after ``reset`` every frame of the stack is the first observation; at a step
    where an env's episode ended, ``info["final_obs"]`` is the finished episode's last ``k`` observations (its history
    and the final one) and ``obs`` a fresh stack of the new episode's first observation; other envs roll their stack
    by one. ``reset(options={"reset_mask": mask})`` refills only the stacks of the envs in ``mask`` (the others go on
    as they were). Per step this is tensor ops only (``torch.where`` on the done mask: no host sync). The stack is env
    state: :meth:`state_dict` / :meth:`load_state_dict` carry it through checkpoints (``env_state_dict``).
    """

    def __init__(self, env: VectorEnv, k: int):
        super().__init__(env)
        self.k = frame_stack_size(k)
        space = env.single_observation_space
        self._stacked: set[tuple[str, ...]] | None = None  # the stacked leaves of a Dict observation (None: a Box)
        if isinstance(space, gym.spaces.Box):
            self.single_observation_space = _stacked_box(space, self.k)
        elif isinstance(space, gym.spaces.Dict):
            self._stacked = set()
            self.single_observation_space = self._stacked_dict(space, ())
        else:
            raise ValueError(
                f"frame_stack stacks Box or Dict observations; this one is a {type(space).__name__} ({space})"
            )
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self._stack: torch.Tensor | TensorDict | None = None  # what the policy saw last (None before a reset)

    def _stacked_dict(self, space: gym.spaces.Dict, prefix: tuple[str, ...]) -> gym.spaces.Dict:
        if is_instruction_space(space):
            return space  # tokens: the newest observation's
        spaces = {}
        for key, sub in space.spaces.items():
            path = (*prefix, key)
            if isinstance(sub, gym.spaces.Dict):
                spaces[key] = self._stacked_dict(sub, path)
            elif isinstance(sub, gym.spaces.Box):
                spaces[key] = _stacked_box(sub, self.k)
                self._stacked.add(path)
            else:
                raise ValueError(f"frame_stack stacks Box entries; {'/'.join(path)} is a {type(sub).__name__}")
        return gym.spaces.Dict(spaces)

    def _leafwise(self, fn, obs, *stacks):
        """``fn(leaf, *stack leaves)`` for every stacked leaf of ``obs``; the other leaves (tokens) as in ``obs``."""
        if self._stacked is None:
            return fn(obs, *stacks)
        out = TensorDict({}, batch_size=obs.batch_size, device=obs.device)
        for key in obs.keys(include_nested=True, leaves_only=True):
            path = key if isinstance(key, tuple) else (key,)
            leaf = obs.get(path)
            out.set(path, fn(leaf, *(stack.get(path) for stack in stacks)) if path in self._stacked else leaf)
        return out

    def _fresh(self, obs):
        """A stack of ``k`` copies of ``obs``."""
        return self._leafwise(lambda x: (f := _frames(x)).repeat(1, self.k, *([1] * (f.dim() - 2))), obs)

    def _rolled(self, obs):
        """The current stack without its oldest frame, ``obs`` appended."""
        return self._leafwise(lambda x, stack: _append(stack, x), obs, self._stack)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        mask = (options or {}).get("reset_mask")  # (read first: an env below may pop it)
        obs, info = self.env.reset(seed=seed, options=options)
        fresh = self._fresh(obs)
        if mask is None or self._stack is None:
            self._stack = fresh
        else:
            self._stack = _rows(torch.as_tensor(mask, dtype=torch.bool, device=fresh.device), fresh, self._stack)
        return self._stack, info

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if "final_obs" in info:  # (rows that did not end hold obs: their rolled stack, as the contract wants)
            info["final_obs"] = self._rolled(info["final_obs"])
        self._stack = _rows(terminated | truncated, self._fresh(obs), self._rolled(obs))
        return self._stack, reward, terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        """The stack (a TensorDict's as a nested dict of tensors; None before the first reset)."""
        stack = self._stack.to_dict() if isinstance(self._stack, TensorDict) else self._stack
        return {"stack": stack}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (tensors on any device: they go to the env's)."""
        stack = state["stack"]
        if stack is None:
            self._stack = None
            return
        device = self._stack.device if self._stack is not None else getattr(self.unwrapped, "device", None)
        if isinstance(stack, dict):
            stack = TensorDict(stack, batch_size=[self.num_envs])
        self._stack = stack.to(device) if device is not None else stack


def first_frame(frames: Any) -> np.ndarray | None:
    """The first RGB frame of what a (vector) env's ``render()`` returned, as uint8 ``[H, W, 3]``; else None.

    Accepts one frame ``[H, W, 3|4]`` or a batch ``[N, H, W, 3|4]`` (numpy or torch), or a list/tuple of
    frames (a Gymnasium vector env's ``render()``); float frames are taken to be in [0, 1].
    """
    if isinstance(frames, (list, tuple)):
        frames = frames[0] if len(frames) else None
    if frames is None:
        return None
    if isinstance(frames, torch.Tensor):  # e.g. ManiSkill's batch on the GPU: copy only the first frame
        frames = (frames[0] if frames.ndim == 4 else frames).detach().cpu().numpy()
    frame = np.asarray(frames)
    if frame.ndim == 4:
        frame = frame[0]
    if frame.ndim != 3 or frame.shape[-1] not in (3, 4) or frame.dtype.kind not in "biuf":
        return None
    frame = frame[..., :3]
    if frame.dtype.kind == "f":
        frame = np.clip(frame, 0.0, 1.0) * 255.0
    return np.ascontiguousarray(np.clip(frame, 0, 255).astype(np.uint8))


MUJOCO_RENDER_HINT = "; MuJoCo renders headless with MUJOCO_GL=egl (libegl1) or MUJOCO_GL=osmesa (libosmesa6)"


def env_name(env) -> str:
    """The registered id of an env (or wrapper), for messages; the raw env's class name when it has no spec."""
    return env.spec.id if env.spec is not None else type(env.unwrapped).__name__


def _warn_cannot_render(env, error: BaseException | str, hint: str = "") -> None:
    name = env_name(env)
    reason = error if isinstance(error, str) else f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
    warnings.warn(
        f"{name} cannot render here ({reason[:200]}); render() returns None{hint}", RuntimeWarning, stacklevel=3
    )


class SafeRender(gym.Wrapper):
    """A single env whose ``render()`` never raises: where it can't render it warns once, with the reason, in
    the process that owns the env (an async worker too, which would otherwise die), and returns None from then
    on. Without a display it first defaults ``MUJOCO_GL`` to ``egl`` (Gymnasium's MuJoCo renderer would pick
    GLFW and fail), at render time and not at import time, because ``import mujoco`` itself reads MUJOCO_GL.
    """

    def __init__(self, env: gym.Env, hint: str | None = None):
        super().__init__(env)
        is_mujoco = "mujoco" in type(env.unwrapped).__module__
        self.hint = hint if hint is not None else MUJOCO_RENDER_HINT if is_mujoco else ""
        self.cannot_render = False

    def render(self):
        if self.cannot_render:
            return None
        if not any(os.environ.get(k) for k in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY")):
            os.environ["MUJOCO_GL"] = "egl"
        try:
            frame = self.env.render()
            error = None if frame is not None else f"render_mode={self.env.render_mode!r} gives no frame"
        except Exception as e:  # any renderer failure means "no video", never a crash
            frame, error = None, e
        if error is not None:
            self.cannot_render = True
            _warn_cannot_render(self, error, self.hint)
        return frame


class RenderFirstEnv(VectorWrapper):
    """Base of the adapters: ``render()`` returns the first sub-env's RGB frame (uint8 ``[H, W, 3]``) or None.

    It never raises: an exception from the renderer is reported once (reason and ``render_hint``) and render()
    returns None from then on, which the trainers read as "no video" (they say so themselves). Subclasses
    say how to get the frames (``_render_frames``).
    """

    render_hint = ""
    """appended to the warning, e.g. how to enable headless rendering"""
    _render_failed = False

    def _render_frames(self) -> Any:
        return self.env.render()

    def render(self) -> np.ndarray | None:
        if self._render_failed:
            return None
        try:
            return first_frame(self._render_frames())
        except Exception as e:  # any renderer failure means "no video", never a crash
            self._render_failed = True
            _warn_cannot_render(self, e, self.render_hint)
            return None


def _float32_space(space: gym.Space, top: bool = True) -> gym.Space:
    """The same Box / nested Dict of Boxes with float32 dtype (the contract's observation dtype); images (uint8
    [C, H, W] leaves of a Dict) stay uint8, channels-last ones ([H, W, C], Gymnasium's pixel layout) become
    channels-first; a ``Text`` entry of a Dict becomes instruction tokens (``shared.language``: byte ids and
    attention mask)."""
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict(
            [
                (key, channels_first(sub) if is_image(sub) else _float32_space(sub, top=False))
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


def _numpy_leaves(obs) -> list[np.ndarray]:
    """All arrays of a (nested) dict observation, or the observation itself, as a list."""
    if isinstance(obs, dict):
        return [leaf for key in sorted(obs) for leaf in _numpy_leaves(obs[key])]
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


class GymnasiumToTorch(RenderFirstEnv):
    """A numpy Gymnasium vector env (SAME_STEP autoreset) seen through the torch env contract.

    Outputs are on ``device``: obs float32 (Dict spaces -> TensorDict, see :class:`FlattenDictObservation`),
    reward float32 ``[N]``, terminated/truncated bool ``[N]``; actions may be torch tensors on any device.
    ``info`` holds only tensors (and dicts of tensors): a dense ``final_obs`` plus ``_final_obs``,
    ``success`` (bool ``[N]``) once the sub-envs have reported ``"success"`` or ``"is_success"``, and of the
    sub-envs' own info entries only ``rewards`` and ``metrics`` (:data:`INFO_KEYS`) plus those named in
    ``info_keys`` (``"all"``: every numeric one), batched as Gymnasium batches them (an ``[N]`` tensor and its
    ``_<key>`` mask; for an env that finished at this step, the entry its reset gave, except ``rewards`` and
    ``metrics``: those describe its last step, see :func:`last_step_entries`; the terms inside them come without
    Gymnasium's masks). Other entries (MuJoCo's
    ``x_position``, ``reward_ctrl``, ...) are not converted: each one costs an array, a mask and two tensors
    per step (HalfCheetah's four: a third of its one-env physics step), and no trainer reads them. ``render()``
    renders only the first sub-env (all of them in async mode, where sub-envs can't be reached one by one).

    A ``SyncVectorEnv`` is not stepped through its ``step()``: this wrapper steps its sub-envs itself (the same
    sub-env objects with the same wrappers, in the same order; an env whose episode ended is reset at once,
    without a seed, as SAME_STEP does), writing observations, rewards and flags straight into fresh
    float32/bool arrays. ``SyncVectorEnv.step`` batches every info entry of every sub-env into new arrays and
    masks, collects final observations in an object array and deep-copies the batch, and converting that
    output cost as much again; the results are the same bit for bit (tests/test_gymnasium_contract.py checks it
    step by step). Other vector envs (``AsyncVectorEnv``) are stepped through ``step()`` and their output converted.

    Several tasks: an env whose ``metadata["task_names"]`` names them and whose sub-envs report ``info["task_id"]``
    gets ``info["task_id"]`` (long ``[N]``, at reset and every step; a finished env's is its last episode's) and
    ``info["episode"]["task_id"]``. One without task names whose sub-envs tell their tasks apart otherwise
    (:func:`sub_env_tasks`: a ``task_name`` or ``task`` attribute, or their specs) gets them from there: its
    ``metadata["task_names"]`` are the distinct names in sub-env order, and each sub-env keeps its task.

    The per-step work is done on numpy arrays (a tiny numpy op costs well under a microsecond, a tiny torch op
    a few) and each output becomes a tensor with one ``torch.from_numpy`` (no copy on the CPU; one transfer
    per output to another device). Two jobs that are separate wrappers elsewhere are fused in here for that
    reason, each behind a flag (both on in :func:`numpy_vector_to_torch`):

    - ``rescale_actions``: the policy's [-1, 1] is mapped onto the env's bounds with Gymnasium's own
      ``rescale_box`` arithmetic (``RescaleAction``'s; unbounded components keep the env's scale), then clipped
      to the bounds, in one pass over the batch instead of two vector wrappers that go row by row.
    - ``episode_statistics``: ``info["episode"]``/``info["_episode"]`` exactly as :class:`EpisodeStatistics`
      computes them (float32 return, int32 length, success at the episode's last step), kept in numpy.

    Why not ``gymnasium.wrappers.vector.NumpyToTorch`` (gymnasium 1.x)? It needs the optional
    ``array_api_compat`` package (not installed with gymnasium's base requirements), and it converts every
    info entry with ``torch.from_dlpack``: SAME_STEP's ``info["final_obs"]`` is a numpy *object* array
    (None for envs that did not finish), which raises ``BufferError`` there. It would also keep
    ``final_info`` nested, and the top-level ``is_success`` of a finished env belongs to the new episode.

    Args:
        env: numpy vector env created with ``autoreset_mode=AutoresetMode.SAME_STEP``.
        device: torch device of all outputs.
        seed: used by the first ``reset()`` that gets ``seed=None``, and to seed the generator that draws
            fresh group seeds for ``reset(options={"group_size": G})``.
        rescale_actions: act in [-1, 1] (Box action spaces; see above); else actions go to ``env`` as given.
        episode_statistics: add ``info["episode"]`` and ``info["_episode"]`` (see above).
        info_keys: further info entries of the sub-envs to pass on (names), or ``"all"`` for every numeric one.
    """

    render_hint = MUJOCO_RENDER_HINT

    def __init__(
        self,
        env: VectorEnv,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        rescale_actions: bool = False,
        episode_statistics: bool = False,
        info_keys: Sequence[str] | str = (),
    ):
        super().__init__(env)
        if env.metadata.get("autoreset_mode") != AutoresetMode.SAME_STEP:
            raise ValueError(
                "GymnasiumToTorch needs a vector env created with autoreset_mode=AutoresetMode.SAME_STEP, "
                f"got {env.metadata.get('autoreset_mode')}"
            )
        self._all_info, self._info_keys = info_key_filter(info_keys)
        self.device = torch.device(device)
        self._on_cpu = self.device.type == "cpu"
        self.single_observation_space = _float32_space(env.single_observation_space)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self._seed = seed
        self._first_reset = True
        self._rng = np.random.default_rng(seed)
        self._success_key: str | None = None  # "success" or "is_success", once a sub-env reported it
        self._tasks = self._task_t = None  # each sub-env's task where it is fixed (sub_env_tasks) and its tensor
        self._task_info = "task_names" in env.metadata  # else the sub-envs' info["task_id"] means nothing here
        if not self._task_info and (names := sub_env_tasks(env)) is not None:
            task_names = tuple(dict.fromkeys(names))
            self.metadata = {**env.metadata, "task_names": task_names}
            self._tasks = np.array([task_names.index(name) for name in names], dtype=np.int64)
            self._task_t = torch.from_numpy(self._tasks).to(self.device)
        # SyncVectorEnv: its sub-envs are stepped here (see the class docstring); Box observations of float32 or
        # float64 go straight into a float32 array (one rounding, as through a float64 batch and then float32)
        self._sub_envs = env.envs if type(env) is SyncVectorEnv else None
        obs_space = env.single_observation_space
        self._float_rows = isinstance(obs_space, gym.spaces.Box) and obs_space.dtype in (np.float32, np.float64)
        self._batch_shape = (self.num_envs, *obs_space.shape) if self._float_rows else None
        self._n = self.num_envs  # (num_envs is a property that asks the wrapped env)
        space = env.single_action_space
        self._action_dtype = space.dtype
        self._bounds = self._unscale = None
        if rescale_actions:  # the bounds repeated for every env: a ufunc that needn't broadcast is ~1 us faster
            batch = (self.num_envs, *space.shape)
            self._bounds = tuple(np.ascontiguousarray(np.broadcast_to(b, batch)) for b in (space.low, space.high))
            if np.all(np.isfinite(space.low) & np.isfinite(space.high)):
                ones = np.ones(space.shape, dtype=space.dtype)  # in the space's dtype: no precision warning
                self.single_action_space, _, self._unscale = rescale_box(space, -ones, ones)
                self.action_space = batch_space(self.single_action_space, self.num_envs)
                if np.all(space.low == -1) and np.all(space.high == 1):  # (MuJoCo locomotion) the map is the
                    self._unscale = None  # identity: gradient exactly 1, intercept exactly 0, so it is left out
        self.episode_statistics = episode_statistics
        self._episode_return = np.zeros(self.num_envs, dtype=np.float32)
        self._episode_length = np.zeros(self.num_envs, dtype=np.int32)
        self._ones = np.ones(self.num_envs, dtype=np.int32)  # length + 1 without a Python int to convert

    def _render_frames(self):
        sub_envs = getattr(self.env.unwrapped, "envs", None)  # SyncVectorEnv: render the first sub-env only
        return sub_envs[0].render() if sub_envs else self.env.render()  # async: every worker renders

    # ---- conversions -------------------------------------------------------------------------------
    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        """A numpy array this wrapper owns -> a tensor on the device (no copy on the CPU)."""
        tensor = torch.from_numpy(array)
        return tensor if self._on_cpu else tensor.to(self.device)

    def _obs_to_torch(self, obs) -> torch.Tensor | TensorDict:
        if isinstance(obs, dict):
            obs = self._obs_dict_to_torch(obs, self.single_observation_space)
            return TensorDict(obs, batch_size=[self.num_envs], device=self.device)
        return self._tensor(np.array(obs, dtype=np.float32))

    def _obs_dict_to_torch(self, obs: dict, space: gym.spaces.Dict) -> dict:
        out = {}
        for key, value in obs.items():
            if isinstance(value, dict):
                out[key] = self._obs_dict_to_torch(value, space[key])
            elif not isinstance(value, np.ndarray) or value.dtype.kind in "USO":  # Text: the batch of strings
                out[key] = encode_instructions(list(value), space[key]["input_ids"].shape[0], self.device)
            elif value.dtype == np.uint8 and value.ndim == 4:  # images stay uint8, channels first
                if value.shape[1:] != space[key].shape:  # a channels-last image [N, H, W, C]
                    value = value.transpose(0, 3, 1, 2)
                out[key] = self._tensor(np.ascontiguousarray(value))
            else:
                out[key] = self._tensor(np.array(value, dtype=np.float32))
        return out

    def _passes(self, key: str) -> bool:
        """Whether a (batched) info entry of the sub-envs, or its ``_<key>`` mask, is passed on."""
        keys = self._info_keys
        return self._all_info or key in keys or (key[:1] == "_" and key[1:] in keys)

    def _info_to_torch(self, info: dict, select: bool = True) -> dict:
        """:func:`numeric_info_to_torch`, with ``select`` keeping only the entries passed on (:meth:`_passes`).
        The vector env builds fresh info arrays at every step, so they are wrapped without a copy."""
        return numeric_info_to_torch(info, self._tensor, self._passes if select else None)

    def _actions_to_numpy(self, actions) -> np.ndarray:
        if isinstance(actions, torch.Tensor):
            actions = actions.numpy(force=True)  # detached, on the host
        if self._bounds is None:
            return np.asarray(actions, dtype=self._action_dtype)
        actions = np.asarray(actions, dtype=self._action_dtype)
        low, high = self._bounds  # clipped (= np.clip, in fewer calls) in a new array, not in the caller's
        if self._unscale is not None:
            actions = self._unscale(actions)  # a new array
            np.maximum(actions, low, out=actions)
        else:
            actions = np.maximum(actions, low)
        return np.minimum(actions, high, out=actions)

    def _pop_success(self, info: dict, final_info: dict, done: np.ndarray) -> np.ndarray | None:
        """Success of the transition just taken; for finished envs it comes from ``final_info``."""
        if self._success_key is None:
            self._success_key = next((k for k in ("success", "is_success") if k in info or k in final_info), None)
            if self._success_key is None:
                return None
        key = self._success_key
        success = np.zeros(self.num_envs, dtype=bool)
        if key in info:  # running envs: the top-level info is theirs
            rows = info.pop(f"_{key}") & ~done
            success[rows] = info.pop(key)[rows].astype(bool)
        if key in final_info:  # finished envs: the top-level info belongs to the new episode
            rows = final_info[f"_{key}"] & done
            success[rows] = final_info[key][rows].astype(bool)
        return success

    def _obs_outputs(self, obs, final_rows: dict[int, Any]) -> tuple[torch.Tensor | TensorDict, ...]:
        """``obs`` (the batch after the step) and the dense ``final_obs``: ``obs`` with the rows of the envs that
        finished replaced by their last observation (``final_rows``: env index -> that observation)."""
        if isinstance(obs, dict):
            obs_t = self._obs_to_torch(obs)
            if not final_rows:
                return obs_t, obs_t.clone()
            space = self.env.single_observation_space
            rows = list(iterate(space, obs))
            for i, row in final_rows.items():
                rows[i] = row
            return obs_t, self._obs_to_torch(concatenate(space, rows, create_empty_array(space, self.num_envs)))
        obs = np.array(obs, dtype=np.float32)
        dense = obs.copy()
        for i, row in final_rows.items():
            dense[i] = row
        return self._tensor(obs), self._tensor(dense)

    # ---- VectorEnv API -----------------------------------------------------------------------------
    partial_reset = True  # reset(options={"reset_mask": mask}) resets just those envs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset all sub-envs; ``options={"group_size": G}`` gives each group of G envs one seed;
        ``options={"reset_mask": mask}`` resets only the envs in ``mask`` (the other rows of the returned
        observation are the envs' current ones)."""
        options = dict(options) if options else {}
        if "reset_mask" in options:
            return self._partial_reset(np.asarray(torch.as_tensor(options.pop("reset_mask")).cpu(), dtype=bool))
        group_size = options.pop("group_size", None)
        if seed is None and self._first_reset:
            seed = self._seed
        seeds: int | list[int] | None = seed
        if group_size is not None:
            if not isinstance(group_size, (int, np.integer)) or group_size < 1 or self.num_envs % group_size:
                raise ValueError(
                    f"group_size={group_size!r} must be a positive integer dividing num_envs={self.num_envs}"
                )
            num_groups = self.num_envs // group_size
            if seed is None:
                group_seeds = self._rng.integers(0, 2**31 - 1, size=num_groups)
            else:
                group_seeds = seed + np.arange(num_groups)
            seeds = [int(s) for s in np.repeat(group_seeds, group_size)]
        obs, info = self.env.reset(seed=seeds, options=options or None)
        self._first_reset = False
        # new arrays: the last step's info["episode"] tensors may share memory with the old ones
        self._episode_return = np.zeros(self.num_envs, dtype=np.float32)
        self._episode_length = np.zeros(self.num_envs, dtype=np.int32)
        if group_size is not None:
            self._check_identical_groups(obs, int(group_size), seeds)
        for key in ("success", "is_success"):  # a reset describes no transition: no success to report
            if key in info:
                self._success_key = self._success_key or key
                del info[key]
                info.pop(f"_{key}", None)
        task = self._pop_task_id(info, {}, np.zeros(self.num_envs, bool))
        self._last_obs = self._obs_to_torch(obs)
        out = self._info_to_torch(info)
        if self._task_t is not None or (task is not None and self._task_info):  # the task each sub-env starts on
            out["task_id"] = self._task_t if self._task_t is not None else torch.from_numpy(task).to(self.device)
        return self._last_obs, out

    def _partial_reset(self, mask: np.ndarray):
        """Reset the envs in ``mask`` (no seed: each continues its own random stream); other rows keep their obs."""
        rows = np.flatnonzero(mask)
        if rows.size == 0:
            return self._last_obs, {}
        if self._sub_envs is not None:  # stepped here: reset the sub-envs here too
            fresh = {int(i): self._sub_envs[i].reset()[0] for i in rows}
            space = self.env.single_observation_space
            batch = [fresh.get(i, fresh[int(rows[0])]) for i in range(self.num_envs)]  # other rows: filler
            obs = concatenate(space, batch, create_empty_array(space, self.num_envs))
        else:
            obs, _ = self.env.reset(options={"reset_mask": mask})
        self._episode_return = np.where(mask, np.float32(0.0), self._episode_return)
        self._episode_length = np.where(mask, np.int32(0), self._episode_length)
        keep = torch.as_tensor(mask, device=self.device)
        obs_t = self._obs_to_torch(obs)
        if isinstance(obs_t, TensorDict):
            self._last_obs = torch.where(keep, obs_t, self._last_obs)
        else:
            self._last_obs = torch.where(keep.view(-1, *([1] * (obs_t.dim() - 1))), obs_t, self._last_obs)
        return self._last_obs, {}

    def _check_identical_groups(self, obs, group_size: int, seeds: list[int]) -> None:
        num_groups = self.num_envs // group_size
        for leaf in _numpy_leaves(obs):
            grouped = leaf.reshape(num_groups, group_size, -1)
            differs = ~np.all(grouped == grouped[:, :1], axis=(1, 2))
            if differs.any():
                group = int(np.flatnonzero(differs)[0])
                raise ValueError(
                    f"reset(options={{'group_size': {group_size}}}): {env_name(self.env)} can't give identical "
                    f"starts: the envs of group {group} were all reset with seed {seeds[group * group_size]} but "
                    "their first observations differ (its reset ignores the seed or is not deterministic)"
                )

    def _step_sub_envs(self, actions: np.ndarray) -> tuple:
        """SyncVectorEnv's SAME_STEP step, done here on its sub-envs (see the class docstring)."""
        n = self._n
        reward = np.empty(n, dtype=np.float32)
        terminated, truncated = np.empty(n, dtype=bool), np.empty(n, dtype=bool)
        last = np.empty(self._batch_shape, dtype=np.float32) if self._float_rows else [None] * n  # last obs
        infos: list = [None] * n
        resets: dict[int, tuple] = {}  # env index -> (obs, info) of the reset that followed its episode's end
        for i, env in enumerate(self._sub_envs):
            last[i], reward[i], ended, cut, infos[i] = env.step(actions[i])
            terminated[i], truncated[i] = ended, cut
            if ended or cut:
                resets[i] = env.reset()

        tensor = torch.from_numpy if self._on_cpu else self._tensor
        if self._float_rows:  # final_obs is the batch of last observations; obs has the reset ones in their rows
            obs = last.copy()
            for i, (reset_obs, _) in resets.items():
                obs[i] = reset_obs
            obs_t, final_t = tensor(obs), tensor(last)
        else:  # Dict (or another dtype): batched as SyncVectorEnv batches it, then converted as its output would be
            env_obs = list(last)
            for i, (reset_obs, _) in resets.items():
                env_obs[i] = reset_obs
            space = self.env.single_observation_space
            obs_t, final_t = self._obs_outputs(
                concatenate(space, env_obs, create_empty_array(space, n)), {i: last[i] for i in resets}
            )

        key = self._success_key
        if key is None:  # seen in a step's info, or in the info of a reset that followed an episode's end
            seen = [*infos, *(info for _, info in resets.values())] if resets else infos
            for info in seen:
                if "success" in info or "is_success" in info:
                    key = self._success_key = "success" if any("success" in i for i in seen) else "is_success"
                    break
        success = None
        if key is not None:  # from the step's own info, also for the envs that finished (not from their reset's)
            success = np.zeros(n, dtype=bool)
            for i, info in enumerate(infos):
                if key in info:
                    success[i] = info[key]
        task = None
        if self._task_info and self._tasks is None:  # the step's own task, as success (a finished env: its last)
            task = np.array([info.get("task_id", 0) for info in infos], dtype=np.int64)

        # The passed-on entries, batched as SyncVectorEnv batches them (a finished env's from its reset's info,
        # except rewards and metrics, which describe its last step: see last_step_entries)
        batched: dict = {}
        keys, all_info = self._info_keys, self._all_info
        for i, info in enumerate(infos):
            top = resets[i][1] if resets and i in resets else info
            if top and (all_info or not keys.isdisjoint(top)):
                wanted = {k: v for k, v in top.items() if k != key and (all_info or k in keys)}
                if wanted:
                    self.env._add_info(batched, wanted, i)
        if resets:
            final: dict = {}
            for i in resets:
                last = {k: infos[i][k] for k in INFO_KEYS if k in infos[i]}
                if last:
                    self.env._add_info(final, last, i)
            if final or not batched.keys().isdisjoint(INFO_KEYS):
                last_step_entries(batched, final, terminated | truncated)
        out = self._info_to_torch(batched, select=False) if batched else {}
        return self._outputs(obs_t, final_t, reward, terminated, truncated, success, out, bool(resets), task)

    def _outputs(
        self,
        obs_t,
        final_t,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        success: np.ndarray | None,
        out: dict,
        any_done: bool | None,
        task: np.ndarray | None = None,
    ) -> tuple:
        """The step's return value: tensors, with ``final_obs``, ``success``, the episode statistics and the task
        (``task``, or the fixed tasks) in ``out`` (the converted info). ``any_done`` False: no episode ended (None:
        not known)."""
        tensor = torch.from_numpy if self._on_cpu else self._tensor
        done = terminated | truncated
        done_t = tensor(done)
        out["final_obs"], out["_final_obs"] = final_t, done_t
        if success is not None:
            out["success"] = tensor(success)
        if self.episode_statistics:
            episode_return = self._episode_return + reward
            episode_length = self._episode_length + self._ones
            out["episode"] = {
                "r": tensor(episode_return),
                "l": tensor(episode_length),
                "success": tensor(
                    success.astype(np.float32) if success is not None else np.zeros(self._n, dtype=np.float32)
                ),
            }
            out["_episode"] = done_t
            if any_done is False:  # the running sums are those arrays now: they are never changed in place
                self._episode_return, self._episode_length = episode_return, episode_length
            else:  # finished envs start their next episode from zero (SAME_STEP autoreset already happened)
                self._episode_return = np.where(done, np.float32(0.0), episode_return)
                self._episode_length = np.where(done, np.int32(0), episode_length)
        task_t = self._task_t if self._task_t is not None else None if task is None else tensor(task)
        if task_t is not None:  # the task each sub-env ran: per-task success (RolloutStats, evaluate)
            out["task_id"] = task_t
            if "episode" in out:
                out["episode"]["task_id"] = task_t
        self._last_obs = obs_t  # (what a partial reset leaves in the rows it doesn't reset)
        return obs_t, tensor(reward), tensor(terminated), tensor(truncated), out

    def step(self, actions):
        """Step all sub-envs; finished envs are already reset (SAME_STEP), see ``info["final_obs"]``."""
        actions = self._actions_to_numpy(actions)
        if self._sub_envs is not None:
            return self._step_sub_envs(actions)
        obs, reward, terminated, truncated, info = self.env.step(actions)
        reward = np.asarray(reward, dtype=np.float32)  # the vector env returns fresh arrays: no copy needed
        terminated, truncated = np.asarray(terminated, dtype=bool), np.asarray(truncated, dtype=bool)
        final_obs = info.pop("final_obs", None)  # an object array, present when some env finished
        info.pop("_final_obs", None)
        final_info = info.pop("final_info", None) or {}
        info.pop("_final_info", None)
        success = self._pop_success(info, final_info, terminated | truncated)
        task = self._pop_task_id(info, final_info, terminated | truncated)
        if final_info:
            last_step_entries(info, final_info, terminated | truncated)
        final_rows = {i: final_obs[i] for i in np.flatnonzero(terminated | truncated)} if final_obs is not None else {}
        obs_t, final_t = self._obs_outputs(obs, final_rows)
        out = self._info_to_torch(info) if info else {}
        task = task if self._task_info else None
        return self._outputs(obs_t, final_t, reward, terminated, truncated, success, out, None, task)

    @staticmethod
    def _pop_task_id(info: dict, final_info: dict, done: np.ndarray) -> np.ndarray | None:
        """The task of the transition just taken (``info["task_id"]``, an integer per sub-env), for finished envs that
        of the episode that ended (``final_info``: the top-level info belongs to the new episode); None without."""
        if "task_id" not in info and "task_id" not in final_info:
            return None
        task = np.asarray(info.pop("task_id", np.zeros(done.shape, np.int64)), dtype=np.int64).copy()
        info.pop("_task_id", None)
        if "task_id" in final_info:
            task = np.where(done & final_info.get("_task_id", done), np.asarray(final_info["task_id"]), task)
        return task


def flattens(space: gym.Space, flatten_obs: bool | None) -> bool:
    """Whether observations of ``space`` get flattened: Dict spaces when ``flatten_obs`` is True, or when it is
    None (the default) and all their leaves are floats (no image, which is a uint8 ``[C, H, W]`` leaf, no
    instruction tokens and no privileged entry, which must stay apart from what an actor reads); never a Box."""
    if flatten_obs not in (None, True, False):
        raise ValueError(
            f"flatten_obs must be true, false or null (flatten unless there are images), got {flatten_obs!r}"
        )
    separate = image_spaces(space) or token_spaces(space) or PRIVILEGED_KEY in getattr(space, "spaces", {})
    wanted = not separate if flatten_obs is None else flatten_obs
    return wanted and isinstance(space, gym.spaces.Dict)


def numpy_vector_to_torch(
    env: VectorEnv,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    flatten_obs: bool | None = None,
    info_keys: Sequence[str] | str = (),
) -> VectorEnv:
    """A numpy vector env (SAME_STEP autoreset, Box actions) -> the torch env contract.

    :class:`GymnasiumToTorch` with both of its fused jobs: the policy's [-1, 1] rescaled onto the env's bounds
    (unbounded actions keep the env's own scale) and clipped to them (so the env never sees an out-of-bound
    action, rounding included), and the episode statistics that :class:`EpisodeStatistics` gives other envs.
    Then :class:`FlattenDictObservation` for Dict observations (see :func:`flattens`). ``info_keys``: the sub-envs'
    info entries passed on besides ``rewards`` and ``metrics`` (``"all"``: every numeric one; see
    :class:`GymnasiumToTorch`). A non-Box action space or bad ``info_keys`` raise a one-line ValueError (and close
    ``env``).
    """
    try:
        space = env.single_action_space
        if not isinstance(space, gym.spaces.Box):
            raise ValueError(
                f"--env-id {env_name(env)!r} has a {type(space).__name__} action space; "
                "make_env supports continuous (Box) action spaces only"
            )
        env = GymnasiumToTorch(
            env, device=device, seed=seed, rescale_actions=True, episode_statistics=True, info_keys=info_keys
        )
        if flattens(env.single_observation_space, flatten_obs):
            env = FlattenDictObservation(env)
    except ValueError:
        env.close()
        raise
    return env


def _offers_rgb_array(env_id: str) -> bool:
    """Whether the env class behind a Gymnasium id lists "rgb_array" among its render modes."""
    try:
        entry_point = gym.spec(env_id).entry_point
        creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
        return "rgb_array" in (getattr(creator, "metadata", None) or {}).get("render_modes", ())
    except Exception:  # a missing dependency is reported by make_vec itself, with its own message
        return False


QUIET_MUJOCO_WARNINGS = ("compiler attribute 'settotalmass' is deprecated",)
"""The starts of the MuJoCo warnings make_env drops: Gymnasium's own model files (half_cheetah.xml, hopper.xml, ...)
set ``settotalmass``, which MuJoCo 4 deprecates but still applies; nothing a user can or needs to act on."""


def _mujoco_warning(message: str) -> None:
    if not message.startswith(QUIET_MUJOCO_WARNINGS):
        warnings.warn(f"MuJoCo: {message}", RuntimeWarning, stacklevel=2)


def quiet_mujoco(spec: gym.envs.registration.EnvSpec) -> None:
    """Where ``spec``'s env runs on MuJoCo (its entry point's module imports ``mujoco``): route MuJoCo's warnings
    through Python's ``warnings`` as RuntimeWarnings, without :data:`QUIET_MUJOCO_WARNINGS`.

    MuJoCo's default warning handler prints every warning to the console and appends it to ``MUJOCO_LOG.TXT`` in
    the working directory; with a handler of the user's (``mujoco.set_mju_user_warning``) it does neither and calls
    that instead. This installs one, once per process, before the env compiles its model (where the deprecation is
    warned). The workers of an async vector env are forked from this process and inherit it. A handler someone
    else installed is left alone."""
    for entry in (spec.entry_point, spec.vector_entry_point):
        if isinstance(entry, str):
            try:
                load_env_creator(entry)  # imports the env's module, and mujoco with it for a MuJoCo env
            except Exception:  # a missing dependency is reported by make_vec itself, with its own message
                pass
    mujoco = sys.modules.get("mujoco")
    if mujoco is not None and mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_mujoco_warning)


def _vector_only_env(env_id: str, num_envs: int, device, seed, flatten_obs, info_keys, env_kwargs: dict) -> VectorEnv:
    """An id registered with a ``vector_entry_point`` only (multi-task suites register this way: ``gym.make_vec``
    works, ``gym.make`` does not): its own vector env, asked for SAME_STEP autoreset where its creator takes an
    ``autoreset_mode``, -> :func:`numpy_vector_to_torch`. Each sub-env may run another task: where the env or its
    sub-envs tell them apart (:class:`GymnasiumToTorch`, "Several tasks"), success is logged per task. One line for
    an env that resets in another mode (the trainers need the last observation of every finished episode)."""
    creator = gym.spec(env_id).vector_entry_point
    creator = load_env_creator(creator) if isinstance(creator, str) else creator
    takes_mode = "autoreset_mode" in inspect.signature(creator).parameters
    kwargs = {**({"autoreset_mode": AutoresetMode.SAME_STEP} if takes_mode else {}), **env_kwargs}
    try:
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)
    except gym.error.DependencyNotInstalled as e:
        raise ValueError(f"--env-id {env_id!r} needs a package that is not installed ({e})") from None
    mode = env.metadata.get("autoreset_mode")
    if mode != AutoresetMode.SAME_STEP:
        env.close()
        raise ValueError(
            f"--env-id {env_id!r} registers only a vector env, and it resets finished sub-envs in mode {mode}; the "
            "trainers need Gymnasium's SAME_STEP autoreset (the last observation in info['final_obs']): give its "
            "creator an autoreset_mode argument or register a single-env entry point"
        )
    return numpy_vector_to_torch(env, device=device, seed=seed, flatten_obs=flatten_obs, info_keys=info_keys)


def make_gymnasium_env(
    env_id: str,
    num_envs: int,
    device,
    seed: int | None,
    vectorization: str,
    flatten_obs: bool | None,
    info_keys=(),
    **env_kwargs,
) -> VectorEnv:
    """``make_env``'s backend for a registered numpy Gymnasium id: ``num_envs`` sub-envs (SAME_STEP autoreset,
    stepped in this process (``"sync"``) or one worker process each (``"async"``), ``render_mode="rgb_array"``
    where the env has it) -> :func:`numpy_vector_to_torch`."""
    spec = gym.spec(env_id)
    quiet_mujoco(spec)  # no MuJoCo deprecation warnings from Gymnasium's model files, no MUJOCO_LOG.TXT
    if spec.entry_point is None and spec.vector_entry_point is not None:  # a suite that registers only its vector env
        return _vector_only_env(env_id, num_envs, device, seed, flatten_obs, info_keys, env_kwargs)
    if "render_mode" not in env_kwargs and _offers_rgb_array(env_id):
        env_kwargs["render_mode"] = "rgb_array"  # for --capture-video; see GymnasiumToTorch.render
    try:
        env = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode=vectorization,
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            wrappers=[SafeRender],  # render() never raises, in async workers too
            **env_kwargs,
        )
    except gym.error.DependencyNotInstalled as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(
            f"--env-id {env_id!r} needs a package that is not installed ({reason}); "
            "MuJoCo ids need `uv sync --extra mujoco`, ManiSkill ids need `uv sync --extra maniskill`"
        ) from None
    if env_kwargs.get("max_episode_steps") and env.spec is not None:  # make_vec keeps the registered limit
        env.spec = dataclasses.replace(env.spec, max_episode_steps=int(env_kwargs["max_episode_steps"]))
    return numpy_vector_to_torch(env, device=device, seed=seed, flatten_obs=flatten_obs, info_keys=info_keys)


class IntervalRandomization(VectorWrapper):
    """Domain-randomization event at an interval: every ``interval`` env steps, ask the env to resample its
    randomized physical parameters (``env.unwrapped.randomize_parameters()``) mid-episode.

    Reset-time randomization is the env's own business (PushCubeRL's ``*_range`` options); this wrapper adds
    the "every K steps" event of EmbodiChain's EventManager as a plain Gymnasium wrapper. It counts control
    steps on the host (a Python int), so it costs no device sync.
    """

    def __init__(self, env: VectorEnv, interval: int):
        super().__init__(env)
        if not hasattr(env.unwrapped, "randomize_parameters"):
            raise ValueError(f"randomize_interval: {type(env.unwrapped).__name__} has no randomize_parameters()")
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"randomize_interval must be a positive integer (env steps), got {interval!r}")
        self.interval = interval
        self.steps_since_event = 0
        self.num_events = 0

    def step(self, actions):
        self.steps_since_event += 1
        if self.steps_since_event >= self.interval:
            self.env.unwrapped.randomize_parameters()
            self.steps_since_event = 0
            self.num_events += 1
        return self.env.step(actions)

    def state_dict(self) -> dict[str, int]:
        return {"steps_since_event": self.steps_since_event, "num_events": self.num_events}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps_since_event, self.num_events = int(state["steps_since_event"]), int(state["num_events"])
