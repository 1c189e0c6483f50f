"""Tests of the torch env contract: make_env, GymnasiumToTorch, FlattenDictObservation, EpisodeStatistics."""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control.pendulum import PendulumEnv

from cleanrl_embodied.shared import BUILTIN_ENV_IDS, check_env_id, make_env
from cleanrl_embodied.shared.envs.wrappers import EpisodeStatistics

# ---------------------------------------------------------------------------------------------------
# A tiny Gymnasium env with a nested Dict observation space and an "is_success" info key.
# Episodes last 3 steps (terminated); "is_success" is False at t=1, True at t=2 and t=3, and the reset
# info says False, so a wrapper that reads the top-level info of a finished env (SAME_STEP: that info
# belongs to the new episode) reports False at the terminal step.
# ---------------------------------------------------------------------------------------------------
DICT_ENV_ID = "CleanrlEmbodiedDictTest-v0"
_reset_counter = itertools.count()


class DictSuccessEnv(gym.Env):
    # Keys given unsorted (a sequence keeps its order in gymnasium's Dict): flattening must sort them.
    observation_space = gym.spaces.Dict(
        [
            ("b", gym.spaces.Box(-1.0, 1.0, (2,), np.float32)),
            (
                "a",
                gym.spaces.Dict(
                    [
                        ("y", gym.spaces.Box(0.0, 10.0, (1,), np.float32)),
                        ("x", gym.spaces.Box(-5.0, 5.0, (3,), np.float32)),
                    ]
                ),
            ),
        ]
    )
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, ignore_seed: bool = False):
        self.ignore_seed = ignore_seed

    def _obs(self):
        s = np.float32(self.start)
        x = np.array([0.1, 0.2, 0.3], np.float32) + s + self.t
        return {"b": np.array([s, -s], np.float32), "a": {"y": np.array([s + 1], np.float32), "x": x}}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        # ignore_seed: every reset starts elsewhere, whatever the seed (can't give identical group starts)
        self.start = (next(_reset_counter) % 100) / 100 if self.ignore_seed else self.np_random.uniform(-1, 1)
        self.t = 0
        return self._obs(), {"is_success": False}

    def step(self, action):
        self.t += 1
        return self._obs(), float(self.t), self.t == 3, False, {"is_success": self.t >= 2}


if DICT_ENV_ID not in gym.registry:
    gym.register(DICT_ENV_ID, entry_point=DictSuccessEnv)


def _flat(o) -> np.ndarray:
    """Hand-flattened observation in sorted key order: a/x, a/y, b."""
    return np.concatenate([o["a"]["x"], o["a"]["y"], o["b"]])


def _flat_by_hand(start: float, t: int) -> list[float]:
    """DictSuccessEnv's observation at step t, flattened: a/x (3), a/y (1), b (2)."""
    s = np.float32(start)
    return [s + 0.1 + t, s + 0.2 + t, s + 0.3 + t, s + 1, s, -s]


# ---------------------------------------------------------------------------------------------------
# Pendulum-v1 through make_env
# ---------------------------------------------------------------------------------------------------
def test_pendulum_shapes_dtypes_device():
    env = make_env("Pendulum-v1", num_envs=3, device="cpu", seed=0)
    assert isinstance(env.single_observation_space, gym.spaces.Box)
    assert env.single_observation_space.shape == (3,) and env.single_observation_space.dtype == np.float32
    assert env.single_action_space == gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    obs, info = env.reset()
    assert obs.shape == (3, 3) and obs.dtype == torch.float32 and obs.device.type == "cpu"
    obs, reward, terminated, truncated, info = env.step(torch.zeros(3, 1))
    assert obs.shape == (3, 3) and obs.dtype == torch.float32
    assert reward.shape == (3,) and reward.dtype == torch.float32
    assert terminated.dtype == torch.bool and truncated.dtype == torch.bool and terminated.shape == (3,)
    assert info["final_obs"].shape == (3, 3) and info["_final_obs"].dtype == torch.bool
    assert info["episode"]["r"].dtype == torch.float32 and info["episode"]["l"].dtype == torch.int32
    assert not any(isinstance(v, np.ndarray) for v in info.values())
    env.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pendulum_on_cuda():
    env = make_env("Pendulum-v1", num_envs=2, device="cuda", seed=0)
    obs, _ = env.reset()
    obs, reward, terminated, truncated, info = env.step(torch.zeros(2, 1, device="cuda"))
    for t in (obs, reward, terminated, truncated, info["final_obs"], info["episode"]["r"]):
        assert t.device.type == "cuda"
    env.close()


