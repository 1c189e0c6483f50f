"""Policy factories for tests/test_export.py (``--policy export_policies:<name>``): a policy that a trace cannot hold,
and one whose actor declares an observation entry privileged (critic only)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from cleanrl_embodied import ppo_continuous


class NumpyMean(ppo_continuous.Agent):
    """The built-in agent with its Gaussian mean passed through numpy (``np.tanh``): a trace records the numbers it
    saw as constants, so the traced file gives the example's actions whatever it is fed."""

    def _dist(self, features: torch.Tensor) -> torch.distributions.Normal:
        dist = super()._dist(features)
        loc = torch.from_numpy(np.tanh(dist.loc.detach().cpu().numpy())).to(dist.loc.device)
        return torch.distributions.Normal(loc, dist.scale, validate_args=False)


def numpy_mean(obs_space, act_space, args):
    return NumpyMean(obs_space, act_space, args)


class PrivilegedState(nn.Module):
    """Observations {"rgb", "state"}: the critic reads both, the actor the image alone, and ``privileged_keys``
    says so. ``leak=True`` (same parameters) makes the actor read the state too: an actor export must refuse it."""

    privileged_keys = ("state",)

    def __init__(self, obs_space, act_space, args, leak: bool = False):
        super().__init__()
        self.leak = leak
        channels, height, width = obs_space["rgb"].shape
        state, act_dim = obs_space["state"].shape[0], act_space.shape[0]
        self.encoder = nn.Sequential(nn.Conv2d(channels, 8, 4, stride=4), nn.ReLU(), nn.Flatten())
        features = self.encoder(torch.zeros(1, channels, height, width)).shape[1]
        self.actor_mean = nn.Linear(features, act_dim)
        self.from_state = nn.Linear(state, act_dim)  # what a leaking actor adds to its mean
        self.actor_logstd = nn.Parameter(torch.full((1, act_dim), -0.5))
        self.critic = nn.Sequential(nn.Linear(features + state, 16), nn.Tanh(), nn.Linear(16, 1))

    def _image(self, obs) -> torch.Tensor:
        return self.encoder(obs["rgb"].float() / 255.0)

    def dist(self, obs) -> torch.distributions.Normal:
        mean = self.actor_mean(self._image(obs))
        if self.leak:
            mean = mean + self.from_state(obs["state"])
        return torch.distributions.Normal(mean, self.actor_logstd.expand_as(mean).exp(), validate_args=False)

    def get_value(self, obs) -> torch.Tensor:
        return self.critic(torch.cat([self._image(obs), obs["state"]], -1)).squeeze(-1)

    def forward(self, obs):
        return self.dist(obs), self.get_value(obs)


def privileged_state(obs_space, act_space, args, leak: bool = False):
    return PrivilegedState(obs_space, act_space, args, leak)
