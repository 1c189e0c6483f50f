"""The evaluation loop every trainer uses, given a policy callable.

``evaluate`` runs whole episodes on the eval envs and averages them; ``Evaluator`` adds what a run
needs around it: fresh, reproducible starts for every evaluation, videos, the ``eval/*`` scalars and
the record of the best evaluation so far (the trainer saves ``best.pt`` when it says so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from cleanrl_embodied.shared.cli import fail
from cleanrl_embodied.shared.envs.chunks import step_chunk
from cleanrl_embodied.shared.language import INSTRUCTION_KEY, decode_instructions
from cleanrl_embodied.shared.random_streams import stream_seed
from cleanrl_embodied.shared.run_logger import RunLogger

__all__ = ["Evaluator", "caption", "evaluate", "evaluation_seed"]

Act = Callable[[torch.Tensor | TensorDict, torch.Generator, torch.Tensor], torch.Tensor]
"""``act(obs, generator, starts)`` -> actions: ``starts`` (bool [N]) marks the envs whose ``obs`` begins an episode
(all of them after the reset, then those whose episode ended at the last step), where a policy with memory resets
its state; a memoryless policy ignores it."""


def evaluation_seed(seed: int, global_step: int) -> int:
    """The reset seed of the evaluation at ``global_step`` of the run with seed ``seed``: its own stream hashed
    from (seed, step) (``stream_seed(seed, "eval_resets", step)``), so every evaluation starts from fresh episodes,
    the same ones in a rerun or a resumed run, unrelated to the training envs' streams."""
    return stream_seed(seed, "eval_resets", global_step)


