"""make_env's backend for registered numpy Gymnasium ids, beside maniskill_backend.py and envpool_backend.py.

- :func:`make_gymnasium_env`: ``gym.make_vec`` sub-envs (sync or async; an id with only a vector entry point as it
  is), then :func:`numpy_vector_to_torch`; MuJoCo's deprecation noise kept out of the console.
- :func:`numpy_vector_to_torch`: a numpy Gymnasium vector env -> the full contract (:class:`GymnasiumToTorch` with
  actions rescaled and clipped and episode statistics, FlattenDictObservation for Dict spaces).
- :class:`GymnasiumToTorch`: a numpy Gymnasium vector env (SAME_STEP autoreset) -> torch tensors on a device, with a
  dense ``info["final_obs"]``, a correct ``info["success"]`` and group resets for GRPO; it steps a
  ``SyncVectorEnv``'s sub-envs itself, and its per-step work is numpy plus one ``torch.from_numpy`` per output (the
  contract costs little next to the physics).

See ``docs/env-contract.md`` and ``docs/internals.md``."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate
from gymnasium.wrappers.utils import rescale_box
from tensordict import TensorDict

from cleanrl_embodied.shared.envs.numpy_to_torch import (
    INFO_KEYS,
    float32_space,
    info_key_filter,
    last_step_entries,
    numeric_info_to_torch,
    numpy_leaves,
    sub_env_tasks,
)
from cleanrl_embodied.shared.envs.render import MUJOCO_RENDER_HINT, RenderFirstEnv, SafeRender, env_name
from cleanrl_embodied.shared.envs.wrappers import FlattenDictObservation, flattens
from cleanrl_embodied.shared.language import encode_instructions

__all__ = ["GymnasiumToTorch", "QUIET_MUJOCO_WARNINGS", "make_gymnasium_env", "numpy_vector_to_torch", "quiet_mujoco"]


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
        self.single_observation_space = float32_space(env.single_observation_space)
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
        for leaf in numpy_leaves(obs):
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


def offers_rgb_array(env_id: str) -> bool:
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
    if "render_mode" not in env_kwargs and offers_rgb_array(env_id):
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
