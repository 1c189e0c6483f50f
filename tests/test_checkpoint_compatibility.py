"""A checkpoint records the env it was made for (id, kwargs, observation layout): a --resume or --eval-checkpoint
on envs whose observations or actions mean something else is refused in one line, harmless option changes are
allowed and named. Checkpoints from before that record existed (tests/fixtures/, made by
tests/fixtures/make_checkpoints.py) still resume and evaluate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cleanrl_embodied import ppo_continuous
from tests.checks import exits_in_one_line
from tests.trainer_args import ONE_OF_EACH_KIND, TWO_SAVED_ITERATIONS, tiny_args, trainers

SCRIPTS = trainers(ONE_OF_EACH_KIND)


def tiny(name: str, tmp_path: Path, **overrides):
    return tiny_args(name, tmp_path, TWO_SAVED_ITERATIONS, **overrides)


# The env a checkpoint was made for: recorded, checked on --resume and --eval-checkpoint.
def first_checkpoint(name: str, tmp_path: Path, **overrides) -> tuple[Path, dict]:
    out = SCRIPTS[name].main(tiny(name, tmp_path / "first", **overrides))
    path = Path(out["run_dir"]) / "checkpoints" / "iter_000001.pt"
    return path, torch.load(path, weights_only=True)


def test_a_checkpoint_records_its_env_options_and_observation_layout(tmp_path):
    kwargs = '{"obs_mode": "dict", "push_friction_range": [0.5, 1.5]}'
    _, ckpt = first_checkpoint("ppo_continuous", tmp_path, env_kwargs=kwargs, eval_env_kwargs='{"obs_mode": "dict"}')
    record = ckpt["env"]
    assert record["env_id"] == "PushCubeRL" and record["env_kwargs"] == json.loads(kwargs)
    assert record["eval_env_kwargs"] == {"obs_mode": "dict"}
    leaves = record["observation"]["leaves"]
    assert record["observation"]["flattened"] and [path for path, _, _ in leaves][:2] == [
        "goal/goal_pos",
        "object/cube_pos",
    ]
    assert sum(int(np.prod(shape)) for _, shape, _ in leaves) == ckpt["obs_dim"] == 31


@pytest.mark.parametrize("name", list(SCRIPTS))
@pytest.mark.parametrize(
    "option, trained, here",
    [("obs_mode", "dict", "state"), ("action_mode", "joint_pos", "joint_delta")],  # same sizes, other meaning
)
def test_another_observation_or_action_meaning_is_refused(tmp_path, name, option, trained, here):
    kwargs = json.dumps({option: trained})
    path, _ = first_checkpoint(name, tmp_path, env_kwargs=kwargs, eval_env_kwargs=kwargs)
    other = json.dumps({option: here})
    for flag_name, kwargs_flag in (("resume", "env_kwargs"), ("eval_checkpoint", "eval_env_kwargs")):
        args = tiny(name, tmp_path / flag_name, **{flag_name: str(path), "env_kwargs": other, "eval_env_kwargs": other})
        message = exits_in_one_line(lambda args=args: SCRIPTS[name].main(args))
        expected = f"--{flag_name.replace('_', '-')} {path}: its env had {option}={trained!r} (--env-kwargs), this "
        assert message.startswith(f"error: {expected}"), message
        assert f"--{kwargs_flag.replace('_', '-')} give {option}={here!r}" in message, message
        assert not (tmp_path / flag_name).exists()
    # the same options are accepted
    same = tiny(name, tmp_path / "same", eval_checkpoint=str(path), env_kwargs=kwargs, eval_env_kwargs=kwargs)
    assert SCRIPTS[name].main(same)["global_step"] == 20


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_harmless_env_changes_on_resume_are_allowed_and_named(tmp_path, name, capsys):
    """Adding ``randomize_interval`` (an interval-randomization wrapper the saved env state lacks) used to end in a
    KeyError traceback; randomization and friction options change neither observations nor actions."""
    path, _ = first_checkpoint(name, tmp_path)
    kwargs = '{"randomize_interval": 3, "push_friction_range": [0.5, 1.5]}'
    out = SCRIPTS[name].main(tiny(name, tmp_path / "resumed", resume=str(path), env_kwargs=kwargs))
    assert out["global_step"] == 40
    printed = capsys.readouterr().out
    assert (
        f"note: --resume {path}: env options differ from its --env-kwargs: push_friction_range None -> [0.5, 1.5], "
        in printed
    )
    assert "randomize_interval None -> 3 (allowed" in printed, printed


def test_gymnasium_options_must_match_unless_known_to_be_harmless(tmp_path):
    """For ids whose options this code cannot judge, every option counts (a default counts as given); an
    --eval-checkpoint may use the options of the checkpoint's training envs or of its eval envs (which inherit the
    training envs' options, so here both have g=9)."""
    common = dict(env_id="Pendulum-v1", env_kwargs='{"g": 9.0}')
    path, _ = first_checkpoint("ppo_continuous", tmp_path, **common)
    message = exits_in_one_line(
        lambda: ppo_continuous.main(tiny("ppo_continuous", tmp_path / "b", resume=str(path), env_id="Pendulum-v1"))
    )
    assert "its env had g=9.0 (--env-kwargs), this run's --env-kwargs give g=10.0" in message, message
    message = exits_in_one_line(
        lambda: ppo_continuous.main(
            tiny(
                "ppo_continuous",
                tmp_path / "c",
                eval_checkpoint=str(path),
                env_id="Pendulum-v1",
                eval_env_kwargs='{"g": 5.0}',
            )
        )
    )
    assert "its env had g=9.0 (--env-kwargs), this run's --eval-env-kwargs give g=5.0" in message, message
    for eval_kwargs in ('{"g": 9.0}', '{"g": 9.0, "max_episode_steps": 100}'):  # the same env; a harmless change
        ppo_continuous.main(
            tiny(
                "ppo_continuous",
                tmp_path / "d",
                eval_checkpoint=str(path),
                env_id="Pendulum-v1",
                eval_env_kwargs=eval_kwargs,
            )
        )
    resumed = ppo_continuous.main(
        tiny(
            "ppo_continuous",
            tmp_path / "e",
            resume=str(path),
            total_timesteps=3 * 20,
            env_kwargs='{"g": 9.0, "max_episode_steps": 100}',
            env_id="Pendulum-v1",
        )
    )
    assert resumed["global_step"] == 60


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_another_observation_layout_is_refused(tmp_path, name):
    """A checkpoint whose recorded observation entries differ (here: edited, as another version of an env would
    give) is refused in one line naming the first entry that differs."""
    path, ckpt = first_checkpoint(
        name, tmp_path, env_kwargs='{"obs_mode": "dict"}', eval_env_kwargs='{"obs_mode": "dict"}'
    )
    ckpt["env"]["observation"]["leaves"][0][0] = "goal/target"
    torch.save(ckpt, tmp_path / "edited.pt")
    message = exits_in_one_line(
        lambda: SCRIPTS[name].main(
            tiny(
                name,
                tmp_path / "b",
                resume=str(tmp_path / "edited.pt"),
                env_kwargs='{"obs_mode": "dict"}',
                eval_env_kwargs='{"obs_mode": "dict"}',
            )
        )
    )
    assert message == (
        "error: --resume: the checkpoint's observation entry 0 is goal/target (3,) float32 there, goal/goal_pos (3,) "
        "float32 here (pass the env options it was trained with)"
    )


