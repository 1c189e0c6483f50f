"""Run a test module's `__main__` worker on two ranks under torchrun, as the DDP tests do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# A worker that runs a trainer in a process group of its own making ends with `dist.barrier()` before it destroys the
# group, as the trainers' own `process_group` does: rank 0 evaluates and writes last.pt after the other ranks are
# done, and a rank that destroyed its group and exited meanwhile could die in gloo's teardown ("terminate called
# without an active exception", SIGABRT) under a loaded machine, about one launch in ten.


def two_ranks(script: str, *argv: str, timeout: int = 600, pythonpath: tuple[str, ...] = ()) -> str:
    """`python -m torch.distributed.run --standalone --nproc_per_node 2 script *argv` with one thread per rank and
    W&B off; its output (both ranks and torchrun's) goes to a file, not a pipe, so a helper process that outlives
    the ranks cannot keep the run from ending. Asserts that it exited 0 and returns the output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", script, *argv]
    log = Path(argv[0]) / "torchrun.log" if argv and Path(argv[0]).is_dir() else Path(script).with_suffix(".log")
    with open(log, "w") as f:
        proc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    output = log.read_text()
    assert proc.returncode == 0, output[-3000:]
    return output
