"""How did the code of other commits learn? Run a results folder's published commands at several commits, side by side.

    uv run python benchmarks/curves_at.py --results docs/results/privileged-critic-cpu \\
        --task PushCubeRL@proprio+rgb --commits cb89760 1f9693b c9f1a98 HEAD --seeds 1 2 3 \\
        --until-step 256000 --jobs 2 --out docs/results/pixel-bisect-cpu

Each (commit, seed) runs the published command of that task and seed (runs.json; `--output-dir` replaced) with this
environment's interpreter in a temporary git worktree of the commit (the repository itself is untouched), one thread,
and is stopped with Ctrl-C once it has logged `--until-step` (it saves and exits cleanly), so its learning-rate
schedule is the full run's. Written to `--out`: curves.json (the training and evaluation success and return curves
of every run), a report.md table of the proxy `--metric` averaged over each run's first `--until-step` env steps (by
default the training success rate: all of a run's training episodes, far less noisy than an evaluation of 64
episodes) with each commit's mean, and the report's provenance.json. A finished (commit, seed) is read from
curves.json instead of run again.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import rlstats  # noqa: E402
from benchlib import REPO, machine_info, md_table, read_scalars  # noqa: E402
from recheck import command_of, last_step  # noqa: E402


@dataclass
class Args:
    results: str
    """a results folder written by run.py (its runs.json holds the commands)"""
    task: str
    """the task of the runs to take (as in runs.json, e.g. PushCubeRL@proprio+rgb)"""
    commits: tuple[str, ...] = ("HEAD",)
    """the commits to run the commands at (anything `git rev-parse` takes)"""
    seeds: tuple[int, ...] = (1, 2, 3)
    """the seeds (one runs.json does not have runs its first run's command with this --seed)"""
    until_step: int = 256_000
    """stop each run once it has logged this env step"""
    metric: str = "charts/success_rate"
    """the scalar averaged over the first --until-step env steps (the proxy)"""
    jobs: int = 2
    """runs at a time (one thread each)"""
    out: str = "docs/results/curves-at"
    """folder for curves.json, report.md and provenance.json"""
    pool: tuple[str, ...] = ()
    """groups of commits pooled as one learner (NAME=COMMIT,COMMIT; e.g. commits whose env and update compute the same
    thing and differ only in their random numbers): each group's runs, mean and std, and its difference to the first
    group with a 95% Welch t-interval"""
    run_missing: bool = True
    """run the (commit, seed) pairs curves.json does not have; with --no-run-missing the report shows them as not run
    and a commit's mean is over the seeds it has"""


def git(*argv: str) -> str:
    return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def run_at(commit: str, run: dict, until_step: int) -> dict:
    """The run's published command at `commit`, stopped at `until_step`: its scalar curves and wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=REPO, capture_output=True)
        try:
            argv, env = command_of(run, str(Path(tmp) / "out"))
            env = {**env, "PYTHONPATH": str(tree), "WANDB_MODE": "disabled"}
            start = time.time()
            with open(Path(tmp) / "log", "w") as log:
                proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
                while proc.poll() is None:
                    time.sleep(10)
                    if last_step(Path(tmp) / "out") >= until_step:
                        proc.send_signal(signal.SIGINT)
                        proc.wait()
            events = sorted((Path(tmp) / "out").rglob("events.out.tfevents.*"))
            if not events:
                sys.exit(
                    f"error: {commit[:10]} seed {run['seed']}: no scalars ({(Path(tmp) / 'log').read_text()[-300:]})"
                )
            kept = ("charts/success_rate", "charts/episodic_return", "eval/success_rate", "eval/episodic_return")
            curves = {tag: [s, v] for tag, (s, v) in read_scalars(events[0].parent).items() if tag in kept}
            return {"curves": curves, "wall_s": round(time.time() - start, 1)}
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)


welch = rlstats.welch  # the difference of two groups' means and its 95% Welch t-interval (exact quantile)


def proxy(curves: dict, metric: str, until_step: int) -> float:
    steps, values = (np.asarray(x) for x in curves[metric])
    return float(values[steps <= until_step].mean())


def main(args: Args) -> dict:
    published = json.loads((Path(args.results) / "runs.json").read_text())
    runs = {r["seed"]: r for r in published["runs"] if r["task"] == args.task}
    if not runs:
        sys.exit(f"error: --task: {args.results} has no run of {args.task!r}")
    first = runs[min(runs)]
    for seed in set(args.seeds) - set(runs):  # the same command with another seed
        tokens = shlex.split(first["command"])
        tokens[tokens.index("--seed") + 1] = str(seed)
        runs[seed] = {**first, "seed": seed, "command": shlex.join(tokens)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "curves.json"
    done = json.loads(path.read_text()) if path.is_file() else {}
    commits = {c: git("rev-parse", c) for c in args.commits}
    plan = [(c, s) for s in args.seeds for c in commits.values() if f"{c}:{s}" not in done and args.run_missing]

    def one(item):
        commit, seed = item
        result = run_at(commit, runs[seed], args.until_step)
        print(f"{commit[:10]} seed {seed}: {proxy(result['curves'], args.metric, args.until_step):.3f}", flush=True)
        return f"{commit}:{seed}", result

    with ThreadPoolExecutor(args.jobs) as pool:
        for key, result in pool.map(one, plan):
            done[key] = result
            path.write_text(json.dumps(done))
    rows = []
    for name, commit in commits.items():
        values = [
            proxy(done[key]["curves"], args.metric, args.until_step) if key in done else None
            for key in (f"{commit}:{s}" for s in args.seeds)
        ]
        had = [v for v in values if v is not None]
        mean = (
            f"**{np.mean(had):.3f}** ± {np.std(had, ddof=1) if len(had) > 1 else 0:.3f} (n={len(had)})"
            if had
            else "not run"
        )
        subject = git("log", "-1", "--format=%s", commit)[:70]
        rows.append([f"`{commit[:10]}` ({name})", subject, *("–" if v is None else f"{v:.3f}" for v in values), mean])
    header = ["commit", "what it is", *(f"seed {s}" for s in args.seeds), "mean ± std over seeds"]
    pooled = []
    for group in args.pool:
        name, _, members = group.partition("=")
        shas = [git("rev-parse", c) for c in members.split(",")]
        values = [proxy(done[f"{c}:{s}"]["curves"], args.metric, args.until_step)
                  for c in shas for s in args.seeds if f"{c}:{s}" in done]  # fmt: skip
        if len(values) < 2:
            sys.exit(f"error: --pool {group}: fewer than 2 finished runs in this group")
        pooled.append((name, members, values))
    pool_text = ""
    if pooled:
        rows_p = []
        for name, members, values in pooled:
            diff = ""
            if name != pooled[0][0]:
                d, half = welch(pooled[0][2], values)
                diff = f"{d:+.3f} ± {half:.3f}"
            rows_p.append(
                [name, members, str(len(values)), f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}", diff]
            )
        pool_text = (
            "\nPooled (runs of the commits of a group taken as one learner; mean ± std over runs; the difference to "
            "the first group ± its 95% Welch t-interval):\n\n"
            + md_table(["group", "commits", "runs", "mean ± std", f"difference to {pooled[0][0]}"], rows_p)
            + "\n"
        )
    command = "uv run python benchmarks/curves_at.py " + " ".join(sys.argv[1:])
    text = (
        f"# {args.metric}, mean over the first {args.until_step:,} env steps, by commit\n\n"
        f"The published commands of `{args.task}` in `{args.results}` (512k-step schedules, stopped at "
        f"{args.until_step:,}), at each commit. Command: `{command}`\n\n" + md_table(header, rows) + "\n" + pool_text
    )
    (out / "report.md").write_text(text)
    provenance.record(out, command, [runs[s]["command"] for s in args.seeds], machine_info())
    print(text)
    return done


if __name__ == "__main__":
    main(tyro.cli(Args))
