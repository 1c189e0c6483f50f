"""The device a run trains on (``pick_device``) and the precision of its forward passes (``autocast``,
``--autocast``)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch

__all__ = ["autocast", "pick_device"]


def pick_device(cuda: bool) -> torch.device:
    """CUDA when asked for and present, else the CPU."""
    return torch.device("cuda" if cuda and torch.cuda.is_available() else "cpu")


def autocast(setting: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """What ``--autocast`` asks for, as a context factory for the update's forward passes: bf16 autocast on
    ``device`` (weights and optimizer stay fp32), or a no-op, cheaper to enter than a disabled ``torch.autocast``."""
    return (
        functools.partial(torch.autocast, device.type, torch.bfloat16) if setting == "bf16" else contextlib.nullcontext
    )
