"""Test envs with language: a Gymnasium env whose observation holds a ``Text`` instruction, and a tiny torch vector
env whose steps are known exactly, for action chunks. Importing the module registers the Gymnasium id, so tests use
``make_env("tests.instructed_envs:PointReachText-v0", ...)``.

``PointReachText-v0`` (:class:`PointReachText`): a point starts at the origin of the plane and must reach one of four
targets, (0.5, 0), (0, 0.5), (-0.5, 0), (0, -0.5), named by the instruction ``"reach east"``, ``"reach north"``,
``"reach west"``, ``"reach south"`` (drawn at reset). The observation is ``{"position": float32 [2], "instruction":
Text}``: the target is known from the words alone. Reward ``-distance``; success (and termination) within 0.1 of the
target; truncation after 20 steps.

:class:`CountingVecEnv`: N envs whose episodes count steps. The observation is ``[step in episode, episode index]``
(float32), the reward of the k-th step of an episode is ``k`` (1, 2, 3, ...), env i's episodes terminate at their
``terminate_at[i]``-th step (0: never) and are truncated at ``max_steps``. Every action an env gets is recorded with
its episode index in ``received[i]``, so a test sees which episode each action of a chunk went to.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from cleanrl_embodied.shared.envs.wrappers import EpisodeStatistics

TARGETS = {"reach east": (0.5, 0.0), "reach north": (0.0, 0.5), "reach west": (-0.5, 0.0), "reach south": (0.0, -0.5)}


class PointReachText(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self):
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict(
            {
                "position": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
                "instruction": gym.spaces.Text(16, charset="abcdefghijklmnopqrstuvwxyz "),
            }
        )

    def _obs(self):
        return {"position": self.position.astype(np.float32), "instruction": self.instruction}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.instruction = list(TARGETS)[int(self.np_random.integers(len(TARGETS)))]
        self.position, self.steps = np.zeros(2), 0
        return self._obs(), {}

    def step(self, action):
        self.steps += 1
        self.position = np.clip(self.position + 0.1 * np.clip(action, -1, 1), -1, 1)
        distance = float(np.linalg.norm(np.asarray(TARGETS[self.instruction]) - self.position))
        success = distance < 0.1
        return self._obs(), -distance, success, self.steps >= 20, {"success": success}


if "PointReachText-v0" not in gym.registry:
    gym.register("PointReachText-v0", entry_point=PointReachText, max_episode_steps=None)


class CountingVecEnv(VectorEnv):
    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
    partial_reset = True

    def __init__(self, terminate_at: list[int], max_steps: int, act_dim: int = 1):
        self.num_envs, self.max_steps = len(terminate_at), max_steps
        self.terminate_at = torch.tensor(terminate_at)
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.step_in_episode = torch.zeros(self.num_envs)
        self.episode = torch.zeros(self.num_envs)
        self.received: list[list[tuple[int, float]]] = [[] for _ in range(self.num_envs)]

    def _obs(self) -> torch.Tensor:
        return torch.stack([self.step_in_episode, self.episode], -1)

    def reset(self, *, seed=None, options=None):
        mask = (options or {}).get("reset_mask")
        if mask is None:  # a full reset starts every env's count afresh: episode 0
            self.step_in_episode, self.episode = torch.zeros(self.num_envs), torch.zeros(self.num_envs)
        else:  # a partial reset starts the next episode of the envs in the mask
            mask = torch.as_tensor(mask)
            self.step_in_episode = torch.where(mask, 0.0, self.step_in_episode)
            self.episode = torch.where(mask, self.episode + 1, self.episode)
        return self._obs(), {}

    def step(self, actions):
        for i in range(self.num_envs):
            self.received[i].append((int(self.episode[i]), float(actions[i, 0])))
        self.step_in_episode = self.step_in_episode + 1
        reward = self.step_in_episode.clone()
        terminated = (self.terminate_at > 0) & (self.step_in_episode == self.terminate_at)
        truncated = ~terminated & (self.step_in_episode >= self.max_steps)
        done = terminated | truncated
        final_obs = self._obs()
        self.step_in_episode = torch.where(done, 0.0, self.step_in_episode)
        self.episode = torch.where(done, self.episode + 1, self.episode)
        info = {"final_obs": final_obs, "_final_obs": done, "rewards": {"count": reward.clone()}}
        return self._obs(), reward, terminated, truncated, info


def counting_env(terminate_at: list[int], max_steps: int) -> EpisodeStatistics:
    return EpisodeStatistics(CountingVecEnv(terminate_at, max_steps))
