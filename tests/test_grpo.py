"""GRPO: group advantages against a plain reference loop, group resets, CLI errors, and short in-process runs."""

from __future__ import annotations

import dataclasses
import json
import math
import signal
from pathlib import Path

import grpo_test_helpers  # noqa: F401 - the --policy factories and envs of these tests
import gymnasium as gym
import numpy as np
import pytest
import torch
import toy_policies
from grpo_test_helpers import PUSH_CUBE_GROUPS, tiny_actor
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensordict import TensorDict

from cleanrl_embodied import grpo
from cleanrl_embodied.grpo import (
    Args,
    episode_advantages,
    first_episode_mask,
    group_advantages,
    main,
    returns_to_go,
)
from cleanrl_embodied.shared import make_env
from tests import trainer_args
from tests.checks import compiled_grads_match, micro_batch_runs, one_line_exit, pieces_train_like_whole
from tests.envs_for_tests import spaces

pytestmark = pytest.mark.usefixtures("offline")  # tests/conftest.py


# ---------------------------------------------------------------------------------------------
# A toy Gymnasium task: obs x ~ U(-1, 1)^2, reward -(a - x[0])^2, 5 steps. Options make it misbehave.
# ---------------------------------------------------------------------------------------------
class ToyEnv(gym.Env):
    def __init__(self, ignore_seed: bool = False, nan_reward_at: int | None = None):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.ignore_seed, self.nan_reward_at = ignore_seed, nan_reward_at
        self._t, self._x = 0, np.zeros(2, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=None if self.ignore_seed else seed)
        rng = np.random.default_rng() if self.ignore_seed else self.np_random
        self._t, self._x = 0, rng.uniform(-1, 1, 2).astype(np.float32)
        return self._x.copy(), {}

    def step(self, action):
        self._t += 1
        reward = -float((action[0] - self._x[0]) ** 2)
        if self.nan_reward_at is not None and self._t == self.nan_reward_at:
            reward = float("nan")
        return self._x.copy(), reward, False, False, {}


for _id, _kwargs in (
    ("GRPOToy-v0", {}),
    ("GRPOToyNoSeed-v0", {"ignore_seed": True}),
    ("GRPOToyNaN-v0", {"nan_reward_at": 3}),
):
    if _id not in gym.registry:
        gym.register(_id, entry_point=ToyEnv, max_episode_steps=5, kwargs=_kwargs)


def tiny_args(tmp_path: Path, **overrides) -> Args:
    sizes = dict(PUSH_CUBE_GROUPS, total_timesteps=8 * 50 * 3, eval_freq=2, save_freq=2)
    return trainer_args.tiny_args(grpo, tmp_path, sizes, **overrides)


# ---------------------------------------------------------------------------------------------
# Pure functions against reference loops
# ---------------------------------------------------------------------------------------------
def reference_returns(rewards, dones, gamma):
    T, N = rewards.shape
    out = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if dones[t, n]:
                running = 0.0  # the next step belongs to another episode
            running = float(rewards[t, n]) + gamma * running
            out[t, n] = running
    return out


def reference_mask(dones):
    T, N = dones.shape
    mask = torch.zeros(T, N, dtype=torch.bool)
    for n in range(N):
        for t in range(T):
            mask[t, n] = True
            if dones[t, n]:
                break
    return mask


def reference_advantages(returns, mask, group_size, scale, eps):
    """One group at a time, in Python floats: the cells (time steps) with two or more alive members whose
    returns differ are centred on their mean and divided by the group's std pooled over those cells."""
    T, N = returns.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for g0 in range(0, N, group_size):
        cells = []  # (time step, alive members, their returns, their mean)
        for t in range(T):
            members = [n for n in range(g0, g0 + group_size) if mask[t, n]]
            values = [float(returns[t, n]) for n in members]
            if len(values) >= 2 and len(set(values)) > 1:  # else zero advantage
                cells.append((t, members, values, sum(values) / len(values)))
        squares = sum((v - mean) ** 2 for _, _, values, mean in cells for v in values)
        dof = sum(len(values) - 1 for _, _, values, _ in cells)
        std = math.sqrt(squares / dof) if dof else 0.0
        for t, members, values, mean in cells:
            for n, v in zip(members, values):
                adv[t, n] = (v - mean) / (std + eps) if scale else v - mean
    return adv


