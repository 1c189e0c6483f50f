"""make_env(..., vectorization="envpool") (extra `envpool`): EnvPool's NEXT_STEP autoreset turned into the SAME_STEP
contract, checked step by step against EnvPool's raw output (every raw transition accounted for, its filler
transitions never reaching us) and against plain Gymnasium MuJoCo across falls and time limits. Skipped with a
reason where envpool or MuJoCo is not installed."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
import torch

from cleanrl_embodied.shared import make_env
from tests.trainer_args import TWO_ENVS, tiny_args

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("envpool") is None,
        reason="needs the envpool extra: uv sync --extra mujoco --extra envpool (Python >= 3.11)",
    ),
    pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs the mujoco extra"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

NUM_ENVS, SEED, LIMIT = 3, 5, 25


def _actions(steps: int, dim: int) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1.0, 1.0, size=(steps, NUM_ENVS, dim)).astype(np.float32)


def test_every_raw_envpool_transition_is_accounted_for_and_no_filler_reaches_us():
    """Ours vs a raw EnvPool pool (same seed, EnvPool's own 25-step limit), the raw pool stepped env by env: each of
    our transitions is exactly one raw transition (obs, reward, flags); after each episode end the raw env's next
    transition is its filler (reward 0, elapsed step 0) whose obs is exactly our obs of the done step."""
    import envpool

    env = make_env("Hopper-v5", NUM_ENVS, seed=SEED, vectorization="envpool", max_episode_steps=LIMIT)
    raw = envpool.make("Hopper-v5", env_type="gymnasium", num_envs=NUM_ENVS, seed=SEED, max_episode_steps=LIMIT)
    obs, _ = env.reset()
    raw_obs, _ = raw.reset()
    np.testing.assert_array_equal(obs.numpy(), raw_obs.astype(np.float32))
    actions = _actions(150, 3)
    fillers = ends = n_terminated = n_truncated = 0
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(a))
        done = (terminated | truncated).numpy()
        assert info["_final_obs"].numpy().tolist() == info["_episode"].numpy().tolist() == done.tolist()
        for i in range(NUM_ENVS):
            r_obs, r_rew, r_term, r_trunc, r_info = raw.step(a[i : i + 1].astype(np.float64), np.array([i], np.int32))
            assert r_info["env_id"].tolist() == [i] and r_info["elapsed_step"][0] >= 1  # a real transition
            np.testing.assert_array_equal(info["final_obs"][i].numpy(), r_obs[0].astype(np.float32))
            assert reward[i].item() == np.float32(r_rew[0])
            assert truncated[i].item() == bool(r_trunc[0])
            if not r_trunc[0]:  # at the limit EnvPool hides a fall (truncated only); ours keeps it, as Gymnasium
                assert terminated[i].item() == bool(r_term[0])
            if done[i]:
                f_obs, f_rew, f_term, f_trunc, f_info = raw.step(np.zeros((1, 3)), np.array([i], np.int32))
                assert f_info["elapsed_step"][0] == 0 and f_rew[0] == 0.0 and not (f_term[0] or f_trunc[0])
                np.testing.assert_array_equal(obs[i].numpy(), f_obs[0].astype(np.float32))  # the new episode
                fillers += 1
            else:
                np.testing.assert_array_equal(obs[i].numpy(), r_obs[0].astype(np.float32))
        ends += int(done.sum())
        n_terminated += int(terminated.sum())
        n_truncated += int(truncated.sum())
    assert fillers == ends > 0 and n_terminated > 0 and n_truncated > 0
    env.close()
    raw.close()


def test_envpool_hopper_matches_plain_gymnasium_across_falls_and_time_limits():
    """Each env is mirrored by a plain Gymnasium Hopper-v5 (TimeLimit 25) put into the same start state (x is not
    observed and does not change dynamics or reward); then, step by step with the same actions: the same
    terminated/truncated flags and episode boundaries, reward and final_obs to a tolerance (two MuJoCo builds),
    the obs after an end a fresh start (within the reset noise) and the episode statistics."""
    env = make_env("Hopper-v5", NUM_ENVS, seed=SEED, vectorization="envpool", max_episode_steps=LIMIT)
    assert env.spec.max_episode_steps == LIMIT and env.single_action_space == gym.spaces.Box(-1, 1, (3,), np.float32)
    refs = [gym.make("Hopper-v5", max_episode_steps=LIMIT) for _ in range(NUM_ENVS)]
    init_qpos = refs[0].unwrapped.init_qpos.copy()

    def mirror(i: int, o: np.ndarray) -> None:
        refs[i].reset(seed=i)
        refs[i].unwrapped.set_state(np.concatenate([[0.0], o[:5]]), o[5:])
        # a fresh start: the model's initial pose plus EnvPool's reset noise (scale 0.005)
        assert np.abs(o[:5] - init_qpos[1:]).max() <= 0.0051 and np.abs(o[5:]).max() <= 0.0051

    obs, _ = env.reset()
    for i in range(NUM_ENVS):
        mirror(i, obs[i].numpy().astype(np.float64))
    ref_return, ref_length = np.zeros(NUM_ENVS), np.zeros(NUM_ENVS, dtype=int)
    n_terminated = n_truncated = 0
    for a in _actions(150, 3):
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(a))
        steps = [ref.step(a[i].astype(np.float64)) for i, ref in enumerate(refs)]
        ref_term, ref_trunc = np.array([s[2] for s in steps]), np.array([s[3] for s in steps])
        assert terminated.tolist() == ref_term.tolist() and truncated.tolist() == ref_trunc.tolist()
        np.testing.assert_allclose(reward.numpy(), [s[1] for s in steps], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(info["final_obs"].numpy(), np.stack([s[0] for s in steps]), rtol=1e-4, atol=1e-4)
        ref_return += [s[1] for s in steps]
        ref_length += 1
        done = ref_term | ref_trunc
        assert info["_episode"].tolist() == done.tolist()
        for i in range(NUM_ENVS):
            if done[i]:
                assert info["episode"]["l"][i].item() == ref_length[i]
                assert info["episode"]["r"][i].item() == pytest.approx(ref_return[i], rel=1e-4, abs=1e-3)
                assert not np.allclose(obs[i].numpy(), info["final_obs"][i].numpy())  # obs: the next episode
                mirror(i, obs[i].numpy().astype(np.float64))
                ref_return[i], ref_length[i] = 0.0, 0
            else:
                np.testing.assert_array_equal(obs[i].numpy(), info["final_obs"][i].numpy())
        n_terminated += int(ref_term.sum())
        n_truncated += int((ref_trunc & ~ref_term).sum())
    assert n_terminated > 0 and n_truncated > 0
    env.close()


def test_envpool_actions_rescaled_and_clipped_and_seeding():
    """Pusher acts in [-2, 2]: [-1, 1] is rescaled onto it and clipped (equal rewards for equal env actions), the
    same seed gives the same starts, reset(seed=) rebuilds the pool, and group resets are one clear line."""
    a = make_env("Pusher-v5", 2, seed=1, vectorization="envpool")
    b = make_env("Pusher-v5", 2, seed=1, vectorization="envpool")
    assert a.single_action_space == gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
    obs_a, _ = a.reset()
    obs_b, _ = b.reset()
    assert torch.equal(obs_a, obs_b)
    _, r_a, *_ = a.step(torch.full((2, 7), 5.0))  # clipped to 1 -> 2 in the env
    _, r_b, *_ = b.step(torch.full((2, 7), 1.0))
    assert torch.equal(r_a, r_b)
    assert torch.equal(a.reset(seed=7)[0], make_env("Pusher-v5", 2, seed=7, vectorization="envpool").reset()[0])
    with pytest.raises(ValueError, match="sync") as err:
        a.reset(options={"group_size": 2})
    assert "\n" not in str(err.value)
    a.close()
    b.close()


def test_envpool_info_entries_follow_info_keys_like_gymnasium_ids():
    """The contract's entries always; EnvPool's MuJoCo entries (x_position, ...) only when info_keys names them."""
    kinds = {"default": (), "named": ["x_position"], "all": "all"}
    infos = {}
    for kind, info_keys in kinds.items():
        env = make_env("HalfCheetah-v5", NUM_ENVS, "cpu", seed=SEED, vectorization="envpool", info_keys=info_keys)
        env.reset()
        infos[kind] = env.step(torch.zeros(NUM_ENVS, 6))[4]
        env.close()
    contract = {"final_obs", "_final_obs", "episode", "_episode"}
    assert set(infos["default"]) == contract
    assert set(infos["named"]) == contract | {"x_position"}
    assert set(infos["all"]) == contract | {"x_position", "x_velocity", "reward_run", "reward_ctrl"}
    assert infos["all"]["x_position"].dtype == torch.float32 and infos["all"]["x_position"].shape == (NUM_ENVS,)
    assert torch.equal(infos["named"]["x_position"], infos["all"]["x_position"])
    with pytest.raises(ValueError, match="info_keys must be a list of info entry names or 'all'"):
        make_env("HalfCheetah-v5", NUM_ENVS, "cpu", seed=SEED, vectorization="envpool", info_keys="x_position")


def test_unknown_envpool_id_is_one_line():
    with pytest.raises(ValueError, match="--env-vectorization envpool") as err:
        make_env("Hopper-v2", 2, vectorization="envpool")
    message = str(err.value)
    assert "\n" not in message and "Hopper-v5" in message and "sync" in message


def test_ppo_smoke_run_with_envpool(tmp_path):
    import json
    import math
    from pathlib import Path

    from cleanrl_embodied import ppo_continuous as ppo

    out = ppo.main(
        tiny_args(ppo, tmp_path, TWO_ENVS, env_id="HalfCheetah-v5", env_vectorization="envpool", num_steps=32,
                  total_timesteps=128, num_minibatches=2, update_epochs=1, eval_env_kwargs='{"max_episode_steps": 20}')
    )  # fmt: skip
    summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
    assert summary["global_step"] == 128 and summary["eval"]["episodic_length"] == 20
    assert math.isfinite(summary["eval"]["episodic_return"])
