"""Command-line plumbing the trainers share: the run-keeping flags every trainer has (`RunArgs`), the one failure
style and the flag checks.

Every user mistake ends the same way, in every trainer: one line ``error: <what went wrong, naming the flag
and the allowed values>`` on stderr, no traceback, exit status 1, before anything is built.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cleanrl_embodied.shared.envs import check_env_id

__all__ = [
    "RunArgs",
    "UsageError",
    "check_args",
    "fail",
    "flag",
]


@dataclass
class RunArgs:
    """The run-keeping flags every trainer has: where a run goes, the envs' options, evaluation, checkpoints,
    compilation and the policy hook. Each trainer's `Args` subclasses this and declares the flags a reader of the
    algorithm needs (experiment name, seed, device, tracking, env id, steps, and the algorithm's own)."""

    output_dir: str = "runs"
    """root folder of run directories"""
    env_kwargs: str = "{}"
    """JSON keyword arguments of the training envs, e.g. '{"push_friction_range": [0.5, 1.5]}'"""
    eval_env_kwargs: str = "{}"
    """JSON keyword arguments of the eval envs, on top of --env-kwargs: the eval envs inherit it except the keys
    that randomize or disturb the env (randomization ranges, noise, events: the list in docs/cli.md), so only what
    differs goes here, e.g. '{"camera": "perspective"}'"""
    env_vectorization: Literal["sync", "async", "envpool"] = "sync"
    """Gymnasium (numpy) ids: step sub-envs in this process (sync), one worker process each (async), or EnvPool's
    C++ thread pool (envpool: extra `envpool`, the ids it provides, e.g. HalfCheetah-v5)"""
    num_eval_envs: int = 64
    """number of parallel evaluation environments"""
    num_eval_episodes: int = 64
    """episodes per evaluation (each eval env contributes its first completed episodes)"""
    eval_freq: int = 25
    """evaluate every this many iterations on fresh starts (0: only the final evaluation)"""
    eval_deterministic: bool = True
    """evaluate with the mean action (``--no-eval-deterministic`` samples)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint (with video if --capture-video) and exit without training"""
    save_freq: int = 25
    """write checkpoints/last.pt (and a numbered copy) every this many iterations; always at the end"""
    resume: str | None = None
    """continue training from this checkpoint (counters, optimizer, schedule, RNG and env state)"""
    max_consecutive_skips: int = 10
    """stop after this many optimizer steps in a row skipped for a non-finite loss or gradient"""
    compile: Literal["auto", "on", "off"] = "auto"
    """torch.compile the update (loss, backward, gradient clipping, optimizer step) and the rollout's policy step;
    auto: on the CPU, time the second iteration and compile when the iterations left would save more than compiling
    costs (as earlier runs of this configuration measured it here, or ours); on CUDA only with --cudagraphs (compiled
    without CUDA graphs ran slower than eager on an H200); elsewhere eager (shared.compile_choice). Eager where
    compiling does not work here"""
    policy: str | None = None
    """build the agent with this `module:factory` instead of the script's own network (docs/policies.md)"""
    policy_kwargs: str = "{}"
    """JSON keyword arguments of the --policy factory, e.g. '{"model_path": "my_vla.pt"}'"""


class UsageError(SystemExit):
    """A user mistake. Its ``code`` is the one line Python prints on stderr before exiting with status 1."""


def fail(message: str, show: bool = True) -> None:
    """Stop with ``error: message``. ``show=False`` exits with status 1 silently: in DDP, the ranks that do
    not know the details leave the line to the one that does."""
    raise UsageError(f"error: {message}" if show else 1)


def flag(name: str) -> str:
    """The command-line spelling of an Args field: ``num_envs`` -> ``--num-envs``."""
    return "--" + name.replace("_", "-")


def check_args(
    args: Any,
    positive: Iterable[str] = (),
    non_negative: Iterable[str] = (),
    at_most_1: Iterable[str] = (),
    finite: Iterable[str] = (),
    may_be_inf: Iterable[str] = (),
    sizes: Iterable[str] = ("hidden_sizes",),
    minibatches_of: int | None = None,
    json_objects: Iterable[str] = (),
    files: Iterable[str] = (),
    env_id: bool = True,
    show: bool = True,
) -> None:
    """The checks every trainer makes, each failing with one line naming the flag: fields that must be
    > 0 (None skips), >= 0, <= 1 (discounts, lambdas), non-empty tuples of positive integers (layer sizes),
    JSON objects (env kwargs), paths of existing files (None skips), a known env id. Every number named in
    ``positive``, ``non_negative``, ``at_most_1`` or ``finite`` must be finite (NaN never passes; ``inf`` only
    for the fields in ``may_be_inf``, where it means "no limit"). ``minibatches_of``: the number of samples
    ``--num-minibatches`` must cut into equal minibatches of at least 2 (advantages are normalized per
    minibatch). For a `RunArgs`, its own fields are checked too (``--seed`` >= 0, ``--resume`` and
    ``--eval-checkpoint`` not together)."""
    if isinstance(args, RunArgs):
        positive = ("num_eval_envs", "num_eval_episodes", "max_consecutive_skips", *positive)
        non_negative = ("seed", "eval_freq", "save_freq", *non_negative)
        json_objects = ("env_kwargs", "eval_env_kwargs", "policy_kwargs", *json_objects)
        files = ("resume", "eval_checkpoint", *files)
        if args.resume and args.eval_checkpoint:  # which one would be evaluated, under which name?
            fail(
                "--resume and --eval-checkpoint exclude each other: --eval-checkpoint evaluates a checkpoint and "
                "exits, --resume continues training one; pass one of them",
                show,
            )
    may_be_inf = set(may_be_inf)
    for name in dict.fromkeys((*positive, *non_negative, *at_most_1, *finite)):
        value = getattr(args, name)
        if isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and name not in may_be_inf)):
            fail(f"{flag(name)} must be a finite number, got {value}", show)
    for name in positive:
        value = getattr(args, name)
        if value is not None and not value > 0:
            fail(f"{flag(name)} must be > 0, got {value}", show)
    for name in non_negative:
        if getattr(args, name) < 0:
            fail(f"{flag(name)} must be >= 0, got {getattr(args, name)}", show)
    for name in at_most_1:
        if getattr(args, name) > 1.0:
            fail(f"{flag(name)} must be <= 1, got {getattr(args, name)}", show)
    for name in sizes:
        value = getattr(args, name)
        if not value or min(value) <= 0:
            fail(f"{flag(name)} must be one or more positive integers, got {value}", show)
    n = getattr(args, "num_minibatches", None)
    if minibatches_of is not None and (n > minibatches_of // 2 or minibatches_of % n):
        fail(
            f"--num-minibatches must divide the {minibatches_of} samples of a rollout (--num-envs x --num-steps) into "
            f"equal minibatches of at least 2 (advantages are normalized per minibatch), got {n}",
            show,
        )
    for name in json_objects:
        try:
            ok = isinstance(json.loads(getattr(args, name)), dict)
        except json.JSONDecodeError:
            ok = False
        if not ok:
            fail(f"{flag(name)} must be a JSON object like '{{\"key\": 1.0}}', got {getattr(args, name)!r}", show)
    for name in files:
        path = getattr(args, name)
        if path is not None and not Path(path).is_file():
            fail(f"{flag(name)}: no such checkpoint file {path!r}", show)
    if env_id:
        try:
            check_env_id(args.env_id)
        except ValueError as e:
            fail(str(e), show)
