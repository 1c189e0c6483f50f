"""Partial observability: make_env's ``obs_indices`` / ``obs_keys`` (any env id: only the chosen observation entries,
also in ``info["final_obs"]``) and PushCubeRL's sensor dropout (``dropout_sensor``: a sensor that goes missing for
stretches of steps, read as zeros with a 0/1 flag)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from cleanrl_embodied import ppo_continuous
from cleanrl_embodied.shared import make_env
from cleanrl_embodied.shared.builders import EnvOptions
from cleanrl_embodied.shared.envs import (
    OBSERVATION_KWARGS,
    RANDOMIZATION_KWARGS,
    env_state_dict,
    load_env_state_dict,
)
from cleanrl_embodied.shared.envs.chunks import step_chunk, supports_partial_reset
from cleanrl_embodied.shared.envs.push_cube import INTERFACE_KWARGS, PushCubeRLVecEnv
from cleanrl_embodied.shared.observations import flatten_obs
from tests.checks import one_line, steps_without_a_host_sync
from tests.envs_for_tests import random_actions

pytestmark = pytest.mark.usefixtures("single_thread")

# The state entries of PushCubeRL's [N, 31] observation that come from the cube's pose (cube_pos 17-19, sin/cos of
# its yaw 20-21, tcp_to_cube 25-27, cube_to_goal 28-30; goal_pos 22-24 and the robot's 0-16 do not).
CUBE_COLUMNS = [17, 18, 19, 20, 21, 25, 26, 27, 28, 29, 30]
NONZERO_AT_RESET = [17, 18, 19, 21, 25, 26, 27, 28, 30]  # (the cube starts unturned: sin 0; the goal lies at +x: dy 0)
NO_RESETS = dict(terminate_on_success=False, max_episode_steps=100_000)


# --------------------------------------------------------------------------- obs_indices, obs_keys
def test_obs_indices_keep_the_chosen_columns_of_pendulum_in_obs_and_final_obs():
    """Pendulum observing cos and sin of its angle only (RL Zoo's PendulumNoVel): the columns of the full env under
    the same seed and actions, also in the final observations of the episodes that end at step 200."""
    full = make_env("Pendulum-v1", num_envs=3, seed=5)
    part = make_env("Pendulum-v1", num_envs=3, seed=5, obs_indices=[0, 1])
    space, full_space = part.single_observation_space, full.single_observation_space
    assert space.shape == (2,) and part.observation_space.shape == (3, 2)
    assert np.array_equal(space.low, full_space.low[:2]) and np.array_equal(space.high, full_space.high[:2])
    obs, _ = part.reset()
    expected, _ = full.reset()
    assert obs.shape == (3, 2) and torch.equal(obs, expected[:, :2])
    ended = 0
    for step in range(201):
        action = random_actions((3, 1), step)
        obs, reward, terminated, truncated, info = part.step(action)
        expected, full_reward, *_, full_info = full.step(action)
        assert torch.equal(obs, expected[:, :2]) and torch.equal(reward, full_reward)
        assert info["final_obs"].shape == (3, 2) and torch.equal(info["final_obs"], full_info["final_obs"][:, :2])
        ended += int(info["_final_obs"].sum())
    assert ended == 3  # the time limit: every env's final observation was compared


def test_obs_indices_keep_their_order_and_slice_the_bounds():
    part = make_env("Pendulum-v1", num_envs=2, seed=0, obs_indices=[2, 0])
    full = make_env("Pendulum-v1", num_envs=2, seed=0)
    assert part.single_observation_space.high.tolist() == [8.0, 1.0]  # angular velocity up to 8, then cos
    assert torch.equal(part.reset()[0], full.reset()[0][:, [2, 0]])


def test_obs_keys_keep_entries_of_a_dict_observation_before_flattening():
    keys = ["robot", "object/cube_pos"]
    kwargs = dict(num_envs=4, seed=2, obs_mode="dict", max_episode_steps=4)
    flat = make_env("PushCubeRL", obs_keys=keys, **kwargs)
    nested = make_env("PushCubeRL", obs_keys=keys, flatten_obs=False, **kwargs)
    full = make_env("PushCubeRL", flatten_obs=False, **kwargs)
    assert flat.single_observation_space.shape == (3 + 7 + 7 + 3,)  # flattened in sorted key order
    assert sorted(nested.single_observation_space.spaces) == ["object", "robot"]
    assert list(nested.single_observation_space["object"].spaces) == ["cube_pos"]
    assert nested.single_observation_space["robot"] == full.single_observation_space["robot"]
    wanted = [("object", "cube_pos"), ("robot", "qpos"), ("robot", "qvel"), ("robot", "tcp_pos")]

    def check(got_flat, got_nested, all_of_it):
        assert isinstance(got_nested, TensorDict)
        assert sorted(got_nested.keys(include_nested=True, leaves_only=True)) == wanted
        assert torch.equal(got_nested.get(("object", "cube_pos")), all_of_it.get(("object", "cube_pos")))
        assert torch.equal(flatten_obs(got_nested), got_flat)
        assert torch.equal(got_flat, flatten_obs(all_of_it.select(*wanted)))

    envs = (flat, nested, full)
    check(*[env.reset()[0] for env in envs])
    for step in range(9):  # two autoresets: final_obs is selected too
        outputs = [env.step(random_actions((4, 7), step)) for env in envs]
        check(*[obs for obs, *_ in outputs])
        check(*[info["final_obs"] for *_, info in outputs])
        assert torch.equal(outputs[0][4]["_final_obs"], outputs[2][4]["_final_obs"])


def test_partial_resets_and_action_chunks_pass_through_the_selection():
    for env in (
        make_env("Pendulum-v1", num_envs=4, seed=0, obs_indices=[0, 1]),
        make_env("PushCubeRL", num_envs=4, seed=0, obs_mode="dict", obs_keys=["robot"]),
    ):
        assert supports_partial_reset(env)
        env.reset()
        mask = torch.tensor([True, False, True, False])
        obs, _ = env.reset(options={"reset_mask": mask})
        assert obs.shape == (4, env.single_observation_space.shape[0])
        chunk = random_actions((4, 3, env.single_action_space.shape[0]), 1)
        obs, rewards, *_ = step_chunk(env, chunk)
        assert obs.shape == (4, env.single_observation_space.shape[0]) and rewards.shape == (3, 4)


@pytest.mark.parametrize(
    "env_id, kwargs, says",
    [
        ("Pendulum-v1", {"obs_indices": [0, 3]}, "obs_indices must be a non-empty list of distinct integers in [0, 2]"),
        ("Pendulum-v1", {"obs_indices": [-1]}, "obs_indices must be a non-empty list of distinct integers in [0, 2]"),
        ("Pendulum-v1", {"obs_indices": [1, 1]}, "obs_indices must be a non-empty list of distinct integers in [0, 2]"),
        ("Pendulum-v1", {"obs_indices": []}, "obs_indices must be a non-empty list of distinct integers in [0, 2]"),
        ("Pendulum-v1", {"obs_indices": 1}, "obs_indices must be a list of integers"),
        ("Pendulum-v1", {"obs_indices": [0.5]}, "obs_indices must be a list of integers"),
        ("Pendulum-v1", {"obs_keys": ["x"]}, "obs_keys keeps entries of a Dict observation; this one is a Box"),
        ("PushCubeRL", {"obs_mode": "dict", "obs_keys": ["robot/qacc"]},
         "obs_keys: unknown key 'robot/qacc'; the observation's keys are goal, goal/goal_pos, object, "),
        ("PushCubeRL", {"obs_mode": "dict", "obs_keys": []}, "obs_keys must be a non-empty list of observation keys"),
        ("PushCubeRL", {"obs_mode": "dict", "obs_keys": ["robot", "robot"]}, "obs_keys must name each entry once"),
        ("PushCubeRL", {"obs_mode": "rgb", "image_size": 8, "obs_indices": [0]},
         "obs_indices selects entries of a flat Box observation; this one is a Dict (rgb); obs_keys keeps"),
        ("PushCubeLangRL", {"obs_keys": ["instruction/input_ids"]},
         "obs_keys: keep the instruction entry 'instruction' whole"),
    ],
)  # fmt: skip
def test_bad_selections_are_one_line_naming_the_option(env_id, kwargs, says):
    with pytest.raises(ValueError) as error:
        make_env(env_id, num_envs=2, **kwargs)
    assert one_line(error).startswith(says), str(error.value)


def test_the_options_are_inherited_by_the_eval_envs_and_named_for_checkpoints():
    assert OBSERVATION_KWARGS == ("flatten_obs", "obs_indices", "obs_keys", "frame_stack")
    own = {"obs_indices": [0, 1], "obs_keys": ["robot"], "dropout_sensor": "cube", "dropout_rate": 0.1,
           "dropout_steps": [2, 3]}  # fmt: skip
    assert not set(own) & set(RANDOMIZATION_KWARGS)
    assert EnvOptions("PushCubeRL", env_kwargs=json.dumps(own)).kwargs(eval_envs=True) == own
    assert "dropout_sensor" in INTERFACE_KWARGS  # it changes what a policy sees; the rate and lengths do not
    assert "dropout_rate" not in INTERFACE_KWARGS and "dropout_steps" not in INTERFACE_KWARGS


TINY = dict(num_envs=2, num_steps=8, num_minibatches=2, update_epochs=1, num_eval_envs=2, num_eval_episodes=2,
            hidden_sizes=(8, 8), cuda=False, compile="off", eval_freq=0, save_freq=1,
            total_timesteps=2 * 8 * 2)  # fmt: skip


def test_ppo_trains_on_pendulum_without_velocity_and_its_checkpoint_needs_the_same_selection(tmp_path: Path):
    kwargs = '{"obs_indices": [0, 1]}'
    out = ppo_continuous.main(
        ppo_continuous.Args(env_id="Pendulum-v1", env_kwargs=kwargs, output_dir=str(tmp_path / "train"), **TINY)
    )
    assert out["global_step"] == 32
    path = Path(out["run_dir"]) / "checkpoints" / "last.pt"
    assert torch.load(path, weights_only=True)["obs_dim"] == 2
    again = ppo_continuous.Args(env_id="Pendulum-v1", env_kwargs=kwargs, eval_checkpoint=str(path),
                                output_dir=str(tmp_path / "same"), **TINY)  # fmt: skip
    assert ppo_continuous.main(again)["eval"] is not None
    checked = ppo_continuous.Args(env_id="Pendulum-v1", eval_checkpoint=str(path), output_dir=str(tmp_path / "full"),
                                  **TINY)  # fmt: skip
    bad = ppo_continuous.Args(env_id="Pendulum-v1", env_kwargs='{"obs_indices": [0, 5]}',
                              output_dir=str(tmp_path / "bad"), **TINY)  # fmt: skip
    for args, says in (
        (checked, f"error: --eval-checkpoint {path}: its env had obs_indices=[0, 1] (--env-kwargs)"),
        (bad, "error: --env-kwargs (inherited by the eval envs) / --eval-env-kwargs / --env-id Pendulum-v1: "
              "obs_indices must be a non-empty list of distinct integers in [0, 2]"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            ppo_continuous.main(args)
        message = str(e.value.code)
        assert message.startswith(says) and "\n" not in message, message
        assert not Path(args.output_dir).exists()


# --------------------------------------------------------------------------- sensor dropout (PushCubeRL)
def _missing_runs(flags: np.ndarray) -> list[int]:
    """Lengths of the runs of 1s in each column of ``flags`` [T, N] that start and end inside the window."""
    runs = []
    for column in flags.T:
        edges = np.diff(np.concatenate(([0], column, [0])))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        runs += [int(e - s) for s, e in zip(starts, ends) if s > 0 and e < len(column)]
    return runs


def test_the_sensor_is_out_for_the_fraction_the_rate_and_lengths_give():
    """A working sensor fails with probability p per step, an outage lasts L steps (uniform in [3, 4], mean m = 3.5),
    and at least one real reading follows every outage (outages start only from a working sensor). The real runs
    between outages then last 1/p steps on average, so the sensor is out p m / (1 + p m) = 0.512 of the steps; an
    outage that could restart at once would give p m / (1 - p + p m) = 0.600. The standard error of the measured
    fraction over ~10k outages is ~0.002, the bound is 0.015."""
    rate, (low, high) = 0.3, (3, 4)
    env = PushCubeRLVecEnv(num_envs=128, seed=0, dropout_sensor="cube", dropout_rate=rate, dropout_steps=[low, high],
                           **NO_RESETS)  # fmt: skip
    env.reset(seed=0)
    flags = []
    for step in range(600):
        obs, *_, info = env.step(random_actions((128, 7), step))
        flags.append(obs[:, -1].clone())
    flags = torch.stack(flags).numpy()
    assert set(np.unique(flags)) == {0.0, 1.0}
    mean_length = (low + high) / 2
    expected = rate * mean_length / (1 + rate * mean_length)
    assert abs(flags[30:].mean() - expected) < 0.015, (flags[30:].mean(), expected)
    runs = _missing_runs(flags)
    assert len(runs) > 5000 and set(runs) == {3, 4}  # never two outages back to back (that would be 6 or more)
    assert abs(np.mean(runs) - mean_length) < 0.05
    # the per-episode fraction reported in the metrics: the share of the episode's steps so far
    assert torch.allclose(info["metrics"]["sensor_missing_fraction"], torch.from_numpy(flags.mean(0)))


@pytest.mark.parametrize(
    "kwargs, cube_columns",
    [
        ({}, CUBE_COLUMNS),
        ({"cube_dynamics": "sliding"}, [*CUBE_COLUMNS, 31, 32]),  # cube_vel
        ({"tasks": ["forward", "left"]}, [17, 18, 19, 20, 21, 22, 23, 24]),  # no goal entries: tcp_to_cube is 22-24
    ],
)
def test_while_the_cube_is_out_its_entries_read_zero_and_the_flag_one(kwargs, cube_columns):
    """Against the same env without dropout (no resets, no noise: the same physics): every other reading is exactly
    that env's, and while the sensor is out exactly the cube's entries are zeros."""
    common = dict(num_envs=16, seed=4, **NO_RESETS, **kwargs)
    env = PushCubeRLVecEnv(dropout_sensor="cube", dropout_rate=0.2, dropout_steps=[1, 6], **common)
    plain = PushCubeRLVecEnv(**common)
    state = lambda obs: obs["state"] if isinstance(obs, TensorDict) else obs  # noqa: E731  (tasks: {"state", ...})
    obs, expected = state(env.reset(seed=4)[0]), state(plain.reset(seed=4)[0])
    dim = expected.shape[1]
    assert obs.shape == (16, dim + 1) and torch.equal(obs[:, dim], torch.zeros(16))  # an episode starts real
    assert env.single_observation_space.shape == (dim + 1,) or "state" in env.single_observation_space.spaces
    cube = torch.zeros(dim, dtype=torch.bool)
    cube[cube_columns] = True
    seen = 0
    for step in range(40):
        action = random_actions((16, 7), step)
        obs, expected = state(env.step(action)[0]), state(plain.step(action)[0])
        missing = obs[:, dim] == 1
        assert torch.equal(obs[:, dim] == 0, ~missing)  # 0 or 1
        assert torch.equal(obs[:, :dim], torch.where(missing[:, None] & cube, 0.0, expected))
        seen += int(missing.sum())
    assert 0 < seen < 16 * 40


def test_a_reset_ends_an_outage_and_every_episode_starts_with_a_real_reading():
    env = PushCubeRLVecEnv(num_envs=4, seed=1, dropout_sensor="cube", dropout_rate=1.0, dropout_steps=[10, 10],
                           terminate_on_success=False, max_episode_steps=3)  # fmt: skip
    obs, _ = env.reset(seed=1)
    assert torch.equal(obs[:, -1], torch.zeros(4))
    for step in range(3):  # rate 1: the outage starts at the first step and outlasts the episode
        obs, _, _, truncated, info = env.step(random_actions((4, 7), step))
    assert truncated.all() and torch.equal(info["final_obs"][:, -1], torch.ones(4))  # the last reading is missing
    assert torch.equal(info["final_obs"][:, CUBE_COLUMNS], torch.zeros(4, len(CUBE_COLUMNS)))
    assert torch.equal(info["metrics"]["sensor_missing_fraction"], torch.ones(4))
    assert torch.equal(obs[:, -1], torch.zeros(4)) and bool((obs[:, NONZERO_AT_RESET] != 0).all())  # the next: real
    assert torch.equal(env.sensor_outage, torch.zeros(4, dtype=torch.int32))
    obs, *_ = env.step(random_actions((4, 7), 3))  # a working sensor again: rate 1 starts an outage
    assert torch.equal(obs[:, -1], torch.ones(4))
    obs, _ = env.reset(options={"reset_mask": torch.tensor([True, False, True, False])})  # a partial reset
    assert obs[:, -1].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert bool((obs[[0, 2]][:, NONZERO_AT_RESET] != 0).all()) and not bool(obs[[1, 3]][:, CUBE_COLUMNS].any())


def test_a_resumed_env_state_continues_the_outages_identically():
    """Through make_env (episode statistics, the selection of obs_keys) and env_state_dict, as a checkpoint does."""
    kwargs = dict(num_envs=8, obs_mode="dict", obs_keys=["robot", "object", "sensor_missing"], dropout_sensor="cube",
                  dropout_rate=0.3, dropout_steps=[2, 5], max_episode_steps=6)  # fmt: skip
    env = make_env("PushCubeRL", seed=0, **kwargs)
    env.reset(seed=0)
    for step in range(9):
        env.step(random_actions((8, 7), step))
    saved = env_state_dict(env)
    assert {"sensor_outage", "sensor_missing_steps"} <= set(saved["PushCubeRLVecEnv"])
    assert "SelectObservation" not in saved  # a wrapper without state
    expected = [env.step(random_actions((8, 7), 100 + step)) for step in range(20)]
    resumed = make_env("PushCubeRL", seed=99, **kwargs)
    resumed.reset(seed=99)
    load_env_state_dict(resumed, saved)
    flags = []
    for step, (obs, reward, terminated, truncated, info) in enumerate(expected):
        got = resumed.step(random_actions((8, 7), 100 + step))
        assert torch.equal(got[0], obs) and torch.equal(got[1], reward)
        assert torch.equal(got[2], terminated) and torch.equal(got[3], truncated)
        assert torch.equal(got[4]["final_obs"], info["final_obs"])
        flags.append(obs[:, -1])
    assert 0 < float(torch.stack(flags).mean()) < 1  # outages ran across the resumed steps


def test_camera_dropout_blanks_every_camera_and_the_privileged_state_stays_true():
    env = PushCubeRLVecEnv(num_envs=8, seed=2, obs_mode="proprio+rgb", image_size=16, obs_cameras=["top", "wrist"],
                           privileged_state=True, dropout_sensor="camera", dropout_rate=0.3, dropout_steps=[1, 3],
                           max_episode_steps=5)  # fmt: skip
    space = env.single_observation_space
    assert space["state"].shape == (18,) and space["privileged"].shape == (31,)  # 17 proprio + the flag
    obs, _ = env.reset(seed=2)
    seen = 0
    for step in range(25):
        obs, *_, info = env.step(random_actions((8, 7), step))
        for o in (obs, info["final_obs"]):
            missing = o["state"][:, -1] == 1
            assert torch.equal(o["state"][:, :17], o["privileged"][:, :17])  # the robot's own state is never lost
            for key in ("rgb", "wrist"):
                images = o[key].flatten(1)
                assert not images[missing].any() and bool((images[~missing].amax(1) > 0).all())
        seen += int((obs["state"][:, -1] == 1).sum())
    assert 0 < seen < 8 * 25


def test_cube_dropout_in_an_image_mode_keeps_the_privileged_state_true():
    env = PushCubeRLVecEnv(num_envs=8, seed=3, obs_mode="state+rgb", image_size=8, privileged_state=True,
                           dropout_sensor="cube", dropout_rate=0.3, dropout_steps=[1, 4], **NO_RESETS)  # fmt: skip
    env.reset(seed=3)
    cube = torch.zeros(31, dtype=torch.bool)
    cube[CUBE_COLUMNS] = True
    seen = 0
    for step in range(20):
        obs, *_ = env.step(random_actions((8, 7), step))
        missing = obs["state"][:, -1] == 1
        assert torch.equal(obs["state"][:, :31], torch.where(missing[:, None] & cube, 0.0, obs["privileged"]))
        seen += int(missing.sum())
    assert seen > 0


def test_the_rgb_mode_gets_the_flag_as_an_entry_of_its_own():
    env = make_env("PushCubeRL", num_envs=2, seed=0, obs_mode="rgb", image_size=8, dropout_sensor="camera")
    assert sorted(env.single_observation_space.spaces) == ["rgb", "sensor_missing"]
    obs, _ = env.reset(seed=0)
    assert obs["sensor_missing"].shape == (2, 1) and obs["sensor_missing"].dtype == torch.float32


def test_without_dropout_the_observation_is_unchanged():
    """(The numeric fingerprints in tests/golden/ pin the defaults' numbers bit for bit.)"""
    env = PushCubeRLVecEnv(num_envs=2, seed=0)
    assert env.single_observation_space.shape == (31,) and "sensor_outage" not in env.state_dict()


def test_reports_of_dropout_runs_depend_on_its_fingerprint():
    from benchmarks.suite import provenance
    from tests.numerics import FINGERPRINTS

    command = 'python cleanrl_embodied/ppo_continuous.py --env-kwargs \'{"dropout_sensor": "cube"}\''
    assert provenance.depends_on(command) == ["env-PushCubeRL", "env-PushCubeRL-dropout", "ppo_continuous"]
    assert "env-PushCubeRL-dropout" in FINGERPRINTS and FINGERPRINTS["env-PushCubeRL-dropout"].golden.is_file()


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"dropout_sensor": "camera"}, "dropout_sensor must be null or 'cube' with obs_mode 'state' (no images)"),
        ({"dropout_sensor": "cube", "obs_mode": "proprio+rgb"},
         "dropout_sensor must be null or 'camera' with obs_mode 'proprio+rgb' (the cube is seen in the image only)"),
        ({"dropout_sensor": "cube", "obs_mode": "rgb"}, "dropout_sensor must be null or 'camera' with obs_mode 'rgb'"),
        ({"dropout_steps": [4, 2]}, "dropout_steps must be [min, max], integers with 1 <= min <= max"),
        ({"dropout_steps": [2.5, 3]}, "dropout_steps must be [min, max], integers with 1 <= min <= max"),
        ({"dropout_rate": -0.1}, "dropout_rate must be a number in [0, 1]"),
    ],
)  # fmt: skip
def test_bad_dropout_options_are_one_line(kwargs, says):
    with pytest.raises(ValueError) as error:
        PushCubeRLVecEnv(num_envs=2, **kwargs)
    assert one_line(error).startswith(f"PushCubeRL: {says}"), str(error.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("sensor, obs_mode", [("cube", "state"), ("camera", "proprio+rgb")])
def test_dropout_steps_without_a_host_sync_on_a_gpu(sensor, obs_mode):
    env = PushCubeRLVecEnv(num_envs=64, device="cuda", seed=0, obs_mode=obs_mode, image_size=16,
                           dropout_sensor=sensor, dropout_rate=0.3, max_episode_steps=3)  # fmt: skip
    *_, info = steps_without_a_host_sync(env)
    assert info["metrics"]["sensor_missing_fraction"].device.type == "cuda"
