"""Fixtures more than one test module uses (opt-in: `pytest.mark.usefixtures("single_thread")`)."""

import pytest
import torch


@pytest.fixture
def single_thread():
    """torch on one thread for the test (PushCubeRL's tests compare numbers that thread count could reorder)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


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
