"""Training SPS of ppo_continuous.py eager vs --compile, measured side by side in one invocation.

    uv run python benchmarks/compile_speedup.py                       # CPU, 1 thread, PushCubeRL
    uv run python benchmarks/compile_speedup.py --threads 2 --extra --num-envs 1024

Each variant runs the script's CLI in its own process, one after another, with the same seed and
flags. Besides the end-to-end SPS from summary.json (which includes compilation time), it reports the
steady-state SPS from the TensorBoard event wall times, skipping the first `--skip` iterations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

SCRIPT = Path(__file__).resolve().parents[1] / "cleanrl_embodied" / "ppo_continuous.py"


@dataclass
class Args:
    env_id: str = "PushCubeRL"
    """environment id"""
    total_timesteps: int = 600_000
    """env steps per variant"""
    threads: int = 1
    """CPU threads (OMP_NUM_THREADS) for every variant"""
    skip: int = 10
    """iterations left out of the steady-state SPS (warm-up, compilation)"""
    extra: list[str] = field(default_factory=list)
    """extra flags passed to both variants"""
    out: str | None = None
    """optional markdown file for the table"""


def steady_sps(run_dir: Path, skip: int) -> float:
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    events = acc.Scalars("charts/SPS")[skip:]
    return (events[-1].step - events[0].step) / (events[-1].wall_time - events[0].wall_time)


def main(args: Args) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in (("eager", []), ("compile", ["--compile"])):
            cmd = [sys.executable, str(SCRIPT), "--env-id", args.env_id, "--total-timesteps",
                   str(args.total_timesteps), "--output-dir", f"{tmp}/{name}", "--eval-freq", "0", "--save-freq", "0",
                   *flags, *args.extra]
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, env=env)
            run_dir = next(Path(tmp, name).iterdir())
            summary = json.loads((run_dir / "summary.json").read_text())
            results[name] = (summary["sps"], steady_sps(run_dir, args.skip), summary["wall_time_s"])
    rows = [f"| variant ({args.env_id}, {args.threads} thread(s)) | end-to-end SPS | steady-state SPS "
            "| wall time (s) |",
            "|---|---|---|---|"]
    for name, (sps, steady, wall) in results.items():
        rows.append(f"| {name} | {sps:,.0f} | {steady:,.0f} | {wall:.0f} |")
    e, c = results["eager"], results["compile"]
    rows.append(f"| compile / eager | {c[0] / e[0]:.2f}x | {c[1] / e[1]:.2f}x | |")
    table = "\n".join(rows)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main(tyro.cli(Args))
