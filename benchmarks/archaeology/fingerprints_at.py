"""Today's numeric fingerprints run on the code of other commits: does the code a report's runs ran compute what
today's golden files hold?

    uv run python -m benchmarks.archaeology.fingerprints_at --commits 934c8ec e83f09e \\
        --names env-PushCubeLangRL-fewshot hf_vla

For each commit, a temporary worktree (removed after) runs the fingerprints as tests/numerics.py defines them today
(its configs and record functions, copied in) on that commit's cleanrl_embodied/ and examples/, with that commit's
tests/toy_policies.py, one process per commit, one thread. Each record is compared with today's golden file: within
the tolerance (`first_difference`), and bit for bit. This is how a fingerprint added after a report was measured is
verified for it (docs/benchmarks.md, "stale reports"): identical at every commit its runs used, its digest goes into
the report's provenance.json, saying so; otherwise the report is marked stale. Exit status 1 when some record differs
beyond the tolerance (or failed to run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tyro

REPO = Path(__file__).resolve().parents[2]
"""This repository (not imported from benchmarks.common: the worker runs with the other commit's tree first on its
path, whose benchmarks/ may be laid out otherwise)."""


@dataclass
class Args:
    commits: tuple[str, ...]
    """commits to run the fingerprints at (anything `git rev-parse` reads)"""
    names: tuple[str, ...] = field(default_factory=tuple)
    """fingerprints (names in tests/numerics.py; the two-rank ones are not run here)"""


def worker(tree: Path, names: list[str]) -> None:
    """In a worktree: each fingerprint's record, one JSON line per name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("numerics_today", tree / "tests" / "numerics_today.py")
    numerics = importlib.util.module_from_spec(spec)
    sys.modules["numerics_today"] = numerics
    spec.loader.exec_module(numerics)
    import cleanrl_embodied.shared.envs.push_cube as push_cube

    if not hasattr(push_cube, "expert_action"):  # (before the expert moved into the push_cube package)
        from cleanrl_embodied.shared.envs.push_cube_expert import expert_action

        push_cube.expert_action = expert_action
    for name in names:
        fp = numerics.FINGERPRINTS[name]
        try:
            record = numerics.run_env(fp) if fp.kind == "env" else numerics.run_trainer(fp)
            print(json.dumps({"name": name, "record": record}), flush=True)
        except Exception as e:  # noqa: BLE001 (a commit whose code cannot run today's definition: said, not raised)
            print(json.dumps({"name": name, "error": f"{type(e).__name__}: {e}".splitlines()[0]}), flush=True)


def run_at(commit: str, names: list[str]) -> dict[str, dict]:
    """{name: {"record": ...} or {"error": ...}} for `names` run on the code of `commit`."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True,
                         text=True)  # fmt: skip
    if sha.returncode:
        sys.exit(f"error: --commits {commit}: not a commit of this repository")
    tree = Path(tempfile.mkdtemp(prefix="fingerprints_at_")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha.stdout.strip()], cwd=REPO, check=True,
                   capture_output=True)  # fmt: skip
    try:
        shutil.copy(REPO / "tests" / "numerics.py", tree / "tests" / "numerics_today.py")
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
        done = subprocess.run([sys.executable, __file__, "--worker", str(tree), *names], cwd=tree, env=env,
                              capture_output=True, text=True)  # fmt: skip
        out = {}
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                entry = json.loads(line)
                out[entry.pop("name")] = entry
        for name in names:
            out.setdefault(name, {"error": f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1]}"})
        return out
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
        shutil.rmtree(tree.parent, ignore_errors=True)


def main(args: Args) -> int:
    from tests.numerics import FINGERPRINTS, first_difference

    unknown = [n for n in args.names if n not in FINGERPRINTS or FINGERPRINTS[n].kind == "trainer-2ranks"]
    if unknown or not args.names:
        sys.exit(f"error: --names {' '.join(unknown)}: one or more of "
                 f"{', '.join(n for n, f in FINGERPRINTS.items() if f.kind != 'trainer-2ranks')}")  # fmt: skip
    failed = False
    for commit in args.commits:
        for name, result in run_at(commit, list(args.names)).items():
            if "error" in result:
                failed = True
                print(f"{commit} {name}: failed: {result['error']}")
                continue
            golden = json.loads(FINGERPRINTS[name].golden.read_text())["record"]
            record = json.loads(json.dumps(result["record"]))  # (as a golden file holds it)
            found = first_difference(golden, record)
            failed |= found is not None
            same = "bit for bit" if record == golden else "within the tolerance"
            print(f"{commit} {name}: " + (f"differs: {found}" if found else f"today's golden file ({same})"))
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(Path(sys.argv[2]), sys.argv[3:])
    else:
        sys.exit(main(tyro.cli(Args)))
