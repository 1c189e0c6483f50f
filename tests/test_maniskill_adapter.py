"""The ManiSkill3 adapter: its mapping onto the env contract, checked on a tiny fake that mimics
ManiSkillVectorEnv's API (always runs), and on real ManiSkill where the `maniskill` extra is installed."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from cleanrl_embodied.shared import check_env_id, make_env
from cleanrl_embodied.shared.envs import maniskill_backend
from tests.trainer_args import TWO_ENVS, tiny_args

HAS_MANISKILL = importlib.util.find_spec("mani_skill") is not None
needs_maniskill = pytest.mark.skipif(not HAS_MANISKILL, reason="needs the maniskill extra: uv sync --extra maniskill")


class FakeManiSkillVectorEnv(gym.vector.VectorEnv):
    """Mimics ``mani_skill.vector.wrappers.gymnasium.ManiSkillVectorEnv`` (auto_reset=True) on a 1-D task.

    Each env moves a point by ``0.1 * action`` (action bounds [-2, 2]) towards its goal: success (and
    termination, as in ManiSkill) within 0.05 of it, truncation after ``max_steps``. Obs = [pos, goal, t] as a
    torch tensor (or a nested dict with ``dict_obs``). Like the real wrapper, when envs finish it resets just
    those (``options={"env_idx": ...}``) and returns the reset info, which holds ``success=False`` for every
    env, plus ``final_observation`` / ``final_info`` of the whole batch and their ``_`` masks. The k-th
    partial reset puts the point at ``-1 - k``, so reset obs are recognizable.
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, goals, max_steps=4, dict_obs=False, render_fails=False):
        self.num_envs = len(goals)
        self.device = torch.device("cpu")
        self.goal = torch.tensor(goals, dtype=torch.float32)
        self.max_steps, self.dict_obs, self.render_fails = max_steps, dict_obs, render_fails
        self.single_action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
        if dict_obs:
            self.single_observation_space = gym.spaces.Dict(
                {
                    "pos": gym.spaces.Box(-np.inf, np.inf, (1,), np.float32),
                    "extra": gym.spaces.Dict(
                        {
                            "goal": gym.spaces.Box(-np.inf, np.inf, (1,), np.float32),
                            "t": gym.spaces.Box(0, np.inf, (1,), np.float32),
                        }
                    ),
                }
            )
        else:
            self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.actions_seen, self.reset_calls, self.partial_resets = [], [], 0

    def _obs(self):
        t = self.elapsed.float()
        if self.dict_obs:
            return {"pos": self.pos[:, None].clone(), "extra": {"goal": self.goal[:, None].clone(), "t": t[:, None]}}
        return torch.stack([self.pos, self.goal, t], dim=1)

    def reset(self, *, seed=None, options=None):
        self.reset_calls.append((seed, options))
        if options is not None and "env_idx" in options:
            idx = options["env_idx"]
            self.pos[idx] = -1.0 - self.partial_resets
            self.partial_resets += 1
            self.elapsed[idx] = 0
        else:
            self.pos = torch.zeros(self.num_envs)
            self.elapsed = torch.zeros(self.num_envs, dtype=torch.int32)
        info = {
            "elapsed_steps": self.elapsed.clone(),
            "success": torch.zeros(self.num_envs, dtype=torch.bool),
            "reconfigure": False,
        }
        return self._obs(), info

    def step(self, actions):
        self.actions_seen.append(actions.clone())
        self.pos = self.pos + 0.1 * actions[:, 0]
        self.elapsed = self.elapsed + 1
        success = (self.pos - self.goal).abs() < 0.05
        reward = -(self.pos - self.goal).abs()
        terminated, truncated = success.clone(), self.elapsed >= self.max_steps
        obs = self._obs()
        info = {
            "success": success,
            "fail": torch.zeros_like(success),
            "elapsed_steps": self.elapsed.clone(),
            "dist": (self.pos - self.goal).abs().double(),
        }
        dones = terminated | truncated
        if dones.any():
            final_obs, final_info = obs, info
            obs, info = self.reset(options={"env_idx": torch.arange(self.num_envs)[dones]})
            info.update(
                final_observation=final_obs,
                final_info=final_info,
                _final_info=dones,
                _final_observation=dones,
                _elapsed_steps=dones,
            )
        return obs, reward, terminated, truncated, info

    def render(self):
        if self.render_fails:
            raise RuntimeError("failed to find a rendering device")
        frames = torch.zeros(self.num_envs, 8, 12, 3, dtype=torch.uint8)
        return frames + (10 * torch.arange(1, self.num_envs + 1, dtype=torch.uint8))[:, None, None, None]


