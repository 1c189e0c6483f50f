"""The learning-rate schedule across a resume: a run resumed with another ``--total-timesteps`` follows the schedule of
a run planned with the new total, and says so (``note_schedule_change``)."""

from __future__ import annotations

__all__ = ["note_schedule_change"]


def note_schedule_change(
    ckpt: dict, start_iteration: int, num_iterations: int, learning_rate: float, anneal: bool, say
) -> None:
    """The learning rate anneals (``anneal``, --anneal-lr) linearly from ``learning_rate`` at iteration 1 to 0 after
    ``num_iterations``, resumed or not. A resume with another number of iterations (another ``--total-timesteps``,
    e.g. to train longer) thus follows the schedule of a run planned with the new total; ``say`` announces it with
    the learning rate of ``start_iteration`` (the iteration the trainer goes on at: after a resume in another world
    size, where its env steps are, not the checkpoint's iteration + 1) and the one the checkpoint's run would have
    used next (continuing the old schedule would leave a finished run at 0). Nothing is said when the two are the
    same (e.g. the same total in another world size)."""
    done, old_total = ckpt["iteration"], ckpt["num_iterations"]
    if not anneal or (start_iteration - 1) * old_total == done * num_iterations:  # (the same fraction of the plan)
        return
    new_lr = learning_rate * max(1.0 - (start_iteration - 1) / num_iterations, 0.0)
    old_lr = learning_rate * max(1.0 - done / old_total, 0.0)
    say(
        f"this run has {num_iterations} iterations, the checkpoint's run {old_total}: the learning rate follows "
        f"the {num_iterations}-iteration schedule, {new_lr:.3g} at iteration {start_iteration} "
        f"(the old schedule had {old_lr:.3g})"
    )