def test_pendulum_actions_rescaled_and_clipped(monkeypatch):
    seen = []
    original_step = PendulumEnv.step

    def spy_step(self, u):
        seen.append(np.array(u, dtype=np.float64).copy())
        return original_step(self, u)

    monkeypatch.setattr(PendulumEnv, "step", spy_step)
    env = make_env("Pendulum-v1", num_envs=5, seed=0)
    env.reset()
    env.step(torch.tensor([[-1.0], [0.5], [1.0], [7.0], [-3.0]]))
    np.testing.assert_array_equal(np.concatenate(seen), [-2.0, 1.0, 2.0, 2.0, -2.0])
    env.close()


def test_pendulum_same_step_autoreset_matches_plain_gymnasium():
    """Final obs at the truncation step, the reset obs, and every reward match plain Gymnasium envs."""
    num_envs, seed = 2, 3
    env = make_env("Pendulum-v1", num_envs=num_envs, seed=seed)
    refs = [gym.make("Pendulum-v1") for _ in range(num_envs)]
    obs, _ = env.reset()  # make_env's seed: sub-env i gets seed + i
    ref_obs = np.stack([ref.reset(seed=seed + i)[0] for i, ref in enumerate(refs)])
    np.testing.assert_array_equal(obs.numpy(), ref_obs)

    rng = np.random.default_rng(0)
    returns = np.zeros(num_envs)
    for t in range(1, 206):
        action = rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0], size=(num_envs, 1))  # exact in binary after x2
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(action, dtype=torch.float32))
        ref_steps = [ref.step(2.0 * action[i]) for i, ref in enumerate(refs)]
        ref_obs = np.stack([s[0] for s in ref_steps])
        ref_reward = np.array([s[1] for s in ref_steps])
        ref_truncated = np.array([s[3] for s in ref_steps])
        returns += ref_reward
        # Every step, including the first one after the autoreset, is a real transition.
        np.testing.assert_allclose(reward.numpy(), ref_reward, rtol=1e-6)
        assert not terminated.any()
        assert truncated.tolist() == ref_truncated.tolist() == [t == 200] * num_envs
        assert info["_final_obs"].tolist() == info["_episode"].tolist() == [t == 200] * num_envs
        if t == 200:
            np.testing.assert_array_equal(info["final_obs"].numpy(), ref_obs)
            ref_obs = np.stack([ref.reset()[0] for ref in refs])  # SyncVectorEnv resets without a seed
            np.testing.assert_allclose(info["episode"]["r"].numpy(), returns, rtol=1e-4)
            assert info["episode"]["l"].tolist() == [200] * num_envs
            returns[:] = 0.0
        np.testing.assert_array_equal(obs.numpy(), ref_obs)
    env.close()
    for ref in refs:
        ref.close()


# ---------------------------------------------------------------------------------------------------
# Dict observations, success, group resets (custom env)
# ---------------------------------------------------------------------------------------------------
def test_dict_obs_flattened_in_sorted_key_order_and_success_from_final_info():
    env = make_env(DICT_ENV_ID, num_envs=2, seed=0)
    space = env.single_observation_space
    assert isinstance(space, gym.spaces.Box) and space.shape == (6,) and space.dtype == np.float32
    np.testing.assert_array_equal(space.low, [-5, -5, -5, 0, -1, -1])
    np.testing.assert_array_equal(space.high, [5, 5, 5, 10, 1, 1])

    subs = [e.unwrapped for e in env.unwrapped.envs]
    obs, info = env.reset()
    assert "success" not in info and "is_success" not in info
    np.testing.assert_allclose(obs.numpy(), np.stack([_flat(e._obs()) for e in subs]))
    expected_success = {1: False, 2: True, 3: True, 4: False}
    for t in range(1, 5):
        old_starts = [e.start for e in subs]
        obs, reward, terminated, truncated, info = env.step(torch.zeros(2, 1))
        assert obs.shape == (2, 6) and obs.dtype == torch.float32
        np.testing.assert_allclose(obs.numpy(), np.stack([_flat(e._obs()) for e in subs]))
        assert info["success"].dtype == torch.bool
        assert info["success"].tolist() == [expected_success[t]] * 2
        assert "is_success" not in info and "final_info" not in info
        if t == 3:
            assert terminated.all() and info["_final_obs"].all()
            # final rows: the terminal obs (t=3) of the old episode; obs: the new episode's first one
            new_starts = [e.start for e in subs]
            assert new_starts != old_starts
            np.testing.assert_allclose(info["final_obs"].numpy(), [_flat_by_hand(s, 3) for s in old_starts])
            np.testing.assert_allclose(obs.numpy(), [_flat_by_hand(s, 0) for s in new_starts])
            assert info["episode"]["success"].tolist() == [1.0, 1.0]
            assert info["episode"]["r"].tolist() == [6.0, 6.0] and info["episode"]["l"].tolist() == [3, 3]
    env.close()


