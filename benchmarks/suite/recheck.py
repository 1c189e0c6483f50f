"""Does the code at hand still train the published runs? Re-run the runs of a results folder with their exact
commands up to an env step, and compare their curves with the published ones, point by point and exactly.

    uv run python -m benchmarks.suite.recheck --results docs/results/full-cpu --until-step 104448 --seeds 1

On the CPU the same command gives the same numbers bit for bit, so identical training points say more than a
re-run landing inside the old confidence interval: the code trains the very runs the table describes, and
it costs minutes instead of the whole budget. Each run's command comes from the folder's runs.json (its
--output-dir replaced by a temporary one); the run is stopped with Ctrl-C (SIGINT: it saves and exits
cleanly) once it has logged `--until-step`. Compared: every curve runs.json keeps (the training return of
each iteration, the evaluations), at the steps both have. Exit status 1 if a training point differs.
Evaluation points are reported apart: they also depend on the evaluation's start states.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

from benchmarks.common import REPO, command_of, last_step, md_table, read_scalars


@dataclass
class Args:
    results: str = "docs/results/full-cpu"
    """a results folder written by run.py (its runs.json)"""
    until_step: int = 104_448
    """stop each run once it has logged this env step (the whole run if larger than its budget)"""
    tasks: tuple[str, ...] = ()
    """only these tasks (default: all in runs.json)"""
    seeds: tuple[int, ...] = ()
    """only these seeds (default: all)"""
    poll_s: float = 5.0
    """how often the run's scalars are read while it trains"""


def compiled_by_auto(run: dict) -> bool:
    """Whether the run compiled by `--compile auto`'s own choice (its summary says so and its command did not ask):
    a decision from the machine's record of earlier runs, which a re-run here need not repeat, and compiled and
    eager code agree to float rounding only, so its points cannot be compared exactly."""
    argv, asked = command_of(run, "-")[0], "auto"
    for i, token in enumerate(argv):
        if token == "--compile" and i + 1 < len(argv):
            asked = argv[i + 1]
        elif token.startswith("--compile="):
            asked = token.partition("=")[2]
    return asked == "auto" and bool((run.get("summary") or {}).get("compiled"))


def recheck(run: dict, until_step: int, poll_s: float) -> dict:
    """Re-run `run` up to `until_step` and compare its curves with the published ones."""
    if compiled_by_auto(run):
        return {"error": "not comparable: it compiled by --compile auto's choice (re-run it with --compile on/off)"}
    final = run["summary"]["global_step"]  # a run that got there is finishing by itself: no signal then
    with tempfile.TemporaryDirectory() as tmp:
        argv, env = command_of(run, tmp)
        with open(Path(tmp) / "stdout.log", "w") as log:
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            while proc.poll() is None:
                time.sleep(poll_s)
                if until_step <= last_step(Path(tmp)) < final:
                    proc.send_signal(signal.SIGINT)  # the trainer saves and exits after this iteration
                    proc.wait()
        run_dirs = [p.parent for p in Path(tmp).rglob("summary.json")]
        if not run_dirs:
            tail = (Path(tmp) / "stdout.log").read_text().strip().splitlines()[-3:]
            return {"error": " / ".join(tail) or f"exit status {proc.returncode}"}
        scalars = read_scalars(run_dirs[0])
    result = {}
    for tag, published in run["curves"].items():
        ours = dict(zip(*scalars.get(tag, ([], []))))
        steps = [s for s in published["step"] if s <= until_step and s in ours]
        differing = [s for s, v in zip(published["step"], published["value"]) if s in steps and ours[s] != v]
        result[tag] = {"compared": len(steps), "differing": differing}
    return result


def main(args: Args) -> int:
    path = Path(args.results) / "runs.json"
    if not path.is_file():
        sys.exit(f"error: --results {args.results}: no runs.json there (run.py writes one)")
    data = json.loads(path.read_text())
    runs = [
        r
        for r in data["runs"]
        if r.get("curves")
        and (not args.tasks or r["task"] in args.tasks)
        and (not args.seeds or r["seed"] in args.seeds)
    ]
    if not runs:
        sys.exit(
            f"error: --tasks/--seeds: no run of {path} matches (it has "
            f"{sorted({(r['task'], r['seed']) for r in data['runs']})})"
        )
    print(
        f"published at git {data['git']['git_sha'][:10]} with torch {data['versions'].get('torch')}; "
        f"re-running {len(runs)} run(s) up to step {args.until_step}",
        flush=True,
    )
    rows, training_differs = [], False
    for run in runs:
        result = recheck(run, args.until_step, args.poll_s)
        if "error" in result:
            rows.append([run["script"], run["task"], str(run["seed"]), "failed: " + result["error"]])
            training_differs = True
            continue
        cells = []
        for tag, r in result.items():
            same = r["compared"] - len(r["differing"])
            cells.append(
                f"{tag}: {same}/{r['compared']} identical"
                + (f" (first difference at step {r['differing'][0]})" if r["differing"] else "")
            )
            training_differs |= tag.startswith("charts/") and bool(r["differing"] or not r["compared"])
        rows.append([run["script"], run["task"], str(run["seed"]), "; ".join(cells)])
        print(" ".join(rows[-1]), flush=True)
    print(md_table(["script", "task", "seed", "published points reproduced exactly"], rows))
    return 1 if training_differs else 0


if __name__ == "__main__":
    sys.exit(main(tyro.cli(Args)))
