"""Every command the docs show runs: the commands in the docstrings of cleanrl_embodied/*.py, examples/hf_vla/*.py and
benchmarks/**/*.py and in the shell code blocks of README.md and docs/*.md are taken apart as a shell would (bash, with
`uv`, `python`, `torchrun`, `git`, `tar`, `pip` and `cp` replaced by stubs that record their arguments, so that
`$E`, `$(sed ...)`, `cd` and `| xargs` work and nothing runs), and every script of this repository they start (by its
path, or as a module: `python -m benchmarks.suite.run`) parses the command's flags with its own command line (tyro or
argparse), stopped before its main. `--help` appended would not
do: tyro prints the help and exits before it looks at the other flags (a command that is `--help` itself passes).

All commands are parsed in one worker process, script by script (each import is paid once). A script whose import
needs an extra that is not installed is skipped with the reason."""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ("cleanrl_embodied/*.py", "examples/hf_vla/*.py", "benchmarks/**/*.py")
PACKAGES = ("benchmarks", "cleanrl_embodied", "examples")
"""This repository's packages: a command's `-m <module>` that names one of their modules starts a script of ours."""
DOCS = ("README.md", "docs/*.md")
STUBS = ("uv", "python", "python3", "torchrun", "git", "tar", "pip", "cp")
"""Commands that record their arguments (and the directory they were called in) instead of running; `sed` and
`xargs` run for real, nothing else is found. A script copied with `cp` and run is its original."""
COMMAND = re.compile(r"^\s*(?:[A-Z_][A-Z0-9_]*=\S+\s+)*(?:uv|python3?|torchrun|git)\s")
"""A line that starts a command (after optional VAR=value assignments), in a docstring or an unlabelled block."""
RECORD = re.compile(r"<!-- BEGIN ([\w-]+) -->.*?<!-- END \1 -->", re.S)
"""A benchmark's report in docs/benchmarks.md (written by the benchmark): the commands it lists are the ones it ran,
at the commit it names, a record that is not rewritten when a flag changes; they are not checked."""
PLACEHOLDER = re.compile(r"<[A-Za-z][^<>\n]*>")  # <run>, <your task>: a word here, not a shell redirection
EXTRAS = {"transformers": "vla", "peft": "vla", "mujoco": "mujoco", "mani_skill": "maniskill",
          "envpool": "envpool", "onnx": "export", "onnxscript": "export", "onnxruntime": "export"}  # fmt: skip
"""The optional extras' imports (pyproject.toml's optional-dependencies), for the reason of a skip."""
BAD_EXAMPLE = ("bc.py's docstring before the fix", "cleanrl_embodied/grpo.py",
               ["--env-id", "PushCubeLangRL", "--action-head", "bins", "--action-bins", "16"], None)  # fmt: skip
"""A command that must fail (the classic grpo.py has no token bins): the check is run on it too."""


def command_lines(text: str) -> list[str]:
    """The commands in a docstring or an unlabelled block: each line that starts one, with its `\\` continuations."""
    commands, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if COMMAND.match(lines[i]):
            command = [lines[i]]
            while command[-1].rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                command.append(lines[i])
            commands.append("\n".join(command))
        i += 1
    return commands


