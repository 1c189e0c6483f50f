"""PushCubeRL env-only throughput (env-steps/s) vs number of envs, on CPU (threads pinned) and CUDA.

    uv run python benchmarks/env_throughput.py                 # CPU, 1 and 2 threads, 64..4096 envs
    uv run python benchmarks/env_throughput.py --threads 2 --num-envs 4096

Random actions are drawn once up front, so the figure is the env's own cost: `step()` including
autoreset and episode statistics, exactly what a trainer calls. Prints a markdown table; with
`--out FILE` it also writes it there.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

import torch
import tyro

from cleanrl_embodied.shared import make_env


@dataclass
class Args:
    num_envs: tuple[int, ...] = (64, 256, 1024, 4096)
    """numbers of parallel envs to measure"""
    threads: tuple[int, ...] = (1, 2)
    """CPU thread counts to measure (torch.set_num_threads)"""
    steps: int = 200
    """timed steps per repeat"""
    repeats: int = 5
    """timed repeats; the median is reported"""
    cuda: bool = True
    """also measure on CUDA when available"""
    out: str | None = None
    """optional markdown file to write the table to"""


def measure(num_envs: int, device: torch.device, steps: int, repeats: int) -> float:
    env = make_env("PushCubeRL", num_envs=num_envs, device=device, seed=0)
    env.reset(seed=0)
    actions = torch.rand(steps, num_envs, 7, device=device) * 2 - 1
    for t in range(20):  # warm-up
        env.step(actions[t])
    rates = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for t in range(steps):
            env.step(actions[t])
        if device.type == "cuda":
            torch.cuda.synchronize()
        rates.append(num_envs * steps / (time.perf_counter() - start))
    env.close()
    return statistics.median(rates)


def main(args: Args) -> None:
    rows = ["| device | threads | num_envs | env-steps/s (median) |", "|---|---|---|---|"]
    cpu_name = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line),
                    "cpu") if os.path.exists("/proc/cpuinfo") else "cpu"
    for threads in args.threads:
        torch.set_num_threads(threads)
        for n in args.num_envs:
            rate = measure(n, torch.device("cpu"), args.steps, args.repeats)
            rows.append(f"| cpu ({cpu_name}) | {threads} | {n} | {rate:,.0f} |")
            print(rows[-1], flush=True)
    if args.cuda and torch.cuda.is_available():
        for n in (*args.num_envs, 16384):
            rate = measure(n, torch.device("cuda"), args.steps, args.repeats)
            rows.append(f"| cuda ({torch.cuda.get_device_name()}) | - | {n} | {rate:,.0f} |")
            print(rows[-1], flush=True)
    table = "\n".join(rows)
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main(tyro.cli(Args))
