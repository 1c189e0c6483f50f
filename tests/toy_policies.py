"""Policy factories for ``--policy toy_policies:<name>`` in tests: the trainers' own agents with a fault
or a delay added, built through the public policy hook instead of replacing a script's globals."""

from __future__ import annotations

import importlib
import os
import signal
import time

import torch


def _agent_class(args):
    """The Agent of the trainer these args belong to (ppo_continuous.Args -> ppo_continuous.Agent)."""
    return importlib.import_module(type(args).__module__).Agent


def nan_loss_every(obs_space, act_space, args, every: int = 3):
    """An Agent whose every ``every``-th training forward (grad enabled) gives NaN action means, so that
    minibatch's loss is NaN; rollouts and evaluations (no grad) stay finite."""

    class NaNAgent(_agent_class(args)):
        calls = 0

        def dist(self, obs):
            d = super().dist(obs)
            if torch.is_grad_enabled():
                type(self).calls += 1
                if type(self).calls % every == 0:
                    return torch.distributions.Normal(d.mean * float("nan"), d.stddev, validate_args=False)
            return d

    return NaNAgent(obs_space.shape[0], act_space.shape[0], args)


FAILED_ONCE: set[str] = set()


def fail_in_update(obs_space, act_space, args, at_call: int = 5, once: bool = False):
    """An Agent that raises RuntimeError at its ``at_call``-th training forward (inside an update). With
    ``once``, only the first run of this process that reaches that call fails (later runs with the same
    --policy, e.g. a resume, which must name the same policy, train normally)."""

    class FailingAgent(_agent_class(args)):
        calls = 0

        def dist(self, obs):
            if torch.is_grad_enabled():
                type(self).calls += 1
                if type(self).calls == at_call and not (once and "fail_in_update" in FAILED_ONCE):
                    FAILED_ONCE.add("fail_in_update")
                    raise RuntimeError("injected failure inside the update")
            return super().dist(obs)

    return FailingAgent(obs_space.shape[0], act_space.shape[0], args)


def sigint_in_update(obs_space, act_space, args, at_call: int = 5):
    """An Agent that sends Ctrl-C (SIGINT) to its own process at its ``at_call``-th training forward."""

    class InterruptingAgent(_agent_class(args)):
        calls = 0

        def dist(self, obs):
            if torch.is_grad_enabled():
                type(self).calls += 1
                if type(self).calls == at_call:
                    os.kill(os.getpid(), signal.SIGINT)
            return super().dist(obs)

    return InterruptingAgent(obs_space.shape[0], act_space.shape[0], args)


def slow(obs_space, act_space, args, rollout_ms: float = 0.0, update_ms: float = 0.0):
    """An Agent that sleeps ``rollout_ms`` per inference call (no grad) and ``update_ms`` per training
    forward: a stand-in for a large model's latency."""

    class SlowAgent(_agent_class(args)):
        def dist(self, obs):
            time.sleep((update_ms if torch.is_grad_enabled() else rollout_ms) / 1000)
            return super().dist(obs)

    return SlowAgent(obs_space.shape[0], act_space.shape[0], args)


RECORDS: list[tuple[str, bool, float]] = []
"""(thread name, grad enabled, parameter fingerprint) of every call of a `recording` agent."""


def fingerprint(module: torch.nn.Module) -> float:
    return float(sum(t.double().sum() for t in module.state_dict().values()))


def recording(obs_space, act_space, args, rollout_ms: float = 0.0):
    """An Agent that records, at every action-distribution call, which thread called it, whether it was a
    training forward, and a fingerprint of the weights it acted with (into RECORDS)."""

    class RecordingAgent(_agent_class(args)):
        def dist(self, obs):
            import threading

            RECORDS.append((threading.current_thread().name, torch.is_grad_enabled(), fingerprint(self)))
            if not torch.is_grad_enabled():
                time.sleep(rollout_ms / 1000)
            return super().dist(obs)

    return RecordingAgent(obs_space.shape[0], act_space.shape[0], args)
