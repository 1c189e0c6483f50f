"""mjlab's tasks (Isaac Lab's manager-based API on MuJoCo Warp) behind the env contract: ``--env-id mjlab:<task>``
(shared/envs/isaaclab_backend.py), on the CPU with a few envs.

The contract (final observation = the terminal state, truncations from the termination manager, reward terms and
episode metrics, seeding, group and partial resets, bit-identical state), every trainer that takes a state vector
on it (ppo_continuous, grpo, ppo_recurrent, ppo_ddp on two gloo ranks), a resume, and the privileged critic group.
Needs the mjlab extra, which conflicts with the mujoco extra: CI runs this file in a step of its own
(`.ci/run`, ``CLEANRL_EMBODIED_REQUIRE_MJLAB=1``). Without it only the one-line error of a missing extra runs.
MuJoCo Warp compiles its CPU kernels the first time (tens of seconds, cached in ~/.cache/warp after)."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from cleanrl_embodied import shared
from tests.checks import one_line
from tests.extras import installed, needs
from tests.trainer_args import FOUR_ENVS, TWO_ENVS, tiny_args, trainer

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # (mjlab on the CPU; set before Warp first looks for devices)
pytestmark = pytest.mark.usefixtures("offline")

CARTPOLE, BALANCE = "mjlab:Mjlab-Cartpole-Swingup", "mjlab:Mjlab-Cartpole-Balance"
GO1, LIFT = "mjlab:Mjlab-Velocity-Flat-Unitree-Go1", "mjlab:Mjlab-Lift-Cube-Yam"
SHORT = {"episode_length_s": 0.5}  # Cartpole steps at 20 Hz: episodes of 10 steps


def rollout(env, actions):
    """(obs, reward, terminated, truncated, final_obs) of every step, copied."""
    out = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((obs.clone(), reward.clone(), terminated.clone(), truncated.clone(), info["final_obs"].clone()))
    return out


def same(a, b) -> bool:
    return all(bool((x == y).all()) for x, y in zip(a, b))


@pytest.mark.skipif(installed("mjlab"), reason="mjlab is installed: its missing-extra error can't be seen here")
def test_an_mjlab_id_without_the_extra_is_one_line_naming_it():
    for call in (lambda: shared.check_env_id(GO1), lambda: shared.make_env(GO1, 2)):
        with pytest.raises(ValueError) as e:
            call()
        assert "uv sync --extra mjlab" in one_line(e)


def test_the_eval_envs_run_whole_episodes_where_training_starts_them_at_random_points():
    options = shared.EnvOptions(BALANCE, json.dumps({"init_at_random_ep_len": True, "episode_length_s": 2.0}))
    assert options.kwargs(eval_envs=False) == {"init_at_random_ep_len": True, "episode_length_s": 2.0}
    assert options.kwargs(eval_envs=True) == {"episode_length_s": 2.0}


@needs("mjlab")
def test_bad_ids_and_options_are_one_line():
    with pytest.raises(ValueError) as e:
        shared.check_env_id("mjlab:Mjlab-Cartpole-Balanse")
    assert "did you mean Mjlab-Cartpole-Balance" in one_line(e)
    bad = [
        ({"episode_lenght_s": 1.0}, "did you mean episode_length_s"),
        ({"rewards.smooth": 1.0}, "options at rewards: smooth_reward"),
        ({"rewards.smooth_reward.weight": "high"}, "is a number"),
        ({"observations": {"actor": {"enable_corruption": 3}}}, "is a bool"),
        ({"scene.num_envs": 3}, "--num-envs"),
        ({"auto_reset": True}, "final observation"),
        ({"obs_groups": {"actor": ["camera"]}}, "no observation group 'camera'"),
        ({"clip_actions": -1}, "clip_actions must be a positive number"),
    ]
    for kwargs, says in bad:
        with pytest.raises(ValueError) as e:
            shared.make_env(BALANCE, 2, **kwargs)
        assert says in one_line(e), kwargs
    with pytest.raises(ValueError) as e:
        shared.make_env(BALANCE, 2, vectorization="async")
    assert "one MuJoCo Warp simulation" in one_line(e)


@needs("mjlab")
def test_final_obs_is_the_terminal_state_and_time_outs_are_truncations():
    """At a time-out, ``final_obs`` is what a twin env without that time limit observes at the same step (the time
    limit changes no physics; the twin's draws are the same), and ``obs`` the next episode's first observation."""
    env = shared.make_env(CARTPOLE, 3, seed=4, **SHORT)
    twin = shared.make_env(CARTPOLE, 3, seed=4, episode_length_s=5.0)
    assert shared.PRIVILEGED_KEY in env.single_observation_space.spaces  # the critic group
    assert env.spec.max_episode_steps == 10 and twin.spec.max_episode_steps == 100
    (obs, _), (twin_obs, _) = env.reset(), twin.reset()
    assert same(obs.values(), twin_obs.values())
    global_rng = torch.get_rng_state()
    actions = torch.randn(10, 3, 1, generator=torch.Generator().manual_seed(0))
    for t, action in enumerate(actions):
        obs, reward, terminated, truncated, info = env.step(action)
        twin_obs, twin_reward, *_ = twin.step(action)
        assert not terminated.any() and bool(truncated.all()) == (t == 9)
        torch.testing.assert_close(info["final_obs"], twin_obs, rtol=0, atol=0)
        torch.testing.assert_close(reward, twin_reward, rtol=0, atol=0)
        terms = info["rewards"]
        assert set(terms) == {"smooth_reward"}
        torch.testing.assert_close(sum(terms.values()), reward)
        assert {"Episode_Reward/smooth_reward", "Episode_Termination/time_out"} == set(info["metrics"])
    assert torch.equal(torch.get_rng_state(), global_rng)  # mjlab drew from the env's own generator only
    assert info["_final_obs"].all() and info["_episode"].all() and (info["episode"]["l"] == 10).all()
    assert (obs["actor"][:, 0] == 0).all() and (info["final_obs"]["actor"][:, 0] != 0).all()  # swing-up: cart at 0
    torch.testing.assert_close(info["metrics"]["Episode_Termination/time_out"], torch.ones(3))
    # the episode's reward sum over its length in seconds, as mjlab logs Episode_Reward/<term>
    torch.testing.assert_close(info["metrics"]["Episode_Reward/smooth_reward"], info["episode"]["r"] / 0.5)
    # the next episode goes on from the reset observation
    obs2, _, terminated, truncated, _ = env.step(torch.zeros(3, 1))
    assert not (terminated | truncated).any() and not same(obs2.values(), obs.values())


@needs("mjlab")
def test_a_finite_horizon_time_out_is_a_termination_and_seeds_decide_the_draws():
    env = shared.make_env(BALANCE, 2, seed=1, is_finite_horizon=True, **SHORT)
    env.reset()
    for _ in range(10):
        _, _, terminated, truncated, _ = env.step(torch.zeros(2, 1))
    assert terminated.all() and not truncated.any()
    first = [shared.make_env(BALANCE, 4, seed=s, **SHORT).reset()[0]["actor"] for s in (7, 7, 8)]
    assert torch.equal(first[0], first[1]) and not torch.equal(first[0], first[2])


@needs("mjlab")
def test_group_resets_give_each_group_one_start_and_partial_resets_only_the_masked_envs():
    env = shared.make_env(BALANCE, 6, seed=2, **SHORT)
    env.reset()
    obs, _ = env.reset(seed=11, options={"group_size": 3})
    start, actor = obs["actor"].clone(), obs["actor"].view(2, 3, -1)
    assert torch.equal(actor[:, :1].expand_as(actor), actor) and not torch.equal(actor[0], actor[1])
    action = torch.randn(2, 1, 1).expand(2, 3, 1).reshape(6, 1)  # the same actions within a group
    for _ in range(5):
        obs, *_ = env.step(action)
    actor = obs["actor"].view(2, 3, -1)
    assert torch.equal(actor[:, :1].expand_as(actor), actor)  # the same start, the same actions: the same states
    again, _ = env.reset(seed=11, options={"group_size": 3})
    assert torch.equal(again["actor"], start)  # the same seed, the same group starts
    with pytest.raises(ValueError) as e:
        env.reset(options={"group_size": 4})
    assert "divide" in one_line(e)

    before, *_ = env.step(torch.ones(6, 1))
    mask = torch.tensor([True, False, False, True, False, False])
    after, _ = env.reset(options={"reset_mask": mask})
    assert torch.equal(after[~mask]["actor"], before[~mask]["actor"])
    assert not torch.equal(after[mask]["actor"], before[mask]["actor"])
    assert shared.supports_partial_reset(env)


@needs("mjlab")
@pytest.mark.parametrize("env_id", [BALANCE, GO1])
def test_env_state_continues_bit_for_bit(env_id, tmp_path):
    """``env_state_dict`` / ``load_env_state_dict`` (checkpoints) through torch.save and a fresh env built with
    another seed: the same steps after, across episode ends (episodes of 10 and 25 steps)."""
    act_dim = 12 if env_id == GO1 else 1
    actions = torch.randn(40, 2, act_dim, generator=torch.Generator().manual_seed(0)) * 0.5
    env = shared.make_env(env_id, 2, seed=5, **SHORT)
    env.reset()
    rollout(env, actions[:13])
    path = tmp_path / "env_state.pt"
    torch.save(shared.env_state_dict(env), path)
    straight = rollout(env, actions[13:])
    other = shared.make_env(env_id, 2, seed=99, **SHORT)
    other.reset()
    rollout(other, actions[:3])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # every saved entry found its place
        shared.load_env_state_dict(other, torch.load(path, weights_only=True))
    resumed = rollout(other, actions[13:])
    for t, (a, b) in enumerate(zip(straight, resumed)):
        assert same(a, b), t
    assert any(bool((s[2] | s[3]).any()) for s in straight)  # episodes ended on the way


@needs("mjlab")
def test_go1_actor_and_critic_groups_reach_the_actor_and_the_critic_alone(tmp_path):
    env = shared.make_env(GO1, 2, seed=0)
    space = env.single_observation_space
    assert shared.float_dim(space) == 48 and shared.privileged_dim(space) == 72
    obs, _ = env.reset()
    assert list(obs.keys()) == ["actor", shared.PRIVILEGED_KEY]
    _, _, _, _, info = env.step(torch.zeros(2, 12))
    assert {"Metrics/twist/error_vel_xy", "Episode_Termination/fell_over", "Episode_Metrics/mean_action_acc"} <= set(
        info["metrics"]
    )
    ppo = trainer("ppo_continuous")
    args = tiny_args("ppo_continuous", tmp_path, TWO_ENVS, env_id=GO1, privileged_critic=True, norm_obs=True)
    agent = ppo.Agent(space, env.single_action_space, args)
    assert agent.critic[0].in_features == 72 and agent.actor_mean[0].in_features == 48
    changed = obs.clone()
    changed[shared.PRIVILEGED_KEY] += 1.0
    dist, value = agent(obs)
    dist2, value2 = agent(changed)
    assert torch.equal(dist.mean, dist2.mean) and not torch.equal(value, value2)
    out = ppo.main(tiny_args("ppo_continuous", tmp_path, TWO_ENVS, env_id=GO1, privileged_critic=True,
                             num_steps=4, num_minibatches=1, update_epochs=1, total_timesteps=8,
                             env_kwargs=json.dumps({"episode_length_s": 0.1})))  # fmt: skip
    assert out["global_step"] == 8 and "Metrics/twist/error_vel_xy" in out["eval"]  # evaluated per episode


@needs("mjlab")
def test_lift_cube_reports_success_and_its_command_metrics():
    env = shared.make_env(LIFT, 2, seed=0)
    env.reset()
    _, _, _, _, info = env.step(torch.zeros(2, *env.single_action_space.shape))
    assert info["success"].dtype == torch.bool and not info["success"].any()
    assert {"Metrics/lift_height/episode_success", "Episode_Reward/lift"} <= set(info["metrics"])
    assert env.single_action_space.shape == (7,) and not np.isfinite(env.single_action_space.high).any()
    clipped = shared.make_env(LIFT, 2, seed=0, clip_actions=1.0)
    assert clipped.single_action_space.high.max() == 1.0


TRAINER_RUN = dict(FOUR_ENVS, env_id=BALANCE, env_kwargs=json.dumps(SHORT), num_steps=8, total_timesteps=64,
                   update_epochs=1, hidden_sizes=(16, 16))  # fmt: skip


@needs("mjlab")
@pytest.mark.parametrize("name", ["ppo_continuous", "grpo", "ppo_recurrent", "ppo_ddp"])
def test_each_state_trainer_runs_on_an_mjlab_task(name, tmp_path):
    extra = {"privileged_critic": True} if name in ("ppo_continuous", "ppo_recurrent", "ppo_ddp") else {}
    out = trainer(name).main(tiny_args(name, tmp_path, TRAINER_RUN, **extra))
    assert out["global_step"] == 64
    assert out["eval"]["episodic_length"] == 10 and "Episode_Reward/smooth_reward" in out["eval"]
    summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
    assert summary["env_id"] == BALANCE and Path(out["run_dir"]).name.startswith("Mjlab-Cartpole-Balance__")


@needs("mjlab")
@pytest.mark.filterwarnings("error:.*saved entries have no place:RuntimeWarning")  # the whole env state restored
def test_ppo_continuous_resume_is_bit_identical(tmp_path):
    ppo, common = trainer("ppo_continuous"), dict(TRAINER_RUN, total_timesteps=4 * 32, save_freq=2, eval_freq=0,
                                                  norm_obs=True, norm_reward=True)  # fmt: skip
    straight = ppo.main(tiny_args("ppo_continuous", tmp_path / "a", common))
    half = Path(straight["run_dir"]) / "checkpoints" / "iter_000002.pt"
    resumed = ppo.main(tiny_args("ppo_continuous", tmp_path / "b", common, resume=str(half)))
    a, b = (torch.load(Path(r["run_dir"]) / "checkpoints" / "last.pt", weights_only=True) for r in (straight, resumed))
    assert torch.load(half, weights_only=True)["env_state"] is not None
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert torch.equal(a["next_obs"]["actor"], b["next_obs"]["actor"])


def ddp_worker(out_dir: Path) -> None:
    """Runs on each rank under torchrun (`python tests/test_mjlab.py OUT_DIR`)."""
    import torch.distributed as dist

    ddp = trainer("ppo_ddp")
    out = ddp.main(tiny_args("ppo_ddp", out_dir / "runs", TRAINER_RUN, total_timesteps=2 * 64, privileged_critic=True))
    torch.save(out["model"], out_dir / f"model_{os.environ['RANK']}.pt")
    if dist.is_initialized():
        dist.barrier()


@needs("mjlab")
def test_ppo_ddp_on_two_gloo_ranks(tmp_path):
    from tests.torchrun import two_ranks

    output = two_ranks(__file__, str(tmp_path), timeout=600)
    assert "world=2 envs/rank=4" in output and output.count("done: global_step=128") >= 1
    m0, m1 = (torch.load(tmp_path / f"model_{r}.pt", weights_only=True) for r in range(2))
    for key in m0:
        assert torch.equal(m0[key], m1[key]), key


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    ddp_worker(Path(sys.argv[1]))
