"""Running a trainer (or any command) as a subprocess and stopping it with a signal, written once.

- `subprocess_env`: the environment a child gets: this process's, torch on one thread, paths first on PYTHONPATH.
- `signal_when`: start a command, send it a signal once a condition holds, return its exit status and output.
- `ctrl_c_a_long_run`: a trainer run far longer than the test, stopped by Ctrl-C a few seconds into training; the
  exit status, last.pt and summary.json it must leave are checked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from tests.trainer_args import cli_flags

TESTS = Path(__file__).resolve().parent  # on a child's PYTHONPATH for `--policy toy_policies:...`
REPO = TESTS.parent  # for `tests.envs_for_tests:...` ids and `python -m` of the trainers


def subprocess_env(*paths: str | Path, **variables: str) -> dict[str, str]:
    """This process's environment with OMP_NUM_THREADS=1, ``paths`` first on PYTHONPATH and ``variables`` set."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **variables}
    if paths:
        env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")])
    return env


def signal_when(
    command: list[str],
    ready: Callable[[], bool],
    signum: int,
    timeout: float,
    settle: float = 0.0,
    poll: float = 0.5,
    **popen,
) -> tuple[int, str]:
    """Start ``command`` (its output and errors together, as text), wait until ``ready()`` holds (checked every
    ``poll`` seconds, for ``timeout`` seconds at most) and ``settle`` seconds more, check it still runs, send it
    ``signum`` and return its exit status and output (waiting ``timeout`` seconds at most for it to end)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)
    deadline = time.time() + timeout
    while proc.poll() is None and time.time() < deadline and not ready():
        time.sleep(poll)
    time.sleep(settle)
    assert proc.poll() is None, proc.communicate()[0][-3000:]  # still running when the signal goes out
    proc.send_signal(signum)
    output, _ = proc.communicate(timeout=timeout)
    return proc.returncode, output


# 100M steps of 8 envs x 10: far longer than any test; no saves, evaluations or compile before Ctrl-C comes
LONG_RUN = dict(
    num_envs=8,
    num_steps=10,
    num_minibatches=2,
    total_timesteps=100_000_000,
    cuda=False,
    save_freq=0,
    eval_freq=0,
    compile="off",  # (a run this long would compile first; Ctrl-C is what is tested here)
)


def ctrl_c_a_long_run(script: Path, out_dir: Path, *flags: str, env: dict[str, str]) -> tuple[dict, dict]:
    """Run ``script`` (a trainer file) on PushCubeRL for `LONG_RUN` with ``flags`` under ``out_dir``, press Ctrl-C
    (SIGINT) 3 seconds after its first logged iteration, and check that it exits with status 130 having written
    last.pt and summary.json at the same step, after some training. Returns (summary, last.pt)."""
    status, output = signal_when(
        [sys.executable, str(script), "--output-dir", str(out_dir), *cli_flags(LONG_RUN), *flags],
        lambda: any(out_dir.glob("*/events.out.tfevents*")),
        signal.SIGINT,
        timeout=120,
        settle=3,  # let a few iterations run
        env=env,
    )
    assert status == 130, output[-2000:]
    run_dir = next(out_dir.glob("PushCubeRL__*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert summary["global_step"] == ckpt["global_step"] > 0
    return summary, ckpt
