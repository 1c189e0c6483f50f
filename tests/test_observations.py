"""TensorDict observations end to end: make_env keeps them (flatten_obs), rollout storage holds them in their
dtypes, normalization sees float entries only, the pixel encoder (images below 36 pixels too), non-finite checks,
checkpoints and resume."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from cleanrl_embodied import grpo, ppo_ddp, ppo_vla_async
from cleanrl_embodied import ppo_continuous as ppo
from cleanrl_embodied.shared import make_env, rollout_storage
from cleanrl_embodied.shared.non_finite import NonFiniteWatch
from cleanrl_embodied.shared.observations import finite_rows, float_dim, float_entries, image_spaces
from tests import envs_for_tests  # noqa: F401 - registers the PointReach ids
from tests.trainer_args import TWO_SAVED_ITERATIONS, tiny_args, trainers

PIXELS_ID = "tests.envs_for_tests:PointReachPixels-v0"
PIXEL_SPACE = gym.spaces.Dict(
    {
        "state": gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,), np.float32), "b": gym.spaces.Box(-1, 1, (3,))}),
        "rgb": gym.spaces.Box(0, 255, (3, 36, 40), np.uint8),
    }
)


def test_rollout_storage_holds_nested_observations_in_their_dtypes():
    storage = rollout_storage(4, 5, "cpu", obs=PIXEL_SPACE, done=((), torch.bool))
    assert storage["obs", "rgb"].shape == (4, 5, 3, 36, 40) and storage["obs", "rgb"].dtype == torch.uint8
    assert storage["obs", "state", "a"].dtype == torch.float32 and storage["obs", "state", "b"].shape == (4, 5, 3)
    assert storage["obs", "state", "b"].dtype == torch.float32  # the Box's float32 default
    batch = storage.reshape(-1)[torch.tensor([0, 7])]
    assert batch["obs", "rgb"].shape == (2, 3, 36, 40) and batch["obs", "rgb"].dtype == torch.uint8


def test_state_vector_normalizes_nothing_but_float_entries():
    obs = TensorDict(
        {
            "rgb": torch.full((2, 3, 36, 40), 200, dtype=torch.uint8),
            "state": {"a": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.zeros(2, 3)},
        },
        batch_size=[2],
    )
    assert list(image_spaces(PIXEL_SPACE)) == [("rgb",)] and float_dim(PIXEL_SPACE) == 5
    assert torch.equal(float_entries(obs), torch.tensor([[1.0, 2.0, 0, 0, 0], [3.0, 4.0, 0, 0, 0]]))
    plain = torch.randn(4, 6)
    assert float_entries(plain) is plain
    assert float_entries(obs.select("rgb")).shape == (2, 0)  # images only: an empty state
    obs["state", "b"][1, 2] = float("inf")
    assert finite_rows(obs).tolist() == [True, False]
    assert finite_rows(obs[None].expand(3, 2), batch_dims=2).tolist() == [[True, False]] * 3


def test_make_env_keeps_tensordicts_when_asked_and_flattens_state_by_default():
    flat = make_env("PushCubeRL", num_envs=3, seed=0, obs_mode="dict")
    nested = make_env("PushCubeRL", num_envs=3, seed=0, obs_mode="dict", flatten_obs=False)
    obs_flat, _ = flat.reset(seed=0)
    obs_nested, _ = nested.reset(seed=0)
    assert isinstance(obs_flat, torch.Tensor) and isinstance(obs_nested, TensorDict)
    assert isinstance(nested.single_observation_space, gym.spaces.Dict)
    assert torch.equal(float_entries(obs_nested), obs_flat)  # flattening = the sorted float leaves
    action = torch.zeros(3, 7)
    for _ in range(60):  # past the 50-step time limit: final_obs keeps the structure too
        _, _, _, truncated, info = nested.step(action)
        if truncated.any():
            break
    assert truncated.all() and isinstance(info["final_obs"], TensorDict)
    assert info["final_obs"].keys() == obs_nested.keys()


def test_image_observations_stay_tensordicts_of_uint8_by_default():
    env = make_env(PIXELS_ID, num_envs=2, seed=0)
    obs, _ = env.reset(seed=0)
    assert isinstance(obs, TensorDict) and obs["pixels"].dtype == torch.uint8 and obs["pixels"].shape == (2, 3, 36, 36)
    assert obs["position"].dtype == torch.float32
    assert (obs["pixels"][:, 1] == 255).any()  # the target is drawn
    forced = make_env(PIXELS_ID, num_envs=2, seed=0, flatten_obs=True)
    assert forced.reset(seed=0)[0].shape == (2, 2 + 3 * 36 * 36)
    with pytest.raises(ValueError, match="flatten_obs") as e:
        make_env(PIXELS_ID, num_envs=2, flatten_obs="yes")
    assert "\n" not in str(e.value)


def test_pixel_agent_encodes_images_and_normalizes_only_the_state():
    args = ppo.Args(norm_obs=True, hidden_sizes=(16,))
    agent = ppo.Agent(PIXEL_SPACE, gym.spaces.Box(-1, 1, (4,)), args)
    assert agent.obs_rms.mean.shape == (5,) and agent.encoder is not None
    obs = TensorDict(
        {
            "rgb": torch.zeros(3, 3, 36, 40, dtype=torch.uint8),
            "state": {"a": torch.zeros(3, 2), "b": torch.zeros(3, 3)},
        },
        batch_size=[3],
    )
    dist, value = agent(obs)
    assert dist.mean.shape == (3, 4) and value.shape == (3,)
    assert torch.equal(value, agent.get_value(obs)) and torch.equal(dist.mean, agent.dist(obs).mean)
    obs["rgb"][1] = 255  # only row 1 sees another image: only its value changes
    changed = agent.get_value(obs) != value
    assert changed.tolist() == [False, True, False]


def test_non_finite_watch_names_the_first_step_and_ignores_images():
    watch = NonFiniteWatch(3, "cpu")
    obs = TensorDict({"rgb": torch.zeros(4, 3, 3, 36, 36, dtype=torch.uint8), "x": torch.zeros(4, 3, 2)}, [4, 3])
    obs["x"][2, 1, 0] = float("nan")  # seen by action 2: produced by step 1
    last = TensorDict({"rgb": torch.zeros(3, 3, 36, 36, dtype=torch.uint8), "x": torch.zeros(3, 2)}, [3])
    last["x"][2] = float("inf")  # produced by the last step, 3
    rewards = torch.zeros(4, 3)
    rewards[0, 0] = float("nan")
    watch.update_final(2, last, torch.tensor([False, True, False]))  # a later step for env 1: the earlier one wins
    watch.update_rollout(obs, last, rewards)
    assert watch.first.tolist() == [[-1, 1, 3], [0, -1, -1]]


def tiny(tmp_path: Path, module=ppo, **overrides):
    settings = dict(
        env_id=PIXELS_ID,
        num_envs=4,
        num_steps=8,
        total_timesteps=96,
        num_minibatches=2,
        update_epochs=1,
        hidden_sizes=(16,),
        num_eval_envs=2,
        num_eval_episodes=2,
        eval_freq=0,
        save_freq=1,
        output_dir=str(tmp_path),
        norm_obs=True,
        seed=3,
    )
    settings.update(overrides)
    return module.Args(**settings)


@pytest.mark.parametrize("module", [ppo, ppo_ddp], ids=["ppo_continuous", "ppo_ddp"])  # (the classic trainers' encoder)
def test_pixel_ppo_runs_saves_and_evaluates(tmp_path, module):
    result = module.main(tiny(tmp_path / "a", module))
    last = Path(result["run_dir"]) / "checkpoints" / "last.pt"
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["model"]["obs_rms.mean"].shape == (2,)  # the position only, never the pixels
    assert any(key.startswith("encoder.cnns.0.") for key in ckpt["model"])
    assert (ckpt["model"]["obs_rms.count"] > 90).item()  # updated from the rollouts
    evaluated = module.main(tiny(tmp_path / "b", module, eval_checkpoint=str(last)))
    assert evaluated["global_step"] == 96 and np.isfinite(evaluated["eval"]["episodic_return"])


def test_tensordict_observations_resume_bit_identically(tmp_path):
    common = dict(
        env_id="PushCubeRL",
        env_kwargs='{"obs_mode": "dict", "flatten_obs": false}',
        eval_env_kwargs='{"obs_mode": "dict", "flatten_obs": false}',
        total_timesteps=4 * 8 * 6,
        save_freq=3,
        torch_deterministic=True,
        norm_reward=True,
    )
    straight = ppo.main(tiny(tmp_path / "a", **common))
    half = Path(straight["run_dir"]) / "checkpoints" / "iter_000003.pt"
    assert isinstance(torch.load(half, weights_only=True)["next_obs"], dict)
    resumed = ppo.main(tiny(tmp_path / "b", resume=str(half), **common))
    a = torch.load(Path(straight["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(Path(resumed["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_grpo_builtin_actor_reads_image_observations(tmp_path):
    """grpo.py's built-in actor puts images through the shared PixelEncoder (as the PPO agents do): a short run on
    pixels trains, and its checkpoint holds the encoder."""
    args = grpo.Args(
        env_id=PIXELS_ID, num_envs=4, group_size=2, num_steps=8, total_timesteps=64, num_minibatches=2,
        hidden_sizes=(16,), output_dir=str(tmp_path), num_eval_envs=2, num_eval_episodes=2, eval_freq=0,
    )  # fmt: skip
    out = grpo.main(args)
    model = torch.load(out["checkpoint"], weights_only=True)["model"]
    assert any(key.startswith("encoder.cnns.0.") for key in model)
    assert out["global_step"] == 64 and out["eval"]["episodic_return"] is not None


@pytest.mark.parametrize("module", [ppo, ppo_vla_async, grpo])
def test_eval_envs_with_other_observations_than_training_are_refused_in_one_line(tmp_path, module):
    """The eval envs inherit obs_mode from --env-kwargs; one that --eval-env-kwargs changes would build the policy
    for the eval envs' observations and crash in the first rollout: it is refused before training starts, naming
    both flags."""
    extra = {"group_size": 2} if module is grpo else {}
    extra.update({"policy": "toy_policies:ToyVLA"} if module is ppo_vla_async else {})  # (a VLA trainer: a toy VLA)
    args = module.Args(
        env_id="PushCubeRL",
        env_kwargs='{"obs_mode": "rgb", "image_size": 36}',
        eval_env_kwargs='{"obs_mode": "state"}',
        num_envs=2,
        num_eval_envs=2,
        num_eval_episodes=2,
        output_dir=str(tmp_path),
        cuda=False,
        **extra,
    )
    with pytest.raises(SystemExit) as e:
        module.main(args)
    message = str(e.value.code)
    assert "--env-kwargs and --eval-env-kwargs" in message and "observation" in message and "\n" not in message


def test_pixel_features_stay_bounded_for_the_tanh_heads():
    """The encoder's image features lie in [-1, 1] (LayerNorm then Tanh), also after weights grow: unbounded
    ReLU features saturated the agents' Tanh heads, which made actor and critic constant over the batch."""
    torch.manual_seed(0)
    encoder = ppo.PixelEncoder(PIXEL_SPACE, num_floats=5)  # (ppo_ddp.py and grpo.py hold copies of it)
    with torch.no_grad():  # as if a few large updates had blown the conv and linear weights up
        for module in encoder.modules():
            if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
                module.weight.mul_(30.0)
    obs = TensorDict({"rgb": torch.randint(0, 256, (16, 3, 36, 40), dtype=torch.uint8)}, batch_size=[16])
    state = torch.randn(16, 5)
    features = encoder(obs, state)
    assert features.shape == (16, encoder.out_dim) and encoder.out_dim == 256 + 5
    assert features[:, :256].abs().max() <= 1.0 and torch.equal(features[:, 256:], state)
    assert (features[:, :256].std(0) > 0).float().mean() > 0.9  # and they still differ between images


