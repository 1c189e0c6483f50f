"""``make_env(..., vectorization="envpool")``: an EnvPool batch (C++ threads, extra ``envpool``) behind the torch env
contract, with Gymnasium's SAME_STEP autoreset and TimeLimit semantics.

EnvPool's own autoreset (envpool 1.2.x, its Gymnasium API declares ``AutoresetMode.NEXT_STEP``): the step where an
episode ends returns its last obs with ``terminated``/``truncated``; the *next* ``step`` of that env ignores its
action and returns the first obs of a new episode with reward 0 (a filler transition). And its time limit reports
``truncated`` and not ``terminated`` when an env falls at the very last step (``terminated = done & ~trunc``),
where Gymnasium's ``TimeLimit`` reports both.

:class:`EnvPoolToTorch` turns that into the contract exactly:

- the pool is built with a time limit one step longer than the episode's, so EnvPool's limit never fires; the
  wrapper counts episode lengths and sets ``truncated`` at the limit itself (``terminated`` comes from the env:
  a fall at the last step is both, as in Gymnasium);
- at the step where episodes end, their envs are reset at once (EnvPool's partial ``reset(env_ids)``), so
  ``obs`` holds the new episode's first obs and ``info["final_obs"]`` the last obs of the finished one; an env
  reset that way starts its next ``step`` as a real transition, so no filler transition ever exists.

Actions are rescaled from [-1, 1] and clipped as on the Gymnasium path (``rescale_box``), episode statistics are
added, and every output is one ``torch.from_numpy``. ``seed`` seeds the pool (EnvPool seeds env ``i`` from it when
the pool is built); ``reset(seed=s)`` with another seed rebuilds the pool with ``s``. Group resets (GRPO) are
not possible: EnvPool's seeds are fixed per env when the pool is built.
"""

from __future__ import annotations

import difflib
import importlib.util
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import batch_space
from gymnasium.wrappers.utils import rescale_box

from cleanrl_embodied.shared.envs.numpy_to_torch import float32_space, info_key_filter, numeric_info_to_torch

__all__ = ["EnvPoolToTorch", "envpool_ids", "make_envpool_env"]

INSTALL_HINT = "`uv sync --extra mujoco --extra envpool` (Python >= 3.11)"
_BOOKKEEPING_INFO = ("env_id", "players", "elapsed_step")  # EnvPool's own info entries, not the env's


def _import_envpool():
    if importlib.util.find_spec("envpool") is None:
        raise ValueError(f"--env-vectorization envpool needs the envpool package: {INSTALL_HINT}")
    import envpool

    return envpool


def envpool_ids() -> list[str]:
    """The ids the installed EnvPool provides."""
    return list(_import_envpool().list_all_envs())


def _check_envpool_id(env_id: str) -> None:
    ids = envpool_ids()
    if env_id in ids:
        return
    mujoco = sorted(i for i in ids if i.split("-v")[0] in _MUJOCO_NAMES)
    close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.75)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ValueError(
        f"--env-vectorization envpool: EnvPool has no {env_id!r}; {hint}its MuJoCo ids are "
        f"{', '.join(mujoco)} (all {len(ids)}: envpool.list_all_envs()); "
        "other ids run with --env-vectorization sync or async"
    )


_MUJOCO_NAMES = (
    "Ant",
    "HalfCheetah",
    "Hopper",
    "Humanoid",
    "HumanoidStandup",
    "InvertedDoublePendulum",
    "InvertedPendulum",
    "Pusher",
    "Reacher",
    "Swimmer",
    "Walker2d",
)


def make_envpool_env(
    env_id: str, num_envs: int, device: torch.device | str = "cpu", seed: int | None = None, info_keys=(), **env_kwargs
) -> EnvPoolToTorch:
    """``num_envs`` copies of an EnvPool id behind the torch env contract. ``env_kwargs`` go to ``envpool.make``
    (its config keys, e.g. ``max_episode_steps``, ``reset_noise_scale``); Gymnasium's ``render_mode``,
    ``width`` and ``height`` are not EnvPool options and are dropped. ``info_keys``: as for Gymnasium ids."""
    _check_envpool_id(env_id)
    for key in ("render_mode", "width", "height"):
        env_kwargs.pop(key, None)
    return EnvPoolToTorch(env_id, num_envs, device=device, seed=seed, info_keys=info_keys, **env_kwargs)


