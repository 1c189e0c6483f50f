"""The default PPO run on PushCubeRL, as a user launches it: wall time, SPS, final success per seed.

    uv run python benchmarks/ppo_default_run.py --seeds 1 2 3

Each seed runs the script's own CLI in its own process, one after another (never two at once on a
small CPU), and the figures are read back from each run's summary.json. Extra script flags go after
`--extra`, e.g. `--extra --total-timesteps 1000000`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tyro

SCRIPT = Path(__file__).resolve().parents[1] / "cleanrl_embodied" / "ppo_continuous.py"


@dataclass
class Args:
    seeds: tuple[int, ...] = (1,)
    """seeds to run, one process each, sequentially"""
    env_id: str = "PushCubeRL"
    """environment id passed to the script"""
    extra: list[str] = field(default_factory=list)
    """extra flags passed through to ppo_continuous.py"""
    out: str | None = None
    """optional markdown file to write the table to"""


def main(args: Args) -> None:
    rows = ["| seed | global_step | wall time (s) | SPS | train success (last iter) | eval success | eval return |",
            "|---|---|---|---|---|---|---|"]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            cmd = [sys.executable, str(SCRIPT), "--env-id", args.env_id, "--seed", str(seed),
                   "--output-dir", tmp, *args.extra]
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
            summary_path = max(Path(tmp).glob(f"{args.env_id}__*__{seed}__*/summary.json"),
                               key=lambda p: p.stat().st_mtime)
            s = json.loads(summary_path.read_text())
            results.append(s)
            rows.append(f"| {seed} | {s['global_step']:,} | {s['wall_time_s']:.0f} | {s['sps']:,.0f} | "
                        f"{s['train'].get('charts/success_rate', float('nan')):.3f} | "
                        f"{s['eval']['success_rate']} | {s['eval']['episodic_return']:.3f} |")
    if len(results) > 1:
        def ms(xs):
            return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}"
        rows.append(f"| mean ± std | | {ms([r['wall_time_s'] for r in results])} | "
                    f"{ms([r['sps'] for r in results])} | "
                    f"{ms([r['train'].get('charts/success_rate', 0.0) for r in results])} | "
                    f"{ms([r['eval']['success_rate'] or 0.0 for r in results])} | "
                    f"{ms([r['eval']['episodic_return'] for r in results])} |")
    table = "\n".join(rows)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main(tyro.cli(Args))
