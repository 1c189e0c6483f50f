"""The eval envs default to the training envs: `--eval-env-kwargs` starts from `--env-kwargs` without the keys that
randomize or disturb the env (evaluation measures the nominal task) and overrides or adds only the keys it names."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch

from cleanrl_embodied import grpo, ppo_ddp
from cleanrl_embodied import ppo_continuous as ppo
from cleanrl_embodied.shared.builders import EnvOptions, build_env
from cleanrl_embodied.shared.envs import RANDOMIZATION_KWARGS
from cleanrl_embodied.shared.envs.push_cube import PushCubeRLVecEnv
from cleanrl_embodied.shared.envs.wrappers import IntervalRandomization
from tests.trainer_args import FOUR_ENVS

RANDOMIZED = {
    "push_friction_range": [0.5, 1.5],
    "cube_half_size_range": [0.015, 0.025],
    "obs_noise_std": 0.01,
    "action_noise_std": 0.05,
    "randomize": {"action_noise_std": [0.0, 0.1]},
    "randomize_every": 10,
    "randomize_at": [5],
    "event_cube_shift_std": 0.01,
    "randomize_interval": 7,
}


def run_args(env_kwargs: dict, eval_env_kwargs: dict, env_id: str = "PushCubeRL") -> EnvOptions:
    return EnvOptions(env_id, json.dumps(env_kwargs), json.dumps(eval_env_kwargs))


def test_eval_kwargs_inherit_the_training_kwargs_and_override_only_what_they_name():
    args = run_args({"obs_mode": "rgb", "image_size": 48, "max_episode_steps": 30}, {"camera": "front"})
    assert args.kwargs(eval_envs=False) == {"obs_mode": "rgb", "image_size": 48, "max_episode_steps": 30}
    assert args.kwargs(eval_envs=True) == {
        "obs_mode": "rgb",
        "image_size": 48,
        "max_episode_steps": 30,
        "camera": "front",
    }
    args = run_args({"obs_mode": "rgb", "max_episode_steps": 30}, {"max_episode_steps": 100})
    assert args.kwargs(eval_envs=True) == {"obs_mode": "rgb", "max_episode_steps": 100}
    assert run_args({}, {}).kwargs(eval_envs=True) == {}


def test_eval_kwargs_leave_out_randomization_unless_they_name_it():
    args = run_args({"obs_mode": "dict", **RANDOMIZED}, {})
    assert args.kwargs(eval_envs=False) == {"obs_mode": "dict", **RANDOMIZED}
    assert args.kwargs(eval_envs=True) == {"obs_mode": "dict"}  # the nominal task
    args = run_args({"obs_mode": "dict", **RANDOMIZED}, {"push_friction_range": [0.9, 1.1]})
    assert args.kwargs(eval_envs=True) == {"obs_mode": "dict", "push_friction_range": [0.9, 1.1]}


def test_randomization_keys_are_ones_the_envs_take():
    """A renamed PushCubeRL option would silently be inherited by the eval envs: every key of the list is one of
    PushCubeRL's parameters, make_env's own randomize_interval or the mjlab backend's init_at_random_ep_len, and
    every PushCubeRL parameter that randomizes is in the list."""
    from cleanrl_embodied.shared.envs.isaaclab_backend import ADAPTER_KWARGS

    params = set(inspect.signature(PushCubeRLVecEnv.__init__).parameters)
    assert set(RANDOMIZATION_KWARGS) - params == {"randomize_interval", "init_at_random_ep_len"}
    assert "init_at_random_ep_len" in ADAPTER_KWARGS
    randomizing = {p for p in params if p.startswith(("randomize", "event_")) or p.endswith(("_range", "_noise_std"))}
    assert randomizing - {"cube_xy_range", "cube_yaw_range"} <= set(RANDOMIZATION_KWARGS)  # start-state spread: task


def test_built_eval_envs_are_the_training_envs_without_randomization():
    args = run_args(
        {"obs_mode": "rgb", "image_size": 36, "max_episode_steps": 20, **RANDOMIZED}, {"camera": "perspective"}
    )
    eval_envs = build_env(args, 2, 0, torch.device("cpu"), eval_envs=True)
    envs = build_env(args, 2, 1, torch.device("cpu"), eval_envs=False, like=eval_envs)
    train, evaluation = envs.unwrapped, eval_envs.unwrapped
    assert isinstance(envs, IntervalRandomization) and not isinstance(eval_envs, IntervalRandomization)
    assert train.obs_mode == evaluation.obs_mode == "rgb" and train.image_size == evaluation.image_size == (36, 36)
    assert train.max_episode_steps == evaluation.max_episode_steps == 20
    assert train.camera == "top" and evaluation.camera == "perspective"  # the override, for the eval envs only
    assert train.param_ranges["push_friction"] == (0.5, 1.5) and train.randomize_every == 10
    assert train.event_cube_shift_std == 0.01 and train.param_ranges["obs_noise_std"] == (0.01, 0.01)
    assert train.param_ranges["action_noise_std"] == (0.0, 0.1) and train.randomize_at == (5,)
    nominal = {name: (low, low) for name, (low, _) in evaluation.param_ranges.items()}
    assert evaluation.param_ranges == nominal and evaluation.param_ranges["obs_noise_std"] == (0.0, 0.0)
    assert evaluation.randomize_every == 0 and evaluation.randomize_at == () and evaluation.event_cube_shift_std == 0


def test_a_bad_inherited_key_names_the_flag_that_carried_it(tmp_path):
    with pytest.raises(SystemExit) as e:
        build_env(run_args({"no_such_option": 1}, {}), 2, 0, torch.device("cpu"), eval_envs=True)
    message = str(e.value.code)
    assert message.startswith("error: --env-kwargs (inherited by the eval envs)") and "no_such_option" in message
    with pytest.raises(SystemExit) as e:
        build_env(run_args({}, {"no_such_option": 1}), 2, 0, torch.device("cpu"), eval_envs=True)
    assert str(e.value.code).startswith("error: --eval-env-kwargs / --env-id PushCubeRL")


def test_an_env_the_trainers_cannot_serve_is_blamed_on_the_env_id_when_no_kwargs_were_given():
    for eval_envs in (True, False):
        with pytest.raises(SystemExit) as e:
            build_env(run_args({}, {}, env_id="CartPole-v1"), 2, 0, torch.device("cpu"), eval_envs=eval_envs)
        message = str(e.value.code)
        assert message.startswith("error: --env-id CartPole-v1: ") and "Discrete" in message, message


TINY = dict(FOUR_ENVS, num_steps=8, update_epochs=1, total_timesteps=32, hidden_sizes=(16,), eval_freq=0, save_freq=0)


@pytest.mark.parametrize("module", [ppo, ppo_ddp, grpo], ids=lambda m: m.__name__.split(".")[-1])
def test_env_kwargs_alone_configure_the_eval_envs_in_every_trainer(tmp_path, module):
    """`--env-kwargs` alone changes the observation space (pixels; GRPO's built-in actor takes no images, so an
    action space there) and the episode limit, and every classic trainer trains and evaluates on those envs."""
    if module is grpo:
        config = dict(TINY, group_size=2, num_steps=None, total_timesteps=4 * 10)
        env_kwargs = {"action_mode": "ee_delta_pos", "max_episode_steps": 10}
    else:
        config, env_kwargs = TINY, {"obs_mode": "rgb", "image_size": 36, "max_episode_steps": 10}
    out = module.main(module.Args(output_dir=str(tmp_path), env_kwargs=json.dumps(env_kwargs), **config))
    summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
    assert 1 <= summary["eval"]["episodic_length"] <= 10  # the eval envs' episodes follow the training limit
    model = torch.load(Path(out["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)["model"]
    if module is grpo:
        assert model[[k for k in model if k.endswith("weight")][-1]].shape[0] == 3  # 3 TCP deltas
    else:
        assert any(key.startswith("encoder.cnns.0.") for key in model)  # a pixel policy, used in eval too
