"""Flags whose effect is seen only inside a run, checked from outside: --env-vectorization (in which processes
the sub-envs run), --target-kl (how many optimizer steps an update makes), --max-grad-norm (the gradient the
optimizer steps with), and the one-line errors for env kwargs a Gymnasium id refuses and for a missing envpool."""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

import pytest

from cleanrl_embodied import ppo_continuous
from cleanrl_embodied.shared import make_env

TEST_ENV = "tests.envs_for_tests:PointReach-v0"
TRAINERS = ["ppo_continuous", "ppo_ddp", "ppo_async", "grpo"]
TINY = dict(
    num_envs=4,
    num_steps=10,
    num_minibatches=2,
    update_epochs=3,
    num_eval_envs=2,
    num_eval_episodes=2,
    hidden_sizes=(16,),
    eval_freq=0,
    save_freq=0,
    cuda=False,
)


def args_for(name: str, tmp_path: Path, **overrides):
    module = importlib.import_module(f"cleanrl_embodied.{name}")
    extra = {"group_size": 2} if name == "grpo" else {}
    return module, module.Args(output_dir=str(tmp_path), **{**TINY, **extra, **overrides})


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_env_vectorization_decides_in_which_processes_the_sub_envs_run(tmp_path, vectorization):
    """Each PointReach sub-env writes the id of the process that built it: with sync all are this process, with
    async each training sub-env is built in a worker process of its own."""
    pids = tmp_path / "pids"
    out = ppo_continuous.main(
        ppo_continuous.Args(
            **dict(TINY, update_epochs=1),
            env_id=TEST_ENV,
            env_vectorization=vectorization,
            env_kwargs=f'{{"pid_file": "{pids}"}}',
            eval_env_kwargs='{"max_episode_steps": 5}',
            total_timesteps=2 * 4 * 10,
            output_dir=str(tmp_path),
        )
    )
    assert out["global_step"] == 80
    built_in = [int(line) for line in pids.read_text().split()]
    others = set(built_in) - {os.getpid()}
    if vectorization == "sync":
        assert built_in == [os.getpid()] * 4
    else:
        assert len(others) == 4 and len([p for p in built_in if p in others]) == 4  # one worker per sub-env
    with pytest.raises(ValueError, match="--env-vectorization"):
        make_env("Pendulum-v1", num_envs=2, vectorization="threads")
