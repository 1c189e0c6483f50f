"""Aggregate statistics of RL runs over seeds: IQM, stratified bootstrap CIs, curve alignment.

numpy only. The interval estimates follow Agarwal et al., "Deep RL at the Edge of the Statistical
Precipice" (NeurIPS 2021), the method of the `rliable` package, written here in a few lines because
`rliable` pulls in pandas, seaborn, statsmodels and arch:

- scores form a matrix `[runs, tasks]` (one column per task, one row per seed);
- the IQM (interquartile mean) is the mean of the middle 50% of all runs x tasks scores: sort the
  flattened scores and drop `floor(0.25 * n)` from each end (as `scipy.stats.trim_mean(x, 0.25)`,
  which rliable calls; with fewer than 4 scores nothing is dropped and the IQM is the mean);
- the stratified bootstrap resamples the runs with replacement *within each task* (so every
  resample keeps every task with its number of runs), recomputes the statistic, and takes the
  2.5th and 97.5th percentiles of the resampled statistic as the 95% interval (percentile method).

Learning curves of different seeds are put on one x grid by linear interpolation (`align_curves`),
and the band around the mean curve is a plain bootstrap over seeds at each x (`bootstrap_band`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def iqm(scores: np.ndarray, axis: int | None = None) -> np.ndarray | float:
    """Interquartile mean: the mean after dropping floor(n/4) of the lowest and of the highest values.

    `axis=None` pools all values; an int reduces that axis only (used to vectorize the bootstrap).
    """
    x = np.asarray(scores, dtype=np.float64)
    if axis is None:
        x, axis = x.reshape(-1), 0
    x = np.sort(np.moveaxis(x, axis, -1), axis=-1)
    n = x.shape[-1]
    if n == 0:
        raise ValueError("iqm of an empty set of scores")
    cut = int(0.25 * n)
    return x[..., cut : n - cut].mean(axis=-1)


def mean(scores: np.ndarray, axis: int | None = None) -> np.ndarray | float:
    """Mean with the same signature as `iqm` (a statistic for `stratified_bootstrap_ci`)."""
    return np.asarray(scores, dtype=np.float64).mean(axis=axis)


def stratified_bootstrap_ci(
    scores: np.ndarray,
    statistic: Callable[..., np.ndarray] = iqm,
    reps: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Point estimate and percentile bootstrap interval of `statistic` over a `[runs, tasks]` matrix.

    A 1-d array is one task. Each of the `reps` resamples draws `runs` rows with replacement
    independently for every task column, then applies `statistic(resampled [reps, runs * tasks], axis=-1)`.
    Returns (estimate, low, high). With one run the interval collapses onto the estimate.
    """
    x = np.asarray(scores, dtype=np.float64)
    x = x[:, None] if x.ndim == 1 else x
    runs, tasks = x.shape
    if runs == 0:
        raise ValueError("no runs to aggregate")
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, runs, size=(reps, runs, tasks))
    resampled = np.take_along_axis(np.broadcast_to(x, (reps, runs, tasks)), rows, axis=1)
    stats = statistic(resampled.reshape(reps, runs * tasks), axis=-1)
    alpha = (1.0 - confidence) / 2
    low, high = np.quantile(stats, [alpha, 1.0 - alpha])
    return float(statistic(x.reshape(-1))), float(low), float(high)


def align_curves(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Put curves `(xs[i], ys[i])` of different seeds on one grid: `(grid, values [seeds, len(grid)])`.

    The grid is the union of all x values inside the range every curve covers (from the largest first
    x to the smallest last x), so curves logged at the same x are used exactly as they are, and others
    are interpolated linearly between their neighbouring points (never extrapolated).
    """
    if not xs:
        raise ValueError("no curves to align")
    curves = [(np.asarray(x, np.float64), np.asarray(y, np.float64)) for x, y in zip(xs, ys)]
    if any(len(x) == 0 for x, _ in curves):
        return np.zeros(0), np.zeros((len(curves), 0))
    for x, y in curves:
        if len(x) != len(y) or np.any(np.diff(x) < 0):
            raise ValueError("each curve needs as many x as y values, with x non-decreasing")
    lo, hi = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
    if lo > hi:  # no x covered by every curve
        return np.zeros(0), np.zeros((len(curves), 0))
    grid = np.unique(np.concatenate([x[(x >= lo) & (x <= hi)] for x, _ in curves]))
    return grid, np.stack([np.interp(grid, x, y) for x, y in curves])


def bootstrap_band(
    values: np.ndarray, reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over seeds of `values [seeds, points]` with a percentile bootstrap band (seeds resampled
    with replacement, the same resample at every point). Returns (mean, low, high), each `[points]`."""
    v = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, v.shape[0], size=(reps, v.shape[0]))
    means = v[rows].mean(axis=1)  # [reps, points]
    alpha = (1.0 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1.0 - alpha], axis=0)
    return v.mean(axis=0), low, high


def first_crossing(x: Sequence[float], y: Sequence[float], threshold: float) -> float | None:
    """The first x at which y >= threshold (no interpolation: the first logged point that reaches it), or None."""
    hits = np.flatnonzero(np.asarray(y, dtype=np.float64) >= threshold)
    return float(np.asarray(x)[hits[0]]) if hits.size else None


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0.0 for a single value)."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0