def docstrings(path: Path) -> list[str]:
    """Every docstring of a module: the module's, its classes' and functions', and attribute ones."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            for statement in node.body:
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                    if isinstance(statement.value.value, str):
                        found.append(statement.value.value)
    return found


def shell_snippets() -> list[tuple[str, str]]:
    """(where, shell text) of every docstring command and every shell block of the docs."""
    snippets = []
    for pattern in SCRIPTS:
        for path in sorted(REPO.glob(pattern)):
            source = path.read_text().splitlines()
            for text in docstrings(path):
                for command in command_lines(text):
                    first = command.splitlines()[0].strip()
                    line = next((i + 1 for i, s in enumerate(source) if s.strip().startswith(first[:60])), 0)
                    snippets.append((f"{path.relative_to(REPO)}:{line} (docstring)", command))
    block = re.compile(r"^([ \t]*)```([\w-]*)[ \t]*\n(.*?)^\1```", re.S | re.M)
    for pattern in DOCS:
        for path in sorted(REPO.glob(pattern)):
            text = path.read_text()
            records = [m.span() for m in RECORD.finditer(text)]
            for match in block.finditer(text):
                if any(start < match.start() < end for start, end in records):
                    continue
                indent, language, body = match.groups()
                body = "\n".join(line.removeprefix(indent) for line in body.splitlines())
                where = f"{path.relative_to(REPO)}:{text[: match.start()].count(chr(10)) + 1}"
                if language in ("bash", "sh", "shell"):
                    snippets.append((where, body))
                elif language == "":
                    snippets += [(where, command) for command in command_lines(body)]
    return snippets


def invocations(snippet: str, sandbox: Path) -> list[list[str]]:
    """[directory relative to the repository, command, *arguments] of every stubbed command bash ran in `snippet`,
    run in `sandbox` (whose PATH holds the stubs, sed and xargs alone; benchmarks/ is linked there, for `cd` and the
    `sed` of its configs)."""
    log = sandbox / "log"
    log.write_bytes(b"")
    env = {"PATH": str(sandbox / "bin"), "LOG": str(log), "HOME": str(sandbox)}
    subprocess.run([shutil.which("bash"), "-c", PLACEHOLDER.sub("PLACEHOLDER", snippet)], cwd=sandbox / "cwd",
                   env=env, capture_output=True, timeout=60)  # fmt: skip
    records = [record.split("\x1f")[:-1] for record in log.read_bytes().decode().split("\x1e")[:-1]]
    return [[os.path.relpath(cwd, sandbox / "cwd"), *argv] for cwd, *argv in records]


def make_sandbox(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "cwd").mkdir()
    (root / "cwd" / "benchmarks").symlink_to(REPO / "benchmarks")
    stub = r"""#!/bin/sh
