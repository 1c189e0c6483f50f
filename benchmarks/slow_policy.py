"""A stand-in for a large model's inference latency, for benchmarks/async_speed.py: the trainer's own agent with
a fixed sleep in every rollout inference call (no grad), plugged in through the policy hook:

    python cleanrl_embodied/ppo_async.py --policy slow_policy:make_agent --policy-kwargs '{"latency_ms": 20}'

(with benchmarks/ on PYTHONPATH). Training forwards (grad enabled) are not slowed.
"""

from __future__ import annotations

import importlib
import time

import torch


def make_agent(obs_space, act_space, args, latency_ms: float = 0.0):
    if latency_ms < 0:
        raise SystemExit(f"error: --policy-kwargs latency_ms must be >= 0, got {latency_ms}")
    base = importlib.import_module(type(args).__module__).Agent

    class SlowAgent(base):
        def dist(self, obs):  # evaluation
            if not torch.is_grad_enabled():
                time.sleep(latency_ms / 1000)
            return super().dist(obs)

        def forward(self, obs):  # the rollout's (and the loss's) one pass
            if not torch.is_grad_enabled():
                time.sleep(latency_ms / 1000)
            return super().forward(obs)

    return SlowAgent(obs_space, act_space, args)
