"""Where every published figure comes from, and whether the code still computes what it measured.

Each report folder under docs/results/ holds a `provenance.json`: the date and machine, the one command that measures
it again, the exact command of each run, and the code each run ran: `runs_at` groups the runs by the commit each
started from, with the digest of each numeric fingerprint (tests/numerics.py) its runs depend on as the golden file of
that commit holds it (`commit` and `fingerprints`: the commit the report was written at and its digests; alone, in an
older file, they stand for every run). A report is stale when a recorded digest is not today's, when a run's commit is
unknown, or when a run depends on a fingerprint the report holds no digest of, until it is measured again:

    uv run python -m benchmarks.suite.provenance                  # every report: fresh, or why it is stale
    uv run python -m benchmarks.suite.provenance --mark-stale   # mark those reports stale (provenance.json and a banner
                                                            #   at the top of the report); then mark the docs' quotes

A stale report stays published, with its banner, until its command is run again; every paragraph of README.md and
docs/ that quotes it (links its folder or its section of docs/benchmarks.md) must say "stale" (tests/test_reports.py
checks it, and that every linked report exists and names a commit of this repository). docs/benchmarks.md describes
the rules.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import importlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

from benchmarks.common import ARCHIVE_MD, REPO, RESULTS_DIR, RESULTS_MD, describe_machine, machine_info

GOLDEN_DIR = REPO / "tests" / "golden"
FILE = "provenance.json"
STALE_BANNER = "> **Stale:**"
"""The first line of a stale report's markdown starts with this (and says which fingerprints moved, since when)."""

# What each script's numbers depend on, besides the env fingerprint of the env it runs (`ENV_FINGERPRINTS`).
COMPILED_FINGERPRINTS = {"ppo_continuous": "ppo_continuous-compiled"}
"""The fingerprint of a trainer's compiled path: a command with `--compile on` depends on it too. (A `--compile auto`
run decides by measuring, and its summary.json says which path it took; a report that must be rerun bit for bit
names on or off.)"""

SCRIPT_FINGERPRINTS = {
    "ppo_continuous": ["ppo_continuous"],
    "ppo_recurrent": ["ppo_recurrent"],
    "grpo": ["grpo"],
    "ppo_ddp": ["ppo_ddp"],
    "ppo_vla": ["ppo_vla"],
    "grpo_vla": ["grpo_vla"],
    "ppo_vla_async": ["ppo_vla_async"],
    "ppo_vla_ddp": ["ppo_vla_ddp"],
    # examples/hf_vla's scripts: the policy, and PushCubeLangRL with images (and the diagonal tasks and view_tasks of
    # pretrain.py, demos.py and fewshot.py) driven by its scripted expert or the policy
    "bc": ["hf_vla", "env-PushCubeLangRL", "env-PushCubeLangRL-fewshot"],
    "dagger": ["hf_vla", "env-PushCubeLangRL", "env-PushCubeLangRL-fewshot"],
    "pretrain": ["hf_vla", "env-PushCubeLangRL", "env-PushCubeLangRL-fewshot"],
    "demos": ["env-PushCubeLangRL", "env-PushCubeLangRL-fewshot"],
    "fewshot": ["hf_vla", "env-PushCubeLangRL", "env-PushCubeLangRL-fewshot"],
    # benchmark drivers: what the runs they start depend on
    "run": [],  # its runs' own commands are recorded
    "vla_rl": ["hf_vla", "grpo_vla", "ppo_vla", "env-PushCubeLangRL", "env-PushCubeLangRL-fewshot"],
    "vla_fewshot": ["hf_vla", "grpo_vla", "ppo_vla", "env-PushCubeLangRL", "env-PushCubeLangRL-fewshot"],
    "vs_cleanrl": ["ppo_continuous"],
    "vs_mjlab": ["ppo_continuous"],  # mjlab's tasks have no fingerprint (the extra is not in the numerics tests' env)
    "vs_rsl_rl": ["ppo_continuous", "env-PushCubeRL"],
    "rsl_rl_push_cube": ["env-PushCubeRL"],  # rsl_rl's PPO on our PushCubeRL (vs_rsl_rl's peer)
    "speed": ["ppo_continuous", "env-PushCubeRL"],
    "update_vs": ["ppo_continuous"],
    "async_speed": ["ppo_vla_async"],
    "push_cube_env_speed": ["env-PushCubeRL"],
    "push_cube_rgb_speed": ["env-PushCubeRL"],
    "push_cube_variants": ["env-PushCubeRL"],
    "vla_memory": ["hf_vla"],
    "pomdp": ["ppo_recurrent", "ppo_continuous", "env-PushCubeRL", "env-PushCubeRL-dropout"],
    "sb3_recurrent_ppo": [],  # sb3-contrib's RecurrentPPO (pomdp.py's peer): none of this project's numbers
    "gpu_check": ["ppo_continuous", "grpo", "ppo_ddp", "ppo_vla", "grpo_vla", "ppo_vla_async", "ppo_vla_ddp",
                  "hf_vla", "env-PushCubeRL", "env-PushCubeLangRL"],
}  # fmt: skip
ENV_FINGERPRINTS = {"PushCubeRL": "env-PushCubeRL", "PushCubeLangRL": "env-PushCubeLangRL"}
PIXEL_FINGERPRINTS = {"ppo_continuous": "ppo_continuous-pixels", "ppo_recurrent": "ppo_recurrent-gru-pixels"}
"""The fingerprint of a trainer's image path (its encoder), for runs whose env observes images."""
IMAGE_OBS_MODES = ("rgb", "proprio+rgb", "state+rgb")  # PushCubeRL's (shared/envs/push_cube/options.py)
DROPOUT_FINGERPRINT = "env-PushCubeRL-dropout"  # PushCubeRL's sensor dropout (env kwarg dropout_sensor)
LANG_FINGERPRINT = "env-PushCubeLangRL-fewshot"
"""PushCubeLangRL with images, the diagonal tasks and view_tasks (the published VLA runs' env), driven by the expert"""
LANG_OPTIONS = ("tasks", "view_tasks", "obs_cameras", "image_size")  # (or an image obs_mode) for LANG_FINGERPRINT
HF_VLA_FINGERPRINT = "hf_vla"  # the policy of examples/hf_vla (--policy examples.hf_vla:make_policy)


