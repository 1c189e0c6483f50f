"""The classic PPO trainers share one algorithm and one run-keeping: the same GAE, the same loss, one checkpoint
layout and the same resume rules. ppo_ddp runs as a world of one, so differences here can only be drift between the
copies. (ppo_async.py became the VLA trainer ppo_vla_async.py, issue 37: tests/test_ppo_vla_async.py checks its
copies of ppo_vla.py's functions.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from cleanrl_embodied import ppo_continuous, ppo_ddp
from tests.envs_for_tests import spaces
from tests.trainer_args import EIGHT_ENVS

SCRIPTS = {"ppo_continuous": ppo_continuous, "ppo_ddp": ppo_ddp}
TINY = dict(EIGHT_ENVS, total_timesteps=2 * 80, eval_freq=1, save_freq=1, norm_obs=True, norm_reward=True)
COMMON_KEYS = {
    "script",
    "args",
    "model",
    "optimizer",
    "reward_rms",
    "reward_trace",
    "iteration",
    "global_step",
    "num_iterations",
    "best_key",
    "obs_dim",
    "act_dim",
    "rng",
}


def args_for(name: str, tmp_path: Path, **overrides):
    return SCRIPTS[name].Args(output_dir=str(tmp_path), **{**TINY, **overrides})


def test_gae_and_loss_are_the_same_in_every_copy():
    g = torch.Generator().manual_seed(0)
    rew, val, nxt = torch.randn(3, 12, 6, generator=g).unbind(0)
    term, trunc = torch.rand(12, 6, generator=g) < 0.1, torch.rand(12, 6, generator=g) < 0.1
    outs = [m.compute_gae(rew, val, nxt, term, term | trunc, 0.97, 0.9) for m in SCRIPTS.values()]
    for adv, ret in outs[1:]:
        assert torch.equal(adv, outs[0][0]) and torch.equal(ret, outs[0][1])

    batch = TensorDict(
        obs=torch.randn(32, 5, generator=g),
        action=torch.randn(32, 3, generator=g),
        logprob=torch.randn(32, generator=g) - 3,
        value=torch.randn(32, generator=g),
        advantages=torch.randn(32, generator=g),
        returns=torch.randn(32, generator=g),
        batch_size=[32],
    )
    results = []
    for name, module in SCRIPTS.items():
        torch.manual_seed(0)
        args = module.Args(hidden_sizes=(16,), clip_vloss=True, ent_coef=0.01)
        agent = module.Agent(*spaces(5, 3), args)
        loss, stats = module.ppo_loss(agent, batch, args)
        loss.backward()
        results.append((name, loss.detach(), stats, [p.grad for p in agent.parameters()]))
    for name, loss, stats, grads in results[1:]:
        assert torch.equal(loss, results[0][1]), name
        assert set(stats.keys()) == set(results[0][2].keys()) >= {"clipfrac", "approx_kl", "old_approx_kl"}, name
        assert all(torch.equal(a, b) for a, b in zip(grads, results[0][3])), name


@pytest.mark.parametrize("name", list(SCRIPTS))
@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"gamma": 1.5}, "--gamma must be <= 1, got 1.5"),
        ({"gamma": 0.0}, "--gamma must be > 0, got 0.0"),
        ({"gae_lambda": 1.01}, "--gae-lambda must be <= 1, got 1.01"),
        ({"hidden_sizes": (64, 0)}, "--hidden-sizes must be one or more positive integers, got (64, 0)"),
        ({"hidden_sizes": ()}, "--hidden-sizes must be one or more positive integers, got ()"),
        ({"num_minibatches": 3}, "--num-minibatches must divide the 80 samples of a rollout"),  # 8 envs x 10 steps
        ({"num_minibatches": 41}, "--num-minibatches must divide the 80 samples of a rollout"),  # minibatches of 1
    ],
)
def test_the_same_bad_input_gets_the_same_line(tmp_path, name, overrides, message):
    with pytest.raises(SystemExit) as e:
        SCRIPTS[name].main(args_for(name, tmp_path, **overrides))
    assert str(e.value.code).startswith(f"error: {message}") and "\n" not in str(e.value.code), str(e.value.code)
    assert not any(tmp_path.iterdir())  # refused before anything was built


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_one_checkpoint_layout_and_the_same_resume_rules(tmp_path, name):
    out = SCRIPTS[name].main(args_for(name, tmp_path / "a"))
    last = Path(out["run_dir"]) / "checkpoints" / "last.pt"
    ckpt = torch.load(last, weights_only=True)
    assert COMMON_KEYS <= set(ckpt), COMMON_KEYS - set(ckpt)
    assert ckpt["script"] == name and ckpt["iteration"] == 2 and ckpt["global_step"] == 160
    assert ckpt["num_iterations"] == 2
    first = json.loads((Path(out["run_dir"]) / "summary.json").read_text())["train"]
    assert first["charts/learning_rate"] == pytest.approx(1e-3 * (1 - 1 / 2))  # iteration 2 of 2

    # settings that change what the checkpoint's contents mean are refused in one line naming the flag
    for flag, value in (("gamma", 0.5), ("clip_obs", 5.0), ("num_envs", 16)):
        with pytest.raises(SystemExit) as e:
            SCRIPTS[name].main(args_for(name, tmp_path / "b", resume=str(last), **{flag: value}))
        message = str(e.value.code)
        assert message.startswith("error:") and f"--{flag.replace('_', '-')}" in message and "\n" not in message
    # a checkpoint saved for an env with other observation sizes (other env kwargs): one line, same words everywhere
    other = tmp_path / "other_obs.pt"
    torch.save({**ckpt, "obs_dim": ckpt["obs_dim"] + 1}, other)
    for flag in ("resume", "eval_checkpoint"):
        with pytest.raises(SystemExit) as e:
            SCRIPTS[name].main(args_for(name, tmp_path / "d", **{flag: str(other)}))
        message = str(e.value.code)
        assert message.startswith(
            f"error: --{flag.replace('_', '-')}: the checkpoint has observation/action sizes "
            f"{ckpt['obs_dim'] + 1}/{ckpt['act_dim']}, the env here {ckpt['obs_dim']}/"
        ), message
        assert "\n" not in message

    # training longer: the LR follows the schedule of a run planned with the new total (announced)
    longer = SCRIPTS[name].main(args_for(name, tmp_path / "c", resume=str(last), total_timesteps=4 * 80))
    assert longer["global_step"] == 320
    summary = json.loads((Path(longer["run_dir"]) / "summary.json").read_text())
    assert summary["train"]["charts/learning_rate"] == pytest.approx(1e-3 * (1 - 3 / 4))  # iteration 4 of 4


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_diverged_run_stops_with_the_same_line(tmp_path, name):
    # every training forward gives a NaN loss: the first 3 optimizer steps are skipped, then the run stops; the
    # step named is the one the first iteration logs at (its 8 envs x 10 steps)
    with pytest.raises(SystemExit) as e:
        SCRIPTS[name].main(
            args_for(
                name,
                tmp_path,
                max_consecutive_skips=3,
                policy="toy_policies:nan_loss_every",
                policy_kwargs='{"every": 1}',
            )
        )
    assert str(e.value.code) == (
        "error: 3 optimizer steps in a row had a non-finite loss or gradient (last at "
        "global step 80); lower --learning-rate or check the env"
    )
