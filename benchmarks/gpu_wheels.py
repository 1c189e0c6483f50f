"""The wheels an offline GPU machine needs to run benchmarks/gpu_check.py, at uv.lock's versions, in bundles that fit.

    uv run python benchmarks/gpu_wheels.py --have have.txt --out .whl                # the check's default parts
    uv run python benchmarks/gpu_wheels.py --have have.txt --out .whl --parts mjlab  # part 7 (mjlab, Warp, MuJoCo)
    uv run python benchmarks/gpu_wheels.py --have have.txt --out .whl --dry-run      # list them, download nothing

A GPU machine's image brings PyTorch and much else, and may reach no package index. What the check imports beyond
it: this project's own dependencies (uv.lock, with the `mjlab` extra for part 7; `uv export`), and for part 6
rsl_rl 5.5.1, which is no dependency (peers/vs_rsl_rl.py's INSTALL pins). From those pins the ones the machine
already has are left out: `--have` is a file with the names it has, one per line, as `python3 -m pip list
--format=freeze` prints them there (versions ignored: the image's own torch is the one to use). Markers are read for
the machine (`--python-version`, Linux x86_64). Each wheel comes from `pip download --no-deps --only-binary=:all:`
for that Python and the manylinux platforms, into `--out`.

Bundles: a command sent to the machine carries a limited amount (`--bundle-mib`, what is left beside the working
tree), so the wheels are grouped into bundles of at most that size, `--out`/b0, b1, ..., and a wheel larger than a
bundle is cut into pieces (`<wheel>.part00`, ...) that bundles carry one by one. Each bundle is copied to the same
folder on the machine (`--stage`) while it stays up, then the last command joins the pieces and installs everything
with `pip install --no-index --no-deps --target`; `--out`/bundles.json and the console give those commands. Then run
the check with that folder on PYTHONPATH.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import tyro

from benchmarks.common import REPO

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")  # fmt: skip
ROOTS = {"default": ("tensordict", "tyro", "gymnasium"), "mjlab": ("tensordict", "tyro", "gymnasium", "mjlab")}
"""gpu_check's parts -> the packages they import that a PyTorch GPU image lacks (the trainers import wandb and
imageio-ffmpeg only when a run asks for tracking or video); their dependencies come with them"""
EXTRAS = {"default": (), "mjlab": ("mjlab",)}
"""gpu_check's parts -> the extras of this project whose locked versions they use"""


@dataclass
class Args:
    have: str
    """a file with the names of the packages the machine has, one per line (`pip list --format=freeze` there)"""
    out: str = ".whl"
    """where the bundles go (keep it out of git: `echo /.whl/ >> .git/info/exclude`)"""
    parts: str = "default"
    """default (gpu_check's default parts, rsl_rl included) or mjlab (its part 7)"""
    python_version: str = "3.12"
    """the machine's Python (major.minor)"""
    bundle_mib: float = 44.0
    """the most one bundle may hold, MiB"""
    stage: str = "/tmp/wheels"
    """the folder on the machine that collects the bundles"""
    target: str = "/tmp/site"
    """where they are installed on the machine (then PYTHONPATH)"""
    pip: str = "python3"
    """the Python whose pip downloads (uv's environments have no pip)"""
    dry_run: bool = False
    """list the pins and what would be downloaded, download nothing"""


def fail(message: str) -> None:
    raise SystemExit(f"error: {message}")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def marker_env(python_version: str) -> dict[str, str]:
    """PEP 508 marker values of a CPython `python_version` on Linux x86_64."""
    full = python_version if python_version.count(".") == 2 else python_version + ".0"
    return {"python_version": ".".join(full.split(".")[:2]), "python_full_version": full, "os_name": "posix",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
            "platform_python_implementation": "CPython", "implementation_name": "cpython"}  # fmt: skip


def locked_pins(export: str, python_version: str) -> dict[str, tuple[str, set[str]]]:
    """`uv export --format requirements-txt` output -> {name: (version, the names it is there for)} of the lines
    whose marker holds on that machine (the "# via" comments under each pin)."""
    from packaging.markers import Marker

    env = marker_env(python_version)
    pins: dict[str, tuple[str, set[str]]] = {}
    current = None
    for raw in export.splitlines():
        line = raw.strip()
        if not line or line.startswith("-"):
            continue
        if line.startswith("#"):
            via = line.lstrip("#").strip()
            if current is not None and via and via != "via":
                pins[current][1].add(canonical(via.removeprefix("via ").split()[0]))
            continue
        spec, _, marker = line.partition(";")
        name, _, version = spec.strip().partition("==")
        holds = bool(version) and (not marker.strip() or Marker(marker.strip()).evaluate(env))
        current = canonical(name) if holds else None
        if current is not None:
            pins[current] = (version.strip(), set())
    return pins


def closure(pins: dict[str, tuple[str, set[str]]], roots: tuple[str, ...], have: set[str]) -> dict[str, str]:
    """The roots and what they need, through the pins' "via" edges, less what the machine has (a package it has
    brings its own dependencies)."""
    wanted = {canonical(r) for r in roots} - have
    missing = sorted(wanted - set(pins))
    if missing:
        fail(f"not in uv.lock for these parts: {', '.join(missing)}")
    grew = True
    while grew:
        grew = False
        for name, (_, via) in pins.items():
            if name not in wanted and name not in have and via & wanted:
                wanted.add(name)
                grew = True
    return {name: pins[name][0] for name in sorted(wanted)}


