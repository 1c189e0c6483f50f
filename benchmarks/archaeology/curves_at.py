"""How did the code of other commits learn? Run a results folder's published commands at several commits, side by side.

    uv run python -m benchmarks.archaeology.curves_at --results docs/results/privileged-critic-cpu \\
        --task PushCubeRL@proprio+rgb --commits cb89760 1f9693b c9f1a98 HEAD --seeds 1 2 3 \\
        --until-step 256000 --jobs 2 --out docs/results/pixel-bisect-cpu

Each (commit, seed) runs the published command of that task and seed (runs.json; `--output-dir` replaced) with this
environment's interpreter in a temporary git worktree of the commit (the repository itself is untouched), one thread,
and is stopped with Ctrl-C once it has logged `--until-step` (it saves and exits cleanly), so its learning-rate
schedule is the full run's. Written to `--out`: curves.json (the training and evaluation success and return curves
of every run), a report.md table of the proxy `--metric` averaged over each run's first `--until-step` env steps (by
default the training success rate: all of a run's training episodes, far less noisy than an evaluation of 64
episodes) with each commit's mean, and the report's provenance.json. A finished run is read from curves.json instead
of run again, and only by what it was: each run there records its commit, seed, task, results folder, command (as
published, `--output-dir` left out) and `--until-step`, and a run that differs in any of them is another run (kept in
the file, not used). curves.json is saved after every run, atomically (a temp file renamed over it). One of the old
form (keys `commit:seed`) is read as the runs its folder's provenance.json names.
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

from benchmarks.common import REPO, command_of, invocation, last_step, machine_info, md_table, read_scalars
from benchmarks.suite import provenance, rlstats
from cleanrl_embodied.shared.atomic_files import atomic_write

KEY = ("commit", "seed", "task", "results", "command", "until_step")  # what a run in curves.json is


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


def commit_of(name: str) -> str | None:
    """The full hash of the commit `name` names (anything `git rev-parse` takes), or None."""
    proc = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"], cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    return proc.stdout.strip() if proc.returncode == 0 else None


def folder_name(results: str, base: Path | None = None) -> str:
    """A results folder as curves.json records it: relative to the repository when inside it, else absolute
    (`base`: what a relative `results` is relative to; the current directory unless given)."""
    path = ((base or Path.cwd()) / results).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def without_output_dir(command: str) -> str:
    """The published command without its `--output-dir` (which curves_at replaces): what the run computes."""
    tokens, kept = shlex.split(command), []
    while tokens:
        token = tokens.pop(0)
        if token == "--output-dir":
            tokens = tokens[1:]
        elif not token.startswith("--output-dir="):
            kept.append(token)
    return shlex.join(kept)


def run_key(commit: str, seed: int, task: str, results: str, command: str, until_step: int) -> dict:
    """What makes a run in curves.json this run (`KEY`): any difference makes it another one."""
    return {"commit": commit, "seed": seed, "task": task, "results": results,
            "command": without_output_dir(command), "until_step": until_step}  # fmt: skip


def with_seed(command: str, seed: int) -> str | None:
    """`command` with its `--seed` value replaced by `seed` (None if it has no --seed)."""
    tokens = shlex.split(command)
    for i, token in enumerate(tokens):
        if token == "--seed" and i + 1 < len(tokens):
            return shlex.join([*tokens[: i + 1], str(seed), *tokens[i + 2 :]])
        if token.startswith("--seed="):
            return shlex.join([*tokens[:i], f"--seed={seed}", *tokens[i + 1 :]])
    return None


def migrate(old: dict, out: Path) -> list[dict]:
    """The runs of a curves.json of the old form (`{"<commit>:<seed>": run}`) with the key the provenance.json beside
    it records: its command's --results (relative to the repository), --task, --until-step and --seeds, and the
    published command of each seed (its "runs", in the order of --seeds)."""
    prov_path = out / "provenance.json"
    prov = json.loads(prov_path.read_text()) if prov_path.is_file() else {}
    if "command" not in prov or "runs" not in prov:
        sys.exit(f"error: --out {out}: its curves.json has runs keyed by commit and seed only (the old form), and no "
                 "provenance.json beside it says which task, results folder, commands and --until-step they ran "
                 "(move it away to start afresh)")  # fmt: skip
    tokens = shlex.split(prov["command"])
    found = provenance.script_of(tokens)  # (`-m benchmarks.archaeology.curves_at`, or an older record's path)
    at = found[0] if found and found[2] == "curves_at" else None
    try:
        made = tyro.cli(Args, args=tokens[at + 1 :], console_outputs=False) if at is not None else None
    except SystemExit:
        made = None
    if made is None:
        sys.exit(f"error: --out {out}: its curves.json is of the old form and its provenance.json's command is not a "
                 f"curves_at.py command to read the runs' task and --until-step from: {prov['command']!r}")  # fmt: skip
    commands = dict(zip(made.seeds, prov["runs"]))
    runs = []
    for name, run in old.items():
        commit, _, seed = name.rpartition(":")
        if int(seed) not in commands:
            sys.exit(f"error: --out {out}: curves.json's run {name} has a seed its provenance.json's --seeds lack")
        key = run_key(commit, int(seed), made.task, folder_name(made.results, REPO), commands[int(seed)],
                      made.until_step)  # fmt: skip
        runs.append({**key, **run})
    return runs


def load_runs(out: Path) -> list[dict]:
    """The runs curves.json in `out` holds (none if there is none), each with its key (`KEY`). A file of the old form
    is rewritten in the new one at once, while the provenance.json that says what its runs were is still there."""
    path = out / "curves.json"
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    if isinstance(data.get("runs"), list):
        return data["runs"]
    runs = migrate(data, out)
    save_runs(out, runs)
    print(
        f"{path}: {len(runs)} run(s) keyed by commit and seed only, rewritten with their task, results folder, "
        "command and --until-step (from provenance.json)"
    )
    return runs


def save_runs(out: Path, runs: list[dict]) -> None:
    """curves.json written whole or not at all (a temp file beside it, fsync, rename): it holds hours of runs."""
    text = json.dumps({"form": 2, "runs": runs})
    atomic_write(out / "curves.json", lambda f: f.write(text.encode()))


def schedules(commands: list[str]) -> str:
    """What the commands' schedules are, e.g. "512,000-step schedules" (from their --total-timesteps)."""
    totals = set()
    for command in commands:
        tokens = shlex.split(command)
        value = next((tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == "--total-timesteps"), None)
        value = value or next((t.partition("=")[2] for t in tokens if t.startswith("--total-timesteps=")), None)
        totals.add(f"{int(value):,}-step" if value and value.isdigit() else "the trainer's default")
    return " and ".join(sorted(totals)) + " schedules"


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


