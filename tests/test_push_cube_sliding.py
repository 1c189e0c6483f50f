"""Tests of PushCubeRL's sliding cube (cube_dynamics="sliding"): pushes give the cube a velocity, friction stops it."""

from __future__ import annotations

import pytest
import torch

from cleanrl_embodied.shared.envs.push_cube import CONTROL_DT, GRAVITY, OBS_DIM, TCP_RADIUS, PushCubeRLVecEnv
from tests.envs_for_tests import random_actions
from tests.test_push_cube import JOINT_DELTA_SCALE, dls_joint_step, place_tcp, scripted_push_policy, set_cube

pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py

HALF = 0.02  # default cube_half_size


def set_state(env: PushCubeRLVecEnv, **values: torch.Tensor) -> None:
    state = env.state_dict()
    state.update({key: value.clone() for key, value in values.items()})
    env.load_state_dict(state)


def test_kinematic_default_keeps_the_31_dim_observation_and_state():
    kinematic = PushCubeRLVecEnv(num_envs=4, seed=0)
    assert kinematic.cube_dynamics == "kinematic" and kinematic.single_observation_space.shape == (OBS_DIM,) == (31,)
    assert "cube_vel" not in kinematic.state_dict()
    sliding = PushCubeRLVecEnv(num_envs=4, seed=0, cube_dynamics="sliding")
    obs, _ = sliding.reset(seed=0)
    assert sliding.single_observation_space.shape == (33,) and obs.shape == (4, 33)
    assert torch.equal(obs[:, 31:], torch.zeros(4, 2))
    assert torch.equal(sliding.state_dict()["cube_vel"], torch.zeros(4, 2))
    nested, _ = PushCubeRLVecEnv(num_envs=4, seed=0, cube_dynamics="sliding", obs_mode="dict").reset(seed=0)
    assert nested["object", "cube_vel"].shape == (4, 2)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"cube_dynamics": "physx"}, "cube_dynamics"), ({"cube_friction": 0.0}, "cube_friction"),
     ({"cube_friction": -0.5}, "cube_friction"), ({"cube_friction": "high"}, "cube_friction")],
)  # fmt: skip
def test_bad_sliding_option_raises_one_line_naming_it(kwargs, named):
    with pytest.raises(ValueError) as error:
        PushCubeRLVecEnv(num_envs=2, **kwargs)
    message = str(error.value)
    assert "\n" not in message and message.startswith("PushCubeRL: ") and named in message


@pytest.mark.parametrize("friction", [0.2, 0.5, 1.0])
def test_free_cube_slides_exactly_v_squared_over_2_mu_g_and_stops(friction):
    env = PushCubeRLVecEnv(num_envs=4, seed=0, cube_dynamics="sliding", cube_friction=friction,
                           terminate_on_success=False)  # fmt: skip
    env.reset(seed=0)  # the TCP rests 15 cm above the table: no contact
    velocity = torch.tensor([[0.3, 0.0], [0.0, -0.05], [0.8, 0.6], [0.0, 0.0]])
    set_state(env, cube_vel=velocity)
    start = env.cube_xy.clone()
    for _ in range(30):
        env.step(torch.zeros(4, 7))
    speed = velocity.norm(dim=-1)
    travelled = env.cube_xy - start
    assert torch.allclose(travelled.norm(dim=-1), speed**2 / (2 * friction * GRAVITY), rtol=1e-5, atol=1e-7)
    assert torch.allclose(travelled[:3], velocity[:3] / speed[:3, None] * travelled[:3].norm(dim=-1, keepdim=True))
    assert torch.equal(env.cube_vel, torch.zeros(4, 2)) and torch.equal(travelled[3], torch.zeros(2))
    resting = env.cube_xy.clone()
    env.step(torch.zeros(4, 7))
    assert torch.equal(env.cube_xy, resting)