def adapted(**kwargs):
    seed = kwargs.pop("seed", None)
    return maniskill_backend.maniskill_vector_to_torch(FakeManiSkillVectorEnv(**kwargs), device="cpu", seed=seed)


# ---------------------------------------------------------------------------------------------------
# The mapping, on the fake
# ---------------------------------------------------------------------------------------------------
def test_final_obs_success_and_episode_statistics():
    env = adapted(goals=[0.4, 10.0], max_steps=4)
    assert env.single_observation_space.shape == (3,) and env.single_action_space == gym.spaces.Box(-1, 1, (1,))
    obs, info = env.reset()
    assert "success" not in info  # a reset describes no transition
    torch.testing.assert_close(obs, torch.tensor([[0.0, 0.4, 0.0], [0.0, 10.0, 0.0]]))
    step = lambda: env.step(torch.ones(2, 1))  # policy 1.0 -> env action 2.0 -> +0.2 per step

    obs, reward, terminated, truncated, info = step()
    assert reward.dtype == torch.float32 and terminated.dtype == truncated.dtype == torch.bool
    assert info["success"].tolist() == [False, False] and info["_final_obs"].tolist() == [False, False]
    torch.testing.assert_close(info["final_obs"], obs)

    obs, reward, terminated, truncated, info = step()  # env 0 reaches its goal: success, terminated
    assert terminated.tolist() == [True, False] and truncated.tolist() == [False, False]
    assert info["success"].tolist() == [True, False]  # from final_info, not the reset info (all False)
    assert info["_final_obs"].tolist() == [True, False] and info["_episode"].tolist() == [True, False]
    torch.testing.assert_close(info["final_obs"][0], torch.tensor([0.4, 0.4, 2.0]))  # the last obs
    torch.testing.assert_close(obs[0], torch.tensor([-1.0, 0.4, 0.0]))  # SAME_STEP: the new episode's first
    torch.testing.assert_close(info["final_obs"][1], obs[1])
    assert info["episode"]["l"][0].item() == 2 and info["episode"]["success"][0].item() == 1.0
    assert info["episode"]["r"][0].item() == pytest.approx(-0.2 - 0.0, abs=1e-6)
    assert info["dist"].dtype == torch.float32 and "final_info" not in info and "final_observation" not in info
    assert not any(k.startswith("_final_info") or k == "reconfigure" for k in info)

    step()
    obs, reward, terminated, truncated, info = step()  # env 1 hits the time limit at step 4
    assert truncated.tolist() == [False, True] and info["success"].tolist() == [False, False]
    assert info["episode"]["l"][1].item() == 4 and info["episode"]["success"][1].item() == 0.0
    torch.testing.assert_close(info["final_obs"][1], torch.tensor([0.8, 10.0, 4.0]))
    torch.testing.assert_close(obs[1], torch.tensor([-2.0, 10.0, 0.0]))
    env.close()


def test_actions_rescaled_and_clipped_at_the_boundary():
    env = adapted(goals=[5.0, 5.0, 5.0, 5.0])
    fake = env.unwrapped
    env.reset()
    env.step(torch.tensor([[-1.0], [0.5], [7.0], [-3.0]]))
    torch.testing.assert_close(fake.actions_seen[-1], torch.tensor([[-2.0], [1.0], [2.0], [-2.0]]))
    env.step(np.array([[0.0], [0.25], [1.0], [-1.0]], dtype=np.float32))  # numpy actions too
    torch.testing.assert_close(fake.actions_seen[-1], torch.tensor([[0.0], [0.5], [2.0], [-2.0]]))


def test_seed_goes_to_the_first_reset_and_group_resets_are_refused():
    env = adapted(goals=[1.0, 1.0], seed=7)
    fake = env.unwrapped
    env.reset()
    env.reset()
    env.reset(seed=3, options={"group_size": 1})
    assert [call[0] for call in fake.reset_calls] == [7, None, 3]
    with pytest.raises(ValueError, match="group_size") as err:
        env.reset(options={"group_size": 2})
    assert "\n" not in str(err.value)


