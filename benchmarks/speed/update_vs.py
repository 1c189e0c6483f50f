"""Where an iteration's time goes, this checkout against another one (an earlier commit), side by side in one run.

    git worktree add /tmp/before <commit> && (cd /tmp/before && uv sync --extra mujoco)
    uv run python -m benchmarks.speed.update_vs --other-repo /tmp/before

Each contestant is speed.py's breakdown (part 3: the real `main()` of ppo_continuous, timed through public seams)
run by that checkout's own `.venv` Python on that checkout's own code, one process at a time with one thread
(OMP_NUM_THREADS=1), in turns (this, other, other, this, ...) so that drift of the machine falls on all alike.
Contestants: the other checkout as it is, this checkout with `--compile off` (eager) and with `--compile on`
(compiled; `--compile auto` decides between the two from what a run measures). Settings: CleanRL's HalfCheetah
(benchmarks/suite/configs/ppo_continuous__HalfCheetah-v5.txt: 1 env x 2048 steps, 10 epochs x 32 minibatches of
64) and PushCubeRL with 256 envs x 20 steps (speed.py's breakdown setting). Per iteration after `--skip`: the
whole iteration, env, policy, update and rest (means, they add up). The compilation happens in the first
iterations and so is outside those means: the whole process time, which holds it, is reported next to them.
Writes `--out`/update_vs.json and the `update-vs-cpu` section of docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

from benchmarks.common import (
    CONFIG_DIR,
    REPO,
    RESULTS_DIR,
    RESULTS_MD,
    describe_machine,
    git_info,
    invocation,
    machine_info,
    md_table,
    read_flags,
    write_section,
)
from benchmarks.suite import provenance

PHASES = ("total", "env", "policy", "update", "rest")


@dataclass
class Args:
    other_repo: str = ""
    """a checkout of another commit with its own `.venv` (see the module docstring)"""
    settings: tuple[str, ...] = ("halfcheetah", "pushcube")
    """which settings to measure: halfcheetah (CleanRL's, 1 env x 2048) and/or pushcube (256 envs x 20)"""
    rounds: int = 3
    """turns per setting; each turn runs every contestant once"""
    iterations: int = 10
    """iterations per run"""
    skip: int = 3
    """iterations left out of the means (compilation and warm-up happen there)"""
    out: str = str(RESULTS_DIR / "update-vs-cpu")
    """folder for update_vs.json"""
    results_md: str = str(RESULTS_MD)
    """markdown file whose update-vs-cpu section is replaced ('' to skip)"""
    report_only: bool = False
    """rewrite the report from `--out`/update_vs.json without measuring"""


def setting_flags(setting: str, iterations: int) -> tuple[int, str]:
    """(num_envs, extra flags for speed.py's breakdown) of a setting."""
    if setting == "halfcheetah":
        flags = read_flags(CONFIG_DIR / "ppo_continuous__HalfCheetah-v5.txt")
        flags += ["--total-timesteps", str(iterations * 2048), "--eval-freq", "0", "--num-eval-envs", "1"]
        return 1, " ".join(flags)
    if setting == "pushcube":
        return 256, ""
    sys.exit(f"error: --settings takes halfcheetah and/or pushcube, got {setting!r}")


SPEED = ("benchmarks/speed/speed.py", "benchmarks/speed.py")
"""Where speed.py is in a checkout: this layout's, or the flat benchmarks/ of older commits."""


def speed_script(repo: Path) -> Path | None:
    """`repo`'s speed.py, in whichever layout the checkout has; None if it has none."""
    return next((repo / path for path in SPEED if (repo / path).is_file()), None)


def speed_command(repo: Path) -> list[str]:
    """How `repo`'s own venv runs its speed.py: as a module of the benchmarks package, or by its path (flat)."""
    python, script = str(repo / ".venv" / "bin" / "python"), speed_script(repo)
    if script == repo / SPEED[0]:
        return [python, "-m", "benchmarks.speed.speed"]
    return [python, str(script)]


def run_one(repo: Path, setting: str, extra: str, args: Args) -> dict:
    """One breakdown of ppo_continuous in `repo`'s venv; the per-iteration means (ms) and the process time (s)."""
    num_envs, flags = setting_flags(setting, args.iterations)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            *speed_command(repo),
            "--parts",
            "breakdown",
            "--scripts",
            "ppo_continuous",
            "--no-cuda",
            "--breakdown-num-envs",
            str(num_envs),
            "--iterations",
            str(args.iterations),
            "--skip",
            str(args.skip),
            f"--extra={flags} {extra}".rstrip(),
            "--out",
            tmp,
            "--results-md",
            "",
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "VIRTUAL_ENV": str(repo / ".venv")}
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
        process_s = time.perf_counter() - start
        if proc.returncode:
            tail = " / ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            sys.exit(f"error: the breakdown in {repo} failed (exit {proc.returncode}): {tail}")
        row = json.loads((Path(tmp) / "speed.json").read_text())["breakdown"][0]
    return {**{k: 1e3 * row[k] for k in PHASES}, "process_s": process_s}