def push_then_stop(cube_dynamics: str, push_steps: int = 4):
    """Put the TCP at push height just behind each cube (-x) and push along +x at 0.2, 0.5 and 1.0 m/s for
    ``push_steps`` control steps (ee_delta_pos without the arm limits: the TCP moves as commanded, to first
    order, and stops at once), then hold still. Returns the cube's x displacement and velocity after every
    step, and the TCP's x velocity in the last push step."""
    env = PushCubeRLVecEnv(num_envs=3, seed=0, cube_dynamics=cube_dynamics, action_mode="ee_delta_pos",
                           arm_limits=False, terminate_on_success=False)  # fmt: skip
    env.reset(seed=0)
    start = env.tcp_pos.clone()
    start[:, 2] = HALF
    place_tcp(env, start)
    set_cube(env, start[:, :2] + torch.tensor([HALF + TCP_RADIUS + 1e-3, 0.0]))
    cube_start = env.cube_xy[:, 0].clone()
    shifts, velocities = [], []
    for step in range(push_steps + 12):
        action = torch.zeros(3, 3)
        if step < push_steps:
            action[:, 0] = torch.tensor([0.2, 0.5, 1.0])  # x 0.05 m per step at 1: 0.2, 0.5, 1.0 m/s
        tcp_x = env.tcp_pos[:, 0].clone()
        env.step(action)
        if step == push_steps - 1:
            tcp_velocity = (env.tcp_pos[:, 0] - tcp_x) / CONTROL_DT
        shifts.append(env.cube_xy[:, 0] - cube_start)
        velocities.append(env.cube_vel.clone() if cube_dynamics == "sliding" else None)
    return torch.stack(shifts), velocities, tcp_velocity


def test_push_gives_the_tcp_velocity_and_the_cube_slides_on_after_contact():
    push_steps = 4
    shifts, velocities, tcp_velocity = push_then_stop("sliding", push_steps)
    kinematic_shifts, _, _ = push_then_stop("kinematic", push_steps)
    # While pushed the cube moves like the kinematic one (the TCP carries it) ...
    assert torch.allclose(shifts[:push_steps], kinematic_shifts[:push_steps], atol=2e-3)
    assert (kinematic_shifts[push_steps - 1] > torch.tensor([0.02, 0.06, 0.13])).all()
    # ... at the TCP's velocity along the push
    pushed = velocities[push_steps - 1]
    assert (tcp_velocity > torch.tensor([0.18, 0.45, 0.85])).all()
    assert torch.allclose(pushed[:, 0], tcp_velocity, rtol=0.01) and (pushed[:, 1].abs() < 0.01).all()
    # After the TCP stops, the kinematic cube stays where it was left, the sliding one slides on and stops
    # after v^2 / (2 mu g).
    assert torch.equal(kinematic_shifts[push_steps:], kinematic_shifts[push_steps - 1].expand(12, 3))
    after_contact = shifts[-1] - shifts[push_steps - 1]
    stop_distance = pushed.norm(dim=-1) ** 2 / (2 * 0.5 * GRAVITY)
    assert (after_contact > 0.003).all() and torch.allclose(after_contact, stop_distance, rtol=1e-3, atol=1e-6)
    assert torch.equal(velocities[-1], torch.zeros(3, 2)) and torch.equal(shifts[-1], shifts[-2])


def test_cube_sliding_into_a_resting_tcp_stops_against_it():
    env = PushCubeRLVecEnv(num_envs=2, seed=0, cube_dynamics="sliding", action_mode="ee_delta_pos",
                           terminate_on_success=False)  # fmt: skip
    env.reset(seed=0)
    target = env.tcp_pos.clone()
    target[:, 2] = HALF
    place_tcp(env, target)
    set_state(env, cube_xy=target[:, :2] + torch.tensor([0.1, 0.0]), cube_vel=torch.tensor([[-1.5, 0.0], [-1.0, 0.0]]))
    for _ in range(10):
        env.step(torch.zeros(2, 3))
        assert (env.cube_xy[:, 0] - env.tcp_pos[:, 0] > HALF + TCP_RADIUS - 1e-4).all()  # never passes through
    assert torch.equal(env.cube_vel, torch.zeros(2, 2))
    assert torch.allclose(env.cube_xy[:, 0] - env.tcp_pos[:, 0], torch.full((2,), HALF + TCP_RADIUS), atol=1e-3)