class EnvPoolToTorch(VectorEnv):
    """An EnvPool batch (synchronous: every ``step`` steps all envs) seen through the torch env contract; see the
    module docstring for how EnvPool's autoreset and time limit become SAME_STEP and Gymnasium's TimeLimit.
    ``self.pool`` is the EnvPool object. ``render()`` returns None (no video) with one warning. Of EnvPool's own
    info entries, ``success``/``is_success`` and those named by ``info_keys`` (``"all"``: every numeric one) are
    passed on, as for Gymnasium ids."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        info_keys=(),
        **env_kwargs,
    ):
        self._all_info, self._info_keys = info_key_filter(info_keys)
        self._info_keys |= {"success", "is_success"}
        envpool = _import_envpool()
        self.env_id, self.num_envs, self.device = env_id, num_envs, torch.device(device)
        self._on_cpu = self.device.type == "cpu"
        try:
            with warnings.catch_warnings():  # Gymnasium warns about EnvPool's float64 bounds of float32 Boxes
                warnings.simplefilter("ignore")
                default_limit = envpool.make_spec(env_id, **env_kwargs).config.max_episode_steps
        except TypeError as e:  # an unknown config key
            raise ValueError(f"envpool {env_id}: {str(e).splitlines()[0]}") from None
        self.max_episode_steps = int(env_kwargs.pop("max_episode_steps", default_limit))
        if self.max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {self.max_episode_steps}")
        self._env_kwargs = env_kwargs
        self._seed = int(seed) if seed is not None else int(np.random.default_rng().integers(2**31 - 1))
        self.pool = self._make_pool(self._seed)
        try:
            self._set_spaces()
        except ValueError:
            self.pool.close()
            raise
        registered = gym.registry.get(env_id)
        self.spec = EnvSpec(
            id=env_id,
            entry_point=registered.entry_point if registered else None,
            max_episode_steps=self.max_episode_steps,
        )
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        self.render_mode = None
        self._warned_render = False
        self._arange = np.arange(num_envs, dtype=np.int32)
        self._episode_return = np.zeros(num_envs, dtype=np.float32)
        self._episode_length = np.zeros(num_envs, dtype=np.int32)

    def _set_spaces(self) -> None:
        env_id, num_envs = self.env_id, self.num_envs
        with warnings.catch_warnings():  # Gymnasium warns about EnvPool's float64 bounds of float32 Boxes
            warnings.simplefilter("ignore")
            space, obs_space = self.pool.action_space, self.pool.observation_space
        if not isinstance(space, gym.spaces.Box):
            raise ValueError(
                f"--env-id {env_id!r} has a {type(space).__name__} action space; "
                "make_env supports continuous (Box) action spaces only"
            )
        self._action_dtype, self._bounds, self._unscale = space.dtype, (space.low, space.high), None
        self.single_action_space = space
        if np.all(np.isfinite(space.low) & np.isfinite(space.high)):
            ones = np.ones(space.shape, dtype=space.dtype)
            self.single_action_space, _, self._unscale = rescale_box(space, -ones, ones)
        self.single_action_space = gym.spaces.Box(
            self.single_action_space.low, self.single_action_space.high, dtype=np.float32
        )
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.single_observation_space = float32_space(obs_space)
        if not isinstance(self.single_observation_space, gym.spaces.Box):
            raise ValueError(f"--env-id {env_id!r}: --env-vectorization envpool supports Box observations only")
        self.observation_space = batch_space(self.single_observation_space, num_envs)

    def _make_pool(self, seed: int):
        import envpool

        with warnings.catch_warnings():  # Gymnasium warns about EnvPool's float64 Box bounds of float32 spaces
            warnings.simplefilter("ignore")
            # One step longer than the episode: this wrapper truncates, so a fall at the limit stays a termination.
            return envpool.make(
                self.env_id,
                env_type="gymnasium",
                num_envs=self.num_envs,
                batch_size=self.num_envs,
                seed=seed,
                max_episode_steps=self.max_episode_steps + 1,
                **self._env_kwargs,
            )

    # ---- conversions -------------------------------------------------------------------------------
    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        return tensor if self._on_cpu else tensor.to(self.device)

    def _actions_to_numpy(self, actions) -> np.ndarray:
        if isinstance(actions, torch.Tensor):
            actions = actions.numpy(force=True)
        actions = np.asarray(actions, dtype=self._action_dtype)
        actions = self._unscale(actions) if self._unscale is not None else actions.copy()
        low, high = self._bounds
        return np.minimum(np.maximum(actions, low, out=actions), high, out=actions)

    def _passes(self, key: str) -> bool:
        """Whether a top-level info entry of EnvPool's is passed on (nested dicts are passed on whole)."""
        return key not in _BOOKKEEPING_INFO and (self._all_info or key in self._info_keys)

    # ---- VectorEnv API -----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset every env. ``seed``: rebuild the pool with this seed (EnvPool seeds only at construction)."""
        if options and options.get("group_size") is not None:
            raise ValueError(
                f"reset(options={{'group_size': ...}}): {self.env_id} with --env-vectorization envpool "
                "can't give identical group starts (EnvPool seeds each env once, when the pool is "
                "built); use --env-vectorization sync"
            )
        if options:
            raise ValueError(f"envpool reset: unsupported options {sorted(options)}")
        if seed is not None and int(seed) != self._seed:
            self.pool.close()
            self._seed = int(seed)
            self.pool = self._make_pool(self._seed)
        obs, info = self.pool.reset()
        self._episode_return[:] = 0.0
        self._episode_length[:] = 0
        obs = np.array(obs, dtype=np.float32)
        if not np.array_equal(info["env_id"], self._arange):
            obs[info["env_id"]] = obs.copy()
        return self._tensor(obs), {}

    def step(self, actions):
        """Step every env; envs whose episode ended are reset in the same call (SAME_STEP)."""
        obs, reward, terminated, _, info = self.pool.step(self._actions_to_numpy(actions))
        env_ids = info["env_id"]
        in_order = env_ids[0] == 0 and np.array_equal(env_ids, self._arange)
        obs = np.array(obs, dtype=np.float32)
        reward = np.asarray(reward, dtype=np.float32)
        terminated = np.array(terminated, dtype=bool)
        if not in_order:  # a synchronous pool answers in env order; this is only a guard
            order = np.argsort(env_ids)
            obs, reward, terminated = obs[order], reward[order], terminated[order]
            info = {k: v[order] for k, v in info.items() if isinstance(v, np.ndarray)}
        episode_return = self._episode_return + reward
        episode_length = self._episode_length + 1
        truncated = episode_length >= self.max_episode_steps
        done = terminated | truncated
        final_obs = obs.copy()
        if done.any():
            ids = np.flatnonzero(done).astype(np.int32)
            reset_obs, reset_info = self.pool.reset(ids)
            obs[reset_info["env_id"]] = reset_obs
        out = numeric_info_to_torch(info, self._tensor, self._passes)
        done_t = self._tensor(done)
        out["final_obs"], out["_final_obs"] = self._tensor(final_obs), done_t
        success = None
        for key in ("success", "is_success"):
            if key in out:
                success = out.pop(key).bool()
                out["success"] = success
        out["episode"] = {
            "r": self._tensor(episode_return),
            "l": self._tensor(episode_length),
            "success": success.float()
            if success is not None
            else self._tensor(np.zeros(self.num_envs, dtype=np.float32)),
        }
        out["_episode"] = done_t
        self._episode_return = np.where(done, np.float32(0.0), episode_return)
        self._episode_length = np.where(done, np.int32(0), episode_length)
        return self._tensor(obs), self._tensor(reward), self._tensor(terminated), self._tensor(truncated), out

    def render(self) -> None:
        if not self._warned_render:
            self._warned_render = True
            warnings.warn(
                f"{self.env_id} with --env-vectorization envpool does not render here; render() returns "
                "None (no video); use --env-vectorization sync for videos",
                RuntimeWarning,
                stacklevel=2,
            )
        return None

    def close_extras(self, **kwargs) -> None:
        self.pool.close()
