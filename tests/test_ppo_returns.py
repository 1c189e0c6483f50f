"""What each PPO trainer teaches its critic, seen from outside: the return target of every sample of a rollout,
read off the value-loss gradient of a probe policy (``--policy toy_policies:still``), against values worked out
from what the env did.

The probe always acts ``a = 0.1`` in both dimensions on ``PointReach`` with a time limit: the point moves by
``0.1 * a`` per step, so the obs an action reaches is known from the obs it was taken in (the offset to the target
shrinks by ``0.01``), the reward is minus the new distance, and the episode ends by success where that distance is
below the radius (a termination; for targets that start close) or else at the time limit (a truncation). Its
V(obs) is ``10 * offset_x``. With ``--gae-lambda 0`` the return target of a sample is ``r + gamma * V(the obs its
action reached, in the same episode)``, or just ``r`` at a termination; V of the obs the sample was taken in, or
of the next episode's first obs (what the env returns after an episode's end), differ from it.
The value loss ``0.5 * mean((V - R)^2)`` times ``--vf-coef`` has gradient ``vf_coef * (V - R) / B`` per sample.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
import torch
import toy_policies

from tests.trainer_args import tiny_args

GAMMA, RADIUS, LIMIT, SCALE, ACTION = 0.9, 0.3, 3, 10.0, 0.1
N, T, VF_COEF = 8, 8, 0.5
TRAINERS = ["ppo_continuous", "ppo_ddp", "ppo_vla_async"]


def run(name: str, tmp_path: Path, **overrides) -> dict:
    module = importlib.import_module(f"cleanrl_embodied.{name}")
    toy_policies.PROBE.clear()
    args = dict(
        env_id="tests.envs_for_tests:PointReach-v0",
        env_kwargs=f'{{"max_episode_steps": {LIMIT}, "success_radius": {RADIUS}}}',
        eval_env_kwargs='{"max_episode_steps": 3}',
        policy="toy_policies:still",
        policy_kwargs=f'{{"action": {ACTION}, "value_scale": {SCALE}, "value_index": 2}}',
        num_envs=N,
        num_steps=T,
        total_timesteps=N * T,  # one iteration
        num_minibatches=1,  # the first training forward sees the whole rollout
        update_epochs=1,
        gamma=GAMMA,
        gae_lambda=0.0,
        vf_coef=VF_COEF,
        hidden_sizes=(8,),
        num_eval_envs=2,
        num_eval_episodes=2,
        eval_freq=0,
        save_freq=0,
        cuda=False,
    )
    out = module.main(tiny_args(module, tmp_path, args, **overrides))  # (a VLA trainer's probe: toy_policies' ToyVLA)
    probe = toy_policies.PROBE
    targets = (probe["value"] - probe["value_grad"] * N * T / VF_COEF).double()  # R per sample, from the gradient
    return {"out": out, "obs": probe["obs"].double(), "targets": targets, "rollout": torch.stack(probe["rollout"])}


def reached(obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The offset to the target [..., 2] after the probe's action in ``obs`` [..., 4], and the reward."""
    offset = obs[..., 2:].double() - 0.1 * ACTION
    return offset, -offset.norm(dim=-1)


def episodes(rollout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rewards, terminated, done [T, N] of a rollout of the probe on PointReach, from its observations [T, N, 4]
    (what the env model above says), checked against where a new episode starts (the point back at 0)."""
    rewards = reached(rollout)[1]
    terminated = -rewards < RADIUS
    done = torch.zeros_like(terminated)
    elapsed = torch.zeros(rollout.shape[1], dtype=torch.long)
    for t in range(rollout.shape[0]):
        elapsed += 1
        done[t] = terminated[t] | (elapsed >= LIMIT)
        elapsed[done[t]] = 0
    assert torch.equal((rollout[1:, :, :2] == 0).all(-1), done[:-1])  # the model is right about this rollout
    return rewards, terminated, done


def expected_targets(obs: torch.Tensor, reward_scale: float = 1.0) -> torch.Tensor:
    """R = r + gamma * V(the obs reached) for samples taken in ``obs`` [B, 4]; R = r where the episode terminated."""
    offset, reward = reached(obs)
    return reward / reward_scale + GAMMA * torch.where(-reward < RADIUS, 0.0, SCALE * offset[:, 0])


@pytest.mark.parametrize("name", TRAINERS)
def test_truncations_bootstrap_from_the_final_obs_and_terminations_not_at_all(tmp_path, name):
    got = run(name, tmp_path)
    rewards, terminated, done = episodes(got["rollout"])
    assert terminated.any() and (done & ~terminated).any()  # both kinds of episode end happened
    # at a truncation the next obs is another episode's start, which the probe values differently
    truncated = (done & ~terminated)[:-1]
    starts = got["rollout"][1:][truncated]
    assert (starts[:, 2] != got["rollout"][:-1][truncated][:, 2]).all()

    assert got["obs"].shape[0] == N * T
    torch.testing.assert_close(got["targets"], expected_targets(got["obs"]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_ddp"])  # (the VLA trainers do not scale rewards)
def test_norm_reward_divides_by_the_std_of_returns_that_restart_at_episode_ends(tmp_path, name):
    """--norm-reward: each reward is divided by the running std of the discounted return (no mean shift); the
    return restarts after every episode end; the scale and each env's return so far are in the checkpoint."""
    got = run(name, tmp_path, norm_reward=True)
    rewards, terminated, done = episodes(got["rollout"])
    trace, traces = torch.zeros(N, dtype=torch.float64), []
    for t in range(T):
        trace = GAMMA * trace + rewards[t]
        traces.append(trace.clone())
        trace = torch.where(done[t], 0.0, trace)
    traces = torch.stack(traces)
    std = float(np.sqrt(np.var(traces.numpy()) + 1e-8))  # the prior (1e-4 samples of variance 1) is negligible

    torch.testing.assert_close(got["targets"], expected_targets(got["obs"], std), rtol=1e-3, atol=1e-4)

    ckpt = torch.load(Path(got["out"]["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    torch.testing.assert_close(ckpt["reward_trace"], trace)  # restarted where the last episodes ended
    never_restarted = sum(GAMMA ** (T - 1 - t) * rewards[t] for t in range(T))
    assert (never_restarted - trace).abs().min() > 0.01  # every env's return restarted in this rollout
    assert ckpt["reward_rms"]["count"].item() == pytest.approx(N * T, abs=1e-3)
    assert ckpt["reward_rms"]["var"].item() == pytest.approx(std**2, rel=1e-3)
    assert ckpt["reward_rms"]["mean"].item() == pytest.approx(traces.mean().item(), rel=1e-3)
