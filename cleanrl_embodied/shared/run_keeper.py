"""What every trainer does around its iterations, the same in all of them: evaluate and save when due, and end the
run (the last checkpoint, the final evaluation, summary.json). What a checkpoint holds stays in the trainer: it
passes its own ``save(name, *save_args) -> path``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cleanrl_embodied.shared.evaluation import Act, Evaluator


class RunKeeper:
    """Evaluations and checkpoints of one run, on thresholds of the iteration counter (so they survive resumes and
    sizes that do not divide the total), and the run's clock.

    - ``due(iteration)``: ``(evaluate, save)`` now; each moves its threshold on. The last iteration is never
      evaluated here: ``finish`` evaluates it.
    - ``after_iteration(iteration, global_step)``: ``due`` and what it asks for: an evaluation (a new best is saved
      as best.pt), last.pt and iter_<iteration>.pt. A distributed trainer calls ``due`` on every rank (the ranks
      gather what a checkpoint needs together) and ``evaluate_and_save`` on rank 0.
    - ``finish(global_step, stopped)``: last.pt, then (unless stopped) the final evaluation, best.pt and last.pt
      again if it is the best (last.pt holds the best key a resume compares against), then summary.json.
    """

    def __init__(
        self,
        evaluator: Evaluator | None,  # None on the ranks that do not evaluate (they only ask `due`)
        act: Act,
        save: Callable[..., str],
        eval_freq: int,
        save_freq: int,
        num_iterations: int,
        done_iterations: int,
        global_step: int,
    ):
        self.evaluator, self.act, self.save = evaluator, act, save
        self.eval_freq, self.save_freq, self.num_iterations = eval_freq, save_freq, num_iterations
        self.next_eval, self.next_save = done_iterations + eval_freq, done_iterations + save_freq
        self.start_time, self.start_step = time.time(), global_step
        self.checkpoint: str | None = None  # the newest last.pt

    def sps(self, global_step: int) -> float:
        """Env steps per second of this process's run so far (a resume counts from where it started)."""
        return (global_step - self.start_step) / max(time.time() - self.start_time, 1e-9)

    def due(self, iteration: int) -> tuple[bool, bool]:
        evaluate = bool(self.eval_freq) and self.next_eval <= iteration < self.num_iterations
        save = bool(self.save_freq) and iteration >= self.next_save
        if evaluate:
            self.next_eval = iteration + self.eval_freq
        if save:
            self.next_save = iteration + self.save_freq
        return evaluate, save

    def after_iteration(self, iteration: int, global_step: int, *save_args: Any) -> None:
        self.evaluate_and_save(iteration, global_step, *self.due(iteration), *save_args)

    def evaluate_and_save(self, iteration: int, global_step: int, evaluate: bool, save: bool, *save_args) -> None:
        if evaluate:
            _, is_best = self.evaluator.run(self.act, global_step)
            if is_best:
                self.save("best.pt", *save_args)
        if save:
            self.checkpoint = self.save("last.pt", *save_args)
            self.save(f"iter_{iteration:06d}.pt", *save_args)

    def finish(self, global_step: int, stopped: bool, *save_args: Any, **summary: Any) -> dict[str, Any] | None:
        """End the run; ``summary``: more entries for summary.json (e.g. world_size). Returns the last evaluation."""
        self.checkpoint = self.save("last.pt", *save_args)
        if not stopped:
            _, is_best = self.evaluator.run(self.act, global_step)
            if is_best:
                self.save("best.pt", *save_args)
                self.checkpoint = self.save("last.pt", *save_args)
        logger = self.evaluator.logger
        wall = time.time() - self.start_time
        logger.finish(global_step, wall, self.sps(global_step), logger.last_eval, self.checkpoint, **summary)
        return logger.last_eval
