"""Action chunks, env side: run one decision of K actions on an env of the contract (``--action-chunk K`` in the
VLA trainers).

:func:`step_chunk` runs ``actions[:, 0]``, ..., ``actions[:, K - 1]`` and reports what happened at each step; it does
no reward arithmetic: how a chunk's rewards are discounted into one decision's reward is the trainer's business (it
is written in the VLA trainers' rollouts). An env whose episode ends inside a chunk stops there: its remaining
actions belong to an episode that is over and are never applied to the next one. (A vector env steps all its envs
together, so that env runs them in a throwaway continuation, which is then discarded: at the end of the chunk it is
reset with ``reset(options={"reset_mask": ...})``, Gymnasium's partial reset, and its next decision starts from a
fresh episode.) Needs envs that can reset a subset of their envs: PushCubeRL and Gymnasium ids.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import VectorEnv, VectorWrapper
from tensordict import TensorDict

__all__ = ["chunk_space", "step_chunk", "supports_partial_reset"]


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


def chunk_space(space: gym.spaces.Box, chunk: int) -> gym.spaces.Box:
    """The action space of a decision of ``chunk`` actions of ``space``: its Box repeated, shape ``(chunk, *shape)``."""
    low = np.broadcast_to(space.low, (chunk, *space.shape))
    high = np.broadcast_to(space.high, (chunk, *space.shape))
    return gym.spaces.Box(low, high, dtype=space.dtype)


def step_chunk(envs: VectorEnv, actions: torch.Tensor, frames: list | None = None):
    """Run the decision ``actions`` [N, K, D]: ``envs.step(actions[:, k])`` for k = 0 .. K-1.

    Returns ``(obs, rewards, executed, terminated, truncated, info)``:

    - ``rewards`` [K, N]: each step's reward as the env gave it (no discounting);
    - ``executed`` [K, N] bool: the decision still ran at step k (its episode had not ended before k); where it is
      False, the reward belongs to a throwaway continuation and must be ignored;
    - ``terminated``, ``truncated``, ``info`` (``final_obs``, ``episode``, ``success``...): those of the step at
      which the episode ended inside the chunk, else of the last step; ``info["rewards"]`` (reward terms, where
      the env gives them) are summed over the executed steps;
    - ``obs``: what the next decision sees (a fresh episode's first observation where the episode ended).

    With ``frames`` a list, ``envs.render()`` is appended after every step (videos show every env step)."""
    num_steps = actions.shape[1]
    obs, reward, terminated, truncated, info = envs.step(actions[:, 0])
    if frames is not None:
        frames.append(envs.render())
    rewards = torch.zeros((num_steps, *reward.shape), dtype=torch.float32, device=reward.device)
    executed = torch.zeros((num_steps, *reward.shape), dtype=torch.bool, device=reward.device)
    rewards[0], executed[0], info = reward, True, dict(info)
    ended = terminated | truncated  # the decision's episode has ended (at this step or before)
    restart = ended  # ended before the chunk's last step: ran on in a throwaway continuation
    for k in range(1, num_steps):
        running = ~ended
        obs, rewards[k], step_terminated, step_truncated, step_info = envs.step(actions[:, k])
        if frames is not None:
            frames.append(envs.render())
        executed[k] = running
        terms = step_info.pop("rewards", None)
        if terms is not None:
            info["rewards"] = {
                key: info["rewards"][key] + torch.where(running, value, 0.0) for key, value in terms.items()
            }
        info = _last_executed(step_info, info, running)
        terminated = torch.where(running, step_terminated, terminated)
        truncated = torch.where(running, step_truncated, truncated)
        ended = ended | step_terminated | step_truncated
        if k < num_steps - 1:
            restart = ended
    if num_steps > 1:  # envs whose episode ended before the last step start their next episode from a fresh reset
        fresh, _ = envs.reset(options={"reset_mask": restart})
        obs = (
            torch.where(restart, fresh, obs)
            if isinstance(obs, TensorDict)
            else torch.where(restart.view(-1, *([1] * (obs.dim() - 1))), fresh, obs)
        )
    return obs, rewards, executed, terminated, truncated, info
