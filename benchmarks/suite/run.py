"""Reproducibility suite: multi-seed runs of the trainers through their own CLIs, with curves and tables.

    uv run python -m benchmarks.suite.run --suite quick      # ~15 min, 2-core CPU: PPO, GRPO x PushCubeRL, Pendulum-v1
    uv run python -m benchmarks.suite.run --suite full      # the published set: every file in benchmarks/suite/configs/
    uv run python -m benchmarks.suite.run --suite full --tasks HalfCheetah-v5 --seeds 3 --name mujoco-cpu
    uv run python -m benchmarks.suite.run --suite quick --scripts grpo --extra="--learning-rate 3e-3"
    uv run python -m benchmarks.suite.run --suite quick --report-only    # redraw plots and tables from runs.json
    uv run python -m benchmarks.suite.run --suite quick --skip-done      # continue: finished runs are read, not re-run

Each (script, task, seed) runs `python cleanrl_embodied/<script>.py ...` in its own process, one after
another (threads pinned with OMP_NUM_THREADS), and is read back from its summary.json and TensorBoard
scalars. Written to `--out` (default `docs/results/<name>/`, `--name` by default `<suite>-<device>`):

- `<task>.png`: eval success (or return) vs env steps and vs wall time, mean over seeds with a 95%
  bootstrap band;
- `report.md`: per task and script, final eval success and return as mean ± std and IQM with a 95%
  stratified bootstrap CI (rliable's method, see rlstats.py), env steps and wall time until the eval
  metric first reaches the task's threshold, wall time and SPS; the machine, versions, git sha and the
  exact command of every run; the same text replaces the `<name>` section of docs/benchmarks.md;
- `runs.json`: everything the report is drawn from (curves included), so `--report-only` redraws it;
- `runs/`: the run directories themselves (TensorBoard, summary.json, last.pt, stdout.log; not committed).

Flags of a run, later ones replacing earlier ones: `--save-freq 0`, the device flag and on the CPU `--compile off`;
the file `benchmarks/suite/configs/<script>__<task>.txt` (see configs/README.md); the suite's overrides below (QUICK:
shorter budgets); `--extra`; then `--env-id`, `--seed`, `--output-dir`. `--budget-scale` multiplies
`--total-timesteps` at the end. A task is an env id, or an env id and a variant after "@" (`PushCubeRL@rgb`:
the same env with the options of its config file, judged like the env id).

Wall time of a curve point is the trainer's own loop time at that iteration (global_step / charts/SPS),
so it includes earlier evaluations and excludes start-up. On CPU with --torch-deterministic the same
command gives the same curves bit for bit; `--determinism-check` runs the first run twice and says so. That is
why the CPU runs are eager unless a config file or `--extra` names `--compile`: `--compile auto` decides from this
machine's record of earlier runs, so the same command could compile on one machine and not on another (or in the
first run of a configuration and not in the next), and compiled and eager code agree to float rounding only.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import tyro

from benchmarks.common import (
    CONFIG_DIR,
    REPO,
    RESULTS_DIR,
    RESULTS_MD,
    SCRIPTS_DIR,
    fail,
    get_flag,
    git_info,
    invocation,
    machine_info,
    md_table,
    merge_flags,
    package_versions,
    read_flags,
    read_scalars,
    record_lines,
    save_runs,
    shell_command,
    write_section,
)
from benchmarks.suite import provenance, rlstats
from benchmarks.suite.curves import (
    env_id,
    fmt_hits,
    plot_groups,
    read_curves,
    task_metric,
)

SCRIPTS = ("ppo_continuous", "grpo", "ppo_ddp")

# Suite -> (default number of seeds, {(script, task): flags replacing the config file's}).
# `full` runs every config file with its own budget.
QUICK = {
    ("ppo_continuous", "PushCubeRL"): "--total-timesteps 300000 --eval-freq 3",
    ("grpo", "PushCubeRL"): "--total-timesteps 384000 --eval-freq 2",
    ("ppo_continuous", "Pendulum-v1"): "--total-timesteps 150000 --eval-freq 5",
    ("grpo", "Pendulum-v1"): "--total-timesteps 288000 --eval-freq 3",
}
SMOKE = {
    ("ppo_continuous", "PushCubeRL"): "--total-timesteps 2048 --num-envs 64 --num-steps 8 --num-minibatches 2 "
    "--update-epochs 2 --eval-freq 1 --num-eval-envs 8 --num-eval-episodes 8 --hidden-sizes 32 32"
}
SUITES = {"smoke": (1, SMOKE), "quick": (5, QUICK), "full": (10, None)}

TRAIN_TAIL = 10  # training return of a run = mean of its last this many logged iterations (CleanRL's tables
# report training returns; ours add the deterministic eval)
TIMING_TAGS = ("charts/SPS",)  # the only scalars that depend on the clock, left out of the determinism check
COLORS = {"ppo_continuous": "tab:blue", "grpo": "tab:orange", "ppo_ddp": "tab:green"}


@dataclass
class Args:
    suite: Literal["smoke", "quick", "full"] = "quick"
    """smoke: 1 seed x PPO x PushCubeRL, a few iterations; quick: PPO and GRPO on PushCubeRL and Pendulum-v1,
    short budgets; full: every benchmarks/suite/configs file with its own budget"""
    seeds: int | None = None
    """number of seeds, 1..N (default: smoke 1, quick 5, full 10)"""
    scripts: tuple[str, ...] = ()
    """only these scripts (default: all of the suite)"""
    tasks: tuple[str, ...] = ()
    """only these tasks: env ids, or env id@variant (default: all of the suite)"""
    extra: str = ""
    """flags added to every run, with "=" and in quotes, e.g. --extra="--num-envs 512"; they replace the config's"""
    budget_scale: float = 1.0
    """multiply every run's --total-timesteps (e.g. 0.1 for a dry run of the full suite)"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: --cuda when a GPU is present, else --no-cuda (a config file's own --no-cuda still wins)"""
    threads: int = 1
    """OMP_NUM_THREADS of every run"""
    jobs: int = 1
    """runs at a time (each with --threads threads); above 1 the runs share the machine, so their wall times
    and SPS are those of a loaded machine (the report says so)"""
    ddp_nproc: int = 1
    """processes per ppo_ddp run: 1 runs the script directly (a world of one), more go through torchrun"""
    name: str | None = None
    """name of this set of runs: its output folder and its docs/benchmarks.md section (default <suite>-<device>; give
    one when --scripts/--tasks pick a part of a suite, or the part replaces the whole suite's report)"""
    out: str | None = None
    """output folder (default docs/results/<name>)"""
    results_md: str = str(RESULTS_MD)
    """markdown file whose '<name>' section is replaced by the report ('' leaves it alone)"""
    determinism_check: bool = True
    """run the first run a second time and compare all its scalars bit for bit (costs one more run)"""
    report_only: bool = False
    """don't run anything: redraw plots and tables from <out>/runs.json"""
    skip_done: bool = False
    """read the runs whose directory already holds a finished run (its summary.json) instead of running them again:
    an interrupted suite, or one built over several invocations, continues where it stopped"""


