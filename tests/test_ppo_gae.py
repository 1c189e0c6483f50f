"""compute_gae against a plain per-env reference loop, with terminations and truncations anywhere."""

import torch

from cleanrl_embodied.ppo_continuous import compute_gae


def reference_gae(rewards, values, next_values, terminated, dones, gamma, lam):
    """Textbook GAE written one env and one step at a time, in Python floats."""
    T, N = rewards.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            bootstrap = 0.0 if terminated[t, n] else float(next_values[t, n])
            delta = float(rewards[t, n]) + gamma * bootstrap - float(values[t, n])
            if dones[t, n]:
                running = 0.0  # the next step belongs to another episode
            running = delta + gamma * lam * running
            adv[t, n] = running
    return adv


def make_rollout(T=7, N=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, N, generator=g)
    values = torch.randn(T, N, generator=g)
    final_values = torch.randn(T, N, generator=g) * 3  # V(final_obs), distinct from any values[t+1]
    last_value = torch.randn(N, generator=g)
    terminated = torch.zeros(T, N, dtype=torch.bool)
    truncated = torch.zeros(T, N, dtype=torch.bool)
    terminated[2, 0] = True  # termination mid-rollout
    truncated[4, 1] = True  # truncation mid-rollout
    terminated[T - 1, 2] = True  # termination at the last step
    truncated[T - 1, 3] = True  # truncation at the last step
    terminated[1, 4] = truncated[3, 4] = True  # both kinds in one env
    dones = terminated | truncated
    next_values = torch.cat([values[1:], last_value[None]])
    next_values = torch.where(dones, final_values, next_values)
    return rewards, values, next_values, terminated, dones


def test_gae_matches_reference_loop():
    rewards, values, next_values, terminated, dones = make_rollout()
    for gamma, lam in [(0.99, 0.95), (0.8, 0.9), (1.0, 1.0), (0.9, 0.0)]:
        adv, ret = compute_gae(rewards, values, next_values, terminated, dones, gamma, lam)
        ref = reference_gae(rewards, values, next_values, terminated, dones, gamma, lam)
        torch.testing.assert_close(adv.double(), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ret, adv + values)


def test_truncation_bootstraps_from_final_value_and_termination_does_not():
    # compute_gae given next values; that each trainer passes V(final obs) at truncations: tests/test_ppo_returns.py
    rewards, values, next_values, terminated, dones = make_rollout()
    gamma, lam = 0.9, 0.95
    adv, _ = compute_gae(rewards, values, next_values, terminated, dones, gamma, lam)
    # truncated at t=4 in env 1: one-step advantage from V(final_obs), no recursion into t=5
    assert torch.isclose(adv[4, 1], rewards[4, 1] + gamma * next_values[4, 1] - values[4, 1])
    # terminated at the last step in env 2: no bootstrap at all
    assert torch.isclose(adv[-1, 2], rewards[-1, 2] - values[-1, 2])
    # changing V(final_obs) of a terminated step changes nothing; of a truncated step it does
    nv = next_values.clone()
    nv[2, 0] += 100.0
    assert torch.equal(compute_gae(rewards, values, nv, terminated, dones, gamma, lam)[0], adv)
    nv = next_values.clone()
    nv[4, 1] += 100.0
    assert not torch.equal(compute_gae(rewards, values, nv, terminated, dones, gamma, lam)[0], adv)


def test_a_non_finite_value_behind_a_termination_does_not_reach_any_advantage():
    """V(final_obs) of a terminated episode is never used: even NaN or inf there must leave every advantage
    finite and equal to the reference (masking by multiplication would give NaN * 0 = NaN)."""
    rewards, values, next_values, terminated, dones = make_rollout()
    expected = reference_gae(rewards, values, next_values, terminated, dones, 0.9, 0.95)
    poisoned = torch.where(terminated, float("nan"), next_values)
    poisoned[2, 0] = float("inf")  # terminated too
    adv, ret = compute_gae(rewards, values, poisoned, terminated, dones, 0.9, 0.95)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    torch.testing.assert_close(adv.double(), expected, rtol=1e-5, atol=1e-5)