def test_untouched_cube_never_moves():
    num_envs = 64
    env = PushCubeRLVecEnv(num_envs=num_envs, seed=0, cube_dynamics="sliding", terminate_on_success=False)
    env.reset(seed=0)
    start_xy, start_yaw = env.cube_xy.clone(), env.cube_yaw.clone()
    generator = torch.Generator().manual_seed(0)
    velocity_xy = torch.zeros(num_envs, 2)
    for _ in range(40):  # random horizontal TCP motion 15 cm above the table (as in test_push_cube)
        fresh = 0.06 * (2 * torch.rand(num_envs, 2, generator=generator) - 1)
        velocity_xy = 0.7 * velocity_xy + 0.3 * (fresh - 0.3 * env.tcp_pos[:, :2])
        hold_height = 0.5 * (0.15 - env.tcp_pos[:, 2:])
        actions = dls_joint_step(env.qpos, torch.cat((velocity_xy, hold_height), -1)) / JOINT_DELTA_SCALE
        env.step(actions / actions.abs().amax(-1, keepdim=True).clamp_min(1.0))
        assert (env.tcp_pos[:, 2] > 0.1).all()
    assert torch.equal(env.cube_xy, start_xy) and torch.equal(env.cube_yaw, start_yaw)
    assert torch.equal(env.cube_vel, torch.zeros(num_envs, 2))


def test_state_dict_round_trip_continues_identically_while_cubes_slide():
    kwargs = dict(num_envs=32, cube_dynamics="sliding", cube_friction=0.3, obs_noise_std=0.01, cube_yaw_range=0.5)
    env = PushCubeRLVecEnv(seed=0, **kwargs)
    obs, _ = env.reset(seed=0)
    for _ in range(30):  # scripted pushes: by now some cubes slide
        obs, *_ = env.step(scripted_push_policy(obs))
    assert (env.cube_vel != 0).any()
    saved = env.state_dict()
    expected, policy_obs, sliding = [], obs, 0
    for step in range(40):
        out = env.step(scripted_push_policy(policy_obs) + 0.3 * random_actions((32, 7), step))
        expected.append(out)
        policy_obs = out[0]
        sliding += int((env.cube_vel != 0).any(-1).sum())
    assert sliding >= 5  # env-steps with a moving cube (12 with these seeds)
    resumed = PushCubeRLVecEnv(seed=999, **kwargs)
    resumed.load_state_dict(saved)
    policy_obs = obs
    for step, (obs_e, reward, terminated, truncated, info) in enumerate(expected):
        got = resumed.step(scripted_push_policy(policy_obs) + 0.3 * random_actions((32, 7), step))
        assert torch.equal(got[0], obs_e) and torch.equal(got[1], reward)
        assert torch.equal(got[2], terminated) and torch.equal(got[3], truncated)
        assert torch.equal(got[4]["final_obs"], info["final_obs"])
        policy_obs = got[0]
    for key, value in env.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key
    with pytest.raises(KeyError, match="cube_vel"):  # a kinematic env's state lacks the velocity
        resumed.load_state_dict(PushCubeRLVecEnv(num_envs=32, seed=0).state_dict())


def test_reset_stops_the_cube():
    env = PushCubeRLVecEnv(num_envs=4, seed=0, cube_dynamics="sliding", max_episode_steps=3)
    env.reset(seed=0)
    set_state(env, cube_vel=torch.full((4, 2), 2.0))
    for _ in range(2):
        env.step(torch.zeros(4, 7))
    assert (env.cube_vel != 0).all()
    _, _, _, truncated, info = env.step(torch.zeros(4, 7))
    assert truncated.all() and torch.equal(env.cube_vel, torch.zeros(4, 2))
    assert (info["final_obs"][:, 31:] != 0).all()  # the final observation still shows the sliding cube
