"""The document bootstrap every evaluation interval uses: whole groups (documents, sentences) resampled with
replacement, the statistic the pooled mean. A leaf: the intrinsic metrics, span filling and the untrained control
all draw their intervals here (``default_rng(seed)``, so a figure is the same in every process).
"""
from __future__ import annotations

import numpy as np

BOOTSTRAP_SAMPLES = 2000


def bootstrap_ci(groups: np.ndarray, values: np.ndarray, seed: int = 0, n_boot: int = BOOTSTRAP_SAMPLES,
                 level: float = 0.95) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of the mean of ``values`` (one per masked position), resampling whole
    groups (documents) with replacement: positions of one document are not independent draws.

    Each replicate draws G groups uniformly with replacement (G = number of groups) and takes
    sum(values) / count over the drawn positions; the interval is the (1-level)/2 and (1+level)/2 quantiles
    (numpy's default linear interpolation) of ``n_boot`` replicates drawn from ``default_rng(seed)`` as
    ``integers(0, G, size=(n_boot, G))``. Vectorized through per-group sums, in blocks of replicates."""
    if len(values) == 0:
        return None, None
    q = np.quantile(bootstrap_replicates(groups, values, seed, n_boot), [(1 - level) / 2, (1 + level) / 2])
    return float(q[0]), float(q[1])


def bootstrap_replicates(groups: np.ndarray, values: np.ndarray, seed: int = 0,
                         n_boot: int = BOOTSTRAP_SAMPLES) -> np.ndarray:
    """The ``n_boot`` replicate statistics behind ``bootstrap_ci`` (same draws, same order)."""
    groups = np.asarray(groups, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    _, g = np.unique(groups, return_inverse=True)
    G = int(g.max()) + 1
    sums, counts = np.bincount(g, weights=values, minlength=G), np.bincount(g, minlength=G).astype(np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, G, size=(n_boot, G))
    stats = np.empty(n_boot)
    block = max(1, 4_000_000 // G)                   # bounded temporaries: ~32 MB of float64 per block
    for i in range(0, n_boot, block):
        d = draws[i: i + block]
        stats[i: i + block] = sums[d].sum(1) / counts[d].sum(1)
    return stats


__all__ = ["BOOTSTRAP_SAMPLES", "bootstrap_ci", "bootstrap_replicates"]