def flags(tokens: list[str]) -> dict[str, str | bool]:
    """The flags of a script's arguments as its CLI (tyro) reads them: `--name value` or `--name=value` (a flag's
    first value; more values, as `--hidden-sizes 64 64`, are not needed here), `--name` alone True and `--no-name`
    False; `-` and `_` alike in names (keys: the Args field names)."""
    out: dict[str, str | bool] = {}
    for i, token in enumerate(tokens):
        if not token.startswith("--") or token == "--":
            continue
        name, eq, value = token[2:].partition("=")
        name = name.replace("-", "_")
        if eq:
            out[name] = value
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out[name] = tokens[i + 1]
        elif name.startswith("no_"):
            out[name[3:]] = False
        else:
            out[name] = True
    return out


@functools.cache
def script_defaults(script: str) -> dict:
    """The defaults of a trainer's flags: the fields of `cleanrl_embodied.<script>.Args` ({} for a script that is
    not a trainer of this package)."""
    try:
        args = importlib.import_module(f"cleanrl_embodied.{script}").Args
    except (ImportError, AttributeError):
        return {}
    if not dataclasses.is_dataclass(args):
        return {}
    out = {}
    for f in dataclasses.fields(args):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _json_object(value) -> dict:
    try:
        parsed = json.loads(value) if isinstance(value, str) else {}
    except json.JSONDecodeError:  # (a run that stopped at its argument check)
        return {}
    return parsed if isinstance(parsed, dict) else {}


OUR_PACKAGES = ("benchmarks", "cleanrl_embodied", "examples")
"""The packages whose modules a command may run with `python -m` (`-m benchmarks.suite.run`)."""


def script_of(tokens: list[str]) -> tuple[int, str, str] | None:
    """(index, folder, stem) of the script a command runs: the first `.py` argument (`benchmarks/suite/run.py`, as older
    records name the benchmarks, `cleanrl_embodied/ppo_continuous.py`) or the module after `-m`, when it is one of
    this repository's (`-m benchmarks.suite.run`: folder `suite`, stem `run`); None without one."""
    for i, token in enumerate(tokens):
        if token.endswith(".py"):
            path = Path(token)
            return i, path.parent.name, path.stem
        if token == "-m" and i + 1 < len(tokens) and tokens[i + 1].split(".")[0] in OUR_PACKAGES:
            *package, stem = tokens[i + 1].split(".")
            return i + 1, package[-1] if package else "", stem
    return None


