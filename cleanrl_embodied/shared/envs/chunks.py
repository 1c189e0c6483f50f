"""Action chunks: one policy decision holds K actions that the env runs one after the other (``--action-chunk K``).

:class:`ActionChunks` turns an env of the contract into one whose step is a *decision*: ``step(actions)`` takes
``[N, K, D]`` and runs ``actions[:, 0]``, ..., ``actions[:, K - 1]``. Seen from the trainer it is again an env of the
contract (a semi-MDP): one step per decision, with

- ``reward``: the discounted sum of the rewards of the steps the decision executed, ``sum_j gamma^j r_j``;
- ``info["discount"]``: ``gamma^k`` for the k steps it executed, what bootstrapping multiplies V(next) by;
- ``terminated`` / ``truncated`` / ``info["final_obs"]`` / ``info["episode"]``: those of the episode's end, where
  it ended inside the chunk.

An env whose episode ends inside a chunk stops there: its remaining actions belong to an episode that is over and
are never applied to the next one. (A vector env steps all its envs together, so that env runs them in a throwaway
continuation, which is then discarded: at the end of the chunk it is reset with ``reset(options={"reset_mask":
...})``, Gymnasium's partial reset, and its next decision starts from a fresh episode.) Every other info entry is
that of the last step the decision executed (``info["rewards"]``: discounted sums, so they still add up to the
reward). Needs envs that can reset a subset of their envs: PushCubeRL and Gymnasium ids.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space
from tensordict import TensorDict

__all__ = ["ActionChunks", "supports_partial_reset"]


def supports_partial_reset(env: VectorEnv) -> bool:
    """Whether ``env.reset(options={"reset_mask": mask})`` resets just the envs in ``mask``: the outermost layer of
    the wrapper stack whose class says so (a ``partial_reset`` class attribute) decides; wrappers that don't say
    pass the call on."""
    while True:
        flag = getattr(type(env), "partial_reset", None)
        if flag is not None:
            return bool(flag)
        if not isinstance(env, VectorWrapper):
            return False
        env = env.env


def _last_executed(new: Any, old: Any, running: torch.Tensor) -> Any:
    """Per env: ``new`` where ``running`` (the decision still ran at this step), else ``old``; dicts leaf by leaf,
    entries that are not per-env tensors as they come."""
    if isinstance(new, dict):
        merged = {key: _last_executed(value, old[key], running) if key in old else value for key, value in new.items()}
        return {**old, **merged}
    if isinstance(new, TensorDict):  # a [N] mask broadcasts over a TensorDict's rows
        return torch.where(running, new, old)
    if isinstance(new, torch.Tensor) and new.shape[:1] == running.shape and old.shape == new.shape:
        return torch.where(running.view(-1, *([1] * (new.dim() - 1))), new, old)
    return new


class ActionChunks(VectorWrapper):
    """Run chunks of ``chunk`` actions per step (see the module docstring); ``gamma`` discounts within a chunk.

    ``single_action_space`` becomes the env's Box repeated ``chunk`` times, shape ``(chunk, *shape)``. With
    ``record_frames`` set, ``step`` appends the ``render()`` of every step it executes to ``frames`` (so that the
    evaluator's videos show every env step, not one frame per decision).
    """

    def __init__(self, env: VectorEnv, chunk: int, gamma: float):
        super().__init__(env)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 2:
            raise ValueError(f"--action-chunk must be an integer >= 2 to chunk actions, got {chunk!r}")
        if not supports_partial_reset(env):
            raise ValueError(
                f"--action-chunk {chunk}: {type(env.unwrapped).__name__} cannot reset a subset of its envs, which "
                "chunks need (an episode that ends inside a chunk is restarted at the chunk's end); use PushCubeRL, "
                "PushCubeLangRL or a Gymnasium id with --env-vectorization sync or async"
            )
        space = env.single_action_space
        low = np.broadcast_to(space.low, (chunk, *space.shape))
        high = np.broadcast_to(space.high, (chunk, *space.shape))
        self.single_action_space = gym.spaces.Box(low, high, dtype=space.dtype)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.chunk, self.gamma = chunk, float(gamma)
        self.record_frames, self.frames = False, []

    def step(self, actions: torch.Tensor):
        obs, reward, terminated, truncated, info = self.env.step(actions[:, 0])
        self._record()
        info = dict(info)
        discount = torch.full_like(reward, self.gamma)  # gamma^(steps executed)
        ended = terminated | truncated  # the decision's episode has ended (at this step or before)
        restart = ended  # ended before the chunk's last step: ran on in a throwaway continuation
        for k in range(1, self.chunk):
            running = ~ended
            obs, step_reward, step_terminated, step_truncated, step_info = self.env.step(actions[:, k])
            self._record()
            reward = reward + torch.where(running, discount * step_reward, 0.0)
            terms = step_info.pop("rewards", None)
            if terms is not None:  # the reward terms stay discounted sums that add up to the reward
                info["rewards"] = {
                    key: info["rewards"][key] + torch.where(running, discount * value, 0.0)
                    for key, value in terms.items()
                }
            discount = torch.where(running, discount * self.gamma, discount)
            info = _last_executed(step_info, info, running)
            terminated = torch.where(running, step_terminated, terminated)
            truncated = torch.where(running, step_truncated, truncated)
            ended = ended | step_terminated | step_truncated
            if k < self.chunk - 1:
                restart = ended
        # Envs whose episode ended before the chunk's last step start their next episode now, from a fresh reset
        # (the others already hold theirs: SAME_STEP autoreset).
        fresh, _ = self.env.reset(options={"reset_mask": restart})
        obs = (
            torch.where(restart, fresh, obs)
            if isinstance(obs, TensorDict)
            else torch.where(restart.view(-1, *([1] * (obs.dim() - 1))), fresh, obs)
        )
        info["discount"] = discount
        return obs, reward, terminated, truncated, info

    def _record(self) -> None:
        if self.record_frames:
            self.frames.append(self.env.render())
