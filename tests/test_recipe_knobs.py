"""The VLA-RL recipe's knobs in the VLA trainers: --temperature (the rollout's distribution, the same one in the
update's log-probs) and clip-higher (--clip-coef-high, DAPO's asymmetric clip)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from tensordict import TensorDict
from toy_policies import ToyVLA

from cleanrl_embodied import grpo_vla, ppo_vla, ppo_vla_async, ppo_vla_ddp, shared
from examples.hf_vla.policy import Bins

ENV = {"obs_mode": "state+rgb", "image_size": 16, "action_mode": "ee_delta_pos", "max_episode_steps": 10}


def test_tempered_divides_the_logits_and_scales_the_std():
    logits = torch.randn(3, 4, 7)
    hot = ppo_vla.tempered(Bins(logits), 1.6)
    torch.testing.assert_close(hot.logits.exp(), torch.softmax(logits / 1.6, -1))
    assert hot.entropy().sum() > Bins(logits).entropy().sum()  # a higher temperature spreads the bins
    torch.testing.assert_close(ppo_vla.tempered(Bins(logits), 0.5).logits.exp(), torch.softmax(logits / 0.5, -1))
    normal = torch.distributions.Normal(torch.zeros(2, 3), torch.full((2, 3), 0.5))
    assert torch.equal(ppo_vla.tempered(normal, 2.0).stddev, torch.full((2, 3), 1.0))
    assert torch.equal(ppo_vla.tempered(normal, 2.0).mean, normal.mean)
    assert ppo_vla.tempered(normal, 1.0) is normal
    assert torch.equal(ppo_vla.tempered(Bins(logits), 3.0).mode, Bins(logits).mode)  # evaluation's mode is unchanged


def batch(module, head: str, temperature: float):
    """A rollout batch of ToyVLA on PushCubeLangRL sampled at `temperature` by the trainer's own sampling step."""
    args = module.Args(env_id="PushCubeLangRL", env_kwargs=json.dumps(ENV), action_head=head, action_bins=9,
                       temperature=temperature, policy="toy_policies:ToyVLA")  # fmt: skip
    env = shared.make_env("PushCubeLangRL", 16, "cpu", seed=0, **ENV)
    torch.manual_seed(0)
    agent = ToyVLA(env.single_observation_space, env.single_action_space, args)
    if head == "bins":  # ToyVLA starts near uniform over the bins, where a temperature changes little
        agent.actor_logits[-1].weight.data *= 300
    obs, _ = env.reset(seed=0)
    with torch.no_grad():
        if module is ppo_vla_async:
            out = module.collector_step(agent, obs, torch.Generator().manual_seed(0), temperature)
            value = agent.get_value(obs)
        elif module is grpo_vla:
            out, value = module.policy_step(agent, obs, temperature), torch.zeros(16)
        else:
            out = module.policy_step(agent, obs, temperature)
            value = out["value"]
    adv = torch.randn(16)
    mb = TensorDict(obs=obs, action=out["action"], logprob=out["logprob"], value=value, advantages=adv,
                    returns=value + adv, mask=torch.ones(16, dtype=torch.bool), ref_logprob=out["logprob"],
                    batch_size=[16])  # fmt: skip
    return agent, mb, args


@pytest.mark.parametrize("head", ["bins", "gaussian"])
@pytest.mark.parametrize("module", [ppo_vla, ppo_vla_ddp, ppo_vla_async, grpo_vla], ids=lambda m: m.__name__[17:])
def test_the_first_minibatch_ratio_is_one_at_any_temperature(module, head):
    """The update's log-probs are taken under the distribution the rollout sampled from: before any step the ratio
    is exactly 1 (no KL, nothing clipped) at T = 1.6 — and the same batch judged at T = 1 is not."""
    agent, mb, args = batch(module, head, 1.6)
    loss_fn = module.grpo_loss if module is grpo_vla else module.ppo_loss
    _, stats = loss_fn(agent, mb, args)
    assert stats["approx_kl"].abs() < 1e-6 and stats["old_approx_kl"].abs() < 1e-6 and stats["clipfrac"] == 0
    _, other = loss_fn(agent, mb, module.Args(**{**vars(args), "temperature": 1.0}))
    assert other["approx_kl"] > 1e-4


@pytest.mark.parametrize("module", [ppo_vla, ppo_vla_ddp, ppo_vla_async, grpo_vla], ids=lambda m: m.__name__[17:])
def test_clip_higher_clips_the_ratio_asymmetrically(module):
    """One sample, advantage +1, its log-prob raised so that the ratio is 1.25: the symmetric clip (0.2) holds its
    surrogate at 1.2, clip-higher (0.2 / 0.28) lets it count 1.25; with advantage -1 and ratio 0.75 both clip at 0.8."""
    agent, mb, args = batch(module, "gaussian", 1.0)
    mb = mb[:1]
    loss_fn = module.grpo_loss if module is grpo_vla else module.ppo_loss
    kw = dict(vars(args), ent_coef=0.0, kl_coef=0.0, vf_coef=0.0, norm_adv=False) if hasattr(args, "kl_coef") else dict(
        vars(args), ent_coef=0.0, vf_coef=0.0, norm_adv=False)  # fmt: skip
    kw = {k: v for k, v in kw.items() if k in vars(args)}
    for adv, ratio, symmetric, higher in ((1.0, 1.25, 1.2, 1.25), (-1.0, 0.75, 0.8, 0.8)):
        mb["advantages"] = torch.tensor([adv])
        mb["logprob"] = mb["logprob"] - math.log(ratio)  # new / old = ratio
        losses = []
        for high in (None, 0.28):
            loss, stats = loss_fn(agent, mb, module.Args(**{**kw, "clip_coef": 0.2, "clip_coef_high": high}))
            losses.append(float(loss))
        mb["logprob"] = mb["logprob"] + math.log(ratio)
        assert losses[0] == pytest.approx(-adv * symmetric, rel=1e-5)
        assert losses[1] == pytest.approx(-adv * higher, rel=1e-5)


@pytest.mark.parametrize("flag, value", [("temperature", 0.0), ("temperature", -1.0), ("clip_coef_high", 0.0)])
def test_bad_knobs_are_one_line(flag, value, tmp_path):
    with pytest.raises(SystemExit) as e:
        ppo_vla.main(ppo_vla.Args(output_dir=str(tmp_path), policy="toy_policies:ToyVLA", **{flag: value}))
    message = str(e.value.code)
    assert message.startswith(f"error: --{flag.replace('_', '-')}") and "\n" not in message