def report(data: dict) -> str:
    a = data["args"]
    lines = [
        f"Side by side, {data['finished']}: ppo_continuous at this commit ({data['git']['git_sha'][:7]}, eager with "
        "`--compile off` and compiled with `--compile on`) against "
        f"{data['other_git']} "
        f"(its own code and venv), {a['rounds']} turns per setting, one thread each; milliseconds per iteration, "
        f"means over iterations {a['skip'] + 1}-{a['iterations']}, medians over turns. The whole process (start-up, "
        "compilation and the rest) is in the last column.",
        "",
        f"- command: `{data['invocation'].replace(a['other_repo'], '<checkout of the other commit>')}`",
        f"- machine: {describe_machine(data['machine'])}",
        "",
    ]
    for setting, runs in data["settings"].items():
        med = {c: {k: statistics.median(r[k] for r in rs) for k in (*PHASES, "process_s")} for c, rs in runs.items()}
        rows = [
            [
                c,
                *(f"{med[c][k]:.1f}" for k in PHASES),
                f"{med['other']['update'] / med[c]['update']:.2f}x",
                f"{med['other']['total'] / med[c]['total']:.2f}x",
                f"{med[c]['process_s']:.0f}",
            ]
            for c in runs
        ]
        name = {
            "halfcheetah": "HalfCheetah-v5, CleanRL's settings (1 env x 2048 steps, 320 minibatches of 64)",
            "pushcube": "PushCubeRL, 256 envs x 20 steps (8 minibatches of 640 x 4 epochs)",
        }[setting]
        lines += [
            f"**{name}**",
            "",
            md_table(
                [
                    "",
                    "iteration",
                    "env",
                    "policy",
                    "update",
                    "rest",
                    "update speed-up vs other",
                    "iteration speed-up vs other",
                    "process (s)",
                ],
                rows,
            ),
            "",
        ]
    return "\n".join(lines).rstrip()


def main(args: Args) -> dict:
    out = Path(args.out)
    if args.report_only:
        if not (out / "update_vs.json").is_file():
            sys.exit(f"error: --report-only: no {out / 'update_vs.json'}; measure first")
        data = json.loads((out / "update_vs.json").read_text())
        if args.results_md:
            write_section(Path(args.results_md), "update-vs-cpu", report(data))
        print(report(data))
        return data
    other = Path(args.other_repo)
    if not (other / ".venv" / "bin" / "python").is_file() or speed_script(other) is None:
        sys.exit(f"error: --other-repo must be a checkout with {' or '.join(SPEED)} and a synced .venv, got {other}")
    if args.rounds < 1 or args.iterations <= args.skip or args.skip < 1:
        sys.exit("error: --rounds must be >= 1 and --iterations > --skip >= 1")
    contestants = {"other": (other, ""), "eager": (REPO, "--compile off"), "compiled": (REPO, "--compile on")}
    settings = {}
    for setting in args.settings:
        runs = {c: [] for c in contestants}
        for turn in range(args.rounds):
            order = list(contestants) if turn % 2 == 0 else list(reversed(contestants))
            for c in order:
                repo, extra = contestants[c]
                runs[c].append(run_one(repo, setting, extra, args))
                r = runs[c][-1]
                print(
                    f"{setting} turn {turn + 1} {c}: iteration {r['total']:.1f} ms, update {r['update']:.1f} ms, "
                    f"process {r['process_s']:.0f} s",
                    flush=True,
                )
        settings[setting] = runs
    other_sha = subprocess.run(
        ["git", "-C", str(other), "log", "-1", "--format=%h %s"], capture_output=True, text=True
    ).stdout.strip()
    data = {
        "invocation": invocation(__file__, sys.argv[1:]),
        "args": vars(args),
        "settings": settings,
        "other_git": f"commit {other_sha.split()[0]}" if other_sha else str(other),
        "machine": machine_info(),
        "git": git_info(),
        "finished": time.strftime("%Y-%m-%d %H:%M"),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "update_vs.json").write_text(json.dumps(data, indent=1) + "\n")
    text = report(data)
    print(text)
    if args.results_md:
        write_section(Path(args.results_md), "update-vs-cpu", text)
    command = data["invocation"].replace(args.other_repo, "<checkout of the other commit>")  # (a path of this machine)
    provenance.record(out, command, None, data["machine"], data["git"])
    return data


if __name__ == "__main__":
    main(tyro.cli(Args))