def make_rollout(T=9, N=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, N, generator=g)
    dones = torch.rand(T, N, generator=g) < 0.15
    dones[:, [0, 5]] = False
    dones[3, 0] = dones[6, 0] = True  # two dones in one env
    dones[0, 5] = True  # done at the first step
    dones[:, 8:12] = False  # a whole group alive throughout
    dones[2, 8:12] = True  # ... then all done at once
    return rewards, dones


def test_returns_to_go_and_first_episode_mask_match_reference():
    rewards, dones = make_rollout()
    for gamma in (0.9, 0.99, 1.0):
        torch.testing.assert_close(
            returns_to_go(rewards, dones, gamma).double(),
            reference_returns(rewards, dones, gamma),
            rtol=1e-5,
            atol=1e-5,
        )
    mask = first_episode_mask(dones)
    assert torch.equal(mask, reference_mask(dones))
    assert mask[3, 0] and not mask[4, 0] and not mask[6, 0]  # data after the first done is masked out
    assert mask[0, 5] and not mask[1:, 5].any()


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("eps", [1e-8, 1e-4, 0.5])
def test_group_advantages_match_reference(scale, eps):
    rewards, dones = make_rollout()
    returns = returns_to_go(rewards, dones, 0.9)
    returns[:, 4:8] = 0.3  # a group whose members all get the same return (e.g. all failed)
    mask = first_episode_mask(dones)
    mask[:, 1] = False  # a member never alive
    adv, stats = group_advantages(returns, mask, 4, scale, eps)
    ref = reference_advantages(returns, mask, 4, scale, eps)
    torch.testing.assert_close(adv.double(), ref, rtol=1e-5, atol=1e-6)
    assert torch.isfinite(adv).all()
    assert (adv[~mask] == 0).all() and (adv[:, 4:8] == 0).all()
    assert 0 < float(stats["zero_adv_group_frac"]) < 1 and float(stats["mean_group_std"]) > 0
    # with every member alive and scaling, each group's advantages have mean 0 at every time step and a
    # (Bessel, pooled over the time steps) std of ~1
    full, _ = group_advantages(returns, torch.ones_like(mask), 4, True, 1e-8)
    live = full.reshape(-1, 3, 4)[:, [0, 2]]
    torch.testing.assert_close(live.mean(-1), torch.zeros_like(live.mean(-1)), atol=1e-5, rtol=0)
    pooled_var = (live - live.mean(-1, keepdim=True)).pow(2).sum((0, 2)) / (live.shape[0] * 3)
    torch.testing.assert_close(pooled_var.sqrt(), torch.ones(2), atol=1e-4, rtol=0)