@dataclass
class RunSpec:
    script: str
    task: str
    seed: int
    flags: list[str]  # everything but --seed and --output-dir


# ---- planning ------------------------------------------------------------------------------------
def config_path(script: str, task: str) -> Path | None:
    path = CONFIG_DIR / f"{script}__{task}.txt"
    return path if path.is_file() else None


def config_pairs() -> list[tuple[str, str]]:
    """(script, task) of every config file <script>__<task>.txt."""
    return [tuple(path.stem.split("__", 1)) for path in sorted(CONFIG_DIR.glob("*__*.txt"))]


def suite_pairs(args: Args) -> dict[tuple[str, str], str]:
    _, overrides = SUITES[args.suite]
    pairs = overrides if overrides is not None else {pair: "" for pair in config_pairs()}
    available = ", ".join(f"{s}/{t}" for s, t in pairs)
    unknown = (set(args.scripts) - {s for s, _ in pairs}) | (set(args.tasks) - {t for _, t in pairs})
    chosen = {
        (s, t): o
        for (s, t), o in pairs.items()
        if (not args.scripts or s in args.scripts) and (not args.tasks or t in args.tasks)
    }
    if unknown or not chosen:
        fail(
            f"--scripts/--tasks: {', '.join(sorted(unknown)) or 'that combination'} is not in suite "
            f"{args.suite!r}, which has: {available}"
        )
    return chosen