@torch.no_grad()
def evaluate(
    act: Act, env, num_episodes: int, seed: int, video_frames: list | None = None, max_decisions: int = 100_000
) -> dict[str, Any]:
    """Run ``num_episodes`` episodes (each of the N eval envs contributes its first ceil(num_episodes / N)
    completed ones) and average return, length, success and the env's ``info["metrics"]``.

    ``act(obs, generator, starts)`` returns the actions (``starts``: see :data:`Act`; a recurrent policy resets its
    memory there); sampling policies draw from ``generator``, seeded from ``seed``
    by its own stream (``stream_seed(seed, "eval_actions")``: not the env's ``seed`` itself, whose generator draws
    the starts), so evaluating never touches the training run's random streams. With ``video_frames`` a
    list, the first env's frames of its first episode are appended (``None`` where it can't render; every env
    step's frame with action chunks). ``success_rate`` is None for envs without a success signal; envs with
    several tasks (``metadata["task_names"]``) add ``success_rate/<task>`` over the episodes of each task, and
    envs whose observations hold an instruction report the first env's first one as ``instruction``.
    An evaluation whose episodes have not all ended after ``max_decisions`` steps (an env without a time limit)
    stops with one line instead of running forever.
    """
    obs, _ = env.reset(seed=seed)
    device = obs.device
    gen = torch.Generator(device=device).manual_seed(stream_seed(seed, "eval_actions"))
    n = env.num_envs
    per_env = -(-num_episodes // n)  # ceil
    task_names = tuple(env.metadata.get("task_names") or ())
    tasks = torch.arange(len(task_names), device=device)
    done_count = torch.zeros(n, dtype=torch.long, device=device)
    sums, metric_sums, has_success = torch.zeros(3, device=device), {}, False
    task_sums = torch.zeros(2, len(task_names), device=device)  # episodes and successes per task
    result_extra = {}
    if isinstance(obs, TensorDict) and INSTRUCTION_KEY in obs.keys():
        result_extra["instruction"] = decode_instructions(obs[INSTRUCTION_KEY][:1])[0]
    decisions, starts = 0, torch.ones(n, dtype=torch.bool, device=device)
    while bool((done_count < per_env).any()):
        if decisions == max_decisions:
            fail(
                f"evaluation: {int((done_count < per_env).sum())} of {n} eval envs did not finish their episodes "
                f"within {max_decisions} steps; give the env a time limit (e.g. --env-kwargs "
                "'{\"max_episode_steps\": 1000}', which the eval envs inherit)"
            )
        decisions += 1
        action, frames = act(obs, gen, starts), [] if video_frames is not None and int(done_count[0]) == 0 else None
        if action.dim() == 3:  # a chunk of K actions [N, K, D]: the env runs them one by one
            obs, _, _, terminated, truncated, info = step_chunk(env, action, frames)
        else:
            obs, _, terminated, truncated, info = env.step(action)
            if frames is not None:
                frames.append(env.render())
        starts = terminated | truncated  # these envs' obs is the first of a new episode (SAME_STEP autoreset)
        has_success = has_success or "success" in info
        for frame in frames or ():
            video_frames.append(frame[0] if isinstance(frame, (list, tuple)) else frame)
        counted = info["_episode"] & (done_count < per_env)
        ep = info["episode"]
        sums += torch.stack([torch.where(counted, ep[k].float(), 0.0).sum() for k in ("r", "l", "success")])
        if task_names and "task_id" in ep:
            mine = counted.unsqueeze(-1) & (ep["task_id"].unsqueeze(-1) == tasks)
            task_sums += torch.stack(
                [mine.float().sum(0), torch.where(mine, ep["success"].float()[:, None], 0.0).sum(0)]
            )
        for k, v in info.get("metrics", {}).items():
            metric_sums[k] = metric_sums.get(k, 0.0) + torch.where(counted, v.float(), 0.0).sum()
        done_count += info["_episode"].long()
    ret, length, success = (sums / (per_env * n)).tolist()
    result = {"episodic_return": ret, "episodic_length": length, "success_rate": success if has_success else None}
    result.update({k: float(v) / (per_env * n) for k, v in metric_sums.items()})
    if has_success:
        for name, (count, successes) in zip(task_names, task_sums.T.tolist()):
            result[f"success_rate/{name}"] = successes / count if count else None
    return {**result, **result_extra}


def caption(frames: np.ndarray, text: str) -> np.ndarray:
    """``frames`` (uint8 [T, H, W, 3]) with ``text`` written in a dark band above them (Pillow's built-in font)."""
    from PIL import Image, ImageDraw  # (Pillow comes with imageio, which writes the videos)

    band = 14
    out = np.zeros((frames.shape[0], frames.shape[1] + band, frames.shape[2], 3), dtype=np.uint8)
    out[:, band:] = frames
    label = Image.new("RGB", (frames.shape[2], band), (20, 20, 20))
    ImageDraw.Draw(label).text((3, 1), text, fill=(255, 255, 255))
    out[:, :band] = np.asarray(label)
    return out


class Evaluator:
    """Evaluations of one run: ``run(act, global_step)`` evaluates on fresh starts, logs ``eval/*``,
    writes a video if asked and returns ``(result, is_best)``; ``best_key`` (success rate, return) of the
    best evaluation so far is part of a checkpoint so a resumed run keeps comparing against it."""

    def __init__(self, env, logger: RunLogger, seed: int, num_episodes: int, capture_video: bool):
        self.env, self.logger, self.seed, self.num_episodes = env, logger, seed, num_episodes
        self.capture_video = capture_video
        self.best_key: tuple[float, float] = (-1.0, -float("inf"))

    def run(self, act: Act, global_step: int) -> tuple[dict[str, Any], bool]:
        frames = [] if self.capture_video else None
        result = evaluate(act, self.env, self.num_episodes, evaluation_seed(self.seed, global_step), frames)
        instruction = result.pop("instruction", None)
        result["global_step"] = global_step
        self.logger.log(
            {f"eval/{k}": v for k, v in result.items() if k != "global_step" and v is not None}, global_step
        )
        if frames is not None and (not frames or frames[0] is None):
            self.logger.write("warning: the eval env cannot render here; no video, training goes on")
            self.capture_video = False
        elif frames:
            frames = np.stack([np.asarray(f) for f in frames])
            if instruction is not None:  # the video shows what the policy was told
                frames = caption(frames, instruction)
                self.logger.write(f"video eval_{global_step}: {instruction!r}")
            self.logger.write_video(frames, f"eval_{global_step}", global_step)
        self.logger.last_eval = result
        key = (result["success_rate"] or 0.0, result["episodic_return"])
        is_best = key > self.best_key
        self.best_key = max(key, self.best_key)
        return result, is_best

    def run_checkpoint(self, act: Act, ckpt: dict, path: str) -> dict[str, Any]:
        """``--eval-checkpoint``: evaluate the saved policy, write summary.json, close the logger and env."""
        result, _ = self.run(act, ckpt["global_step"])
        self.logger.write(f"eval of {path}: {result}")
        self.logger.finish(global_step=ckpt["global_step"], wall_time_s=0.0, sps=0.0, eval=result, checkpoint=path)
        self.env.close()
        return {"run_dir": str(self.logger.run_dir), "eval": result, "global_step": ckpt["global_step"]}
