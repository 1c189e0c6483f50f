"""Checkpoint plumbing: loading with its compatibility checks, and the random state a resume restores.

What a checkpoint *holds* is the trainer's business (it builds the dict); this module only loads one
safely and says, in one line, why a file cannot serve the run at hand. Files are written with
``atomic_save`` (shared.logging) and read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from cleanrl_embodied.shared.cli import fail, flag
from cleanrl_embodied.shared.tensordict_helpers import flat_dim

__all__ = ["check_dims", "load_checkpoint", "note_schedule_change", "rng_state", "set_rng_state"]


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def load_checkpoint(
    path: str, flag_name: str, scripts: Iterable[str], args: Any, same: Iterable[str], show: bool = True
) -> dict:
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
        fail(
            f"{flag(flag_name)} {path}: not a checkpoint of {' or '.join(s + '.py' for s in scripts)}"
            + (f" (it is from {found}.py)" if found else ""),
            show,
        )
    defaults = {f.name: f.default for f in dataclasses.fields(args)} if dataclasses.is_dataclass(args) else {}
    for key in same:  # a flag the checkpoint's trainer did not have yet ran with its default
        theirs, ours = ckpt["args"].get(key, defaults.get(key)), getattr(args, key)
        if _plain(theirs) != _plain(ours):
            fail(
                f"{flag(flag_name)} {path} was trained with {flag(key)} {theirs}, this run has {ours}; "
                "pass the same value",
                show,
            )
    return ckpt


def load_start(
    args: Any, scripts: Iterable[str], same: tuple[str, ...], resume_same: tuple[str, ...] = (), read: bool = True
) -> tuple[dict | None, str]:
    """The checkpoint ``--resume`` or ``--eval-checkpoint`` names (None if neither is given) and that flag's
    name, for later messages. ``same``: the Args fields both uses must share with the checkpoint (the network
    and what it sees); ``resume_same``: the further fields a resumed run must keep (see ``load_checkpoint``).
    ``read=False`` (DDP ranks other than 0, which get the content by broadcast): only the flag's name."""
    flag_name, path = ("resume", args.resume) if args.resume else ("eval_checkpoint", args.eval_checkpoint)
    if not path or not read:
        return None, flag_name
    return load_checkpoint(path, flag_name, scripts, args, same + (resume_same if args.resume else ())), flag_name


def check_dims(envs, *checkpoints: tuple[dict | None, str], show: bool = True) -> tuple[int, int]:
    """The flat observation size and the action size of ``envs``; fails with one line if a checkpoint, given
    as ``(ckpt, flag_name)`` (``ckpt`` None: nothing loaded), was saved for an env with other sizes."""
    obs_dim, act_dim = flat_dim(envs.single_observation_space), envs.single_action_space.shape[0]
    for ckpt, flag_name in checkpoints:
        if ckpt is not None and (ckpt["obs_dim"], ckpt["act_dim"]) != (obs_dim, act_dim):
            fail(
                f"{flag(flag_name)}: the checkpoint has observation/action sizes {ckpt['obs_dim']}/{ckpt['act_dim']}, "
                f"the env here {obs_dim}/{act_dim} (pass the env options it was trained with)",
                show,
            )
    return obs_dim, act_dim


def rng_state() -> dict:
    """Python's, NumPy's and torch's (CPU and this process's CUDA device) random states, as tensors and
    plain values that ``torch.load(weights_only=True)`` can read back."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else [],
        "numpy": [torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
    }


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` captured."""
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"][0])
    keys, *rest = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), *rest))


def note_schedule_change(ckpt: dict, num_iterations: int, learning_rate: float, say) -> None:
    """The learning rate anneals linearly from ``learning_rate`` at iteration 1 to 0 after ``num_iterations``,
    resumed or not. A resume with another number of iterations (another ``--total-timesteps``, e.g. to train
    longer) thus follows the schedule of a run planned with the new total; ``say`` announces it with the
    learning rate before and after (continuing the old schedule would leave a finished run at 0)."""
    done, old_total = ckpt["iteration"], ckpt["num_iterations"]
    if old_total != num_iterations:
        lr = lambda total: learning_rate * max(1.0 - done / total, 0.0)  # noqa: E731 - the LR of iteration done + 1
        say(
            f"this run has {num_iterations} iterations, the checkpoint's run {old_total}: the learning rate follows "
            f"the {num_iterations}-iteration schedule, {lr(num_iterations):.3g} at iteration {done + 1} "
            f"(the old schedule had {lr(old_total):.3g})"
        )