def plan(args: Args, device: str) -> list[RunSpec]:
    num_seeds = args.seeds or SUITES[args.suite][0]
    if num_seeds < 1 or args.budget_scale <= 0 or args.threads < 1 or args.ddp_nproc < 1 or args.jobs < 1:
        fail("--seeds, --budget-scale, --threads, --ddp-nproc and --jobs must be positive")
    specs = []
    for (script, task), overrides in suite_pairs(args).items():
        path = config_path(script, task)
        if path is None:
            fail(f"no flags for {script} on {task}: add benchmarks/suite/configs/{script}__{task}.txt")
        config = read_flags(path)
        if get_flag(config, "--env-id") not in (None, [env_id(task)]):
            fail(f"{path} sets --env-id {get_flag(config, '--env-id')}, but its name says {env_id(task)}")
        base = ["--save-freq", "0", *(["--cuda"] if device == "cuda" else ["--no-cuda", "--compile", "off"])]
        flags = merge_flags(base, config, shlex.split(overrides), shlex.split(args.extra), ["--env-id", env_id(task)])
        flags = scale_budget(flags, args.budget_scale, path)
        specs += [RunSpec(script, task, seed, flags) for seed in range(1, num_seeds + 1)]
    return specs


def scale_budget(flags: list[str], scale: float, path: Path) -> list[str]:
    if scale == 1.0:
        return flags
    total = get_flag(flags, "--total-timesteps")
    if not total:
        fail(f"--budget-scale needs --total-timesteps in {path}")
    return merge_flags(flags, ["--total-timesteps", str(max(1, round(int(total[0]) * scale)))])


def command(spec: RunSpec, output_dir: Path, ddp_nproc: int) -> list[str]:
    launcher = [sys.executable]
    if spec.script == "ppo_ddp" and ddp_nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ddp_nproc)]
    return [
        *launcher,
        str(SCRIPTS_DIR / f"{spec.script}.py"),
        *merge_flags(spec.flags, ["--seed", str(spec.seed), "--output-dir", str(output_dir)]),
    ]


# ---- running and reading back -------------------------------------------------------------------
def launch(spec: RunSpec, output_dir: Path, args: Args) -> dict:
    """Run one (script, task, seed) in its own process; return its record for runs.json. With --skip-done, a run
    that already finished in `output_dir` is read back instead (its process time is then the loop's)."""
    env_vars = {"OMP_NUM_THREADS": str(args.threads)}
    cmd = command(spec, output_dir, args.ddp_nproc)
    done = list(output_dir.glob("*/summary.json")) if args.skip_done and output_dir.exists() else []
    start = time.time()
    if len(done) == 1:
        rc, process_wall_s = 0, json.loads(done[0].read_text())["wall_time_s"]
    else:
        if output_dir.exists():
            shutil.rmtree(output_dir)
        output_dir.mkdir(parents=True)
        with open(output_dir / "stdout.log", "w") as log:
            rc = subprocess.run(
                cmd, cwd=REPO, env={**os.environ, **env_vars}, stdout=log, stderr=subprocess.STDOUT
            ).returncode
        process_wall_s = time.time() - start
    record = {
        "script": spec.script,
        "task": spec.task,
        "seed": spec.seed,
        "command": shell_command(cmd, env_vars),
        "returncode": rc,
        "process_wall_s": round(process_wall_s, 2),
    }
    summaries = list(output_dir.glob("*/summary.json"))
    if rc != 0 or len(summaries) != 1:
        tail = (output_dir / "stdout.log").read_text().strip().splitlines()[-3:]
        return {**record, "returncode": rc or 1, "error": " / ".join(tail)}
    summary = json.loads(summaries[0].read_text())
    keep = ("global_step", "wall_time_s", "sps", "eval", "versions", "compiled")
    return {
        **record,
        "run_dir": os.path.relpath(summaries[0].parent, REPO),
        "summary": {k: summary.get(k) for k in keep},
        "curves": read_curves(summaries[0].parent),
    }


