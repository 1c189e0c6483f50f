"""Action chunks, env side: `step_chunk` runs a decision of K actions step by step and reports each step's raw reward
and whether the decision still ran there; the discounting of a chunk is the VLA trainers' (checked here on the
trainers' own functions, by hand)."""

from __future__ import annotations

import importlib

import pytest
import torch

from cleanrl_embodied.shared import make_env
from cleanrl_embodied.shared.envs.chunks import chunk_space, step_chunk, supports_partial_reset
from tests.instructed_envs import counting_env


def test_step_chunk_crosses_a_termination_and_a_truncation_step_by_step():
    """Chunks of 4 on envs whose k-th step in an episode earns k: env 0 terminates at its 2nd step, env 1 is truncated
    at its 6th, env 2 terminates exactly at the chunk's end (its 4th step)."""
    env = counting_env(terminate_at=[2, 0, 4], max_steps=6)
    assert chunk_space(env.single_action_space, 4).shape == (4, 1) and supports_partial_reset(env)
    env.reset()
    first = torch.tensor([[[10.0], [11.0], [12.0], [13.0]]]).expand(3, 4, 1)
    obs, rewards, executed, terminated, truncated, info = step_chunk(env, first)
    assert rewards.shape == executed.shape == (4, 3)
    assert executed.T.tolist() == [[True, True, False, False], [True] * 4, [True] * 4]
    assert torch.equal(
        torch.where(executed, rewards, 0.0).T, torch.tensor([[1, 2, 0, 0], [1, 2, 3, 4], [1, 2, 3, 4.0]])
    )
    assert terminated.tolist() == [True, False, True] and truncated.tolist() == [False, False, False]
    assert info["final_obs"][0].tolist() == [2.0, 0.0] and info["final_obs"][2].tolist() == [4.0, 0.0]
    assert info["_episode"].tolist() == [True, False, True]
    assert info["episode"]["r"][0] == 3 and info["episode"]["l"][0] == 2  # steps 1 and 2 only
    assert torch.equal(info["rewards"]["count"], torch.where(executed, rewards, 0.0).sum(0))  # terms: executed steps
    # env 0's episode ended after two actions: the other two went to a throwaway continuation (episode 1, which
    # ended too, at its own 2nd step), and the next decision starts a fresh episode 3 from a partial reset; env 2
    # ended at the chunk's end and simply goes on with episode 1.
    assert env.env.received[0] == [(0, 10.0), (0, 11.0), (1, 12.0), (1, 13.0)]
    assert obs.tolist() == [[0.0, 3.0], [4.0, 0.0], [0.0, 1.0]]

    second = torch.tensor([[[20.0], [21.0], [22.0], [23.0]]]).expand(3, 4, 1)
    obs, rewards, executed, terminated, truncated, info = step_chunk(env, second)
    assert torch.where(executed, rewards, 0.0).sum(0).tolist() == [3.0, 11.0, 10.0]
    assert executed[:, 1].tolist() == [True, True, False, False]  # env 1 truncated at its 6th step, the chunk's 2nd
    assert truncated.tolist() == [False, True, False] and terminated.tolist() == [True, False, True]
    assert info["final_obs"][1].tolist() == [6.0, 0.0]
    assert info["episode"]["r"].tolist()[:2] == [3.0, 21.0] and info["episode"]["l"].tolist()[:2] == [2, 6]
    assert [a for e, a in env.env.received[0] if e == 3] == [20.0, 21.0]  # the new episode got its own actions only
    assert all(e < 3 for e, a in env.env.received[0] if a < 20)


def test_a_chunk_of_one_is_a_plain_step():
    env, twin = (counting_env(terminate_at=[2, 0, 4], max_steps=6) for _ in range(2))
    env.reset(), twin.reset()
    for t in range(5):
        action = torch.full((3, 1, 1), float(t))
        obs, rewards, executed, terminated, truncated, info = step_chunk(env, action)
        obs2, reward2, terminated2, truncated2, _ = twin.step(action[:, 0])
        assert executed.all() and torch.equal(rewards[0], reward2) and torch.equal(obs, obs2)
        assert torch.equal(terminated, terminated2) and torch.equal(truncated, truncated2)


def test_step_chunk_records_a_frame_per_env_step():
    env = make_env("PushCubeRL", num_envs=2, seed=0, render_mode="rgb_array")
    env.reset(seed=0)
    frames = []
    step_chunk(env, torch.zeros(2, 3, env.single_action_space.shape[0]), frames)
    assert len(frames) == 3


@pytest.mark.parametrize("script", ["ppo_vla", "ppo_vla_ddp", "ppo_vla_async"])
def test_gae_per_decision_matches_hand_computation(script):
    """Two decisions of a chunked env: rewards 3.25 then 8 (truncated, bootstrap V(final obs) = 5 with gamma^2)."""
    module = importlib.import_module(f"cleanrl_embodied.{script}")
    rewards, values = torch.tensor([[3.25], [8.0]]), torch.tensor([[1.0], [2.0]])
    next_values = torch.tensor([[2.0], [5.0]])
    terminated, dones = torch.tensor([[False], [False]]), torch.tensor([[False], [True]])
    discounts = torch.tensor([[0.0625], [0.25]])
    adv, ret = module.compute_gae(rewards, values, next_values, terminated, dones, discounts, 0.9)
    a1 = 8 + 0.25 * 5 - 2
    a0 = 3.25 + 0.0625 * 2 - 1 + 0.0625 * 0.9 * a1
    assert torch.allclose(adv.flatten(), torch.tensor([a0, a1])) and torch.allclose(ret, adv + values)