# Checkpoints written before the env record and the independent random streams.
@pytest.mark.parametrize("name", [name for name in SCRIPTS if name != "ppo_vla_async"])  # (ppo_async.pt: refused)
def test_checkpoints_of_the_previous_code_still_resume_and_evaluate(tmp_path, name):
    """tests/fixtures/{name}.pt were written by main before checkpoints recorded their env
    (tests/fixtures/make_checkpoints.py): no env record, the old random streams. They resume (the env options are
    checked against the ones in their args) and evaluate."""
    from tests.fixtures.make_checkpoints import RUNS

    path = Path(__file__).parent / "fixtures" / f"{name}.pt"
    module, kwargs = RUNS[name]
    assert "env" not in torch.load(path, weights_only=True)
    resumed = module.main(module.Args(output_dir=str(tmp_path / "resumed"), resume=str(path), **kwargs))
    assert resumed["global_step"] == 40
    ckpt = torch.load(Path(resumed["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["iteration"] == 2 and ckpt["env"]["env_id"] == "PushCubeRL"
    evaluated = module.main(module.Args(output_dir=str(tmp_path / "eval"), eval_checkpoint=str(path), **kwargs))
    assert evaluated["global_step"] == 20 and evaluated["eval"]["episodic_length"] > 0
    message = exits_in_one_line(  # and a changed meaning is refused for them too
        lambda: module.main(
            module.Args(
                output_dir=str(tmp_path / "x"),
                resume=str(path),
                **{**kwargs, "env_kwargs": '{"obs_mode": "dict"}', "eval_env_kwargs": '{"obs_mode": "dict"}'},
            )
        )
    )
    assert "its env had obs_mode='state' (--env-kwargs), this run's --env-kwargs give obs_mode='dict'" in message


def test_the_schedule_note_names_the_iteration_and_learning_rate_the_run_uses():
    """note_schedule_change takes the start iteration the trainer computed (after a resume across world sizes it is
    global_step // this run's batch + 1, not the checkpoint's iteration + 1) and speaks only when the learning rate
    there differs from the one the checkpoint's run would have used next."""
    from cleanrl_embodied import shared

    said = []
    two_ranks = {"iteration": 3, "num_iterations": 6}  # 3 of 6 iterations of a global batch of 160
    shared.note_schedule_change(two_ranks, 7, 12, 1e-3, True, said.append)  # alone, batch 80: the same plan
    assert said == []  # 0.0005 either way: the schedule did not change
    shared.note_schedule_change(two_ranks, 7, 24, 1e-3, True, said.append)  # alone and twice as long
    assert said == [
        "this run has 24 iterations, the checkpoint's run 6: the learning rate follows the 24-iteration schedule, "
        "0.00075 at iteration 7 (the old schedule had 0.0005)"
    ]
    said.clear()
    shared.note_schedule_change({"iteration": 2, "num_iterations": 4}, 3, 8, 1e-3, True, said.append)
    assert said == [
        "this run has 8 iterations, the checkpoint's run 4: the learning rate follows the 8-iteration schedule, "
        "0.00075 at iteration 3 (the old schedule had 0.0005)"
    ]
    said.clear()
    shared.note_schedule_change({"iteration": 2, "num_iterations": 4}, 3, 8, 1e-3, False, said.append)
    assert said == []  # --no-anneal-lr: the learning rate is 1e-3 throughout


@pytest.mark.parametrize(
    "cls, old_path",
    [("NonFiniteWatch", "cleanrl_embodied.shared.runtime"), ("RolloutStats", "cleanrl_embodied.shared.logging")],
)
def test_objects_a_checkpoint_pickled_under_their_modules_old_names_still_load(tmp_path, cls, old_path):
    """ppo_vla_async's checkpoints pickle the pending rollouts' NonFiniteWatch and RolloutStats objects, whose modules
    were renamed (runtime.py -> non_finite.py, logging.py -> rollout_stats.py): a file that names the old path loads
    with weights_only=True, in a fresh process, as the object it was."""
    import subprocess
    import sys
    import types

    from cleanrl_embodied import shared

    klass = getattr(shared, cls)
    obj = klass(4, "cpu") if cls == "NonFiniteWatch" else klass("cpu")
    old = types.ModuleType(old_path)
    setattr(old, cls, klass)
    real = klass.__module__
    sys.modules[old_path], klass.__module__ = old, old_path  # pickled as the old code pickled it
    try:
        torch.save({"watch": obj}, tmp_path / "old.pt")
    finally:
        klass.__module__ = real
        del sys.modules[old_path]
    assert old_path.encode() in (tmp_path / "old.pt").read_bytes()
    code = (f"import torch; from cleanrl_embodied import shared; "
            f"x = torch.load({str(tmp_path / 'old.pt')!r}, weights_only=True)['watch']; "
            f"assert type(x) is shared.{cls}, type(x); print('ok')")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
