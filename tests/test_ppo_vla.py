"""ppo_vla.py and ppo_vla_ddp.py with a small stand-in for a VLA (toy_policies.ToyVLA): every head (Gaussian, bins,
chunks), a chunk's discounting, micro-batches that bound every forward pass, bf16 autocast, bit-identical resume
(ppo_vla_ddp's too, counting a chunk's env steps), a world of one that is ppo_vla.py bit for bit, and one line for
bad input and for a checkpoint of the trainers before the VLA split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from toy_policies import ToyVLA

from cleanrl_embodied import ppo_vla, ppo_vla_ddp
from tests.checks import micro_batch_runs, one_line_exit, pieces_train_like_whole
from tests.instructed_envs import counting_env

SCRIPTS = {"ppo_vla": ppo_vla, "ppo_vla_ddp": ppo_vla_ddp}


pytestmark = pytest.mark.usefixtures("offline")  # tests/conftest.py


def args_for(script: str, out: Path, env_id: str = "PushCubeLangRL", **kw):
    common = dict(
        env_id=env_id, seed=1, num_envs=8, num_steps=4, num_minibatches=2, update_epochs=1,
        total_timesteps=8 * 4 * 2 * kw.get("action_chunk", 1), eval_freq=0, save_freq=0, num_eval_envs=2,
        num_eval_episodes=2, output_dir=str(out), cuda=False, compile="off", policy="toy_policies:ToyVLA",
    )  # fmt: skip
    if env_id == "tests.envs_for_tests:PointReach-v0":
        common["action_bins"] = 16
    return SCRIPTS[script].Args(**{**common, **kw})


def train(script: str, args) -> dict:
    SCRIPTS[script].main(args)
    (run,) = [p for p in Path(args.output_dir).iterdir() if p.is_dir()]
    summary = json.loads((run / "summary.json").read_text())
    return summary | {"run_dir": run, "last": torch.load(run / "checkpoints" / "last.pt", weights_only=True)}


HEADS = {"gaussian": {}, "bins": {"action_head": "bins"}, "chunk": {"action_chunk": 4}}


@pytest.mark.parametrize("env_id", ["PushCubeLangRL", "tests.envs_for_tests:PointReach-v0"])
@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_every_head_trains_and_the_first_minibatch_has_ratio_one(script, head, env_id, tmp_path):
    """One iteration, one epoch, one minibatch (the whole rollout): the update's first (and only) minibatch sees
    the behaviour policy itself, so ratio = 1 for every sample, whatever the head."""
    chunk = HEADS[head].get("action_chunk", 1)
    kw = dict(HEADS[head], num_minibatches=1, total_timesteps=8 * 4 * chunk)
    summary = train(script, args_for(script, tmp_path, env_id, **kw))
    assert summary["global_step"] == 8 * 4 * chunk
    train_stats = summary["train"]
    assert abs(train_stats["losses/approx_kl"]) < 1e-6 and train_stats["losses/clipfrac"] == 0.0, train_stats
    assert abs(train_stats["losses/old_approx_kl"]) < 1e-5
    assert summary["eval"]["episodic_return"] is not None


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_a_chunk_is_discounted_inside_and_by_the_steps_it_ran(script):
    """Chunks of 4 with gamma 0.5 on envs whose k-th step in an episode earns k: env 0 terminates at its 2nd step,
    env 1 runs all four, env 2 terminates exactly at the chunk's end."""
    env = counting_env(terminate_at=[2, 0, 4], max_steps=6)
    env.reset()
    actions = torch.tensor([[[10.0], [11.0], [12.0], [13.0]]]).expand(3, 4, 1)
    obs, reward, discount, steps, terminated, truncated, info = SCRIPTS[script].step_decision(env, actions, 0.5)
    assert torch.allclose(reward, torch.tensor([1 + 0.5 * 2, 1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 4, 3.25]))
    assert steps.tolist() == [2, 4, 4] and torch.allclose(discount, torch.tensor([0.25, 0.0625, 0.0625]))  # gamma^steps
    assert terminated.tolist() == [True, False, True] and truncated.tolist() == [False, False, False]
    assert obs.tolist() == [[0.0, 3.0], [4.0, 0.0], [0.0, 1.0]]  # env 0 starts a fresh episode
    one = counting_env(terminate_at=[2, 0, 4], max_steps=6)
    one.reset()
    _, reward, discount, steps, *_ = SCRIPTS[script].step_decision(one, actions[:, :1], 0.5)  # no chunk: one step
    assert reward.tolist() == [1.0, 1.0, 1.0] and discount.tolist() == [0.5] * 3 and steps.tolist() == [1] * 3