def main(args: Args) -> list[dict]:
    runs_json = Path(args.results) / "runs.json"
    if not runs_json.is_file():
        sys.exit(f"error: --results {args.results}: no runs.json there (a results folder written by run.py)")
    published = json.loads(runs_json.read_text())
    runs = {r["seed"]: r for r in published["runs"] if r["task"] == args.task}
    if not runs:
        sys.exit(f"error: --task: {args.results} has no run of {args.task!r}")
    first = runs[min(runs)]
    for seed in sorted(set(args.seeds) - set(runs)):  # the same command with another seed
        command = with_seed(first["command"], seed)
        if command is None:
            sys.exit(f"error: --seeds {seed}: {runs_json} has no run of {args.task} with seed {seed}, and the command "
                     f"of its seed {first['seed']} has no --seed to change (the seeds it has: "
                     f"{', '.join(map(str, sorted(runs)))})")  # fmt: skip
        runs[seed] = {**first, "seed": seed, "command": command}
    commits = {name: commit_of(name) for name in args.commits}
    for name, commit in commits.items():
        if commit is None:
            sys.exit(f"error: --commits {name}: not a commit (`git rev-parse {name}` names none in {REPO})")
    groups = []
    for group in args.pool:
        name, eq, members = group.partition("=")
        if not eq or not name or not members:
            sys.exit(f"error: --pool {group}: not NAME=COMMIT,COMMIT (a group's name, then its commits)")
        for member in members.split(","):
            if commit_of(member) is None:
                sys.exit(f"error: --pool {group}: {member} is not a commit (`git rev-parse {member}` names none)")
        groups.append((name, members, [commit_of(m) for m in members.split(",")]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = load_runs(out)
    results = folder_name(args.results)

    def key(commit: str, seed: int) -> dict:
        return run_key(commit, seed, args.task, results, runs[seed]["command"], args.until_step)

    def found(commit: str, seed: int) -> dict | None:
        want = key(commit, seed)
        return next((r for r in cache if all(r.get(k) == want[k] for k in KEY)), None)

    asked = {*commits.values(), *(c for _, _, shas in groups for c in shas)}
    others = len(cache) - len({id(r) for c in asked for s in args.seeds if (r := found(c, s)) is not None})
    if others:
        print(f"curves.json: {others} run(s) of another task, results folder, command or --until-step: not used")
    plan = [(c, s) for s in args.seeds for c in commits.values() if found(c, s) is None and args.run_missing]

    def one(item):
        commit, seed = item
        result = run_at(commit, runs[seed], args.until_step)
        print(f"{commit[:10]} seed {seed}: {proxy(result['curves'], args.metric, args.until_step):.3f}", flush=True)
        return {**key(commit, seed), **result}

    with ThreadPoolExecutor(args.jobs) as pool:
        for run in pool.map(one, plan):
            cache.append(run)
            save_runs(out, cache)

    def value(commit: str, seed: int) -> float | None:
        run = found(commit, seed)
        return None if run is None else proxy(run["curves"], args.metric, args.until_step)

    rows = []
    for name, commit in commits.items():
        values = [value(commit, s) for s in args.seeds]
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
    for name, members, shas in groups:
        values = [v for v in (value(c, s) for c in shas for s in args.seeds) if v is not None]
        if len(values) < 2:
            sys.exit(f"error: --pool {name}={members}: fewer than 2 finished runs in this group")
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
    command = invocation(__file__, sys.argv[1:], join=" ".join)
    text = (
        f"# {args.metric}, mean over the first {args.until_step:,} env steps, by commit\n\n"
        f"The published commands of `{args.task}` in `{args.results}` "
        f"({schedules([runs[s]['command'] for s in args.seeds])}, stopped at {args.until_step:,}), at each commit. "
        f"Command: `{command}`\n\n" + md_table(header, rows) + "\n" + pool_text
    )
    (out / "report.md").write_text(text)
    provenance.record(out, command, [runs[s]["command"] for s in args.seeds], machine_info())
    print(text)
    return cache


if __name__ == "__main__":
    main(tyro.cli(Args))
