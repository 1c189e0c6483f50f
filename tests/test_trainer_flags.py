"""Flags whose effect is seen only inside a run, checked from outside: --env-vectorization (in which processes
the sub-envs run), --target-kl (how many optimizer steps an update makes), --max-grad-norm (the gradient the
optimizer steps with), and the one-line errors for env kwargs a Gymnasium id refuses and for a missing envpool,
for a numeric flag out of its range (every numeric flag of every trainer is checked) and for --resume and
--eval-checkpoint given together."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import toy_policies

from cleanrl_embodied import ppo_continuous
from cleanrl_embodied.shared import make_env
from tests.checks import exits_in_one_line, one_line_exit
from tests.trainer_args import FOUR_ENVS, ONE_OF_EACH_KIND, TWO_SAVED_ITERATIONS, tiny_args, trainer, trainers

TEST_ENV = "tests.envs_for_tests:PointReach-v0"
TRAINERS = ["ppo_continuous", "ppo_ddp", "ppo_vla_async", "grpo", "ppo_recurrent"]
TINY = dict(FOUR_ENVS, num_steps=10, update_epochs=3, hidden_sizes=(16,), eval_freq=0, save_freq=0)


def args_for(name: str, tmp_path: Path, **overrides):
    return trainer(name), tiny_args(name, tmp_path, TINY, **overrides)


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_env_vectorization_decides_in_which_processes_the_sub_envs_run(tmp_path, vectorization):
    """Each PointReach sub-env writes the id of the process that built it: with sync all are this process, with
    async each sub-env is built in a worker process of its own (the eval envs inherit --env-kwargs, pid_file too,
    so they write theirs as well)."""
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
    sub_envs = TINY["num_envs"] + TINY["num_eval_envs"]
    if vectorization == "sync":
        assert built_in == [os.getpid()] * sub_envs
    else:
        assert len(others) == sub_envs and len([p for p in built_in if p in others]) == sub_envs  # one worker each
    with pytest.raises(ValueError, match="--env-vectorization"):
        make_env("Pendulum-v1", num_envs=2, vectorization="threads")


def train_calls(name: str, tmp_path: Path, **overrides) -> list[float]:
    """GRAD_NORMS of a 3-iteration run: one entry per optimizer step (minibatch), the norm of the gradient it used."""
    toy_policies.GRAD_NORMS.clear()
    module, args = args_for(name, tmp_path, total_timesteps=3 * 4 * 10, policy="toy_policies:grad_norms", **overrides)
    module.main(args)
    return list(toy_policies.GRAD_NORMS)


@pytest.mark.parametrize("name", TRAINERS)
def test_target_kl_stops_the_epochs_of_an_update_early(tmp_path, name):
    """Without --target-kl every update makes update_epochs x num_minibatches steps; with a target every epoch's
    KL exceeds (1e-12), each update stops after its first epoch; with one no epoch reaches, none stops."""
    full, per_epoch = 3 * TINY["update_epochs"] * TINY["num_minibatches"], 3 * TINY["num_minibatches"]
    assert len(train_calls(name, tmp_path / "none", target_kl=None)) == full
    assert len(train_calls(name, tmp_path / "tiny", target_kl=1e-12)) == per_epoch
    assert len(train_calls(name, tmp_path / "huge", target_kl=1e9)) == full


@pytest.mark.parametrize("name", TRAINERS)
def test_max_grad_norm_clips_the_gradient_the_optimizer_steps_with(tmp_path, name):
    """The gradient each optimizer step uses has norm --max-grad-norm where the raw one was larger, which without
    clipping it is."""
    clipped = train_calls(name, tmp_path / "clip", target_kl=None, max_grad_norm=0.01)
    assert len(clipped) == 3 * TINY["update_epochs"] * TINY["num_minibatches"]
    assert clipped == pytest.approx([0.01] * len(clipped), rel=1e-4)
    raw = train_calls(name, tmp_path / "raw", target_kl=None, max_grad_norm=1e6)
    assert min(raw) > 0.02 and len(set(raw)) == len(raw)  # larger, and each its own


@pytest.mark.parametrize(
    "env_id, kwargs, named",
    [
        ("Pendulum-v1", '{"no_such_option": 1}', "no_such_option"),  # the constructor's TypeError
        (TEST_ENV, '{"dim": "two"}', "two"),  # the constructor's ValueError
    ],
)
@pytest.mark.parametrize("flag", ["env_kwargs", "eval_env_kwargs"])
@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_env_kwargs_a_gymnasium_id_refuses_are_one_line(tmp_path, env_id, kwargs, named, flag, vectorization):
    with pytest.raises(SystemExit) as e:
        ppo_continuous.main(
            ppo_continuous.Args(
                **TINY, env_id=env_id, env_vectorization=vectorization, output_dir=str(tmp_path), **{flag: kwargs}
            )
        )
    message = str(e.value.code)
    # the flag that carried the option, first (the eval envs, built first, inherit --env-kwargs' options)
    named_flags = "--env-kwargs (inherited by the eval envs) / --eval-env-kwargs" if flag == "env_kwargs" else None
    assert message.startswith(f"error: {named_flags or '--eval-env-kwargs'} / --env-id {env_id}: ") and named in message
    assert "\n" not in message
    assert not list(tmp_path.glob("*/summary.json"))  # refused before any run started


@pytest.mark.skipif(importlib.util.find_spec("envpool") is not None, reason="envpool is installed here")
def test_envpool_missing_is_one_line_saying_how_to_install_it(tmp_path):
    hint = "`uv sync --extra mujoco --extra envpool`"
    with pytest.raises(ValueError) as e:
        make_env("HalfCheetah-v5", num_envs=2, vectorization="envpool")
    assert "\n" not in str(e.value) and "--env-vectorization envpool needs the envpool package" in str(e.value)
    assert hint in str(e.value)
    with pytest.raises(SystemExit) as e:
        ppo_continuous.main(
            ppo_continuous.Args(**TINY, env_id="HalfCheetah-v5", env_vectorization="envpool", output_dir=str(tmp_path))
        )
    assert hint in one_line_exit(e)
    assert not list(tmp_path.iterdir())


SCRIPTS = trainers(ONE_OF_EACH_KIND)


def tiny(name: str, tmp_path: Path, **overrides):
    return tiny_args(name, tmp_path, TWO_SAVED_ITERATIONS, **overrides)


# Every numeric flag of every trainer is checked for its range; a bad value is one line, before anything is built.
NAN, INF = float("nan"), float("inf")
COMMON_BAD = [
    ({"max_grad_norm": -1.0}, "--max-grad-norm must be > 0, got -1.0"),  # was gradient ascent
    ({"max_grad_norm": 0.0}, "--max-grad-norm must be > 0, got 0.0"),  # was no learning at all
    ({"target_kl": 0.0}, "--target-kl must be > 0, got 0.0"),
    ({"target_kl": -0.1}, "--target-kl must be > 0, got -0.1"),
    ({"clip_coef": 0.0}, "--clip-coef must be > 0, got 0.0"),
    ({"learning_rate": NAN}, "--learning-rate must be a finite number, got nan"),
    ({"learning_rate": INF}, "--learning-rate must be a finite number, got inf"),
    ({"gamma": NAN}, "--gamma must be a finite number, got nan"),
    ({"ent_coef": NAN}, "--ent-coef must be a finite number, got nan"),
    ({"init_logstd": NAN}, "--init-logstd must be a finite number, got nan"),
    ({"seed": -1}, "--seed must be >= 0, got -1"),
]
PPO_BAD = [
    ({"vf_coef": 0.0}, "--vf-coef must be > 0, got 0.0"),  # the critic would never learn
    ({"gae_lambda": NAN}, "--gae-lambda must be a finite number, got nan"),
    ({"clip_obs": NAN}, "--clip-obs must be a finite number, got nan"),
]
CASES = [(name, *case) for name in SCRIPTS for case in COMMON_BAD + (PPO_BAD if name != "grpo" else [])]
CASES = [(n, o, m) for n, o, m in CASES if n != "ppo_vla_async" or not {"init_logstd", "clip_obs"} & set(o)]  # (VLA)
CASES += [("grpo", {"kl_coef": NAN}, "--kl-coef must be a finite number, got nan")]
CASES += [("grpo", {"adv_eps": INF}, "--adv-eps must be a finite number, got inf")]


@pytest.mark.parametrize("name, overrides, message", CASES)
def test_numeric_flags_out_of_range_are_one_line(tmp_path, name, overrides, message):
    got = exits_in_one_line(lambda: SCRIPTS[name].main(tiny(name, tmp_path / "runs", **overrides)))
    assert got.startswith(f"error: {message}"), got
    assert not (tmp_path / "runs").exists()  # refused before anything was built


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_unbounded_clipping_is_still_allowed(name):
    """``inf`` is a meaningful --max-grad-norm (no clipping), as for --clip-obs and --clip-reward."""
    clip_obs = {} if name in ("grpo", "ppo_vla_async") else {"clip_obs": INF}
    args = tiny(name, Path("unused"), max_grad_norm=INF, **clip_obs)
    SCRIPTS[name].validate(*((args, True) if name == "ppo_ddp" else (args,)))


# --resume A --eval-checkpoint B is refused (it would evaluate A and call it B).
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_resume_and_eval_checkpoint_together_are_refused(tmp_path, name):
    first = SCRIPTS[name].main(tiny(name, tmp_path / "a"))
    a = Path(first["run_dir"]) / "checkpoints" / "iter_000001.pt"
    b = Path(first["run_dir"]) / "checkpoints" / "last.pt"
    message = exits_in_one_line(
        lambda: SCRIPTS[name].main(tiny(name, tmp_path / "b", resume=str(a), eval_checkpoint=str(b)))
    )
    assert "--resume" in message and "--eval-checkpoint" in message, message
    assert not (tmp_path / "b").exists()
