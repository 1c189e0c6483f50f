"""Torch vector-env wrappers that turn any env into the project's env contract.

- :class:`GymnasiumToTorch`: a numpy Gymnasium vector env (SAME_STEP autoreset) -> torch tensors on a device,
  with a dense ``info["final_obs"]``, a correct ``info["success"]`` and group resets for GRPO.
- :class:`FlattenDictObservation`: TensorDict observations -> one float32 ``[N, D]`` tensor.
- :class:`EpisodeStatistics`: episode return / length / success, kept on the env's device.

See ``CONVENTIONS.md`` ("The env contract") and ``docs/INTERFACES.md``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate
from tensordict import TensorDict

from cleanrl_embodied.shared.tensordict_helpers import flat_dim, flatten_obs


class EpisodeStatistics(VectorWrapper):
    """Adds ``info["episode"] = {"r", "l", "success"}`` and ``info["_episode"]`` to every step.

    Running return (float32) and length (int32) live on the env's device and are updated with pure
    tensor ops (no ``.item()``, no boolean indexing), so there is no host sync per step. Values in
    ``info["episode"]`` are valid in the rows where ``info["_episode"]`` (terminated | truncated) is True.
    Episode success is ``info["success"]`` at the episode's last step, 0 if the env has no success signal.
    """

    def __init__(self, env: VectorEnv):
        super().__init__(env)
        # Allocated lazily from the first reward tensor, so the wrapper needs no device argument.
        self._return: torch.Tensor | None = None
        self._length: torch.Tensor | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset all envs and all running statistics."""
        self._return = None
        self._length = None
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
        info["_episode"] = done
        # Finished envs start their next episode from zero (SAME_STEP autoreset already happened).
        self._return = torch.where(done, 0.0, episode_return)
        self._length = torch.where(done, 0, episode_length).to(torch.int32)
        return obs, reward, terminated, truncated, info


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


def _float32_space(space: gym.Space) -> gym.Space:
    """The same Box / nested Dict of Boxes with float32 dtype (the contract's observation dtype)."""
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict([(key, _float32_space(sub)) for key, sub in space.spaces.items()])  # keep order
    if isinstance(space, gym.spaces.Box):
        with np.errstate(over="ignore"):
            low, high = space.low.astype(np.float32), space.high.astype(np.float32)
        return gym.spaces.Box(low, high, dtype=np.float32)
    raise ValueError(f"observation space {space} is not supported: expected a Box or a nested Dict of Boxes")


def _numpy_leaves(obs) -> list[np.ndarray]:
    """All arrays of a (nested) dict observation, or the observation itself, as a list."""
    if isinstance(obs, dict):
        return [leaf for key in sorted(obs) for leaf in _numpy_leaves(obs[key])]
    return [np.asarray(obs)]


