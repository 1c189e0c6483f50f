"""PushCubeRL env-only throughput with image observations (obs_mode="rgb") against the state-only path.

    uv run python -m benchmarks.speed.push_cube_rgb_speed                       # ~2 min on a 2-core CPU
    uv run python -m benchmarks.speed.push_cube_rgb_speed --num-envs 256 --image-sizes 64 --rounds 3
    uv run python -m benchmarks.speed.push_cube_rgb_speed --wrist --out docs/results/push_cube_wrist_speed  # + wrist

For every N in `--num-envs` it builds the state env (obs_mode="state", the default) and one rgb env per size in
`--image-sizes`, all with seed 0, in this one process (`--threads` pinned, OMP_NUM_THREADS too). Random actions
for all steps are drawn up front. After `--warmup` steps (left out), every env steps `--steps` times per round,
the variants of one N interleaved round after round (so that a change of machine load hits them alike); a step
includes the autoreset of the finished envs (SAME_STEP) and, in rgb mode, drawing the images of the final
state and of the state after the reset. Reported: the median over `--rounds` of env-steps/s (N * steps / time).
`--wrist` adds, per size, an rgb env with the wrist camera too (`obs_cameras=("top", "wrist")`: two images a step),
reports its step cost against the top camera's alone, and saves `examples_wrist_64.png` (both views of 4 envs
pushed by the scripted expert) instead of the top camera's examples.

Writes `speed.md`, `speed.json`, `speed.png` (steps/s, log scale) and example observations (`examples_64.png`:
4 envs at reset and after 10 and 20 random steps, 64 x 64 upscaled 4x; `examples_128.png` the same at 128) to
`--out` (default docs/results/push_cube_rgb_speed/).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported; --threads sets it below as well

import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import tyro  # noqa: E402

from benchmarks.common import (
    RESULTS_DIR,
    git_info,
    invocation,
    machine_info,
    md_table,
    package_versions,
    record_lines,
)
from benchmarks.suite import provenance  # noqa: E402
from cleanrl_embodied.shared.envs.push_cube import PushCubeRLVecEnv  # noqa: E402


@dataclass
class Args:
    num_envs: tuple[int, ...] = (256, 1024)
    """numbers of parallel envs N"""
    image_sizes: tuple[int, ...] = (64, 128)
    """square image sizes of the rgb variants"""
    steps: int = 10
    """env steps per round and variant"""
    rounds: int = 5
    """rounds (the median is reported)"""
    warmup: int = 3
    """steps of every variant before the first round (left out)"""
    threads: int = 1
    """torch threads (and OMP_NUM_THREADS)"""
    device: str = "cpu"
    out: str = str(RESULTS_DIR / "push_cube_rgb_speed")
    examples: bool = True
    """also save example observations (PNG)"""
    wrist: bool = False
    """also step rgb envs with the wrist camera (obs_cameras top and wrist) and compare their step cost"""


def measure(args: Args, num_envs: int) -> dict[str, float]:
    """Median env-steps/s of the state variant and of every rgb size, for N = num_envs."""
    variants = {"state": PushCubeRLVecEnv(num_envs=num_envs, device=args.device, seed=0)}
    for size in args.image_sizes:
        variants[f"rgb {size}x{size}"] = PushCubeRLVecEnv(num_envs=num_envs, device=args.device, seed=0,
                                                          obs_mode="rgb", image_size=size)  # fmt: skip
        if args.wrist:
            variants[f"rgb+wrist {size}x{size}"] = PushCubeRLVecEnv(
                num_envs=num_envs, device=args.device, seed=0, obs_mode="rgb", image_size=size,
                obs_cameras=("top", "wrist"),
            )  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    total = args.warmup + args.rounds * args.steps
    actions = (2 * torch.rand(total, num_envs, 7, generator=generator) - 1).to(args.device)
    for env in variants.values():
        env.reset(seed=0)
        for a in actions[: args.warmup]:
            env.step(a)
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        chunk = actions[args.warmup + r * args.steps : args.warmup + (r + 1) * args.steps]
        for name, env in variants.items():
            _sync(args.device)
            start = time.perf_counter()
            for a in chunk:
                env.step(a)
            _sync(args.device)
            rates[name].append(num_envs * args.steps / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in rates.items()}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def save_examples(args: Args, size: int, path: Path, upscale: int) -> None:
    """A grid of 4 envs (columns) at reset and after 10 and 20 random steps (rows), upscaled."""
    from PIL import Image

    env = PushCubeRLVecEnv(num_envs=4, device=args.device, seed=0, obs_mode="rgb", image_size=size)
    obs, _ = env.reset(seed=1)
    generator = torch.Generator().manual_seed(1)
    rows = [obs["rgb"]]
    for _ in range(2):
        for _ in range(10):
            obs, *_ = env.step((2 * torch.rand(4, 7, generator=generator) - 1).to(args.device))
        rows.append(obs["rgb"])
    gap = 2  # white pixels between the images
    grid = np.full((3 * (size + gap), 4 * (size + gap), 3), 255, dtype=np.uint8)
    for i, images in enumerate(rows):
        for j, image in enumerate(images.cpu()):
            grid[i * (size + gap) : i * (size + gap) + size, j * (size + gap) : j * (size + gap) + size] = (
                image.permute(1, 2, 0).numpy())  # fmt: skip
    Image.fromarray(np.kron(grid, np.ones((upscale, upscale, 1), dtype=np.uint8))).save(path)


def save_wrist_examples(args: Args, size: int, path: Path, upscale: int) -> None:
    """4 envs (column pairs: top view, wrist view) at reset and after 6 and 12 steps of the scripted expert (rows)."""
    from PIL import Image

    from cleanrl_embodied.shared.envs.push_cube import expert_action

    env = PushCubeRLVecEnv(num_envs=4, device=args.device, seed=0, obs_mode="rgb", image_size=size,
                           obs_cameras=("top", "wrist"), cube_yaw_range=0.5)  # fmt: skip
    obs, _ = env.reset(seed=1)
    rows = [obs]
    for _ in range(2):
        for _ in range(6):
            obs, *_ = env.step(expert_action(env))
        rows.append(obs)
    gap, pair_gap = 2, 6  # white pixels between the two views of an env, and between envs
    width = 4 * (2 * size + gap + pair_gap)
    grid = np.full((3 * (size + gap), width, 3), 255, dtype=np.uint8)
    for i, row in enumerate(rows):
        for j in range(4):
            for k, key in enumerate(("rgb", "wrist")):
                x = j * (2 * size + gap + pair_gap) + k * (size + gap)
                grid[i * (size + gap) : i * (size + gap) + size, x : x + size] = (
                    row[key][j].cpu().permute(1, 2, 0).numpy())  # fmt: skip
    Image.fromarray(np.kron(grid, np.ones((upscale, upscale, 1), dtype=np.uint8))).save(path)


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(next(iter(data["results"].values())))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = np.arange(len(names))
    width = 0.8 / len(data["results"])
    for k, (num_envs, rates) in enumerate(data["results"].items()):
        ax.bar(x + (k - (len(data["results"]) - 1) / 2) * width, [rates[n] for n in names], width,
               label=f"{num_envs} envs")  # fmt: skip
    ax.set_yscale("log")
    ax.set_xticks(x, names)
    ax.set_ylabel("env steps/s (median)")
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.legend()
    ax.set_title(f"PushCubeRL env step, {data['device']}, {data['threads']} thread(s)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(data: dict) -> str:
    names = list(next(iter(data["results"].values())))
    sizes = list(data["results"])
    header = ["obs", *[f"{n} envs: steps/s" for n in sizes], *[f"{n} envs: vs state" for n in sizes]]
    rows = []
    for name in names:
        rates = [data["results"][n][name] for n in data["results"]]
        ratios = [data["results"][n][name] / data["results"][n]["state"] for n in data["results"]]
        rows.append([name, *[f"{r:,.0f}" for r in rates], *[f"{r:.3f}" for r in ratios]])
    wrist = [name for name in names if name.startswith("rgb+wrist ")]
    costs = [
        f"- the wrist camera: a step of `{name}` costs "
        + " / ".join(f"{data['results'][n][name.replace('+wrist', '')] / data['results'][n][name]:.2f}" for n in sizes)
        + f" times one of `{name.replace('+wrist', '')}` at {' / '.join(sizes)} envs"
        for name in wrist
    ]
    lines = [
        f"PushCubeRL env-only throughput ({data['device']}, {data['threads']} thread(s)): median over "
        f"{data['rounds']} rounds of {data['steps']} steps, {data['warmup']} warm-up steps left out; random "
        f"actions drawn up front; a step includes the SAME_STEP autoreset and, in rgb mode, the images of the final "
        f"and of the reset state. Finished {data['finished']} after {data['total_wall_s']:.0f} s.",
        "",
        *record_lines(data["invocation"], data["machine"], data["load_avg_end"], data["git"], data["versions"]),
        "",
        md_table(header, rows),
        *([""] + costs if costs else []),
        "",
        "![steps/s](speed.png)",
        "",
    ]
    if costs:
        lines.append("Both cameras (64 x 64, upscaled 4x; column pairs: top and wrist view of 4 envs; rows: reset, "
                     "after 6 and after 12 steps of the scripted expert): ![wrist](examples_wrist_64.png)")  # fmt: skip
    else:
        lines.append("Example observations (64 x 64, upscaled 4x; columns: 4 envs, rows: reset, after 10 and after 20 "
                     "random steps): ![examples](examples_64.png)")  # fmt: skip
    return "\n".join(lines)


def main(args: Args) -> None:
    if min(args.num_envs) < 1 or min(args.image_sizes) < 1 or min(args.steps, args.rounds, args.threads) < 1:
        raise SystemExit("error: --num-envs, --image-sizes, --steps, --rounds and --threads must be positive")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {"invocation": invocation(__file__, sys.argv[1:]),
            "device": args.device, "threads": args.threads, "steps": args.steps, "rounds": args.rounds,
            "warmup": args.warmup, "machine": machine_info(), "versions": package_versions(), "git": git_info(),
            "results": {}}  # fmt: skip
    start = time.time()
    for num_envs in args.num_envs:
        data["results"][str(num_envs)] = measure(args, num_envs)
        print(num_envs, {k: round(v) for k, v in data["results"][str(num_envs)].items()}, flush=True)
    data.update(
        total_wall_s=round(time.time() - start, 1),
        finished=time.strftime("%Y-%m-%d %H:%M"),
        load_avg_end=machine_info()["load_avg_1_5_15"],
    )
    (out / "speed.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(data, out / "speed.png")
    if args.examples and args.wrist:
        save_wrist_examples(args, 64, out / "examples_wrist_64.png", upscale=4)
    elif args.examples:
        save_examples(args, 64, out / "examples_64.png", upscale=4)
        save_examples(args, 128, out / "examples_128.png", upscale=2)
    (out / "speed.md").write_text(f"# PushCubeRL image observations: env speed\n\n{report(data)}\n")
    provenance.record(out, data["invocation"], None, data["machine"], data["git"])
    print(f"wrote {out / 'speed.md'}")


if __name__ == "__main__":
    main(tyro.cli(Args))