def test_group_advantages_degenerate_groups_are_zero_not_nan():
    # returns whose mean is not exactly representable: (x - mean) would be ~1 ulp, not 0
    returns = torch.tensor([[0.1, 0.1, 0.1, 0.1, 1.0, 2.0, 3.0, 4.0], [5.0, 7.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor(
        [
            [True, True, True, True, True, False, False, False],  # single alive member
            [True, True, False, False, False, False, False, False],
        ]
    )  # all dead in group 2
    adv, stats = group_advantages(returns, mask, 4, True, 1e-8)
    assert torch.isfinite(adv).all()
    assert (adv[0] == 0).all() and (adv[1, 2:] == 0).all()
    torch.testing.assert_close(adv[1, :2], torch.tensor([-1.0, 1.0]) / math.sqrt(2), rtol=1e-5, atol=1e-6)
    assert float(stats["zero_adv_group_frac"]) == pytest.approx(2 / 3)  # 3 cells with a live member, 2 zero
    # a dead member's return changes nothing
    returns2 = returns.clone()
    returns2[1, 2] = 1e6
    assert torch.equal(group_advantages(returns2, mask, 4, True, 1e-8)[0], adv)
    # Dr. GRPO: centring only
    adv_c, _ = group_advantages(returns, mask, 4, False, 1e-8)
    torch.testing.assert_close(adv_c[1, :2], torch.tensor([-1.0, 1.0]))


def sparse_success_rollout():
    """Two groups of 4 over 6 steps, reward 1 on the success step (which ends the episode), 0 elsewhere. Group 0:
    member 0 succeeds at step 1, member 1 at step 4, members 2 and 3 never (still running at the horizon). Group 1:
    all fail, member 5 by a time-out at step 2 (a done with reward 0)."""
    rewards, dones = torch.zeros(6, 8), torch.zeros(6, 8, dtype=torch.bool)
    rewards[1, 0] = dones[1, 0] = 1
    rewards[4, 1] = dones[4, 1] = 1
    dones[2, 5] = True
    dones[4, 0] = True  # a second episode of member 0: masked out, its reward too
    rewards[4, 0] = 1
    return rewards, dones


@pytest.mark.parametrize("scale", [True, False])
def test_episode_advantages_are_outcome_advantages_on_every_step(scale):
    rewards, dones = sparse_success_rollout()
    mask = first_episode_mask(dones)
    adv, stats = episode_advantages(rewards, mask, 4, scale, 1e-8)
    outcome = torch.tensor([1.0, 1.0, 0.0, 0.0])  # first-episode returns of group 0
    expected = outcome - outcome.mean()
    if scale:
        expected = expected / outcome.std()  # Bessel: (G - 1) degrees of freedom
    for n in range(4):  # each member's advantage on all of its first episode's steps, 0 after it
        torch.testing.assert_close(adv[mask[:, n], n], expected[n].expand(int(mask[:, n].sum())))
        assert (adv[~mask[:, n], n] == 0).all()
    assert (adv[:, 4:] == 0).all()  # all failed: no signal, no NaN
    assert float(stats["zero_adv_group_frac"]) == 0.5
    # the step-wise comparison leaves the failures' steps after the last success without a signal: only
    # failures are alive there, all with return 0. The outcome comparison reaches them.
    step_adv, _ = group_advantages(returns_to_go(rewards, dones, 1.0), mask, 4, scale, 1e-8)
    assert (step_adv[5:, 2:4] == 0).all() and (adv[5:, 2:4] < 0).all()


def test_episode_advantage_needs_first_episodes_one_line(tmp_path):
    with pytest.raises(SystemExit) as excinfo:
        main(tiny_args(tmp_path, advantage="episode", truncate_at_first_done=False))
    assert "--advantage episode" in one_line_exit(excinfo) and "--truncate-at-first-done" in str(excinfo.value)
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------
# Group resets
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", ["PushCubeRL", "Pendulum-v1"])
def test_group_resets_share_a_start(env_id):
    env = make_env(env_id, num_envs=8, device="cpu", seed=3)
    try:
        for _ in range(2):  # fresh starts each reset, identical within each group of 4
            obs, _ = env.reset(options={"group_size": 4})
            groups = obs.reshape(2, 4, -1)
            assert torch.equal(groups, groups[:, :1].expand_as(groups))
            assert not torch.equal(groups[0, 0], groups[1, 0])
            # the whole state is shared, not just the observation: equal actions keep the members equal
            action = torch.rand(2, 1, env.single_action_space.shape[0]).expand(2, 4, -1).reshape(8, -1) * 2 - 1
            for _ in range(3):
                obs, reward, *_ = env.step(action)
            assert torch.allclose(obs.reshape(2, 4, -1), obs.reshape(2, 4, -1)[:, :1], atol=1e-6)
            assert torch.allclose(reward.reshape(2, 4), reward.reshape(2, 4)[:, :1], atol=1e-6)
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ["PushCubeRL", "Pendulum-v1"])
def test_every_iteration_rolls_out_from_fresh_group_starts(tmp_path, env_id):
    """What grpo.py's policy sees: at the first step of every iteration, each group of G envs is in one state,
    other groups in others, and the next iteration starts from new states (a trainer that reset only once, or not
    per group, would show members that drifted apart after their different sampled actions)."""
    toy_policies.OBSERVED.clear()
    iterations, horizon = 3, 3
    main(
        tiny_args(
            tmp_path,
            env_id=env_id,
            num_steps=horizon,
            total_timesteps=8 * horizon * iterations,
            policy="toy_policies:observing",
            num_eval_envs=2,
            num_eval_episodes=2,
            eval_freq=0,
            save_freq=0,
        )
    )
    rollout = [obs for grad, obs in toy_policies.OBSERVED if not grad and obs.shape[0] == 8]
    assert len(rollout) == iterations * horizon  # one call per step of every iteration
    starts = []
    for iteration in range(iterations):
        first, second = (rollout[iteration * horizon + k].reshape(2, 4, -1) for k in (0, 1))
        assert torch.equal(first, first[:, :1].expand_as(first)), iteration  # members share their group's start
        assert not torch.equal(first[0, 0], first[1, 0]), iteration  # each group its own
        assert not torch.equal(second, second[:, :1].expand_as(second))  # after one step they differ
        starts.append(first[:, 0])
    for a in range(iterations):
        for b in range(a):
            assert not torch.equal(starts[a], starts[b]), (a, b)  # fresh starts every iteration


@pytest.mark.parametrize("num_envs,group_size", [(6, 4), (8, 1), (8, 0)])
def test_bad_group_size_is_one_line_naming_the_flag(tmp_path, num_envs, group_size):
    with pytest.raises(SystemExit) as excinfo:
        main(tiny_args(tmp_path, num_envs=num_envs, group_size=group_size))
    assert "--group-size" in one_line_exit(excinfo)
    assert not any(tmp_path.iterdir())  # nothing was built


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"gamma": 1.5}, "--gamma must be <= 1, got 1.5"),
        ({"hidden_sizes": (0,)}, "--hidden-sizes must be one or more positive integers, got (0,)"),
    ],
)
def test_bad_discount_and_sizes_get_the_ppo_scripts_line(tmp_path, overrides, message):
    with pytest.raises(SystemExit) as excinfo:
        main(tiny_args(tmp_path, **overrides))
    assert one_line_exit(excinfo).startswith(f"error: {message}")
    assert not any(tmp_path.iterdir())


