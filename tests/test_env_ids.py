"""Env ids from the command line: Gymnasium's ``module:EnvId`` form (the module is imported, its registration
runs, then the id is used) in check_env_id / make_env / a real training run, one-line errors for modules that
can't be imported, and ManiSkill left alone (not imported, nothing printed) for ids that aren't ManiSkill's."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from cleanrl_embodied import ppo_continuous as ppo
from cleanrl_embodied.shared import check_env_id, make_env
from cleanrl_embodied.shared.envs import maniskill_backend, resolve_env_id
from tests.trainer_args import FOUR_ENVS, tiny_args

TEST_ENV = "tests.envs_for_tests:PointReach-v0"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def clean_import_state(monkeypatch):
    """Give a test its own sys.path; afterwards forget the throw-away modules (``*_for_tests``, outside
    tests/envs_for_tests.py) and ids (``*ForTests*``) it made."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for env_id in [i for i in gym.registry if "ForTests" in i]:
        del gym.registry[env_id]
    for name in [n for n in sys.modules if n.endswith("_for_tests") and "envs_for_tests" not in n]:
        del sys.modules[name]


# ---------------------------------------------------------------------------------------------------
# module:EnvId
# ---------------------------------------------------------------------------------------------------
def test_module_env_id_is_imported_then_used(monkeypatch):
    monkeypatch.delitem(sys.modules, "tests.envs_for_tests", raising=False)  # as in a fresh process
    for env_id in ("PointReach-v0", "PointReachDict-v0"):  # restored afterwards, with the module
        monkeypatch.delitem(gym.registry, env_id, raising=False)
    assert resolve_env_id("Pendulum-v1") == "Pendulum-v1"  # plain ids are left alone
    assert check_env_id(TEST_ENV) == "PointReach-v0"  # the import registered it
    assert "tests.envs_for_tests" in sys.modules and "PointReach-v0" in gym.registry

    env = make_env(TEST_ENV, num_envs=3, seed=0)
    assert env.spec.id == "PointReach-v0"
    obs, _ = env.reset()
    assert obs.shape == (3, 4) and obs.dtype == torch.float32
    succeeded = torch.zeros(3, dtype=torch.bool)
    for _ in range(12):  # pushing along the observed offset reaches the target: success ends the episode
        obs, reward, terminated, truncated, info = env.step(obs[:, 2:] * 10)
        assert info["success"].dtype == torch.bool and torch.equal(info["success"], terminated)
        succeeded |= info["success"]
    assert succeeded.all()
    env.close()

    dict_env = make_env("tests.envs_for_tests:PointReachDict-v0", num_envs=2, seed=0)  # Dict obs -> flat
    assert dict_env.reset()[0].shape == (2, 4)
    dict_env.close()


def test_fault_injection_kwargs_of_the_test_env():
    env = make_env(TEST_ENV, num_envs=1, seed=0, nan_obs_at_step=3)
    env.reset()
    finite = [bool(torch.isfinite(env.step(torch.zeros(1, 2))[0]).all()) for _ in range(4)]
    assert finite == [True, True, False, True]
    env = make_env(TEST_ENV, num_envs=1, seed=0, raise_at_step=2)
    env.reset()
    env.step(torch.zeros(1, 2))
    with pytest.raises(RuntimeError, match="raise_at_step=2"):
        env.step(torch.zeros(1, 2))


def test_unimportable_module_is_one_line_with_the_install_command():
    with pytest.raises(ValueError) as err:
        check_env_id("gymnasium_robotics_not_installed_here:PointMaze_UMazeDense-v3")
    message = str(err.value)
    assert "\n" not in message and "'gymnasium_robotics_not_installed_here'" in message
    assert "uv pip install gymnasium-robotics-not-installed-here" in message
    assert "pip install gymnasium-robotics-not-installed-here" in message.split("without uv")[1]


