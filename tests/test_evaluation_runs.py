"""Evaluations inside a run, seen from outside: which evaluation best.pt keeps (success rate first, then return)
and that a resumed run keeps comparing against the best so far; and that evaluating changes nothing about
training (its own random streams, the frozen observation normalizer)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import toy_policies

from tests.trainer_args import FOUR_ENVS, tiny_args, trainer

TRAINERS = ["ppo_continuous", "ppo_ddp", "ppo_vla_async", "grpo"]
TINY = dict(FOUR_ENVS, num_steps=2, update_epochs=2, hidden_sizes=(16,))
BATCH = 4 * 2


def args_for(name: str, tmp_path: Path, **overrides):
    return trainer(name), tiny_args(name, tmp_path, TINY, **overrides)


def checkpoints(out: dict) -> Path:
    return Path(out["run_dir"]) / "checkpoints"


@pytest.mark.parametrize("name", TRAINERS)
def test_best_checkpoint_is_chosen_by_success_then_return_and_its_key_survives_a_resume(tmp_path, name):
    """On Echo-v0 an evaluation's return and success rate are what the policy's eval actions say
    (toy_policies:scripted_eval plays one planned action per evaluation). Evaluations 1-3 give (success, return)
    (0, 0.9), (1, -0.5), (1, -0.3): each is the best so far, the 2nd by success despite its lower return, the
    3rd by return. A run resumed from the end then evaluates (1, -0.4) and (0, 0.95): neither beats (1, -0.3),
    so it writes no best.pt (either would against a key that was lost or stale)."""
    common = dict(env_id="tests.envs_for_tests:Echo-v0", policy="toy_policies:scripted_eval", eval_freq=1)
    toy_policies.EVAL_PLAN[:] = [(0.9, -1.0), (-0.5, 1.0), (-0.3, 1.0)]
    module, args = args_for(name, tmp_path / "a", total_timesteps=3 * BATCH, save_freq=1, **common)
    first = module.main(args)
    assert toy_policies.EVAL_PLAN == []  # three evaluations, as planned
    saved = {n: torch.load(checkpoints(first) / n, weights_only=True) for n in ("iter_000001.pt", "iter_000002.pt")}
    assert saved["iter_000001.pt"]["best_key"] == pytest.approx([0.0, 0.9])
    assert saved["iter_000002.pt"]["best_key"] == pytest.approx([1.0, -0.5])  # success first
    best = torch.load(checkpoints(first) / "best.pt", weights_only=True)
    assert best["global_step"] == 3 * BATCH and best["best_key"] == pytest.approx([1.0, -0.3])  # then return
    last = torch.load(checkpoints(first) / "last.pt", weights_only=True)
    assert last["best_key"] == pytest.approx([1.0, -0.3])  # what a resume continues from

    toy_policies.EVAL_PLAN[:] = [(-0.4, 1.0), (0.95, -1.0)]
    resume = str(checkpoints(first) / "last.pt")
    module, args = args_for(name, tmp_path / "b", total_timesteps=5 * BATCH, save_freq=0, resume=resume, **common)
    second = module.main(args)
    assert toy_policies.EVAL_PLAN == [] and second["global_step"] == 5 * BATCH
    assert second["eval"]["success_rate"] == 0.0 and second["eval"]["episodic_return"] == pytest.approx(0.95)
    assert not (checkpoints(second) / "best.pt").exists()


@pytest.mark.parametrize("name", TRAINERS)
def test_evaluating_every_iteration_changes_nothing_about_training(tmp_path, name):
    """A run that evaluates after every iteration, sampling its eval actions (--no-eval-deterministic), ends
    with the same weights, bit for bit, as one that never evaluates before the end: evaluations draw from their
    own random streams and leave the observation normalizer (--norm-obs, part of the weights) as it was."""
    common = dict(total_timesteps=4 * 8 * 10, num_envs=8, num_steps=10, eval_deterministic=False, save_freq=0)
    normalizes = "norm_obs" in trainer(name).Args.__dataclass_fields__
    if normalizes:  # (grpo and the VLA trainers have no normalizer)
        common.update(norm_obs=True, norm_reward=True)
    runs = {}
    for eval_freq in (1, 0):
        module, args = args_for(name, tmp_path / str(eval_freq), eval_freq=eval_freq, **common)
        runs[eval_freq] = module.main(args)
    evaluated, plain = (torch.load(checkpoints(runs[f]) / "last.pt", weights_only=True)["model"] for f in (1, 0))
    if normalizes:
        assert evaluated["obs_rms.count"] > 1  # the normalizer did learn during training
    for key, value in plain.items():
        assert torch.equal(evaluated[key], value), key


def test_an_evaluation_on_an_env_without_a_time_limit_stops_with_one_line():
    from cleanrl_embodied.shared.evaluation import evaluate
    from tests.instructed_envs import counting_env

    env = counting_env(terminate_at=[0, 0], max_steps=10**9)  # episodes never end
    with pytest.raises(SystemExit) as e:
        evaluate(lambda obs, generator, starts: torch.zeros(2, 1), env, 2, seed=0, max_decisions=50)
    message = str(e.value.code)
    assert message.startswith("error: evaluation: 2 of 2 eval envs") and "max_episode_steps" in message
    assert "\n" not in message
    chunked = evaluate(lambda obs, generator, starts: torch.zeros(2, 3, 1), counting_env([2, 4], 10), 2, seed=0)
    assert chunked["episodic_length"] == 3.0  # episodes of 2 and 4 steps, each run as chunks of 3


@pytest.mark.parametrize("chunk", [1, 3])
def test_the_policy_is_told_where_each_eval_episode_starts(chunk):
    """evaluate() hands the policy `starts`: the envs whose observation begins an episode (all of them after the
    reset, then those whose episode ended at the last decision), which a policy with memory resets at. The counting
    env's observation says it too (its step in the episode is 0 exactly there); with action chunks an episode may
    end inside a decision."""
    from cleanrl_embodied.shared.evaluation import evaluate
    from tests.instructed_envs import counting_env

    calls = []

    def act(obs, generator, starts):
        calls.append((obs.clone(), starts.clone()))
        return torch.zeros(2, chunk, 1) if chunk > 1 else torch.zeros(2, 1)

    evaluate(act, counting_env([2, 5], 10), 6, seed=0)
    assert len(calls) > 4 and calls[0][1].all()
    for obs, starts in calls:
        assert torch.equal(starts, obs[:, 0] == 0)
    assert any(starts.any() and not starts.all() for _, starts in calls)  # the envs' episodes end apart
