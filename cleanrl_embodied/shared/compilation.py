"""Whether and how a trainer compiles its pure functions: ``compile_choice`` (``--compile`` auto/on/off: where
compiling was measured to pay) and ``compiler`` (torch.compile where it works here, else the functions as they are,
said in one line), with torch.compile's irrelevant first-compilation warnings dropped."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

__all__ = ["QUIET_COMPILE_WARNINGS", "compile_choice", "compiler"]


@functools.cache
def _compile_works(device_type: str) -> str | None:
    """None if torch.compile builds and runs code for this device type here, else why not (one line)."""
    try:
        torch.compile(lambda x: torch.tanh(x) * 2 + 1)(torch.ones(4, device=device_type))
        return None
    except Exception as e:  # noqa: BLE001 - a missing compiler, Triton, an unsupported Python: all mean "eager"
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


QUIET_COMPILE_WARNINGS = {
    "torch.utils.cpp_extension": "No CUDA runtime is found",  # a CPU machine with a CUDA toolkit installed
    "torch._dynamo.variables.ctx_manager": "Profiler record function",  # the optimizer step's profiler label
}
"""Warnings torch.compile logs on every first compilation that say nothing about the run: the logger and how the
message starts. They are dropped, so that the console shows the run's own lines only."""


class _DropMessages(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


@functools.cache
def _quiet_compile_warnings() -> None:
    for name, start in QUIET_COMPILE_WARNINGS.items():
        logging.getLogger(name).addFilter(_DropMessages(start))


def compile_choice(setting: str, device_type: str, updates: int, pays_after: int, cudagraphs: bool = False) -> bool:
    """Whether a run compiles its update and policy step: ``--compile`` (``setting``) ``on`` always, ``off`` never,
    and ``auto`` where it was measured to be faster on this kind of device (``device_type``), for a run that plans
    at least ``pays_after`` minibatch updates (``updates``; compiling costs about 10 s once per process):

    - ``cpu``: compiles. The compiled update was 1.1-1.4x faster in steady state on a 2-core CPU
      (docs/benchmarks.md, "Speed, CPU" and "The update, compiled").
    - ``cuda``: compiles only with CUDA graphs (``cudagraphs``: the trainer's ``--cudagraphs``), else eager. On an
      H200, ppo_continuous at 4096 envs ran 221,697 env steps/s eager, 187,905 compiled without CUDA graphs (the
      step is launch-bound there, and compiling alone does not remove the launches) and 277,303 compiled with them
      (docs/results/gpu-h200-2026-11-26). benchmarks/gpu_check.py's ppo part measures these again on every lent GPU
      and checks that this choice is the faster one.
    - any other device: eager (nothing measured)."""
    if setting != "auto":
        return setting == "on"
    if updates < pays_after:
        return False
    return device_type == "cpu" or (device_type == "cuda" and cudagraphs)


def compiler(enabled: bool, device: torch.device, say: Callable[[str], None]) -> Callable:
    """A function that wraps the update's pure functions: ``torch.compile`` when ``enabled`` (the trainer decides
    with :func:`compile_choice`), else, or where compiling does not work on this machine (``say`` tells
    why, once), the identity: the same functions run eager."""
    if not enabled:
        return lambda fn: fn
    _quiet_compile_warnings()
    reason = _compile_works(device.type)
    if reason is not None:
        say(f"warning: --compile: torch.compile does not work here ({reason}); the update runs eager")
        return lambda fn: fn
    return torch.compile
