"""Multi-seed runs of one or more trainers, exactly as a user launches them, with a results table.

    uv run python benchmarks/multi_seed.py --seeds 1 2 3                                   # default PPO run
    uv run python benchmarks/multi_seed.py --scripts ppo_continuous grpo --seeds 1 2 3 --total-timesteps 1000000

Each (script, seed) runs the script's own CLI in its own process, one after another (never two at
once on a small CPU, threads pinned with OMP_NUM_THREADS), and the figures are read back from each
run's summary.json: eval success and return, wall time, SPS. Extra flags for every run go after
`--extra`, e.g. `--extra --num-envs 512`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tyro

SCRIPTS_DIR = Path(__file__).resolve().parents[1] / "cleanrl_embodied"


@dataclass
class Args:
    scripts: tuple[str, ...] = ("ppo_continuous",)
    """trainer scripts (file names in cleanrl_embodied/ without .py)"""
    seeds: tuple[int, ...] = (1,)
    """seeds to run, one process each, sequentially"""
    env_id: str = "PushCubeRL"
    """environment id passed to every run"""
    total_timesteps: int | None = None
    """env-step budget of every run (None: each script's default)"""
    threads: int = 1
    """CPU threads per run (OMP_NUM_THREADS)"""
    extra: list[str] = field(default_factory=list)
    """extra flags passed through to every run"""
    out: str | None = None
    """optional markdown file to write the table to"""


def fmt(xs: list[float], digits: int = 3) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.{digits}f}"
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"


def main(args: Args) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    rows = ["| script | seed | env steps | wall time (s) | SPS | eval success | eval return |",
            "|---|---|---|---|---|---|---|"]
    summaries: dict[str, list[dict]] = {s: [] for s in args.scripts}
    with tempfile.TemporaryDirectory() as tmp:
        for script in args.scripts:
            for seed in args.seeds:
                out_dir = Path(tmp, f"{script}_{seed}")
                cmd = [sys.executable, str(SCRIPTS_DIR / f"{script}.py"), "--env-id", args.env_id, "--seed", str(seed),
                       "--output-dir", str(out_dir), *args.extra]
                if args.total_timesteps is not None:
                    cmd += ["--total-timesteps", str(args.total_timesteps)]
                print("$", " ".join(cmd), flush=True)
                subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
                s = json.loads(next(out_dir.glob("*/summary.json")).read_text())
                summaries[script].append(s)
                rows.append(f"| {script} | {seed} | {s['global_step']:,} | {s['wall_time_s']:.0f} | {s['sps']:,.0f} | "
                            f"{s['eval']['success_rate']} | {s['eval']['episodic_return']:.3f} |")
    for script, runs in summaries.items():
        rows.append(f"| **{script}** | {len(runs)} seeds | {runs[0]['global_step']:,} | "
                    f"{fmt([r['wall_time_s'] for r in runs], 0)} | {fmt([r['sps'] for r in runs], 0)} | "
                    f"{fmt([r['eval']['success_rate'] or 0.0 for r in runs])} | "
                    f"{fmt([r['eval']['episodic_return'] for r in runs])} |")
    table = "\n".join(rows)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main(tyro.cli(Args))
