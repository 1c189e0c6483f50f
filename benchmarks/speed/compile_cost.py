"""What compiling costs and saves on this CPU: the figures `--compile auto` decides from where no earlier run of a
configuration measured them (shared/compilation.py's CPU_COMPILED_RATIO and CPU_COMPILE_S).

    uv run python -m benchmarks.speed.compile_cost                      # ppo_continuous on PushCubeRL, 3 rounds: ~6 min
    uv run python -m benchmarks.speed.compile_cost --dry-run              # print the commands, run nothing
    uv run python -m benchmarks.speed.compile_cost --report-only          # the report again from runs.json

Each round runs the trainer three times, one process at a time, one thread (OMP_NUM_THREADS=1), `--iterations`
iterations at its defaults plus `--flags`:

1. `--compile off`: the eager iteration (the median of the iterations after the first);
2. `--compile on` with Inductor's caches empty (TORCHINDUCTOR_CACHE_DIR, a new directory): the compiled iteration
   (median) and what compiling cost, the time the compiled iterations took beyond that median (as a run measures
   it for `--compile auto`);
3. `--compile on` again with the caches round 2 left: the compile's cost with warm caches.

Each run writes what it measured to a compile_times.json of its own (CLEANRL_EMBODIED_COMPILE_TIMES), which this
script reads back, and its whole process is timed. Writes `--out`: report.md, runs.json (after every run),
provenance.json, and its section of docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

from benchmarks.common import (
    REPO,
    RESULTS_MD,
    commands_block,
    fail,
    git_info,
    invocation,
    machine_info,
    md_table,
    package_versions,
    record_lines,
    save_runs,
    saved_runs,
    write_report,
)
from benchmarks.suite import provenance

MODES = {"eager": ("off", False), "compiled, caches empty": ("on", True), "compiled, caches warm": ("on", False)}
"""label -> (--compile, whether Inductor's caches start empty)."""


@dataclass
class Args:
    script: str = "ppo_continuous"
    """the trainer (cleanrl_embodied/<script>.py)"""
    flags: str = "--env-id PushCubeRL"
    """flags added to the trainer's defaults (one string, as a shell reads it)"""
    iterations: int = 30
    """training iterations per run (at least 10: a run records its times after 8 of a mode)"""
    rounds: int = 3
    """rounds of the three runs"""
    out: str = "docs/results/compile-cost-cpu"
    """report folder"""
    results_md: str = str(RESULTS_MD)
    """the benchmarks page whose section is rewritten ("" for none)"""
    dry_run: bool = False
    """print the commands, run nothing"""
    report_only: bool = False
    """write the report again from `out`/runs.json"""


def trainer_command(args: Args, compile_setting: str, run_dir: Path) -> list[str]:
    defaults = provenance.script_defaults(args.script)
    per_iteration = defaults["num_envs"] * defaults["num_steps"]
    return [sys.executable, f"cleanrl_embodied/{args.script}.py", *shlex.split(args.flags), "--compile",
            compile_setting, "--total-timesteps", str(args.iterations * per_iteration), "--eval-freq", "0",
            "--save-freq", "0", "--no-cuda", "--output-dir", str(run_dir)]  # fmt: skip


def shown(command: list[str], env: dict[str, str]) -> str:
    """The command as the report shows it: from the repository root, the uv environment's python."""
    settings = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return f"{settings} python {shlex.join(command[1:])}"


def run_one(command: list[str], env: dict[str, str], times_file: Path) -> dict:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True)
    whole_s = time.perf_counter() - start
    if done.returncode:
        return {"returncode": done.returncode, "error": (done.stderr.strip().splitlines() or [""])[-1]}
    measured = json.loads(times_file.read_text()) if times_file.is_file() else {}
    if len(measured) != 1:
        return {"returncode": 0, "error": f"{times_file} holds {len(measured)} configurations, not one"}
    (entry,) = measured.values()
    return {"returncode": 0, "whole_s": round(whole_s, 2), **{k: v for k, v in entry.items() if k != "date"}}


