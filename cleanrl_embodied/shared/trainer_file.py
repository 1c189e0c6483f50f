"""The trainer file a run comes from: its name, path, content hash, git state and the code of its network.

A copy of a trainer is a trainer of its own (docs/copy-and-modify.md): ``describe_trainer(__file__)`` is what a run,
its summary.json and its checkpoints record of the file that made them, and ``network_differences`` says whether a
checkpoint's weights mean in this file what they meant in the one that wrote them.

- ``script``: the file's stem (``my_ppo.py`` -> ``my_ppo``), as in CleanRL: the name of the run directory, of
  summary.json's ``script`` and of the checkpoint's.
- ``path`` and ``sha256``: where the file is and a hash of its bytes.
- ``network``: {definition: hash} of the module-level functions, classes and constants that build and run the
  network, found from ``make_agent`` and ``eval_action`` by following the names their code uses (annotations and
  docstrings left out, the code compared as parsed Python, so formatting and comments change nothing). Two files
  whose ``network`` entries are equal build the same network from the same flags and act with it the same way.
- ``git``: the file's state in git. ``state`` is ``clean``, ``modified`` or ``untracked`` for a file in the
  repository of this package, ``not in this repository`` for one outside it (``repository``/``commit``/``file``
  then describe the repository that holds it, if any), ``unknown`` where git cannot tell.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["NETWORK_ROOTS", "describe_trainer", "network_definitions", "network_differences"]

NETWORK_ROOTS = ("make_agent", "eval_action")
"""Where the code of a trainer's network starts: the function that builds it from the flags and the one that acts."""

PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _code_only(node: ast.AST) -> ast.AST:
    """A copy of ``node`` without what computes nothing: bare string statements (docstrings) and the annotations of
    function arguments and returns."""
    node = copy.deepcopy(node)
    for sub in ast.walk(node):
        if isinstance(sub, ast.arg):
            sub.annotation = None
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
            sub.returns = None
        body = getattr(sub, "body", None)
        if isinstance(body, list):
            kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                            and isinstance(s.value.value, str))]  # fmt: skip
            sub.body = kept or [ast.Pass()]
    return node


def _names_used(node: ast.AST) -> set[str]:
    """The plain names that ``node``'s code reads, annotations left out (they name types, they compute nothing)."""
    names: set[str] = set()

    def visit(sub: ast.AST) -> None:
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        for field, value in ast.iter_fields(sub):
            if field in ("annotation", "returns"):
                continue
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    visit(child)

    visit(node)
    return names


def _definitions(tree: ast.Module) -> dict[str, ast.AST]:
    """{name: node} of a module's top-level functions, classes and assigned constants."""
    found: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = node
    return found


def network_definitions(source: str, roots: tuple[str, ...] = NETWORK_ROOTS) -> dict[str, str]:
    """{definition: sha256 of its code} of the definitions reachable from ``roots`` in a trainer's ``source``."""
    defs = _definitions(ast.parse(source))
    found: dict[str, str] = {}
    todo = [name for name in roots if name in defs]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        node = _code_only(defs[name])
        found[name] = hashlib.sha256(ast.dump(node).encode()).hexdigest()
        todo += sorted(n for n in _names_used(node) if n in defs and n not in found)
    return dict(sorted(found.items()))


def network_differences(theirs: dict[str, str], ours: dict[str, str]) -> list[str]:
    """The definitions in which two ``network`` records differ, as ``name (changed)``, ``name (only in theirs)`` or
    ``name (only in ours)``; empty when the networks are the same code."""
    out = []
    for name in sorted(set(theirs) | set(ours)):
        if name not in ours:
            out.append(f"{name} (only in theirs)")
        elif name not in theirs:
            out.append(f"{name} (only in ours)")
        elif theirs[name] != ours[name]:
            out.append(f"{name} (changed)")
    return out


def _git(cwd: Path, *args: str) -> str | None:
    """Output of ``git <args>`` in ``cwd``, or None when git fails or is missing."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5, check=True)
    except Exception:  # noqa: BLE001 - no git, not a repository, a timeout: the state is unknown
        return None
    return out.stdout.strip()


def git_state(path: Path) -> dict[str, Any]:
    """The file's state in git (see the module docstring)."""
    package_repo = _git(PACKAGE_DIR, "rev-parse", "--show-toplevel")
    repo = _git(path.parent, "rev-parse", "--show-toplevel")
    state: dict[str, Any] = {"state": "unknown", "repository": repo, "commit": None, "file": None}
    if repo is None:
        if package_repo is not None:
            state["state"] = "not in this repository"
        return state
    state["commit"] = _git(path.parent, "rev-parse", "HEAD")
    if _git(path.parent, "ls-files", "--error-unmatch", "--", path.name) is None:
        state["file"] = "untracked"
    else:
        changes = _git(path.parent, "status", "--porcelain", "--", path.name)
        state["file"] = None if changes is None else ("modified" if changes else "clean")
    same = package_repo is not None and Path(repo).resolve() == Path(package_repo).resolve()
    state["state"] = (state["file"] or "unknown") if same else "not in this repository"
    return state


def describe_trainer(file: str | Path, roots: tuple[str, ...] = NETWORK_ROOTS) -> dict[str, Any]:
    """What a run records of the trainer file ``file`` (a trainer passes its ``__file__``): ``script``, ``path``,
    ``sha256``, ``network`` and ``git`` (see the module docstring). Plain strings and dicts, so a checkpoint read with
    ``weights_only=True`` and summary.json hold it as it is."""
    path = Path(file).resolve()
    source = path.read_bytes()
    return {
        "script": path.stem,
        "path": str(path),
        "sha256": hashlib.sha256(source).hexdigest(),
        "network": network_definitions(source.decode(), roots),
        "git": git_state(path),
    }