def test_group_reset_identical_within_groups_and_different_across():
    env = make_env(DICT_ENV_ID, num_envs=6, seed=1)
    for seed in (None, 10):
        obs, _ = env.reset(seed=seed, options={"group_size": 3})
        assert torch.equal(obs[0], obs[1]) and torch.equal(obs[0], obs[2])
        assert torch.equal(obs[3], obs[4]) and torch.equal(obs[3], obs[5])
        assert not torch.equal(obs[0], obs[3])
    first, _ = env.reset(options={"group_size": 2})
    second, _ = env.reset(options={"group_size": 2})
    assert not torch.equal(first, second)  # fresh group seeds each time
    env.close()
    # The fresh group seeds come from a generator seeded by make_env's seed: reproducible.
    starts = []
    for _ in range(2):
        env = make_env(DICT_ENV_ID, num_envs=6, seed=1)
        env.reset()
        starts.append(env.reset(options={"group_size": 2})[0])
        env.close()
    assert torch.equal(starts[0], starts[1])


def test_group_reset_errors():
    env = make_env(DICT_ENV_ID, num_envs=4, seed=0, ignore_seed=True)
    with pytest.raises(ValueError, match="identical starts") as err:
        env.reset(options={"group_size": 2})
    assert "\n" not in str(err.value)
    env.close()

    env = make_env(DICT_ENV_ID, num_envs=3, seed=0)
    with pytest.raises(ValueError, match="group_size=2") as err:
        env.reset(options={"group_size": 2})
    assert "\n" not in str(err.value) and "num_envs=3" in str(err.value)
    env.close()


# ---------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------
def test_unknown_env_id_is_one_clear_line():
    with pytest.raises(ValueError) as err:
        make_env("NoSuchEnv-v0", num_envs=2)
    message = str(err.value)
    assert "\n" not in message and "PushCubeRL" in message and "NoSuchEnv-v0" in message
    assert "--extra mujoco" in message and "--extra maniskill" in message
    with pytest.raises(ValueError):
        check_env_id("NoSuchEnv-v0")
    check_env_id("Pendulum-v1")
    for env_id in BUILTIN_ENV_IDS:
        check_env_id(env_id)


def test_non_box_action_space_is_one_clear_line():
    with pytest.raises(ValueError, match="Discrete") as err:
        make_env("CartPole-v1", num_envs=2)
    assert "\n" not in str(err.value)


def test_bad_num_envs():
    with pytest.raises(ValueError, match="num-envs"):
        make_env("Pendulum-v1", num_envs=0)


# ---------------------------------------------------------------------------------------------------
# EpisodeStatistics on a scripted torch vector env
# ---------------------------------------------------------------------------------------------------
class ScriptedTorchVecEnv(gym.vector.VectorEnv):
    """Replays scripted rewards / terminations / truncations / successes, one row per step."""

    def __init__(self, rewards, terminated, truncated, success=None):
        self.num_envs = len(rewards[0])
        self.single_observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.script = (rewards, terminated, truncated, success)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        return torch.zeros(self.num_envs, 1), {}

    def step(self, actions):
        rewards, terminated, truncated, success = self.script
        t, self.t = self.t, self.t + 1
        info = {} if success is None else {"success": torch.tensor(success[t])}
        obs = torch.zeros(self.num_envs, 1)
        return obs, torch.tensor(rewards[t]), torch.tensor(terminated[t]), torch.tensor(truncated[t]), info


def test_episode_statistics_hand_count():
    rewards = [[1.0, 0.5], [2.0, 0.5], [3.0, 0.5], [10.0, 0.5], [1.0, 2.0]]
    terminated = [[False, False], [False, False], [True, False], [False, False], [True, False]]
    truncated = [[False, False], [False, False], [False, False], [False, True], [False, False]]
    success = [[False, True], [False, False], [True, False], [True, False], [False, True]]
    env = EpisodeStatistics(ScriptedTorchVecEnv(rewards, terminated, truncated, success))
    env.reset()
    dones = []
    for _ in range(5):
        *_, info = env.step(torch.zeros(2, 1))
        dones.append(info["_episode"].tolist())
        if info["_episode"][0]:
            episode_0 = {k: v[0].item() for k, v in info["episode"].items()}
        if info["_episode"][1]:
            episode_1 = {k: v[1].item() for k, v in info["episode"].items()}
        if len(dones) == 3:  # env 0 finished at step 3: 1 + 2 + 3, success at its last step
            assert episode_0 == {"r": 6.0, "l": 3, "success": 1.0}
    assert dones == [[False, False], [False, False], [True, False], [False, True], [True, False]]
    assert episode_0 == {"r": 11.0, "l": 2, "success": 0.0}  # second episode: 10 + 1, failed at the end
    assert episode_1 == {"r": 2.0, "l": 4, "success": 0.0}  # succeeded at step 1 only: not at its last step
    assert info["episode"]["r"].dtype == torch.float32 and info["episode"]["l"].dtype == torch.int32

    # A reset restarts the counts; an env without a success signal reports success 0.
    env = EpisodeStatistics(ScriptedTorchVecEnv(rewards, terminated, truncated))
    env.reset()
    env.step(torch.zeros(2, 1))
    env.reset()
    env.env.t = 1
    env.step(torch.zeros(2, 1))
    *_, info = env.step(torch.zeros(2, 1))
    assert info["_episode"].tolist() == [True, False]
    assert info["episode"]["r"][0].item() == 5.0 and info["episode"]["l"][0].item() == 2
    assert info["episode"]["success"].tolist() == [0.0, 0.0]


