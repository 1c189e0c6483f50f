"""What RL adds to a pretrained VLA where imitation runs out: a pretrained base, K demonstrations per task of a task
the pretraining held out, no expert to ask (docs/VLA.md).

    uv run --extra vla python -m benchmarks.experiments.vla_fewshot                   # the grid, the goal's cells first
    uv run --extra vla python -m benchmarks.experiments.vla_fewshot --obs-modes proprio+rgb --ks 1 --seeds 1 2 3 4
    uv run --extra vla python -m benchmarks.experiments.vla_fewshot --report-only     # the report from what is finished

In `--runs-dir` (default runs/vla_fewshot), one process at a time (`OMP_NUM_THREADS=1`), each run's CPU seconds
(`os.wait4`) and wall seconds recorded in `<name>.time.json` (a finished run is not run again):
0. `pretrain/`: `examples/hf_vla/pretrain.py` (once: every cell starts from it). Held out of its corpus: the target
   tasks and every held-out paraphrase.
1. `<mode>/demos_s<s>.pt`: `demos.py --per-task 10 --seed s`: the scripted expert on the target, PushCubeLangRL's
   diagonal tasks forward_right and back_left (`demos.TARGET_ENV`), through the pretraining's camera window.
2. `<mode>/k<K>/start_s<s>/`: `fewshot.py --base pretrain/<layout> --k K`: LoRA on the first K demonstrations of
   each task, with its augmentation (the start).
3. From that start, each `--rows` entry: `grpo` and `ppo` (RL on a 0/1 success reward, `--timesteps` env steps);
   `sft`, the control: `fewshot.py --start`, the same demonstrations and augmentation trained on for the mean CPU
   time of the seed's grpo and ppo runs; `dagger`, the oracle (an upper bound, not a control): `dagger.py`, the
   scripted expert labelling the learner's states, for the same CPU time.
4. `<mode>/k<K>/final_eval_s<s>.json`: the start and every row's final policy on the same `--final-eval-episodes`
   episodes of the target (one env per episode, reset from a seed no run draws from), with the training
   instructions and with held-out paraphrases: paired differences, 95% t-intervals over seeds.

Cells run in `--ks` x `--obs-modes` order (K = 1 on proprio+rgb, the goal's cell, first), seed by seed. Written to
`--out` (default docs/results/vla-fewshot-cpu/): `report.md` (the pretraining, one table per cell, every seed, the
minutes, what was not run and the commands that run it), `vla_fewshot.png` (success per cell), `curves.png` (the
RL runs' evaluations and the pretraining's), `runs.json`, `provenance.json`; and its section of docs/benchmarks.md.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

from benchmarks.common import (
    REPO,
    RESULTS_DIR,
    RESULTS_MD,
    describe_machine,
    git_info,
    machine_info,
    md_table,
    read_scalars,
    save_runs,
    shell_command,
    write_section,
)
from benchmarks.experiments import vla_runs
from benchmarks.suite import provenance, rlstats
from examples.hf_vla.demos import TARGET_ENV

LAYOUT = {"proprio+rgb": "proprio_rgb", "state+rgb": "state_rgb"}  # the pretraining output each mode starts from
ROWS = {"grpo": ("GRPO", "grpo_vla"), "ppo": ("PPO", "ppo_vla"), "sft": ("SFT continued (control)", None),
        "dagger": ("DAgger, scripted expert (oracle)", None)}  # fmt: skip
LABEL = {"start": "few-shot start (SFT)", **{row: label for row, (label, _) in ROWS.items()}}
CONTROL = "sft"


@dataclass
class Args:
    seeds: tuple[int, ...] = (1, 2, 3, 4)
    """seeds: of the demonstrations, the few-shot start and every run from it (the pretrained base is one)"""
    obs_modes: tuple[str, ...] = ("proprio+rgb", "state+rgb")
    """observation modes (keys of LAYOUT)"""
    ks: tuple[int, ...] = (1, 10)
    """demonstrations per task"""
    rows: tuple[str, ...] = tuple(ROWS)
    """the runs from each start (keys of ROWS)"""
    runs_dir: str = "runs/vla_fewshot"
    """where the pretraining, demonstrations, starts and runs go"""
    out: str | None = None
    """where report.md, the plots and runs.json go (None: docs/results/vla-fewshot-cpu, with its docs/benchmarks.md
    section)"""
    pretrain_flags: tuple[str, ...] = ("--eval-every", "2500")
    """flags of pretrain.py besides --out"""
    per_task: int = 10
    """demonstrations recorded per task (the largest K)"""
    fewshot_steps: int = 400
    """Adam steps of the few-shot start"""
    timesteps: int = 64_000
    """env steps of each RL run"""
    final_eval_episodes: int = 256
    """episodes of each paired final evaluation (one per instruction set)"""
    report_only: bool = False
    """run nothing: read what is finished and write the report"""


def cell_dir(args: Args, mode: str, k: int) -> Path:
    return Path(args.runs_dir) / mode.replace("+", "_") / f"k{k}"


def target_env(mode: str) -> dict:
    return {**TARGET_ENV, "obs_mode": mode}


def pretrain_command(args: Args) -> list[str]:
    return [sys.executable, str(REPO / "examples/hf_vla/pretrain.py"), "--out", str(Path(args.runs_dir) / "pretrain"),
            *args.pretrain_flags]  # fmt: skip


def demos_file(args: Args, mode: str, seed: int) -> Path:
    return Path(args.runs_dir) / mode.replace("+", "_") / f"demos_s{seed}.pt"


def demos_command(args: Args, mode: str, seed: int) -> list[str]:
    return [sys.executable, str(REPO / "examples/hf_vla/demos.py"), "--out", str(demos_file(args, mode, seed)),
            "--per-task", str(args.per_task), "--seed", str(seed),
            "--env-kwargs", json.dumps(target_env(mode))]  # fmt: skip


def start_command(args: Args, mode: str, k: int, seed: int) -> list[str]:
    return [sys.executable, str(REPO / "examples/hf_vla/fewshot.py"),
            "--base", str(Path(args.runs_dir) / "pretrain" / LAYOUT[mode]),
            "--demos", str(demos_file(args, mode, seed)),
            "--k", str(k), "--seed", str(seed), "--steps", str(args.fewshot_steps),
            "--out", str(cell_dir(args, mode, k) / f"start_s{seed}"), "--eval-episodes", "256",
            "--eval-every", "100"]  # fmt: skip


def row_command(args: Args, mode: str, k: int, row: str, seed: int, minutes: float | None = None) -> list[str]:
    cell, start = cell_dir(args, mode, k), str(cell_dir(args, mode, k) / f"start_s{seed}")
    out = str(cell / f"{row}_s{seed}")
    budget = "<the seed's mean RL CPU minutes>" if minutes is None else f"{minutes:.3f}"
    if row == "sft":
        return [sys.executable, str(REPO / "examples/hf_vla/fewshot.py"), "--start", start, "--out", out,
                "--cpu-minutes", budget, "--seed", str(seed), "--eval-episodes", "256",
                "--eval-every", "1000"]  # fmt: skip
    if row == "dagger":
        return [sys.executable, str(REPO / "examples/hf_vla/dagger.py"), "--model-path", start, "--out", out,
                "--cpu-minutes", budget, "--seed", str(seed)]  # fmt: skip
    trainer = ROWS[row][1]
    command = [
        sys.executable, str(REPO / f"cleanrl_embodied/{trainer}.py"), "--env-id", "PushCubeLangRL",
        "--env-kwargs", json.dumps({**target_env(mode), "reward_weights": vla_runs.SPARSE_REWARD}),
        "--policy-kwargs", json.dumps({"model_path": start}), "--action-head", "bins", "--action-bins", "16",
        "--num-envs", "128", "--num-minibatches", "4", "--update-epochs", "2", "--learning-rate", "3e-4",
        "--total-timesteps", str(args.timesteps), "--eval-freq", "2", "--num-eval-envs", "64",
        "--num-eval-episodes", "64", "--save-freq", "5", "--seed", str(seed), "--output-dir", out, "--exp-name", row,
        "--compile", "off",  # eager: --compile auto decides by timing an iteration (the load would change the numbers)
    ]  # fmt: skip
    if trainer == "grpo_vla":
        return command + ["--group-size", "8", "--advantage", "episode"]
    return command + ["--num-steps", "50", "--gamma", "0.99", "--gae-lambda", "0.95"]


def recorded(args: Args, name: str) -> dict | None:
    """The CPU and wall seconds and the command of a finished run (vla_runs.run's time file), or None."""
    return vla_runs.recorded(Path(args.runs_dir), name)


def run(args: Args, name: str, cmd: list[str]) -> dict:
    return vla_runs.run(Path(args.runs_dir), name, cmd)


def name(mode: str, k: int | None, what: str, seed: int | None = None) -> str:
    parts = [mode.replace("+", "_")] + ([f"k{k}"] if k is not None else []) + [what if seed is None else
                                                                                f"{what}_s{seed}"]  # fmt: skip
    return "/".join(parts)


def budget(args: Args, mode: str, k: int, seed: int) -> float:
    """The control's and the oracle's CPU minutes: the mean of the seed's grpo and ppo runs."""
    times = [recorded(args, name(mode, k, row, seed)) for row in ("grpo", "ppo")]
    if any(t is None for t in times):
        sys.exit(f"error: {mode} K={k} seed {seed}: the control's budget needs the grpo and ppo runs")
    return float(np.mean([t["cpu_s"] for t in times])) / 60


def run_all(args: Args) -> None:
    report_file = Path(args.runs_dir) / "pretrain" / "pretrain.json"
    if recorded(args, "pretrain") is None and report_file.is_file():  # pretrained by hand with pretrain_command
        cpu_s = json.loads(report_file.read_text())["cpu_s"]  # (its own process_time, which spans resumes)
        record = {
            "cpu_s": cpu_s,
            "wall_s": None,
            "command": shell_command(pretrain_command(args)),
            "from": "pretrain.json",
        }
        vla_runs.time_file(Path(args.runs_dir), "pretrain").write_text(json.dumps(record, indent=1) + "\n")
    if recorded(args, "pretrain") is None:
        run(args, "pretrain", pretrain_command(args))
    for k in args.ks:
        for mode in args.obs_modes:
            for seed in args.seeds:
                if recorded(args, name(mode, None, "demos", seed)) is None:
                    run(args, name(mode, None, "demos", seed), demos_command(args, mode, seed))
                if recorded(args, name(mode, k, "start", seed)) is None:
                    run(args, name(mode, k, "start", seed), start_command(args, mode, k, seed))
                for row in [r for r in ("grpo", "ppo") if r in args.rows] + [r for r in ("sft", "dagger")
                                                                              if r in args.rows]:  # fmt: skip
                    if recorded(args, name(mode, k, row, seed)) is None:
                        minutes = budget(args, mode, k, seed) if row in ("sft", "dagger") else None
                        run(args, name(mode, k, row, seed), row_command(args, mode, k, row, seed, minutes))
                final_eval(args, mode, k, seed)


def run_dir(args: Args, mode: str, k: int, row: str, seed: int) -> Path | None:
    """A row's output: the model directory (sft, dagger) or the RL run directory with a summary.json."""
    base = cell_dir(args, mode, k) / f"{row}_s{seed}"
    if row in ("sft", "dagger"):
        return base if (base / "model.safetensors").is_file() else None
    done = sorted(base.glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
    return done[-1].parent if done else None


def paired_env(args: Args, mode: str, seed: int, instructions: str):
    """The envs of the paired final evaluation of seed ``seed`` (one per episode) and their reset seed, from a stream
    no run draws from (vla_runs.py's): every policy plays the same starts and tasks."""
    from cleanrl_embodied.shared.envs import make_env

    reset_seed = int(np.random.SeedSequence(seed, spawn_key=(vla_runs.FINAL_EVAL_KEY,)).generate_state(1)[0] >> 2)
    options = {**target_env(mode), "reward_weights": vla_runs.SPARSE_REWARD, "instructions": instructions}
    return make_env("PushCubeLangRL", num_envs=args.final_eval_episodes, seed=reset_seed, **options), reset_seed


def final_eval(args: Args, mode: str, k: int, seed: int) -> dict:
    """The start and every finished row (an RL run's ``checkpoints/last.pt`` on the start, a saved model) on the
    same episodes, training words and held-out paraphrases, deterministic; cached while the files are unchanged."""
    start = cell_dir(args, mode, k) / f"start_s{seed}"
    if not (start / "fewshot.json").is_file():
        return {}
    sources = {"start": (start, None)}
    for row in args.rows:
        found = run_dir(args, mode, k, row, seed)
        if found is not None and row in ("sft", "dagger"):
            sources[row] = (found, None)
        elif found is not None and (found / "checkpoints" / "last.pt").is_file():
            sources[row] = (start, found / "checkpoints" / "last.pt")
    files = {n: ckpt or d / "model.safetensors" for n, (d, ckpt) in sources.items()}
    key = {n: [str(f.resolve()), f.stat().st_mtime_ns] for n, f in files.items()}
    cache = cell_dir(args, mode, k) / f"final_eval_s{seed}.json"
    kept = json.loads(cache.read_text()) if cache.is_file() else {"key": {}, "results": {}}
    same = kept.get("episodes") == args.final_eval_episodes
    results = {n: r for n, r in kept["results"].items() if same and kept["key"].get(n) == key.get(n)}
    envs = {which: paired_env(args, mode, seed, which) for which in ("train", "heldout")}
    vla_runs.evaluate_sources(sources, envs, args.final_eval_episodes, results, f"{mode} K={k} seed {seed}")
    cache.write_text(json.dumps({"key": key, "episodes": args.final_eval_episodes, "results": results}, indent=1))
    return results


def collect(args: Args) -> dict:
    pretrain_file = Path(args.runs_dir) / "pretrain" / "pretrain.json"
    pretrained = json.loads(pretrain_file.read_text()) if pretrain_file.is_file() else None
    cells, missing = {}, []
    for k in args.ks:
        for mode in args.obs_modes:
            seeds = {}
            for seed in args.seeds:
                entry = {"final_eval": final_eval(args, mode, k, seed), "times": {}, "curves": {}}
                for what in ("start", *args.rows):
                    t = recorded(args, name(mode, k, what, seed))
                    if t is not None:
                        entry["times"][what] = {"cpu_s": t["cpu_s"], "wall_s": t["wall_s"]}
                    elif what == "start" or what in args.rows:
                        missing.append((mode, k, seed, what))
                for row in [r for r in args.rows if ROWS[r][1]]:
                    found = run_dir(args, mode, k, row, seed)
                    if found is not None:
                        steps, values = read_scalars(found).get("eval/success_rate", ([], []))
                        entry["curves"][row] = {"steps": steps, "success": values}
                for what in ("start", "sft"):  # the few-shot SFT's success against its Adam steps
                    file = cell_dir(args, mode, k) / f"{what}_s{seed}" / "fewshot.json"
                    if file.is_file():
                        points = [c for c in json.loads(file.read_text())["curve"] if "success_rate" in c]
                        entry["curves"][what] = {"steps": [c["step"] for c in points],
                                                 "success": [c["success_rate"] for c in points]}  # fmt: skip
                if entry["final_eval"]:
                    seeds[str(seed)] = entry
            cells[f"{mode} K={k}"] = {"mode": mode, "k": k, "seeds": seeds}

    commits: dict[str, dict | None] = {}  # command -> the commit its run started from (None: not recorded)

    def command(run_name: str, cmd: list[str]) -> str:  # as it was run (the budget filled in), or will be
        done = recorded(args, run_name)
        text = done["command"] if done else shell_command(cmd, {"OMP_NUM_THREADS": "1"})
        commits.setdefault(text, done.get("git") if done else {"not_run": True})
        return text

    commands = [command("pretrain", pretrain_command(args))]
    for k in args.ks:
        for mode in args.obs_modes:
            for seed in args.seeds:
                commands.append(command(name(mode, None, "demos", seed), demos_command(args, mode, seed)))
                commands.append(command(name(mode, k, "start", seed), start_command(args, mode, k, seed)))
                commands += [command(name(mode, k, r, seed), row_command(args, mode, k, r, seed)) for r in args.rows]
    pretrain_time = recorded(args, "pretrain")
    commands = list(dict.fromkeys(commands))
    return {"cells": cells, "pretrain": pretrained, "pretrain_time": pretrain_time, "missing": missing,
            "commands": commands, "commits": [commits[c] for c in commands], "rows": list(args.rows),
            "timesteps": args.timesteps, "final_eval_episodes": args.final_eval_episodes,
            "fewshot_steps": args.fewshot_steps}  # fmt: skip


def success(entry: dict, source: str, which: str) -> float:
    return entry["final_eval"][source][which]["success_rate"]


def cell_table(data: dict, cell: dict) -> str:
    seeds, rows = cell["seeds"], []
    for source in ["start", *data["rows"]]:
        have = [e for e in seeds.values() if source in e["final_eval"]]
        if not have:
            continue
        train, held = [success(e, source, "train") for e in have], [success(e, source, "heldout") for e in have]
        gain = [success(e, source, "train") - success(e, "start", "train") for e in have]
        both = [e for e in have if CONTROL in e["final_eval"]]
        vs = [success(e, source, "train") - success(e, CONTROL, "train") for e in both]
        held_vs = [success(e, source, "heldout") - success(e, CONTROL, "heldout") for e in both]
        cpu = [e["times"][source]["cpu_s"] / 60 for e in have if source in e["times"]]
        plain = source in ("start", CONTROL)
        rows.append([LABEL[source], str(len(have)), vla_runs.interval(train), vla_runs.interval(held),
                     "" if source == "start" else vla_runs.signed(gain), "" if plain else vla_runs.signed(vs),
                     "" if plain else vla_runs.signed(held_vs), f"{np.mean(cpu):.1f}" if cpu else ""])  # fmt: skip
    header = ["policy", "seeds", "success, training instructions", "success, held-out paraphrases",
              "gain over the start", "difference to the control", "the same, held out", "CPU min per seed"]  # fmt: skip
    return md_table(header, rows)


def goal_line(data: dict) -> str:
    """The experiment's goal: RL beats the control by >= 0.15 at K = 1 on proprio+rgb with the interval above 0, and the
    pretrained base lifts the proprio+rgb start above 0.2."""
    cell = data["cells"].get("proprio+rgb K=1")
    if not cell or not cell["seeds"]:
        return "The goal's cell (proprio+rgb, K = 1) has not run."
    seeds = cell["seeds"].values()
    start = np.mean([success(e, "start", "train") for e in seeds])
    parts = [f"start {start:.2f} ({'above' if start > 0.2 else 'not above'} 0.2)"]
    for row in ("grpo", "ppo"):
        both = [e for e in seeds if row in e["final_eval"] and CONTROL in e["final_eval"]]
        if len(both) < 2:
            continue
        diff = [success(e, row, "train") - success(e, CONTROL, "train") for e in both]
        mean, half = rlstats.t_interval(diff)
        met = mean >= 0.15 and mean - half > 0
        parts.append(f"{ROWS[row][0]} - control {mean:+.2f} ± {half:.2f} ({'met' if met else 'not met'})")
    return "Goal (proprio+rgb, K = 1): " + "; ".join(parts) + "."


def report(data: dict) -> str:
    lines, n = [], data["final_eval_episodes"]
    pre, pre_time = data["pretrain"], data["pretrain_time"]
    if pre:
        cases = ("pretraining_tasks", "pretraining_tasks_heldout_phrasings", "heldout_tasks")
        rows = [[layout] + [f"{pre['eval'][layout][c]['success_rate']:.2f}" for c in cases] for layout in pre["eval"]]
        lines += ["Pretraining (`pretrain.py`, one run; each saved layout reloaded and evaluated deterministically on "
                  f"{pre['args']['eval_episodes']} episodes per column): {pre['samples']:,} corpus samples "
                  f"(+{pre['wrist_samples']:,} with the wrist camera), {pre['phrasings']} phrasings of "
                  f"{len(pre['args']['tasks'])} tasks, {pre['parameters']:,} parameters, "
                  f"{pre['args']['steps']:,} steps, {pre['cpu_s'] / 60:.1f} CPU min"
                  + (f" ({pre_time['cpu_s'] / 60:.1f} for the whole process)" if pre_time else "") + ".", "",
                  md_table(["layout", "pretraining tasks", "the same, held-out paraphrases",
                            "held-out tasks (zero-shot)"], rows), ""]  # fmt: skip
    lines += [goal_line(data), ""]
    for label, cell in data["cells"].items():
        if not cell["seeds"]:
            continue
        seed_rows = []
        for seed, entry in cell["seeds"].items():
            cells = [f"{success(entry, s, 'train'):.2f} / {success(entry, s, 'heldout'):.2f}"
                     if s in entry["final_eval"] else "" for s in ["start", *data["rows"]]]  # fmt: skip
            times = [f"{entry['times'][s]['cpu_s'] / 60:.1f}" if s in entry["times"] else ""
                     for s in ["start", *data["rows"]]]  # fmt: skip
            seed_rows.append([seed, *cells, " / ".join(t for t in times if t)])
        lines += [f"### {label}", "", cell_table(data, cell), "",
                  "Every seed, success with the training instructions / held-out paraphrases, and CPU minutes "
                  "(start, then the rows):", "",
                  md_table(["seed", *[LABEL[s] for s in ["start", *data["rows"]]], "CPU min"], seed_rows),
                  ""]  # fmt: skip
    lines += [
        f"Mean ± 95% t-interval over seeds; each seed's start and every row from it on the same {n} episodes of the "
        "target (one env per episode, reset from a seed no run draws from; deterministic actions, argmax bins; "
        f"a {n}-episode success rate has a standard error of at most {0.5 / np.sqrt(n):.3f}). Gains and "
        "differences are paired per seed. The target: PushCubeLangRL's diagonal tasks forward_right and back_left "
        "(pushes the pretraining never saw), through the pretraining's camera window; held out: their paraphrases "
        f"(`instructions=\"heldout\"`). RL: {data['timesteps']:,} env steps, 128 envs, learning rate 3e-4, 0/1 "
        f"success reward. Few-shot start: {data['fewshot_steps']} Adam steps of LoRA on the K demonstrations "
        "per task with fewshot.py's augmentation; the control continues it on the same demonstrations with the "
        "same augmentation, and the oracle runs DAgger with the scripted expert, each for the mean CPU time of the "
        "seed's GRPO and PPO runs.", ""]  # fmt: skip
    if data["missing"]:
        lines += ["Not run: " + "; ".join(f"{m} K={k} seed {s} {w}" for m, k, s, w in data["missing"]) + ". The "
                  "commands below run them (`benchmarks/experiments/vla_fewshot.py` with the same flags does it in "
                  "order).",
                  ""]  # fmt: skip
    machine = machine_info()
    lines += [f"Machine: {describe_machine(machine)}; git {git_info().get('git_sha') or '?'}.", "",
              "Commands (the control's and the oracle's --cpu-minutes as run: the mean of the seed's GRPO and PPO "
              "CPU minutes):", "", "```bash", *data["commands"], "```"]  # fmt: skip
    return "\n".join(lines)


def plot(data: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in data["cells"].values() if c["seeds"]]
    if cells:
        fig, axes = plt.subplots(1, len(cells), figsize=(4.5 * len(cells), 4), squeeze=False)
        for ax, cell in zip(axes[0], cells):
            sources = ["start", *[r for r in data["rows"] if any(r in e["final_eval"] for e in cell["seeds"].values())]]
            for j, (which, color) in enumerate((("train", "C0"), ("heldout", "C1"))):
                for i, source in enumerate(sources):
                    values = [success(e, source, which) for e in cell["seeds"].values() if source in e["final_eval"]]
                    x = i + (j - 0.5) * 0.3
                    label = {"train": "training words", "heldout": "held-out paraphrases"}[which] if i == 0 else None
                    ax.bar(x, np.mean(values), width=0.28, color=color, alpha=0.5, label=label)
                    ax.plot([x] * len(values), values, "o", color=color, ms=3)
            ax.set_xticks(range(len(sources)), [LABEL[s] for s in sources], fontsize=6, rotation=25)
            ax.set_title(f"{cell['mode']}, K = {cell['k']}", fontsize=9)
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3, axis="y")
        axes[0][0].set_ylabel("success on the target (paired episodes)")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "vla_fewshot.png", dpi=110)
        plt.close(fig)
    fig, axes = plt.subplots(2, len(cells) + 1, figsize=(4 * (len(cells) + 1), 7), squeeze=False)
    if data["pretrain"]:
        curve = [c for c in data["pretrain"]["curve"] if "success_rate" in c]
        ax = axes[0][0]
        ax.plot([c["step"] for c in curve], [c["success_rate"] for c in curve], "o-")
        ax.set_title("pretraining: proprio_rgb on its tasks", fontsize=9)
        ax.set_xlabel("step")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(3, 3))
        ax.set_ylim(0, 1)
    axes[1][0].axis("off")
    for ax, cell in zip(axes[1][1:], cells):  # SFT: the start's steps, then the control's after them
        for i, entry in enumerate(cell["seeds"].values()):
            start, more = entry["curves"].get("start"), entry["curves"].get("sft")
            steps = (start["steps"] if start else []) + [s + (start["steps"][-1] if start and start["steps"] else 0)
                                                        for s in (more["steps"] if more else [])]  # fmt: skip
            values = (start["success"] if start else []) + (more["success"] if more else [])
            ax.plot(steps, values, "o-", color="C0", alpha=0.6, ms=3, label="few-shot SFT" if not i else None)
        ax.set_title(f"SFT on the K demos, {cell['mode']}, K = {cell['k']}", fontsize=9)
        ax.set_xlabel("Adam steps (the start's, then the control's)")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
    for ax, cell in zip(axes[0][1:], cells):
        for row, color in (("grpo", "C2"), ("ppo", "C3")):
            for i, entry in enumerate(cell["seeds"].values()):
                curve = entry["curves"].get(row)
                if curve:
                    ax.plot(
                        curve["steps"], curve["success"], color=color, alpha=0.6, label=ROWS[row][0] if not i else None
                    )
        ax.set_title(f"RL eval success, {cell['mode']}, K = {cell['k']}", fontsize=9)
        ax.set_xlabel("env steps")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    plt.close(fig)


