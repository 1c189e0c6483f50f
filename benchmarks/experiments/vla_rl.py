"""What RL adds to a behaviour-cloned VLA (examples/hf_vla), against more imitation for the same compute.

    uv run --extra vla python -m benchmarks.experiments.vla_rl                                    # state+rgb, seeds 1-4
    uv run --extra vla python -m benchmarks.experiments.vla_rl --obs-mode proprio+rgb --rows grpo ppo dagger
    uv run --extra vla python -m benchmarks.experiments.vla_rl --rows grpo_temp --report-only    # redraw (or add a row)

Per seed s, in `--runs-dir` (default runs/vla_rl/<obs mode>):
1. `bc_s<s>/`: `examples/hf_vla/bc.py --seed s --demo-noise 0.3` (DART demonstrations of the scripted expert; the
   labels stay clean), bins 16, 2000 steps: the start, whatever success it has (every start is reported; the
   report marks which are in the 20-60% band of partial starts);
2. one run per `--rows` entry from that start (`ROWS`): GRPO and PPO on a 0/1 success reward, their recipe variants
   (dynamic sampling, critic warm-up, and the ablations of one knob each), `--timesteps` env steps each; and
   `dagger`, the control: `examples/hf_vla/dagger.py` for the mean CPU time of the seed's `grpo` and `ppo` runs
   (or `--dagger-cpu-minutes`), i.e. more imitation of the expert for the compute RL spent;
3. `final_eval_s<s>.json`: the start and every row's final policy on the same `--final-eval-episodes` episodes,
   once with the training instructions and once with held-out paraphrases (PushCubeLangRL's
   `instructions="heldout"`: same starts and tasks, words no training run used): paired differences.

Each run's CPU seconds (its process, one thread: `OMP_NUM_THREADS=1`) and wall seconds are recorded in
`<row>_s<s>.time.json`; `--parallel 2` runs two at once on a 2-core machine. A finished run (its time file
exists) is not run again, so the experiment can be run in parts.

Written to `--out` (default docs/results/vla-rl-control-cpu/ or vla-rl-control-proprio-cpu/): `report.md` (the
tables: mean and 95% t-interval over seeds of success, of the gain over the start and of the difference to the
control; every seed's numbers; minutes; the exact commands), `vla_rl.png`, `runs.json`. The report also replaces
its section of docs/benchmarks.md.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import tyro

from benchmarks.common import (
    REPO,
    RESULTS_DIR,
    RESULTS_MD,
    describe_machine,
    git_info,
    invocation,
    machine_info,
    md_table,
    read_scalars,
    save_runs,
    shell_command,
    write_section,
)
from benchmarks.experiments.vla_runs import (
    FINAL_EVAL_KEY,
    SPARSE_REWARD,
    evaluate_sources,
    interval,
    recorded,
    run,
    signed,
)
from benchmarks.suite import provenance

START_BAND = (0.2, 0.6)  # the partial starts the question is about

# row -> (label, trainer, its extra flags); "dagger" is the control (examples/hf_vla/dagger.py)
ROWS = {
    "dagger": ("DAgger, same CPU time (control)", None, []),
    "grpo": ("GRPO", "grpo_vla", []),
    "grpo_dyn": ("GRPO, dynamic sampling", "grpo_vla", ["--min-informative-groups", "16", "--max-draws", "3"]),
    "ppo": ("PPO", "ppo_vla", []),
    "ppo_warm": ("PPO, critic warm-up", "ppo_vla", ["--critic-warmup-iterations", "2"]),
    "grpo_filter": ("GRPO, filtered groups (no resampling)", "grpo_vla", ["--filter-groups"]),
    "grpo_temp": ("GRPO, temperature 1.6", "grpo_vla", ["--temperature", "1.6"]),
    "grpo_cliphigh": ("GRPO, clip-higher 0.28", "grpo_vla", ["--clip-coef-high", "0.28"]),
    "grpo_token": ("GRPO, per-token loss", "grpo_vla", ["--loss-agg", "token"]),
    "ppo_temp": ("PPO, temperature 1.6", "ppo_vla", ["--temperature", "1.6"]),
}
DEFAULT_ROWS = ("grpo", "grpo_dyn", "ppo", "ppo_warm", "dagger")


@dataclass
class Args:
    seeds: tuple[int, ...] = (1, 2, 3, 4)
    """seeds: of the demonstrations and behaviour cloning, and of every run from that start"""
    obs_mode: Literal["state+rgb", "proprio+rgb"] = "state+rgb"
    """what the VLA sees besides the instruction: the full state and the image, or the robot's own state and the
    image (the cube's position only in the image)"""
    rows: tuple[str, ...] = DEFAULT_ROWS
    """the runs from each start (keys of ROWS); `dagger` is the imitation control"""
    runs_dir: str | None = None
    """where the starts and the runs go (None: runs/vla_rl/<obs mode>)"""
    out: str | None = None
    """where report.md, vla_rl.png and runs.json go (None: docs/results/vla-rl-control-cpu, or
    vla-rl-control-proprio-cpu for proprio+rgb); a directory of docs/results also gets its docs/benchmarks.md
    section"""
    timesteps: int = 128_000
    """env steps of each RL run (dynamic sampling's extra draws count)"""
    bc_steps: int = 2000
    """Adam steps of behaviour cloning"""
    demo_noise: float = 0.3
    """DART noise of the demonstrations (bc.py --demo-noise)"""
    dagger_cpu_minutes: float | None = None
    """the control's budget (None: the mean CPU minutes of the seed's grpo and ppo runs)"""
    parallel: int = 2
    """runs at a time (each one thread)"""
    final_eval_episodes: int = 256
    """episodes of each paired final evaluation (one per instruction set)"""
    report_only: bool = False
    """run nothing: read what is finished in --runs-dir and write the report"""


def env_options(args: Args) -> dict:
    return {"obs_mode": args.obs_mode, "image_size": 64, "action_mode": "ee_delta_pos"}


def runs_dir(args: Args) -> Path:
    return Path(args.runs_dir or f"runs/vla_rl/{args.obs_mode.replace('+', '_')}")


def bc_command(args: Args, seed: int) -> list[str]:
    return [
        sys.executable, str(REPO / "examples/hf_vla/bc.py"), "--out", str(runs_dir(args) / f"bc_s{seed}"),
        "--env-kwargs", json.dumps(env_options(args)), "--action-head", "bins", "--action-bins", "16",
        "--steps", str(args.bc_steps), "--seed", str(seed), "--demo-noise", str(args.demo_noise),
        "--eval-episodes", "256",
    ]  # fmt: skip


def row_command(args: Args, row: str, seed: int, dagger_minutes: float | None = None) -> list[str]:
    out = runs_dir(args) / f"{row}_s{seed}"
    if row == "dagger":
        minutes = "<the seed's mean RL CPU minutes>" if dagger_minutes is None else f"{dagger_minutes:.3f}"
        return [sys.executable, str(REPO / "examples/hf_vla/dagger.py"), "--model-path",
                str(runs_dir(args) / f"bc_s{seed}"), "--out", str(out), "--cpu-minutes", minutes,
                "--seed", str(seed)]  # fmt: skip
    _, trainer, extra = ROWS[row]
    command = [
        sys.executable, str(REPO / f"cleanrl_embodied/{trainer}.py"), "--env-id", "PushCubeLangRL",
        "--env-kwargs", json.dumps({**env_options(args), "reward_weights": SPARSE_REWARD}),
        "--policy-kwargs", json.dumps({"model_path": str(runs_dir(args) / f"bc_s{seed}")}),
        "--action-head", "bins", "--action-bins", "16", "--num-envs", "128",
        "--num-minibatches", "4", "--update-epochs", "2", "--learning-rate", "3e-4",
        "--total-timesteps", str(args.timesteps), "--eval-freq", "5", "--num-eval-envs", "64",
        "--num-eval-episodes", "64", "--save-freq", "10", "--seed", str(seed), "--output-dir", str(out),
        "--exp-name", row,
        "--compile", "off",  # eager: --compile auto decides by timing an iteration (the load would change the numbers)
    ]  # fmt: skip
    if trainer == "grpo_vla":
        command += ["--group-size", "8", "--advantage", "episode"]
    else:
        command += ["--num-steps", "50", "--gamma", "0.99", "--gae-lambda", "0.95"]
    return command + extra


def dagger_budget(args: Args, seed: int) -> float:
    if args.dagger_cpu_minutes is not None:
        return args.dagger_cpu_minutes
    times = [recorded(runs_dir(args), f"{row}_s{seed}") for row in ("grpo", "ppo")]
    if any(t is None for t in times):
        sys.exit(f"error: seed {seed}: the control's budget needs the grpo and ppo runs (or --dagger-cpu-minutes)")
    return float(np.mean([t["cpu_s"] for t in times])) / 60


def run_all(args: Args) -> None:
    """Every start and run not yet recorded, then each seed's paired evaluation, ``--parallel`` at a time: the
    starts first, then per seed its runs, its control (after its grpo and ppo runs) and its evaluation (after all
    of them, in this process), so the results come seed by seed."""
    jobs: dict[str, Future] = {}

    def job(name: str, needs: list[str], work) -> None:
        waits = [jobs[n] for n in needs if n in jobs]  # (queued before this job: a worker never waits on a later one)

        def go():
            for w in waits:
                w.result()
            return work()

        jobs[name] = pool.submit(go)

    def command_job(name: str, needs: list[str], make_cmd) -> None:
        if recorded(runs_dir(args), name) is None:
            job(name, needs, lambda: run(runs_dir(args), name, make_cmd()))

    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        for seed in args.seeds:
            command_job(f"bc_s{seed}", [], lambda s=seed: bc_command(args, s))
        for seed in args.seeds:
            rl_rows = [f"{r}_s{seed}" for r in args.rows if r != "dagger"]
            for row in [r for r in args.rows if r != "dagger"]:
                command_job(f"{row}_s{seed}", [f"bc_s{seed}"], lambda r=row, s=seed: row_command(args, r, s))
            if "dagger" in args.rows:
                needs = [f"{r}_s{seed}" for r in ("grpo", "ppo")] if args.dagger_cpu_minutes is None else []
                command_job(f"dagger_s{seed}", [f"bc_s{seed}", *needs],
                            lambda s=seed: row_command(args, "dagger", s, dagger_budget(args, s)))  # fmt: skip
            job(f"eval_s{seed}", [f"bc_s{seed}", *rl_rows, f"dagger_s{seed}"], lambda s=seed: final_eval(args, s))
        for future in jobs.values():
            future.result()


def run_dir(args: Args, row: str, seed: int) -> Path | None:
    """A row's output: the dagger directory, or the newest RL run directory with a summary.json."""
    base = runs_dir(args) / f"{row}_s{seed}"
    if row == "dagger":
        return base if (base / "dagger.json").is_file() else None
    done = sorted(base.glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
    return done[-1].parent if done else None


def paired_env(args: Args, seed: int, instructions: str):
    """The envs of seed ``seed``'s paired final evaluation (one per episode) and their reset seed, drawn from a
    stream no run uses: every policy plays the same starts and tasks; ``instructions`` picks the words."""
    from cleanrl_embodied.shared.envs import make_env

    reset_seed = int(np.random.SeedSequence(seed, spawn_key=(FINAL_EVAL_KEY,)).generate_state(1)[0] >> 2)
    options = {**env_options(args), "reward_weights": SPARSE_REWARD, "instructions": instructions}
    return make_env("PushCubeLangRL", num_envs=args.final_eval_episodes, seed=reset_seed, **options), reset_seed


def final_eval(args: Args, seed: int) -> dict:
    """The start and every finished row's final policy (an RL run's ``checkpoints/last.pt``, the control's saved
    model) on the same episodes, with the training instructions and with the held-out paraphrases; deterministic
    actions (argmax bins). Cached in ``final_eval_s<seed>.json`` while the files are unchanged."""
    bc_dir = runs_dir(args) / f"bc_s{seed}"
    sources = {"bc": (bc_dir, None)}
    for row in args.rows:
        found = run_dir(args, row, seed)
        if found is not None and row == "dagger":
            sources[row] = (found, None)
        elif found is not None and (found / "checkpoints" / "last.pt").is_file():
            sources[row] = (bc_dir, found / "checkpoints" / "last.pt")
    files = {n: ckpt or d / "model.safetensors" for n, (d, ckpt) in sources.items()}
    key = {n: [str(f.resolve()), f.stat().st_mtime_ns] for n, f in files.items()}
    key["episodes"] = args.final_eval_episodes
    cache = runs_dir(args) / f"final_eval_s{seed}.json"
    kept = json.loads(cache.read_text()) if cache.is_file() else {"results": {}}
    old_key = kept.get("key", {}) if kept.get("key", {}).get("episodes") == key["episodes"] else {}
    # a policy's result is kept while its file is unchanged; rows not asked for this time keep theirs too
    results = {n: r for n, r in kept["results"].items() if n in old_key and old_key[n] == key.get(n, old_key[n])}
    key = {**{n: k for n, k in old_key.items() if n in results}, **key}
    envs = {which: paired_env(args, seed, which) for which in ("train", "heldout")}
    evaluate_sources(sources, envs, args.final_eval_episodes, results, f"seed {seed}")
    cache.write_text(json.dumps({"key": key, "results": results}, indent=1) + "\n")
    return results


def collect(args: Args) -> dict:
    seeds = {}
    for seed in args.seeds:
        bc_file = runs_dir(args) / f"bc_s{seed}" / "bc_eval.json"
        if not bc_file.is_file():
            continue
        entry = {"bc_success": json.loads(bc_file.read_text())["eval"]["success_rate"], "times": {}, "curves": {}}
        for name in ["bc", *args.rows]:
            t = recorded(runs_dir(args), f"{name}_s{seed}")
            if t is not None:
                entry["times"][name] = {"cpu_s": t["cpu_s"], "wall_s": t["wall_s"]}
        for row in args.rows:
            found = run_dir(args, row, seed)
            if found is None:
                continue
            if row == "dagger":
                d = json.loads((found / "dagger.json").read_text())
                entry["curves"][row] = {"env_steps": d["env_steps"], "rounds": d["rounds"], "updates": d["updates"]}
                continue
            steps, values = read_scalars(found)["eval/success_rate"]
            env_steps = json.loads((found / "summary.json").read_text())["global_step"]
            entry["curves"][row] = {"steps": steps, "success": values, "env_steps": env_steps}
        entry["final_eval"] = final_eval(args, seed)
        seeds[str(seed)] = entry

    def command(name: str, cmd: list[str]) -> str:  # as it was run (the control's budget filled in), or will be
        done = recorded(runs_dir(args), name)
        return done["command"] if done else shell_command(cmd, {"OMP_NUM_THREADS": "1"})

    commands = {
        str(s): [command(f"bc_s{s}", bc_command(args, s))]
        + [command(f"{r}_s{s}", row_command(args, r, s)) for r in args.rows]
        for s in args.seeds
    }
    return {"obs_mode": args.obs_mode, "rows": list(args.rows), "timesteps": args.timesteps, "seeds": seeds,
            "final_eval_episodes": args.final_eval_episodes, "commands": commands}  # fmt: skip


def report(data: dict) -> str:
    seeds, n = data["seeds"], data["final_eval_episodes"]
    names = ["bc", *[r for r in data["rows"] if any(r in e["final_eval"] for e in seeds.values())]]
    label = {"bc": "behaviour-cloned start", **{r: ROWS[r][0] for r in ROWS}}

    def success(entry, name, which):
        return entry["final_eval"][name][which]["success_rate"]

    rows = []
    for name in names:
        have = [e for e in seeds.values() if name in e["final_eval"]]
        train = [success(e, name, "train") for e in have]
        held = [success(e, name, "heldout") for e in have]
        gain = [success(e, name, "train") - success(e, "bc", "train") for e in have]
        control = [e for e in have if "dagger" in e["final_eval"]]
        vs_control = [success(e, name, "train") - success(e, "dagger", "train") for e in control]
        held_vs_control = [success(e, name, "heldout") - success(e, "dagger", "heldout") for e in control]
        cpu = [e["times"][name]["cpu_s"] / 60 for e in have if name in e["times"]]
        rows.append([label[name], str(len(have)), interval(train), interval(held),
                     "" if name == "bc" else signed(gain),
                     "" if name in ("bc", "dagger") else signed(vs_control),
                     "" if name in ("bc", "dagger") else signed(held_vs_control),
                     f"{np.mean(cpu):.1f}" if cpu else ""])  # fmt: skip
    header = ["policy", "seeds", "success, training instructions", "success, held-out paraphrases",
              "gain over the start", "difference to the control", "the same, held out", "CPU min per seed"]  # fmt: skip
    low, high = START_BAND
    seed_rows = []
    for seed, entry in seeds.items():
        start = success(entry, "bc", "train")
        band = "in the band" if low <= start <= high else "outside the band"
        seed_rows.append([seed, f"{start:.2f} ({band})"] + [
            f"{success(entry, r, 'train'):.2f} / {success(entry, r, 'heldout'):.2f}" if r in entry["final_eval"]
            else "" for r in names[1:]])  # fmt: skip
    time_rows = []
    for seed, entry in seeds.items():
        cells = []
        for name in names:
            t = entry["times"].get(name)
            steps = entry["curves"].get(name, {}).get("env_steps")
            cell = f"{t['cpu_s'] / 60:.1f} / {t['wall_s'] / 60:.1f}" if t else ""
            cells.append(cell + (f" ({steps / 1000:.0f}k)" if steps else ""))
        time_rows.append([seed, *cells])
    machine = machine_info()
    return "\n".join([
        md_table(header, rows),
        "",
        f"Mean ± 95% t-interval over seeds (each seed's start and every row from it on the same {n} episodes: "
        f"one env per episode, reset from a seed no run draws from; deterministic actions, argmax bins; a "
        f"{n}-episode success rate has a standard error of at most {0.5 / np.sqrt(n):.3f}). The gain and the "
        "difference to the control are paired per seed. Held-out: the same starts and tasks with paraphrases no "
        "run trained on (PushCubeLangRL `instructions=\"heldout\"`).",
        "",
        f"Observation: `{data['obs_mode']}`. RL runs: {data['timesteps']:,} env steps each (dynamic sampling's "
        "redraws count), 128 envs, learning rate 3e-4, 0/1 success reward. The control: DAgger from the same "
        "start: its rounds (rollouts of the learner labelled by the expert, and updates) get the mean CPU time of "
        "the seed's GRPO and PPO runs (whole processes, their in-run evaluations included); its process also "
        "re-records the start's demonstrations and evaluates once, which the budget does not charge.",
        "",
        "Every seed, success with the training instructions / held-out paraphrases:",
        "",
        md_table(["seed", "start (train)", *[label[r] for r in names[1:]]], seed_rows),
        "",
        "CPU / wall minutes of each run (one thread, two runs sharing the 2 cores) and its env steps:",
        "",
        md_table(["seed", *[label[r] for r in names]], time_rows),
        "",
        f"Machine: {describe_machine(machine)}; git {git_info().get('git_sha') or '?'}.",
        "",
        "Commands, per seed (the control's --cpu-minutes is the mean of the seed's GRPO and PPO CPU minutes; "
        "then `benchmarks/experiments/vla_rl.py --report-only` with the same --obs-mode and --rows):",
        "",
        "```bash",
        *[c for cmds in data["commands"].values() for c in cmds],
        "```",
    ])  # fmt: skip


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = data["seeds"]
    names = ["bc", *[r for r in data["rows"] if any(r in e["final_eval"] for e in seeds.values())]]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names)), 4))
    legend = {"train": "training instructions", "heldout": "held-out paraphrases"}
    for k, (which, color) in enumerate((("train", "C0"), ("heldout", "C1"))):
        for i, name in enumerate(names):
            values = [e["final_eval"][name][which]["success_rate"] for e in seeds.values() if name in e["final_eval"]]
            x = i + (k - 0.5) * 0.3
            ax.bar(x, np.mean(values), width=0.28, color=color, alpha=0.5, label=legend[which] if i == 0 else None)
            ax.plot([x] * len(values), values, "o", color=color, ms=4)
    ax.set_xticks(range(len(names)), ["BC start" if n == "bc" else ROWS[n][0] for n in names], fontsize=7,
                  rotation=20)  # fmt: skip
    ax.set_ylabel("success (deterministic, paired episodes)")
    ax.set_title(f"VLA on PushCubeLangRL ({data['obs_mode']}): RL vs the imitation control; dots: seeds", fontsize=9)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: Args) -> None:
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        sys.exit(f"error: --rows {' '.join(unknown)}: not a row; the rows are {', '.join(ROWS)}")
    if not args.report_only:
        run_all(args)
    data = collect(args)
    if not data["seeds"]:
        sys.exit(f"error: {runs_dir(args)}: no finished behaviour cloning (bc_s<seed>/bc_eval.json)")
    name = "vla-rl-control-cpu" if args.obs_mode == "state+rgb" else "vla-rl-control-proprio-cpu"
    out = Path(args.out) if args.out else RESULTS_DIR / name
    title = f"VLA: RL against an imitation control ({args.obs_mode})"
    save_runs(data, out)
    plot(data, out / "vla_rl.png")
    body = report(data)
    (out / "report.md").write_text(f"# {title} ({time.strftime('%Y-%m-%d')})\n\n{body}\n")
    if out.resolve().parent == RESULTS_DIR.resolve():
        write_section(RESULTS_MD, out.name, f"## {title}, CPU\n\n{body}\n\n![VLA RL](results/{out.name}/vla_rl.png)")
    names = [n for s in args.seeds for n in (f"bc_s{s}", *(f"{r}_s{s}" for r in args.rows))]  # as data["commands"]
    run_git = [(recorded(runs_dir(args), n) or {}).get("git") for n in names]  # each run's commit, as it recorded
    runs = [c for commands in data["commands"].values() for c in commands]
    provenance.record(out, invocation(__file__, sys.argv[1:]), runs, machine_info(), git_info(), run_git)
    print(body)


if __name__ == "__main__":
    main(tyro.cli(Args))
