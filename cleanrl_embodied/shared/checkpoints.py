"""Checkpoint plumbing: loading with its compatibility checks, and the random state a resume restores.

What a checkpoint *holds* is the trainer's business (it builds the dict); this module only loads one
safely and says, in one line, why a file cannot serve the run at hand. Files are written with
``atomic_save`` (shared.logging) and read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from cleanrl_embodied.shared.cli import fail, flag

__all__ = ["load_checkpoint", "resume_lr_anchor", "rng_state", "set_rng_state"]


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def load_checkpoint(path: str, flag_name: str, scripts: Iterable[str], args: Any, same: Iterable[str],
                    show: bool = True) -> dict:
    """Load ``path`` on the CPU (``weights_only=True``) and check it can serve this run.

    ``scripts``: trainers whose checkpoints are accepted (their ``"script"`` entry); ``same``: Args fields
    that must equal the checkpoint's (each mismatch is one line naming the flag). Fails with one line for
    a missing or unreadable file, another trainer's checkpoint or a mismatch.
    """
    scripts = tuple(scripts)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        fail(f"{flag(flag_name)}: no such checkpoint file {path!r}", show)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user mistake
        reason = (str(e).strip().splitlines() or [""])[0]
        fail(f"{flag(flag_name)} {path}: not a readable checkpoint ({type(e).__name__}: {reason})", show)
    if not isinstance(ckpt, dict) or ckpt.get("script") not in scripts or not isinstance(ckpt.get("args"), dict):
        found = ckpt.get("script") if isinstance(ckpt, dict) else None
        fail(f"{flag(flag_name)} {path}: not a checkpoint of {' or '.join(s + '.py' for s in scripts)}"
             + (f" (it is from {found}.py)" if found else ""), show)
    for key in same:
        theirs, ours = ckpt["args"].get(key), getattr(args, key)
        if _plain(theirs) != _plain(ours):
            fail(f"{flag(flag_name)} {path} was trained with {flag(key)} {theirs}, this run has {ours}; "
                 "pass the same value", show)
    return ckpt


def rng_state() -> dict:
    """Python's, NumPy's and torch's (CPU and this process's CUDA device) random states, as tensors and
    plain values that ``torch.load(weights_only=True)`` can read back."""
    np_state = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else [],
            "numpy": [torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]]}


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` captured."""
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"][0])
    keys, *rest = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), *rest))


def resume_lr_anchor(ckpt: dict, num_iterations: int, say) -> tuple[int, float]:
    """The point (iteration, learning rate) from which a resumed run anneals the LR linearly to 0 at its last
    iteration: the checkpoint's own. With the same ``--total-timesteps`` that is the straight run's schedule,
    bit for bit; with another one (training longer), the schedule of a run planned with the new total from
    the start, which ``say`` announces with the LR before and after (continuing from where the LR was would
    leave a finished run at 0)."""
    (it0, lr0), done, old_total = ckpt["lr_anchor"], ckpt["iteration"], ckpt["num_iterations"]
    if old_total != num_iterations:
        lr = lambda total: lr0 * (1.0 - (done - it0) / max(total - it0, 1))  # noqa: E731
        say(f"--total-timesteps changed ({old_total} -> {num_iterations} iterations): the learning rate follows "
            f"the schedule of a {num_iterations}-iteration run, {lr(num_iterations):.3g} at iteration {done + 1} "
            f"(the old schedule had {max(lr(old_total), 0.0):.3g})")
    return int(it0), float(lr0)
