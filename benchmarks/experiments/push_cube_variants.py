"""PushCubeRL variants side by side: how fast the default PPO learns each, and how long solved episodes are.

    uv run python -m benchmarks.experiments.push_cube_variants --variants default legacy --seeds 1 2 3
    uv run python -m benchmarks.experiments.push_cube_variants --variants legacy --source /tmp/old --tag before

For every (variant, seed) it runs ``cleanrl_embodied/ppo_continuous.py`` (PushCubeRL, the quick suite's flags
from benchmarks/suite/configs/ppo_continuous__PushCubeRL.txt, ``--total-timesteps`` and ``--eval-freq`` below, the
variant's env kwargs for the training and the eval envs, ``--compile off``) in its own process, one at a time,
``OMP_NUM_THREADS=1``, and reads back from its TensorBoard events. (Under ``--compile auto`` the first run of each
variant compiled, by this machine's record of earlier runs, and the others did not: the loop times mixed a compile
in, and the same command would not compute the same numbers on another machine.)

- env steps and loop wall time (``global_step / charts/SPS``, start-up excluded, evaluations included) at
  the first evaluation with ``eval/success_rate >= 0.9``;
- eval success s and mean eval episode length L at the last evaluation, and from them the mean length of
  the solved episodes, ``(L - (1 - s) T) / s`` (a failed episode always lasts ``T = max_episode_steps``).

``--source DIR`` runs the trainer and the package from another checkout (e.g. ``git archive <sha>``), to
measure the code before a change with this same script (give it an ``--out`` of its own). One measurement per
``--out`` folder: ``runs.json`` (every run's record), ``report.md`` (the table, per-seed values, the commands, the
machine) and ``provenance.json`` (each run's commit as its trainer recorded it in summary.json).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tyro

from benchmarks.common import (
    CONFIG_DIR,
    REPO,
    RESULTS_DIR,
    git_info,
    invocation,
    machine_info,
    md_table,
    merge_flags,
    read_flags,
    read_scalars,
    record_lines,
    shell_command,
)
from benchmarks.suite import provenance

# Variant name -> PushCubeRL env kwargs (JSON for --env-kwargs).
VARIANTS = {
    "default": {},
    "legacy": {"arm_limits": False},
    "sliding": {"cube_dynamics": "sliding", "cube_friction": 0.5},
}
THRESHOLD = 0.9


@dataclass
class Args:
    variants: tuple[str, ...] = ("default", "legacy")
    """names from VARIANTS (the old code knows no kwargs: run it as 'default' with --source)"""
    seeds: tuple[int, ...] = (1, 2, 3)
    total_timesteps: int = 600_000
    eval_freq: int = 3
    """iterations between evaluations (256 envs x 20 steps = 5120 env steps per iteration)"""
    extra: str = ""
    """more trainer flags, with "=" and in quotes"""
    source: str | None = None
    """checkout to run the trainer and package from (default: this one)"""
    tag: str = "variants"
    """subfolder of --runs-dir for the run directories"""
    out: str = str(RESULTS_DIR / "push-cube-variants")
    """folder of runs.json, report.md and provenance.json (one measurement per folder)"""
    runs_dir: str = str(REPO / "runs" / "push-cube-variants")
    kwargs: dict[str, str] = field(default_factory=dict)
    """extra env kwargs per variant as JSON, e.g. --kwargs default '{"max_episode_steps": 100}'"""


def run_one(args: Args, variant: str, seed: int) -> dict:
    source = Path(args.source).resolve() if args.source else REPO
    env_kwargs = {**VARIANTS[variant], **json.loads(args.kwargs.get(variant, "{}"))}
    flags = merge_flags(
        read_flags(CONFIG_DIR / "ppo_continuous__PushCubeRL.txt"),
        [
            "--total-timesteps",
            str(args.total_timesteps),
            "--eval-freq",
            str(args.eval_freq),
            "--save-freq",
            "0",
            "--no-cuda",
            "--compile",
            "off",
            "--env-id",
            "PushCubeRL",
        ],
        args.extra.split(),
    )
    if env_kwargs:  # the eval envs too: they take no --env-kwargs of their own (and arm_limits=False trained,
        # then evaluated with the limits, or a 33-dim sliding observation, would measure something else)
        flags += ["--env-kwargs", json.dumps(env_kwargs), "--eval-env-kwargs", json.dumps(env_kwargs)]
    out_dir = Path(args.runs_dir) / args.tag / f"{variant}__{seed}"
    if out_dir.exists():
        shutil.rmtree(out_dir)  # read back only this run
    cmd = [
        sys.executable,
        str(source / "cleanrl_embodied" / "ppo_continuous.py"),
        *flags,
        "--seed",
        str(seed),
        "--output-dir",
        str(out_dir),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if args.source:
        env["PYTHONPATH"] = str(source)
    start = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{variant} seed {seed} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    run_dir = next(out_dir.glob("*/summary.json")).parent
    scalars = read_scalars(run_dir)
    sps_steps, sps = (np.asarray(v, dtype=np.float64) for v in scalars["charts/SPS"])
    steps, success = scalars["eval/success_rate"]
    _, length = scalars["eval/episodic_length"]
    hit = next((i for i, s in enumerate(success) if s >= THRESHOLD), None)
    hit_time = None if hit is None else float(np.interp(steps[hit], sps_steps, sps_steps / np.maximum(sps, 1e-9)))
    return {
        "variant": variant,
        "seed": seed,
        "env_kwargs": env_kwargs,
        "command": shell_command(cmd, {"OMP_NUM_THREADS": "1"}).replace(str(source) + "/", ""),
        "steps_to_0.9": None if hit is None else steps[hit],
        "time_to_0.9_s": hit_time,
        "final_success": success[-1],
        "final_length": length[-1],
        "global_step": steps[-1],
        "solved_length": None
        if success[-1] == 0
        else (length[-1] - (1 - success[-1]) * env_kwargs.get("max_episode_steps", 50)) / success[-1],
        "process_wall_s": round(time.time() - start, 1),
        "versions": json.loads((run_dir / "summary.json").read_text()).get("versions"),
    }


def fmt(values: list, digits: int, scale: float = 1.0, unit: str = "", per_seed: bool = False) -> str:
    """mean ± std (ddof 1) of the values that are not None, the count reached if not all; `per_seed`: each value."""
    got = [v / scale for v in values if v is not None]
    if not got:
        return f"not reached (0/{len(values)})"
    reached = "" if len(got) == len(values) else f" ({len(got)}/{len(values)})"
    each = f" ({', '.join('-' if v is None else f'{v / scale:.{digits}f}{unit}' for v in values)})" if per_seed else ""
    std = np.std(got, ddof=1) if len(got) > 1 else 0
    return f"{np.mean(got):.{digits}f}{unit} ± {std:.{digits}f}{unit}{reached}{each}"


def report(data: dict) -> str:
    """The table (one row per variant, mean ± std over seeds, per-seed values of the step counts), the runs and the
    machine."""
    rows = []
    for variant in data["variants"]:
        mine = [r for r in data["runs"] if r["variant"] == variant]
        rows.append([
            variant, f"`{json.dumps(mine[0]['env_kwargs'])}`", str(len(mine)),
            fmt([r["steps_to_0.9"] for r in mine], 0, 1e3, "k", per_seed=True),
            fmt([r["time_to_0.9_s"] for r in mine], 1, unit=" s"),
            fmt([r["final_success"] for r in mine], 2),
            fmt([r["solved_length"] for r in mine], 1),
        ])  # fmt: skip
    header = ["variant", "env kwargs", "seeds", "env steps to eval success ≥ 0.9 (per seed)",
              "loop time to it", f"eval success at {data['total_timesteps'] // 1000}k",
              "solved-episode length (control steps)"]  # fmt: skip
    return "\n".join([
        f"ppo_continuous.py with the PushCubeRL config, {data['total_timesteps']:,} env steps, an evaluation every "
        f"{data['eval_freq']} iterations; the variant's env kwargs in the training and the eval envs; eager "
        f"(`--compile off`), one run at a time, one thread. Loop time: `global_step / charts/SPS` at that "
        f"evaluation (start-up excluded, evaluations included). Solved-episode length: `(L - (1 - s) T) / s` from "
        f"the last evaluation's mean length L and success s (a failed episode lasts T). Finished "
        f"{data['finished']} after {data['total_wall_s']:.0f} s.",
        "",
        *record_lines(data["invocation"], data["machine"], data["load_avg_end"], data["git"]),
        *([f"- the runs from `{data['source']}`"] if data["source"] else []),
        "",
        md_table(header, rows),
        "",
        "Runs:",
        "",
        *(f"- `{r['command']}`" for r in data["runs"]),
    ])  # fmt: skip


def main(args: Args) -> None:
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"error: --variants takes {', '.join(VARIANTS)}, got {', '.join(unknown)}")
    data = {"invocation": invocation(__file__, sys.argv[1:]), "variants": list(args.variants),
            "total_timesteps": args.total_timesteps, "eval_freq": args.eval_freq, "source": args.source,
            "machine": machine_info(), "git": git_info(), "runs": []}  # fmt: skip
    start = time.time()
    for variant in args.variants:
        for seed in args.seeds:
            record = run_one(args, variant, seed)
            print(json.dumps({k: v for k, v in record.items() if k != "versions"}), flush=True)
            data["runs"].append(record)
    data.update(total_wall_s=round(time.time() - start, 1), finished=time.strftime("%Y-%m-%d %H:%M"),
                load_avg_end=machine_info()["load_avg_1_5_15"])  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.json").write_text(json.dumps(data, indent=1) + "\n")
    text = report(data)
    (out / "report.md").write_text(f"# PushCubeRL variants: how fast PPO learns each\n\n{text}\n")
    run_git = [r["versions"] or {"git_sha": None, "git_dirty": None} for r in data["runs"]]
    provenance.record(out, data["invocation"], [r["command"] for r in data["runs"]], data["machine"], data["git"],
                      run_git)  # fmt: skip
    print(text)


if __name__ == "__main__":
    main(tyro.cli(Args))