def determinism_check(spec: RunSpec, first: dict, out: Path, args: Args) -> dict:
    """Run `spec` again and compare every scalar but the clock-based ones with the first run, exactly."""
    again = launch(spec, out / "runs" / "determinism", args)
    result = {"command": first["command"], "compared": 0, "points": 0, "differing": [], "identical": False}
    if first["returncode"] or again["returncode"]:
        return {**result, "differing": ["a run failed"]}
    result.update(compare_scalars(read_scalars(REPO / first["run_dir"]), read_scalars(REPO / again["run_dir"])))
    if first["summary"]["eval"] != again["summary"]["eval"]:
        result["differing"].append("summary.json eval")
    result["identical"] = not result["differing"]
    return result


def compare_scalars(a: dict, b: dict) -> dict:
    """Tags whose (steps, values) differ between two runs, clock-based tags left out; exact comparison."""
    tags = sorted((set(a) | set(b)) - set(TIMING_TAGS))
    return {
        "compared": len(tags),
        "points": sum(len(a.get(t, ([], []))[0]) for t in tags),
        "differing": [t for t in tags if a.get(t) != b.get(t)],
    }


# ---- aggregation ----------------------------------------------------------------------------------
def fmt_mean_std(values: list[float], digits: int) -> str:
    m, s = rlstats.mean_std(values)
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def fmt_iqm(values: list[float], digits: int) -> str:
    est, lo, hi = rlstats.stratified_bootstrap_ci(np.asarray(values))
    return f"{est:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def threshold_hits(runs: list[dict], metric: str, threshold: float) -> tuple[list, list]:
    """Per run: env steps and loop seconds at the first eval that reaches the threshold (None: never)."""
    steps, times = [], []
    for run in runs:
        curve = run["curves"].get(f"eval/{metric}", {"step": [], "value": [], "time_s": []})
        hit = rlstats.first_crossing(range(len(curve["value"])), curve["value"], threshold)
        steps.append(None if hit is None else curve["step"][int(hit)])
        times.append(None if hit is None else curve["time_s"][int(hit)])
    return steps, times


def task_table(task: str, runs: list[dict]) -> str:
    metric, threshold = task_metric(task)
    has_success = any(r["summary"]["eval"].get("success_rate") is not None for r in runs)
    has_tasks = any(k.startswith("success_rate/") for r in runs for k in r["summary"]["eval"])
    header = ["script", "seeds", "env steps"]
    if has_success:
        header += ["eval success (mean ± std)", "eval success IQM [95% CI]"]
    if has_tasks:
        header += ["worst task's eval success (mean ± std)"]
    header += ["eval return (mean ± std)", "eval return IQM [95% CI]", f"train return, last {TRAIN_TAIL} iterations"]
    if threshold is not None:
        what = {"success_rate": "success", "worst_task_success_rate": "every task's success"}.get(metric, "return")
        what = f"{what} ≥ {threshold:g}"
        header += [f"env steps to {what}", f"wall time to {what}"]
    header += ["wall time (s)", "SPS"]
    rows = []
    for script in sorted({r["script"] for r in runs}, key=SCRIPTS.index):
        mine = [r for r in runs if r["script"] == script]
        ev = [r["summary"]["eval"] for r in mine]
        row = [script, str(len(mine)), f"{max(r['summary']['global_step'] for r in mine):,}"]
        if has_success:
            success = [e["success_rate"] or 0.0 for e in ev]
            row += [fmt_mean_std(success, 2), fmt_iqm(success, 2)]
        if has_tasks:
            worst = [min(v or 0.0 for k, v in e.items() if k.startswith("success_rate/")) for e in ev]
            row += [fmt_mean_std(worst, 2)]
        returns = [e["episodic_return"] for e in ev]
        train = [
            float(np.mean(c["value"][-TRAIN_TAIL:]))
            for r in mine
            if (c := r["curves"].get("charts/episodic_return")) and c["value"]
        ]
        row += [fmt_mean_std(returns, 1), fmt_iqm(returns, 1), fmt_mean_std(train, 1) if train else "-"]
        if threshold is not None:
            steps, times = threshold_hits(mine, metric, threshold)
            row += [fmt_hits(steps, "k", 1e3), fmt_hits(times, " s")]
        row += [
            fmt_mean_std([r["summary"]["wall_time_s"] for r in mine], 1),
            fmt_mean_std([r["summary"]["sps"] for r in mine], 0),
        ]
        rows.append(row)
    return md_table(header, rows)