SCRIPTS = trainers(["ppo_continuous", "ppo_ddp"])


def push_cube_args(name: str, tmp_path: Path, **overrides):
    """Two iterations of PushCubeRL (the default --env-id)."""
    return tiny_args(name, tmp_path, TWO_SAVED_ITERATIONS, **overrides)


# Images smaller than 36 x 36 pixels work with the built-in pixel encoder.
def test_the_pixel_encoder_takes_images_below_36_pixels():
    from cleanrl_embodied.ppo_continuous import PixelEncoder  # (ppo_ddp.py and grpo.py hold copies of it)

    for shape in ((3, 8, 8), (3, 20, 40), (3, 35, 35), (1, 36, 36), (3, 64, 64)):
        space = gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, shape, np.uint8)})
        torch.manual_seed(0)
        encoder = PixelEncoder(space, num_floats=2, features=16)
        images = torch.randint(0, 256, (5, *shape), dtype=torch.uint8)
        out = encoder(TensorDict(rgb=images, batch_size=[5]), torch.zeros(5, 2))
        assert out.shape == (5, 18) and torch.isfinite(out).all()
        if min(shape[1:]) < 36:  # the same network as for a 36 x 36 image
            torch.manual_seed(0)
            big = PixelEncoder(gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, (shape[0], 36, 36), np.uint8)}), 2, 16)
            assert encoder.state_dict().keys() == big.state_dict().keys()
            assert all(torch.equal(a, b) for a, b in zip(encoder.state_dict().values(), big.state_dict().values()))


@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_ddp"])  # (the classic trainers' encoder)
def test_a_trainer_learns_from_16_pixel_images(tmp_path, name):
    kwargs = '{"obs_mode": "rgb", "image_size": 16}'
    out = SCRIPTS[name].main(push_cube_args(name, tmp_path, env_kwargs=kwargs, eval_env_kwargs=kwargs, save_freq=0))
    assert out["global_step"] == 40 and out["eval"]["episodic_length"] > 0