def depends_on(command: str) -> list[str]:
    """The fingerprints a command's numbers depend on. The command is split as the shell splits it, its script is
    found by `script_of`, and its flags are read as the script's CLI reads them over the trainer's defaults
    (`script_defaults`): the script's fingerprints (`SCRIPT_FINGERPRINTS`), its env's (with the sensor dropout's
    where its env kwargs or eval env kwargs turn it on, and PushCubeLangRL's images and tasks where they name them),
    the trainer's image path where the env observes images, and examples/hf_vla's where the policy is that
    package's."""
    tokens = shlex.split(command)
    found = script_of(tokens)
    if found is None:
        return []
    at, package, script = found
    args = {**(script_defaults(script) if package == "cleanrl_embodied" else {}), **flags(tokens[at + 1 :])}
    names = set(SCRIPT_FINGERPRINTS.get(script, []))
    if args.get("compile") == "on" and script in COMPILED_FINGERPRINTS:
        names.add(COMPILED_FINGERPRINTS[script])
    env_id = args.get("env_id")
    for kwargs in (_json_object(args.get("env_kwargs")), _json_object(args.get("eval_env_kwargs"))):
        images = kwargs.get("obs_mode") in IMAGE_OBS_MODES
        if env_id in ENV_FINGERPRINTS:
            names.add(ENV_FINGERPRINTS[env_id])
            if kwargs.get("dropout_sensor"):
                names.add(DROPOUT_FINGERPRINT)
            if env_id == "PushCubeLangRL" and (images or any(k in kwargs for k in LANG_OPTIONS)):
                names.add(LANG_FINGERPRINT)
        if images and script in PIXEL_FINGERPRINTS:
            names.add(PIXEL_FINGERPRINTS[script])
    if str(args.get("policy") or "").startswith("examples.hf_vla"):
        names.add(HF_VLA_FINGERPRINT)
    return sorted(names)


def _digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def golden_digest(name: str) -> str | None:
    """A short hash of the numbers in a fingerprint's golden file today, on disk (None when it has none)."""
    path = GOLDEN_DIR / f"{name}.json"
    return _digest(json.loads(path.read_text())["record"]) if path.is_file() else None


@functools.cache
def digest_at(commit: str | None, name: str) -> str | None:
    """The same hash of the golden file as commit `commit` holds it (`git show <commit>:tests/golden/<name>.json`;
    None when that commit has no such file, or the commit is unknown)."""
    if not commit:
        return None
    path = f"{commit}:{GOLDEN_DIR.relative_to(REPO).as_posix()}/{name}.json"
    shown = subprocess.run(["git", "show", path], cwd=REPO, capture_output=True, text=True)
    return _digest(json.loads(shown.stdout)["record"]) if shown.returncode == 0 else None


def git_commit() -> tuple[str, bool]:
    """(HEAD's full sha, whether tracked files other than the records under docs/results/ differ from it: the rule of
    the runs' own `git_dirty`)."""
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", ".", ":!docs/results"], cwd=REPO).returncode != 0
    return sha, dirty


def _depends(command: str) -> list[str]:
    try:
        return depends_on(command)
    except ValueError:  # (a command the shell cannot split: an old record's typo)
        return []