def plan(args: Args, out: Path) -> list[dict]:
    specs = []
    out = Path(os.path.relpath(out, REPO))  # (the commands run from the repository root)
    for round_ in range(1, args.rounds + 1):
        caches = out / "runs" / f"inductor_cache_{round_}"
        for label, (setting, cold) in MODES.items():
            run_dir = out / "runs" / f"round{round_}_{setting}{'_cold' if cold else ''}"
            env = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "WANDB_MODE": "disabled",
                   "CLEANRL_EMBODIED_COMPILE_TIMES": str(run_dir / "compile_times.json"),
                   "TORCHINDUCTOR_CACHE_DIR": str(caches)}  # fmt: skip
            specs.append({"round": round_, "mode": label, "cold": cold, "caches": caches, "env": env,
                          "command": trainer_command(args, setting, run_dir)})  # fmt: skip
    return specs


def report(data: dict) -> str:
    runs = [r for r in data["runs"] if not r.get("error")]
    by_mode = {label: [r for r in runs if r["mode"] == label] for label in MODES}
    eager = [r["eager_s"] for r in by_mode["eager"]]
    rows = []
    for label, rs in by_mode.items():
        if not rs:
            continue
        step = [r["eager_s"] if label == "eager" else r["compiled_s"] for r in rs]
        cost = [r["compile_s"] for r in rs if "compile_s" in r]
        rows.append([label, str(len(rs)), f"{statistics.median(step):.3f}",
                     f"{statistics.median(step) / statistics.median(eager):.2f}x" if eager else "",
                     f"{statistics.median(cost):.1f} ({min(cost):.1f}-{max(cost):.1f})" if cost else "",
                     f"{statistics.median(r['whole_s'] for r in rs):.1f}"])  # fmt: skip
    a = data["args"]
    lines = [
        f"{a['script']} with `{a['flags']}`, {a['iterations']} iterations per run, {a['rounds']} rounds of the three "
        f"runs, one at a time, one thread each; finished {data.get('finished_at', '')}.",
        "",
        *record_lines(data["command"], data["machine"], data.get("load_avg_end"), data["git"], data["versions"]),
        "- iteration: the median of a run's timed iterations (eager: after the first; compiled: from the first "
        "compiled call); compile cost: what the compiled iterations took beyond that median (the figure a run "
        "records for `--compile auto`); medians over the rounds (range).",
        "",
        md_table(["run", "runs", "iteration (s)", "of eager", "compile cost (s)", "whole process (s)"], rows),
    ]
    failed = [r for r in data["runs"] if r.get("error")]
    if failed:
        lines += ["", "Failed runs:", ""] + [f"- `{r['command']}`: {r['error']}" for r in failed]
    lines += commands_block([r["command"] for r in data["runs"]])
    return "\n".join(lines)


def write_outputs(data: dict, out: Path, results_md: str) -> None:
    body = report(data)
    write_report(out, "# Compiling on the CPU: what it costs and saves", lambda _: body, results_md)


def main(args: Args) -> dict | list[dict]:
    if args.iterations < 10:
        fail(f"--iterations {args.iterations}: at least 10 (a run records its times after 8 iterations of a mode)")
    if args.rounds < 1:
        fail(f"--rounds {args.rounds}: at least 1")
    out = (REPO / args.out).resolve()
    if args.report_only:
        data = saved_runs(out, "the measurement")
        write_outputs(data, out, args.results_md)
        return data
    specs = plan(args, out)
    if args.dry_run:
        for spec in specs:
            print(shown(spec["command"], spec["env"]))
        return specs
    command = invocation(__file__, sys.argv[1:])
    data = {"args": dataclasses.asdict(args), "command": command, "machine": machine_info(),
            "versions": package_versions(), "git": git_info(), "runs": []}  # fmt: skip
    for i, spec in enumerate(specs, 1):
        if spec["cold"]:
            shutil.rmtree(REPO / spec["caches"], ignore_errors=True)  # Inductor's caches empty
        times_file = REPO / spec["env"]["CLEANRL_EMBODIED_COMPILE_TIMES"]
        times_file.unlink(missing_ok=True)
        result = run_one(spec["command"], spec["env"], times_file)
        data["runs"].append({"round": spec["round"], "mode": spec["mode"], **result,
                             "command": shown(spec["command"], spec["env"])})  # fmt: skip
        print(f"[{i}/{len(specs)}] round {spec['round']} {spec['mode']}: {result}", flush=True)
        save_runs(data, out)
    data.update(finished_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                load_avg_end=machine_info()["load_avg_1_5_15"])  # fmt: skip
    save_runs(data, out)
    write_outputs(data, out, args.results_md)
    provenance.record(out, command, [r["command"] for r in data["runs"]], data["machine"], data["git"])
    return data


if __name__ == "__main__":
    main(tyro.cli(Args))
