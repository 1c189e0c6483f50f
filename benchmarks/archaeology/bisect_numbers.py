"""Which commits changed what a run computes? Run one short command at commits between two, find every change.

    uv run python -m benchmarks.archaeology.bisect_numbers --good cb89760 --bad HEAD \\
        --command "python cleanrl_embodied/ppo_continuous.py --env-kwargs '{\\"obs_mode\\": \\"proprio+rgb\\"}' \\
                   --num-envs 64 --num-steps 20 --total-timesteps 5120 --eval-freq 1000 --num-eval-envs 8 \\
                   --num-eval-episodes 8 --save-freq 0 --no-cuda --seed 1"

On the CPU a run is bit-deterministic, so a few iterations of the same command give the same numbers at two commits
unless one of the commits between them changed what the run computes (its losses, its parameters, the env's
rewards). This script checks each commit out into a temporary git worktree (the repository itself is untouched),
runs `--command` there with this environment's interpreter (`python` in it is replaced, one thread,
`--output-dir` set) and reads the run's fingerprint: every scalar it logged except the clock's, and per-tensor sums
of its final parameters (last.pt). It bisects the first-parent history from `--good` to `--bad` and prints every
commit whose fingerprint differs from its parent's, and the command's output where a commit fails to run. A commit
that changes the numbers is not yet a commit that changes learning: a new random stream or a reordered sum changes
every number and trains a statistically equivalent run. docs/benchmarks.md ("The pixel curve that slowed") shows
how the change points were then compared by learning.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tyro

from benchmarks.common import REPO, read_scalars


@dataclass
class Args:
    good: str
    """the older commit"""
    bad: str = "HEAD"
    """the newer commit"""
    command: str = ""
    """a short trainer command, as typed in the repository root (`python cleanrl_embodied/...`); no --output-dir"""


def git(*argv: str) -> str:
    return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def commit_of(name: str, flag: str) -> str:
    """The full hash of the commit `name` (anything `git rev-parse` takes); one line naming `flag` if it is none."""
    proc = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"], cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode:
        sys.exit(f"error: {flag} {name}: not a commit (`git rev-parse {name}` names none in {REPO})")
    return proc.stdout.strip()


def parameter_sums(ckpt: Path) -> list[tuple[float, float]]:
    """The sum and the absolute sum of every floating-point tensor of a checkpoint's "model", sorted. Read with
    torch.load(weights_only=True): a file that holds more than tensors and plain values (a pickle that could run
    code) raises pickle.UnpicklingError and runs nothing."""
    import torch

    model = torch.load(ckpt, map_location="cpu", weights_only=True)["model"]
    return sorted(
        (float(t.double().sum()), float(t.double().abs().sum())) for t in model.values() if t.is_floating_point()
    )


def fingerprint(commit: str, command: str) -> str:
    """A short hash of what `command` computes at `commit` (its logged scalars but the clock's and its final
    parameters' sums), or "failed: <last line of its output>" (or why its last.pt could not be read)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "out"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=REPO, capture_output=True)
        try:
            tokens = shlex.split(command)
            argv = [sys.executable, *tokens[1:], "--output-dir", str(out)]
            env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
            proc = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
            runs = [p.parent for p in out.rglob("events.out.tfevents.*")]
            if proc.returncode or not runs:
                lines = (proc.stderr or proc.stdout).strip().splitlines() or [f"exit {proc.returncode}"]
                return f"failed: {lines[-1][:200]}"
            scalars = {k: v for k, v in read_scalars(runs[0]).items() if k != "charts/SPS"}
            params = []
            for ckpt in sorted(runs[0].rglob("last.pt")):
                try:
                    params = parameter_sums(ckpt)
                except pickle.UnpicklingError as e:
                    reason = str(e).strip().splitlines()[0][:160]
                    return f"failed: {ckpt.name} refused by torch.load(weights_only=True) (not only tensors): {reason}"
            blob = json.dumps({"scalars": scalars, "params": params}, sort_keys=True)
            return hashlib.sha256(blob.encode()).hexdigest()[:12]
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)


def change_points(at, n: int) -> list[int]:
    """The indices i in 1..n-1 where ``at(i) != at(i - 1)``, found by bisection: ``at`` (a commit's fingerprint by
    its index) is asked about O(changes x log n) commits, not n. Equal ends of a span are taken to mean no change
    inside it (a change undone later in the same span goes unseen)."""
    found: list[int] = []

    def search(lo: int, hi: int) -> None:
        if at(lo) == at(hi):
            return
        if hi - lo == 1:
            found.append(hi)
            return
        mid = (lo + hi) // 2
        search(lo, mid)
        search(mid, hi)

    search(0, n - 1)
    return found


def main(args: Args) -> list[str]:
    if not args.command.startswith("python "):
        sys.exit(f"error: --command must start with 'python ' (a trainer command), got {args.command!r}")
    try:
        shlex.split(args.command)
    except ValueError as e:
        sys.exit(f"error: --command: {e} (a command as typed in a shell): {args.command!r}")
    good, bad = commit_of(args.good, "--good"), commit_of(args.bad, "--bad")
    span = git("rev-list", "--first-parent", "--reverse", f"{good}..{bad}").split()
    commits = [good, *span]
    seen: dict[int, str] = {}

    def at(i: int) -> str:
        if i not in seen:
            seen[i] = fingerprint(commits[i], args.command)
            print(f"{commits[i][:10]} {seen[i]}  {git('log', '-1', '--format=%s', commits[i])[:80]}", flush=True)
        return seen[i]

    changed = [commits[i] for i in change_points(at, len(commits))]
    print(f"\n{len(changed)} commit(s) of {len(commits) - 1} changed what the command computes:")
    for commit in changed:
        merge = len(git("log", "-1", "--format=%P", commit).split()) > 1
        hint = f" (a merge: bisect its branch, --good {git('merge-base', f'{commit}^1', f'{commit}^2')[:10]} " \
               f"--bad {commit[:10]}^2)" if merge else ""  # fmt: skip
        print(f"  {commit[:10]} {git('log', '-1', '--format=%s', commit)[:100]}{hint}")
    return changed


if __name__ == "__main__":
    main(tyro.cli(Args))
