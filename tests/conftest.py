"""Fixtures more than one test module uses (opt-in: `pytestmark = pytest.mark.usefixtures("single_thread")`), the
options and marks of the suite. Helpers that are plain functions live beside this file: trainer_args.py (tiny Args
per trainer), checks.py (one-line errors, compiled gradients, micro-batches, GPU host syncs), subprocesses.py
(trainers run as subprocesses and signalled), hf_vla_policies.py, toy_policies.py, envs_for_tests.py and others."""

import pytest
import torch


@pytest.fixture(autouse=True)
def compile_times(tmp_path_factory, monkeypatch):
    """Every test keeps its own ``--compile auto`` measurements (compilation.py), in a file of its own that starts
    empty, also for the trainers it runs as subprocesses: no test reads or writes the user's, or another test's."""
    path = tmp_path_factory.mktemp("compile_times") / "compile_times.json"
    monkeypatch.setenv("CLEANRL_EMBODIED_COMPILE_TIMES", str(path))
    return path


@pytest.fixture
def single_thread():
    """torch on one thread for the test (PushCubeRL's tests compare numbers that thread count could reorder)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def offline(monkeypatch):
    """No run reaches wandb (WANDB_MODE=disabled), and torch computes on one thread: set for the rest of the
    session, not given back (as the modules that use this always left it)."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    torch.set_num_threads(1)


@pytest.fixture
def offline_hub(offline, monkeypatch):
    """`offline`, and no model is fetched from a hub (HF_HUB_OFFLINE=1): building a policy must never reach one."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="write the numeric fingerprints' golden files anew (tests/numerics.py) instead of comparing with them",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (benchmarks/gpu_check.py runs `pytest -m cuda`)")
    config.addinivalue_line("markers", "numerics: numeric fingerprints against golden files (tests/numerics.py)")


def pytest_collection_modifyitems(config, items):
    """Every test skipped for want of CUDA is also marked `cuda`, so `pytest -m cuda` selects the GPU tests."""
    for item in items:
        if any("cuda" in str(mark.kwargs.get("reason", "")).lower() for mark in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.cuda)
