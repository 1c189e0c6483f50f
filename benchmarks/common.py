"""Helpers shared by the benchmark scripts: machine description, flag files, TensorBoard scalars, markdown, and the
plumbing of a driver's report (runs.json kept as runs finish, `--report-only`, report.md and its section of
docs/benchmarks.md, the command that measures it again).

Nothing here knows about a particular trainer: runs are read back from what every script writes
(summary.json and TensorBoard scalars, docs/runs.md).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
SCRIPTS_DIR = REPO / "cleanrl_embodied"
CONFIG_DIR = BENCH / "suite" / "configs"  # the flags of each (script, task): the suite's and others'
RESULTS_DIR = REPO / "docs" / "results"  # plots and reports: under the docs site's folder, which serves them
RESULTS_MD = REPO / "docs" / "benchmarks.md"  # the site's benchmarks page: each suite writes its own section
ARCHIVE_MD = REPO / "docs" / "benchmarks-archive.md"  # the sections of stale reports, moved off RESULTS_MD


def fail(message: str) -> None:
    """Stop in one line: `error: message` (the trainers' style)."""
    raise SystemExit(f"error: {message}")


# ---- machine and software ----------------------------------------------------------------------
def cpu_model() -> str:
    from cleanrl_embodied.shared.device import cpu_model  # (torch is imported only when a report needs it)

    return cpu_model()


def gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def git_info() -> dict:
    """The commit of the code that ran (from the trainers' own `versions()`, as in summary.json)."""
    from cleanrl_embodied.shared.run_logger import versions

    return {key: versions().get(key) for key in ("git_sha", "git_dirty")}


def package_versions() -> dict:
    """What summary.json records (python, torch, gymnasium, tensordict, numpy), plus the extras that ran."""
    from cleanrl_embodied.shared.run_logger import versions

    out = {k: v for k, v in versions().items() if not k.startswith("git_")}
    for name in ("mujoco", "mani_skill", "matplotlib"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def machine_info() -> dict:
    """CPU model, logical cores (and how many this process may use), memory, GPU, OS, load average."""
    mem_gib = None
    try:
        kib = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        mem_gib = round(kib / 2**20, 1)
    except (OSError, AttributeError):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": mem_gib,
        "gpu": gpu_name() or "none",
        "os": platform.platform(),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


def describe_machine(machine: dict) -> str:
    return (
        f"{machine['cpu']}, {machine['logical_cores']} logical cores ({machine['usable_cores']} usable), "
        f"{machine['memory_gib']} GiB RAM, GPU: {machine['gpu']}, {machine['os']}"
    )


# ---- commands and flag files -------------------------------------------------------------------
def read_flags(path: Path) -> list[str]:
    """CLI flags from a text file: shell quoting, any whitespace or newlines between tokens, `#` comments."""
    return shlex.split(path.read_text(), comments=True)


def _flag_groups(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """[(flag, values)] from ["--a", "1", "2", "--b", ...]; a flag's values are the tokens up to the next flag."""
    groups: list[tuple[str, list[str]]] = []
    for token in tokens:
        if token.startswith("--"):
            groups.append((token, []))
        elif groups:
            groups[-1][1].append(token)
        else:
            raise ValueError(f"flag value {token!r} comes before any --flag")
    return groups


def _flag_key(flag: str) -> str:
    """`--no-norm-obs` and `--norm-obs` set the same option."""
    return flag[5:] if flag.startswith("--no-") else flag[2:]


def merge_flags(*flag_lists: list[str]) -> list[str]:
    """Concatenate flag lists; a flag given again (or its --no- form) replaces the earlier one in place."""
    merged: dict[str, tuple[str, list[str]]] = {}
    for tokens in flag_lists:
        for flag, values in _flag_groups(list(tokens)):
            merged[_flag_key(flag)] = (flag, values)
    return [token for flag, values in merged.values() for token in (flag, *values)]


def get_flag(tokens: list[str], flag: str) -> list[str] | None:
    for name, values in _flag_groups(tokens):
        if name == flag:
            return values
    return None


def shell_command(cmd: list[str], env: dict[str, str] | None = None) -> str:
    """The command as one would type it in the repository root (interpreter shown as `python`)."""
    shown = [
        "python" if c == sys.executable else os.path.relpath(c, REPO) if c.startswith(str(REPO)) else c for c in cmd
    ]
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    return prefix + shlex.join(shown)


def invocation(path: str, argv: list[str], prefix: str = "uv run python", join: Callable = shlex.join) -> str:
    """The command that runs the benchmark module at `path` (a file under benchmarks/) with the arguments `argv`
    from the repository root: `uv run python -m benchmarks.<folder>.<name> ...`."""
    module = ".".join(Path(path).resolve().relative_to(REPO).with_suffix("").parts)
    return f"{prefix} -m {module}" + (f" {join(argv)}" if argv else "")


# ---- TensorBoard --------------------------------------------------------------------------------
def read_scalars(run_dir: Path) -> dict[str, tuple[list[int], list[float]]]:
    """Every scalar series of a run directory: {tag: (steps, values)}, all points kept."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {
        tag: ([e.step for e in acc.Scalars(tag)], [e.value for e in acc.Scalars(tag)]) for tag in acc.Tags()["scalars"]
    }


def scalar_wall_times(run_dir: Path, tag: str) -> tuple[list[int], list[float]]:
    """(steps, event wall times) of one scalar, to measure steady-state speed between iterations."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars(tag)
    return [e.step for e in events], [e.wall_time for e in events]


def steady_sps(run_dir: Path, skip: int) -> float:
    """Median over iterations after `skip` of (env steps of the iteration) / (time between its SPS events)."""
    steps, wall = scalar_wall_times(run_dir, "charts/SPS")
    rates = [
        (steps[i] - steps[i - 1]) / (wall[i] - wall[i - 1])
        for i in range(max(1, skip), len(steps))
        if wall[i] > wall[i - 1]
    ]
    return statistics.median(rates) if rates else float("nan")


# ---- a published run again ---------------------------------------------------------------------
def command_of(run: dict, output_dir: str) -> tuple[list[str], dict[str, str]]:
    """The run's published command as argv for this interpreter, with its env assignments and a new output dir."""
    tokens, env = shlex.split(run["command"]), dict(os.environ)
    while tokens and "=" in tokens[0] and not tokens[0].startswith("-"):
        key, _, value = tokens.pop(0).partition("=")
        env[key] = value
    if tokens[0] != "python":
        raise ValueError(f"unexpected command (not 'python ...'): {run['command']}")
    argv = [sys.executable, *tokens[1:]]
    i = argv.index("--output-dir")
    argv[i + 1] = output_dir
    return argv, env


def last_step(output_dir: Path) -> int:
    """The last env step the run under `output_dir` has logged (-1 before its first iteration)."""
    events = sorted(output_dir.rglob("events.out.tfevents.*"))
    steps = read_scalars(events[0].parent).get("charts/learning_rate", ([], []))[0] if events else []
    return max(steps) if steps else -1  # charts/learning_rate: logged every iteration


# ---- PushCubeRL's step alone ---------------------------------------------------------------------
def env_throughput(num_envs: int, device: str, steps: int, repeats: int) -> float:
    """Median env-steps/s of PushCubeRL's step() with pre-drawn random actions."""
    import torch

    from cleanrl_embodied.shared import make_env

    env = make_env("PushCubeRL", num_envs=num_envs, device=device, seed=0)
    env.reset(seed=0)
    actions = torch.rand(steps, num_envs, env.single_action_space.shape[0], device=device) * 2 - 1
    for t in range(min(20, steps)):  # warm-up
        env.step(actions[t])
    rates = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        for t in range(steps):
            env.step(actions[t])
        sync(device)
        rates.append(num_envs * steps / (time.perf_counter() - start))
    env.close()
    return statistics.median(rates)


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


# ---- markdown -----------------------------------------------------------------------------------
def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(md_path: Path, name: str, body: str) -> None:
    """Replace the text between `<!-- BEGIN name -->` and `<!-- END name -->` in md_path (append the
    section at the end if it is not there yet), so re-running a suite updates its own part only. A section of the
    benchmarks page that was moved to the archive page (ARCHIVE_MD) is updated there; tests/test_reports.py then
    asks for it to be moved back, now that it is fresh."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    if Path(md_path) == RESULTS_MD and ARCHIVE_MD.is_file() and begin in ARCHIVE_MD.read_text():
        md_path = ARCHIVE_MD
    text = md_path.read_text() if md_path.exists() else "# Benchmark results\n"
    block = f"{begin}\n{body.strip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    md_path.write_text(text)


def image_prefix(out: Path, md_path: Path) -> str:
    """How a link from the page `md_path` to a file of the report folder `out` starts."""
    return os.path.relpath(out, Path(md_path).resolve().parent).replace(os.sep, "/") + "/"


def failed_lines(failed: list[dict]) -> list[str]:
    """The report's list of failed runs (records with `command`, `returncode` and `error`); none: no lines."""
    if not failed:
        return []
    return ["", "Failed runs:", "", *(f"- `{r['command']}` (exit {r['returncode']}): {r.get('error', '')}"
                                      for r in failed)]  # fmt: skip


def record_lines(
    command: str, machine: dict, load_avg_end, git: dict, versions: dict | None = None, note: str = ""
) -> list[str]:
    """A report's bullets of where its figures come from: the command (`note` follows it: how a peer was
    installed), the machine with its load at start and end, the library versions (when given) and the commit."""
    return [
        f"- command: `{command}`{note}",
        f"- machine: {describe_machine(machine)}; load average (1/5/15 min) at start {machine['load_avg_1_5_15']}, "
        f"at end {load_avg_end}",
        *([f"- versions: {', '.join(f'{k} {v}' for k, v in versions.items())}"] if versions else []),
        f"- git: {git['git_sha']}{' (uncommitted changes)' if git.get('git_dirty') else ''}",
    ]


def commands_block(commands: list[str], note: str = "") -> list[str]:
    """The report's folded block of the exact commands its runs ran; `note` is added to the summary line."""
    summary = f"Exact commands (from the repository root; python = the uv environment's interpreter{note})"
    return ["", f"<details><summary>{summary}</summary>", "", "```", *commands, "```", "", "</details>"]


# ---- a driver's runs and report -----------------------------------------------------------------
def save_runs(data: dict, out: Path) -> None:
    """`out`/runs.json, atomically: what is done so far survives a crash (--report-only reads it)."""
    out.mkdir(parents=True, exist_ok=True)
    partial = out / ".runs.json.tmp"
    partial.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(partial, out / "runs.json")


def saved_runs(out: Path, what: str) -> dict:
    """runs.json of `out`, for `--report-only`; without one, exit in one line (run `what` first)."""
    if not (out / "runs.json").is_file():
        raise SystemExit(f"error: --report-only: no {out / 'runs.json'}; run {what} first")
    return json.loads((out / "runs.json").read_text())


def finished(data: dict, start: float) -> None:
    """Record in `data` how long the runs took since `start` (time.time()), when they ended and the load then."""
    data.update(total_s=round(time.time() - start, 1), finished=time.time(),
                load_avg_end=machine_info()["load_avg_1_5_15"])  # fmt: skip


def write_report(out: Path, title: str, report: Callable[[str], str], results_md: str, section: str = "") -> None:
    """`out`/report.md (`title`, then `report("")`) and, with a `results_md` page, its section there (named `section`,
    by default the folder's name) with `report(prefix)`, where `prefix` starts links to the folder's files."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(f"{title}\n\n{report('')}\n")
    if results_md:
        md = Path(results_md)
        write_section(md, section or out.name, report(image_prefix(out, md)))
    print(f"wrote {out / 'report.md'}", flush=True)
