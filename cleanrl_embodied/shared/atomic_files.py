"""Files written atomically, so a crash mid-write (an error, a full disk, Ctrl-C) never leaves a torn file: a temp
file beside the target, fsync, rename. ``atomic_save`` for checkpoints (``torch.save``), ``atomic_write`` for any
bytes (summary.json)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

__all__ = ["atomic_save", "atomic_write"]


# ---------------------------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------------------------
def atomic_write(path: str | os.PathLike, write_fn: Callable[[IO[bytes]], None]) -> Path:
    """Write ``path`` via ``write_fn(file)`` into a temp file beside it, fsync, then rename over it.

    The temp file lives in the same directory (so ``os.replace`` is an atomic rename on one
    filesystem) and is removed again if anything fails, including KeyboardInterrupt. It is
    created with mode 0o666 minus the umask, like a normal ``open()``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # Make the rename itself durable (best effort; not possible on every OS / filesystem).
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return path


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save(obj, path)`` atomically: temp file in the same directory, fsync, ``os.replace``.

    If saving fails midway (error, full disk, Ctrl-C), the existing file at ``path`` is left
    untouched and no temp file stays behind. Load the result with ``torch.load(path, weights_only=True)``.
    Returns ``path`` as a :class:`~pathlib.Path`.
    """
    return atomic_write(path, lambda f: torch.save(obj, f))