def extra_pins(install: str) -> dict[str, str]:
    """The `name==version` words of an install command (peers/vs_rsl_rl.py's INSTALL)."""
    return {canonical(m[0]): m[1] for m in re.findall(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.\-+]+)", install)}


def read_have(path: str) -> set[str]:
    """Package names from `pip list --format=freeze` (or `pip freeze`, or bare names) output."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        fail(f"--have {path}: {e.strerror}")
    names = {canonical(re.split(r"[=<>@ ;\[]", line.strip(), maxsplit=1)[0]) for line in text.splitlines()}
    return {n for n in names if n and not n.startswith("#")}


def needed(parts: str, python_version: str, have: set[str]) -> dict[str, str]:
    """The locked pins of `parts`' roots and their dependencies, less what the machine has."""
    extras = [f"--extra={e}" for e in EXTRAS[parts]]
    command = ["uv", "export", "--locked", "--no-hashes", "--no-dev", "--no-emit-project", "--format=requirements-txt"]
    export = subprocess.run([*command, *extras], cwd=REPO, capture_output=True, text=True)
    if export.returncode:
        fail("uv export failed: " + (export.stderr.strip().splitlines() or [str(export.returncode)])[-1])
    pins = closure(locked_pins(export.stdout, python_version), ROOTS[parts], have)
    if parts == "default":  # part 6's rsl_rl, no dependency of this project
        from benchmarks.peers.vs_rsl_rl import INSTALL

        pins.update({n: v for n, v in extra_pins(INSTALL).items() if n not in have})
    return dict(sorted(pins.items()))


def bundles(sizes: dict[str, int], limit: int) -> list[list[tuple[str, int, int]]]:
    """Files (name -> bytes) into bundles of at most `limit` bytes, largest first: each entry (file, piece, pieces);
    a file over the limit is cut into ceil(size / limit) pieces, each in a bundle of its own."""
    out: list[list[tuple[str, int, int]]] = []
    room: list[int] = []
    for name, size in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        pieces = max(1, math.ceil(size / limit))
        for piece in range(pieces):
            part = min(limit, size - piece * limit) if pieces > 1 else size
            at = next((i for i, free in enumerate(room) if free >= part), None) if pieces == 1 else None
            if at is None:
                out.append([])
                room.append(limit)
                at = len(out) - 1
            out[at].append((name, piece, pieces))
            room[at] -= part
    return out


def download(pins: dict[str, str], out: Path, python_version: str, pip: str) -> None:
    platform = [flag for p in PLATFORMS for flag in ("--platform", p)]
    cmd = [pip, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
           "--implementation", "cp", *platform, "-d", str(out), *(f"{n}=={v}" for n, v in pins.items())]  # fmt: skip
    if subprocess.run(cmd).returncode:
        fail(f"pip download failed (command: {shlex.join(cmd)})")


def cut(path: Path, limit: int, pieces: int) -> list[Path]:
    """`path` into `pieces` files of at most `limit` bytes (`cat` joins them again), the whole file removed."""
    names = [path.with_name(f"{path.name}.part{i:02d}") for i in range(pieces)]
    with open(path, "rb") as f:
        for name in names:
            name.write_bytes(f.read(limit))
    path.unlink()
    return names


def main(args: Args) -> dict:
    if args.parts not in ROOTS:
        fail(f"--parts {args.parts}: one of {', '.join(ROOTS)}")
    if args.bundle_mib <= 0:
        fail("--bundle-mib must be positive")
    pins = needed(args.parts, args.python_version, read_have(args.have))
    print(f"{len(pins)} packages to bring: " + ", ".join(f"{n}=={v}" for n, v in pins.items()), flush=True)
    if args.dry_run:
        return {"pins": pins}
    out = Path(args.out)
    staging = out / "download"
    staging.mkdir(parents=True, exist_ok=True)
    download(pins, staging, args.python_version, args.pip)
    limit = int(args.bundle_mib * 2**20)
    wheels = {p.name: p.stat().st_size for p in staging.glob("*.whl")}
    plan = bundles(wheels, limit)
    cuts = {name: pieces for group in plan for name, _, pieces in group if pieces > 1}
    pieces_of = {name: cut(staging / name, limit, n) for name, n in cuts.items()}
    commands = []
    for i, group in enumerate(plan):
        folder = out / f"b{i}"
        folder.mkdir(exist_ok=True)
        for name, piece, pieces in group:
            source = pieces_of[name][piece] if pieces > 1 else staging / name
            source.replace(folder / source.name)
        commands.append(f"mkdir -p {args.stage} && cp {folder}/* {args.stage}/")
    join = [f"cat {shlex.quote(args.stage)}/{n}.part* > {shlex.quote(args.stage)}/{n}" for n in cuts]
    install = (f"python3 -m pip install -q --no-index --no-deps --no-compile --target {args.target} "
               f"$(ls {args.stage}/*.whl) && export PYTHONPATH={args.target}")  # fmt: skip
    staging.rmdir()
    record = {"pins": pins, "bundle_mib": args.bundle_mib, "bundles": [[n for n, _, _ in g] for g in plan],
              "copy_commands": commands, "install_command": " && ".join([*join, install])}  # fmt: skip
    (out / "bundles.json").write_text(json.dumps(record, indent=1) + "\n")
    for i, command in enumerate(commands):
        print(f"bundle {i} ({out / f'b{i}'}): {command}")
    print(f"then: {record['install_command']}")
    return record


if __name__ == "__main__":
    main(tyro.cli(Args))
