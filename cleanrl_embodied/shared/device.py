"""The device a run trains on (``pick_device``), what it is called (``device_name``) and the precision of its forward
passes (``autocast``, ``--autocast``)."""

from __future__ import annotations

import contextlib
import functools
import os
import platform
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["autocast", "cpu_model", "device_name", "pick_device"]


def pick_device(cuda: bool) -> torch.device:
    """CUDA when asked for and present, else the CPU."""
    return torch.device("cuda" if cuda and torch.cuda.is_available() else "cpu")


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; elsewhere what the platform says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    """The hardware ``device`` stands for: the GPU's name, or the CPU's model and how many cores this process may
    use."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return f"{cpu_model()} ({cores} cores)"
    return device.type


def autocast(setting: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """What ``--autocast`` asks for, as a context factory for the update's forward passes: bf16 autocast on
    ``device`` (weights and optimizer stay fp32), or a no-op, cheaper to enter than a disabled ``torch.autocast``."""
    return (
        functools.partial(torch.autocast, device.type, torch.bfloat16) if setting == "bf16" else contextlib.nullcontext
    )
