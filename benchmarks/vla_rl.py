"""RL fine-tuning of the VLA (examples/hf_vla) from a behaviour-cloned start: per seed, behaviour cloning on
DART demonstrations, then GRPO and PPO from the saved model; a table and curves of deterministic eval success.

    uv run --extra vla python benchmarks/vla_rl.py                         # seeds 1-4, about 45 min each (2-core CPU)
    uv run --extra vla python benchmarks/vla_rl.py --seeds 1 --parallel 2  # a seed's GRPO and PPO side by side: ~25 min
    uv run --extra vla python benchmarks/vla_rl.py --report-only           # redraw from the finished runs

Per seed s, in `--runs-dir`:
1. `bc_s<s>/`: `examples/hf_vla/bc.py --seed s --demo-noise 0.3` (the env runs the expert's action plus noise, the
   labels stay clean, so the demonstrations show recoveries; docs/VLA.md says why that matters for RL), bins 16,
   2000 steps: a start at 0.1-0.55 deterministic eval success (seeds 1-4);
2. `grpo_s<s>/`: grpo_vla.py from it with a 0/1 success reward, 16 groups of 8, `--advantage episode`, 512k env steps;
3. `ppo_s<s>/`: ppo_vla.py from it with the same reward, its value head on the VLA's hidden states, 512k;
4. `final_eval_s<s>.json`: the start and both final policies evaluated on the same 512 episodes (`final_eval`): the
   gains the table reports are differences on identical starts and instructions.

Written to `--out` (default docs/results/vla-rl-cpu/, or vla-rl-cpu-filter-groups/ with `--grpo-filter-groups`):
`report.md` (the table, the machine, the exact commands), `vla_rl.png` (in-run eval success vs env steps, each
seed and the mean, the paired evaluation as circles), `runs.json` (what they are drawn from). The report also
replaces its section of docs/benchmarks.md.
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
from types import SimpleNamespace

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
FINAL_EVAL_KEY = 1000  # the paired final evaluation's seed stream: a spawn key no shared.runtime.STREAMS entry uses
START_RANGE = (0.2, 0.6)  # the partial starts the result is about: RL should raise them by 0.30 or to 0.9


@dataclass
class Args:
    seeds: tuple[int, ...] = (1, 2, 3, 4)
    """seeds: of the demonstrations and behaviour cloning, and of the RL run from that start"""
    runs_dir: str = "runs/vla_rl"
    """where the behaviour-cloned models and the run directories go"""
    out: str | None = None
    """where report.md, vla_rl.png and runs.json go (None: docs/results/vla-rl-cpu, or vla-rl-cpu-filter-groups
    with --grpo-filter-groups); a directory of docs/results also gets its section of docs/benchmarks.md"""
    grpo_timesteps: int = 512_000
    """env steps of each GRPO run"""
    grpo_filter_groups: bool = False
    """GRPO with --filter-groups (groups whose members all got the same return leave the update): the ablation on
    docs/VLA.md, run into its own --runs-dir (a runs dir holds one setting)"""
    ppo_timesteps: int = 512_000
    """env steps of each PPO run"""
    bc_steps: int = 2000
    """Adam steps of behaviour cloning"""
    demo_noise: float = 0.3
    """DART noise of the demonstrations (bc.py --demo-noise)"""
    parallel: int = 1
    """RL runs at a time (each pinned to one thread); 2 on a 2-core machine runs a seed's GRPO and PPO together"""
    final_eval_episodes: int = 512
    """episodes of the paired final evaluation: the start and each algorithm's final policy on the same starts"""
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
        return [sys.executable, str(REPO / "cleanrl_embodied/grpo_vla.py"), *common, "--group-size", "8",
                "--advantage", "episode"] + ["--filter-groups"] * args.grpo_filter_groups  # fmt: skip
    return [sys.executable, str(REPO / "cleanrl_embodied/ppo_vla.py"), *common, "--num-steps", "50",
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


def paired_env(seed: int, episodes: int):
    """The envs of seed ``seed``'s paired final evaluation and the seed each evaluation resets them with: one env
    per episode, seeded from a stream no run draws from; every reset with that seed gives the same starts and
    instructions, whatever was played before."""
    from cleanrl_embodied.shared.envs import make_env

    reset_seed = int(np.random.SeedSequence(seed, spawn_key=(FINAL_EVAL_KEY,)).generate_state(1)[0] >> 2)
    return make_env("PushCubeLangRL", num_envs=episodes, seed=reset_seed, **SPARSE), reset_seed


def final_eval(args: Args, seed: int) -> dict:
    """Paired evaluation of seed ``seed``'s behaviour-cloned start and each algorithm's final checkpoint
    (``checkpoints/last.pt``): one env per episode (``--final-eval-episodes`` envs), reset from one seed of a
    stream neither training nor the in-run evaluations draw from, so every policy plays the same starts and
    instructions once and the gains are differences on the same episodes. Deterministic actions (argmax bins),
    as in the runs. Written to ``--runs-dir/final_eval_s<seed>.json`` and reused while the runs are unchanged."""
    import torch

    from cleanrl_embodied.shared.checkpoints import load_model_state
    from examples.hf_vla import make_policy
    from examples.hf_vla.bc import evaluate_policy

    bc_dir = Path(args.runs_dir, f"bc_s{seed}")
    checkpoints = {"bc": None}
    for algo in ALGOS:
        found = run_dir(args, algo, seed)
        if found is not None and (found / "checkpoints" / "last.pt").is_file():
            checkpoints[algo] = found / "checkpoints" / "last.pt"
    files = {name: path or bc_dir / "model.safetensors" for name, path in checkpoints.items()}
    key = {name: [str(f.resolve()), f.stat().st_mtime_ns] for name, f in files.items()}
    key["episodes"] = args.final_eval_episodes
    cache = Path(args.runs_dir, f"final_eval_s{seed}.json")
    kept = json.loads(cache.read_text()) if cache.is_file() else {}
    if kept.get("key") == key:
        return kept["results"]
    n = args.final_eval_episodes
    env, reset_seed = paired_env(seed, n)
    head = SimpleNamespace(action_head="bins", action_bins=16, action_chunk=1)
    results = {}
    for name, path in checkpoints.items():
        policy = make_policy(env.single_observation_space, env.single_action_space, head, model_path=str(bc_dir))
        if path is not None:
            try:  # weights_only: a checkpoint is data; a pickle that would run code is refused, not run
                ckpt = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as e:  # noqa: BLE001 - any unreadable file is refused the same way
                sys.exit(f"error: {path}: not a readable checkpoint ({type(e).__name__}); it is not evaluated")
            load_model_state(policy, ckpt, "checkpoint", str(path))
        with torch.no_grad():
            results[name] = evaluate_policy(policy.eval(), env, n, reset_seed)  # bc.py's: argmax bins
        print(f"seed {seed} {name}: success {results[name]['success_rate']:.3f} on {n} paired episodes")
    env.close()
    cache.write_text(json.dumps({"key": key, "results": results}, indent=1) + "\n")
    return results


def collect(args: Args) -> dict:
    """What the report is drawn from, per seed: the start's success (bc.py's own evaluation), each algorithm's
    in-run eval curve and minutes, and the paired final evaluation (:func:`final_eval`)."""
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
        entry["final_eval"] = final_eval(args, seed)
        seeds[str(seed)] = entry
    return {
        "seeds": seeds,
        "final_eval_episodes": args.final_eval_episodes,
        "commands": {str(s): commands(args, s) for s in args.seeds},
    }


def commands(args: Args, seed: int) -> list[str]:
    env = {"OMP_NUM_THREADS": "1"}
    return [shell_command(bc_command(args, seed), env)] + [
        shell_command(rl_command(args, algo, seed), env) for algo in ALGOS
    ]


def reached(start: float, final: float) -> bool:
    """The issue's bar: a gain of 0.30 or more, or a final success of 0.9 or more."""
    return final - start >= 0.30 - 1e-9 or final >= 0.9


def report(data: dict) -> str:
    seeds, n = data["seeds"], data["final_eval_episodes"]
    rows, task_rows, run_rows, gains = [], [], [], {a: [] for a in ALGOS}
    low, high = START_RANGE
    for seed, entry in seeds.items():
        paired = entry["final_eval"]
        start = paired["bc"]["success_rate"]
        in_range = low <= start <= high
        row = [seed, f"{start:.2f}" + ("" if in_range else " (out of range)")]
        run_row = [seed, f"{entry['bc_success']:.2f}", f"{entry['bc_minutes']:.0f}"]
        for algo in ALGOS:
            if algo not in paired:
                row += ["", ""]
                run_row += ["", "", "", ""]
                continue
            final = paired[algo]["success_rate"]
            if in_range:
                gains[algo].append((start, final))
            row += [f"{final:.2f}", f"{final - start:+.2f}" + ("" if reached(start, final) else " (short)")]
            curve = entry[algo]["success"]
            run_row += [f"{curve[-1]:.2f}", f"{np.mean(curve[-3:]):.2f}", f"{max(curve):.2f}",
                        f"{entry[algo]['minutes']:.0f}"]  # fmt: skip
        rows.append(row)
        run_rows.append(run_row)
        tasks = [k.split("/", 1)[1] for k in paired["bc"] if k.startswith("success_rate/")]
        for name, result in paired.items():
            task_rows.append([seed, name.upper() if name in ALGOS else "BC start"] +
                             [f"{result[f'success_rate/{t}']:.2f}" for t in tasks])  # fmt: skip
    run_header = ["seed", "BC (bc.py)", "BC min"]
    run_header += [f"{a.upper()} {what}" for a in ALGOS for what in ("last", "last 3", "best", "min")]
    lines = [
        md_table(["seed", "BC start", "GRPO final", "GRPO gain", "PPO final", "PPO gain"], rows),
        "",
    ]
    for algo in ALGOS:
        if gains[algo]:
            g = np.array(gains[algo])
            gain = g[:, 1] - g[:, 0]
            count = sum(reached(a, b) for a, b in g)
            lines.append(
                f"- {algo.upper()}: gain {gain.mean():+.2f} ± {gain.std():.2f} over the {len(g)} seed(s) starting at "
                f"{low:.0%}-{high:.0%}; {count} of {len(g)} gained 0.30 or more or reached 0.9"
            )
    machine = machine_info()
    lines += [
        "",
        f"Success: deterministic (argmax bins), the behaviour-cloned start and each run's final policy (the "
        f"checkpoint at the end, the learning rate annealed to 0) on the same {n} episodes: one env per episode, "
        f"reset from one seed no run draws from, so each policy plays the same starts and instructions (a "
        f"{n}-episode success rate has a standard error of at most {0.5 / np.sqrt(n):.3f}).",
        "",
        "Success per task on those episodes:",
        "",
        md_table(["seed", "policy", *tasks], task_rows),
        "",
        "The runs: bc.py's own evaluation of the start (256 episodes), the in-run evaluations (128 fresh episodes "
        "every 4 iterations, 25,600 env steps: the last one, the mean of the last three, the best) and minutes (each "
        "run's own loop, one thread, two runs sharing the 2 cores):",
        "",
        md_table(run_header, run_rows),
        "",
        f"Machine: {describe_machine(machine)}; git {git_info().get('git_sha') or '?'}.",
        "",
        "Commands, per seed (then `benchmarks/vla_rl.py --report-only` for the paired evaluation and this report):",
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
                paired = entry["final_eval"]
                if algo not in paired:  # a run without its last checkpoint
                    continue
                ax.plot([0, c["steps"][-1]], [paired["bc"]["success_rate"], paired[algo]["success_rate"]], "o",
                        color=color, mfc="none")  # fmt: skip
        if curves and all(c["steps"] == curves[0]["steps"] for c in curves):
            mean = np.mean([[s, *c["success"]] for s, c in zip(starts, curves)], axis=0)
            ax.plot([0, *curves[0]["steps"]], mean, color="k", lw=2, label="mean")
        ax.set_title(f"{algo.upper()} from the behaviour-cloned VLA", fontsize=10)
        ax.plot([], [], "o", color="gray", mfc="none", label=f"paired eval, {data['final_eval_episodes']} episodes")
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
    out = Path(args.out) if args.out else RESULTS_DIR / ("vla-rl-cpu" + "-filter-groups" * args.grpo_filter_groups)
    title = "VLA RL from behaviour cloning" + ", GRPO with --filter-groups" * args.grpo_filter_groups
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(data, out / "vla_rl.png")
    body = report(data)
    (out / "report.md").write_text(f"# {title} ({time.strftime('%Y-%m-%d')})\n\n{body}\n")
    if out.resolve().parent == RESULTS_DIR.resolve():
        write_section(RESULTS_MD, out.name, f"## {title} (CPU)\n\n{body}\n\n![VLA RL](results/{out.name}/vla_rl.png)")
    print(body)


if __name__ == "__main__":
    main(tyro.cli(Args))