class GymnasiumToTorch(VectorWrapper):
    """A numpy Gymnasium vector env (SAME_STEP autoreset) seen through the torch env contract.

    Outputs are on ``device``: obs float32 (Dict spaces -> TensorDict, see :class:`FlattenDictObservation`),
    reward float32 ``[N]``, terminated/truncated bool ``[N]``; actions may be torch tensors on any device.
    ``info`` holds only tensors (and dicts of tensors): a dense ``final_obs`` plus ``_final_obs``,
    ``success`` (bool ``[N]``) once the sub-envs have reported ``"success"`` or ``"is_success"``, and the
    other numeric info arrays converted; object arrays and ``final_info`` are dropped.

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
    """

    def __init__(self, env: VectorEnv, device: torch.device | str = "cpu", seed: int | None = None):
        super().__init__(env)
        if env.metadata.get("autoreset_mode") != AutoresetMode.SAME_STEP:
            raise ValueError(
                "GymnasiumToTorch needs a vector env created with autoreset_mode=AutoresetMode.SAME_STEP, "
                f"got {env.metadata.get('autoreset_mode')}"
            )
        self.device = torch.device(device)
        self.single_observation_space = _float32_space(env.single_observation_space)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self._seed = seed
        self._first_reset = True
        self._rng = np.random.default_rng(seed)
        self._success_key: str | None = None  # "success" or "is_success", once a sub-env reported it

    # ---- conversions -------------------------------------------------------------------------------
    def _obs_to_torch(self, obs) -> torch.Tensor | TensorDict:
        if isinstance(obs, dict):
            return TensorDict(self._obs_dict_to_torch(obs), batch_size=[self.num_envs], device=self.device)
        return torch.as_tensor(obs, dtype=torch.float32, device=self.device)

    def _obs_dict_to_torch(self, obs: dict) -> dict:
        return {
            key: self._obs_dict_to_torch(value) if isinstance(value, dict)
            else torch.as_tensor(value, dtype=torch.float32, device=self.device)
            for key, value in obs.items()
        }

    def _info_to_torch(self, info: dict) -> dict:
        """Numeric/bool numpy arrays -> tensors (float64 -> float32), nested dicts kept; the rest dropped."""
        out = {}
        for key, value in info.items():
            if isinstance(value, dict):
                out[key] = self._info_to_torch(value)
            elif isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
                tensor = torch.as_tensor(value, device=self.device)
                out[key] = tensor.float() if tensor.dtype == torch.float64 else tensor
        return out

    def _actions_to_numpy(self, actions) -> np.ndarray:
        if isinstance(actions, torch.Tensor):
            actions = actions.detach().cpu().numpy()
        return np.asarray(actions, dtype=self.env.single_action_space.dtype)

    def _pop_success(self, info: dict, final_info: dict, done: np.ndarray) -> np.ndarray | None:
        """Success of the transition just taken; for finished envs it comes from ``final_info``."""
        if self._success_key is None:
            self._success_key = next(
                (k for k in ("success", "is_success") if k in info or k in final_info), None
            )
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

    # ---- VectorEnv API -----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset all sub-envs; ``options={"group_size": G}`` gives each group of G envs one seed."""
        options = dict(options) if options else {}
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
        if group_size is not None:
            self._check_identical_groups(obs, int(group_size), seeds)
        for key in ("success", "is_success"):  # a reset describes no transition: no success to report
            if key in info:
                self._success_key = self._success_key or key
                del info[key]
                info.pop(f"_{key}", None)
        return self._obs_to_torch(obs), self._info_to_torch(info)

    def _check_identical_groups(self, obs, group_size: int, seeds: list[int]) -> None:
        num_groups = self.num_envs // group_size
        for leaf in _numpy_leaves(obs):
            grouped = leaf.reshape(num_groups, group_size, -1)
            differs = ~np.all(grouped == grouped[:, :1], axis=(1, 2))
            if differs.any():
                group = int(np.flatnonzero(differs)[0])
                env_name = self.env.spec.id if self.env.spec is not None else str(self.env)
                raise ValueError(
                    f"reset(options={{'group_size': {group_size}}}): {env_name} can't give identical starts: "
                    f"the envs of group {group} were all reset with seed {seeds[group * group_size]} but "
                    "their first observations differ (its reset ignores the seed or is not deterministic)"
                )

    def step(self, actions):
        """Step all sub-envs; finished envs are already reset (SAME_STEP), see ``info["final_obs"]``."""
        obs, reward, terminated, truncated, info = self.env.step(self._actions_to_numpy(actions))
        done = np.logical_or(terminated, truncated)
        final_obs = info.pop("final_obs", None)
        info.pop("_final_obs", None)
        final_info = info.pop("final_info", {})
        info.pop("_final_info", None)
        success = self._pop_success(info, final_info, done)

        out = self._info_to_torch(info)
        obs_t = self._obs_to_torch(obs)
        if done.any():
            # Dense final_obs: the current obs, with the rows of finished envs replaced by their last obs.
            space = self.env.single_observation_space
            rows = list(iterate(space, obs))
            for i in np.flatnonzero(done):
                rows[i] = final_obs[i]
            dense = concatenate(space, rows, create_empty_array(space, self.num_envs))
            out["final_obs"] = self._obs_to_torch(dense)
        else:
            out["final_obs"] = obs_t.clone()
        out["_final_obs"] = torch.as_tensor(done, device=self.device)
        if success is not None:
            out["success"] = torch.as_tensor(success, device=self.device)
        return (
            obs_t,
            torch.as_tensor(reward, dtype=torch.float32, device=self.device),
            torch.as_tensor(terminated, dtype=torch.bool, device=self.device),
            torch.as_tensor(truncated, dtype=torch.bool, device=self.device),
            out,
        )


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