record=$(printf '%s\037' "$PWD" "${0##*/}" "$@")
printf '%s\036' "$record" >> "$LOG"
"""  # each argument ends with a unit separator, each command with a record separator; one write per command, so
    # that stubs running at once (a pipeline, a command in the background) never interleave their records
    for name in STUBS:
        (root / "bin" / name).write_text(stub)
        (root / "bin" / name).chmod(0o755)
    for tool in ("sed", "xargs"):
        (root / "bin" / tool).symlink_to(shutil.which(tool))
    return root


def repository_commands(root: Path) -> list[tuple[str, str, list[str], str | None]]:
    """(where, script, flags, module) of every command that starts a script of this repository, by its path (module
    None) or as `-m module` (script: the module's file); a `.py` path or a module that names no file is kept as it is
    (the worker reports it)."""
    sandbox, commands = make_sandbox(root), []
    for where, snippet in shell_snippets():
        copies = {}  # copy -> original, of `cp` in this snippet
        for cwd, name, *argv in invocations(snippet, sandbox):
            if name == "cp" and len(argv) == 2:
                copies[os.path.normpath(os.path.join(cwd, argv[1]))] = os.path.normpath(os.path.join(cwd, argv[0]))
                continue
            scripts = [i for i, arg in enumerate(argv) if arg.endswith(".py") and "PLACEHOLDER" not in arg]
            modules = [i for i, arg in enumerate(argv[1:], 1) if argv[i - 1] == "-m" and arg.split(".")[0] in PACKAGES]
            if modules and (not scripts or modules[0] < scripts[0]):
                module = argv[modules[0]]
                commands.append((where, module.replace(".", "/") + ".py", argv[modules[0] + 1 :], module))
            elif scripts and not argv[scripts[0]].startswith("/"):
                script = os.path.normpath(os.path.join(cwd, argv[scripts[0]]))
                commands.append((where, copies.get(script, script), argv[scripts[0] + 1 :], None))
    return commands


@functools.cache
def shown_commands() -> list[tuple[str, str, list[str], str | None]]:
    """`repository_commands`, once per process (the tests are parametrized by its scripts); none without bash."""
    if shutil.which("bash") is None:
        return []
    with tempfile.TemporaryDirectory() as root:
        return repository_commands(Path(root))


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    """What the worker found for every command (and `BAD_EXAMPLE`): status ok, error or skip, and why."""
    if shutil.which("bash") is None:
        pytest.skip("the commands are expanded by bash, which this machine does not have")
    work = tmp_path_factory.mktemp("worker") / "commands.json"
    work.write_text(json.dumps([list(BAD_EXAMPLE), *shown_commands()]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, __file__, str(work)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(work.with_suffix(".out.json").read_text())


def test_the_docs_show_commands_of_every_trainer(results):
    """The extraction finds what it should: every trainer is shown in a command (the check is not vacuous)."""
    shown = {r["script"] for r in results}
    trainers = {f"cleanrl_embodied/{p.name}" for p in (REPO / "cleanrl_embodied").glob("*.py") if p.stem != "__init__"}
    assert trainers <= shown, trainers - shown
    assert {"examples/hf_vla/bc.py", "examples/hf_vla/dagger.py", "benchmarks/suite/run.py"} <= shown


def test_a_flag_the_script_does_not_have_is_caught(results):
    """The classic grpo.py refuses --action-head (what bc.py's docstring told users to run): the check fails on it."""
    (bad,) = [r for r in results if r["where"] == BAD_EXAMPLE[0]]
    assert bad["status"] == "error" and "action-head" in bad["detail"], bad


@pytest.mark.parametrize("script", sorted({script for _, script, _, _ in shown_commands()}))
def test_every_command_shown_parses(results, script):
    mine = [r for r in results if r["script"] == script and r["where"] != BAD_EXAMPLE[0]]
    skipped = [r for r in mine if r["status"] == "skip"]
    if skipped and len(skipped) == len(mine):
        pytest.skip(skipped[0]["detail"])
    failed = [
        f"{r['where']}: {script} {' '.join(r['argv'])}\n    {r['detail']}" for r in mine if r["status"] == "error"
    ]
    assert not failed, "\n".join(failed)


# ---- the worker: parses each command's flags with the script's own command line, stopped before its main ---------
class Parsed(BaseException):
    """Raised where the script's command line returned: its flags parsed (not an Exception: nothing catches it)."""


def worker(path: Path) -> None:
    import argparse
    import runpy

    import tyro

    cli, parse_args = tyro.cli, argparse.ArgumentParser.parse_args

    def parsed_cli(*args, **kwargs):
        cli(*args, **kwargs)
        raise Parsed

    def parsed_args(self, *args, **kwargs):
        parse_args(self, *args, **kwargs)
        raise Parsed

    tyro.cli, argparse.ArgumentParser.parse_args = parsed_cli, parsed_args
    by_script = defaultdict(list)
    for where, script, argv, module in json.loads(path.read_text()):
        by_script[script].append((where, argv, module))
    results = []
    for script, commands in by_script.items():
        file = REPO / script
        for where, argv, module in commands:
            result = {"where": where, "script": script, "argv": argv, "status": "error", "detail": ""}
            results.append(result)
            if not file.is_file():
                result["detail"] = f"no such script {script}"
                continue
            sys.argv, sys.path[0] = [str(file), *argv], str(REPO if module else file.parent)  # as python puts it
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    if module:
                        runpy.run_module(module, run_name="__main__", alter_sys=True)
                    else:
                        runpy.run_path(str(file), run_name="__main__")
            except Parsed:
                result["status"] = "ok"
            except SystemExit as e:
                if e.code == 0:  # (--help)
                    result["status"] = "ok"
                    continue
                text = re.sub(r"[│╭╮╰╯─]+", " ", err.getvalue())
                result["detail"] = f"exit {e.code}: " + " ".join(text.split())[-600:]
            except ImportError as e:
                extra = EXTRAS.get((e.name or "").split(".")[0])
                if extra or "extra" in str(e):  # (examples.hf_vla says which extra itself)
                    why = f"needs the {extra} extra (uv sync --extra {extra})" if extra else "cannot be imported"
                    result["status"], result["detail"] = "skip", f"{script} {why}: {e}"
                else:
                    result["detail"] = f"{type(e).__name__}: {e}"
            except Exception as e:  # noqa: BLE001 - whatever the script raised before its command line
                result["detail"] = f"{type(e).__name__}: {e}"
            else:
                result["detail"] = "the script ran to its end without parsing a command line"
    path.with_suffix(".out.json").write_text(json.dumps(results))


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
