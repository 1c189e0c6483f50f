"""The compiled update: the same pure functions as eager, the same results up to float rounding, when `--compile auto`
compiles, the fallback where compiling does not work, and bit-identical resume of a compiled run."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from cleanrl_embodied import grpo, ppo_async, ppo_continuous, ppo_ddp
from cleanrl_embodied.shared.runtime import COMPILE_PAYS_AFTER, compiler

REPO = Path(__file__).resolve().parents[1]
PPO = {"ppo_continuous": ppo_continuous, "ppo_ddp": ppo_ddp, "ppo_async": ppo_async}


def _minibatch(n: int, obs_dim: int, act_dim: int, generator: torch.Generator) -> TensorDict:
    randn = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    return TensorDict(
        obs=randn(n, obs_dim), action=randn(n, act_dim), logprob=randn(n) - 3.0, value=randn(n),
        advantages=randn(n), returns=randn(n), mask=torch.rand(n, generator=generator) > 0.2,
        ref_logprob=randn(n) - 3.0, batch_size=[n],
    )  # fmt: skip


def _update(module, agent, mb: TensorDict, args, compile_fn) -> tuple[torch.Tensor, torch.Tensor]:
    """One minibatch update with the trainer's own functions (two pieces, so accumulation is compiled too):
    backward_piece, clip_gradients and the optimizer step, each through ``compile_fn``."""
    params = [p for p in agent.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=torch.tensor(3e-3), eps=1e-5)
    backward_fn, clip_fn = compile_fn(module.backward_piece), compile_fn(module.clip_gradients)
    step_fn = compile_fn(optimizer.step)
    for _ in range(3):  # three steps, so the optimizer's moments matter
        optimizer.zero_grad(set_to_none=True)
        losses = []
        for piece in mb.split(mb.shape[0] // 2):
            if module is grpo:
                n_alive = mb["mask"].sum().clamp_min(1)
                losses.append(backward_fn(agent, piece, args, n_alive, piece["mask"].sum() / n_alive)[0])
            else:
                losses.append(backward_fn(agent, piece, args, len(piece) / len(mb))[0])
        norm = clip_fn(params, args.max_grad_norm)
        step_fn()
    return sum(losses), norm


@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_ddp", "ppo_async", "grpo"])
def test_compiled_and_eager_updates_agree_on_the_same_minibatch(name):
    module = {**PPO, "grpo": grpo}[name]
    obs_space = gym.spaces.Box(-np.inf, np.inf, (11,), np.float32)
    act_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    args = module.Args(hidden_sizes=(32, 32), max_grad_norm=0.5)
    torch.manual_seed(0)
    make = module.Agent if hasattr(module, "Agent") else module.Actor
    eager_agent = make(obs_space, act_space, args)
    compiled_agent = copy.deepcopy(eager_agent)
    initial = copy.deepcopy(eager_agent.state_dict())
    mb = _minibatch(64, 11, 3, torch.Generator().manual_seed(1))
    eager = _update(module, eager_agent, mb.clone(), args, lambda fn: fn)
    compiled = _update(module, compiled_agent, mb.clone(), args, torch.compile)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled[1], eager[1], rtol=1e-5, atol=1e-6)
    for key, value in eager_agent.state_dict().items():
        torch.testing.assert_close(compiled_agent.state_dict()[key], value, rtol=1e-5, atol=1e-6)
    assert any((value - initial[key]).abs().max() > 1e-4 for key, value in eager_agent.state_dict().items())


def test_auto_compiles_only_runs_long_enough_to_pay():
    said = []
    cpu = torch.device("cpu")
    fn = lambda x: x + 1  # noqa: E731
    assert compiler("off", cpu, 10**9, said.append)(fn) is fn
    assert compiler("auto", cpu, COMPILE_PAYS_AFTER - 1, said.append)(fn) is fn
    long_run = compiler("auto", cpu, COMPILE_PAYS_AFTER, said.append)(fn)
    assert long_run is not fn and long_run(torch.ones(2)).tolist() == [2.0, 2.0]
    assert compiler("on", cpu, 1, said.append)(fn) is not fn
    assert said == []


def test_where_compiling_does_not_work_the_run_says_so_and_trains_eager(tmp_path):
    """No C++ compiler for inductor's CPU code (CXX names none): one warning line, then the eager update."""
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "OMP_NUM_THREADS": "1"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor-cache")  # nothing compiled before to reuse
    cmd = [
        sys.executable, str(REPO / "cleanrl_embodied" / "ppo_continuous.py"), "--compile", "on", "--num-envs", "8",
        "--num-steps", "4", "--num-minibatches", "2", "--total-timesteps", "64", "--eval-freq", "0",
        "--num-eval-envs", "2", "--num-eval-episodes", "2", "--output-dir", str(tmp_path / "runs"), "--no-cuda",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "torch.compile does not work here" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: --compile on:"), warnings
    assert "done: global_step=64" in proc.stdout


def test_a_compiled_run_resumes_bit_identically(tmp_path):
    common = dict(
        env_id="PushCubeRL", num_envs=16, num_steps=4, num_minibatches=2, update_epochs=2, total_timesteps=16 * 4 * 4,
        eval_freq=0, save_freq=2, num_eval_envs=2, num_eval_episodes=2, hidden_sizes=(32,), compile="on", cuda=False,
    )  # fmt: skip
    straight = ppo_continuous.main(ppo_continuous.Args(output_dir=str(tmp_path / "a"), **common))
    half = Path(straight["run_dir"]) / "checkpoints" / "iter_000002.pt"
    resumed = ppo_continuous.main(ppo_continuous.Args(output_dir=str(tmp_path / "b"), resume=str(half), **common))
    a, b = (torch.load(Path(r["run_dir"]) / "checkpoints" / "last.pt", weights_only=True) for r in (straight, resumed))
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for state_a, state_b in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
