"""Building and exercising examples/hf_vla's policies in the tests, written once (import it after a test module's
check that the vla extra is installed: it imports examples.hf_vla).

- `policy_flags`: the trainer flags `make_policy` reads (head, bins, chunk), as a trainer's Args would give them.
- `outputs`: what a policy's behaviour is on some observations (log-probs of every bin, or the Gaussian's mean and
  std, and the values), to compare two policies.
- `train_steps`: a few optimizer steps that move a policy's trainable parts.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from examples.hf_vla import Bins


def policy_flags(head: str = "bins", bins: int = 16, chunk: int = 1) -> SimpleNamespace:
    """--action-head, --action-bins, --action-chunk, and no --norm-obs (a VLA trainer has none)."""
    return SimpleNamespace(action_head=head, action_bins=bins, action_chunk=chunk, norm_obs=False)


def outputs(policy, obs) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of every bin (or the Gaussian's mean and std) and the values: what a policy's behaviour is."""
    with torch.no_grad():
        dist, value = policy(obs)
    if isinstance(dist, Bins):
        return dist.logits, value
    return torch.stack([dist.mean, dist.stddev]), value


def train_steps(policy, obs, steps: int = 3, lr: float = 1e-2) -> None:
    """A few Adam steps that move the adapters and heads (toward the zero action, the value toward 0)."""
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        dist, value = policy(obs)
        target = torch.full_like(dist.mode, policy.bins // 2) if policy.bins else torch.zeros_like(dist.mode)
        loss = -dist.log_prob(target).sum() + value.pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