SIZES: list[tuple[bool, int]] = []
"""(grad enabled, batch size) of every forward pass of a `SizeRecorder`."""


class SizeRecorder(ToyVLA):
    """ToyVLA recording the batch size of every forward pass (forward, dist, get_value) into `SIZES`."""

    def forward(self, obs):
        SIZES.append((torch.is_grad_enabled(), obs.shape[0]))
        return super().forward(obs)

    def dist(self, obs):
        SIZES.append((torch.is_grad_enabled(), obs.shape[0]))
        return super().dist(obs)

    def get_value(self, obs):
        SIZES.append((torch.is_grad_enabled(), obs.shape[0]))
        return super().get_value(obs)


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_micro_batches_bound_every_forward_pass(script, tmp_path):
    """--micro-batch-size 3: the update's forward passes (minibatches of 16) run in pieces of at most 3 samples, and
    so do the no-grad ones: the rollout's (8 envs: 3 + 3 + 2) and the evaluation's (5 envs: 3 + 2)."""
    SIZES.clear()
    args = args_for(script, tmp_path, policy="test_ppo_vla:SizeRecorder", micro_batch_size=3, num_eval_envs=5,
                    num_eval_episodes=5, action_chunk=2)  # fmt: skip
    train(script, args)
    assert {size for grad, size in SIZES if grad} == {3, 1}  # 16 = 3 * 5 + 1
    assert {size for grad, size in SIZES if not grad} == {3, 2}


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_micro_batches_give_the_unsplit_update(script, tmp_path):
    """fp32: minibatches of 16 in pieces of 5 (5 + 5 + 5 + 1) take the same optimizer steps as in one piece (and
    another learning rate gives other weights: the updates do move them). 4 envs, fewer than a piece: the rollouts,
    whose sampling would otherwise be split too, are the same."""
    models = []
    for name, kw in micro_batch_runs():
        sizes = dict(num_envs=4, num_minibatches=1, total_timesteps=4 * 4 * 3)
        summary = train(script, args_for(script, tmp_path / name, update_epochs=2, target_kl=None, **sizes, **kw))
        assert summary["train"]["charts/skipped_updates"] == 0
        models.append(summary["last"]["model"])
    pieces_train_like_whole(*models)


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_bf16_autocast_trains_and_is_recorded(script, tmp_path):
    summary = train(script, args_for(script, tmp_path, autocast="bf16", micro_batch_size=7, action_head="bins"))
    assert summary["args"]["autocast"] == "bf16" and summary["args"]["micro_batch_size"] == 7
    assert np.isfinite(summary["train"]["losses/policy_loss"])
    model = summary["last"]["model"]
    assert all(v.dtype in (torch.float32, torch.float64, torch.int64) for v in model.values())  # fp32 weights


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_a_chunked_bins_run_resumes_bit_identically(script, tmp_path, capsys):
    """Three iterations straight, or one, then --resume for two more: the same weights, optimizer state and counters.
    With chunks of 2 an iteration is 8 x 4 x 2 = 64 env steps: the resume starts at the checkpoint's iteration + 1
    (ppo_vla_ddp once counted 32 per iteration here and started at iteration 3)."""
    kw = dict(action_head="bins", action_bins=8, action_chunk=2, total_timesteps=8 * 4 * 2 * 3, save_freq=1,
              eval_freq=1, target_kl=None)  # fmt: skip
    straight = train(script, args_for(script, tmp_path / "a", **kw))
    half = straight["run_dir"] / "checkpoints" / "iter_000001.pt"
    assert torch.load(half, weights_only=True)["iteration"] == 1
    capsys.readouterr()
    resumed = train(script, args_for(script, tmp_path / "b", resume=str(half), **kw))
    assert "start=2" in capsys.readouterr().out
    assert straight["global_step"] == resumed["global_step"] == 8 * 4 * 2 * 3
    assert straight["last"]["iteration"] == resumed["last"]["iteration"] == 3
    for key, value in straight["last"]["model"].items():
        assert torch.equal(value, resumed["last"]["model"][key]), key
    for name, state in straight["last"]["optimizer"]["state"].items():
        assert all(torch.equal(v, resumed["last"]["optimizer"]["state"][name][k]) for k, v in state.items()), name
    assert straight["eval"] == resumed["eval"]
    acc = EventAccumulator(str(resumed["run_dir"]))
    acc.Reload()
    assert [e.step for e in acc.Scalars("charts/SPS")] == [128, 192]


