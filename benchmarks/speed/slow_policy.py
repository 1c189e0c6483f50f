"""A stand-in for a large model's inference latency, for benchmarks/speed/async_speed.py: a small MLP policy with a
fixed sleep in every rollout inference call (no grad), plugged into the VLA trainers through the policy hook:

    python cleanrl_embodied/ppo_vla_async.py --policy benchmarks.speed.slow_policy:make_agent \\
        --policy-kwargs '{"latency_ms": 20}'

(from the repository root). Training forwards (grad enabled) and value passes are not slowed.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn as nn

from cleanrl_embodied.shared.observations import float_dim, float_entries


def mlp(in_dim: int, hidden_sizes: tuple[int, ...], out_dim: int, out_std: float) -> nn.Sequential:
    """Tanh MLP with orthogonal init (gain sqrt(2), the last layer's `out_std`) and zero biases: CleanRL's."""
    sizes, layers = [in_dim, *hidden_sizes, out_dim], []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layer = nn.Linear(n_in, n_out)
        nn.init.orthogonal_(layer.weight, out_std if i == len(sizes) - 2 else math.sqrt(2))
        nn.init.zeros_(layer.bias)
        layers += [layer, nn.Tanh()]
    return nn.Sequential(*layers[:-1])


class SlowAgent(nn.Module):
    """The classic trainers' MLP actor-critic (without observation normalization) on the observation's float
    entries: a Gaussian with a state-independent log-std over the action (or a chunk of them) and a separate critic;
    every inference call sleeps `latency_ms`."""

    def __init__(self, obs_space, act_space, hidden_sizes: tuple[int, ...], latency_ms: float, init_logstd: float):
        super().__init__()
        self.action_shape, self.latency_s = act_space.shape, latency_ms / 1000
        act_dim = math.prod(self.action_shape)
        self.critic = mlp(float_dim(obs_space), hidden_sizes, 1, out_std=1.0)
        self.actor_mean = mlp(float_dim(obs_space), hidden_sizes, act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.full((1, act_dim), float(init_logstd)))

    def _dist(self, state: torch.Tensor) -> torch.distributions.Normal:
        if not torch.is_grad_enabled():  # an inference call (rollout, evaluation)
            time.sleep(self.latency_s)
        mean = self.actor_mean(state)
        std = self.actor_logstd.expand_as(mean).exp()
        shape = (-1, *self.action_shape)
        return torch.distributions.Normal(mean.view(shape), std.view(shape), validate_args=False)

    def forward(self, obs):  # the sync trainer's rollout (and the loss's) one pass
        state = float_entries(obs)
        return self._dist(state), self.critic(state).squeeze(-1)

    def dist(self, obs):  # the async collector's and evaluation's
        return self._dist(float_entries(obs))

    def get_value(self, obs):
        return self.critic(float_entries(obs)).squeeze(-1)

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        return action  # the env clips


def make_agent(obs_space, act_space, args, latency_ms: float = 0.0, hidden_sizes=(128, 128), init_logstd=-0.5):
    if latency_ms < 0:
        raise SystemExit(f"error: --policy-kwargs latency_ms must be >= 0, got {latency_ms}")
    if not hidden_sizes or min(hidden_sizes) <= 0 or not np.isfinite(init_logstd):
        raise SystemExit("error: --policy-kwargs hidden_sizes must be positive integers, init_logstd finite")
    return SlowAgent(obs_space, act_space, tuple(int(h) for h in hidden_sizes), latency_ms, init_logstd)