# ---- plots ---------------------------------------------------------------------------------------
def plot_task(task: str, runs: list[dict], path: Path) -> None:
    """The eval curves of one task, a line per script."""
    metric, _ = task_metric(task)
    scripts = sorted({r["script"] for r in runs}, key=SCRIPTS.index)
    plot_groups(
        {s: [r["curves"].get(f"eval/{metric}") for r in runs if r["script"] == s] for s in scripts}, COLORS, task, path
    )


def plot_variants(runs: list[dict], path: Path) -> None:
    """The eval curves of several variants of one env id (`HalfCheetah-v5@a`, `HalfCheetah-v5@b`), a line each."""
    tasks = list(dict.fromkeys(r["task"] for r in runs))
    metric, _ = task_metric(tasks[0])
    groups = {t: [r["curves"].get(f"eval/{metric}") for r in runs if r["task"] == t] for t in tasks}
    plot_groups(groups, {}, f"{env_id(tasks[0])}, {len(tasks)} variants", path)


# ---- report ----------------------------------------------------------------------------------------
def report(data: dict, out: Path, image_prefix: str) -> str:
    ok = [r for r in data["runs"] if r["returncode"] == 0]
    failed = [r for r in data["runs"] if r["returncode"] != 0]
    lines = [
        f"Suite `{data['suite']}` on `{data['device']}`, {len(ok)} runs ({len(failed)} failed), "
        f"{data['total_wall_s'] / 60:.1f} min in all, finished {data['finished']}"
        + (
            f"; {data['jobs']} runs at a time, so wall times and SPS are those of a shared machine."
            if data.get("jobs", 1) > 1
            else "."
        ),
        "",
        *record_lines(data["invocation"], data["machine"], data["load_avg_end"], data["git"], data["versions"]),
        "- IQM: mean of the middle 50% of seeds (= the mean below 4 seeds); CI: 95% stratified bootstrap "
        "(2000 resamples, percentile); thresholds are reached at the first eval at or above them; "
        "wall time is the trainer's loop time (global_step / SPS), evaluations included.",
    ]
    det = data.get("determinism")
    if det:
        verdict = "identical, bit for bit" if det["identical"] else f"DIFFERENT: {', '.join(det['differing'])}"
        lines.append(
            f"- determinism: ran `{det['command']}` twice: {det['compared']} scalar series "
            f"({det['points']} points, all but charts/SPS) and the final eval: {verdict}"
        )
    for task in dict.fromkeys(r["task"] for r in ok):
        runs = [r for r in ok if r["task"] == task]
        plot_task(task, runs, out / f"{task}.png")
        lines += ["", f"### {task}", "", f"![{task}]({image_prefix}{task}.png)", "", task_table(task, runs)]
    for env in dict.fromkeys(env_id(r["task"]) for r in ok):  # variants of one env id: also on one figure
        runs = [r for r in ok if env_id(r["task"]) == env]
        if len({r["task"] for r in runs}) > 1:
            plot_variants(runs, out / f"{env}-variants.png")
            lines += [
                "",
                f"### {env}: the variants side by side",
                "",
                f"![{env} variants]({image_prefix}{env}-variants.png)",
            ]
    if failed:
        lines += ["", "Failed runs:", ""] + [
            f"- `{r['command']}` (exit {r['returncode']}): {r.get('error', '')}" for r in failed
        ]
    lines += [
        "",
        "<details><summary>Exact commands (run from the repository root; python = the uv "
        "environment's interpreter)</summary>",
        "",
        "```",
    ] + [r["command"] for r in data["runs"]]
    return "\n".join(lines + ["```", "", "</details>"])


