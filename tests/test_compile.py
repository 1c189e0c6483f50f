"""The compiled update: the same pure functions as eager, the same results up to float rounding, when `--compile auto`
compiles, the fallback where compiling does not work, and bit-identical resume of a compiled run."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from toy_policies import ToyVLA

from cleanrl_embodied import (
    grpo,
    grpo_vla,
    ppo_continuous,
    ppo_ddp,
    ppo_recurrent,
    ppo_vla,
    ppo_vla_async,
    ppo_vla_ddp,
    shared,
)
from cleanrl_embodied.shared.compilation import compile_choice, compiler
from tests.trainer_args import FOUR_ENVS, is_vla, tiny_args

REPO = Path(__file__).resolve().parents[1]
PPO = {"ppo_continuous": ppo_continuous, "ppo_ddp": ppo_ddp, "ppo_vla_async": ppo_vla_async}


def _minibatch(n: int, obs_dim: int, act_dim: int, generator: torch.Generator) -> TensorDict:
    randn = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    return TensorDict(
        obs=randn(n, obs_dim), action=randn(n, act_dim), logprob=randn(n) - 3.0, value=randn(n),
        advantages=randn(n), returns=randn(n), mask=torch.rand(n, generator=generator) > 0.2,
        ref_logprob=randn(n) - 3.0, batch_size=[n],
    )  # fmt: skip


def _classic_backward(loss_fn):
    """The classic PPO trainers' update (no micro-batches): the loss over the whole minibatch, then its backward."""

    def backward(agent, mb: TensorDict, args, weight: float) -> tuple[torch.Tensor, TensorDict]:
        loss, stats = loss_fn(agent, mb, args)
        loss.backward()
        return loss.detach(), stats

    return backward