def test_dict_observations_are_flattened_in_sorted_key_order():
    env = adapted(goals=[0.2, 10.0], dict_obs=True)
    assert env.single_observation_space.shape == (3,)
    obs, _ = env.reset()
    torch.testing.assert_close(obs, torch.tensor([[0.2, 0.0, 0.0], [10.0, 0.0, 0.0]]))  # extra/goal, extra/t, pos
    obs, *_, info = env.step(torch.ones(2, 1))  # env 0 succeeds at once
    torch.testing.assert_close(info["final_obs"][0], torch.tensor([0.2, 1.0, 0.2]))
    torch.testing.assert_close(obs[0], torch.tensor([0.2, 0.0, -1.0]))


def test_render_first_frame_or_none_with_one_warning():
    env = adapted(goals=[1.0, 1.0, 1.0])
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.shape == (8, 12, 3) and (frame == 10).all()  # env 0's frame

    env = adapted(goals=[1.0], render_fails=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert env.render() is None and env.render() is None
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "rendering device" in messages[0] and "Vulkan" in messages[0]


# ---------------------------------------------------------------------------------------------------
# Which ids go to the adapter
# ---------------------------------------------------------------------------------------------------
FAKE_MS_ID = "CleanrlEmbodiedFakeManiSkill-v0"
if FAKE_MS_ID not in gym.registry:
    gym.register(FAKE_MS_ID, entry_point="mani_skill.envs.fake_for_tests:FakeEnv")  # never imported


FAKE_PACKAGES = {  # stand-ins for the parts of mani_skill and sapien that make_env's ManiSkill CPU path imports
    "sapien/__init__.py": "from . import render\n",
    "sapien/render.py": "class RenderMaterial:\n    pass\n",  # constructible: a rendering device exists
    "mani_skill/__init__.py": "",
    "mani_skill/envs/__init__.py": "",
    "mani_skill/envs/fake_for_tests.py": """
import gymnasium as gym
import numpy as np

CREATED = []


class FakeEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, num_envs=1, render_mode=None, **kwargs):
        CREATED.append(dict(kwargs, num_envs=num_envs, render_mode=render_mode))
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(3, 0.5, np.float32), {}

    def step(self, action):
        return np.full(3, float(action[0]), np.float32), 0.0, False, False, {}
""",
    "mani_skill/utils/__init__.py": "",
    "mani_skill/utils/wrappers/__init__.py": "",
    "mani_skill/utils/wrappers/gymnasium.py": """
import gymnasium as gym

WRAPPED = []


class CPUGymWrapper(gym.Wrapper):
    def __init__(self, env, ignore_terminations=False):
        super().__init__(env)
        WRAPPED.append(ignore_terminations)
""",
}


@pytest.fixture
def fake_maniskill(tmp_path, monkeypatch):
    """The fake packages on sys.path for one test; afterwards nothing of them stays imported or cached."""
    for name, text in FAKE_PACKAGES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    maniskill_backend.sapien_can_render.cache_clear()
    yield
    for name in [m for m in sys.modules if m.split(".")[0] in ("mani_skill", "sapien")]:
        del sys.modules[name]
    maniskill_backend.sapien_can_render.cache_clear()


@pytest.mark.skipif(HAS_MANISKILL, reason="real mani_skill is installed (its own tests route real ids)")
def test_maniskill_ids_are_recognized_by_their_registration_and_routed(fake_maniskill):
    """make_env sends an id that ManiSkill registered to the ManiSkill path (nothing replaced: fake packages
    stand in for mani_skill and sapien): each CPU sub-env is built by ManiSkill's gym.make with one env, the
    adapter's defaults and the user's kwargs, behind CPUGymWrapper; a Gymnasium id is not routed there."""
    assert maniskill_backend.is_maniskill_id(FAKE_MS_ID)
    assert not maniskill_backend.is_maniskill_id("Pendulum-v1") and not maniskill_backend.is_maniskill_id("PushCubeRL")
    check_env_id(FAKE_MS_ID)
    env = make_env(FAKE_MS_ID, num_envs=3, seed=1, control_mode="pd_joint_delta_pos")
    created = sys.modules["mani_skill.envs.fake_for_tests"].CREATED
    wrapped = sys.modules["mani_skill.utils.wrappers.gymnasium"].WRAPPED
    expected = {
        "num_envs": 1,
        "obs_mode": "state",
        "reward_mode": "normalized_dense",
        "sim_backend": "physx_cpu",
        "render_mode": "rgb_array",
        "control_mode": "pd_joint_delta_pos",
    }
    assert created[-3:] == [expected] * 3 and wrapped[-3:] == [False] * 3
    obs, _ = env.reset()
    assert obs.shape == (3, 3) and env.single_action_space == gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    obs, *_ = env.step(torch.ones(3, 1))
    assert torch.equal(obs, torch.full((3, 3), 2.0))  # the action rescaled to the env's [-2, 2]
    env.close()
    count = len(created)
    make_env("Pendulum-v1", num_envs=2).close()
    assert len(created) == count


@pytest.mark.skipif(HAS_MANISKILL, reason="mani_skill is installed")
def test_maniskill_id_without_the_extra_is_one_clear_line():
    with pytest.raises(ValueError) as err:
        check_env_id("PushCube-v1")
    assert "\n" not in str(err.value) and "uv sync --extra maniskill" in str(err.value)


# ---------------------------------------------------------------------------------------------------
# Real ManiSkill (extra `maniskill`)
# ---------------------------------------------------------------------------------------------------
@needs_maniskill
def test_real_pushcube_contract_on_the_cpu_backend():
    env = make_env("PushCube-v1", num_envs=2, device="cpu", seed=0)  # physx_cpu: gymnasium-vectorized sub-envs
    assert env.single_action_space == gym.spaces.Box(-1.0, 1.0, env.single_action_space.shape, np.float32)
    obs, info = env.reset()
    assert obs.ndim == 2 and obs.shape[0] == 2 and obs.dtype == torch.float32 and "success" not in info
    act_dim = env.single_action_space.shape[0]
    for t in range(1, 51):  # noqa: B007 -- t is checked after the loop
        obs, reward, terminated, truncated, info = env.step(torch.zeros(2, act_dim))
        assert reward.dtype == torch.float32 and info["success"].dtype == torch.bool
        assert info["final_obs"].shape == obs.shape
        if terminated.any() or truncated.any():
            break
    assert t == 50 and truncated.all()  # zero actions never reach the goal; ManiSkill's 50-step limit
    assert info["episode"]["l"].tolist() == [50, 50] and info["episode"]["success"].tolist() == [0.0, 0.0]
    assert env.spec.max_episode_steps == 50  # declared, for GRPO's horizon
    # group resets (GRPO) through seeded sub-envs: identical starts within a group
    obs, _ = env.reset(options={"group_size": 2})
    assert torch.equal(obs[0], obs[1])
    env.close()


@needs_maniskill
def test_real_maniskill_vector_env_through_the_gpu_path_adapter():
    """ManiSkill's own ManiSkillVectorEnv (1 env on the CPU backend: the GPU one needs CUDA) mapped by
    ManiSkillToTorch: partial-reset autoreset, final_observation -> final_obs."""
    import mani_skill.envs  # noqa: F401
    from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

    kwargs = {**maniskill_backend.MANISKILL_DEFAULTS, "sim_backend": "physx_cpu"}
    if not maniskill_backend.sapien_can_render():
        maniskill_backend._render_free_sapien()
        kwargs.update(render_backend="none")
    raw = ManiSkillVectorEnv(gym.make("PushCube-v1", num_envs=1, **kwargs), auto_reset=True)
    env = maniskill_backend.maniskill_vector_to_torch(raw, device="cpu", seed=0)
    obs, _ = env.reset()
    for t in range(1, 51):  # noqa: B007 -- t is checked after the loop
        previous = obs
        obs, reward, terminated, truncated, info = env.step(torch.zeros(1, env.single_action_space.shape[0]))
        if truncated.any():
            break
    assert t == 50 and info["_final_obs"].tolist() == [True] and info["episode"]["l"].tolist() == [50]
    assert info["success"].dtype == torch.bool and reward.shape == (1,)
    assert (info["final_obs"] - previous).abs().max() < 1e-3  # zero actions: the last obs barely moved
    assert not torch.equal(info["final_obs"], obs)  # obs is the new episode's first
    env.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU backend (physx_cuda) needs CUDA")
@needs_maniskill
def test_real_pushcube_on_the_gpu_backend():
    env = make_env("PushCube-v1", num_envs=16, device="cuda", seed=0)
    obs, _ = env.reset()
    assert obs.device.type == "cuda" and obs.shape[0] == 16
    for _ in range(50):
        obs, reward, terminated, truncated, info = env.step(torch.zeros(16, env.single_action_space.shape[0]))
    assert truncated.all() and info["_episode"].all() and info["episode"]["l"].eq(50).all()
    assert info["final_obs"].device.type == "cuda" and info["success"].dtype == torch.bool
    env.close()


@needs_maniskill
def test_ppo_smoke_run_on_real_pushcube(tmp_path):
    from cleanrl_embodied import ppo_continuous as ppo

    out = ppo.main(
        tiny_args(ppo, tmp_path, TWO_ENVS, env_id="PushCube-v1", num_steps=50, total_timesteps=200, num_minibatches=2,
                  update_epochs=1, capture_video=True)
    )  # fmt: skip
    summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
    assert summary["global_step"] == 200 and summary["eval"]["success_rate"] is not None
    assert math.isfinite(summary["eval"]["episodic_return"])


class FakeRGBManiSkillVectorEnv(FakeManiSkillVectorEnv):
    """The fake with ManiSkill's rgb observation layout: camera images uint8 [N, H, W, 3] under sensor_data and
    the cameras' matrices under sensor_param; the image's red channel at column 0 encodes the point's position."""

    def __init__(self, goals, **kwargs):
        super().__init__(goals, dict_obs=True, **kwargs)
        space = dict(self.single_observation_space.spaces)
        space["sensor_data"] = gym.spaces.Dict(
            {"cam": gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, (8, 10, 3), np.uint8)})}
        )
        space["sensor_param"] = gym.spaces.Dict(
            {"cam": gym.spaces.Dict({"extrinsic_cv": gym.spaces.Box(-np.inf, np.inf, (3, 4), np.float32)})}
        )
        self.single_observation_space = gym.spaces.Dict(space)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)

    def _obs(self):
        obs = super()._obs()
        rgb = torch.zeros(self.num_envs, 8, 10, 3, dtype=torch.uint8)
        rgb[:, :, 0, 0] = (self.pos.clamp(-10, 10) * 10 + 100).to(torch.uint8)[:, None]
        return {
            **obs,
            "sensor_data": {"cam": {"rgb": rgb}},
            "sensor_param": {"cam": {"extrinsic_cv": torch.ones(self.num_envs, 3, 4)}},
        }


