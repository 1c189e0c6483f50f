"""Every keyword argument of PushCubeRL refuses a bad value with one line that names it and says what it allows
(the part a user acts on), also when it comes through a trainer's --env-kwargs. A kwarg added without a case here
fails `test_every_kwarg_has_a_case`."""

from __future__ import annotations

import inspect
import math

import pytest

from cleanrl_embodied import ppo_continuous
from cleanrl_embodied.shared.envs.push_cube import PushCubeRLVecEnv

TERMS = "reach, place, success, time, action_rate, action_magnitude"
PARAMETERS = "cube_half_size, push_friction, obs_noise_std, action_noise_std"
OBS_MODES = "'state' or 'dict' or 'rgb' or 'proprio+rgb' or 'state+rgb'"
POSITIVE, NON_NEGATIVE = "a number > 0", "a number >= 0"
ALL_TASKS = "forward, left, back, right, forward_left, forward_right, back_left, back_right"
CASES = {  # kwarg: (bad value, what the message must say it allows)
    "num_envs": (0, "a positive integer"),
    "max_episode_steps": (0, "an integer >= 1"),
    "obs_mode": ("pixels", OBS_MODES),
    "action_mode": ("torque", "'joint_delta' or 'joint_pos' or 'ee_delta_pos'"),
    "joint_delta_scale": (0.0, POSITIVE),
    "ee_delta_scale": (-0.01, POSITIVE),
    "arm_limits": ("yes", "true or false"),
    "max_tcp_speed": (0, POSITIVE),
    "terminate_on_success": (1, "true or false"),
    "goal_direction": (math.nan, "a finite number (radians)"),
    "goal_distance": (0.05, "a number > goal_radius (0.1; else the cube starts in the goal"),
    "goal_radius": (-0.1, POSITIVE),
    "cube_half_size": (0.0, POSITIVE),
    "cube_xy_range": (-0.1, NON_NEGATIVE),
    "cube_yaw_range": (-1.0, NON_NEGATIVE),
    "contact_substeps": (0, "an integer >= 1"),
    "cube_dynamics": ("physx", "'kinematic' or 'sliding'"),
    "cube_friction": (0.0, "a number > 0 (Coulomb friction coefficient of the cube on the table)"),
    "cube_half_size_range": ([0.0, 0.02], "(low, high) with 0.001 <= low <= high"),
    "push_friction": (-0.1, NON_NEGATIVE),
    "push_friction_range": ([1.0, 0.5], "(low, high) with 0 <= low <= high"),
    "obs_noise_std": (-0.01, NON_NEGATIVE),
    "action_noise_std": (math.inf, NON_NEGATIVE),
    "reward_weights": ([1.0], f"a dict {{term: weight}} with terms {TERMS}"),
    "randomize": ([0.5, 1.5], f"a dict {{parameter: [low, high]}} with parameters {PARAMETERS}"),
    "randomize_every": (-1, "an integer >= 0 (control steps between events; 0: no interval event)"),
    "randomize_at": ([0], "a list of integers >= 1 (episode steps after which the event fires)"),
    "event_cube_shift_std": (-0.1, NON_NEGATIVE),
    "base_pos": ([0.0, 0.0], "3 numbers (x, y, z)"),
    "camera": ("fisheye", "'top' or 'front' or 'side' or 'perspective'"),
    "render_mode": ("human", "None or 'rgb_array'"),
    "image_size": (0, "a positive integer or (height, width) of positive integers"),
    "obs_cameras": ("wrist", "['top'] or ['wrist'] or ['top', 'wrist'] (the cameras of the image observations)"),
    "privileged_state": ("yes", "true or false"),
    "tasks": (["up"], f"null or a list of distinct task names from {ALL_TASKS}"),
    "view_tasks": (["up"], f"null or a list of distinct task names from {ALL_TASKS}"),
    "instruction_length": (8, "an integer >= 26 (bytes of the longest instruction)"),
    "instructions": ("test", '"train" or "heldout"'),
    "dropout_sensor": ("gps", "null (no dropout) or 'cube' or 'camera'"),
    "dropout_rate": (1.5, "a number in [0, 1] (the probability per env and step that a working sensor fails)"),
    "dropout_steps": ([0, 5], "[min, max], integers with 1 <= min <= max (control steps an outage lasts)"),
}
# device and seed come from the trainer (--cuda, --seed); given in --env-kwargs too they are refused as duplicates
SET_BY_THE_TRAINER = {"device", "seed"}


def test_every_kwarg_has_a_case():
    kwargs = set(inspect.signature(PushCubeRLVecEnv.__init__).parameters) - {"self"}
    assert kwargs - SET_BY_THE_TRAINER == set(CASES)


@pytest.mark.parametrize("kwarg", sorted(CASES))
def test_a_bad_value_is_one_line_naming_the_kwarg_and_what_it_allows(kwarg):
    value, allowed = CASES[kwarg]
    with pytest.raises(ValueError) as error:
        PushCubeRLVecEnv(**{"num_envs": 2, kwarg: value})
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"PushCubeRL: {kwarg} must be {allowed}") and message.endswith(f"got {value!r}")


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"reward_weights": {"reech": 1.0}}, f"reward_weights has an unknown term 'reech'; terms: {TERMS}"),
        ({"reward_weights": {"reach": math.nan}}, "reward_weights['reach'] must be a finite number, got nan"),
        ({"randomize": {"mass": [1, 2]}}, f"randomize has an unknown parameter 'mass'; parameters: {PARAMETERS}"),
        ({"randomize": {"push_friction": [1.0, 0.5]}}, "randomize['push_friction'] must be (low, high) with 0 <= low"),
        ({"push_friction_range": [0.1, 0.5], "randomize": {"push_friction": [0.1, 0.5]}}, "give push_friction_range"),
    ],
)
def test_bad_entries_of_dict_kwargs_are_one_line_naming_the_entry(kwargs, says):
    with pytest.raises(ValueError) as error:
        PushCubeRLVecEnv(num_envs=2, **kwargs)
    assert str(error.value).startswith(f"PushCubeRL: {says}") and "\n" not in str(error.value)


@pytest.mark.parametrize("kwarg", ["camera", "randomize_at", "randomize"])
def test_through_env_kwargs_it_is_one_error_line_naming_the_flag(tmp_path, kwarg):
    value = CASES[kwarg][0]
    with pytest.raises(SystemExit) as e:
        ppo_continuous.main(
            ppo_continuous.Args(
                env_kwargs=f'{{"{kwarg}": {value!r}}}'.replace("'", '"'), output_dir=str(tmp_path), cuda=False
            )
        )
    message = str(e.value.code)
    # the eval envs inherit --env-kwargs (but not randomization options), and they are built first
    assert message.startswith("error: --env-kwargs ") and "\n" not in message
    assert "/ --env-id PushCubeRL: " in message
    assert f"PushCubeRL: {kwarg} must be {CASES[kwarg][1]}" in message
    assert not list(tmp_path.glob("*/summary.json"))  # no run started
