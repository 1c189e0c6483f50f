"""Which optional extras are installed, and a mark for tests that need one: they skip with the reason on a bare
`uv run pytest`, and fail in CI (`CI` set), which installs the light extras (`.ci/run`).

An extra that conflicts with those (mjlab pins MuJoCo 3.11, the mujoco extra resolves to MuJoCo 4: `[tool.uv]
conflicts` in pyproject.toml) cannot be in CI's main environment; CI installs it in a step of its own and runs its
tests there with ``CLEANRL_EMBODIED_REQUIRE_<EXTRA>=1``, which makes them fail, not skip, where it is missing."""

from __future__ import annotations

import importlib.util
import os

import pytest

MODULES = {
    "vla": ("transformers", "peft"),
    "mujoco": ("mujoco",),
    "export": ("onnx", "onnxscript", "onnxruntime"),
    "mjlab": ("mjlab", "mujoco_warp"),
}
SEPARATE_IN_CI = {"mjlab": "CLEANRL_EMBODIED_REQUIRE_MJLAB"}
"""Extras CI installs in a step of their own (they conflict with the main environment's): the variable that makes
their tests fail where the extra is missing."""


def installed(extra: str) -> bool:
    return all(importlib.util.find_spec(module) is not None for module in MODULES[extra])


def required(extra: str) -> bool:
    """Whether a missing ``extra`` fails its tests here instead of skipping them."""
    if extra in SEPARATE_IN_CI:
        return os.environ.get(SEPARATE_IN_CI[extra], "") not in ("", "0")
    return bool(os.environ.get("CI"))


def needs(extra: str) -> pytest.MarkDecorator:
    """Skip where `extra` is missing (except in CI, where the test then fails and says what is missing)."""
    reason = f"needs the {extra} extra: uv sync --extra {extra}"
    if extra in SEPARATE_IN_CI:
        reason += (
            f" (it conflicts with the mujoco extra; in an environment of its own: UV_PROJECT_ENVIRONMENT=.venv-{extra}"
            f" uv sync --extra {extra}; CI runs these tests in a step of their own)"
        )
    return pytest.mark.skipif(not installed(extra) and not required(extra), reason=reason)
