"""Time one PPO minibatch update (loss, backward, gradient clipping, Adam step) eager and compiled, side by side.

    OMP_NUM_THREADS=1 uv run python -m benchmarks.speed.update_speed                     # CleanRL's HalfCheetah sizes
    OMP_NUM_THREADS=1 uv run python -m benchmarks.speed.update_speed --obs-dim 31 --act-dim 7 --hidden 128 128 \\
        --minibatch 640                                                            # PushCubeRL's defaults

Every variant runs the trainer's own functions (`ppo_continuous.Agent`, `ppo_loss`, `clip_gradients`) on the same
random minibatch; the variants take turns in rounds, so a slower moment of the machine hits them all alike, and the
table gives the median time per minibatch update and its ratio to eager.
Compile time (the first calls) is reported apart.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import tyro
from tensordict import TensorDict

from cleanrl_embodied import ppo_continuous as ppo


@dataclass
class Args:
    obs_dim: int = 17
    """observation size (HalfCheetah: 17)"""
    act_dim: int = 6
    """action size (HalfCheetah: 6)"""
    hidden: tuple[int, ...] = (64, 64)
    """hidden layer sizes (CleanRL's: 64 64)"""
    minibatch: int = 64
    """samples per minibatch (CleanRL's HalfCheetah: 2048 / 32)"""
    rounds: int = 30
    """rounds of timing; every variant runs --calls updates per round"""
    calls: int = 50
    """minibatch updates per variant per round"""
    threads: int = 1
    """torch threads"""


def make_setup(args: Args, seed: int = 0):
    torch.manual_seed(seed)
    obs_space = gym.spaces.Box(-np.inf, np.inf, (args.obs_dim,), np.float32)
    act_space = gym.spaces.Box(-1.0, 1.0, (args.act_dim,), np.float32)
    ppo_args = ppo.Args(hidden_sizes=args.hidden, norm_obs=True)
    agent = ppo.Agent(obs_space, act_space, ppo_args)
    n = args.minibatch
    mb = TensorDict(
        obs=torch.randn(n, args.obs_dim),
        action=torch.randn(n, args.act_dim),
        logprob=torch.randn(n) - 5,
        value=torch.randn(n),
        advantages=torch.randn(n),
        returns=torch.randn(n),
        batch_size=[n],
    )
    return agent, mb, ppo_args


def backward(agent, mb: TensorDict, a, weight: float) -> tuple[torch.Tensor, TensorDict]:
    """What ppo_continuous.py's update does with a minibatch before clipping: its loss, then the backward pass."""
    loss, stats = ppo.ppo_loss(agent, mb, a)
    (loss * weight).backward()
    return loss.detach(), stats


def variants(args: Args) -> dict:
    """name -> a zero-argument update function (and the agent it updates)."""
    out = {}
    for name in (
        "eager",
        "eager, fused Adam",
        "compiled loss",
        "compiled backward + clip",
        "compiled backward + clip, fused Adam",
        "compiled backward + clip + Adam step",
    ):
        agent, mb, ppo_args = make_setup(args)
        params = [p for p in agent.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(params, lr=3e-4, eps=1e-5, fused=name.endswith("fused Adam") or None)
        backward_fn, clip_fn = backward, ppo.clip_gradients
        if name == "compiled loss":
            loss_fn = torch.compile(ppo.ppo_loss)

            def backward_fn(agent, piece, a, weight, loss_fn=loss_fn):
                loss, stats = loss_fn(agent, piece, a)
                (loss * weight).backward()
                return loss.detach(), stats
        elif name.startswith("compiled backward"):
            backward_fn, clip_fn = torch.compile(backward), torch.compile(ppo.clip_gradients)

        step = torch.compile(optimizer.step) if name.endswith("Adam step") else optimizer.step

        def update(agent=agent, mb=mb, a=ppo_args, opt=optimizer, params=params, bf=backward_fn, cf=clip_fn, st=step):
            opt.zero_grad(set_to_none=True)
            bf(agent, mb, a, 1.0)
            cf(params, 0.5)
            st()

        out[name] = update
    return out


def main(args: Args) -> None:
    torch.set_num_threads(args.threads)
    fns = variants(args)
    compile_s = {}
    for name, fn in fns.items():  # first calls: compilation
        start = time.perf_counter()
        for _ in range(3):
            fn()
        compile_s[name] = time.perf_counter() - start
    times = {name: [] for name in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[name].append((time.perf_counter() - start) / args.calls * 1e6)
    eager = statistics.median(times["eager"])
    print(
        f"minibatch update, obs {args.obs_dim}, act {args.act_dim}, hidden {args.hidden}, minibatch {args.minibatch}, "
        f"{args.threads} thread(s), torch {torch.__version__}; medians of {args.rounds} rounds x {args.calls} calls\n"
    )
    print("| variant | us per minibatch | vs eager | first 3 calls (s) |\n|---|---|---|---|")
    for name, samples in times.items():
        med = statistics.median(samples)
        print(f"| {name} | {med:.0f} | {eager / med:.2f}x | {compile_s[name]:.1f} |")


if __name__ == "__main__":
    main(tyro.cli(Args))