def test_a_world_of_one_is_ppo_vla_bit_for_bit(tmp_path):
    kw = dict(
        action_head="bins",
        action_bins=8,
        action_chunk=2,
        micro_batch_size=5,
        eval_freq=1,
        save_freq=1,
        eval_deterministic=False,
    )  # (evaluations sample the bins from the evaluator's own generator)
    ours = train("ppo_vla_ddp", args_for("ppo_vla_ddp", tmp_path / "ddp", **kw))
    reference = train("ppo_vla", args_for("ppo_vla", tmp_path / "ref", **kw))
    for key, value in reference["last"]["model"].items():
        assert torch.equal(ours["last"]["model"][key], value), key
    assert ours["eval"] == reference["eval"] and ours["global_step"] == reference["global_step"] == 128
    assert ours["world_size"] == 1 and ours["last"]["script"] == "ppo_vla_ddp"
    terms = [k for k in reference["train"] if k.startswith("rewards/")]  # a mean per env step, a chunk's too
    assert terms and all(ours["train"][k] == reference["train"][k] for k in terms)


@pytest.mark.parametrize("script", list(SCRIPTS))
@pytest.mark.parametrize("old", ["ppo_continuous", "ppo_ddp"])
def test_a_checkpoint_of_the_trainers_before_the_split_is_refused_in_one_line(script, old, tmp_path):
    summary = train(script, args_for(script, tmp_path / "a"))
    ckpt = {k: v for k, v in summary["last"].items() if k != "trainer"} | {"script": old}  # (no trainer record then)
    torch.save(ckpt, tmp_path / "old.pt")
    for flag in ("resume", "eval_checkpoint"):
        with pytest.raises(SystemExit) as e:
            SCRIPTS[script].main(args_for(script, tmp_path / "b", **{flag: str(tmp_path / "old.pt")}))
        message = one_line_exit(e)
        assert f"{old}.py" in message and "split off" in message and "version" in message, message


@pytest.mark.parametrize(
    "overrides, flag",
    [
        ({"num_minibatches": 3}, "--num-minibatches"),
        ({"action_chunk": 0}, "--action-chunk"),
        ({"micro_batch_size": 0}, "--micro-batch-size"),
        ({"gamma": 1.5}, "--gamma"),
        ({"policy": "no_such_module:make"}, "--policy"),
        ({"action_chunk": 2}, "--action-chunk"),  # on envs that cannot reset a subset of their envs (below)
    ],
)
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_bad_input_is_one_line(script, overrides, flag, tmp_path, monkeypatch):
    monkeypatch.setattr(SCRIPTS[script].shared, "supports_partial_reset", lambda envs: False)
    with pytest.raises(SystemExit) as e:
        SCRIPTS[script].main(args_for(script, tmp_path, **overrides))
    message = str(e.value.code)
    assert message.startswith("error:") and flag in message and "\n" not in message, message


