"""make_env is the one place that decides which backend serves an env id: each kind of id reaches its backend,
seen from what comes back (the env's and its wrappers' types), not from patching the dispatch."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import pytest
import torch
from gymnasium.envs.classic_control.pendulum import PendulumEnv
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

from cleanrl_embodied.shared.envs import BUILTIN_ENV_IDS, BUILTIN_ENVS, make_env
from cleanrl_embodied.shared.envs.gymnasium_backend import GymnasiumToTorch
from cleanrl_embodied.shared.envs.push_cube import PushCubeRLVecEnv
from cleanrl_embodied.shared.envs.wrappers import EpisodeStatistics, FlattenDictObservation, IntervalRandomization
from tests.envs_for_tests import PointReach

HAS_ENVPOOL = importlib.util.find_spec("envpool") is not None
HAS_MANISKILL = importlib.util.find_spec("mani_skill") is not None


def layers(env) -> list[type]:
    """The types of ``env``'s wrappers, outermost first, down to the raw env."""
    out = [type(env)]
    while hasattr(env, "env") and env is not env.unwrapped:
        env = env.env
        out.append(type(env))
    return out


def sub_envs(env) -> list:
    """The unwrapped numpy sub-envs of a Gymnasium-backed env (sync vectorization)."""
    return [e.unwrapped for e in env.unwrapped.envs]


def test_builtin_ids_reach_their_task_through_gymnasium():
    assert BUILTIN_ENV_IDS == tuple(BUILTIN_ENVS) and "PushCubeRL" in BUILTIN_ENVS
    for env_id, entry_point in BUILTIN_ENVS.items():
        task = gym.envs.registration.load_env_creator(entry_point)
        env = make_env(env_id, num_envs=2, seed=0)
        assert layers(env) == [EpisodeStatistics, task]  # state obs: nothing to flatten
        assert type(gym.make_vec(env_id, num_envs=2).unwrapped) is task  # registered with Gymnasium too
    assert layers(make_env("PushCubeRL", num_envs=2, obs_mode="dict")) == [
        FlattenDictObservation,
        EpisodeStatistics,
        PushCubeRLVecEnv,
    ]
    # EnvPool serves Gymnasium ids only: a built-in id stays with its task
    assert type(make_env("PushCubeRL", num_envs=2, vectorization="envpool").unwrapped) is PushCubeRLVecEnv


@pytest.mark.parametrize("vectorization, vector_class", [("sync", SyncVectorEnv), ("async", AsyncVectorEnv)])
def test_gymnasium_ids_reach_numpy_sub_envs_behind_gymnasium_to_torch(vectorization, vector_class):
    env = make_env("Pendulum-v1", num_envs=2, seed=0, vectorization=vectorization)
    try:
        assert type(env) is GymnasiumToTorch and type(env.env) is vector_class
        obs, _ = env.reset()
        assert isinstance(obs, torch.Tensor) and obs.shape == (2, 3)
        if vectorization == "sync":
            assert [type(e) for e in sub_envs(env)] == [PendulumEnv, PendulumEnv]
    finally:
        env.close()


def test_module_ids_import_the_module_then_reach_the_gymnasium_backend():
    env = make_env("tests.envs_for_tests:PointReachDict-v0", num_envs=3, seed=0)
    assert layers(env)[:2] == [FlattenDictObservation, GymnasiumToTorch]
    assert [type(e) for e in sub_envs(env)] == [PointReach] * 3


def test_make_env_own_randomize_interval_wraps_whatever_backend_served_the_id():
    assert type(make_env("PushCubeRL", num_envs=2, randomize_interval=5)) is IntervalRandomization
    with pytest.raises(ValueError, match=r"randomize_interval: SyncVectorEnv has no randomize_parameters\(\)"):
        make_env("Pendulum-v1", num_envs=2, randomize_interval=5)  # reached the wrapper, which refuses


@pytest.mark.skipif(HAS_ENVPOOL, reason="envpool is installed (its own tests cover the backend)")
def test_envpool_vectorization_reaches_the_envpool_backend():
    with pytest.raises(ValueError) as err:
        make_env("Pendulum-v1", num_envs=2, vectorization="envpool")
    assert str(err.value).startswith("--env-vectorization envpool needs the envpool package")  # envpool_backend.py


@pytest.mark.skipif(not HAS_ENVPOOL, reason="needs the envpool extra")
def test_envpool_vectorization_returns_the_envpool_adapter():
    from cleanrl_embodied.shared.envs.envpool_backend import EnvPoolToTorch

    assert type(make_env("HalfCheetah-v5", num_envs=2, vectorization="envpool")) is EnvPoolToTorch


FAKE_MS_ID = "CleanrlEmbodiedDispatchFakeManiSkill-v0"


@pytest.mark.skipif(HAS_MANISKILL, reason="mani_skill is installed (its own tests cover the backend)")
def test_maniskill_ids_reach_the_maniskill_backend_whatever_the_vectorization():
    """An id that ManiSkill registered (its entry point lives in mani_skill) goes to maniskill.py, which imports
    mani_skill first: here, where it is missing, that import is what fails, in maniskill.py's words."""
    gym.register(FAKE_MS_ID, entry_point="mani_skill.envs.fake_for_tests:FakeEnv")  # never imported
    try:
        for vectorization in ("sync", "envpool"):
            with pytest.raises(ValueError) as err:
                make_env(FAKE_MS_ID, num_envs=2, vectorization=vectorization)
            assert str(err.value).startswith("mani_skill is installed but can't be imported")
    finally:
        gym.registry.pop(FAKE_MS_ID)
