"""A critic that reads privileged simulator state (--privileged-critic) while the actor reads what a robot has: the
env's "privileged" entry (shared.PRIVILEGED_KEY), PushCubeRL's `privileged_state`, the built-in agent of the PPO
trainers, evaluation and export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from cleanrl_embodied import ppo_continuous, ppo_ddp, shared
from cleanrl_embodied.shared.envs.wrappers import flattens
from tests.extras import needs

REPO = Path(__file__).resolve().parents[1]
PIXELS = {"obs_mode": "proprio+rgb", "image_size": 32, "privileged_state": True}


@pytest.mark.parametrize("obs_mode", ["rgb", "proprio+rgb", "state+rgb"])
def test_push_cube_privileged_entry_is_the_state_modes_observation(obs_mode):
    seen = shared.make_env("PushCubeRL", 6, "cpu", seed=3, obs_mode=obs_mode, image_size=32, privileged_state=True)
    plain = shared.make_env("PushCubeRL", 6, "cpu", seed=3)
    obs, _ = seen.reset(seed=3)
    state, _ = plain.reset(seed=3)
    space = seen.single_observation_space
    assert (
        shared.PRIVILEGED_KEY in space.spaces
        and shared.privileged_dim(space) == plain.single_observation_space.shape[0]
    )
    torch.testing.assert_close(obs[shared.PRIVILEGED_KEY], state, rtol=0, atol=0)
    action = torch.rand(6, *plain.single_action_space.shape) * 2 - 1
    obs, *_ = seen.step(action)
    state, *_ = plain.step(action)
    torch.testing.assert_close(obs[shared.PRIVILEGED_KEY], state, rtol=0, atol=0)
    # what an actor reads leaves it out
    assert shared.float_dim(space) == (17 if obs_mode == "proprio+rgb" else 31 if obs_mode == "state+rgb" else 0)
    assert shared.float_entries(obs).shape[-1] == shared.float_dim(space)
    assert list(shared.image_spaces(space)) == [("rgb",)]


def test_push_cube_lang_keeps_its_instruction_beside_the_privileged_entry():
    env = shared.make_env("PushCubeLangRL", 4, "cpu", seed=0, **PIXELS)
    obs, _ = env.reset(seed=0)
    assert set(obs.keys()) == {"rgb", "state", "instruction", shared.PRIVILEGED_KEY}
    assert list(shared.token_spaces(env.single_observation_space)) == [("instruction",)]


@pytest.mark.parametrize("obs_mode", ["state", "dict"])
def test_push_cube_refuses_privileged_state_where_the_state_is_observed(obs_mode):
    with pytest.raises(ValueError, match="privileged_state must be false with obs_mode") as e:
        shared.make_env("PushCubeRL", 2, "cpu", seed=0, obs_mode=obs_mode, privileged_state=True)
    assert "\n" not in str(e.value)


def test_a_dict_observation_with_a_privileged_entry_is_not_flattened_into_the_actors_vector():
    box = gym.spaces.Box(-1, 1, (3,), np.float32)
    assert flattens(gym.spaces.Dict({"a": box, "b": box}), None)
    assert not flattens(gym.spaces.Dict({"a": box, shared.PRIVILEGED_KEY: box}), None)


@pytest.mark.parametrize("module", [ppo_continuous, ppo_ddp], ids=["ppo_continuous", "ppo_ddp"])
@pytest.mark.parametrize("privileged_critic", [True, False])
def test_the_actor_never_reads_the_privileged_entry_and_the_privileged_critic_reads_only_it(module, privileged_critic):
    env = shared.make_env("PushCubeRL", 8, "cpu", seed=0, **PIXELS)
    args = module.Args(norm_obs=True, privileged_critic=privileged_critic)
    torch.manual_seed(0)
    agent = module.make_agent(env, args)
    for rms in [agent.obs_rms] + ([agent.critic_rms] if privileged_critic else []):  # not the identity
        rms.mean.uniform_(-1, 1)
        rms.var.uniform_(0.5, 2)
    obs, _ = env.reset(seed=0)
    changed = obs.clone()
    changed[shared.PRIVILEGED_KEY] = torch.randn_like(obs[shared.PRIVILEGED_KEY]) * 10
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for deterministic in (True, False):
            a = module.eval_action(agent, obs, generator.manual_seed(1), None, deterministic)
            b = module.eval_action(agent, changed, generator.manual_seed(1), None, deterministic)
            assert torch.equal(a, b)
        (dist_a, value_a), (dist_b, value_b) = agent(obs), agent(changed)
        assert torch.equal(dist_a.mean, dist_b.mean) and torch.equal(dist_a.stddev, dist_b.stddev)
        assert torch.equal(value_a, agent.get_value(obs)) and torch.equal(value_b, agent.get_value(changed))
        if privileged_critic:  # the critic reads the privileged entry, and nothing else
            assert not torch.allclose(value_a, value_b)
            other = obs.clone()
            other["state"] = other["state"] + 1.0
            other["rgb"] = 255 - other["rgb"]
            assert torch.equal(agent.get_value(other), value_a)
            assert agent.privileged_keys == (shared.PRIVILEGED_KEY,)
        else:
            assert torch.equal(value_a, value_b) and agent.privileged_keys == ()


def test_ppo_with_a_privileged_critic_trains_resumes_and_exports_an_actor_without_it(tmp_path):
    common = dict(
        env_kwargs=json.dumps(PIXELS), privileged_critic=True, norm_obs=True, num_envs=8, num_steps=8,
        num_minibatches=2, update_epochs=1, num_eval_envs=4, num_eval_episodes=4, eval_freq=0, cuda=False,
    )  # fmt: skip
    straight = ppo_continuous.main(
        ppo_continuous.Args(total_timesteps=4 * 64, save_freq=2, output_dir=str(tmp_path / "a"), **common)
    )
    middle = Path(straight["run_dir"]) / "checkpoints" / "iter_000002.pt"
    resumed = ppo_continuous.main(
        ppo_continuous.Args(total_timesteps=4 * 64, output_dir=str(tmp_path / "c"), resume=str(middle), **common)
    )
    ckpts = [torch.load(Path(r["run_dir"]) / "checkpoints" / "last.pt", weights_only=True) for r in (straight, resumed)]
    assert ckpts[0]["model"].keys() == ckpts[1]["model"].keys() and "critic_rms.mean" in ckpts[0]["model"]
    assert ckpts[0]["model"]["critic_rms.count"] > 1 and ckpts[0]["model"]["critic_rms.mean"].shape == (31,)
    for key, value in ckpts[0]["model"].items():  # a resume continues bit for bit
        assert torch.equal(value, ckpts[1]["model"][key]), key

    out = tmp_path / "exported"
    done = subprocess.run(
        [sys.executable, str(REPO / "cleanrl_embodied" / "export.py"), "--checkpoint",
         str(Path(straight["run_dir"]) / "checkpoints" / "last.pt"), "--out", str(out), "--no-onnx"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    inputs = [entry["name"] for entry in json.loads((out / "export.json").read_text())["inputs"]]
    assert inputs == ["rgb", "state"]
    asked = subprocess.run(
        [sys.executable, str(REPO / "cleanrl_embodied" / "export.py"), "--checkpoint",
         str(Path(straight["run_dir"]) / "checkpoints" / "last.pt"), "--out", str(tmp_path / "x"), "--no-onnx",
         "--inputs", "rgb", "state", shared.PRIVILEGED_KEY],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert asked.returncode != 0 and "privileged" in asked.stderr and asked.stderr.strip().count("\n") == 0


def test_privileged_critic_without_a_privileged_entry_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        ppo_continuous.main(ppo_continuous.Args(privileged_critic=True, num_envs=4, num_steps=4, total_timesteps=16,
                                                output_dir=str(tmp_path), cuda=False))  # fmt: skip
    message = str(e.value.code)
    assert message.startswith("error: --privileged-critic:") and '"privileged_state": true' in message
    assert "\n" not in message


VLA_ENV = {"obs_mode": "state+rgb", "image_size": 16, "action_mode": "ee_delta_pos", "max_episode_steps": 10}


def test_ppo_vla_privileged_critic_values_from_the_privileged_entry_and_acts_without_it(tmp_path):
    from cleanrl_embodied import ppo_vla

    env_kwargs = {**VLA_ENV, "privileged_state": True}
    args = ppo_vla.Args(env_id="PushCubeLangRL", env_kwargs=json.dumps(env_kwargs), policy="toy_policies:ToyVLA",
                        privileged_critic=True, num_envs=8, num_steps=4, num_minibatches=2, update_epochs=1,
                        num_eval_envs=4, num_eval_episodes=4, eval_freq=0, save_freq=0, cuda=False, compile="off",
                        total_timesteps=2 * 32, output_dir=str(tmp_path / "run"))  # fmt: skip
    env = shared.make_env("PushCubeLangRL", 8, "cpu", seed=0, **env_kwargs)
    agent = ppo_vla.PrivilegedCritic(ppo_vla.make_agent(env, args, value_head=False), env.single_observation_space)
    assert agent.privileged_keys == (shared.PRIVILEGED_KEY,)
    obs, _ = env.reset(seed=0)
    changed = obs.clone()
    changed[shared.PRIVILEGED_KEY] = torch.randn_like(obs[shared.PRIVILEGED_KEY])
    with torch.no_grad():
        (a, va), (b, vb) = agent(obs), agent(changed)
        assert torch.equal(a.mean, b.mean) and not torch.allclose(va, vb)  # the actor ignores it, the critic reads it
        other = obs.clone()
        other["state"] = other["state"] + 1.0
        assert torch.equal(agent.get_value(other), va)  # and the critic reads nothing else
    out = ppo_vla.main(args)
    model = torch.load(Path(out["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert any(k.startswith("critic.") for k in model) and out["global_step"] == 64
    with pytest.raises(SystemExit) as e:
        ppo_vla.main(
            ppo_vla.Args(**{**vars(args), "env_kwargs": json.dumps(VLA_ENV), "output_dir": str(tmp_path / "x")})
        )
    assert str(e.value.code).startswith("error: --privileged-critic:") and "\n" not in str(e.value.code)


@needs("vla")
def test_the_hf_vla_policy_acts_on_observations_with_a_privileged_entry():
    from cleanrl_embodied import ppo_vla
    from examples.hf_vla import make_policy

    env_kwargs = {**VLA_ENV, "image_size": 32, "privileged_state": True}
    env = shared.make_env("PushCubeLangRL", 2, "cpu", seed=0, **env_kwargs)
    args = ppo_vla.Args(env_id="PushCubeLangRL", env_kwargs=json.dumps(env_kwargs), action_head="bins",
                        action_bins=8, cuda=False)  # fmt: skip
    policy = make_policy(env.single_observation_space, env.single_action_space, args, lora_rank=2, head_hidden=8)
    obs, _ = env.reset(seed=0)
    changed = obs.clone()
    changed[shared.PRIVILEGED_KEY] = changed[shared.PRIVILEGED_KEY] + 5.0
    with torch.no_grad():
        assert torch.equal(policy.dist(obs).logits, policy.dist(changed).logits)


def test_a_ppo_vla_privileged_critic_checkpoint_evaluates_its_actor_in_ppo_vla_ddp_and_resumes_only_in_ppo_vla(
    tmp_path,
):
    """ppo_vla_ddp.py has no --privileged-critic: with --eval-checkpoint it evaluates the actor of such a ppo_vla.py
    checkpoint (the policy inside the wrapper, frozen weights included, as ppo_vla.py evaluates it); --resume is one
    line naming the flag (the run would go on without the critic it trained). ppo_vla_async.py, whose network code is
    ppo_vla.py's, evaluates it the same way and refuses to resume it (a run of another file), naming both files."""
    from cleanrl_embodied import ppo_vla, ppo_vla_async, ppo_vla_ddp

    common = dict(
        env_id="PushCubeLangRL", env_kwargs=json.dumps({**VLA_ENV, "privileged_state": True}), cuda=False,
        policy="toy_policies:frozen_backbone", policy_kwargs=json.dumps({"width": 32}), num_envs=8, num_steps=4,
        num_minibatches=2, update_epochs=1, num_eval_envs=4, num_eval_episodes=4, eval_freq=0, save_freq=0,
        compile="off", total_timesteps=2 * 32,
    )  # fmt: skip
    trained = ppo_vla.main(ppo_vla.Args(privileged_critic=True, output_dir=str(tmp_path / "run"), **common))
    last = str(Path(trained["run_dir"]) / "checkpoints" / "last.pt")
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["frozen"] and any(k.startswith("policy.") for k in ckpt["model"])
    assert any(k.startswith("critic.") for k in ckpt["model"])
    reference = ppo_vla.main(
        ppo_vla.Args(privileged_critic=True, eval_checkpoint=last, output_dir=str(tmp_path / "a"), **common)
    )
    evaluated = ppo_vla_ddp.main(ppo_vla_ddp.Args(eval_checkpoint=last, output_dir=str(tmp_path / "b"), **common))
    assert evaluated["eval"] == reference["eval"] and evaluated["global_step"] == 64
    with pytest.raises(SystemExit) as e:
        ppo_vla_ddp.main(ppo_vla_ddp.Args(resume=last, output_dir=str(tmp_path / "c"), **common))
    message = str(e.value.code)
    assert message.startswith("error: --resume") and "--privileged-critic" in message and "ppo_vla.py" in message
    assert "\n" not in message
    evaluated = ppo_vla_async.main(ppo_vla_async.Args(eval_checkpoint=last, output_dir=str(tmp_path / "d"), **common))
    assert evaluated["eval"] == reference["eval"]
    with pytest.raises(SystemExit) as e:
        ppo_vla_async.main(ppo_vla_async.Args(resume=last, output_dir=str(tmp_path / "e"), **common))
    message = str(e.value.code)
    assert message.startswith("error: --resume") and "\n" not in message
    assert str(Path(ppo_vla.__file__).resolve()) in message and str(Path(ppo_vla_async.__file__).resolve()) in message
