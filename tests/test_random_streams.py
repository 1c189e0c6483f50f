"""Independent random streams derived from the run seed: the training envs, the eval envs, torch's global generator
and the sampled evaluations each get a seed of their own, and the env streams of ranks and runs do not overlap."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cleanrl_embodied.shared import make_env
from cleanrl_embodied.shared.evaluation import evaluate
from tests.trainer_args import ONE_OF_EACH_KIND, TWO_SAVED_ITERATIONS, tiny_args, trainers

SCRIPTS = trainers(ONE_OF_EACH_KIND)


def tiny(name: str, tmp_path: Path, **overrides):
    return tiny_args(name, tmp_path, TWO_SAVED_ITERATIONS, **overrides)


def test_sampled_evaluation_draws_from_another_stream_than_the_eval_env():
    env = make_env("PushCubeRL", num_envs=2, seed=0)
    states = []

    def act(obs, gen, starts):
        states.append(gen.get_state())
        return torch.zeros(obs.shape[0], env.single_action_space.shape[0])

    evaluate(act, env, 2, seed=123)
    # PushCubeRL's reset(seed=123) seeds the env's generator with 123: the actions must not replay its numbers
    assert not torch.equal(states[0], torch.Generator().manual_seed(123).get_state())
    env.close()


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_every_stream_of_a_run_has_its_own_seed(tmp_path, name, monkeypatch):
    """The training envs, the eval envs, torch's global generator (init, sampling, shuffles) and the sampled
    evaluations get unrelated seeds derived from --seed; before, the training envs and torch both got --seed itself
    (a torch.Generator seeded like torch's global one draws the same numbers), and an evaluation's sampling
    generator the eval envs' reset seed."""
    import cleanrl_embodied.shared.builders as builders
    import cleanrl_embodied.shared.evaluation as evaluation

    seeds: dict[str, list[int]] = {"envs": [], "torch": [], "eval_reset": [], "eval_actions": []}
    make_env_, manual_seed, evaluate_ = builders.make_env, torch.manual_seed, evaluation.evaluate
    monkeypatch.setattr(
        builders, "make_env", lambda *a, seed=None, **k: seeds["envs"].append(seed) or make_env_(*a, seed=seed, **k)
    )
    monkeypatch.setattr(torch, "manual_seed", lambda seed: seeds["torch"].append(int(seed)) or manual_seed(seed))

    def recording_evaluate(act, env, num_episodes, seed, *rest):
        def sampling(obs, gen, starts):
            seeds["eval_actions"].append(gen.initial_seed())
            return act(obs, gen, starts)

        seeds["eval_reset"].append(seed)
        return evaluate_(sampling, env, num_episodes, seed, *rest)

    monkeypatch.setattr(evaluation, "evaluate", recording_evaluate)
    SCRIPTS[name].main(tiny(name, tmp_path, eval_deterministic=False, save_freq=0))
    eval_envs, train_envs = seeds["envs"]
    assert seeds["torch"] and seeds["eval_reset"] and seeds["eval_actions"]
    used = [train_envs, eval_envs, seeds["torch"][0], seeds["eval_reset"][0], seeds["eval_actions"][0]]
    assert len(set(used)) == len(used), used
    assert 1 not in used  # --seed 1 itself seeds nothing


def test_env_streams_of_ranks_and_runs_do_not_overlap():
    """ppo_ddp's rank r of seed s used seeds s + r * num_envs + i: rank 1 of seed 1 replayed rank 0 of seed
    1 + num_envs. Now every (seed, rank) has its own stream; their windows of 256 sub-env seeds do not overlap."""
    from cleanrl_embodied.shared.random_streams import STREAMS, stream_seed

    starts = sorted(stream_seed(seed, "train_envs", rank) for seed in range(1, 33) for rank in range(8))
    assert all(b - a >= 256 for a, b in zip(starts, starts[1:]))
    streams = {stream_seed(7, name) for name in STREAMS}
    assert len(streams) == len(STREAMS) and max(streams) < 2**30
