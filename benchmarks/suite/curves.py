"""The suite's reading of a run's curves, its number formats and its plots, shared with the drivers that report
curves like it (experiments/pomdp.py): which metric judges a task, a run's curves with their loop times, the
"steps to threshold" format, mean curves over seeds with a bootstrap band."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.common import read_scalars
from benchmarks.suite import rlstats

TASKS = {  # the eval metric a task is judged by, and the threshold of "steps / time to threshold"
    "PushCubeRL": ("success_rate", 0.9),
    "PushCubeLangRL": ("worst_task_success_rate", 0.9),  # every task (instruction) at 0.9 or more
    "Pendulum-v1": ("episodic_return", -200.0),
    "HalfCheetah-v5": ("episodic_return", 1000.0),
    "Pusher-v5": ("episodic_return", -50.0),
}
DEFAULT_TASK = ("episodic_return", None)  # other tasks: judged by return, no threshold

CURVE_TAGS = ("eval/success_rate", "eval/episodic_return", "charts/success_rate", "charts/episodic_return")


def env_id(task: str) -> str:
    """The env id of a task: ``PushCubeRL@rgb`` -> ``PushCubeRL``."""
    return task.partition("@")[0]


def task_metric(task: str) -> tuple[str, float | None]:
    return TASKS.get(env_id(task), DEFAULT_TASK)


def read_curves(run_dir: Path) -> dict[str, dict[str, list[float]]]:
    """The curve scalars with the loop time of every point: global_step / SPS at that step."""
    scalars = read_scalars(run_dir)
    sps_steps, sps = (np.asarray(v, dtype=np.float64) for v in scalars.get("charts/SPS", ([], [])))
    curves = {}
    per_task = [tag for tag in scalars if tag.startswith("eval/success_rate/")]
    if per_task:  # multi-task envs: the worst task's eval success at each evaluation
        steps = scalars[per_task[0]][0]
        values = np.min([np.asarray(scalars[tag][1], dtype=np.float64) for tag in per_task], axis=0)
        scalars["eval/worst_task_success_rate"] = (steps, values.tolist())
    for tag in (*CURVE_TAGS, "eval/worst_task_success_rate", *per_task):
        if tag not in scalars:
            continue
        steps, values = scalars[tag]
        elapsed = (
            np.interp(steps, sps_steps, sps_steps / np.maximum(sps, 1e-9)) if len(sps) else np.full(len(steps), np.nan)
        )
        curves[tag] = {
            "step": list(steps),
            "value": [float(v) for v in values],
            "time_s": [round(float(t), 3) for t in elapsed],
        }
    return curves


def fmt_hits(hits: list[float | None], unit: str, scale: float = 1.0) -> str:
    reached = [h / scale for h in hits if h is not None]
    if not reached:
        return f"not reached (0/{len(hits)})"
    digits = 0 if unit == "k" else 1
    m, s = rlstats.mean_std(reached)
    return f"{m:.{digits}f}{unit} ± {s:.{digits}f}{unit} ({len(reached)}/{len(hits)})"


def plot_groups(groups: dict[str, list], colors: dict[str, str], title: str, path: Path) -> None:
    """Mean over seeds with a 95% bootstrap band, against env steps and against wall time, a line per group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    metric, threshold = task_metric(title.split(",")[0])
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for label, curves in groups.items():
        curves = [c for c in curves if c and c["step"]]
        if not curves:
            continue
        for ax, xkey in zip(axes, ("step", "time_s")):
            grid, values = rlstats.align_curves([c[xkey] for c in curves], [c["value"] for c in curves])
            if grid.size == 0:
                continue
            mean, low, high = rlstats.bootstrap_band(values)
            (line,) = ax.plot(grid, mean, color=colors.get(label), label=f"{label} ({len(curves)} seeds)")
            ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.25, linewidth=0)
    axes[0].xaxis.set_major_formatter(EngFormatter())
    for ax, xlabel in zip(axes, ("env steps", "wall time (s, training loop)")):
        if threshold is not None:
            ax.axhline(threshold, color="gray", linestyle=":", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"eval {metric.replace('_', ' ')}")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize=8)
    fig.suptitle(f"{title}: eval {metric.replace('_', ' ')}, mean over seeds with 95% bootstrap band", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