def main(args: Args) -> None:
    bad = [r for r in args.rows if r not in ROWS] + [m for m in args.obs_modes if m not in LAYOUT]
    if bad:
        sys.exit(f"error: --rows / --obs-modes {' '.join(bad)}: the rows are {', '.join(ROWS)}, the modes "
                 f"{', '.join(LAYOUT)}")  # fmt: skip
    if any(k < 1 or k > args.per_task for k in args.ks):
        sys.exit(f"error: --ks {' '.join(map(str, args.ks))}: each K must be 1..--per-task ({args.per_task})")
    git = git_info()  # the code the runs start with
    if not args.report_only:
        run_all(args)
    data = collect(args)
    out = Path(args.out) if args.out else RESULTS_DIR / "vla-fewshot-cpu"
    save_runs(data, out)
    plot(data, out)
    body = report(data)
    title = "VLA: what RL adds to a pretrained base from few demonstrations"
    (out / "report.md").write_text(f"# {title} ({time.strftime('%Y-%m-%d')})\n\n{body}\n")
    # each run's commit: its time file's (None where it has none; a run not yet run, which holds no numbers: git's)
    run_git = [git if (c or {}).get("not_run") else c for c in data["commits"]]
    command = shell_command(["uv", "run", "--extra", "vla", "python", *sys.argv])
    provenance.record(out, command, data["commands"], machine_info(), git, run_git)
    if out.resolve().parent == RESULTS_DIR.resolve():
        write_section(RESULTS_MD, out.name, f"## {title}, CPU\n\n{body}\n\n![few-shot VLA](results/{out.name}/"
                      f"vla_fewshot.png)\n\n![curves](results/{out.name}/curves.png)")  # fmt: skip
    print(body)


if __name__ == "__main__":
    main(tyro.cli(Args))
