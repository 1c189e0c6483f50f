"""PushCubeRL env-only throughput of variants side by side in one process (1 thread), against an older checkout.

    git archive bf22c03 | tar -x -C /tmp/old && uv run python -m benchmarks.speed.push_cube_env_speed --old /tmp/old

Steps every variant 50 times with random actions drawn up front, 7 rounds interleaved (so that a change of
machine load hits all variants alike), and prints the median env-steps/s and its ratio to the old code. The old
push_cube module runs with the old checkout's franka module.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch

from cleanrl_embodied.shared.envs.push_cube import PushCubeRLVecEnv

parser = argparse.ArgumentParser()
parser.add_argument("--old", required=True, help="checkout whose cleanrl_embodied/shared/envs/push_cube.py is 'old'")
parser.add_argument("--num-envs", type=int, default=4096)
args = parser.parse_args()
torch.set_num_threads(1)


def load_old(root: str):
    """The old checkout's push_cube module, bound to the old checkout's franka module (not this one's, which may
    have changed): its ``from cleanrl_embodied.shared.envs import franka`` runs while the package's ``franka``
    attribute is the old module."""

    def module(name: str):
        spec = importlib.util.spec_from_file_location(f"old_{name}", f"{root}/cleanrl_embodied/shared/envs/{name}.py")
        return spec, importlib.util.module_from_spec(spec)

    franka_spec, old_franka = module("franka")
    franka_spec.loader.exec_module(old_franka)
    push_cube_spec, old_push_cube = module("push_cube")
    package = importlib.import_module("cleanrl_embodied.shared.envs")  # (this checkout's franka: push_cube.franka)
    package.franka = old_franka
    try:
        push_cube_spec.loader.exec_module(old_push_cube)
    finally:
        del package.franka
    return old_push_cube


old = load_old(args.old)
N = args.num_envs
variants = {
    "old (bf22c03)": lambda: old.PushCubeRLVecEnv(num_envs=N, seed=0),
    "arm_limits=False": lambda: PushCubeRLVecEnv(num_envs=N, seed=0, arm_limits=False),
    "default": lambda: PushCubeRLVecEnv(num_envs=N, seed=0),
    "action_mode=ee_delta_pos": lambda: PushCubeRLVecEnv(num_envs=N, seed=0, action_mode="ee_delta_pos"),
    "events": lambda: PushCubeRLVecEnv(
        num_envs=N, seed=0, randomize={"cube_half_size": [0.015, 0.025]}, randomize_every=10, event_cube_shift_std=0.01
    ),
    "action_rate": lambda: PushCubeRLVecEnv(num_envs=N, seed=0, reward_weights={"action_rate": 0.01}),
    "cube_dynamics=sliding": lambda: PushCubeRLVecEnv(num_envs=N, seed=0, cube_dynamics="sliding"),
}
envs = {name: make() for name, make in variants.items()}
actions = {name: 2 * torch.rand(50, N, env.single_action_space.shape[0], generator=torch.Generator().manual_seed(0)) - 1
           for name, env in envs.items()}  # fmt: skip
for env in envs.values():
    env.reset(seed=0)
rates = {name: [] for name in envs}
for _ in range(7):
    for name, env in envs.items():
        start = time.perf_counter()
        for a in actions[name]:
            env.step(a)
        rates[name].append(50 * N / (time.perf_counter() - start))
base = statistics.median(rates["old (bf22c03)"])
print(f"| variant ({N} envs, 1 thread) | env-steps/s (median of 7) | ratio to old |\n|---|---|---|")
for name, values in rates.items():
    print(f"| {name} | {statistics.median(values) / 1e3:.0f}k | {statistics.median(values) / base:.2f} |")
