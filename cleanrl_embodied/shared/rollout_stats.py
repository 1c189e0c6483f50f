"""What the envs report during a rollout, summed on the device without host syncs (``RolloutStats``): the finished
episodes' return, length and success, per task, and the reward terms, for the ``charts/*`` and ``rewards/*``
scalars of an iteration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["RolloutStats"]


# ---------------------------------------------------------------------------------------------
# Rollout statistics
# ---------------------------------------------------------------------------------------------
class RolloutStats:
    """What the envs report during a rollout, summed on the device without host syncs: the finished
    episodes' return, length and success (``info["episode"]``), per task where the env has several, and the
    reward terms (``info["rewards"]``).

    After every env step call ``add_reward_terms(info)`` (nothing to do for envs without terms) and, at
    least at the steps where an episode ended, ``add_episodes(info)`` (``counted`` restricts which finished
    episodes count; at a step where none ended it adds zeros, so a trainer on the CPU may skip it then).
    ``scalars()`` once at the end gives ``charts/episodic_return``, ``charts/episodic_length``,
    ``charts/success_rate`` (envs with a success signal only) when an episode finished,
    ``charts/success_rate/<task>`` for each of ``task_names`` (an env's ``metadata["task_names"]``; its episodes
    carry ``episode["task_id"]``) that finished an episode, and ``rewards/<term>`` (mean per env step) when the env
    reports terms. ``sums`` is one flat tensor, so a data-parallel trainer can all-reduce it before ``scalars()``.
    """

    task_names: tuple[str, ...] = ()  # (class defaults: objects saved before tasks existed lack them)
    _task_ids = None

    def __init__(self, device: torch.device | str, task_names: tuple[str, ...] | None = None):
        self.task_names = tuple(task_names or ())
        # episodes, return, length, success; episodes and successes per task; then one per reward term
        self.sums = torch.zeros(4 + 2 * len(self.task_names), device=device)
        self._task_ids = torch.arange(len(self.task_names), device=device)
        self.terms: list[str] = []
        self.has_success = False
        self.env_steps = 0

    def add_episodes(self, info: Mapping[str, Any], counted: torch.Tensor | None = None) -> None:
        ended, ep = (info["_episode"] if counted is None else counted), info["episode"]
        values = torch.stack([torch.ones_like(ep["r"]), ep["r"], ep["l"].float(), ep["success"].float()])
        self.sums[:4] += torch.where(ended, values, 0.0).sum(-1)
        self.has_success = self.has_success or "success" in info
        if self.task_names and "task_id" in ep:
            mine = ended.unsqueeze(-1) & (ep["task_id"].unsqueeze(-1) == self._task_ids)  # [N, tasks]
            success = torch.where(mine, ep["success"].float().unsqueeze(-1), 0.0)
            self.sums[4 : 4 + 2 * len(self.task_names)] += torch.cat([mine.float().sum(0), success.sum(0)])

    def add_reward_terms(self, info: Mapping[str, Any], steps: torch.Tensor | None = None) -> None:
        """``steps``: [N] env steps each env ran for these terms (an action chunk's executed steps, whose terms
        ``step_chunk`` sums); default one each. ``rewards/<term>`` stays a mean per env step either way."""
        rewards = info.get("rewards")
        if not rewards:
            return
        first = 4 + 2 * len(self.task_names)
        if not self.terms:
            self.terms = list(rewards)
            self.sums = torch.cat([self.sums, self.sums.new_zeros(len(self.terms))])
        self.sums[first:] += torch.stack([rewards[k].float().sum() for k in self.terms])
        self.env_steps = self.env_steps + (next(iter(rewards.values())).numel() if steps is None else steps.sum())

    def scalars(self) -> dict[str, torch.Tensor]:
        """CleanRL-named means (tensors: RunLogger.log fetches them with one transfer). One host sync (two with
        tasks)."""
        out: dict[str, torch.Tensor] = {}
        if float(self.sums[0]) > 0:
            n = self.sums[0]
            out.update({"charts/episodic_return": self.sums[1] / n, "charts/episodic_length": self.sums[2] / n})
            if self.has_success:  # envs without a success signal (e.g. MuJoCo locomotion) log none
                out["charts/success_rate"] = self.sums[3] / n
                tasks = len(self.task_names)
                episodes, successes = self.sums[4 : 4 + tasks], self.sums[4 + tasks : 4 + 2 * tasks]
                for i, finished in enumerate(episodes.tolist()):
                    if finished > 0:
                        out[f"charts/success_rate/{self.task_names[i]}"] = successes[i] / finished
        first = 4 + 2 * len(self.task_names)
        env_steps = torch.as_tensor(self.env_steps, dtype=self.sums.dtype, device=self.sums.device).clamp_min(1)
        out.update({f"rewards/{k}": self.sums[first + i] / env_steps for i, k in enumerate(self.terms)})
        return out


# ppo_vla_async checkpoints hold the pending rollouts' stats; those written before it moved out of logging.py name the
# class by its old path
torch.serialization.add_safe_globals([RolloutStats, (RolloutStats, "cleanrl_embodied.shared.logging.RolloutStats")])
