"""What a run does with non-finite numbers, never silently: ``NonFiniteWatch`` stops it in one line naming the env
data (observation, final observation, reward), the envs and the step; ``SkipGuard`` skips an optimizer step whose
loss or gradient is not finite, counts it, and stops the run after too many in a row."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from cleanrl_embodied.shared.cli import fail
from cleanrl_embodied.shared.observations import finite_rows

__all__ = ["NonFiniteWatch", "SkipGuard"]


class SkipGuard:
    """Keeps non-finite optimizer steps out of the weights: ``ok`` says whether a step may be taken (one host sync),
    counts the ones it refuses (``skipped``) and stops the run with one line once ``max_consecutive`` come in a
    row (a run that keeps producing them has diverged). ``show``: whether this process prints that line."""

    def __init__(self, max_consecutive: int, show: bool = True):
        self.max_consecutive, self.show = max_consecutive, show
        self.skipped = self.consecutive = 0

    def ok(self, loss: torch.Tensor, grad_norm: torch.Tensor, global_step: int) -> bool:
        if bool(torch.isfinite(grad_norm) & torch.isfinite(loss)):
            self.consecutive = 0
            return True
        self.skipped, self.consecutive = self.skipped + 1, self.consecutive + 1
        if self.consecutive >= self.max_consecutive:
            fail(
                f"{self.consecutive} optimizer steps in a row had a non-finite loss or gradient (last at global "
                f"step {global_step}); lower --learning-rate or check the env",
                self.show,
            )
        return False


class NonFiniteWatch:
    """Remembers, on the device and without host syncs, the first rollout step at which each env produced a
    non-finite observation (a next obs or, where an episode ended, its final obs) or reward. Only float entries
    count (uint8 images are always finite). ``update_final`` runs at the steps where an episode ended,
    ``update_rollout`` once after the rollout over everything stored; then ``check`` stops the run with one
    line naming the tensor, the envs and the global step."""

    def __init__(self, num_envs: int, device: torch.device | str):
        self.first = torch.full((2, num_envs), -1, dtype=torch.long, device=device)  # observation, reward

    def _note(self, kind: int, step: torch.Tensor | int, bad: torch.Tensor) -> None:
        """Record ``step`` [N] (or one int) for the envs where ``bad`` [N], unless an earlier step is recorded."""
        first = self.first[kind]
        self.first[kind] = torch.where(bad & ((first < 0) | (first > step)), step, first)

    def update_final(self, step: int, final_obs: torch.Tensor | TensorDict, done: torch.Tensor) -> None:
        """The final observations of the envs whose episode ended (``done``) at rollout step ``step``."""
        self._note(0, step, done & ~finite_rows(final_obs))

    def update_rollout(
        self, obs: torch.Tensor | TensorDict, last_obs: torch.Tensor | TensorDict, rewards: torch.Tensor
    ) -> None:
        """After a rollout of T steps: ``obs`` [T, N, ...] as stored (``obs[t]`` is what action t saw, so
        ``obs[0]`` came before the rollout: step -1), ``last_obs`` the obs after the last step, ``rewards`` [T, N]."""
        steps = torch.arange(-1, rewards.shape[0], device=rewards.device)
        bad_obs = ~torch.cat([finite_rows(obs, batch_dims=2), finite_rows(last_obs)[None]])  # [T + 1, N]
        for kind, bad, at in ((0, bad_obs, steps), (1, ~torch.isfinite(rewards), steps[1:])):
            first_bad = torch.where(bad, at[:, None], rewards.shape[0]).min(0).values
            self._note(kind, first_bad, first_bad < rewards.shape[0])

    def seen(self) -> torch.Tensor:
        """[2] float: 1 where some env produced a non-finite observation / reward (for an all-reduce)."""
        return (self.first >= 0).any(-1).float()

    def check(self, global_step: int, steps_per_env_step: int, where: str = "") -> None:
        """``global_step`` counts the env steps before this rollout; ``steps_per_env_step`` is how many env
        steps one rollout step adds (num_envs, times the world size in DDP)."""
        for name, first in zip(("observation", "reward"), self.first):
            if bool((first >= 0).any()):
                envs = torch.nonzero(first >= 0).flatten()
                step = global_step + (int(first[envs].min()) + 1) * steps_per_env_step
                fail(f"non-finite {name} from {where}env(s) {envs[:8].tolist()} at global step {step}")


# ppo_vla_async checkpoints hold the pending rollouts' watches; those written before runtime.py became this module
# name the class by its old path
torch.serialization.add_safe_globals(
    [NonFiniteWatch, (NonFiniteWatch, "cleanrl_embodied.shared.runtime.NonFiniteWatch")]
)
