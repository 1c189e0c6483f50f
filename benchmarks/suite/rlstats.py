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

Student t intervals (`t_interval` over seeds, `welch` for a difference of two groups) use the exact
quantile of Student's t for any degrees of freedom, fractional ones included (`t_quantile`: bisection on
its distribution function, the regularized incomplete beta function by its continued fraction), the one
quantile every driver's interval takes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from statistics import NormalDist

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


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes' betacf)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        for aa in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):  # fmt: skip
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"the incomplete beta function's continued fraction did not converge (a={a}, b={b})")


def _stirling_tail(z: float) -> float:
    """lgamma(z) - ((z - 1/2) log z - z + log(2 pi) / 2), for z >= 100 (the series' next term is below 1e-18)."""
    return 1 / (12 * z) - 1 / (360 * z**3) + 1 / (1260 * z**5)


def _log_beta(a: float, b: float) -> float:
    """log B(a, b). With the larger argument above 100, lgamma(a + b) - lgamma(a) is taken from Stirling's series as
    a difference (two lgammas of 1e9 differ by what their rounding loses)."""
    small, big = min(a, b), max(a, b)
    if big < 100:
        return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    rise = (big - 0.5) * math.log1p(small / big) + small * math.log(big + small) - small
    return math.lgamma(small) - rise - _stirling_tail(big + small) + _stirling_tail(big)


def regularized_beta(a: float, b: float, x: float, y: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, with `y` = 1 - x given (no cancellation near x = 1)."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    log_x, log_y = (math.log(x), math.log1p(-x)) if x < 0.5 else (math.log1p(-y), math.log(y))
    front = math.exp(a * log_x + b * log_y - _log_beta(a, b))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, y) / b


def t_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom, t >= 0: I_{df/(df+t^2)}(df/2, 1/2) / 2."""
    return 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t), t * t / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The `p` quantile of Student's t with `df` > 0 degrees of freedom (any real df; infinity: the normal's), to
    about 1e-11: the t whose upper tail is 1 - p, found by bisection on `t_tail` (above 1e5 degrees of freedom,
    the normal quantile plus four terms of the expansion in 1/df, whose rest is below 1e-20).
    t_quantile(0.975, n - 1) is the 95% interval's multiplier of the standard error of a mean of n values."""
    if not 0.0 < p < 1.0 or not df > 0.0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if df > 1e5:  # the continued fraction needs ~sqrt(df) steps; Fisher's expansion in 1/df is exact to rounding here
        z = NormalDist().inv_cdf(p)
        terms = ((z**3 + z) / 4, (5 * z**5 + 16 * z**3 + 3 * z) / 96,
                 (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
                 (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160)  # fmt: skip
        return z + sum(g / df ** (i + 1) for i, g in enumerate(terms))  # Abramowitz & Stegun 26.7.5
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    tail = 1.0 - p
    if tail == 0.5:
        return 0.0
    lo, hi = 0.0, 2.0
    while t_tail(hi, df) > tail:
        lo, hi = hi, 2.0 * hi
    while True:
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            return hi
        lo, hi = (mid, hi) if t_tail(mid, df) > tail else (lo, mid)


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its `confidence` Student t interval: t(1 - alpha/2, n - 1) x std / sqrt(n)
    (ddof=1). One value: half-width 0.0."""
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        return float(v.mean()), 0.0
    t = t_quantile(0.5 + confidence / 2.0, v.size - 1)
    return float(v.mean()), float(t * v.std(ddof=1) / math.sqrt(v.size))


def welch(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """mean(b) - mean(a) and the half-width of its `confidence` Welch t interval (unequal variances; the
    Welch-Satterthwaite degrees of freedom as they are, fractional). Each group needs 2 values or more."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("welch needs at least 2 values in each group")
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    diff = float(np.mean(b) - np.mean(a))
    if va + vb == 0:
        return diff, 0.0
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return diff, float(t_quantile(0.5 + confidence / 2.0, df) * math.sqrt(va + vb))
