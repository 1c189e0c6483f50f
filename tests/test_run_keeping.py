"""Shared run-keeping: fresh evaluation starts, per-rank seeds, return traces on a resume without env state,
the one failure style."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cleanrl_embodied import ppo_continuous
from cleanrl_embodied.shared import make_env
from cleanrl_embodied.shared.cli import fail
from cleanrl_embodied.shared.evaluation import evaluate, evaluation_seed
from cleanrl_embodied.shared.runtime import SkipGuard, seed_everything, stream_seed

TINY = dict(
    num_envs=8,
    num_steps=10,
    num_minibatches=2,
    update_epochs=2,
    num_eval_envs=4,
    num_eval_episodes=4,
    hidden_sizes=(32, 32),
    cuda=False,
    eval_freq=0,
)


def test_every_evaluation_starts_from_fresh_reproducible_starts():
    seeds = {evaluation_seed(1, step) for step in range(0, 100_000, 80)}
    assert len(seeds) == 1250  # one per evaluation, none repeated
    assert not seeds & set(range(1, 1 + 100_000))  # ... none among small seeds ...
    train = {stream_seed(1, "train_envs", rank) + i for rank in range(4) for i in range(256)}
    assert not seeds & train  # ... and none among the training envs' (4 ranks of 256 envs)
    env = make_env("PushCubeRL", num_envs=4, seed=0)
    first_obs = []
    act = lambda obs, gen: torch.zeros(obs.shape[0], env.single_action_space.shape[0])  # noqa: E731
    for seed in (evaluation_seed(1, 80), evaluation_seed(1, 80), evaluation_seed(1, 160)):
        first_obs.append(env.reset(seed=seed)[0].clone())
        evaluate(act, env, 4, seed)
    assert torch.equal(first_obs[0], first_obs[1]) and not torch.equal(first_obs[0], first_obs[2])


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


def test_reward_terms_are_logged_as_iteration_means(tmp_path):
    """PushCubeRL reports its weighted reward terms in info["rewards"]; the trainers log their mean per env step,
    and with the default weights the terms add up to the reward."""
    out = ppo_continuous.main(ppo_continuous.Args(output_dir=str(tmp_path), total_timesteps=2 * 80, **TINY))
    train = json.loads((Path(out["run_dir"]) / "summary.json").read_text())["train"]
    terms = {k: v for k, v in train.items() if k.startswith("rewards/")}
    assert {"rewards/reach", "rewards/place"} <= set(terms), sorted(train)
    env = make_env("PushCubeRL", num_envs=16, seed=0)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(torch.zeros(16, env.single_action_space.shape[0]))
    torch.testing.assert_close(sum(info["rewards"].values()), reward)