def test_env_without_identical_starts_exits_with_one_line(tmp_path):
    with pytest.raises(SystemExit) as excinfo:
        main(tiny_args(tmp_path, env_id="GRPOToyNoSeed-v0"))
    msg = one_line_exit(excinfo)
    assert "--group-size 4" in msg and "identical" in msg
    assert not any(tmp_path.iterdir())


def test_non_finite_reward_names_the_tensor_and_global_step(tmp_path):
    with pytest.raises(SystemExit) as excinfo:
        main(tiny_args(tmp_path, env_id="GRPOToyNaN-v0"))
    assert "non-finite reward" in one_line_exit(excinfo) and "global step 24" in str(excinfo.value.code)


def test_non_finite_final_obs_is_caught(tmp_path):
    """The observation an episode ends with (info["final_obs"]) is checked too, not only the next obs."""

    with pytest.raises(SystemExit) as excinfo:
        main(
            tiny_args(
                tmp_path,
                env_id="tests.envs_for_tests:PointReach-v0",
                env_kwargs='{"nan_final_obs": true, "terminate_at_step": 3, "success_radius": 0}',
            )
        )
    assert "non-finite observation" in one_line_exit(excinfo) and "global step 24" in str(excinfo.value.code)


# ---------------------------------------------------------------------------------------------
# In-process runs
# ---------------------------------------------------------------------------------------------
def read_scalars(run_dir: str) -> dict[str, list[float]]:
    acc = EventAccumulator(run_dir)
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_smoke_run_then_resume_continues(tmp_path):
    out = main(tiny_args(tmp_path))
    run_dir = Path(out["run_dir"])
    assert out["global_step"] == 3 * 8 * 50
    scalars = read_scalars(str(run_dir))
    for tag in (
        "charts/episodic_return",
        "charts/episodic_length",
        "charts/success_rate",
        "charts/SPS",
        "charts/learning_rate",
        "losses/policy_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clipfrac",
        "grpo/zero_adv_group_frac",
        "grpo/mean_group_std",
        "grpo/kl_ref",
        "grpo/mask_frac",
        "eval/success_rate",
        "eval/episodic_return",
    ):
        assert len(scalars[tag]) >= 1 and all(math.isfinite(v) for v in scalars[tag]), tag
    assert len(scalars["charts/SPS"]) == 3 and scalars["charts/episodic_length"][0] == 50.0  # first episodes
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["script"] == "grpo" and summary["global_step"] == 1200
    assert all(math.isfinite(v) for v in summary["train"].values())
    assert summary["eval"]["success_rate"] is not None and summary["eval"]["global_step"] == 1200
    last = run_dir / "checkpoints" / "last.pt"
    assert last.is_file() and (run_dir / "checkpoints" / "best.pt").is_file()
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["iteration"] == 3 and ckpt["args"]["env_id"] == "PushCubeRL"

    out2 = main(tiny_args(tmp_path, total_timesteps=5 * 8 * 50, resume=str(last)))
    assert out2["global_step"] == 5 * 8 * 50
    scalars2 = read_scalars(out2["run_dir"])
    assert len(scalars2["charts/SPS"]) == 2  # only iterations 4 and 5 ran
    assert min(scalars2["charts/learning_rate"]) < min(scalars["charts/learning_rate"])  # schedule continues
    assert torch.load(Path(out2["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)["iteration"] == 5

    # refused: another env id, another obs/act shape, a missing file (one line each)
    with pytest.raises(SystemExit) as excinfo:
        main(tiny_args(tmp_path, env_id="Pendulum-v1", resume=str(last)))
    assert "--resume" in one_line_exit(excinfo) and "PushCubeRL" in str(excinfo.value.code)
    ckpt["obs_dim"] = 5
    bad = tmp_path / "bad_shape.pt"
    torch.save(ckpt, bad)
    with pytest.raises(SystemExit) as excinfo:
        main(tiny_args(tmp_path, resume=str(bad)))
    assert "--resume" in one_line_exit(excinfo) and "observation/action sizes 5/" in str(excinfo.value.code)
    with pytest.raises(SystemExit) as excinfo:
        main(tiny_args(tmp_path, resume=str(tmp_path / "missing.pt")))
    assert "no such checkpoint file" in one_line_exit(excinfo)


def test_resume_is_bit_identical_to_a_straight_run(tmp_path):
    common = dict(total_timesteps=5 * 8 * 50, save_freq=3, eval_freq=2)
    straight = main(tiny_args(tmp_path / "a", **common))
    half = Path(straight["run_dir"]) / "checkpoints" / "iter_000003.pt"
    resumed = main(tiny_args(tmp_path / "b", resume=str(half), **common))
    assert resumed["global_step"] == straight["global_step"] == 2000
    a = torch.load(straight["checkpoint"], weights_only=True)
    b = torch.load(resumed["checkpoint"], weights_only=True)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert [e.step for e in EventAccumulator(resumed["run_dir"]).Reload().Scalars("charts/SPS")] == [1600, 2000]


def test_ctrl_c_writes_last_checkpoint_and_summary(tmp_path):
    """Ctrl-C in the middle of iteration 2 (the actor sends SIGINT at its 75th rollout step of 50 a horizon)."""
    previous = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as excinfo:
        main(
            tiny_args(
                tmp_path,
                total_timesteps=10 * 8 * 50,
                save_freq=0,
                eval_freq=0,
                policy="grpo_test_helpers:sigint_actor",
                policy_kwargs='{"at_call": 75}',
            )
        )
    assert excinfo.value.code == 130
    assert signal.getsignal(signal.SIGINT) is previous  # the handler is given back
    (run_dir,) = tmp_path.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["global_step"] == 800 and summary["checkpoint"].endswith("last.pt")  # iteration 2 finished
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["iteration"] == 2


def test_compiled_functions_agree_with_eager():
    rewards, dones = make_rollout()
    returns, mask = returns_to_go(rewards, dones, 0.9), first_episode_mask(dones)
    eager = group_advantages(returns, mask, 4, True, 1e-4)
    compiled = torch.compile(group_advantages)(returns, mask, 4, True, 1e-4)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled[1]["mean_group_std"], eager[1]["mean_group_std"])
    eager = episode_advantages(rewards, mask, 4, True, 1e-4)
    compiled = torch.compile(episode_advantages)(rewards, mask, 4, True, 1e-4)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-6)
    actor = tiny_actor()
    g = torch.Generator().manual_seed(0)
    mb = TensorDict(
        obs=torch.randn(40, 3, generator=g),
        action=torch.randn(40, 2, generator=g),
        logprob=torch.randn(40, generator=g) - 2,
        ref_logprob=torch.randn(40, generator=g) - 2,
        advantages=torch.randn(40, generator=g),
        mask=torch.rand(40, generator=g) < 0.7,
        batch_size=[40],
    )
    args = Args(kl_coef=0.3, ent_coef=0.01)
    compiled_grads_match(grpo.grpo_loss, actor, mb, args)


def test_ref_checkpoint_from_ppo_is_reference_and_start(tmp_path):
    """A ppo_continuous checkpoint (actor + critic) -> the reference policy and the initial policy."""
    from cleanrl_embodied import ppo_continuous as ppo

    agent = ppo.Agent(*spaces(31, 7), ppo.Args(hidden_sizes=(32, 32), init_logstd=-0.7))
    torch.nn.init.normal_(agent.actor_mean[-1].weight, std=0.3)  # not what a fresh init would give
    path = tmp_path / "ppo.pt"
    ppo_ckpt = {
        "script": "ppo_continuous",
        "model": agent.state_dict(),
        "obs_dim": 31,
        "act_dim": 7,
        "args": dataclasses.asdict(ppo.Args(hidden_sizes=(32, 32), init_logstd=-0.7)),
    }
    torch.save(ppo_ckpt, path)
    out = main(tiny_args(tmp_path, ref_checkpoint=str(path), kl_coef=0.5, learning_rate=1e-9, total_timesteps=400))
    ckpt = torch.load(out["checkpoint"], weights_only=True)
    assert set(ckpt["ref_model"]) == {k for k in agent.state_dict() if k.startswith("actor_")}
    for key, value in ckpt["ref_model"].items():
        torch.testing.assert_close(value, agent.state_dict()[key])
        torch.testing.assert_close(ckpt["model"][key], value, atol=1e-5, rtol=0)
    assert read_scalars(out["run_dir"])["grpo/kl_ref"][0] < 1e-6
    with pytest.raises(SystemExit) as excinfo:
        main(tiny_args(tmp_path, ref_checkpoint=str(path), hidden_sizes=(16,)))
    assert "--hidden-sizes" in one_line_exit(excinfo)
    ppo_ckpt["args"]["norm_obs"] = True  # its actor expects normalized observations
    torch.save(ppo_ckpt, path)
    with pytest.raises(SystemExit) as excinfo:
        main(tiny_args(tmp_path, ref_checkpoint=str(path)))
    assert "--norm-obs" in one_line_exit(excinfo)
    ppo_ckpt["args"].update(norm_obs=False, action_chunk=4)  # the old ppo_continuous.py's chunks: a VLA's now
    torch.save(ppo_ckpt, path)
    with pytest.raises(SystemExit) as excinfo:
        main(tiny_args(tmp_path, ref_checkpoint=str(path)))
    assert "--action-chunk 4" in one_line_exit(excinfo) and "grpo_vla.py" in str(excinfo.value.code)


@pytest.mark.parametrize("advantage", ["step", "episode"])
def test_grpo_learns_the_toy_task(tmp_path, advantage):
    """A real, short run: reward -(a - x)^2 -> the deterministic policy gets much closer to x."""
    args = tiny_args(
        tmp_path,
        advantage=advantage,
        env_id="GRPOToy-v0",
        num_envs=64,
        group_size=8,
        total_timesteps=64 * 5 * 40,
        num_minibatches=4,
        update_epochs=4,
        eval_freq=0,
        save_freq=0,
        num_eval_envs=32,
        num_eval_episodes=32,
        learning_rate=3e-3,
        gamma=1.0,
    )
    out = main(args)
    scalars = read_scalars(out["run_dir"])
    # zero-mean policy: E[-5 x^2] = -5/3 per episode; a policy that learnt a ~ x is far better
    assert out["eval"]["episodic_return"] > -0.5, out["eval"]
    assert scalars["charts/episodic_return"][-1] > scalars["charts/episodic_return"][0] + 0.5


def test_eval_checkpoint_evaluates_without_training(tmp_path):
    first = grpo.main(tiny_args(tmp_path / "a"))
    last = Path(first["run_dir"]) / "checkpoints" / "last.pt"
    out = grpo.main(tiny_args(tmp_path / "b", eval_checkpoint=str(last), capture_video=True))
    run_dir = Path(out["run_dir"])
    assert out["global_step"] == first["global_step"]
    assert not list((run_dir / "checkpoints").glob("*.pt"))  # nothing trained, nothing saved
    assert list((run_dir / "videos").glob("*.mp4"))
    assert json.loads((run_dir / "summary.json").read_text())["eval"]["episodic_length"] > 0


@pytest.mark.parametrize(
    "flag, value", [("env_kwargs", "not json"), ("env_kwargs", '{"no_such_option": 1}'), ("eval_env_kwargs", "[1, 2]")]
)
def test_bad_env_kwargs_is_one_line_naming_the_flag(tmp_path, flag, value):
    with pytest.raises(SystemExit) as e:
        grpo.main(tiny_args(tmp_path, **{flag: value}))
    assert f"--{flag.replace('_', '-')}" in one_line_exit(e)


def test_a_diverged_run_stops_with_the_ppo_scripts_line(tmp_path):
    with pytest.raises(SystemExit) as excinfo:
        main(
            tiny_args(
                tmp_path,
                max_consecutive_skips=3,
                policy="grpo_test_helpers:nan_actor",
                policy_kwargs='{"at_calls": [1, 2, 3]}',
            )
        )
    assert one_line_exit(excinfo) == (
        "error: 3 optimizer steps in a row had a non-finite loss or gradient (last "
        "at global step 400); lower --learning-rate or check the env"
    )


def test_old_checkpoints_load_unless_they_used_what_grpo_vla_trains_now(tmp_path):
    """A checkpoint written before the VLA trainers split off (issue 37) holds the flags of token bins, action chunks,
    micro-batches and autocast in its args, and a fingerprint of frozen weights: a Gaussian one resumes and
    evaluates; one with --action-head bins or --action-chunk > 1 is refused in one line naming grpo_vla.py, whether
    it is resumed, evaluated or the KL reference."""
    first = main(tiny_args(tmp_path / "a", total_timesteps=8 * 50))
    ckpt = torch.load(first["checkpoint"], weights_only=True)
    ckpt["args"].update(action_head="gaussian", action_bins=256, action_chunk=1, micro_batch_size=None, autocast="none")
    ckpt["frozen"] = ""  # grpo.py's built-in actor froze nothing
    old = tmp_path / "old.pt"
    torch.save(ckpt, old)
    assert main(tiny_args(tmp_path / "b", total_timesteps=2 * 8 * 50, resume=str(old)))["global_step"] == 2 * 8 * 50
    assert main(tiny_args(tmp_path / "c", eval_checkpoint=str(old)))["eval"]["episodic_length"] > 0
    for vla in ({"action_head": "bins"}, {"action_chunk": 4}):
        torch.save({**ckpt, "args": {**ckpt["args"], **vla}}, old)
        for flag_name in ("resume", "eval_checkpoint", "ref_checkpoint"):
            with pytest.raises(SystemExit) as excinfo:
                main(tiny_args(tmp_path / "d", **{flag_name: str(old)}))
            msg = one_line_exit(excinfo)
            assert f"--{flag_name.replace('_', '-')} {old}" in msg and "grpo_vla.py" in msg, msg
            assert f"--{next(iter(vla)).replace('_', '-')} {next(iter(vla.values()))}" in msg, msg
    assert not (tmp_path / "d").exists()  # refused before anything was built


# ---------------------------------------------------------------------------------------------
# Token bins, action chunks, micro-batches and bf16 autocast: grpo_vla.py's since issue 37 (these ran through
# grpo.py in tests/test_language_and_heads.py before), with a toy VLA (toy_policies.ToyVLA)
# ---------------------------------------------------------------------------------------------
def vla_args(tmp_path: Path, env_id: str = "PushCubeLangRL", **kw):
    from cleanrl_embodied import grpo_vla

    common = dict(
        env_id=env_id, seed=1, num_envs=8, group_size=4, num_steps=4, num_minibatches=2, total_timesteps=8 * 4 * 2,
        eval_freq=0, save_freq=0, num_eval_envs=2, num_eval_episodes=2, output_dir=str(tmp_path), cuda=False,
        policy="toy_policies:ToyVLA",
    )  # fmt: skip
    if env_id == "tests.envs_for_tests:PointReach-v0":
        common["action_bins"] = 16
    return grpo_vla.Args(**{**common, **kw})


def vla_train(args) -> dict:
    from cleanrl_embodied import grpo_vla

    grpo_vla.main(args)
    (run,) = [p for p in Path(args.output_dir).iterdir() if p.is_dir()]
    return json.loads((run / "summary.json").read_text()) | {"run_dir": str(run)}


VLA_HEADS = {"bins": {"action_head": "bins"}, "chunk": {"action_chunk": 4}}


@pytest.mark.parametrize("env_id", ["PushCubeLangRL", "tests.envs_for_tests:PointReach-v0"])
@pytest.mark.parametrize("head", list(VLA_HEADS))
def test_grpo_vla_trains_bins_and_chunks_and_the_first_minibatch_has_ratio_one(head, env_id, tmp_path):
    """One iteration, one epoch, one minibatch (the whole rollout): the update's first (and only) minibatch sees
    the behaviour policy itself, so ratio = 1 for every sample, whatever the head."""
    chunk = VLA_HEADS[head].get("action_chunk", 1)
    kw = dict(VLA_HEADS[head], update_epochs=1, num_minibatches=1, total_timesteps=8 * 4 * chunk)
    summary = vla_train(vla_args(tmp_path, env_id, **kw))
    assert summary["global_step"] == 8 * 4 * chunk
    train = summary["train"]
    assert abs(train["losses/approx_kl"]) < 1e-6 and train["losses/clipfrac"] == 0.0, train
    assert abs(train["losses/old_approx_kl"]) < 1e-5
    assert summary["eval"]["episodic_return"] is not None


def test_grpo_vla_micro_batches_give_the_unsplit_update(tmp_path):
    """fp32: minibatches of 16 in pieces of 5 (5 + 5 + 5 + 1) take the same optimizer steps as in one piece (and
    another learning rate gives other weights: the updates do move them). 4 envs, fewer than a piece: grpo_vla.py's
    rollout also acts in pieces, which would draw other samples from the same random stream."""
    models = []
    for name, kw in micro_batch_runs():
        common = dict(num_envs=4, group_size=2, num_minibatches=1, total_timesteps=4 * 4 * 2, update_epochs=4)
        summary = vla_train(vla_args(tmp_path / name, target_kl=None, **common, **kw))
        assert summary["train"]["charts/skipped_updates"] == 0
        models.append(torch.load(Path(summary["checkpoint"]), weights_only=True)["model"])
    pieces_train_like_whole(*models)


def test_grpo_vla_bf16_autocast_trains_and_is_recorded(tmp_path):
    summary = vla_train(vla_args(tmp_path, autocast="bf16", micro_batch_size=7))
    assert summary["args"]["autocast"] == "bf16" and summary["args"]["micro_batch_size"] == 7
    assert np.isfinite(summary["train"]["losses/policy_loss"])
    model = torch.load(Path(summary["checkpoint"]), weights_only=True)["model"]
    assert all(v.dtype in (torch.float32, torch.float64, torch.int64) for v in model.values())  # fp32 weights


def test_grpo_vla_returns_to_go_per_decision_match_hand_computation():
    """Two decisions of one env, chunks of 4 with gamma 0.5: rewards 3.25 (the chunk ran all 4 steps: the return
    after it is discounted by 0.5^4) then 8 (its episode ended: no return after it)."""
    from cleanrl_embodied import grpo_vla

    rewards, dones = torch.tensor([[3.25], [8.0]]), torch.tensor([[False], [True]])
    returns = grpo_vla.decision_returns_to_go(rewards, dones, torch.tensor([[0.0625], [0.25]]))
    assert torch.allclose(returns.flatten(), torch.tensor([3.25 + 0.0625 * 8, 8.0]))
