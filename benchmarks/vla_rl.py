"""RL fine-tuning of the VLA (examples/hf_vla) from a behaviour-cloned start: per seed, behaviour cloning on
DART demonstrations, then GRPO and PPO from the saved model; a table and curves of deterministic eval success.

    uv run --extra vla python benchmarks/vla_rl.py                         # seeds 1-4, about 35 min each (2-core CPU)
    uv run --extra vla python benchmarks/vla_rl.py --seeds 1 --parallel 2  # a seed's GRPO and PPO side by side: ~25 min
    uv run --extra vla python benchmarks/vla_rl.py --report-only           # redraw from the finished runs

Per seed s, in `--runs-dir`:
1. `bc_s<s>/`: `examples/hf_vla/bc.py --seed s --demo-noise 0.3` (the env runs the expert's action plus noise, the
   labels stay clean, so the demonstrations show recoveries; docs/VLA.md says why that matters for RL), bins 16,
   2000 steps: a start at about 0.3 deterministic eval success;
2. `grpo_s<s>/`: grpo.py from it with a 0/1 success reward, 16 groups of 8, `--advantage episode`, 512k env steps;
3. `ppo_s<s>/`: ppo_continuous.py from it with the same reward, its value head on the VLA's hidden states, 256k.

Written to `--out` (default docs/results/vla-rl-cpu/): `report.md` (the table, the machine, the exact commands),
`vla_rl.png` (eval success vs env steps, each seed and the mean), `runs.json` (what they are drawn from). The
report also replaces the `vla-rl-cpu` section of docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro
from benchlib import (
    REPO,
    RESULTS_DIR,
    RESULTS_MD,
    describe_machine,
    git_info,
    machine_info,
    md_table,
    read_scalars,
    shell_command,
    write_section,
)

OBS = {"obs_mode": "state+rgb", "image_size": 64, "action_mode": "ee_delta_pos"}
SPARSE = {**OBS, "reward_weights": {"reach": 0, "place": 0, "time": 0, "success": 1}}  # 1 on success, else 0
ALGOS = ("grpo", "ppo")
START_RANGE = (0.2, 0.6)  # the partial starts the result is about: RL should raise them by 0.30 or to 0.9


@dataclass
class Args:
    seeds: tuple[int, ...] = (1, 2, 3, 4)
    """seeds: of the demonstrations and behaviour cloning, and of the RL run from that start"""
    runs_dir: str = "runs/vla_rl"
    """where the behaviour-cloned models and the run directories go"""
    out: str = str(RESULTS_DIR / "vla-rl-cpu")
    """where report.md, vla_rl.png and runs.json go"""
    grpo_timesteps: int = 512_000
    """env steps of each GRPO run (without a critic it learns less per sample than PPO: twice PPO's budget)"""
    ppo_timesteps: int = 256_000
    """env steps of each PPO run"""
    bc_steps: int = 2000
    """Adam steps of behaviour cloning"""
    demo_noise: float = 0.3
    """DART noise of the demonstrations (bc.py --demo-noise)"""
    parallel: int = 1
    """RL runs at a time (each pinned to one thread); 2 on a 2-core machine runs a seed's GRPO and PPO together"""
    report_only: bool = False
    """read the finished runs in --runs-dir and write the report; run nothing"""


def bc_command(args: Args, seed: int) -> list[str]:
    return [
        sys.executable, str(REPO / "examples/hf_vla/bc.py"), "--out", str(Path(args.runs_dir) / f"bc_s{seed}"),
        "--env-kwargs", json.dumps(OBS), "--action-head", "bins", "--action-bins", "16",
        "--steps", str(args.bc_steps), "--seed", str(seed), "--demo-noise", str(args.demo_noise),
        "--eval-episodes", "256",
    ]  # fmt: skip


def rl_command(args: Args, algo: str, seed: int) -> list[str]:
    common = [
        "--env-id", "PushCubeLangRL", "--env-kwargs", json.dumps(SPARSE),
        "--policy", "examples.hf_vla:make_policy",
        "--policy-kwargs", json.dumps({"model_path": str(Path(args.runs_dir) / f"bc_s{seed}")}),
        "--action-head", "bins", "--action-bins", "16", "--num-envs", "128",
        "--num-minibatches", "4", "--update-epochs", "2", "--learning-rate", "3e-4",
        "--total-timesteps", str(args.grpo_timesteps if algo == "grpo" else args.ppo_timesteps), "--eval-freq", "4",
        "--num-eval-envs", "64", "--num-eval-episodes", "128", "--save-freq", "10", "--seed", str(seed),
        "--output-dir", str(Path(args.runs_dir) / f"{algo}_s{seed}"), "--exp-name", algo,
    ]  # fmt: skip
    if algo == "grpo":
        return [sys.executable, str(REPO / "cleanrl_embodied/grpo.py"), *common, "--group-size", "8",
                "--advantage", "episode"]  # fmt: skip
    return [sys.executable, str(REPO / "cleanrl_embodied/ppo_continuous.py"), *common, "--num-steps", "50",
            "--gamma", "0.99", "--gae-lambda", "0.95"]  # fmt: skip


def run(cmd: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": os.environ.get("WANDB_MODE", "disabled")}
    with log.open("w") as f:
        code = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if code:
        sys.exit(f"error: {shell_command(cmd)} exited {code}; its output is in {log}")


def run_dir(args: Args, algo: str, seed: int) -> Path | None:
    """The newest run directory with a summary.json under --runs-dir/<algo>_s<seed>/ (None if none finished)."""
    done = sorted(Path(args.runs_dir, f"{algo}_s{seed}").glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
    return done[-1].parent if done else None


def collect(args: Args) -> dict:
    """What the report is drawn from: per seed, the start's success and each algorithm's eval curve and time."""
    seeds = {}
    for seed in args.seeds:
        bc_file = Path(args.runs_dir, f"bc_s{seed}", "bc_eval.json")
        if not bc_file.is_file():
            continue
        bc = json.loads(bc_file.read_text())
        entry = {"bc_success": bc["eval"]["success_rate"], "bc_minutes": bc["wall_s"] / 60}
        for algo in ALGOS:
            found = run_dir(args, algo, seed)
            if found is None:
                continue
            steps, values = read_scalars(found)["eval/success_rate"]
            summary = json.loads((found / "summary.json").read_text())
            entry[algo] = {"steps": steps, "success": values, "minutes": summary["wall_time_s"] / 60}
        seeds[str(seed)] = entry
    return {"seeds": seeds, "commands": {str(s): commands(args, s) for s in args.seeds}}


def commands(args: Args, seed: int) -> list[str]:
    env = {"OMP_NUM_THREADS": "1"}
    return [shell_command(bc_command(args, seed), env)] + [
        shell_command(rl_command(args, algo, seed), env) for algo in ALGOS
    ]


def report(data: dict) -> str:
    seeds = data["seeds"]
    rows, gains = [], {a: [] for a in ALGOS}
    for seed, entry in seeds.items():
        start = entry["bc_success"]
        in_range = START_RANGE[0] <= start <= START_RANGE[1]
        row = [seed, f"{start:.2f}" + ("" if in_range else " (out of range)")]
        for algo in ALGOS:
            if algo in entry:
                curve = entry[algo]["success"]
                final, last3 = curve[-1], float(np.mean(curve[-3:]))
                if in_range:
                    gains[algo].append((final - start, final, last3 - start, last3))
                row += [f"{final:.2f} ({final - start:+.2f})", f"{last3:.2f} ({last3 - start:+.2f})",
                        f"{max(curve):.2f}", f"{entry[algo]['minutes']:.0f}"]  # fmt: skip
            else:
                row += ["", "", "", ""]
        rows.append(row)
    header = ["seed", "BC start"] + [
        f"{algo.upper()} {what}" for algo in ALGOS for what in ("final (gain)", "last 3 (gain)", "best", "min")
    ]
    lines = [md_table(header, rows), ""]
    low, high = START_RANGE
    for algo in ALGOS:
        if gains[algo]:
            g = np.array(gains[algo])
            for name, gain, value in (("final", g[:, 0], g[:, 1]), ("mean of the last 3", g[:, 2], g[:, 3])):
                reached = int(((gain >= 0.30) | (value >= 0.9)).sum())
                lines.append(
                    f"- {algo.upper()}, {name} evaluation(s), the {len(g)} seed(s) starting at {low:.0%}-{high:.0%}: "
                    f"gain {gain.mean():+.2f} ± {gain.std():.2f}; {reached} of {len(g)} gained 0.30 or more or "
                    "reached 0.9"
                )
    machine = machine_info()
    lines += [
        "",
        "Final: the last evaluation (at the end of the run, the learning rate annealed to 0); last 3: the mean of "
        "the last three, less noisy; best: the highest over the run. Eval success: "
        "deterministic (argmax bins), 128 fresh episodes every 4 iterations (25,600 env steps); "
        "the BC start on 256 episodes (bc.py). Minutes: each run's own loop, one thread, two runs sharing the 2 cores. "
        f"Machine: {describe_machine(machine)}; git {git_info().get('git_sha') or '?'}.",
        "",
        "Commands, per seed:",
        "",
        "```bash",
        *[c for cmds in data["commands"].values() for c in cmds],
        "```",
    ]
    return "\n".join(lines)


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ALGOS), figsize=(11, 4), sharey=True)
    for ax, algo in zip(axes, ALGOS):
        curves = [e[algo] for e in data["seeds"].values() if algo in e]
        starts = [e["bc_success"] for e in data["seeds"].values() if algo in e]
        for (seed, entry), color in zip(data["seeds"].items(), ("C0", "C1", "C2", "C3", "C4")):
            if algo in entry:
                c = entry[algo]
                ax.plot([0, *c["steps"]], [entry["bc_success"], *c["success"]], color=color, alpha=0.5,
                        label=f"seed {seed}")  # fmt: skip
        if curves and all(c["steps"] == curves[0]["steps"] for c in curves):
            mean = np.mean([[s, *c["success"]] for s, c in zip(starts, curves)], axis=0)
            ax.plot([0, *curves[0]["steps"]], mean, color="k", lw=2, label="mean")
        ax.set_title(f"{algo.upper()} from the behaviour-cloned VLA")
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("eval success (deterministic)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: Args) -> None:
    if not args.report_only:
        for seed in args.seeds:
            run(bc_command(args, seed), Path(args.runs_dir) / f"bc_s{seed}.log")
            with ThreadPoolExecutor(max_workers=args.parallel) as pool:
                jobs = [
                    pool.submit(run, rl_command(args, algo, seed), Path(args.runs_dir) / f"{algo}_s{seed}.log")
                    for algo in ALGOS
                ]
                for job in jobs:
                    job.result()
    data = collect(args)
    if not data["seeds"]:
        sys.exit(f"error: --runs-dir {args.runs_dir}: no finished behaviour cloning (bc_s<seed>/bc_eval.json)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(data, out / "vla_rl.png")
    body = report(data)
    (out / "report.md").write_text(f"# VLA RL from behaviour cloning ({time.strftime('%Y-%m-%d')})\n\n{body}\n")
    write_section(RESULTS_MD, "vla-rl-cpu", f"## VLA RL from behaviour cloning (CPU)\n\n{body}\n\n"
                  "![VLA RL](results/vla-rl-cpu/vla_rl.png)")  # fmt: skip
    print(body)


if __name__ == "__main__":
    main(tyro.cli(Args))
