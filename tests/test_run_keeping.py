"""Shared run-keeping: fresh evaluation starts, per-rank seeds, return traces on a resume without env state,
the one failure style."""

from __future__ import annotations

import dataclasses
import importlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cleanrl_embodied import ppo_continuous
from cleanrl_embodied.shared import make_env
from cleanrl_embodied.shared.cli import fail
from cleanrl_embodied.shared.evaluation import Evaluator, evaluation_seed
from cleanrl_embodied.shared.non_finite import SkipGuard
from cleanrl_embodied.shared.random_streams import seed_everything, stream_seed
from cleanrl_embodied.shared.run_logger import RunLogger
from tests.trainer_args import EIGHT_ENVS, tiny_args, trainer

TINY = dict(EIGHT_ENVS, eval_freq=0)


def test_every_evaluation_starts_from_fresh_reproducible_starts(tmp_path):
    """What evaluate() feeds the policy: each evaluation of a run starts from other episodes than the last one,
    a rerun (another Evaluator of the same seed) feeds the same observations, sampled actions and result at the
    same step, whatever the env did before; and the training run's global random streams are left alone."""
    seeds = {evaluation_seed(1, step) for step in range(0, 100_000, 80)}
    assert len(seeds) == 1250  # one per evaluation, none repeated
    assert not seeds & set(range(1, 1 + 100_000))  # ... none among small seeds ...
    train = {stream_seed(1, "train_envs", rank) + i for rank in range(4) for i in range(256)}
    assert not seeds & train  # ... and none among the training envs' (4 ranks of 256 envs)
    env = make_env("PushCubeRL", num_envs=4, seed=0)
    env.reset(seed=0)

    def recorder(calls: list):
        def act(obs, generator, starts):  # a sampling policy: it draws from the generator evaluate() hands it
            calls.append(obs.clone())
            return 2 * torch.rand(obs.shape[0], 7, generator=generator) - 1

        return act

    runs = []
    for rerun in range(2):
        logger = RunLogger("test", ppo_continuous.Args(output_dir=str(tmp_path / str(rerun))), console=False)
        evaluator = Evaluator(env, logger, seed=1, num_episodes=4, capture_video=False)
        fed = {}
        for step in (80, 160):
            env.step(torch.ones(4, 7))  # training goes on between evaluations: the env is mid-episode
            mid_episode = env.step(torch.ones(4, 7))[0]
            calls = []
            torch.manual_seed(123)
            states = torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
            result, _ = evaluator.run(recorder(calls), step)
            assert torch.equal(torch.get_rng_state(), states[0]) and np.array_equal(np.random.get_state()[1], states[1])
            assert random.getstate() == states[2]
            assert not torch.equal(calls[0], mid_episode)  # fresh episodes, not the ones the env was in
            assert len(calls) >= 2 and result["episodic_length"] > 0
            fed[step] = (calls, result)
        logger.close()
        runs.append(fed)
    assert not torch.equal(runs[0][80][0][0], runs[0][160][0][0])  # another evaluation, other starts
    for step in (80, 160):
        (calls, result), (again, result_again) = runs[0][step], runs[1][step]
        assert len(calls) == len(again) and all(torch.equal(a, b) for a, b in zip(calls, again))
        assert result == result_again


def test_ranks_sample_from_streams_no_other_run_uses():
    sweep = [(seed, rank) for seed in range(1, 9) for rank in range(4)]
    streams = [stream_seed(seed, "torch", rank) for seed, rank in sweep]  # what ppo_ddp's rank samples from
    assert len(set(streams)) == len(sweep)  # rank r of seed s is not rank 0 of seed s + r
    for seed in range(1, 9):  # rank 0 = ppo_continuous's stream (seed_everything without a rank)
        seed_everything(seed, True)
        assert torch.initial_seed() == stream_seed(seed, "torch", 0)