def _update(module, agent, mb: TensorDict, args, compile_fn) -> tuple[torch.Tensor, torch.Tensor]:
    """One minibatch update with the trainer's own functions (with micro-batches in two pieces, so accumulation is
    compiled too): backward_piece (the classic PPO trainers: ppo_loss, then backward), clip_gradients and the
    optimizer step, each through ``compile_fn``."""
    params = [p for p in agent.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=torch.tensor(3e-3), eps=1e-5)
    classic = module in (ppo_continuous, ppo_ddp, grpo)  # grpo.py: grpo_loss, then backward
    loss_fn = module.grpo_loss if module is grpo else getattr(module, "ppo_loss", None)
    backward_fn = _classic_backward(compile_fn(loss_fn)) if classic else compile_fn(module.backward_piece)
    clip_fn, step_fn = compile_fn(module.clip_gradients), compile_fn(optimizer.step)
    for _ in range(3):  # three steps, so the optimizer's moments matter
        optimizer.zero_grad(set_to_none=True)
        losses = []
        for piece in (mb,) if classic else mb.split(mb.shape[0] // 2):
            if module is grpo_vla:  # its pieces' shares: of the minibatch's alive samples (or its size, Dr. GRPO)
                losses.append(backward_fn(agent, piece, args, mb["mask"].sum(), len(mb))[0])
            else:
                losses.append(backward_fn(agent, piece, args, len(piece) / len(mb))[0])
        norm = clip_fn(params, args.max_grad_norm)
        step_fn()
    return sum(losses), norm


@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_ddp", "ppo_vla_async", "grpo", "grpo_vla"])
def test_compiled_and_eager_updates_agree_on_the_same_minibatch(name):
    module = {**PPO, "grpo": grpo, "grpo_vla": grpo_vla}[name]
    obs_space = gym.spaces.Box(-np.inf, np.inf, (11,), np.float32)
    act_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    vla = is_vla(module)  # a VLA trainer: the policy is toy_policies' ToyVLA
    args = module.Args(max_grad_norm=0.5) if vla else module.Args(hidden_sizes=(32, 32), max_grad_norm=0.5)
    torch.manual_seed(0)
    make = partial(ToyVLA, hidden=32) if vla else module.Agent if hasattr(module, "Agent") else module.Actor
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


def test_the_compiler_compiles_only_when_enabled():
    said = []
    cpu = torch.device("cpu")
    fn = lambda x: x + 1  # noqa: E731
    assert compiler(False, cpu, said.append)(fn) is fn
    compiled = compiler(True, cpu, said.append)(fn)
    assert compiled is not fn and compiled(torch.ones(2)).tolist() == [2.0, 2.0]
    assert said == []


# 3 iterations of 2 epochs x 2 minibatches: 12 planned updates (toy_policies' ToyVLA for a VLA trainer)
THREE_ITERATIONS = dict(
    FOUR_ENVS, num_steps=4, update_epochs=2, total_timesteps=3 * 16, eval_freq=0, save_freq=0, hidden_sizes=(8,)
)


@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_ddp", "ppo_vla_async", "grpo_vla", "ppo_recurrent"])
@pytest.mark.parametrize(
    "setting, pays_after, enabled", [("auto", 13, False), ("auto", 12, True), ("on", 10**9, True), ("off", 1, False)]
)
def test_auto_compiles_only_runs_long_enough_to_pay(tmp_path, monkeypatch, name, setting, pays_after, enabled):
    """--compile auto compiles a run that plans at least COMPILE_PAYS_AFTER minibatch updates (here 3 iterations x
    2 epochs x 2 minibatches = 12); on always, off never."""
    module, asked = {**PPO, "grpo_vla": grpo_vla, "ppo_recurrent": ppo_recurrent}[name], []
    assert module.COMPILE_PAYS_AFTER == 10_000
    monkeypatch.setattr(module, "COMPILE_PAYS_AFTER", pays_after)
    monkeypatch.setattr(module.shared, "compiler", lambda on, device, say: asked.append(on) or (lambda fn: fn))
    module.main(tiny_args(module, tmp_path, THREE_ITERATIONS, compile=setting))
    assert asked == [enabled]


def test_auto_compiles_on_the_cpu_when_it_pays_and_on_cuda_only_with_cuda_graphs():
    """What was measured decides per device. CPU: compiled updates were 1.1-1.4x faster (docs/benchmarks.md), so a
    long enough run compiles. CUDA (H200, ppo_continuous, 4096 envs, steady env steps/s): eager 221,697, compiled
    187,905, compiled with CUDA graphs 277,303; so only a run with CUDA graphs compiles. Other devices: eager."""
    assert compile_choice("on", "cuda", updates=1, pays_after=10_000)
    assert compile_choice("on", "cpu", updates=1, pays_after=10_000)
    assert not compile_choice("off", "cpu", updates=10**9, pays_after=1)
    assert not compile_choice("off", "cuda", updates=10**9, pays_after=1, cudagraphs=True)
    assert compile_choice("auto", "cpu", updates=10_000, pays_after=10_000)
    assert not compile_choice("auto", "cpu", updates=9_999, pays_after=10_000)
    assert not compile_choice("auto", "cuda", updates=10**9, pays_after=10_000)  # never the slower path
    assert compile_choice("auto", "cuda", updates=10_000, pays_after=10_000, cudagraphs=True)
    assert not compile_choice("auto", "cuda", updates=9_999, pays_after=10_000, cudagraphs=True)
    assert not compile_choice("auto", "mps", updates=10**9, pays_after=10_000)


TRAINERS = {**PPO, "grpo": grpo, "grpo_vla": grpo_vla, "ppo_vla": ppo_vla, "ppo_vla_ddp": ppo_vla_ddp,
            "ppo_recurrent": ppo_recurrent}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_every_trainer_asks_the_shared_decision_with_its_device_and_planned_updates(tmp_path, monkeypatch, name):
    """One decision for every trainer with --compile: shared.compile_choice, given the setting, the device's type,
    the planned minibatch updates (3 iterations x 2 epochs x 2 minibatches; GRPO's epochs x minibatches likewise)
    and the trainer's COMPILE_PAYS_AFTER (and --cudagraphs where the trainer has it)."""
    module, asked = TRAINERS[name], []
    real = shared.compile_choice
    monkeypatch.setattr(module.shared, "compile_choice", lambda *a, **kw: asked.append((a, kw)) or real(*a, **kw))
    module.main(tiny_args(module, tmp_path, THREE_ITERATIONS, compile="auto"))
    assert len(asked) == 1
    (setting, device_type, updates, pays_after, *cudagraphs), kwargs = asked[0]
    assert (setting, device_type, pays_after) == ("auto", "cpu", module.COMPILE_PAYS_AFTER) and updates > 0
    has_graphs = "cudagraphs" in module.Args.__dataclass_fields__  # (--cudagraphs: the classic PPO trainers)
    assert cudagraphs + list(kwargs.values()) == ([False] if has_graphs else [])


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
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("warning: --compile: torch.compile does not work here ("), warnings
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
