"""GRPO's loss and the statistics of its update: the KL penalty's gradient against a much sharper policy,
advantages standardized with the group's std pooled over the horizon, Dr. GRPO's constant divisor, masked samples
whose ratio overflows, epoch statistics over the applied minibatches only, and the success rate over every env.
Every test here fails on grpo.py as it was at commit bf22c03 (checked by running this file against that tree; the
docstrings say why it failed there)."""

from __future__ import annotations

import math
from pathlib import Path

import grpo_test_helpers  # noqa: F401 - registers GRPOSuccessToy-v0, provides the --policy factories
import pytest
import torch
from grpo_test_helpers import PUSH_CUBE_GROUPS, tiny_actor
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensordict import TensorDict

from cleanrl_embodied import grpo
from tests import trainer_args

pytestmark = pytest.mark.usefixtures("offline")  # tests/conftest.py


def tiny_args(tmp_path: Path, **overrides) -> grpo.Args:
    sizes = dict(PUSH_CUBE_GROUPS, total_timesteps=8 * 50 * 2, eval_freq=0, save_freq=0)
    return trainer_args.tiny_args(grpo, tmp_path, sizes, **overrides)


def read_scalars(run_dir: str) -> dict[str, list[float]]:
    acc = EventAccumulator(run_dir)
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def minibatch(actor: grpo.Actor, n: int = 40, seed: int = 0) -> TensorDict:
    """Samples near the actor's mean, logged with its own log-probs (ratio 1), all alive, zero advantages."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, 3, generator=g)
    with torch.no_grad():
        dist = actor.dist(obs)
        action = dist.mean + 0.1 * torch.randn(dist.mean.shape, generator=g)
        logprob = dist.log_prob(action).sum(-1)
    return TensorDict(
        obs=obs,
        action=action,
        logprob=logprob,
        ref_logprob=logprob.clone(),
        advantages=torch.zeros(n),
        mask=torch.ones(n, dtype=torch.bool),
        batch_size=[n],
    )


def gradients(actor: grpo.Actor, mb: TensorDict, args: grpo.Args) -> tuple[torch.Tensor, list[torch.Tensor]]:
    actor.zero_grad()
    loss, _ = grpo.grpo_loss(actor, mb, args)
    loss.backward()
    return loss, [p.grad.clone() for p in actor.parameters()]


def test_kl_gradient_survives_a_policy_much_sharper_than_the_reference():
    """The KL penalty keeps its gradient when the reference gives the samples e^-30 of the policy's density (the
    policy is far sharper, which a 7-D Gaussian reaches quickly). bf22c03 clamped (ref - new) to [-20, 20]: at -30
    the clamp is flat, so the KL penalty had zero gradient exactly when it matters. Only the overflowing side
    (ref - new > 20) is clamped now."""
    actor = tiny_actor()
    mb = minibatch(actor)
    mb["ref_logprob"] = mb["logprob"] - 30.0
    loss, grads = gradients(actor, mb, grpo.Args(kl_coef=1.0))
    norm = torch.cat([g.flatten() for g in grads]).norm()
    assert torch.isfinite(loss) and torch.isfinite(norm)
    assert norm > 0.1  # d k3 / d log pi = 1 - e^-30 per sample: the penalty pulls toward the reference
    # the other side still cannot overflow: a reference e^+100 more likely gives a finite loss and gradient
    mb["ref_logprob"] = mb["logprob"] + 100.0
    loss, grads = gradients(actor, mb, grpo.Args(kl_coef=1.0))
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads)


def test_a_tiny_gap_between_the_last_alive_members_stays_tiny():
    """A tiny return gap between the last alive members of a group gives a tiny advantage. Two groups of 4 over 4
    steps: all alive with returns spread over ~1 for 3 steps, then only two members left, 1e-3 apart in group 0
    and 3 apart in group 1. bf22c03 standardized each time step on its own, giving +-0.707 to both pairs; with the
    group's std pooled over the horizon the advantage keeps the gap's size."""
    returns = torch.tensor([[0.0, 1.0, 2.0, 3.0] * 2] * 3 + [[5.0, 5.001, 0.0, 0.0, 5.0, 8.0, 0.0, 0.0]])
    mask = torch.ones(4, 8, dtype=torch.bool)
    mask[3, [2, 3, 6, 7]] = False
    adv, _ = grpo.group_advantages(returns, mask, 4, True, 1e-8)
    assert adv[3, :2].abs().max() < 1e-2  # 1e-3 / pooled std (~1.2)
    assert adv[3, 4:6].abs().min() > 1.0  # 3 / pooled std (~1.5)
    assert (adv[3, 1] > 0) and (adv[3, 0] < 0) and torch.isfinite(adv).all()


def test_dr_grpo_divides_the_loss_by_a_constant():
    """Dr. GRPO (--no-scale-adv) sums the per-sample losses of the alive samples and divides by the
    minibatch size, whatever number of them is alive. bf22c03 divided by the alive count (here 10 instead of 40)."""
    actor = tiny_actor()
    mb = minibatch(actor)
    mb["advantages"] = torch.randn(40, generator=torch.Generator().manual_seed(1))
    mb["mask"][10:] = False
    dr_loss, _ = grpo.grpo_loss(actor, mb, grpo.Args(scale_adv=False))
    torch.testing.assert_close(dr_loss, -mb["advantages"][:10].sum() / 40)  # ratio 1: each term is -adv
    loss, _ = grpo.grpo_loss(actor, mb, grpo.Args(scale_adv=True))  # GRPO: the mean over the alive samples
    torch.testing.assert_close(loss, -mb["advantages"][:10].sum() / 10)


def test_a_masked_sample_with_an_overflowing_ratio_changes_nothing():
    """A masked-out sample whose ratio overflows (its logged log-prob is -1e4). bf22c03 masked by
    multiplication: 0 * inf = NaN made the whole minibatch's loss NaN. torch.where keeps loss and gradient finite
    and equal to those without that sample."""
    actor = tiny_actor()
    mb = minibatch(actor)
    mb["advantages"] = torch.randn(40, generator=torch.Generator().manual_seed(2))
    args = grpo.Args(kl_coef=0.5, ent_coef=0.01)
    mb["mask"][0] = False
    clean_loss, clean_grads = gradients(actor, mb, args)
    mb["logprob"][0], mb["ref_logprob"][0] = -1e4, 1e4
    loss, grads = gradients(actor, mb, args)
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, clean_loss)
    for g, c in zip(grads, clean_grads):
        torch.testing.assert_close(g, c)


def test_epoch_statistics_average_only_the_applied_minibatches(tmp_path):
    """The epoch's statistics average the applied minibatches only. The actor's first training forward gives NaN
    action means, so the first minibatch is skipped. bf22c03 averaged the epoch's statistics before checking, so
    that iteration logged NaN approx_kl and clipfrac (and NaN > target_kl is False: the target-KL stop was off); it
    logged no old_approx_kl (and its Args had no --policy, so this test cannot even start there). Now every
    losses/* scalar is a finite mean over the applied minibatches."""
    out = grpo.main(tiny_args(tmp_path, policy="grpo_test_helpers:nan_actor", policy_kwargs='{"at_calls": [1]}'))
    scalars = read_scalars(out["run_dir"])
    assert scalars["charts/skipped_updates"] == [1.0, 1.0]
    for tag in (
        "losses/approx_kl",
        "losses/old_approx_kl",
        "losses/clipfrac",
        "losses/policy_loss",
        "losses/entropy",
        "grpo/kl_ref",
    ):
        assert len(scalars[tag]) == 2 and all(math.isfinite(v) for v in scalars[tag]), (tag, scalars.get(tag))
    assert 0.0 <= min(scalars["losses/clipfrac"]) <= max(scalars["losses/clipfrac"]) <= 1.0


def test_success_rate_counts_every_env_over_the_horizon(tmp_path):
    """The success rate counts every env over the horizon. GRPOSuccessToy: an action > 0 at the 2nd step succeeds
    and ends the episode, else it runs to 10 steps. With a horizon of 5 only successes end inside it. bf22c03
    averaged success over the episodes that ended, i.e. reported 1.0 for a random policy; the success rate is now
    over all envs (about one half here), and grpo/finished_frac says how many first episodes ended within the
    horizon."""
    out = grpo.main(
        tiny_args(
            tmp_path,
            env_id="GRPOSuccessToy-v0",
            num_envs=64,
            group_size=8,
            num_steps=5,
            total_timesteps=64 * 5,
            num_minibatches=4,
            num_eval_envs=8,
            num_eval_episodes=8,
        )
    )
    scalars = read_scalars(out["run_dir"])
    success = scalars["charts/success_rate"][0]
    assert 0.2 < success < 0.8, success
    assert success == pytest.approx(scalars["grpo/finished_frac"][0])  # every ended first episode succeeded
    assert scalars["charts/episodic_length"][0] == 2.0 and scalars["charts/episodic_return"][0] == 1.0