def write_outputs(data: dict, out: Path, results_md: str, name: str) -> None:
    save_runs(data, out)
    (out / "report.md").write_text(f"# {data['suite']} suite ({data['device']})\n\n" + report(data, out, "") + "\n")
    if results_md:
        md = Path(results_md)
        prefix = os.path.relpath(out, md.resolve().parent).replace(os.sep, "/") + "/"
        write_section(md, name, report(data, out, prefix))
    print(f"wrote {out / 'report.md'}" + (f" and the {name} section of {results_md}" if results_md else ""))


def main(args: Args) -> None:
    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: no GPU here")
    name = args.name or f"{args.suite}-{device}"
    out = Path(args.out) if args.out else RESULTS_DIR / name
    if args.report_only:
        if not (out / "runs.json").is_file():
            fail(f"--report-only: no {out / 'runs.json'}; run the suite first")
        write_outputs(json.loads((out / "runs.json").read_text()), out, args.results_md, name)
        return
    specs = plan(args, device)
    out.mkdir(parents=True, exist_ok=True)
    command = invocation(__file__, sys.argv[1:])
    data = {
        "suite": args.suite,
        "device": device,
        "invocation": command,
        "jobs": args.jobs,
        "machine": machine_info(),
        "versions": package_versions(),
        "git": git_info(),
        "runs": [],
    }
    start = time.time()
    run_dir = lambda spec: out / "runs" / f"{spec.script}__{spec.task}__{spec.seed}"
    # Runs go `--jobs` at a time; records keep the plan's order whatever order the runs finish in.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(launch, spec, run_dir(spec), args) for spec in specs]
        for i, future in enumerate(futures, 1):
            data["runs"].append(future.result())
            print(f"[{i}/{len(specs)}] {progress_line(data['runs'][-1])}", flush=True)
    if args.determinism_check:  # the first run again, alone on the machine
        data["determinism"] = determinism_check(specs[0], data["runs"][0], out, args)
        print(f"determinism check: identical={data['determinism']['identical']}", flush=True)
    data.update(
        total_wall_s=round(time.time() - start, 1),
        finished=time.strftime("%Y-%m-%d %H:%M"),
        load_avg_end=machine_info()["load_avg_1_5_15"],
    )
    write_outputs(data, out, args.results_md, name)
    run_git = provenance.commits_of(data["runs"], data["git"])  # (a --skip-done run's: that of its earlier invocation)
    provenance.record(out, command, [r["command"] for r in data["runs"]], data["machine"], data["git"], run_git)


def progress_line(r: dict) -> str:
    head = f"{r['script']} {r['task']} seed {r['seed']}:"
    if r["returncode"]:
        return f"{head} FAILED (exit {r['returncode']}): {r.get('error', '')}"
    s, ev = r["summary"], r["summary"]["eval"]
    success = "" if ev.get("success_rate") is None else f"success {ev['success_rate']:.2f}, "
    ret = ev.get("episodic_return")
    return (
        f"{head} {success}return {ret if ret is None or not math.isfinite(ret) else round(ret, 1)}, "
        f"{s['global_step']:,} steps, {s['wall_time_s']:.0f} s ({r['process_wall_s']:.0f} s with start-up)"
    )


if __name__ == "__main__":
    main(tyro.cli(Args))