# ---------------------------------------------------------------------------------------------------
# PushCubeRL
# ---------------------------------------------------------------------------------------------------
def test_push_cube_contract():
    env = gym.make_vec("PushCubeRL", num_envs=4)
    dict_env = make_env("PushCubeRL", 4, obs_mode="dict", seed=0)
    for e in (env, dict_env):
        assert isinstance(e.single_observation_space, gym.spaces.Box)
        obs, _ = e.reset(seed=0)
        assert obs.shape == (4, 31) and obs.dtype == torch.float32
        obs, reward, terminated, truncated, info = e.step(torch.zeros(4, *e.single_action_space.shape))
        assert obs.shape == (4, 31) and obs.dtype == torch.float32
        assert reward.shape == (4,) and reward.dtype == torch.float32
        assert terminated.dtype == torch.bool and truncated.dtype == torch.bool
        assert info["final_obs"].shape == (4, 31) and info["_final_obs"].dtype == torch.bool
        assert set(info["episode"]) == {"r", "l", "success"} and info["_episode"].shape == (4,)
        e.close()


def test_interval_randomization_resamples_parameters_every_k_steps():
    env = make_env("PushCubeRL", num_envs=64, seed=0, push_friction_range=(0.5, 1.5), randomize_interval=3)
    env.reset(seed=0)
    raw = env.unwrapped
    before = raw.push_friction.clone()
    actions = torch.zeros(64, 7)
    env.step(actions)
    env.step(actions)
    assert torch.equal(raw.push_friction, before)  # not yet
    env.step(actions)
    assert not torch.equal(raw.push_friction, before)  # the 3rd step fired the event
    assert ((raw.push_friction >= 0.5) & (raw.push_friction <= 1.5)).all()
    assert env.num_events == 1
    with pytest.raises(ValueError, match="randomize_interval"):
        make_env("Pendulum-v1", num_envs=2, randomize_interval=5)
    with pytest.raises(ValueError, match="randomize_interval"):
        make_env("PushCubeRL", num_envs=2, randomize_interval=0)


def test_env_state_dict_continues_episode_statistics_and_interval_counters_exactly():
    """A PushCubeRL stack (with interval randomization) restored from env_state_dict() into a fresh make_env
    continues exactly: same observations, same episode returns/lengths for episodes spanning the restore."""
    from cleanrl_embodied.shared import env_state_dict, load_env_state_dict

    kwargs = dict(num_envs=16, device="cpu", seed=3, randomize_interval=7, push_friction_range=[0.5, 1.5])
    gen = torch.Generator().manual_seed(0)
    actions = [torch.rand(16, 7, generator=gen) * 2 - 1 for _ in range(120)]
    a = make_env("PushCubeRL", **kwargs)
    a.reset(seed=3)
    for act in actions[:50]:
        a.step(act)
    state = env_state_dict(a)
    assert set(state) == {"IntervalRandomization", "EpisodeStatistics", "PushCubeRLVecEnv"}
    assert state["EpisodeStatistics"]["length"].device.type == "cpu"
    b = make_env("PushCubeRL", **kwargs)
    b.reset(seed=99)  # a different state, overwritten by the restore
    load_env_state_dict(b, state)
    episodes = 0
    for act in actions[50:]:
        out_a, out_b = a.step(act), b.step(act)
        assert torch.equal(out_a[0], out_b[0]) and torch.equal(out_a[1], out_b[1])
        ia, ib = out_a[4], out_b[4]
        assert torch.equal(ia["_episode"], ib["_episode"])
        for key in ("r", "l"):
            assert torch.equal(ia["episode"][key][ia["_episode"]], ib["episode"][key][ib["_episode"]])
        episodes += int(ia["_episode"].sum())
    assert episodes > 0
    assert make_env("Pendulum-v1", num_envs=2) is not None and env_state_dict(make_env("Pendulum-v1")) is None
