"""Rendering that never stops a run: ``render()`` of a vector env gives its first sub-env's frame
(:class:`RenderFirstEnv`), or None with one warning where the env cannot render here (:class:`SafeRender`, with the
hint for headless MuJoCo), and ``first_frame`` reads one RGB frame out of whatever a backend's ``render()`` returned."""

from __future__ import annotations

import os
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import VectorWrapper

__all__ = ["MUJOCO_RENDER_HINT", "env_name", "first_frame", "RenderFirstEnv", "SafeRender"]


def first_frame(frames: Any) -> np.ndarray | None:
    """The first RGB frame of what a (vector) env's ``render()`` returned, as uint8 ``[H, W, 3]``; else None.

    Accepts one frame ``[H, W, 3|4]`` or a batch ``[N, H, W, 3|4]`` (numpy or torch), or a list/tuple of
    frames (a Gymnasium vector env's ``render()``); float frames are taken to be in [0, 1].
    """
    if isinstance(frames, (list, tuple)):
        frames = frames[0] if len(frames) else None
    if frames is None:
        return None
    if isinstance(frames, torch.Tensor):  # e.g. ManiSkill's batch on the GPU: copy only the first frame
        frames = (frames[0] if frames.ndim == 4 else frames).detach().cpu().numpy()
    frame = np.asarray(frames)
    if frame.ndim == 4:
        frame = frame[0]
    if frame.ndim != 3 or frame.shape[-1] not in (3, 4) or frame.dtype.kind not in "biuf":
        return None
    frame = frame[..., :3]
    if frame.dtype.kind == "f":
        frame = np.clip(frame, 0.0, 1.0) * 255.0
    return np.ascontiguousarray(np.clip(frame, 0, 255).astype(np.uint8))


MUJOCO_RENDER_HINT = "; MuJoCo renders headless with MUJOCO_GL=egl (libegl1) or MUJOCO_GL=osmesa (libosmesa6)"


def env_name(env) -> str:
    """The registered id of an env (or wrapper), for messages; the raw env's class name when it has no spec."""
    return env.spec.id if env.spec is not None else type(env.unwrapped).__name__


def _warn_cannot_render(env, error: BaseException | str, hint: str = "") -> None:
    name = env_name(env)
    reason = error if isinstance(error, str) else f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
    warnings.warn(
        f"{name} cannot render here ({reason[:200]}); render() returns None{hint}", RuntimeWarning, stacklevel=3
    )


class SafeRender(gym.Wrapper):
    """A single env whose ``render()`` never raises: where it can't render it warns once, with the reason, in
    the process that owns the env (an async worker too, which would otherwise die), and returns None from then
    on. Without a display it first defaults ``MUJOCO_GL`` to ``egl`` (Gymnasium's MuJoCo renderer would pick
    GLFW and fail), at render time and not at import time, because ``import mujoco`` itself reads MUJOCO_GL.
    """

    def __init__(self, env: gym.Env, hint: str | None = None):
        super().__init__(env)
        is_mujoco = "mujoco" in type(env.unwrapped).__module__
        self.hint = hint if hint is not None else MUJOCO_RENDER_HINT if is_mujoco else ""
        self.cannot_render = False

    def render(self):
        if self.cannot_render:
            return None
        if not any(os.environ.get(k) for k in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY")):
            os.environ["MUJOCO_GL"] = "egl"
        try:
            frame = self.env.render()
            error = None if frame is not None else f"render_mode={self.env.render_mode!r} gives no frame"
        except Exception as e:  # any renderer failure means "no video", never a crash
            frame, error = None, e
        if error is not None:
            self.cannot_render = True
            _warn_cannot_render(self, error, self.hint)
        return frame


class RenderFirstEnv(VectorWrapper):
    """Base of the adapters: ``render()`` returns the first sub-env's RGB frame (uint8 ``[H, W, 3]``) or None.

    It never raises: an exception from the renderer is reported once (reason and ``render_hint``) and render()
    returns None from then on, which the trainers read as "no video" (they say so themselves). Subclasses
    say how to get the frames (``_render_frames``).
    """

    render_hint = ""
    """appended to the warning, e.g. how to enable headless rendering"""
    _render_failed = False

    def _render_frames(self) -> Any:
        return self.env.render()

    def render(self) -> np.ndarray | None:
        if self._render_failed:
            return None
        try:
            return first_frame(self._render_frames())
        except Exception as e:  # any renderer failure means "no video", never a crash
            self._render_failed = True
            _warn_cannot_render(self, e, self.render_hint)
            return None
