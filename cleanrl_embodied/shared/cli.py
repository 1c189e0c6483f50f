"""Command-line plumbing the trainers share: the one failure style, flag checks, env building, seeding,
device choice and the Ctrl-C stop flag.

Every user mistake ends the same way, in every trainer: one line ``error: <what went wrong, naming the flag
and the allowed values>`` on stderr, no traceback, exit status 1, before anything is built.
"""

from __future__ import annotations

import json
import random
import signal
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cleanrl_embodied.shared.envs import check_env_id, make_env

__all__ = ["UsageError", "StopFlag", "build_env", "check_args", "check_policy", "fail", "flag", "load_factory",
           "pick_device", "seed_everything"]

class UsageError(SystemExit):
    """A user mistake. Its ``code`` is the one line Python prints on stderr before exiting with status 1."""


def fail(message: str, show: bool = True) -> None:
    """Stop with ``error: message``. ``show=False`` exits with status 1 silently: in DDP, the ranks that do
    not know the details leave the line to the one that does."""
    raise UsageError(f"error: {message}" if show else 1)


def flag(name: str) -> str:
    """The command-line spelling of an Args field: ``num_envs`` -> ``--num-envs``."""
    return "--" + name.replace("_", "-")


def check_args(args: Any, positive: Iterable[str] = (), non_negative: Iterable[str] = (),
               json_objects: Iterable[str] = (), files: Iterable[str] = (), env_id: bool = True) -> None:
    """The checks every trainer makes, each failing with one line naming the flag: fields that must be
    > 0 (None skips), >= 0, JSON objects (env kwargs), paths of existing files (None skips), a known env id."""
    for name in positive:
        value = getattr(args, name)
        if value is not None and not value > 0:
            fail(f"{flag(name)} must be > 0, got {value}")
    for name in non_negative:
        if getattr(args, name) < 0:
            fail(f"{flag(name)} must be >= 0, got {getattr(args, name)}")
    for name in json_objects:
        try:
            ok = isinstance(json.loads(getattr(args, name)), dict)
        except json.JSONDecodeError:
            ok = False
        if not ok:
            fail(f"{flag(name)} must be a JSON object like '{{\"key\": 1.0}}', got {getattr(args, name)!r}")
    for name in files:
        path = getattr(args, name)
        if path is not None and not Path(path).is_file():
            fail(f"{flag(name)}: no such checkpoint file {path!r}")
    if env_id:
        try:
            check_env_id(args.env_id)
        except ValueError as e:
            fail(f"--env-id: {e}")


def build_env(args: Any, kwargs_flag: str, num_envs: int, seed: int, device: torch.device):
    """``make_env(args.env_id, ...)`` with the JSON env kwargs of ``args.<kwargs_flag>``; a bad keyword
    argument becomes one line naming the flag that carried it."""
    try:
        return make_env(args.env_id, num_envs=num_envs, device=device, seed=seed,
                        vectorization=args.env_vectorization, **json.loads(getattr(args, kwargs_flag)))
    except (TypeError, ValueError) as e:
        fail(f"{flag(kwargs_flag)} / --env-id {args.env_id}: {e}")


def pick_device(cuda: bool) -> torch.device:
    """CUDA when asked for and present, else the CPU."""
    return torch.device("cuda" if cuda and torch.cuda.is_available() else "cpu")


def seed_everything(seed: int, torch_deterministic: bool) -> None:
    """Seed Python, NumPy and torch (all devices) with ``seed``; cuDNN deterministic if asked."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic


class StopFlag:
    """Ctrl-C (and the given signals) set ``requested``; the loop checks it once per iteration and ends
    cleanly. A second Ctrl-C raises KeyboardInterrupt at once unless ``absorb_repeats`` (DDP, where
    torchrun forwards the signal again). Use as a context manager: the previous handlers come back.
    """

    def __init__(self, say: Callable[[str], None], signals: tuple[int, ...] = (signal.SIGINT,),
                 absorb_repeats: bool = False):
        self.say, self.signals, self.absorb_repeats = say, signals, absorb_repeats
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.requested and not self.absorb_repeats:
            raise KeyboardInterrupt
        if not self.requested:
            self.say("stop requested: finishing this iteration, then writing last.pt and summary.json")
        self.requested = True

    def __enter__(self) -> StopFlag:
        self._previous = {s: signal.signal(s, self._handle) for s in self.signals}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def load_factory(spec: str, flag_name: str) -> Callable:
    """``module:attribute`` -> the attribute (after importing the module), or one line naming the flag."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        fail(f"{flag(flag_name)} must be module:factory (e.g. my_lab.policies:make_agent), got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        fail(f"{flag(flag_name)} {spec}: cannot import {module_name!r} ({e}); is it installed or on PYTHONPATH?")
    factory = getattr(module, attr, None)
    if not callable(factory):
        fail(f"{flag(flag_name)} {spec}: {module_name} has no callable {attr!r}")
    return factory


def check_policy(module: Any, spec: str | None, needs: Iterable[str]) -> None:
    """One line if a policy built by ``--policy spec`` lacks a method or attribute the trainer uses."""
    if not isinstance(module, torch.nn.Module):
        fail(f"--policy {spec}: the factory must return a torch.nn.Module, got {type(module).__name__}")
    missing = [name for name in needs if not hasattr(module, name)]
    if missing:
        fail(f"--policy {spec}: the module lacks {', '.join(missing)} (docs/POLICIES.md: what a policy provides)")