def test_a_resume_without_env_state_starts_the_return_traces_afresh(tmp_path):
    """Pendulum's numpy sub-envs cannot save their state: a resume restarts their episodes, so the reward
    normalizer's discounted-return traces must restart too instead of carrying the old episodes' returns."""
    common = dict(TINY, env_id="Pendulum-v1", norm_reward=True, gamma=0.99, total_timesteps=2 * 80)
    first = ppo_continuous.main(ppo_continuous.Args(output_dir=str(tmp_path / "a"), **common))
    last = Path(first["run_dir"]) / "checkpoints" / "last.pt"
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["env_state"] is None and ckpt["reward_trace"].abs().sum() > 0
    # the same budget: the resumed run trains no further iteration and saves what it restored
    again = ppo_continuous.main(ppo_continuous.Args(output_dir=str(tmp_path / "b"), resume=str(last), **common))
    restored = torch.load(Path(again["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert torch.equal(restored["reward_trace"], torch.zeros_like(ckpt["reward_trace"]))
    assert torch.equal(restored["reward_rms"]["var"], ckpt["reward_rms"]["var"])  # the scale itself is kept


def test_a_user_mistake_is_one_line_and_exit_status_1():
    with pytest.raises(SystemExit) as e:
        fail("--num-envs must be > 0, got 0")
    assert e.value.code == "error: --num-envs must be > 0, got 0"


def test_the_skip_guard_counts_refusals_and_stops_only_on_a_run_of_them():
    guard, nan, one = SkipGuard(max_consecutive=3), torch.tensor(float("nan")), torch.tensor(1.0)
    verdicts = [
        guard.ok(loss, norm, 7)
        for loss, norm in [
            (nan, one),
            (one, nan),
            (one, one),
            (nan, one),
            (one, torch.tensor(float("inf"))),
            (one, one),
        ]
    ]
    assert verdicts == [False, False, True, False, False, True]
    assert guard.skipped == 4 and guard.consecutive == 0  # a finite step ends a run of refusals
    assert not guard.ok(nan, one, 8) and not guard.ok(nan, one, 9)
    with pytest.raises(SystemExit) as e:
        guard.ok(nan, one, 10)
    assert e.value.code == (
        "error: 3 optimizer steps in a row had a non-finite loss or gradient (last at global "
        "step 10); lower --learning-rate or check the env"
    )


@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_ddp", "ppo_vla_async", "grpo"])
def test_reward_terms_are_logged_as_iteration_means(tmp_path, name):
    """PushCubeRL reports its weighted reward terms in info["rewards"]; the trainers log each term's mean per env
    step of the iteration. A policy that always acts 0.5 (toy_policies:still) makes the action-rate term
    -|a_t - a_(t-1)|^2 = -7 * 0.25 at the first step of every episode (a_(-1) = 0) and 0 at the others; with
    4-step episodes, iteration 1 (steps 1-6) has two episode starts, iteration 2 (steps 7-12) one; GRPO starts
    every iteration afresh. And with the default weights the terms add up to the reward."""
    env_kwargs = {"reward_weights": {"action_rate": 1.0}, "max_episode_steps": 4, "terminate_on_success": False}
    args = tiny_args(  # (a VLA trainer's probe: on toy_policies' ToyVLA)
        name,
        tmp_path,
        TINY,
        num_steps=6,
        total_timesteps=2 * 8 * 6,
        env_kwargs=json.dumps(env_kwargs),
        policy="toy_policies:still",
        policy_kwargs='{"action": 0.5}',
        save_freq=0,
    )
    out = trainer(name).main(args)
    acc = EventAccumulator(out["run_dir"])
    acc.Reload()
    logged = [(e.step, e.value) for e in acc.Scalars("rewards/action_rate")]
    starts = [2, 2] if name == "grpo" else [2, 1]
    assert [step for step, _ in logged] == [48, 96]
    for (_, value), n in zip(logged, starts):
        assert value == pytest.approx(-7 * 0.25 * n / 6, rel=1e-6)
    env = make_env("PushCubeRL", num_envs=16, seed=0)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(torch.zeros(16, env.single_action_space.shape[0]))
    torch.testing.assert_close(sum(info["rewards"].values()), reward)


FAULTS = [
    ("raise_at_step", RuntimeError, "RuntimeError: "),
    ("nan_obs_at_step", SystemExit, "UsageError: error: non-finite"),
]


@pytest.mark.parametrize("fault, raised, error", FAULTS, ids=[f for f, *_ in FAULTS])
@pytest.mark.parametrize("script", ["ppo_continuous", "ppo_ddp", "grpo", "ppo_vla", "ppo_vla_async", "grpo_vla"])
def test_a_run_that_ends_in_an_error_still_writes_its_summary(tmp_path, script, fault, raised, error):
    """An env that raises at its 45th step (grpo: 120th), or gives a NaN observation there: the error goes on (a
    traceback, or the one line of a non-finite observation), and summary.json says what is known: the last logged
    step, the error, last.pt where one was written (every iteration here)."""
    module = importlib.import_module(f"cleanrl_embodied.{script}")
    at_step = 120 if script == "grpo" else 45  # (grpo's horizon: the episode limit, 50 steps)
    kwargs = dict(
        env_id="tests.envs_for_tests:PointReach-v0", env_kwargs=json.dumps({fault: at_step}), num_envs=2, num_steps=4,
        num_minibatches=2, update_epochs=1, total_timesteps=2 * 4 * 20, eval_freq=0, save_freq=1, num_eval_envs=2,
        num_eval_episodes=2, output_dir=str(tmp_path), cuda=False, seed=1,
    )  # fmt: skip
    if script.startswith("grpo"):
        kwargs.update(group_size=2)
    if script == "grpo":  # horizons of 50 steps: 4 iterations
        kwargs.update(num_steps=None, total_timesteps=2 * 50 * 4)
    if script.endswith(("vla", "vla_async")):
        kwargs.update(policy="toy_policies:ToyVLA")
    kwargs = {k: v for k, v in kwargs.items() if k in {f.name for f in dataclasses.fields(module.Args)}}
    with pytest.raises(raised):
        module.main(module.Args(**kwargs))
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["error"].startswith(error), summary["error"]
    assert summary["global_step"] > 0 and summary["checkpoint"] == str(run / "checkpoints" / "last.pt")
