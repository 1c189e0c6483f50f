"""Policy factories for ``--policy toy_policies:<name>`` in tests: the trainers' own agents with a fault
or a delay added, built through the public policy hook instead of replacing a script's globals."""

from __future__ import annotations

import importlib
import os
import signal
import threading
import time

import torch


def _agent_class(args):
    """The Agent of the trainer these args belong to (ppo_continuous.Args -> ppo_continuous.Agent)."""
    return importlib.import_module(type(args).__module__).Agent


def _with_hook(args, hook, obs_space, act_space):
    """The trainer's Agent with ``hook(agent)`` called at every action-distribution call: ``dist`` (evaluation,
    GRPO) and ``forward`` (the PPO trainers' rollout and loss); ``hook`` may replace the distribution."""

    class Hooked(_agent_class(args)):
        def dist(self, obs):
            return hook(self, super().dist(obs))

        def forward(self, obs):
            dist, value = super().forward(obs)
            return hook(self, dist), value

    return Hooked(obs_space, act_space, args)


def nan_loss_every(obs_space, act_space, args, every: int = 3):
    """An Agent whose every ``every``-th training forward (grad enabled) gives NaN action means, so that
    minibatch's loss is NaN; rollouts and evaluations (no grad) stay finite."""
    calls = [0]

    def hook(agent, d):
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] % every == 0:
                return torch.distributions.Normal(d.mean * float("nan"), d.stddev, validate_args=False)
        return d

    return _with_hook(args, hook, obs_space, act_space)


FAILED_ONCE: set[str] = set()


def fail_in_update(obs_space, act_space, args, at_call: int = 5, once: bool = False):
    """An Agent that raises RuntimeError at its ``at_call``-th training forward (inside an update). With
    ``once``, only the first run of this process that reaches that call fails (later runs with the same
    --policy, e.g. a resume, which must name the same policy, train normally)."""
    calls = [0]

    def hook(agent, d):
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] == at_call and not (once and "fail_in_update" in FAILED_ONCE):
                FAILED_ONCE.add("fail_in_update")
                raise RuntimeError("injected failure inside the update")
        return d

    return _with_hook(args, hook, obs_space, act_space)


def sigint_in_update(obs_space, act_space, args, at_call: int = 5):
    """An Agent that sends Ctrl-C (SIGINT) to its own process at its ``at_call``-th training forward."""
    calls = [0]

    def hook(agent, d):
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] == at_call:
                os.kill(os.getpid(), signal.SIGINT)
        return d

    return _with_hook(args, hook, obs_space, act_space)


def slow(obs_space, act_space, args, rollout_ms: float = 0.0, update_ms: float = 0.0):
    """An Agent that sleeps ``rollout_ms`` per inference call (no grad) and ``update_ms`` per training
    forward: a stand-in for a large model's latency."""

    def hook(agent, d):
        time.sleep((update_ms if torch.is_grad_enabled() else rollout_ms) / 1000)
        return d

    return _with_hook(args, hook, obs_space, act_space)


RECORDS: list[tuple[str, bool, float]] = []
"""(thread name, grad enabled, parameter fingerprint) of every call of a `recording` agent."""


def fingerprint(module: torch.nn.Module) -> float:
    return float(sum(t.double().sum() for t in module.state_dict().values()))


def recording(obs_space, act_space, args, rollout_ms: float = 0.0):
    """An Agent that records, at every action-distribution call, which thread called it, whether it was a
    training forward, and a fingerprint of the weights it acted with (into RECORDS)."""

    def hook(agent, d):
        RECORDS.append((threading.current_thread().name, torch.is_grad_enabled(), fingerprint(agent)))
        if not torch.is_grad_enabled():
            time.sleep(rollout_ms / 1000)
        return d

    return _with_hook(args, hook, obs_space, act_space)


def without_forward(obs_space, act_space, args):
    """A module with `dist` and `get_value` but no `forward` of its own (what the PPO trainers call per step)."""
    inner = _agent_class(args)(obs_space, act_space, args)

    class NoForward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def dist(self, obs):
            return self.inner.dist(obs)

        def get_value(self, obs):
            return self.inner.get_value(obs)

    return NoForward()


def nan_loss_after(obs_space, act_space, args, after: int = 4):
    """An Agent whose training forwards (grad enabled) give NaN action means from the ``after + 1``-th on, so every
    optimizer step after the first ``after`` is skipped; rollouts and evaluations stay finite."""
    calls = [0]

    def hook(agent, d):
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] > after:
                return torch.distributions.Normal(d.mean * float("nan"), d.stddev, validate_args=False)
        return d

    return _with_hook(args, hook, obs_space, act_space)


def frozen_backbone(obs_space, act_space, args, width: int = 256):
    """The trainer's Agent plus a frozen ``width x width`` layer (``requires_grad`` off), standing in for a large
    pretrained backbone that is not trained (e.g. a VLA fine-tuned with LoRA): its weights never change."""
    agent = _agent_class(args)(obs_space, act_space, args)
    agent.backbone = torch.nn.Linear(width, width).requires_grad_(False)
    return agent