def record(
    out_dir: Path,
    command: str,
    runs: list[str] | None = None,
    machine: dict | None = None,
    git: dict | None = None,
    run_git: list[dict | None] | None = None,
) -> dict:
    """Write `out_dir`/provenance.json for a report written now, by `command` (the command that measures it again),
    from the runs `runs` (exact commands; default: `command` alone), on `machine` (`machine_info()`), at the commit
    `git` ({"git_sha", "git_dirty"} as taken when the driver started; default: HEAD now).

    `run_git`: each run's commit as the run recorded it ({"git_sha", "git_dirty"}: a trainer's summary.json
    `versions`, a run's time file), None where it is not known; default: every run at `git`. The runs are grouped by
    commit in `runs_at`, each group with the digests of what its runs depend on as the golden files of its commit
    hold them (`digest_at`); `fingerprints` holds those of everything the report depends on at `git`'s commit. None
    of it reads the golden files on disk: a report written after its runs (--report-only) is judged by the code its
    runs ran, whatever the tree holds when it is written."""
    sha, dirty = (git["git_sha"], git["git_dirty"]) if git else git_commit()
    runs = runs or [command]
    run_git = run_git if run_git is not None else [{"git_sha": sha, "git_dirty": dirty}] * len(runs)
    if len(run_git) != len(runs):
        raise ValueError(f"run_git: {len(run_git)} commits for {len(runs)} runs")
    groups: dict[tuple, list[int]] = {}
    for i, at in enumerate(run_git):
        groups.setdefault(((at or {}).get("git_sha") or None, (at or {}).get("git_dirty")), []).append(i)
    runs_at = []
    for (commit, commit_dirty), indices in groups.items():
        names = sorted({n for i in indices for n in _depends(runs[i])})
        runs_at.append({"commit": commit, "dirty": commit_dirty, "runs": indices,
                        "fingerprints": {name: digest_at(commit, name) for name in names}})  # fmt: skip
    names = sorted({n for c in [command, *runs] for n in _depends(c)})
    body = {
        "commit": sha,
        "dirty": dirty,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": describe_machine(machine or machine_info()),
        "command": command,
        "runs": runs,
        "fingerprints": {name: digest_at(sha, name) for name in names},
        "runs_at": runs_at,
        "stale": None,
    }
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / FILE).write_text(json.dumps(body, indent=1) + "\n")
    return body


def commits_of(run_records: list[dict], default: dict) -> list[dict]:
    """Each run record's commit as its trainer wrote it (the `versions` of its summary.json: git_sha, git_dirty), or
    `default` for a record without one (a failed run, or another project's: run by this invocation, at its commit)."""
    return [(r.get("summary") or {}).get("versions") or default for r in run_records]


def load(report: Path) -> dict:
    return json.loads((report / FILE).read_text())


def run_groups(prov: dict) -> list[dict]:
    """The report's runs by the commit they ran at: `runs_at` ({"commit", "runs": [indices], "fingerprints"}); an
    older provenance.json, which has none, is one group: its commit and digests stand for all its runs."""
    if "runs_at" in prov:
        return prov["runs_at"]
    return [{"commit": prov["commit"], "runs": list(range(len(prov["runs"]))), "fingerprints": prov["fingerprints"]}]


def why_stale(prov: dict) -> str | None:
    """Why the code no longer computes what the report measured (None when it still does): it predates the
    fingerprints (`"fingerprints": null`); or the golden numbers of a fingerprint its runs (or its command) depend on
    differ today from the digest recorded for them (that of the golden file at the runs' commit); or some ran at an
    unknown commit; or they depend on a fingerprint it holds no digest of (one added since, not yet verified)."""
    if prov["fingerprints"] is None:
        return "measured before the numeric fingerprints existed, by code whose numbers have changed since"
    moved: dict[str, set[str]] = {}  # name -> the commits of the runs whose digest differs ("" for the report's)
    absent: dict[str, set[str]] = {}  # name -> the commits of the runs that had no golden file of it
    unknown: set[str] = set()
    missing: set[str] = set()
    command = {"commit": prov["commit"], "runs": [], "fingerprints": prov["fingerprints"], "own": True}
    for group in [command, *(run_groups(prov) if "runs_at" in prov else [])]:
        needs = {n for i in group["runs"] for n in _depends(prov["runs"][i])}
        if group.get("own"):
            needs |= set(_depends(prov["command"]))
            if "runs_at" not in prov:  # (an older file: its digests stand for all its runs)
                needs |= {n for run in prov["runs"] for n in _depends(run)}
        if group["runs"] and not group["commit"]:
            unknown |= set(group["fingerprints"])
            continue
        for name, digest in group["fingerprints"].items():
            if golden_digest(name) != digest:
                at = moved if digest is not None else absent
                at.setdefault(name, set()).add("" if group.get("own") else group["commit"][:7])
        missing |= needs - set(group["fingerprints"])
    parts = []
    if moved:
        named = [name + (f" (its runs at {', '.join(sorted(c for c in at if c))})" if any(at) else "")
                 for name, at in sorted(moved.items())]  # fmt: skip
        parts.append(f"the numbers of {', '.join(named)} have changed since (tests/numerics.py)")
    if absent:
        commits = sorted({c or "the report's commit" for at in absent.values() for c in at})
        parts.append(f"{', '.join(sorted(absent))}: no golden file at {', '.join(commits)}, where its runs ran")
    if unknown:
        parts.append(f"runs depending on {', '.join(sorted(unknown))} ran at an unknown commit")
    if missing:
        parts.append(f"its runs depend on {', '.join(sorted(missing))}, which it holds no digest of (verify the runs' "
                     "commits compute what today's golden files hold, or measure it again)")  # fmt: skip
    return "; ".join(parts) or None


