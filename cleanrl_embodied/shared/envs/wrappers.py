"""The generic torch vector-env wrappers: what every backend's env goes through on its way to the trainers.

- :class:`EpisodeStatistics`: episode return / length / success, kept on the env's device.
- :class:`FlattenDictObservation`: TensorDict observations -> one float32 ``[N, D]`` tensor (:func:`flattens`
  decides when).
- :class:`SelectObservation`: only the chosen entries of the observation (make_env's ``obs_indices``, ``obs_keys``).
- :class:`FrameStack`: the latest K observations side by side, oldest first (make_env's ``frame_stack``).
- :class:`IntervalRandomization`: resample an env's randomized parameters every K steps (``randomize_interval``).

The backends that make an env of a simulator are their own modules (gymnasium_backend.py, maniskill_backend.py,
envpool_backend.py, and the built-in push_cube package). See ``docs/env-contract.md`` and ``docs/internals.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space
from tensordict import TensorDict

from cleanrl_embodied.shared.language import is_instruction_space
from cleanrl_embodied.shared.observations import (
    PRIVILEGED_KEY,
    flat_dim,
    flatten_obs,
    image_spaces,
    token_spaces,
)

__all__ = [
    "EpisodeStatistics",
    "FlattenDictObservation",
    "flattens",
    "frame_stack_size",
    "FrameStack",
    "IntervalRandomization",
    "observation_indices",
    "observation_keys",
    "SelectObservation",
]


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

    Leaves are concatenated in sorted order of their key path (``observations.flatten_obs``);
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
