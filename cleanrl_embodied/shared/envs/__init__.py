"""Environments behind one torch vector-env contract: ``make_env``, ``check_env_id``, ``BUILTIN_ENV_IDS``.

``make_env(env_id, num_envs, device, seed, **env_kwargs)`` returns a ``gymnasium.vector.VectorEnv`` whose
data are torch tensors on ``device`` (see "The env contract" in ``CONVENTIONS.md``):

- ``"PushCubeRL"``: the built-in batched torch task, registered with Gymnasium on import, so
  ``gymnasium.make_vec("PushCubeRL", num_envs=N, device=...)`` works too.
- any other registered Gymnasium id with a Box action space: numpy sub-envs (SAME_STEP autoreset) ->
  clip + rescale actions so the policy acts in [-1, 1] -> :class:`GymnasiumToTorch`
  -> :class:`FlattenDictObservation` for Dict observations -> :class:`EpisodeStatistics`.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.wrappers.vector import RescaleAction, TransformAction

from cleanrl_embodied.shared.envs.wrappers import (
    EpisodeStatistics,
    FlattenDictObservation,
    GymnasiumToTorch,
    IntervalRandomization,
)

__all__ = ["BUILTIN_ENV_IDS", "check_env_id", "make_env"]

BUILTIN_ENV_IDS = ("PushCubeRL",)


def _make_push_cube_vec(
    num_envs: int = 1, device: torch.device | str = "cpu", seed: int | None = None, **kwargs
) -> VectorEnv:
    """Gymnasium ``vector_entry_point`` of PushCubeRL: the raw torch task plus episode statistics."""
    from cleanrl_embodied.shared.envs.push_cube import PushCubeRLVecEnv  # lazy: torch task, heavier import

    return EpisodeStatistics(PushCubeRLVecEnv(num_envs=num_envs, device=device, seed=seed, **kwargs))


if "PushCubeRL" not in gym.registry:  # importing this module twice (or reloading it) must not re-register
    gym.register(id="PushCubeRL", vector_entry_point=_make_push_cube_vec)


def check_env_id(env_id: str) -> None:
    """Raise a one-line ``ValueError`` if ``env_id`` is neither built in nor a registered Gymnasium id."""
    if env_id in BUILTIN_ENV_IDS or env_id in gym.registry:
        return
    # ManiSkill ids: accepted here once the ManiSkill adapter exists (separate issue).
    raise ValueError(
        f"--env-id {env_id!r} is unknown: use a built-in id ({', '.join(BUILTIN_ENV_IDS)}) or any registered "
        "Gymnasium id (e.g. Pendulum-v1); MuJoCo ids need `uv sync --extra mujoco`, "
        "ManiSkill ids need `uv sync --extra maniskill`"
    )


def make_env(
    env_id: str,
    num_envs: int = 1,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    **env_kwargs,
) -> VectorEnv:
    """Build ``num_envs`` copies of ``env_id`` behind the torch env contract, on ``device``.

    ``seed`` seeds the first ``reset()`` called with ``seed=None``. ``env_kwargs`` go to the env constructor;
    for Gymnasium ids, ``vectorization="async"`` selects ``AsyncVectorEnv`` (default ``"sync"``);
    ``randomize_interval=K`` resamples the env's randomized parameters every K steps (IntervalRandomization).
    Bad input (unknown id, bad ``num_envs``, non-Box action space, missing extra) raises a one-line
    ValueError.
    """
    check_env_id(env_id)
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise ValueError(f"--num-envs must be a positive integer, got {num_envs!r}")
    num_envs = int(num_envs)

    randomize_interval = env_kwargs.pop("randomize_interval", None)
    if env_id == "PushCubeRL":
        env = gym.make_vec("PushCubeRL", num_envs=num_envs, device=device, seed=seed, **env_kwargs)
        if isinstance(env.single_observation_space, gym.spaces.Dict):
            env = FlattenDictObservation(env)
    else:
        # ManiSkill ids (GPU-batched torch envs) get their own branch here (separate issue).
        env = _make_gymnasium_env(env_id, num_envs, device, seed, **env_kwargs)
    if randomize_interval is not None:
        env = IntervalRandomization(env, randomize_interval)
    return env


def _make_gymnasium_env(env_id: str, num_envs: int, device, seed: int | None, **env_kwargs) -> VectorEnv:
    """A registered numpy Gymnasium id -> the torch env contract."""
    vectorization = env_kwargs.pop("vectorization", "sync")
    if vectorization not in ("sync", "async"):
        raise ValueError(f"vectorization must be 'sync' or 'async', got {vectorization!r}")
    try:
        env = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode=vectorization,
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            **env_kwargs,
        )
    except gym.error.DependencyNotInstalled as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(
            f"--env-id {env_id!r} needs a package that is not installed ({reason}); "
            "MuJoCo ids need `uv sync --extra mujoco`, ManiSkill ids need `uv sync --extra maniskill`"
        ) from None

    try:
        space = env.single_action_space
        if not isinstance(space, gym.spaces.Box):
            raise ValueError(
                f"--env-id {env_id!r} has a {type(space).__name__} action space; "
                "make_env supports continuous (Box) action spaces only"
            )
        # Actions: clip to the env's bounds (innermost, so the env never sees an out-of-bound action,
        # rounding included), then let RescaleAction map the policy's [-1, 1] onto those bounds.
        # Gymnasium's ClipAction would do the clip but declares an infinite action space, after which
        # RescaleAction can't be applied and the trainer would not see [-1, 1]; TransformAction keeps
        # the space.
        low, high = space.low, space.high
        env = TransformAction(env, func=lambda actions: np.clip(actions, low, high))
        if np.all(np.isfinite(low) & np.isfinite(high)):  # unbounded actions stay in the env's own scale
            ones = np.ones(space.shape, dtype=space.dtype)  # in the space's dtype: no precision warning
            env = RescaleAction(env, min_action=-ones, max_action=ones)
        env = GymnasiumToTorch(env, device=device, seed=seed)
        if isinstance(env.single_observation_space, gym.spaces.Dict):
            env = FlattenDictObservation(env)
    except ValueError:
        env.close()
        raise
    return EpisodeStatistics(env)
