"""Running statistics of the data a run sees (observation normalization, reward scaling)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn


class RunningMeanStd(nn.Module):
    """Running mean and variance in float64, merged batch by batch with the parallel-variance formula. In a process
    group of several ranks, ``update`` is a collective: every rank calls it, the batches of all ranks are merged in
    rank order, and every rank ends with the same bits."""

    def __init__(self, shape: tuple[int, ...] = ()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        if self.mean.numel() == 0:  # observations without float entries: nothing to track
            return
        x = x.reshape(-1, *self.mean.shape).double()
        local = torch.cat([x.new_tensor([x.shape[0]]), x.mean(0).reshape(-1), x.var(0, unbiased=False).reshape(-1)])
        parts = [local]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, local)
        for part in parts:  # in rank order, the same on every rank
            n, batch_mean, batch_var = part[0], *part[1:].view(2, *self.mean.shape).unbind(0)
            delta, total = batch_mean - self.mean, self.count + n
            m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
            self.mean += delta * n / total
            self.var.copy_(m2 / total)
            self.count.copy_(total)
