"""Tests of PushCubeRL's image observations (obs_mode "rgb" and "state+rgb"): structure, the camera, determinism."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

import cleanrl_embodied.shared.envs  # noqa: F401  (registers PushCubeRL)
from cleanrl_embodied.shared.envs.push_cube import OBS_DIM, OBS_LAYOUT, PushCubeRLVecEnv
from tests.envs_for_tests import random_actions

N = 4


pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py


def cube_mask(rgb: torch.Tensor) -> torch.Tensor:
    """Pixels [..., H, W] of the cube's blue (also under the see-through links and in the TCP's shadow)."""
    r, g, b = rgb.int().unbind(-3)
    return (b > r + 60) & (b > g + 60)


def tcp_mask(rgb: torch.Tensor) -> torch.Tensor:
    """Pixels of the TCP: red to yellow (red high, blue low)."""
    r, g, b = rgb.int().unbind(-3)
    return (r > 230) & (b < 50)


def pixel_to_world(env: PushCubeRLVecEnv, row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """World xy of (fractional) pixel coordinates of the observation camera (pixel centres at +0.5)."""
    view = env._obs_views[0]  # the top view, at a fixed place
    return torch.stack((view.x0 + (col + 0.5) * view.pixel, view.y1 - (row + 0.5) * view.pixel), -1)


def centroid(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = torch.nonzero(mask, as_tuple=True)
    return rows.float().mean(), cols.float().mean()


def set_state(env: PushCubeRLVecEnv, **values: torch.Tensor) -> None:
    state = env.state_dict()
    state.update({key: value.clone() for key, value in values.items()})
    env.load_state_dict(state)


# --------------------------------------------------------------------------- structure
@pytest.mark.parametrize("obs_mode", ["rgb", "proprio+rgb", "state+rgb"])
def test_rgb_modes_shapes_dtypes_and_spaces(obs_mode):
    env = PushCubeRLVecEnv(num_envs=N, seed=0, obs_mode=obs_mode)
    keys = {"rgb"} if obs_mode == "rgb" else {"state", "rgb"}
    state_dim = {"proprio+rgb": 17, "state+rgb": OBS_DIM}.get(obs_mode)
    space = env.single_observation_space
    assert isinstance(space, gym.spaces.Dict) and set(space.spaces) == keys
    assert space["rgb"].shape == (3, 64, 64) and space["rgb"].dtype == np.uint8
    assert space["rgb"].low.min() == 0 and space["rgb"].high.max() == 255
    assert env.observation_space["rgb"].shape == (N, 3, 64, 64)
    if state_dim:
        assert space["state"].shape == (state_dim,) and space["state"].dtype == np.float32
    obs, _ = env.reset(seed=1)
    obs2, _, _, _, info = env.step(random_actions((N, 7), 0))
    for value in (obs, obs2, info["final_obs"]):
        assert isinstance(value, TensorDict) and value.batch_size == torch.Size([N]) and set(value.keys()) == keys
        assert value.device == env.device
        assert value["rgb"].shape == (N, 3, 64, 64) and value["rgb"].dtype == torch.uint8
        assert value["rgb"].device == env.device and value["rgb"].is_contiguous()
        if state_dim:
            assert value["state"].shape == (N, state_dim) and value["state"].dtype == torch.float32
        assert space["rgb"].contains(value["rgb"][0].numpy())


def test_image_size_int_or_height_width():
    env = PushCubeRLVecEnv(num_envs=2, seed=0, obs_mode="rgb", image_size=(40, 72))
    obs, _ = env.reset(seed=0)
    assert obs["rgb"].shape == (2, 3, 40, 72) and env.single_observation_space["rgb"].shape == (3, 40, 72)
    assert cube_mask(obs["rgb"]).flatten(1).any(1).all()  # the wide view still shows every cube
    env = PushCubeRLVecEnv(num_envs=2, seed=0, obs_mode="state+rgb", image_size=32)
    assert env.reset(seed=0)[0]["rgb"].shape == (2, 3, 32, 32)


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"image_size": 0}, "image_size"),
        ({"image_size": -64}, "image_size"),
        ({"image_size": 64.0}, "image_size"),
        ({"image_size": "64"}, "image_size"),
        ({"image_size": True}, "image_size"),
        ({"image_size": (64,)}, "image_size"),
        ({"image_size": (64, 0)}, "image_size"),
        ({"image_size": [64, 64, 3]}, "image_size"),
        ({"obs_mode": "pixels"}, "'state+rgb'"),
        ({"obs_mode": "RGB"}, "obs_mode"),
    ],
)
def test_bad_image_arguments_raise_one_line(kwargs, named):
    with pytest.raises(ValueError) as error:
        PushCubeRLVecEnv(num_envs=2, obs_mode=kwargs.pop("obs_mode", "rgb"), **kwargs)
    message = str(error.value)
    assert "\n" not in message and message.startswith("PushCubeRL: ") and named in message


def test_make_vec_with_rgb_observations():
    env = gym.make_vec("PushCubeRL", num_envs=N, obs_mode="rgb", image_size=32, seed=0)
    obs, _ = env.reset(seed=0)
    assert obs["rgb"].shape == (N, 3, 32, 32) and obs["rgb"].dtype == torch.uint8
    obs, reward, _, _, info = env.step(random_actions((N, 7), 0))
    assert obs["rgb"].shape == (N, 3, 32, 32) and reward.shape == (N,) and "episode" in info


def test_state_mode_draws_no_images(monkeypatch):
    def fail(self):
        raise AssertionError("rendered in state mode")

    monkeypatch.setattr(PushCubeRLVecEnv, "_render_images", fail)
    env = PushCubeRLVecEnv(num_envs=N, seed=0)
    env.reset(seed=0)
    obs, *_ = env.step(random_actions((N, 7), 0))
    assert obs.shape == (N, OBS_DIM) and not hasattr(env, "_palette")


# --------------------------------------------------------------------------- same task as the state mode
def test_state_part_rewards_and_dynamics_match_the_state_mode():
    kwargs = dict(num_envs=N, max_episode_steps=6, obs_noise_std=0.01, action_noise_std=0.1,
                  cube_half_size_range=(0.015, 0.025))  # fmt: skip
    envs = {mode: PushCubeRLVecEnv(seed=3, obs_mode=mode, **kwargs) for mode in ("state", "state+rgb", "rgb")}
    first = {mode: env.reset(seed=5)[0] for mode, env in envs.items()}
    assert torch.equal(first["state+rgb"]["state"], first["state"])
    assert torch.equal(first["state+rgb"]["rgb"], first["rgb"]["rgb"])
    truncations = 0
    for step in range(8):  # across an autoreset (step 6)
        out = {mode: env.step(random_actions((N, 7), step)) for mode, env in envs.items()}
        obs, reward, terminated, truncated, info = out["state"]
        truncations += int(truncated.sum())
        assert torch.equal(out["state+rgb"][0]["state"], obs)
        assert torch.equal(out["state+rgb"][4]["final_obs"]["state"], info["final_obs"])
        assert torch.equal(out["state+rgb"][0]["rgb"], out["rgb"][0]["rgb"])
        for mode in ("state+rgb", "rgb"):
            assert torch.equal(out[mode][1], reward)
            assert torch.equal(out[mode][2], terminated) and torch.equal(out[mode][3], truncated)
            assert torch.equal(envs[mode].cube_xy, envs["state"].cube_xy)
    assert truncations == N


def test_observation_noise_leaves_the_images_alone():
    clean = PushCubeRLVecEnv(num_envs=N, seed=0, obs_mode="state+rgb")
    noisy = PushCubeRLVecEnv(num_envs=N, seed=0, obs_mode="state+rgb", obs_noise_std=0.5)
    obs_clean, obs_noisy = clean.reset(seed=2)[0], noisy.reset(seed=2)[0]
    assert torch.equal(obs_clean["rgb"], obs_noisy["rgb"])
    assert (obs_clean["state"] - obs_noisy["state"]).abs().mean() > 0.1


# --------------------------------------------------------------------------- determinism, groups, state
def test_same_seed_same_images():
    env_a = PushCubeRLVecEnv(num_envs=N, seed=1, obs_mode="rgb")
    env_b = PushCubeRLVecEnv(num_envs=N, seed=2, obs_mode="rgb")
    obs_a, obs_b = env_a.reset(seed=9)[0], env_b.reset(seed=9)[0]
    assert torch.equal(obs_a["rgb"], obs_b["rgb"])
    assert not torch.equal(obs_a["rgb"][0], obs_a["rgb"][1])  # different starts, different images
    for step in range(5):
        actions = random_actions((N, 7), step)
        obs_a, obs_b = env_a.step(actions)[0], env_b.step(actions)[0]
        assert torch.equal(obs_a["rgb"], obs_b["rgb"])
    assert not torch.equal(env_a.reset(seed=10)[0]["rgb"], obs_b["rgb"])


def test_group_reset_gives_identical_images_within_groups():
    env = PushCubeRLVecEnv(num_envs=8, seed=0, obs_mode="rgb", cube_yaw_range=1.0)
    images = env.reset(seed=3, options={"group_size": 4})[0]["rgb"].view(2, 4, 3, 64, 64)
    assert torch.equal(images, images[:, :1].expand_as(images))
    assert not torch.equal(images[0, 0], images[1, 0])


def test_state_dict_round_trip_gives_identical_images():
    kwargs = dict(num_envs=N, max_episode_steps=8, obs_mode="state+rgb", obs_noise_std=0.01)
    env = PushCubeRLVecEnv(seed=0, **kwargs)
    env.reset(seed=0)
    for step in range(5):
        env.step(random_actions((N, 7), step))
    saved = env.state_dict()
    expected = [env.step(random_actions((N, 7), 100 + step)) for step in range(6)]  # an autoreset at step 8
    resumed = PushCubeRLVecEnv(seed=999, **kwargs)
    resumed.load_state_dict(saved)
    for step, (obs, _, _, _, info) in enumerate(expected):
        got_obs, _, _, _, got_info = resumed.step(random_actions((N, 7), 100 + step))
        assert torch.equal(got_obs["rgb"], obs["rgb"]) and torch.equal(got_obs["state"], obs["state"])
        assert torch.equal(got_info["final_obs"]["rgb"], info["final_obs"]["rgb"])


def test_final_obs_images_show_the_final_state():
    short = PushCubeRLVecEnv(num_envs=N, seed=0, obs_mode="rgb", max_episode_steps=4, terminate_on_success=False)
    longer = PushCubeRLVecEnv(num_envs=N, seed=0, obs_mode="rgb", max_episode_steps=5, terminate_on_success=False)
    short.reset(seed=4)
    longer.reset(seed=4)
    for step in range(4):
        actions = random_actions((N, 7), step)
        obs, _, _, truncated, info = short.step(actions)
        same_episode = longer.step(actions)[0]
        if step < 3:  # nothing finished: final_obs is the current observation
            assert not info["_final_obs"].any() and torch.equal(info["final_obs"]["rgb"], obs["rgb"])
    assert truncated.all() and info["_final_obs"].all()
    assert torch.equal(info["final_obs"]["rgb"], same_episode["rgb"])  # the image of the last state
    for row in range(N):  # the new episode starts elsewhere
        assert not torch.equal(info["final_obs"]["rgb"][row], obs["rgb"][row])


# --------------------------------------------------------------------------- the camera shows the task
def test_cube_pixels_track_the_cube():
    env = PushCubeRLVecEnv(num_envs=1, seed=0, obs_mode="rgb")
    env.reset(seed=0)
    size = float(2 * env.cube_half_size[0])
    previous_xy, previous = None, None
    # The rest-pose TCP and arm are around y = 0: the cube moves along y = -0.12 and then up to y = -0.05.
    for xy in ([-0.1, -0.12], [0.0, -0.12], [0.1, -0.12], [0.25, -0.12], [0.25, -0.05]):
        set_state(env, cube_xy=torch.tensor([xy]), cube_yaw=torch.zeros(1))
        image = env._render_images()["rgb"][0]
        mask = cube_mask(image)
        pixel = env._obs_views[0].pixel
        assert 0.7 * (size / pixel) ** 2 <= mask.sum() <= 1.5 * (size / pixel) ** 2 + 4
        row, col = centroid(mask)
        assert torch.allclose(pixel_to_world(env, row, col), torch.tensor(xy), atol=0.6 * pixel)
        if previous is not None:
            assert col > previous[1] + 5 if xy[0] > previous_xy[0] else row < previous[0] - 5  # right, or up
        previous, previous_xy = (row, col), xy


def test_goal_tcp_and_tcp_height_are_visible():
    env = PushCubeRLVecEnv(num_envs=N, seed=0, obs_mode="rgb", action_mode="ee_delta_pos")
    obs, _ = env.reset(seed=0)
    for row in range(N):
        image = obs["rgb"][row]
        r, g, b = image.int().unbind(0)
        goal_centre = (g > r + 60) & (g > b + 60) & (g < 160)  # dark green
        goal_region = (g > 200) & (r > 130) & (r < 180)  # light green disk
        assert goal_centre.sum() >= 3 and goal_region.sum() > 300
        goal_row, goal_col = centroid(goal_centre)
        assert torch.allclose(pixel_to_world(env, goal_row, goal_col), env.goal_xy[row], atol=env._obs_views[0].pixel)
        tcp_row, tcp_col = centroid(tcp_mask(image))
        assert torch.allclose(pixel_to_world(env, tcp_row, tcp_col), env.tcp_pos[row, :2], atol=env._obs_views[0].pixel)
    high_green = obs["rgb"][:, 1][tcp_mask(obs["rgb"])].float().mean()
    high_z = env.tcp_pos[:, 2].clone()
    for _ in range(15):  # straight down to the table (or the cube's top)
        obs, *_ = env.step(torch.tensor([[0.0, 0.0, -1.0]]).expand(N, 3))
    assert (env.tcp_pos[:, 2] < 0.06).all() and (high_z > 0.15).all()
    low_green = obs["rgb"][:, 1][tcp_mask(obs["rgb"])].float().mean()
    assert high_green > low_green + 100  # the TCP is yellow-orange high up and red at the table


def test_tcp_shadow_meets_the_tcp_when_it_is_down():
    env = PushCubeRLVecEnv(num_envs=1, seed=0, obs_mode="rgb", action_mode="ee_delta_pos")
    obs, _ = env.reset(seed=0)

    def shadow_gap(image: torch.Tensor) -> float:
        """Rows between the TCP's centroid and its shadow's (dark grey pixels under the TCP's column)."""
        r, g, b = image.int().unbind(0)
        tcp_row, tcp_col = centroid(tcp_mask(image))
        dark = (r < 120) & (g < 120) & (b < 120) & ((r - b).abs() < 20)
        dark[:, : int(tcp_col) - 3] = False
        dark[:, int(tcp_col) + 4 :] = False
        dark[: int(tcp_row)] = False
        return float(centroid(dark)[0] - tcp_row)

    high = shadow_gap(obs["rgb"][0])
    expected = 0.5 * (float(env.tcp_pos[0, 2])) / env._obs_views[0].pixel
    assert abs(high - expected) < 2.0 and high > 5
    for _ in range(15):
        obs, *_ = env.step(torch.tensor([[0.0, 0.0, -1.0]]))
    assert env.tcp_pos[0, 2] < 0.06 and shadow_gap(obs["rgb"][0]) < 3


def test_proprio_rgb_state_is_the_robots_part_of_the_state_observation():
    """proprio+rgb: qpos, qvel and tcp_pos exactly as the state mode has them (noise included), the same images
    as rgb; nothing about the cube or the goal outside the image."""
    kwargs = dict(num_envs=N, max_episode_steps=6, obs_noise_std=0.01, image_size=40)
    envs = [PushCubeRLVecEnv(seed=0, obs_mode=mode, **kwargs) for mode in ("proprio+rgb", "state", "rgb")]
    outs = [env.reset(seed=2)[0] for env in envs]
    for step in range(8):  # through an autoreset
        actions = random_actions((N, 7), step)
        (p, s, r) = outs
        assert torch.equal(p["state"], s[:, :17]) and torch.equal(p["rgb"], r["rgb"])
        outs = [env.step(actions)[0] for env in envs]
    names = [name for _, name, _ in OBS_LAYOUT]
    assert names[:3] == ["qpos", "qvel", "tcp_pos"] and sum(size for _, _, size in OBS_LAYOUT[:3]) == 17
