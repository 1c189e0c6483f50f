"""The VLA-RL recipe's knobs in the VLA trainers: --temperature (the rollout's distribution, the same one in the
update's log-probs) and clip-higher (--clip-coef-high, DAPO's asymmetric clip)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensordict import TensorDict
from toy_policies import ToyVLA

from cleanrl_embodied import grpo_vla, ppo_vla, ppo_vla_async, ppo_vla_ddp, shared
from examples.action_bins import Bins

ENV = {"obs_mode": "state+rgb", "image_size": 16, "action_mode": "ee_delta_pos", "max_episode_steps": 10}


def test_tempered_divides_the_logits_and_scales_the_std():
    logits = torch.randn(3, 4, 7)
    hot = ppo_vla.tempered(Bins(logits), 1.6)
    torch.testing.assert_close(hot.logits.exp(), torch.softmax(logits / 1.6, -1))
    assert hot.entropy().sum() > Bins(logits).entropy().sum()  # a higher temperature spreads the bins
    torch.testing.assert_close(ppo_vla.tempered(Bins(logits), 0.5).logits.exp(), torch.softmax(logits / 0.5, -1))
    normal = torch.distributions.Normal(torch.zeros(2, 3), torch.full((2, 3), 0.5))
    torch.testing.assert_close(ppo_vla.tempered(normal, 2.0).stddev, torch.full((2, 3), 0.5 * 2**0.5))  # p^(1/T)
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
            out = module.collector_step(agent, obs, torch.Generator().manual_seed(0), temperature, False)
            value = agent.get_value(obs)
        elif module is grpo_vla:
            out, value = module.policy_step(agent, obs, temperature, False), torch.zeros(16)
        else:
            out = module.policy_step(agent, obs, temperature, False)
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


GRPO = dict(
    num_envs=8, group_size=4, num_steps=5, num_minibatches=2, update_epochs=1, num_eval_envs=4, num_eval_episodes=4,
    eval_freq=0, save_freq=0, cuda=False, compile="off", total_timesteps=2 * 8 * 5,
)  # fmt: skip


def logged(run_dir: str) -> dict[str, list[float]]:
    acc = EventAccumulator(run_dir)
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_dynamic_sampling_stops_after_max_draws_when_no_group_is_informative(tmp_path):
    """A policy that always acts the same from identical group starts: every member of a group gets the same
    return, no group is informative, so each iteration draws --max-draws rollouts (their env steps counted), logs
    the shortfall, and leaves the policy as it was (no update)."""
    args = grpo_vla.Args(**GRPO, output_dir=str(tmp_path), policy="toy_policies:still", min_informative_groups=1,
                         max_draws=3)  # fmt: skip
    out = grpo_vla.main(args)
    assert out["global_step"] == 2 * 3 * 8 * 5  # 2 iterations of 3 draws of 8 envs x 5 steps
    scalars = logged(out["run_dir"])
    assert scalars["grpo/draws"] == [3, 3] and scalars["grpo/shortfall_groups"] == [1, 1]
    assert "losses/policy_loss" not in scalars


def test_dynamic_sampling_updates_on_exactly_the_informative_groups_it_asked_for(tmp_path):
    args = grpo_vla.Args(**GRPO, output_dir=str(tmp_path), policy="toy_policies:ToyVLA", min_informative_groups=1,
                         max_draws=3)  # fmt: skip
    out = grpo_vla.main(args)
    scalars = logged(out["run_dir"])
    assert scalars["grpo/shortfall_groups"] == [0, 0] and all(d >= 1 for d in scalars["grpo/draws"])
    assert out["global_step"] == sum(scalars["grpo/draws"]) * 8 * 5
    assert len(scalars["losses/policy_loss"]) == 2  # an update every iteration, on 1 group of 4 envs x 5 steps


def test_too_many_informative_groups_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        grpo_vla.main(grpo_vla.Args(**GRPO, output_dir=str(tmp_path), policy="toy_policies:ToyVLA",
                                    min_informative_groups=3))  # fmt: skip
    assert str(e.value.code).startswith("error: --min-informative-groups") and "\n" not in str(e.value.code)


PPO = dict(
    num_envs=8, num_steps=5, num_minibatches=2, update_epochs=2, num_eval_envs=4, num_eval_episodes=4, eval_freq=0,
    save_freq=1, cuda=False, compile="off", total_timesteps=3 * 8 * 5, policy="toy_policies:ToyVLA",
    critic_warmup_iterations=2,
)  # fmt: skip


@pytest.mark.parametrize("module", [ppo_vla, ppo_vla_async, ppo_vla_ddp], ids=lambda m: m.__name__[17:])
def test_critic_warmup_trains_the_value_head_alone_then_the_policy(module, tmp_path):
    """--critic-warmup-iterations 2: after iterations 1 and 2 the actor is bit for bit as built (its parameters get
    no step) while the critic learns; iteration 3 moves the actor."""
    extra = {"max_staleness": 0} if module is ppo_vla_async else {}
    out = module.main(module.Args(**PPO, **extra, output_dir=str(tmp_path)))
    ckpts = [
        torch.load(f"{out['run_dir']}/checkpoints/iter_00000{i}.pt", weights_only=True)["model"] for i in (1, 2, 3)
    ]
    actor = [k for k in ckpts[0] if k.startswith("actor_")]
    critic = [k for k in ckpts[0] if k.startswith("critic.")]
    assert actor and critic
    assert all(torch.equal(ckpts[0][k], ckpts[1][k]) for k in actor)
    assert not all(torch.equal(ckpts[0][k], ckpts[1][k]) for k in critic)
    assert not all(torch.equal(ckpts[1][k], ckpts[2][k]) for k in actor)


def test_critic_warmup_needs_the_policys_value_parameters(tmp_path):
    with pytest.raises(SystemExit) as e:
        ppo_vla.main(ppo_vla.Args(**{**PPO, "policy": "toy_policies:without_forward"}, output_dir=str(tmp_path)))
    assert "value_parameters" in str(e.value.code) and "\n" not in str(e.value.code)


@pytest.mark.parametrize("module", [ppo_vla, ppo_vla_ddp, ppo_vla_async, grpo_vla], ids=lambda m: m.__name__[17:])
def test_token_level_loss_clips_and_averages_each_action_entry(module):
    """--loss-agg token: one sample whose 3 action entries have ratios 1.5, 0.9 and 1.0 and advantage +1: each entry
    is clipped on its own (1.5 -> 1.2) and the loss is their mean, -(1.2 + 0.9 + 1.0) / 3; per decision the ratio is
    their product, 1.35, clipped to 1.2 as a whole."""
    agent, mb, args = batch(module, "gaussian", 1.0)
    mb = mb[:1]
    with torch.no_grad():
        new = agent.dist(mb["obs"]).log_prob(mb["action"]).flatten(1)  # [1, 3]
    ratios = torch.tensor([[1.5, 0.9, 1.0]])
    mb["advantages"] = torch.ones(1)
    loss_fn = module.grpo_loss if module is grpo_vla else module.ppo_loss
    off = {k: 0.0 for k in ("ent_coef", "vf_coef", "kl_coef") if hasattr(args, k)}
    for agg, logprob, expected in (("token", new - ratios.log(), -(1.2 + 0.9 + 1.0) / 3),
                                   ("decision", (new - ratios.log()).sum(-1), -1.2)):  # fmt: skip
        mb["logprob"] = logprob
        mb["ref_logprob"] = new if agg == "token" else new.sum(-1)
        plain = {"norm_adv": False} if hasattr(args, "norm_adv") else {}
        loss, _ = loss_fn(agent, mb, module.Args(**{**vars(args), **off, **plain, "loss_agg": agg}))
        assert float(loss) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("module", [ppo_vla, ppo_vla_async, grpo_vla], ids=lambda m: m.__name__[17:])
def test_a_run_with_token_level_loss_stores_per_entry_log_probs(module, tmp_path):
    common = GRPO if module is grpo_vla else {**PPO, "critic_warmup_iterations": 0, "save_freq": 0}
    out = module.main(module.Args(**{**common, "policy": "toy_policies:ToyVLA"}, output_dir=str(tmp_path),
                                  loss_agg="token", temperature=1.6, clip_coef_high=0.28))  # fmt: skip
    assert out["global_step"] > 0 and "losses/policy_loss" in logged(out["run_dir"])
