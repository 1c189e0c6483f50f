"""Tiny Gymnasium envs for the tests, registered when this module is imported.

They stand in for a package that registers its own ids (gymnasium-robotics, a lab's task package), so tests can
use Gymnasium's ``module:EnvId`` form, e.g. ``make_env("tests.envs_for_tests:PointReach-v0", num_envs=4)`` or
``--env-id tests.envs_for_tests:PointReach-v0`` (the repository root is on ``sys.path`` through the editable
install, or as the current directory).

``PointReach-v0`` (:class:`PointReach`): a point in ``[-1, 1]^dim`` moves by ``0.1 * action`` (actions clipped
to ``[-1, 1]``) towards a target drawn at reset. Observation ``float32 [2 * dim]`` = (position, target - position);
reward ``-|target - position|``; ``info["success"]`` (bool) when within 0.1 of the target, which also terminates
the episode; truncated after 50 steps (``max_episode_steps``). A policy that pushes along the observed offset
succeeds within about 10 steps, so a few hundred PPO steps already show learning.

``PointReachDict-v0``: the same task with a ``Dict`` observation ``{"position", "offset"}`` (like
gymnasium-robotics' goal-conditioned envs), for code paths that flatten dict observations.

``PointReachPixels-v0``: the same task seen as ``{"position", "pixels"}``: ``pixels`` is a uint8 ``[3, 36, 36]``
image of the square ``[-1, 1]^2`` (``dim`` 2 only) with the point in the red channel and the target in the
green one, so the target is known from the image alone; for the image observation paths.

Keyword arguments (``gym.make(..., **kwargs)``, ``make_env(..., **kwargs)``, ``--env-kwargs '{...}'``), so that
other tests can inject faults:

- ``dim`` (int, default 2): dimension of the point, the action and half the observation.
- ``nan_obs_at_step`` (int or None): the observation returned by the k-th ``step()`` of this env (counted from 1
  over the env's whole life, across resets) is all NaN; every other observation is finite.
- ``raise_at_step`` (int or None): the k-th ``step()`` (counted the same way) raises ``RuntimeError``.
- ``success_radius`` (float, default 0.1): distance to the target that counts as success (0: never).
- ``terminate_at_step`` (int or None): episodes also terminate (a true end) at their k-th step.
- ``nan_final_obs`` (bool): the observation an episode ends on (its final obs) is all NaN.
- ``record`` (bool): append this env's keyword arguments to ``CONSTRUCTED`` (which envs got what).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

__all__ = ["PointReach"]

ENV_IDS = ("PointReach-v0", "PointReachDict-v0", "PointReachPixels-v0")
PIXELS = 36  # the smallest image the trainers' CNN takes
CONSTRUCTED: list[dict] = []


class PointReach(gym.Env):
    """See the module docstring."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        dim: int = 2,
        dict_obs: bool = False,
        pixels: bool = False,
        nan_obs_at_step: int | None = None,
        raise_at_step: int | None = None,
        success_radius: float = 0.1,
        terminate_at_step: int | None = None,
        nan_final_obs: bool = False,
        record: bool = False,
    ):
        if record:
            CONSTRUCTED.append(
                {
                    "dim": dim,
                    "nan_obs_at_step": nan_obs_at_step,
                    "raise_at_step": raise_at_step,
                    "success_radius": success_radius,
                    "terminate_at_step": terminate_at_step,
                    "nan_final_obs": nan_final_obs,
                }
            )
        self.dim, self.dict_obs, self.success_radius = int(dim), bool(dict_obs), float(success_radius)
        self.pixels = bool(pixels)
        self.nan_obs_at_step, self.raise_at_step = nan_obs_at_step, raise_at_step
        self.terminate_at_step, self.nan_final_obs = terminate_at_step, bool(nan_final_obs)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (self.dim,), np.float32)
        box = gym.spaces.Box(-np.inf, np.inf, (self.dim,), np.float32)
        self.observation_space = (
            gym.spaces.Dict({"position": box, "offset": box})
            if self.dict_obs
            else gym.spaces.Box(-np.inf, np.inf, (2 * self.dim,), np.float32)
        )
        if self.pixels:
            image = gym.spaces.Box(0, 255, (3, PIXELS, PIXELS), np.uint8)
            self.observation_space = gym.spaces.Dict({"position": box, "pixels": image})
        self.steps_taken = 0  # over the env's life, for nan_obs_at_step / raise_at_step

    def _obs(self, nan: bool = False):
        position = self.position.astype(np.float32)
        offset = (self.target - self.position).astype(np.float32)
        if nan:
            position, offset = np.full_like(position, np.nan), np.full_like(offset, np.nan)
        if self.pixels:
            image = np.zeros((3, PIXELS, PIXELS), np.uint8)
            for channel, (x, y) in ((0, self.position[:2]), (1, self.target[:2])):
                col, row = (int(np.clip((v + 1) / 2 * PIXELS, 0, PIXELS - 1)) for v in (x, y))
                image[channel, max(row - 2, 0) : row + 3, max(col - 2, 0) : col + 3] = 255
            return {"position": position, "pixels": image}
        return {"position": position, "offset": offset} if self.dict_obs else np.concatenate([position, offset])

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.position, self.episode_steps = np.zeros(self.dim), 0
        self.target = self.np_random.uniform(-0.5, 0.5, self.dim)
        return self._obs(), {}

    def step(self, action):
        self.steps_taken += 1
        self.episode_steps += 1
        if self.raise_at_step is not None and self.steps_taken == self.raise_at_step:
            raise RuntimeError(f"PointReach: raise_at_step={self.raise_at_step} reached")
        action = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        self.position = np.clip(self.position + 0.1 * action, -1.0, 1.0)
        distance = float(np.linalg.norm(self.target - self.position))
        success = distance < self.success_radius
        terminated = success or (self.terminate_at_step is not None and self.episode_steps >= self.terminate_at_step)
        nan = (self.nan_obs_at_step is not None and self.steps_taken == self.nan_obs_at_step) or (
            self.nan_final_obs and terminated
        )
        return self._obs(nan), -distance, terminated, False, {"success": success}


for _id, _kwargs in zip(ENV_IDS, ({}, {"dict_obs": True}, {"pixels": True})):
    if _id not in gym.registry:  # importing twice (or reloading) must not re-register
        gym.register(_id, entry_point=PointReach, max_episode_steps=50, kwargs=_kwargs)


def spaces(obs_dim: int, act_dim: int) -> tuple[gym.spaces.Box, gym.spaces.Box]:
    """Observation and action Boxes of these sizes, for building a trainer's Agent directly."""
    return gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32), gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)


def random_actions(shape, seed: int) -> torch.Tensor:
    """Uniform actions in [-1, 1] of ``shape`` from their own seeded generator."""
    return 2 * torch.rand(shape, generator=torch.Generator().manual_seed(seed)) - 1
