"""Which optional extras are installed, and a mark for tests that need one: they skip with the reason on a bare
`uv run pytest`, and fail in CI (`CI` set), which installs the light extras (`.ci/run`)."""

from __future__ import annotations

import importlib.util
import os

import pytest

MODULES = {"vla": ("transformers", "peft"), "mujoco": ("mujoco",), "export": ("onnx", "onnxscript", "onnxruntime")}


def installed(extra: str) -> bool:
    return all(importlib.util.find_spec(module) is not None for module in MODULES[extra])


def needs(extra: str) -> pytest.MarkDecorator:
    """Skip where `extra` is missing (except in CI, where the test then fails and says what is missing)."""
    return pytest.mark.skipif(
        not installed(extra) and not os.environ.get("CI"), reason=f"needs the {extra} extra: uv sync --extra {extra}"
    )
