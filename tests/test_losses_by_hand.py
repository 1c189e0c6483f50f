"""The PPO loss of each PPO trainer and GRPO's clipped loss against values worked out by hand, on 4-sample batches
whose probability ratios lie on both sides of the clip range (each sample hits another case of the pessimistic
surrogate). The reference below is written from the papers' formulas in plain Python floats, not from the code:

    L_clip = -mean_i min(r_i A_i, clip(r_i, 1 - eps, 1 + eps) A_i)          (PPO, Schulman et al. 2017, eq. 7)
    log N(a; mu, sigma) = -(a - mu)^2 / (2 sigma^2) - log sigma - log(2 pi) / 2
    H(N(mu, sigma)) = 1/2 + log(2 pi) / 2 + log sigma

A sample whose surrogate is the clipped one passes no gradient to the policy; an unclipped one passes
-A_i r_i / n * d log pi(a_i) / d mu_i = -A_i r_i / n * (a_i - mu_i) / sigma_i^2.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from tensordict import TensorDict

from cleanrl_embodied import grpo, ppo_continuous, ppo_ddp, ppo_vla_async

CLIP = 0.2
MU = [0.0, 0.5, -0.3, 0.2]
SIGMA = [1.0, 0.5, 0.8, 1.2]
ACTION = [0.3, 0.1, -0.9, 1.0]
# r > 1 + eps with A > 0 (clipped), r < 1 - eps with A < 0 (clipped), r > 1 + eps with A < 0 (the unclipped
# term is the smaller: no clipping), r inside the range
RATIO = [1.6, 0.5, 1.6, 0.9]
ADV = [1.5, -0.5, -2.0, 1.0]  # mean 0: normalizing keeps the signs
VALUE, OLD_VALUE, RETURNS = [0.5, -1.0, 2.0, 0.0], [0.4, -0.5, 1.0, 0.3], [1.0, -1.2, 0.5, 0.1]


def log_normal(a: float, mu: float, sigma: float) -> float:
    return -((a - mu) ** 2) / (2 * sigma**2) - math.log(sigma) - 0.5 * math.log(2 * math.pi)


def entropy(sigma: float) -> float:
    return 0.5 + 0.5 * math.log(2 * math.pi) + math.log(sigma)


def clip(x: float, low: float, high: float) -> float:
    return min(max(x, low), high)


def surrogate(r: float, a: float) -> tuple[float, bool]:
    """min(r A, clip(r) A) and whether the unclipped term is the one taken (it carries the gradient)."""
    unclipped, clipped = r * a, clip(r, 1 - CLIP, 1 + CLIP) * a
    return min(unclipped, clipped), unclipped <= clipped


class FixedGaussian(nn.Module):
    """An agent whose action distribution and value are its parameters (one row per sample), whatever the obs."""

    def __init__(self):
        super().__init__()
        self.mu = nn.Parameter(torch.tensor(MU)[:, None])
        self.log_sigma = nn.Parameter(torch.tensor(SIGMA).log()[:, None])
        self.value = nn.Parameter(torch.tensor(VALUE))

    def dist(self, obs):
        return torch.distributions.Normal(self.mu, self.log_sigma.exp())

    def forward(self, obs):
        return self.dist(obs), self.value


def old_logprobs(ratios: list[float]) -> list[float]:
    """Behaviour log-probs that make the ratios of the current policy exactly ``ratios``."""
    return [log_normal(a, m, s) - math.log(r) for a, m, s, r in zip(ACTION, MU, SIGMA, ratios)]


@pytest.mark.parametrize("module", [ppo_continuous, ppo_ddp, ppo_vla_async], ids=lambda m: m.__name__.split(".")[-1])
@pytest.mark.parametrize("norm_adv", [False, True])
@pytest.mark.parametrize("clip_vloss", [False, True])
def test_ppo_loss_matches_the_formula_worked_by_hand(module, norm_adv, clip_vloss):
    n, ent_coef, vf_coef = 4, 0.01, 0.5
    args = module.Args(clip_coef=CLIP, norm_adv=norm_adv, clip_vloss=clip_vloss, ent_coef=ent_coef, vf_coef=vf_coef)
    mb = TensorDict(
        obs=torch.zeros(n, 3),
        action=torch.tensor(ACTION)[:, None],
        logprob=torch.tensor(old_logprobs(RATIO)),
        value=torch.tensor(OLD_VALUE),
        advantages=torch.tensor(ADV),
        returns=torch.tensor(RETURNS),
        batch_size=[n],
    )
    agent = FixedGaussian()
    if norm_adv and hasattr(module, "normalize_advantages"):  # the VLA family normalizes before micro-batching
        mb = module.normalize_advantages(mb)  # (the classic family's ppo_loss does it itself)
    loss, stats = module.ppo_loss(agent, mb, args)
    loss.backward()

    adv = ADV
    if norm_adv:  # mean 0, unbiased std
        std = math.sqrt(sum(a * a for a in ADV) / (n - 1))
        adv = [a / (std + 1e-8) for a in ADV]
    terms = [surrogate(r, a) for r, a in zip(RATIO, adv)]
    pg = -sum(t for t, _ in terms) / n
    if clip_vloss:
        v_clip = [o + clip(v - o, -CLIP, CLIP) for v, o in zip(VALUE, OLD_VALUE)]
        per = [max((v - R) ** 2, (c - R) ** 2) for v, c, R in zip(VALUE, v_clip, RETURNS)]
        # the gradient flows through v where its own error is the larger (or equal, inside the clip range)
        v_grad_on = [(v - R) ** 2 >= (c - R) ** 2 for v, c, R in zip(VALUE, v_clip, RETURNS)]
    else:
        per, v_grad_on = [(v - R) ** 2 for v, R in zip(VALUE, RETURNS)], [True] * n
    v_loss = 0.5 * sum(per) / n
    h = sum(entropy(s) for s in SIGMA) / n
    assert [on for _, on in terms] == [False, False, True, True]  # the four cases of the surrogate
    assert stats["policy_loss"].item() == pytest.approx(pg, rel=1e-5)
    assert stats["value_loss"].item() == pytest.approx(v_loss, rel=1e-5)
    assert stats["entropy"].item() == pytest.approx(h, rel=1e-5)
    assert loss.item() == pytest.approx(pg - ent_coef * h + vf_coef * v_loss, rel=1e-5)
    assert stats["clipfrac"].item() == pytest.approx(3 / 4)
    assert stats["approx_kl"].item() == pytest.approx(sum((r - 1) - math.log(r) for r in RATIO) / n, rel=1e-5)
    assert stats["old_approx_kl"].item() == pytest.approx(sum(-math.log(r) for r in RATIO) / n, rel=1e-5)

    mu_grad = [
        -a * r / n * (x - m) / s**2 if on else 0.0
        for (_, on), a, r, x, m, s in zip(terms, adv, RATIO, ACTION, MU, SIGMA)
    ]
    torch.testing.assert_close(agent.mu.grad[:, 0], torch.tensor(mu_grad), rtol=1e-5, atol=1e-7)
    value_grad = [vf_coef * (v - R) / n if on else 0.0 for v, R, on in zip(VALUE, RETURNS, v_grad_on)]
    torch.testing.assert_close(agent.value.grad, torch.tensor(value_grad), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("scale_adv", [True, False])
def test_grpo_loss_matches_the_formula_worked_by_hand(scale_adv):
    """Three live samples (ratios 1.6, 0.5, 1.6 with advantages that clip, clip and don't) and one masked sample
    whose log-probs would overflow: it adds nothing, not even NaN. k3 KL to the reference: r - log r - 1 with
    r = pi_ref / pi. The loss is divided by the live samples (GRPO) or by the minibatch size (Dr. GRPO)."""
    n, ent_coef, kl_coef = 4, 0.01, 0.1
    args = grpo.Args(clip_coef=CLIP, ent_coef=ent_coef, kl_coef=kl_coef, scale_adv=scale_adv)
    ratios, mask = [1.6, 0.5, 1.6, 1.0], [True, True, True, False]
    new = [log_normal(a, m, s) for a, m, s in zip(ACTION, MU, SIGMA)]
    ref_shift = [0.3, -0.2, 0.5, 0.0]  # log pi_ref - log pi
    old = old_logprobs(ratios)
    old[3] = -1e4  # masked: an unmasked ratio would be exp(1e4)
    mb = TensorDict(
        obs=torch.zeros(n, 3),
        action=torch.tensor(ACTION)[:, None],
        logprob=torch.tensor(old),
        ref_logprob=torch.tensor([x + d for x, d in zip(new, ref_shift)]),
        advantages=torch.tensor(ADV),
        mask=torch.tensor(mask),
        batch_size=[n],
    )
    actor = FixedGaussian()
    loss, stats = grpo.grpo_loss(actor, mb, args)
    loss.backward()

    live = [i for i in range(n) if mask[i]]
    terms = {i: surrogate(ratios[i], ADV[i]) for i in live}
    pg = -sum(terms[i][0] for i in live)
    h = sum(entropy(SIGMA[i]) for i in live)
    kl = sum(math.exp(ref_shift[i]) - ref_shift[i] - 1 for i in live)
    denominator = len(live) if scale_adv else n
    assert [terms[i][1] for i in live] == [False, False, True]
    assert loss.item() == pytest.approx((pg - ent_coef * h + kl_coef * kl) / denominator, rel=1e-5)
    assert stats["policy_loss"].item() == pytest.approx(pg / len(live), rel=1e-5)
    assert stats["entropy"].item() == pytest.approx(h / len(live), rel=1e-5)
    assert stats["kl_ref"].item() == pytest.approx(kl / len(live), rel=1e-5)
    assert stats["clipfrac"].item() == pytest.approx(1.0)
    kl_old = [(ratios[i] - 1) - math.log(ratios[i]) for i in live]
    assert stats["approx_kl"].item() == pytest.approx(sum(kl_old) / len(live), rel=1e-5)

    # d/d mu_i of the surrogate (unclipped samples only) and of the k3 term: (1 - pi_ref / pi) d log pi / d mu
    mu_grad = [0.0] * n
    for i in live:
        dlogp = (ACTION[i] - MU[i]) / SIGMA[i] ** 2
        surrogate_part = -ADV[i] * ratios[i] * dlogp if terms[i][1] else 0.0
        mu_grad[i] = (surrogate_part + kl_coef * (1 - math.exp(ref_shift[i])) * dlogp) / denominator
    torch.testing.assert_close(actor.mu.grad[:, 0], torch.tensor(mu_grad), rtol=1e-5, atol=1e-7)
