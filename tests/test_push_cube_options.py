"""Tests of PushCubeRL's options: arm limits, action modes, reward terms, events, argument checks, cameras."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from cleanrl_embodied.shared.envs import make_env
from cleanrl_embodied.shared.envs.push_cube import (
    CONTROL_DT,
    PUSH_POINT_MARGIN,
    REACH_THRESHOLD,
    TCP_RADIUS,
    PushCubeRLVecEnv,
    franka,
)
from tests.envs_for_tests import random_actions

HIGH_BASE = (-0.615, 0.0, 1.0)  # base 1 m above the table: the arm can reach neither the table nor the cube
VELOCITY_LIMIT, ACCELERATION_LIMIT = franka.motion_limits()
LOWER, UPPER = franka.joint_limits()


pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py


# --------------------------------------------------------------------------- arm limits
@pytest.mark.parametrize("action_mode", ["joint_delta", "joint_pos", "ee_delta_pos"])
def test_arm_limits_hold_under_random_actions(action_mode):
    """Joint velocity and acceleration limits, TCP speed cap and joint position limits hold for every action
    mode (joints brake before their position limits instead of hitting them)."""
    env = PushCubeRLVecEnv(num_envs=256, seed=0, action_mode=action_mode, base_pos=HIGH_BASE,
                           terminate_on_success=False)  # fmt: skip
    env.reset(seed=0)
    for step in range(45):
        qvel_before, tcp_before = env.qvel.clone(), env.tcp_pos.clone()
        env.step(random_actions(env.action_space.shape, step))
        assert (env.qvel.abs() <= VELOCITY_LIMIT * (1 + 1e-5)).all()
        assert ((env.qvel - qvel_before).abs() <= ACCELERATION_LIMIT * CONTROL_DT * (1 + 1e-4)).all()
        speed = (env.tcp_pos - tcp_before).norm(dim=-1) / CONTROL_DT
        assert (speed <= franka.MAX_TCP_SPEED * 1.02).all()  # the cap is first order: within 2%
        assert ((env.qpos >= LOWER) & (env.qpos <= UPPER)).all()


def test_without_arm_limits_the_arm_is_much_faster():
    """The old arm (arm_limits=False) reaches each target at once: the limits above are not vacuous."""
    env = PushCubeRLVecEnv(num_envs=256, seed=0, arm_limits=False, base_pos=HIGH_BASE, terminate_on_success=False)
    env.reset(seed=0)
    fastest, biggest_change = 0.0, 0.0
    for step in range(10):
        qvel_before, tcp_before = env.qvel.clone(), env.tcp_pos.clone()
        env.step(random_actions(env.action_space.shape, step).sign())
        fastest = max(fastest, float(((env.tcp_pos - tcp_before).norm(dim=-1) / CONTROL_DT).max()))
        biggest_change = max(biggest_change, float(((env.qvel - qvel_before).abs() / ACCELERATION_LIMIT).max()))
    assert fastest > 2.0 * franka.MAX_TCP_SPEED
    assert biggest_change > 2.0 * CONTROL_DT


def test_limited_arm_accelerates_gradually_and_stops():
    """From rest, full joint-delta commands speed a joint up by a_max * dt per step; then zero commands stop it
    within a few steps without moving back."""
    env = PushCubeRLVecEnv(num_envs=1, seed=0, base_pos=HIGH_BASE, terminate_on_success=False)
    env.reset(seed=0)
    action = torch.zeros(1, 7)
    action[0, 0] = 1.0  # joint 1 turns the whole arm about the vertical axis: the TCP moves sideways
    speeds = []
    for _ in range(3):
        env.step(action)
        speeds.append(float(env.qvel[0, 0]))
    # Speeds up by a_max dt per step, up to the speed from which it can still stop at the step's target
    # (0.1 rad away): steps s, s - A, s - 2A, ... (A = a_max dt^2) must fit in 0.1 rad.
    a1 = float(ACCELERATION_LIMIT[0])
    change = a1 * CONTROL_DT**2
    stoppable = math.sqrt(2 * change * 0.1) - change / 2
    assert sum(stoppable - k * change for k in range(int(stoppable / change) + 1)) <= 0.1
    expected = [min(a1 * CONTROL_DT * k, stoppable / CONTROL_DT) for k in (1, 2, 3)]
    assert expected[-1] < a1 * CONTROL_DT * 3  # the test reaches the braking cap
    assert speeds == pytest.approx(expected, rel=1e-4)
    for _ in range(10):
        q_before = float(env.qpos[0, 0])
        env.step(torch.zeros(1, 7))
        assert float(env.qpos[0, 0]) >= q_before - 1e-7  # brakes, never reverses
    assert env.qvel.abs().max() < 1e-5


# --------------------------------------------------------------------------- action modes
@pytest.mark.parametrize("scale", [0.1, 0.04])
def test_joint_delta_moves_exactly_by_the_scaled_action_without_limits(scale):
    env = PushCubeRLVecEnv(num_envs=16, seed=0, arm_limits=False, joint_delta_scale=scale, base_pos=HIGH_BASE)
    env.reset(seed=0)
    actions = random_actions((16, 7), 0)
    q_before = env.qpos.clone()
    env.step(actions)
    expected = torch.minimum(torch.maximum(q_before + scale * actions, LOWER), UPPER)
    assert torch.allclose(env.qpos, expected, atol=1e-6)


def test_joint_delta_with_limits_reaches_a_small_target():
    """A joint delta within what one step allows from rest... is reached over a few steps, by steady commands."""
    env = PushCubeRLVecEnv(num_envs=8, seed=0, base_pos=HIGH_BASE, terminate_on_success=False)
    env.reset(seed=0)
    target = env.qpos + 0.15 * random_actions((8, 7), 1)
    target = torch.minimum(torch.maximum(target, LOWER + 0.05), UPPER - 0.05)
    for _ in range(30):
        env.step(((target - env.qpos) / 0.1).clamp(-1, 1))
    assert torch.allclose(env.qpos, target, atol=1e-3)


@pytest.mark.parametrize("arm_limits", [False, True])
def test_joint_pos_goes_to_the_commanded_configuration(arm_limits):
    env = PushCubeRLVecEnv(num_envs=8, seed=0, action_mode="joint_pos", arm_limits=arm_limits, base_pos=HIGH_BASE,
                           terminate_on_success=False)  # fmt: skip
    env.reset(seed=0)
    target = franka.rest_qpos() + 0.4 * random_actions((8, 7), 2)
    target = torch.minimum(torch.maximum(target, LOWER + 0.05), UPPER - 0.05)
    action = 2 * (target - LOWER) / (UPPER - LOWER) - 1
    env.step(action)
    if not arm_limits:
        assert torch.allclose(env.qpos, target, atol=1e-5)  # at once
        return
    assert not torch.allclose(env.qpos, target, atol=1e-2)  # not at once ...
    for _ in range(40):
        env.step(action)
    assert torch.allclose(env.qpos, target, atol=1e-4)  # ... but settles on it
    assert env.qvel.abs().max() < 1e-2


@pytest.mark.parametrize("arm_limits", [False, True])
def test_ee_delta_pos_moves_the_tcp_where_commanded(arm_limits):
    env = PushCubeRLVecEnv(num_envs=32, seed=0, action_mode="ee_delta_pos", arm_limits=arm_limits,
                           terminate_on_success=False)  # fmt: skip
    assert env.single_action_space.shape == (3,)
    env.reset(seed=0)
    start = env.tcp_pos.clone()
    # One small step, in the linear range: the TCP moves by the command (to first order).
    delta = 0.01 * random_actions((32, 3), 3)
    if not arm_limits:
        env.step(delta / env.ee_delta_scale)
        assert ((env.tcp_pos - start - delta).norm(dim=-1) < 0.1 * delta.norm(dim=-1)).all()
    # Steady commands toward a point 12 cm away (above the table) get there, never faster than the cap.
    target = start + torch.tensor([0.08, -0.06, -0.06]) + 0.02 * random_actions((32, 3), 4)
    for _ in range(40):
        before = env.tcp_pos.clone()
        env.step(((target - env.tcp_pos) / env.ee_delta_scale).clamp(-1, 1))
        if arm_limits:
            assert ((env.tcp_pos - before).norm(dim=-1) <= franka.MAX_TCP_SPEED * CONTROL_DT * 1.02).all()
    assert ((env.tcp_pos - target).norm(dim=-1) < 2e-3).all()


def test_damped_least_squares_solves_the_jacobian_system():
    q = franka.rest_qpos() + 0.3 * random_actions((64, 7), 5)
    jacobian = franka.tcp_jacobian(q)
    dx = 0.01 * random_actions((64, 3), 6)
    dq = franka.damped_least_squares(jacobian, dx, damping=1e-3)
    assert torch.allclose(torch.einsum("nij,nj->ni", jacobian, dq), dx, atol=1e-5)
    reference = jacobian.transpose(1, 2) @ torch.linalg.solve(
        jacobian @ jacobian.transpose(1, 2) + 1e-6 * torch.eye(3), dx.unsqueeze(-1)
    )
    assert torch.allclose(dq, reference.squeeze(-1), atol=1e-4)


# --------------------------------------------------------------------------- reward terms
def old_reward(env: PushCubeRLVecEnv, success: torch.Tensor) -> torch.Tensor:
    """The reward before named terms (bf22c03), written out independently."""
    behind = (env.cube_half_size + TCP_RADIUS + PUSH_POINT_MARGIN).unsqueeze(-1)
    push = torch.cat((env.cube_xy - behind * env.goal_dir_xy, env.cube_half_size.unsqueeze(-1)), -1)
    d_push = (push - env.tcp_pos).norm(dim=-1)
    d_goal = (env.cube_xy - env.goal_xy).norm(dim=-1)
    dense = (1 - torch.tanh(5 * d_push) + (1 - torch.tanh(5 * d_goal)) * (d_push < REACH_THRESHOLD)) / 3
    return torch.where(success, 1.0, dense) - 1


def test_default_reward_terms_sum_to_the_old_reward():
    env = PushCubeRLVecEnv(num_envs=128, seed=0, terminate_on_success=False, goal_radius=0.05,
                           goal_distance=0.06)  # fmt: skip
    env.reset(seed=0)
    seen_success = seen_place = False
    for step in range(49):  # one episode (no autoreset, which would replace the state old_reward reads)
        _, reward, _, _, info = env.step(0.5 * random_actions((128, 7), step))
        terms = info["rewards"]
        assert list(terms) == ["reach", "place", "success", "time"]
        assert all(t.shape == (128,) and t.dtype == torch.float32 for t in terms.values())
        assert torch.equal(terms["reach"] + terms["place"] + terms["success"] + terms["time"], reward)
        assert torch.allclose(reward, old_reward(env, info["success"]), atol=2e-7, rtol=0)
        assert torch.equal(terms["success"], info["success"].float())
        seen_success |= bool(info["success"].any())
        seen_place |= bool((terms["place"] > 0).any())
    assert seen_success  # the comparison covered success steps


def test_reward_weights_select_and_scale_terms():
    weights = {"reach": 0.0, "place": 0.5, "action_rate": 0.1, "action_magnitude": 0.01}
    env = PushCubeRLVecEnv(num_envs=4, seed=0, max_episode_steps=3, reward_weights=weights)
    env.reset(seed=0)
    previous = torch.zeros(4, 7)
    for step in range(6):
        actions = random_actions((4, 7), step) * 1.5  # beyond [-1, 1]: the terms see the clipped action
        clipped = actions.clamp(-1, 1)
        _, reward, terminated, truncated, info = env.step(actions)
        terms = info["rewards"]
        assert list(terms) == ["place", "success", "time", "action_rate", "action_magnitude"]
        assert torch.allclose(terms["action_rate"], -0.1 * (clipped - previous).square().sum(-1))
        assert torch.allclose(terms["action_magnitude"], -0.01 * clipped.square().sum(-1))
        assert torch.equal(terms["time"], torch.full((4,), -1.0))
        assert torch.allclose(sum(terms.values()), reward, atol=1e-6)
        done = (terminated | truncated).unsqueeze(-1)
        previous = torch.where(done, 0.0, clipped)  # a new episode compares with zero
    assert truncated.all()


# --------------------------------------------------------------------------- events
def test_reset_randomization_of_parameters_and_noise_levels():
    ranges = {
        "cube_half_size": [0.015, 0.025],
        "push_friction": [0.2, 0.8],
        "obs_noise_std": [0.0, 0.02],
        "action_noise_std": [0.05, 0.1],
    }
    env = PushCubeRLVecEnv(num_envs=512, seed=0, randomize=ranges)
    env.reset(seed=0)
    for name, (low, high) in ranges.items():
        values = getattr(env, name)
        assert ((values >= low) & (values <= high)).all() and values.std() > 0.2 * (high - low) / math.sqrt(12)
    # The noise levels act per env: an env with zero observation noise sees the exact state.
    quiet = PushCubeRLVecEnv(num_envs=2, seed=0, randomize={"obs_noise_std": [0.0, 0.0]}, obs_noise_std=0.0)
    obs, _ = quiet.reset(seed=0)
    assert torch.equal(obs[:, :7], quiet.qpos)


def test_interval_and_step_events_fire_at_their_steps_only():
    env = PushCubeRLVecEnv(num_envs=32, seed=0, base_pos=HIGH_BASE, terminate_on_success=False,
                           max_episode_steps=20, randomize={"push_friction": [0.0, 1.0]}, randomize_every=6,
                           randomize_at=[4], event_cube_shift_std=0.01)  # fmt: skip
    env.reset(seed=0)
    for _ in range(40):  # two episodes: the step count restarts with each episode
        friction, cube = env.push_friction.clone(), env.cube_xy.clone()
        steps_done = int(env.elapsed_steps[0])
        env.step(torch.zeros(32, 7))
        fired = steps_done in (4, 6, 12, 18)
        if steps_done == 19:  # truncated and reset in this step: new episode, new values anyway
            continue
        assert (env.push_friction != friction).all() == fired and (env.push_friction != friction).any() == fired
        assert ((env.cube_xy != cube).any(-1)).all() == fired  # the arm is high: only events move the cube


def test_make_env_passes_json_style_kwargs():
    """Options as --env-kwargs gives them (JSON: lists for ranges and steps, dicts, true/false) all take effect."""
    options = json.loads(
        '{"randomize": {"cube_half_size": [0.015, 0.025]}, "reward_weights": {"action_rate": 0.05}, '
        '"action_mode": "ee_delta_pos", "randomize_at": [5], "terminate_on_success": false}'
    )
    env = make_env("PushCubeRL", num_envs=64, seed=0, **options)
    raw = env.unwrapped
    assert env.single_action_space.shape == (3,)  # ee_delta_pos
    env.reset(seed=0)
    half = raw.cube_half_size.clone()
    assert ((half >= 0.015) & (half <= 0.025)).all() and half.std() > 0.002  # uniform: std 0.0029
    # action_rate: -0.05 |a_t - a_{t-1}|^2, a_{-1} = 0 at an episode's start
    _, _, _, _, info = env.step(torch.full((64, 3), 0.5))
    torch.testing.assert_close(info["rewards"]["action_rate"], torch.full((64,), -0.05 * 3 * 0.25))
    for step in range(2, 9):  # randomize_at [5]: resampled after the 5th step of the episode (as the 6th begins)
        before = raw.cube_half_size.clone()
        env.step(torch.zeros(64, 3))
        changed = raw.cube_half_size != before
        assert changed.all() if step == 6 else not changed.any(), step
    env.reset(seed=1)
    assert (raw.cube_half_size != half).all()  # and at every reset


def test_state_dict_round_trip_with_events_noise_and_action_rate():
    kwargs = dict(num_envs=16, randomize={"cube_half_size": [0.015, 0.025], "obs_noise_std": [0.0, 0.01],
                                          "action_noise_std": [0.0, 0.1]},
                  randomize_every=7, randomize_at=[3], event_cube_shift_std=0.005,
                  reward_weights={"action_rate": 0.1})  # fmt: skip
    env = PushCubeRLVecEnv(seed=0, **kwargs)
    env.reset(seed=0)
    for step in range(30):
        env.step(random_actions((16, 7), step))
    saved = env.state_dict()
    expected = [env.step(random_actions((16, 7), 100 + step)) for step in range(40)]
    resumed = PushCubeRLVecEnv(seed=999, **kwargs)
    resumed.load_state_dict(saved)
    for step, (obs, reward, terminated, truncated, info) in enumerate(expected):
        got = resumed.step(random_actions((16, 7), 100 + step))
        assert torch.equal(got[0], obs) and torch.equal(got[1], reward)
        assert torch.equal(got[2], terminated) and torch.equal(got[3], truncated)
        assert all(torch.equal(got[4]["rewards"][k], v) for k, v in info["rewards"].items())


# --------------------------------------------------------------------------- argument checks
@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"goal_distance": 0.1, "goal_radius": 0.1}, "goal_distance"),
        ({"goal_distance": 0.05}, "goal_distance"),
        ({"push_friction": -0.1}, "push_friction"),
        ({"action_mode": "torque"}, "action_mode"),
        ({"joint_delta_scale": 0.0}, "joint_delta_scale"),
        ({"max_tcp_speed": -1.0}, "max_tcp_speed"),
        ({"arm_limits": "yes"}, "arm_limits"),
        ({"reward_weights": {"reech": 1.0}}, "reward_weights"),
        ({"reward_weights": {"reach": float("nan")}}, "reward_weights"),
        ({"randomize": {"mass": [1, 2]}}, "randomize"),
        ({"randomize": {"push_friction": [1.0, 0.5]}}, "randomize"),
        ({"randomize": {"cube_half_size": [0.0, 0.02]}}, "randomize"),
        ({"push_friction_range": [-1.0, 0.5]}, "push_friction_range"),
        ({"push_friction_range": [0.1, 0.5], "randomize": {"push_friction": [0.1, 0.5]}}, "push_friction_range"),
        ({"randomize_every": -1}, "randomize_every"),
        ({"randomize_at": [0]}, "randomize_at"),
        ({"event_cube_shift_std": -0.1}, "event_cube_shift_std"),
        ({"camera": "fisheye"}, "camera"),
        ({"max_episode_steps": 0}, "max_episode_steps"),
        ({"base_pos": [0.0, 0.0]}, "base_pos"),
    ],
)
def test_bad_option_raises_one_line_naming_it(kwargs, named):
    with pytest.raises(ValueError) as error:
        PushCubeRLVecEnv(num_envs=2, **kwargs)
    message = str(error.value)
    assert "\n" not in message and message.startswith("PushCubeRL: ") and named in message


# --------------------------------------------------------------------------- cameras
@pytest.mark.parametrize("camera", ["front", "side", "perspective"])
def test_eval_cameras_render_the_scene(camera):
    env = PushCubeRLVecEnv(num_envs=2, seed=0, camera=camera)
    env.reset(seed=0)
    image = env.render()
    assert isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.shape == (256, 256, 3)
    pixels = image.astype(int)
    blue = pixels[..., 2] > pixels[..., 0] + 60  # the cube is in view
    assert 10 < blue.sum() < 2000
    top = PushCubeRLVecEnv(num_envs=2, seed=0)
    top.reset(seed=0)
    assert not np.array_equal(top.render(), image)  # a different view than the top-down default
