"""A tiny numpy Gymnasium env for tests that need an env to misbehave on cue. Importing this module
registers ``ToyReach-v0``; every trainer then takes ``--env-id ToyReach-v0`` like any Gymnasium id.

ToyReach: a point in [-1, 1]^2 moves by 0.1 * action toward a fixed goal; reward = -distance; success
when within 0.1; ``max_episode_steps`` = 10 (truncation). Keyword arguments that inject faults:

- ``nan_obs_at_step=k``: the observation returned by the k-th ``step`` of every sub-env is NaN;
- ``nan_final_obs=True``: the observation returned when an episode ends (its final obs) is NaN;
- ``terminate_at_step=k``: episodes terminate (a true end) at their k-th step;
- ``raise_at_step=k``: the k-th ``step`` of every sub-env raises ValueError (a simulator crash);
- ``record=True``: append the constructor's keyword arguments to ``CONSTRUCTED`` (which envs got what).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

CONSTRUCTED: list[dict] = []


class ToyReach(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, nan_obs_at_step: int | None = None, nan_final_obs: bool = False,
                 terminate_at_step: int | None = None, raise_at_step: int | None = None, record: bool = False,
                 **kwargs):
        if record:
            CONSTRUCTED.append({"nan_obs_at_step": nan_obs_at_step, "nan_final_obs": nan_final_obs,
                                "terminate_at_step": terminate_at_step, **kwargs})
        self.nan_obs_at_step, self.nan_final_obs, self.terminate_at_step, self.raise_at_step = (
            nan_obs_at_step, nan_final_obs, terminate_at_step, raise_at_step)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.goal = np.array([0.5, -0.5])
        self.total_steps, self.episode_steps = 0, 0

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.pos, self.goal - self.pos]).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.episode_steps = self.np_random.uniform(-1, 1, 2), 0
        return self._obs(), {}

    def step(self, action):
        self.total_steps += 1
        self.episode_steps += 1
        if self.total_steps == self.raise_at_step:
            raise ValueError(f"simulated simulator crash at step {self.total_steps}")
        self.pos = np.clip(self.pos + 0.1 * np.clip(action, -1, 1), -1, 1)
        dist = float(np.linalg.norm(self.goal - self.pos))
        terminated = self.terminate_at_step is not None and self.episode_steps >= self.terminate_at_step
        obs = self._obs()
        if self.total_steps == self.nan_obs_at_step or (self.nan_final_obs and terminated):
            obs = np.full_like(obs, np.nan)
        return obs, -dist, terminated, False, {"success": dist < 0.1}


if "ToyReach-v0" not in gym.registry:
    gym.register("ToyReach-v0", entry_point=ToyReach, max_episode_steps=10)
