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
