"""PushCubeRL's observation cameras (``obs_cameras``): the wrist view next to the top view, its window that follows
the TCP, the unchanged top view, the checks, and a classic trainer that reads both images."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from cleanrl_embodied import ppo_continuous
from cleanrl_embodied.shared import PRIVILEGED_KEY
from cleanrl_embodied.shared.checkpoints import _env_differences
from cleanrl_embodied.shared.envs.push_cube import (
    OBS_DIM,
    WRIST_VIEW_WIDTH,
    PushCubeLangRLVecEnv,
    PushCubeRLVecEnv,
    expert_action,
)
from cleanrl_embodied.shared.language import INSTRUCTION_KEY
from tests.checks import steps_without_a_host_sync
from tests.envs_for_tests import random_actions
from tests.test_push_cube_rgb import centroid, cube_mask, set_state, tcp_mask

N = 4
BOTH = ("top", "wrist")

pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py


@pytest.mark.parametrize("obs_mode", ["rgb", "proprio+rgb", "state+rgb"])
def test_the_wrist_view_is_an_entry_of_every_image_mode(obs_mode):
    env = PushCubeRLVecEnv(num_envs=N, seed=0, obs_mode=obs_mode, obs_cameras=BOTH, image_size=(40, 48))
    keys = {"rgb", "wrist"} | (set() if obs_mode == "rgb" else {"state"})
    space = env.single_observation_space
    assert set(space.spaces) == keys and space["wrist"] == space["rgb"]
    assert space["wrist"].shape == (3, 40, 48) and space["wrist"].dtype == np.uint8
    obs, _ = env.reset(seed=1)
    obs2, _, _, _, info = env.step(random_actions((N, 7), 0))
    for value in (obs, obs2, info["final_obs"]):
        assert isinstance(value, TensorDict) and set(value.keys()) == keys
        assert value["wrist"].shape == (N, 3, 40, 48) and value["wrist"].dtype == torch.uint8
        assert space["wrist"].contains(value["wrist"][0].numpy())
    only = PushCubeRLVecEnv(num_envs=N, seed=0, obs_mode=obs_mode, obs_cameras=("wrist",), image_size=(40, 48))
    assert set(only.single_observation_space.spaces) == keys - {"rgb"}
    assert torch.equal(only.reset(seed=1)[0]["wrist"], obs["wrist"])


def test_the_top_view_dynamics_and_state_do_not_change_with_a_wrist_view():
    kwargs = dict(num_envs=N, max_episode_steps=6, obs_mode="proprio+rgb", obs_noise_std=0.01, cube_yaw_range=1.0)
    one, two = PushCubeRLVecEnv(seed=3, **kwargs), PushCubeRLVecEnv(seed=3, obs_cameras=BOTH, **kwargs)
    a, b = one.reset(seed=5)[0], two.reset(seed=5)[0]
    for step in range(8):  # across an autoreset (step 6)
        assert torch.equal(a["rgb"], b["rgb"]) and torch.equal(a["state"], b["state"])
        (a, ra, *_, ia), (b, rb, *_, ib) = (env.step(random_actions((N, 7), step)) for env in (one, two))
        assert torch.equal(ra, rb) and torch.equal(ia["final_obs"]["rgb"], ib["final_obs"]["rgb"])


def wrist_pixel_to_world(env: PushCubeRLVecEnv, row: torch.Tensor, col: torch.Tensor, tcp_xy) -> torch.Tensor:
    view = env._obs_views[-1]
    assert view.key == "wrist" and view.follows_tcp
    x0, y1 = tcp_xy[0] + view.x0, tcp_xy[1] + view.y1
    return torch.stack((x0 + (col + 0.5) * view.pixel, y1 - (row + 0.5) * view.pixel), -1)


def test_the_wrist_view_follows_the_tcp_and_shows_the_cube_large():
    """The TCP sits at the image's centre wherever it is; the cube shows where it lies relative to it, with
    WRIST_VIEW_WIDTH / W metres per pixel (the cube about 13 pixels wide at 64 x 64)."""
    env = PushCubeRLVecEnv(num_envs=1, seed=0, obs_mode="rgb", obs_cameras=BOTH, action_mode="ee_delta_pos")
    env.reset(seed=0)
    pixel = WRIST_VIEW_WIDTH / 64
    assert env._obs_views[-1].pixel == pixel
    size = float(2 * env.cube_half_size[0])
    for _ in range(6):
        tcp = env.tcp_pos[0, :2].clone()
        for offset in ([0.05, 0.0], [-0.04, 0.03], [0.0, -0.06]):
            xy = tcp + torch.tensor(offset)
            set_state(env, cube_xy=xy.view(1, 2), cube_yaw=torch.zeros(1))
            image = env._render_images()["wrist"][0]
            row, col = centroid(tcp_mask(image))
            assert torch.allclose(torch.stack((row, col)), torch.tensor([31.5, 31.5]), atol=0.6)
            mask = cube_mask(image)
            assert 0.8 * (size / pixel) ** 2 <= mask.sum() <= 1.2 * (size / pixel) ** 2 + 8
            assert torch.allclose(wrist_pixel_to_world(env, *centroid(mask), tcp), xy, atol=0.6 * pixel)
        env.step(torch.tensor([[0.6, -0.4, -0.3]]))  # the TCP moves: the window with it


def test_the_wrist_view_draws_the_whole_goal_disk_as_its_tile_would():
    """The goal region's tile would hold more pixels than the wrist image: it is drawn over the image in place
    instead, with the same pixels."""
    env = PushCubeRLVecEnv(num_envs=8, seed=0, obs_mode="rgb", obs_cameras=BOTH, cube_yaw_range=1.0)
    env.reset(seed=0)
    view = env._obs_views[-1]
    assert view.tiles["goal_region"] is None and env._obs_views[0].tiles["goal_region"] is not None
    reach = math.floor(env.goal_radius / view.pixel + 0.5)
    seen_goal = 0
    for _ in range(12):  # the expert brings the TCP near the goal disk
        dense = env._render_images()["wrist"]
        view.tiles["goal_region"] = torch.arange(-reach, reach + 1)
        assert torch.equal(env._render_images()["wrist"], dense)
        view.tiles["goal_region"] = None
        r, g, b = dense.int().unbind(1)
        seen_goal += int(((g > 200) & (r > 130) & (r < 180)).sum())
        env.step(expert_action(env))
    assert seen_goal > 1000


def test_wrist_images_are_deterministic_and_resume_from_a_state_dict():
    kwargs = dict(num_envs=N, max_episode_steps=5, obs_mode="rgb", obs_cameras=BOTH)
    env = PushCubeRLVecEnv(seed=0, **kwargs)
    env.reset(seed=2)
    for step in range(3):
        env.step(random_actions((N, 7), step))
    resumed = PushCubeRLVecEnv(seed=9, **kwargs)
    resumed.load_state_dict(env.state_dict())
    for step in range(4):  # through an autoreset
        (a, *_, ia), (b, *_, ib) = (e.step(random_actions((N, 7), 10 + step)) for e in (env, resumed))
        assert torch.equal(a["wrist"], b["wrist"]) and torch.equal(ia["final_obs"]["wrist"], ib["final_obs"]["wrist"])
    assert not torch.equal(a["wrist"][0], a["wrist"][1])


def test_privileged_state_and_tasks_keep_working_with_the_wrist_view():
    env = PushCubeRLVecEnv(num_envs=N, seed=0, obs_mode="proprio+rgb", obs_cameras=BOTH, privileged_state=True)
    obs, _ = env.reset(seed=0)
    assert set(obs.keys()) == {"state", "rgb", "wrist", PRIVILEGED_KEY} and obs[PRIVILEGED_KEY].shape == (N, OBS_DIM)
    assert set(env.single_observation_space.spaces) == set(obs.keys())
    lang = PushCubeLangRLVecEnv(num_envs=N, seed=0, obs_mode="rgb", obs_cameras=BOTH, privileged_state=True)
    obs, *_ = lang.step(random_actions((N, 7), 0))
    assert set(obs.keys()) == {"rgb", "wrist", INSTRUCTION_KEY, PRIVILEGED_KEY}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"obs_cameras": ("front",)},
        {"obs_cameras": "wrist"},
        {"obs_cameras": ()},
        {"obs_cameras": ("wrist", "top")},
        {"obs_cameras": ("top", "top")},
        {"obs_cameras": ("top", "wrist"), "obs_mode": "state"},
        {"obs_cameras": ["wrist"], "obs_mode": "dict"},
    ],
)
def test_bad_cameras_are_one_line_naming_the_kwarg(kwargs):
    kwargs = {"obs_mode": "rgb", **kwargs}
    with pytest.raises(ValueError) as error:
        PushCubeRLVecEnv(num_envs=2, **kwargs)
    message = str(error.value)
    assert "\n" not in message and message.startswith("PushCubeRL: obs_cameras must be ") and "'wrist'" in message


def test_cameras_are_part_of_what_a_checkpoint_must_match():
    """obs_cameras changes what a policy sees: another value is refused on --resume and --eval-checkpoint, the
    default (as given by JSON or not at all) is the same."""
    changed = _env_differences("PushCubeRL", {"obs_cameras": ["top", "wrist"]}, json.loads('{"obs_cameras": ["top"]}'))
    assert changed == [("obs_cameras", ["top", "wrist"], ["top"], True)]
    assert _env_differences("PushCubeLangRL", {"obs_cameras": ["top"]}, {}) == []
    assert _env_differences("PushCubeRL", {"obs_cameras": ("top", "wrist")}, {"obs_cameras": ["top", "wrist"]}) == []
    env = gym.make_vec("PushCubeRL", num_envs=2, obs_mode="rgb", obs_cameras=["top", "wrist"], image_size=16)
    assert env.reset(seed=0)[0]["wrist"].shape == (2, 3, 16, 16)


def test_ppo_continuous_trains_on_both_cameras_with_a_cnn_each(tmp_path: Path):
    kwargs = json.dumps({"obs_mode": "proprio+rgb", "obs_cameras": ["top", "wrist"], "image_size": 16})
    args = ppo_continuous.Args(
        output_dir=str(tmp_path), env_kwargs=kwargs, eval_env_kwargs=kwargs, num_envs=4, num_steps=5,
        num_minibatches=2, update_epochs=1, num_eval_envs=2, num_eval_episodes=2, hidden_sizes=(8, 8), cuda=False,
        eval_freq=0, save_freq=1, total_timesteps=2 * 20,
    )  # fmt: skip
    out = ppo_continuous.main(args)
    assert out["global_step"] == 40 and out["eval"]["episodic_length"] > 0
    first, last = (torch.load(Path(out["run_dir"]) / "checkpoints" / f"iter_00000{i}.pt", weights_only=True)
                   for i in (1, 2))  # fmt: skip
    cnn = lambda model, i: {k[15:]: v for k, v in model.items() if k.startswith(f"encoder.cnns.{i}.")}  # noqa: E731
    assert cnn(last["model"], 0) and cnn(last["model"], 0).keys() == cnn(last["model"], 1).keys()
    assert not cnn(last["model"], 2)
    for i in (0, 1):  # each camera's CNN learnt in the second iteration
        assert any(not torch.equal(a, cnn(last["model"], i)[k]) for k, a in cnn(first["model"], i).items())
    assert [path for path, _, _ in last["env"]["observation"]["leaves"]] == ["rgb", "state", "wrist"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_both_cameras_step_without_a_host_sync_on_a_gpu():
    """Everything the cameras draw stays on the device: no step (autoresets included) waits for the host."""
    env = PushCubeRLVecEnv(num_envs=64, device="cuda", seed=0, obs_mode="proprio+rgb", obs_cameras=BOTH,
                           privileged_state=True, max_episode_steps=3)  # fmt: skip
    obs, *_ = steps_without_a_host_sync(env)
    assert obs["wrist"].device.type == "cuda" and obs["wrist"].shape == (64, 3, 64, 64)
