"""Test-only helpers for grpo.py, used through its public hooks (``--policy grpo_test_helpers:<factory>``,
``--env-id <registered id>``) instead of replacing the script's globals.

- ``sigint_actor``: the built-in Actor that sends SIGINT to its own process at its ``at_call``-th rollout step
  (a no-grad call on a batch of ``num_envs`` observations), like a user pressing Ctrl-C mid-iteration.
- ``slow_actor``: the built-in Actor that sleeps ``rollout_ms`` at every rollout step (a no-grad call on a batch of
  ``num_envs`` observations): a run that lasts long enough in wall time to be stopped from outside.
- ``nan_actor``: the built-in Actor whose ``at_calls``-th training forwards (grad enabled) give NaN action
  means, so those minibatches have a NaN loss and are skipped.
- ``GRPOSuccessToy-v0``: episodes of up to 10 steps; an action > 0 at the 2nd step ends the episode with
  success, otherwise it runs to the limit without success. With ``--num-steps`` 5, only successes end inside
  the horizon.
- ``PUSH_CUBE_GROUPS``: the sizes of grpo.py's short runs on PushCubeRL in tests/test_grpo.py and test_grpo_loss.py.
"""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
import torch

from cleanrl_embodied import grpo
from tests.trainer_args import EIGHT_ENVS

# 8 envs in groups of 4 over whole episodes (no --num-steps: PushCubeRL's 50-step horizon), EIGHT_ENVS otherwise. The
# test adds how many steps it runs.
PUSH_CUBE_GROUPS = dict(EIGHT_ENVS, env_id="PushCubeRL", num_steps=None, group_size=4)


def _actor(obs_space, act_space, args) -> grpo.Actor:
    return grpo.Actor(obs_space, act_space, args)


class SigintActor(grpo.Actor):
    def dist(self, obs):
        if not torch.is_grad_enabled() and obs.shape[0] == self.num_envs:
            self.calls += 1
            if self.calls == self.at_call:
                os.kill(os.getpid(), signal.SIGINT)
        return super().dist(obs)


def sigint_actor(obs_space, act_space, args, at_call: int) -> grpo.Actor:
    actor = _actor(obs_space, act_space, args)
    actor.__class__ = SigintActor
    actor.calls, actor.at_call, actor.num_envs = 0, at_call, args.num_envs
    return actor


class SlowActor(grpo.Actor):
    def dist(self, obs):
        if not torch.is_grad_enabled() and obs.shape[0] == self.num_envs:
            time.sleep(self.rollout_ms / 1000)
        return super().dist(obs)


def slow_actor(obs_space, act_space, args, rollout_ms: float) -> grpo.Actor:
    actor = _actor(obs_space, act_space, args)
    actor.__class__ = SlowActor
    actor.rollout_ms, actor.num_envs = rollout_ms, args.num_envs
    return actor


class NaNActor(grpo.Actor):
    def dist(self, obs):
        d = super().dist(obs)
        if torch.is_grad_enabled():
            self.calls += 1
            if self.calls in self.at_calls:
                return torch.distributions.Normal(d.mean * float("nan"), d.stddev, validate_args=False)
        return d


def nan_actor(obs_space, act_space, args, at_calls: list[int]) -> grpo.Actor:
    actor = _actor(obs_space, act_space, args)
    actor.__class__ = NaNActor
    actor.calls, actor.at_calls = 0, set(at_calls)
    return actor


class SuccessToy(gym.Env):
    """``GRPOSuccessToy-v0``: a point drawn at reset that never moves; a step that `succeeds` ends the episode with
    reward 1 and success (here the 2nd step, if its action is > 0). A subclass changes `succeeds`."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self._t, self._x = 0, np.zeros(2, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t, self._x = 0, self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self._x.copy(), {}

    def succeeds(self, t: int, action) -> bool:
        """Whether the episode's ``t``-th step (from 1), with ``action``, succeeds."""
        return t == 2 and float(action[0]) > 0

    def step(self, action):
        self._t += 1
        success = self.succeeds(self._t, action)
        return self._x.copy(), float(success), success, False, {"success": success}


if "GRPOSuccessToy-v0" not in gym.registry:
    gym.register("GRPOSuccessToy-v0", entry_point=SuccessToy, max_episode_steps=10)


def tiny_actor() -> grpo.Actor:
    """The built-in actor for 3 observation and 2 action entries, one hidden layer of 16, initial log-std -0.5."""
    obs_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    return grpo.Actor(obs_space, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), grpo.Args(hidden_sizes=(16,)))
