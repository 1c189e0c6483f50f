"""The running statistics behind --norm-obs and --norm-reward (shared.RunningMeanStd; the merge over ranks is
tested in tests/test_ppo_ddp.py: the normalizers of a two-rank run count the samples of both)."""

from __future__ import annotations

import pytest
import torch

from cleanrl_embodied import shared


def test_running_mean_std_merges_batches_like_one_big_batch():
    torch.manual_seed(0)
    rms = shared.RunningMeanStd((3,))
    chunks = [torch.randn(n, 3) * torch.tensor([1.0, 5.0, 0.1]) + 3.0 for n in (7, 100, 1, 33)]
    for chunk in chunks:
        rms.update(chunk)
    x = torch.cat(chunks).double()
    # the normalizer starts from a pseudo-sample of weight 1e-4 with mean 0 and variance 1
    prior, total = 1e-4, 1e-4 + x.shape[0]
    mean = x.sum(0) / total
    var = (prior * (1.0 + 0.0**2) + (x**2).sum(0)) / total - mean**2
    torch.testing.assert_close(rms.mean, mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(rms.var, var, rtol=1e-8, atol=1e-10)
    assert rms.mean.dtype == torch.float64 and rms.count == pytest.approx(total)
