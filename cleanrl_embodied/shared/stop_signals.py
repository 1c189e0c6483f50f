"""Ctrl-C and SIGTERM end a run cleanly: ``StopFlag`` turns the signal into a request the loop reads after its
iteration (the trainer then saves and writes summary.json) and the exit status 130 / 143; in DDP the ranks agree."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["StopFlag"]


class StopFlag:
    """Ctrl-C (SIGINT) and SIGTERM (what a cluster scheduler, ``kill`` or ``docker stop`` send) set ``requested``;
    the loop checks it once per iteration and ends cleanly: the iteration finishes, ``last.pt`` and
    ``summary.json`` are written, and the process exits with ``exit_status``, 128 + the signal's number as a shell
    reports a process that signal ended (130 for Ctrl-C, 143 for SIGTERM), so a script or scheduler can tell a
    stop from a finished run (0) and from an error (1). A second signal raises KeyboardInterrupt at once (the hard
    stop) unless ``absorb_repeats`` (DDP, where torchrun forwards the signal again; its grace period is the hard
    stop). Use as a context manager: the previous handlers come back.
    """

    def __init__(self, say: Callable[[str], None], absorb_repeats: bool = False):
        self.say, self.absorb_repeats = say, absorb_repeats
        self.signum: int | None = None  # the first signal received
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_status(self) -> int:
        """The exit status of a run this flag stopped: 128 + the signal's number (130 Ctrl-C, 143 SIGTERM)."""
        return 128 + (self.signum or signal.SIGINT)

    def _handle(self, signum, frame) -> None:
        if self.requested and not self.absorb_repeats:
            raise KeyboardInterrupt
        if not self.requested:
            name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            self.say(f"stop requested ({name}): finishing this iteration, then writing last.pt and summary.json")
            self.signum = signum

    def votes(self) -> list[float]:
        """DDP: whether this process received SIGINT, SIGTERM; sum them over the ranks and pass them to ``agree``."""
        return [float(self.signum == signal.SIGINT), float(self.signum == signal.SIGTERM)]

    def agree(self, summed_votes) -> int:
        """DDP: the world's decision from ``votes`` summed over the ranks, the same on every rank: 0 to go on, or
        the exit status to stop with, SIGTERM's (143) if any rank received one (the scheduler's stop), else
        Ctrl-C's (130)."""
        sigint, sigterm = torch.as_tensor(summed_votes).tolist()  # one host sync
        return 128 + signal.SIGTERM if sigterm > 0 else 128 + signal.SIGINT if sigint > 0 else 0

    def __enter__(self) -> StopFlag:
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