def test_sample_with_draws_from_the_generator():
    from examples.action_bins import Bins

    normal = torch.distributions.Normal(torch.zeros(4, 3), torch.ones(4, 3))
    bins = Bins(torch.randn(4, 2, 3, 7))
    for dist in (normal, bins):
        a, b = (ppo_vla.sample_with(dist, torch.Generator().manual_seed(5)) for _ in range(2))
        assert torch.equal(a, b) and a.shape == dist.batch_shape
        state = torch.get_rng_state()
        ppo_vla.sample_with(dist, torch.Generator().manual_seed(6))
        assert torch.equal(state, torch.get_rng_state())  # torch's global stream is left alone


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_episodes_that_end_inside_the_rollout_bootstrap_through_micro_batches(script, tmp_path):
    """Episodes of 3 decisions in rollouts of 4: V(final obs) of the envs that finished is computed (in pieces of at
    most 3 of the 8 envs) at the steps where they did, and the run logs their episodes."""
    SIZES.clear()
    env_kwargs = json.dumps({"max_episode_steps": 3})
    args = args_for(script, tmp_path, env_id="tests.envs_for_tests:PointReach-v0", env_kwargs=env_kwargs,
                    micro_batch_size=3, policy="test_ppo_vla:SizeRecorder")  # fmt: skip
    summary = train(script, args)
    assert summary["train"]["charts/episodic_length"] == 3.0
    assert max(size for _, size in SIZES) == 3


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_reward_terms_stay_means_per_env_step_with_chunks(script, tmp_path):
    """PushCubeLangRL's time term is -1 at every env step: logged as -1 with chunks of 4 too (a decision's terms
    are sums over the steps it ran; the mean divides by those steps, not by the decisions)."""
    for chunk in (1, 4):
        summary = train(script, args_for(script, tmp_path / str(chunk), action_chunk=chunk))
        assert summary["train"]["rewards/time"] == pytest.approx(-1.0), chunk


def test_a_resume_across_world_sizes_announces_the_learning_rate_it_uses(tmp_path, capsys):
    """A checkpoint of ppo_vla_ddp on two ranks (iteration 1 of 2: as many env steps as two of ppo_vla's iterations)
    resumed in ppo_vla for longer: ppo_vla goes on at iteration global_step // batch + 1 = 3 of 8, and the schedule
    note names that iteration and the learning rate TensorBoard shows there."""
    straight = train("ppo_vla", args_for("ppo_vla", tmp_path / "a", total_timesteps=4 * 32, save_freq=2))
    ckpt = torch.load(straight["run_dir"] / "checkpoints" / "iter_000002.pt", weights_only=True)
    assert ckpt["global_step"] == 64
    rank = {k: ckpt[k] for k in ("env_state", "next_obs", "rng")}
    two = ckpt | {"script": "ppo_vla_ddp", "iteration": 1, "num_iterations": 2, "world_size": 2, "other_ranks": [rank]}
    torch.save(two, tmp_path / "two_ranks.pt")
    capsys.readouterr()
    resumed = train(
        "ppo_vla", args_for("ppo_vla", tmp_path / "b", total_timesteps=8 * 32, resume=str(tmp_path / "two_ranks.pt"))
    )
    out = capsys.readouterr().out
    assert "iterations=8 start=3" in out
    note = next(line for line in out.splitlines() if "the learning rate follows" in line)
    assert "0.00075 at iteration 3 (the old schedule had 0.0005)" in note, note
    acc = EventAccumulator(str(resumed["run_dir"]))
    acc.Reload()
    first = acc.Scalars("charts/learning_rate")[0]
    assert first.step == 96 and first.value == pytest.approx(1e-3 * (1 - 2 / 8))