def report_markdown(report: Path) -> Path | None:
    """The report's markdown page (report.md, or the one .md the benchmark writes), if it has one."""
    pages = sorted(report.glob("*.md"))
    return next((p for p in pages if p.name == "report.md"), pages[0] if pages else None)


def banner(report: Path, prov: dict) -> str:
    """The stale banner: when and at which commit `report` was measured, why it is stale, and how to measure it again:
    its command, or the record's own sentence (`again`) where that command no longer runs as it ran."""
    again = prov["stale"].get("again") or f"Measure it again with `{prov['command']}`."
    return (f"{STALE_BANNER} `docs/results/{report.name}` was measured at commit {prov['commit'][:10]} "
            f"({prov['date']}); {prov['stale']['why']}. {again}")  # fmt: skip


def mark_stale(report: Path, why: str, again: str | None = None) -> None:
    """Record in provenance.json that `report` is stale, and put a banner at the top of its markdown page and of its
    section in docs/benchmarks.md or docs/benchmarks-archive.md (between its BEGIN/END markers). `again`: a sentence
    that says how it is measured again, for a report whose recorded command no longer runs (a config it named is
    gone); the banner then gives it instead of the command."""
    prov = load(report)
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    prov["stale"] = {"since": today, "why": why} | ({"again": again} if again else {})
    (report / FILE).write_text(json.dumps(prov, indent=1) + "\n")
    page = report_markdown(report)
    if page is not None:
        text = page.read_text()
        if text.startswith(STALE_BANNER):
            text = text.split("\n\n", 1)[1] if "\n\n" in text else ""
        page.write_text(banner(report, prov) + "\n\n" + text)
    begin = f"<!-- BEGIN {report.name} -->\n"
    for md in (RESULTS_MD, ARCHIVE_MD):  # (its section is on the benchmarks page or the archive)
        if not (md.is_file() and begin in md.read_text()):
            continue
        head, rest = md.read_text().split(begin, 1)
        blocks = rest.lstrip("\n").split("\n\n")
        blocks = [b for b in blocks[:3] if not b.startswith(STALE_BANNER)] + blocks[3:]  # (an older banner)
        at = 1 if blocks[0].startswith("#") else 0  # under the section's own heading
        blocks.insert(at, banner(report, prov))
        md.write_text(head + begin + "\n" + "\n\n".join(blocks))


def main(mark: bool = False) -> int:
    """Print each report's state; with ``mark``, mark the reports that are stale but not yet marked."""
    rows = []
    for report in sorted(p for p in RESULTS_DIR.iterdir() if p.is_dir()):
        if not (report / FILE).is_file():
            rows.append((report.name, f"no {FILE}"))
            continue
        prov = load(report)
        why = why_stale(prov)
        if prov["stale"]:
            rows.append((report.name, f"stale since {prov['stale']['since']}: {prov['stale']['why']}"))
        elif why:
            rows.append((report.name, ("marked stale: " if mark else "STALE, not yet marked: ") + why))
            if mark:
                mark_stale(report, why)
        else:
            at = sorted({g["commit"][:7] for g in run_groups(prov) if g["commit"] and g["commit"] != prov["commit"]})
            runs = f"; runs also at {', '.join(at)}" if at else ""
            rows.append((report.name, f"fresh (commit {prov['commit'][:10]}, {prov['date']}{runs})"))
    width = max(len(name) for name, _ in rows)
    for name, status in rows:
        print(f"{name:<{width}}  {status}")
    return 0


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Which reports under docs/results/ are fresh, and which are stale.")
    parser.add_argument("--mark-stale", action="store_true", help="mark the reports found stale (banner, record)")
    sys.exit(main(parser.parse_args().mark_stale))
