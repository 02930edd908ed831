"""Statistics of a sweep report: mean ± sample std over seeds, and a paired difference against the baseline
variant with a bootstrap percentile interval.

* std is the sample standard deviation (ddof = 1); one seed has no std (None).
* The paired difference pairs runs by seed: d_s = variant(s) - baseline(s) for the seeds both have. Its
  interval is the bootstrap percentile interval (Efron & Tibshirani, 1993, ch. 13): ``n_resamples`` = 10000
  resamples of the d_s with replacement (``numpy.random.default_rng(seed)``, seed 0 by default, so a report
  rebuilt from the same outputs prints the same interval), the mean of each, and the 2.5th / 97.5th percentiles
  (numpy's default linear interpolation) of those means.
* With few seeds the interval is coarse: with 3 seeds every resample mean lies between the smallest and largest
  d_s, and the percentile interval is exactly [min d_s, max d_s] (each extreme's resample has probability
  1/27 > 2.5%). It says how far the seeds disagree, not a population interval; the report says so.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

N_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
LEVEL = 0.95


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float | None
    std: float | None           # sample std (ddof=1); None with fewer than 2 values

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PairedDiff:
    n: int                      # seeds present in both the variant and the baseline
    mean: float | None          # mean of the paired differences (variant - baseline)
    ci_low: float | None
    ci_high: float | None
    seeds: tuple                # the paired seeds

    def as_dict(self) -> dict:
        return asdict(self) | {"seeds": list(self.seeds)}


def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def summarize(values) -> Summary:
    """Mean and sample std (ddof=1) of the finite values (None / NaN are left out: missing runs)."""
    v = _finite(values)
    if not v:
        return Summary(0, None, None)
    a = np.asarray(v, dtype=np.float64)
    return Summary(len(v), float(a.mean()), float(a.std(ddof=1)) if len(v) > 1 else None)


def bootstrap_ci(diffs, n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                 level: float = LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``diffs`` (module docstring)."""
    d = np.asarray(_finite(diffs), dtype=np.float64)
    if d.size == 0:
        raise ValueError("bootstrap_ci: no values")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(n_resamples, d.size))
    means = d[idx].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.percentile(means, [100 * alpha, 100 * (1 - alpha)])
    return float(lo), float(hi)


def paired_difference(variant: dict, baseline: dict, n_resamples: int = N_RESAMPLES,
                      seed: int = BOOTSTRAP_SEED, level: float = LEVEL) -> PairedDiff:
    """variant, baseline: {seed: value or None}. Differences variant - baseline on the seeds both have."""
    seeds = tuple(sorted(s for s in variant if s in baseline
                         and _finite([variant[s]]) and _finite([baseline[s]])))
    if not seeds:
        return PairedDiff(0, None, None, None, ())
    d = [float(variant[s]) - float(baseline[s]) for s in seeds]
    lo, hi = bootstrap_ci(d, n_resamples, seed, level)
    return PairedDiff(len(d), float(np.mean(d)), lo, hi, seeds)


__all__ = ["Summary", "PairedDiff", "summarize", "bootstrap_ci", "paired_difference", "N_RESAMPLES",
           "BOOTSTRAP_SEED", "LEVEL"]