def test_maniskill_rgb_observations_stay_uint8_channels_first_and_camera_matrices_go():
    env = maniskill_backend.maniskill_vector_to_torch(FakeRGBManiSkillVectorEnv([1.0, -1.0]), "cpu", seed=0)
    space = env.single_observation_space
    assert "sensor_param" not in space.spaces
    assert space["sensor_data"]["cam"]["rgb"] == gym.spaces.Box(0, 255, (3, 8, 10), np.uint8)
    obs, _ = env.reset()
    rgb = obs["sensor_data", "cam", "rgb"]
    assert isinstance(obs, TensorDict) and "sensor_param" not in obs.keys()
    assert rgb.dtype == torch.uint8 and rgb.shape == (2, 3, 8, 10)
    assert obs["pos"].dtype == torch.float32
    before = rgb[:, 0, :, 0].clone()
    obs, _, _, _, info = env.step(torch.ones(2, 1))
    assert (obs["sensor_data", "cam", "rgb"][:, 0, :, 0] != before).all()  # the image moved with the point
    assert info["final_obs"]["sensor_data", "cam", "rgb"].dtype == torch.uint8
    flat = maniskill_backend.maniskill_vector_to_torch(FakeRGBManiSkillVectorEnv([1.0, -1.0]), "cpu", flatten_obs=True)
    assert flat.reset()[0].shape == (2, 1 + 2 + 3 * 8 * 10)  # pos, goal, t and the image; no camera matrices