def test_a_module_that_registers_no_such_id_or_breaks_on_import(tmp_path, monkeypatch, clean_import_state):
    with pytest.raises(ValueError) as err:
        check_env_id("tests.envs_for_tests:PointReach-v9")
    assert "\n" not in str(err.value) and "'PointReach-v9'" in str(err.value) and "PointReach-v0" in str(err.value)
    for bad in ("a:b:c", ":PointReach-v0", "tests.envs_for_tests:"):
        with pytest.raises(ValueError, match="module:EnvId"):
            check_env_id(bad)

    (tmp_path / "broken_tasks_for_tests.py").write_text("raise RuntimeError('task assets missing')\n")
    (tmp_path / "needs_dep_for_tests.py").write_text("import some_missing_dependency_xyz\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        check_env_id("broken_tasks_for_tests:Task-v0")
    assert "\n" not in str(err.value) and "RuntimeError: task assets missing" in str(err.value)
    with pytest.raises(ValueError) as err:  # the module exists; what is missing is its dependency
        check_env_id("needs_dep_for_tests:Task-v0")
    message = str(err.value)
    assert "'needs_dep_for_tests' needs 'some_missing_dependency_xyz'" in message
    assert "uv pip install some-missing-dependency-xyz" in message


def test_a_module_in_the_current_directory_is_found(tmp_path, monkeypatch, clean_import_state):
    """`python cleanrl_embodied/ppo_continuous.py` puts the script's folder on sys.path; a task file beside the
    user (`my_tasks.py`) must still be importable, as it is for `python my_train.py`."""
    (tmp_path / "my_tasks_for_tests.py").write_text(
        textwrap.dedent("""
        import gymnasium as gym
        gym.register("MyTaskForTests-v0", entry_point="tests.envs_for_tests:PointReach", max_episode_steps=5)
    """)
    )
    monkeypatch.chdir(tmp_path)
    sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
    assert check_env_id("my_tasks_for_tests:MyTaskForTests-v0") == "MyTaskForTests-v0"
    assert make_env("my_tasks_for_tests:MyTaskForTests-v0", num_envs=2).reset()[0].shape == (2, 4)


def test_ppo_continuous_trains_on_a_module_env_id(tmp_path):
    """One short real run through main(Args(env_id="module:EnvId")): dir name, summary, success, checkpoint."""
    common = dict(
        FOUR_ENVS, env_id=TEST_ENV, num_steps=25, update_epochs=2, hidden_sizes=(16, 16), output_dir=str(tmp_path)
    )
    out = ppo.main(ppo.Args(**common, total_timesteps=300))
    run_dir = Path(out["run_dir"])
    assert run_dir.name.startswith("PointReach-v0__ppo_continuous__1__")  # no ':' in paths
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_id"] == TEST_ENV and summary["global_step"] == 300
    assert "charts/success_rate" in summary["train"]  # the env's info["success"] was picked up
    assert summary["eval"]["success_rate"] is not None
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["args"]["env_id"] == TEST_ENV
    # the stored id serves a later process: evaluating the checkpoint resolves it again
    again = ppo.main(ppo.Args(**common, eval_checkpoint=str(run_dir / "checkpoints" / "last.pt")))
    assert again["global_step"] == 300 and again["eval"]["episodic_length"] > 0


def test_grpo_trains_on_a_module_env_id(tmp_path):
    """GRPO's group resets go through seeded Gymnasium sub-envs here: a second trainer on the same path."""
    from cleanrl_embodied import grpo

    out = grpo.main(
        tiny_args(grpo, tmp_path, FOUR_ENVS, env_id=TEST_ENV, total_timesteps=4 * 50 * 2, update_epochs=1,
                  hidden_sizes=(16, 16))
    )  # fmt: skip
    summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
    assert summary["env_id"] == TEST_ENV and summary["global_step"] == 400
    assert Path(out["run_dir"]).name.startswith("PointReach-v0__")


@pytest.mark.parametrize("script", ["ppo_continuous", "grpo", "ppo_ddp", "ppo_vla_async", "grpo_vla"])
def test_every_trainer_refuses_an_unimportable_module_in_one_line(tmp_path, script):
    trainer = importlib.import_module(f"cleanrl_embodied.{script}")
    with pytest.raises(SystemExit) as e:
        trainer.main(trainer.Args(env_id="no_such_task_package_xyz:Reach-v0", output_dir=str(tmp_path), cuda=False))
    message = str(e.value.code)
    assert message.startswith("error: --env-id") and "\n" not in message
    assert "'no_such_task_package_xyz'" in message and "pip install no-such-task-package-xyz" in message
    assert not list(tmp_path.iterdir())  # refused before any run directory was made


# ---------------------------------------------------------------------------------------------------
# ManiSkill: imported (and heard from) only for ManiSkill ids
# ---------------------------------------------------------------------------------------------------
def test_maniskill_is_looked_up_only_for_unknown_ids_and_stays_quiet(monkeypatch, capfd, clean_import_state):
    """Pretend the maniskill extra is installed, with an import that prints like SAPIEN does (to fd 2, from C++)."""
    imports = []
    real_find_spec = importlib.util.find_spec

    def fake_import():
        imports.append(1)
        os.write(2, b"[svulkan2] [warning] A Vulkan render device was not found\n")
        print("sapien: no render device", file=sys.stderr)
        gym.register("FakeManiSkillTaskForTests-v1", entry_point="mani_skill.envs.fake_for_tests:Task")

    monkeypatch.setattr(
        maniskill_backend.importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "mani_skill" else real_find_spec(name, *a),
    )
    monkeypatch.setattr(maniskill_backend, "_import_maniskill", fake_import)

    for env_id in ("Pendulum-v1", "PushCubeRL", TEST_ENV):  # known to Gymnasium (after importing the module)
        check_env_id(env_id)
    assert imports == []
    with pytest.raises(ValueError, match="Pendulm-v1"):  # a typo: ManiSkill is looked up, and keeps quiet
        check_env_id("Pendulm-v1")
    assert imports == [1]
    captured = capfd.readouterr()
    assert "Vulkan" not in captured.err + captured.out and "sapien" not in captured.err + captured.out

    gym.registry.pop("FakeManiSkillTaskForTests-v1")  # a ManiSkill id: what the import printed is shown
    assert maniskill_backend.is_maniskill_id("FakeManiSkillTaskForTests-v1")
    captured = capfd.readouterr()
    assert "A Vulkan render device was not found" in captured.err and "sapien: no render device" in captured.err


@pytest.mark.skipif(importlib.util.find_spec("mani_skill") is None, reason="needs the maniskill extra")
def test_real_maniskill_is_not_imported_for_other_ids():
    code = (
        "import sys; from cleanrl_embodied.shared import check_env_id, make_env; "
        f"check_env_id('Pendulum-v1'); make_env('{TEST_ENV}', num_envs=2).reset(); "
        "assert 'mani_skill' not in sys.modules and 'sapien' not in sys.modules, 'imported'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "" and proc.stderr.strip() == ""


def test_an_id_with_only_a_vector_entry_point_trains_and_logs_success_per_task(tmp_path):
    """A multi-task suite's way to register (`gym.make_vec` works, `gym.make` does not): the id serves the contract,
    each sub-env runs its own task, and training logs success per task from the env's `info["task_id"]`."""
    from tests.envs_for_tests import MULTI_TASK_ID, TASK_NAMES

    with pytest.raises(Exception):  # noqa: B017 - what Gymnasium itself says (no single-env entry point)
        gym.make(MULTI_TASK_ID)
    env = make_env(f"tests.envs_for_tests:{MULTI_TASK_ID}", num_envs=8, seed=0)
    obs, info = env.reset(seed=0)
    assert obs.shape == (8, 6) and obs[:, 2:].argmax(-1).tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    ended = None
    for _ in range(25):  # truncated after 20 steps at the latest
        obs, reward, terminated, truncated, info = env.step(torch.zeros(8, 2))
        if info["_episode"].any():
            ended = info
            break
    assert ended is not None and ended["episode"]["task_id"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert torch.equal(ended["final_obs"][:, 2:].argmax(-1), torch.tensor([0, 1, 2, 3] * 2))
    args = ppo.Args(
        env_id=f"tests.envs_for_tests:{MULTI_TASK_ID}", num_envs=8, num_steps=25, num_minibatches=2, update_epochs=1,
        total_timesteps=8 * 25 * 2, eval_freq=0, save_freq=0, num_eval_envs=4, num_eval_episodes=4, cuda=False,
        output_dir=str(tmp_path), hidden_sizes=(16,),
    )  # fmt: skip
    summary = json.loads((Path(ppo.main(args)["run_dir"]) / "summary.json").read_text())
    assert {f"charts/success_rate/{task}" for task in TASK_NAMES} <= set(summary["train"])
    assert {f"success_rate/{task}" for task in TASK_NAMES} <= set(summary["eval"])


def first_episodes(env, num_envs: int) -> dict:
    """The info of the first step at which every sub-env's first episode has ended (at once here: the suite's
    episodes all last one step or all 20)."""
    for _ in range(25):
        _, _, _, _, info = env.step(torch.zeros(num_envs, 2))
        if info["_episode"].all():
            return info
    raise AssertionError("no episode ended")


@pytest.mark.parametrize("names_by", ["task_name", "task", "spec", "info"])
def test_a_suites_vector_env_tells_its_sub_envs_tasks_apart_by_attribute_spec_or_info(names_by):
    """Meta-World's MT ids and LeRobot's LIBERO envs build a Gymnasium vector env with a task per sub-env and name
    it only on the sub-env (``task_name``, ``task``) or by its spec; others report ``info["task_id"]``. make_env
    names the tasks in ``metadata["task_names"]`` and gives each step's and each episode's task, whichever way."""
    from tests.envs_for_tests import SUITE_ID, SUITE_TASKS

    env = make_env(f"tests.envs_for_tests:{SUITE_ID}", num_envs=4, seed=0, names_by=names_by)
    names = tuple(f"SuiteTask{task.capitalize()}-v0" for task in SUITE_TASKS) if names_by == "spec" else SUITE_TASKS
    assert tuple(env.metadata["task_names"]) == names
    _, info = env.reset(seed=0)
    assert info["task_id"].tolist() == [0, 1, 0, 1]
    ended = first_episodes(env, 4)  # "always" ends at its first step, "never" after 20
    assert ended["episode"]["task_id"].tolist() == [0, 1, 0, 1] and ended["task_id"].tolist() == [0, 1, 0, 1]
    assert ended["episode"]["success"].tolist() == [1.0, 0.0, 1.0, 0.0]


def test_the_tasks_of_an_async_suite_are_read_from_its_workers():
    from tests.envs_for_tests import SUITE_ID, SUITE_TASKS

    env = make_env(f"tests.envs_for_tests:{SUITE_ID}", num_envs=2, seed=0, vector_strategy="async")
    try:
        assert tuple(env.metadata["task_names"]) == SUITE_TASKS
        env.reset(seed=0)
        assert env.step(torch.zeros(2, 2))[-1]["task_id"].tolist() == [0, 1]
    finally:
        env.close()


def test_one_task_in_every_sub_env_logs_only_the_pooled_success():
    env = make_env(TEST_ENV, num_envs=2, seed=0)  # PointReach: no task names, the same spec in every sub-env
    assert "task_names" not in env.metadata
    env.reset(seed=0)
    assert "task_id" not in env.step(torch.zeros(2, 2))[-1]


def test_training_evaluation_and_summary_log_success_per_task_of_a_suite(tmp_path):
    """ppo_continuous on a suite whose sub-envs have a task_name (Meta-World's way): charts/success_rate/<task> in
    training, success_rate/<task> in evaluation and summary.json, each the rate of its own task's episodes."""
    from tests.envs_for_tests import SUITE_ID

    args = ppo.Args(
        env_id=f"tests.envs_for_tests:{SUITE_ID}", num_envs=4, num_steps=25, num_minibatches=2, update_epochs=1,
        total_timesteps=4 * 25 * 2, eval_freq=1, save_freq=0, num_eval_envs=2, num_eval_episodes=4, cuda=False,
        output_dir=str(tmp_path), hidden_sizes=(16,), compile="off",
    )  # fmt: skip
    summary = json.loads((Path(ppo.main(args)["run_dir"]) / "summary.json").read_text())
    train, evaluation = summary["train"], summary["eval"]
    assert train["charts/success_rate/always"] == 1.0 and train["charts/success_rate/never"] == 0.0
    assert 0.0 < train["charts/success_rate"] < 1.0  # the pooled rate mixes them
    assert evaluation["success_rate/always"] == 1.0 and evaluation["success_rate/never"] == 0.0
    assert evaluation["success_rate"] == 0.5


def test_a_vector_only_id_that_cannot_reset_same_step_is_one_line():
    from tests.envs_for_tests import NEXT_STEP_ID

    with pytest.raises(ValueError) as e:
        make_env(f"tests.envs_for_tests:{NEXT_STEP_ID}", num_envs=2)
    assert "SAME_STEP" in str(e.value) and "\n" not in str(e.value)
