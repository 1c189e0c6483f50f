"""make_env's ``frame_stack`` (FrameStack): the latest K observations side by side, oldest first, checked against a
hand-kept history of the same env without it (across episode ends, partial resets and a state round trip), and
ppo_continuous end to end (the stacked observation, the checkpoint check, a bit-identical resume)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from cleanrl_embodied import ppo_continuous
from cleanrl_embodied.shared import make_env
from cleanrl_embodied.shared.builders import EnvOptions
from cleanrl_embodied.shared.envs import (
    OBSERVATION_KWARGS,
    RANDOMIZATION_KWARGS,
    env_state_dict,
    load_env_state_dict,
)
from cleanrl_embodied.shared.envs.chunks import step_chunk, supports_partial_reset
from cleanrl_embodied.shared.envs.wrappers import FrameStack
from cleanrl_embodied.shared.observations import sorted_leaf_keys
from tests.checks import one_line, steps_without_a_host_sync
from tests.envs_for_tests import random_actions

pytestmark = pytest.mark.usefixtures("single_thread")

POINT = "tests.envs_for_tests:PointReach-v0"


def stacked(frames: list):
    """What FrameStack should show for a history ``frames`` (oldest first): every leaf joined along its first axis
    after the batch (a vector's entries, an image's channels), instruction tokens those of the newest frame."""
    if isinstance(frames[-1], torch.Tensor):
        return torch.cat(frames, dim=1)
    out = TensorDict({}, batch_size=frames[-1].batch_size)
    for key in sorted_leaf_keys(frames[-1]):
        newest_only = key[0] == "instruction"
        out.set(key, frames[-1].get(key) if newest_only else torch.cat([f.get(key) for f in frames], dim=1))
    return out


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and torch.equal(a, b)
    keys = sorted_leaf_keys(a)
    return keys == sorted_leaf_keys(b) and all(same(a.get(k), b.get(k)) for k in keys)


class History:
    """The last K observations of each env of a reference env (the same env without frame_stack), kept by hand."""

    def __init__(self, k: int, first):
        self.k, self.frames = k, [[row] * k for row in self._split(first)]

    @staticmethod
    def _split(obs):
        return [obs[i : i + 1] for i in range(obs.shape[0])]

    def current(self):
        return torch.cat([stacked(f) for f in self.frames])  # (TensorDicts concatenate row-wise too)

    def step(self, obs, final_obs, done: torch.Tensor):
        """Returns the expected final_obs stack (the history and the final obs; rows that did not end: obs's)."""
        finals = []
        for i, (o, f) in enumerate(zip(self._split(obs), self._split(final_obs))):
            finals.append(stacked([*self.frames[i][1:], f]))
            self.frames[i] = [o] * self.k if bool(done[i]) else [*self.frames[i][1:], o]
        return torch.cat(finals)

    def reset_rows(self, obs, mask: torch.Tensor):
        for i, o in enumerate(self._split(obs)):
            if bool(mask[i]):
                self.frames[i] = [o] * self.k


def run_against_history(env_id: str, k: int, num_envs: int, steps: int, act_dim: int, **kwargs) -> int:
    """Step ``env_id`` with ``frame_stack=k`` and without, under the same seed and actions, comparing every obs and
    final_obs with the hand-kept history; returns how many episodes ended."""
    env = make_env(env_id, num_envs=num_envs, seed=3, frame_stack=k, **kwargs)
    ref = make_env(env_id, num_envs=num_envs, seed=3, **kwargs)
    obs, _ = env.reset()
    first, _ = ref.reset()
    history = History(k, first)
    assert same(obs, history.current())
    ended = 0
    for step in range(steps):
        action = random_actions((num_envs, act_dim), step)
        obs, reward, terminated, truncated, info = env.step(action)
        r_obs, r_reward, r_terminated, r_truncated, r_info = ref.step(action)
        assert torch.equal(reward, r_reward) and torch.equal(terminated, r_terminated)
        assert torch.equal(truncated, r_truncated) and torch.equal(info["_final_obs"], r_info["_final_obs"])
        expected_final = history.step(r_obs, r_info["final_obs"], r_terminated | r_truncated)
        assert same(info["final_obs"], expected_final), step
        assert same(obs, history.current()), step
        ended += int((terminated | truncated).sum())
    return ended


# --------------------------------------------------------------------------- order, content, episode ends
def test_a_flat_stack_is_the_last_k_observations_oldest_first_across_episode_ends():
    """PointReach (obs [position, target - position], 4 entries) ending every 5 steps: at the steps where an episode
    ends, final_obs is the old episode's last 3 observations and obs the new one's first, 3 times."""
    env = make_env(POINT, num_envs=3, seed=0, frame_stack=3, max_episode_steps=5)
    ref = make_env(POINT, num_envs=3, seed=0, max_episode_steps=5)
    space, ref_space = env.single_observation_space, ref.single_observation_space
    assert space.shape == (12,) and env.observation_space.shape == (3, 12) and space.dtype == ref_space.dtype
    assert np.array_equal(space.low, np.tile(ref_space.low, 3))
    assert np.array_equal(space.high, np.tile(ref_space.high, 3))
    assert run_against_history(POINT, 3, 3, 17, 2, max_episode_steps=5) >= 9  # steps 5, 10, 15 at least


def test_the_order_by_hand_on_pendulum_without_velocity():
    """The newest observation is the last block; at the reset all blocks are the first observation."""
    env = make_env("Pendulum-v1", num_envs=2, seed=1, obs_indices=[0, 1], frame_stack=3)
    ref = make_env("Pendulum-v1", num_envs=2, seed=1, obs_indices=[0, 1])
    obs, _ = env.reset()
    o0, _ = ref.reset()
    assert torch.equal(obs, torch.cat([o0, o0, o0], 1))
    o1 = ref.step(torch.full((2, 1), 0.5))[0]
    assert torch.equal(env.step(torch.full((2, 1), 0.5))[0], torch.cat([o0, o0, o1], 1))
    o2 = ref.step(torch.full((2, 1), -0.5))[0]
    assert torch.equal(env.step(torch.full((2, 1), -0.5))[0], torch.cat([o0, o1, o2], 1))
    o3 = ref.step(torch.zeros(2, 1))[0]
    assert torch.equal(env.step(torch.zeros(2, 1))[0], torch.cat([o1, o2, o3], 1))


def test_dict_observations_stack_images_along_channels_and_keep_instruction_tokens():
    env = make_env("PushCubeRL", num_envs=2, seed=0, frame_stack=2, obs_mode="proprio+rgb", image_size=8,
                   max_episode_steps=3)  # fmt: skip
    space = env.single_observation_space
    assert space["rgb"].shape == (6, 8, 8) and space["rgb"].dtype == np.uint8 and space["state"].shape == (34,)
    assert run_against_history("PushCubeRL", 2, 2, 7, 7, obs_mode="proprio+rgb", image_size=8, max_episode_steps=3) == 4
    lang = make_env("PushCubeLangRL", num_envs=2, seed=0, frame_stack=3)
    plain = make_env("PushCubeLangRL", num_envs=2, seed=0)
    assert lang.single_observation_space["instruction"] == plain.single_observation_space["instruction"]
    assert lang.single_observation_space["state"].shape == (3 * plain.single_observation_space["state"].shape[0],)
    assert run_against_history("PushCubeLangRL", 3, 2, 9, 7, max_episode_steps=4) == 4


def test_frame_stack_1_adds_no_wrapper():
    env = make_env("Pendulum-v1", num_envs=2, seed=0, frame_stack=1)
    assert not isinstance(env, FrameStack) and env.single_observation_space.shape == (3,)


# --------------------------------------------------------------------------- partial resets
@pytest.mark.parametrize(
    "env_id, kwargs, act_dim",
    [("Pendulum-v1", {"obs_indices": [0, 1]}, 1), ("PushCubeRL", {"max_episode_steps": 50}, 7)],
)
def test_a_partial_reset_refills_only_the_masked_stacks(env_id, kwargs, act_dim):
    env = make_env(env_id, num_envs=4, seed=2, frame_stack=3, **kwargs)
    ref = make_env(env_id, num_envs=4, seed=2, **kwargs)
    assert supports_partial_reset(env)
    env.reset()
    history = History(3, ref.reset()[0])
    for step in range(4):
        action = random_actions((4, act_dim), step)
        env.step(action)
        r_obs, _, r_term, r_trunc, r_info = ref.step(action)
        history.step(r_obs, r_info["final_obs"], r_term | r_trunc)
    before = history.current()
    mask = torch.tensor([True, False, True, False])
    obs, _ = env.reset(options={"reset_mask": mask})
    r_obs, _ = ref.reset(options={"reset_mask": mask})
    history.reset_rows(r_obs, mask)
    assert torch.equal(obs, history.current())
    assert torch.equal(obs[[1, 3]], before[[1, 3]]) and not torch.equal(obs[[0, 2]], before[[0, 2]])
    d = obs.shape[1] // 3
    assert torch.equal(obs[[0, 2], :d], obs[[0, 2], d : 2 * d]) and torch.equal(obs[[0, 2], :d], obs[[0, 2], 2 * d :])
    action = random_actions((4, act_dim), 9)
    obs = env.step(action)[0]
    r_obs, _, r_term, r_trunc, r_info = ref.step(action)
    history.step(r_obs, r_info["final_obs"], r_term | r_trunc)
    assert torch.equal(obs, history.current())
    chunk = random_actions((4, 3, act_dim), 1)  # action chunks end with a partial reset
    obs, rewards, *_ = step_chunk(env, chunk)
    assert obs.shape == (4, 3 * d) and rewards.shape == (3, 4)


# --------------------------------------------------------------------------- env state
@pytest.mark.parametrize("kwargs", [{}, {"obs_mode": "proprio+rgb", "image_size": 8}])
def test_the_stack_is_env_state_and_a_resumed_env_continues_identically(kwargs, tmp_path):
    kwargs = dict(num_envs=4, frame_stack=3, max_episode_steps=4, **kwargs)
    env = make_env("PushCubeRL", seed=0, **kwargs)
    env.reset(seed=0)
    for step in range(6):  # mid-episode: the stack holds frames of two episodes' steps
        env.step(random_actions((4, 7), step))
    saved = env_state_dict(env)
    assert "FrameStack" in saved
    torch.save(saved, tmp_path / "state.pt")  # as a checkpoint holds it: plain tensors, on the CPU
    saved = torch.load(tmp_path / "state.pt", weights_only=True)
    expected = [env.step(random_actions((4, 7), 100 + step)) for step in range(9)]
    resumed = make_env("PushCubeRL", seed=99, **kwargs)
    resumed.reset(seed=99)
    load_env_state_dict(resumed, saved)
    for step, (obs, reward, terminated, truncated, info) in enumerate(expected):
        got = resumed.step(random_actions((4, 7), 100 + step))
        assert same(got[0], obs) and torch.equal(got[1], reward), step
        assert torch.equal(got[2], terminated) and torch.equal(got[3], truncated)
        assert same(got[4]["final_obs"], info["final_obs"])


# --------------------------------------------------------------------------- bad values, kwargs lists
@pytest.mark.parametrize("value", [0, -2, 2.0, 2.5, True, "3", None, [2]])
def test_bad_values_are_one_line_naming_the_option(value):
    with pytest.raises(ValueError) as error:
        make_env("Pendulum-v1", num_envs=2, frame_stack=value)
    assert one_line(error).startswith("frame_stack must be an integer >= 1"), str(error.value)


def test_frame_stack_changes_what_a_policy_sees_and_the_eval_envs_inherit_it():
    assert "frame_stack" in OBSERVATION_KWARGS and "frame_stack" not in RANDOMIZATION_KWARGS
    assert EnvOptions("Pendulum-v1", env_kwargs='{"frame_stack": 4}').kwargs(eval_envs=True) == {"frame_stack": 4}


# --------------------------------------------------------------------------- ppo_continuous end to end
TINY = dict(num_envs=4, num_steps=16, total_timesteps=128, num_minibatches=2, update_epochs=1, num_eval_envs=2,
            num_eval_episodes=2, eval_freq=0, save_freq=0, cuda=False, compile="off")  # fmt: skip


def test_ppo_trains_on_a_stack_and_its_checkpoint_needs_the_same_frame_stack(tmp_path: Path):
    kwargs = {"obs_indices": [0, 1], "frame_stack": 3}
    args = ppo_continuous.Args(env_id="Pendulum-v1", env_kwargs=json.dumps(kwargs), output_dir=str(tmp_path / "a"),
                               **TINY)  # fmt: skip
    out = ppo_continuous.main(args)
    assert out["global_step"] == 128
    path = Path(out["run_dir"]) / "checkpoints" / "last.pt"
    assert torch.load(path, weights_only=True)["obs_dim"] == 6
    other = json.dumps({**kwargs, "frame_stack": 2})
    bad = ppo_continuous.Args(env_id="Pendulum-v1", env_kwargs=other, eval_checkpoint=str(path),
                              output_dir=str(tmp_path / "b"), **TINY)  # fmt: skip
    with pytest.raises(SystemExit) as e:
        ppo_continuous.main(bad)
    message = str(e.value.code)
    assert message.startswith(f"error: --eval-checkpoint {path}: its env had frame_stack=3") and "\n" not in message
    assert not Path(bad.output_dir).exists()


def test_a_resumed_run_with_a_frame_stack_is_bit_identical_to_a_straight_one(tmp_path: Path):
    """PushCubeRL with 2 frames, episodes of 4 steps: the checkpoint at env step 30 falls inside episodes whose
    stacks hold frames that only the env state in the checkpoint can give back."""
    common = dict(num_envs=8, num_steps=10, num_minibatches=2, update_epochs=2, num_eval_envs=4, num_eval_episodes=4,
                  hidden_sizes=(32, 32), cuda=False, total_timesteps=6 * 8 * 10, save_freq=3, eval_freq=2,
                  norm_obs=True, norm_reward=True, torch_deterministic=True,
                  env_kwargs='{"frame_stack": 2, "max_episode_steps": 4}')  # fmt: skip
    straight = ppo_continuous.main(ppo_continuous.Args(output_dir=str(tmp_path / "a"), **common))
    half = Path(straight["run_dir"]) / "checkpoints" / "iter_000003.pt"
    assert "FrameStack" in torch.load(half, weights_only=True)["env_state"]
    resumed = ppo_continuous.main(ppo_continuous.Args(output_dir=str(tmp_path / "b"), resume=str(half), **common))
    assert resumed["global_step"] == straight["global_step"] == 480
    a = torch.load(Path(straight["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(Path(resumed["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert a["obs_dim"] == 62 and a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert torch.equal(a["env_state"]["FrameStack"]["stack"], b["env_state"]["FrameStack"]["stack"])


# --------------------------------------------------------------------------- GPU
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kwargs", [{}, {"obs_mode": "proprio+rgb", "image_size": 16}])
def test_frame_stack_steps_without_a_host_sync_on_a_gpu(kwargs):
    env = make_env("PushCubeRL", num_envs=64, device="cuda", seed=0, frame_stack=4, max_episode_steps=3, **kwargs)
    obs, *_, info = steps_without_a_host_sync(env)
    stack = obs if isinstance(obs, torch.Tensor) else obs["state"]
    assert stack.device.type == "cuda" and info["final_obs"] is not None
