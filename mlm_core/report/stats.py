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

Issue 21 (the figures a verdict rests on):

* ``hierarchical_ci``: the interval of the paired difference with evaluation noise inside it. Every run of a
  contrast is scored on the same held-out documents (the shards are shared), so seeds and documents are
  *crossed*: each of ``n_resamples`` replicates draws the seeds with replacement (paired: a drawn seed brings
  the variant's and the baseline's run of that seed) and, independently, the documents of every stratum
  (language, or UPOS target) with replacement, the same document draw for every run; the replicate statistic
  is the mean over the drawn seeds of variant − baseline, each run's value recomputed on the drawn documents
  (per stratum sum(numerator) / sum(denominator), then the unweighted mean over strata: exactly how the stored
  metric is defined). The 2.5th / 97.5th percentiles of the replicates are the interval. Draws:
  ``default_rng(BOOTSTRAP_SEED)``, first the seeds ``integers(0, n, (B, n))``, then per stratum in sorted order
  the documents ``integers(0, G, (B, G))``. With one document per stratum it is the seed bootstrap above; with
  every seed's runs identical it is a plain document bootstrap. When some run has no per-document data, or
  the runs' documents differ (their per-document denominators are not identical), it falls back to the seeds
  alone (``mode`` says which).
* ``sign_flip_p``: the exact paired permutation test over seeds: all 2^n sign patterns of the n paired
  differences, two-sided p = #{patterns with |mean| >= |observed mean|} / 2^n (1e-12 relative slack for
  float ties). With n = 3 the smallest possible p is 2/8 = 0.25; with n = 6 it is 2/64 = 0.031.
* ``holm``: Holm's (1979) step-down adjusted p-values: sorted ascending, p_(i) x (m - i + 1), made
  monotone by a running maximum, capped at 1.
* ``verdict``: *supported* when the Holm-adjusted p < 0.05 and the interval lies entirely on the side of 0 the
  paper expects; *contradicted* when the same holds on the other side; otherwise *inconclusive*.
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


# ------------------------------------------------------------------------------------------ issue 21
ALPHA = 0.05
EXACT_MAX_N = 20            # 2^20 sign patterns; more pairs: Monte Carlo over MC_FLIPS random patterns
MC_FLIPS = 2 ** 16
VERDICTS = ("supported", "contradicted", "inconclusive")


@dataclass(frozen=True)
class DocData:
    """One run's held-out documents for one metric: {stratum: (numerator per document, denominator per
    document)}; the metric is the unweighted mean over strata of sum(numerator) / sum(denominator)."""
    strata: dict

    def value(self) -> float:
        return float(np.mean([np.sum(n) / np.sum(d) for n, d in (self.strata[k] for k in sorted(self.strata))]))


def sign_flip_p(diffs) -> float | None:
    """Exact two-sided paired permutation (sign-flip) p-value of the mean of ``diffs`` (module docstring)."""
    d = np.asarray(_finite(diffs), dtype=np.float64)
    n = d.size
    if n == 0:
        return None
    obs = abs(d.mean())
    if n <= EXACT_MAX_N:
        signs = 1.0 - 2.0 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
    else:
        signs = np.random.default_rng(BOOTSTRAP_SEED).choice([-1.0, 1.0], size=(MC_FLIPS, n))
    null = np.abs(signs @ d) / n
    return float(np.mean(null >= obs - 1e-12 * max(obs, np.abs(d).max())))


def holm(pvalues) -> list[float | None]:
    """Holm step-down adjusted p-values, in the input order (None stays None and is not counted)."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    m = len(idx)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out


def holm_floor(n: int, m: int) -> float:
    """The smallest Holm-corrected p that n paired seeds can ever give among m primary contrasts: the exact
    two-sided sign-flip p when every pair agrees in sign (2 / 2^n), times m (Holm's first step); 1 without seeds."""
    return min(1.0, max(m, 1) * 2.0 / 2 ** n) if n else 1.0


def seeds_needed(m: int, alpha: float = ALPHA) -> int:
    """The fewest paired seeds whose ``holm_floor`` is below ``alpha`` with m primary contrasts (1: 6, 2-3: 7)."""
    return next(k for k in range(1, 64) if holm_floor(k, m) < alpha)


def verdict(p_adjusted: float | None, ci_low: float | None, ci_high: float | None, expect: str,
            alpha: float = ALPHA) -> str:
    """supported / contradicted / inconclusive (module docstring); ``expect``: "higher" or "lower" (the
    variant's metric against the baseline's, as the paper expects)."""
    if p_adjusted is None or ci_low is None or ci_high is None or not p_adjusted < alpha:
        return "inconclusive"
    up = ci_low > 0
    down = ci_high < 0
    if not (up or down):
        return "inconclusive"
    return "supported" if (up and expect == "higher") or (down and expect == "lower") else "contradicted"


def _same_documents(runs: list[DocData]) -> bool:
    keys = set(runs[0].strata)
    for r in runs[1:]:
        if set(r.strata) != keys:
            return False
        for k in keys:
            a, b = np.asarray(runs[0].strata[k][1]), np.asarray(r.strata[k][1])
            if a.shape != b.shape or not np.array_equal(a, b):
                return False
    return True


def hierarchical_ci(variant: dict, baseline: dict, variant_docs: dict | None = None,
                    baseline_docs: dict | None = None, n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                    level: float = LEVEL) -> dict:
    """Interval of mean(variant - baseline) over the paired seeds (module docstring).

    variant, baseline: {seed: stored value or None}; *_docs: {seed: DocData or None}. Returns {"n", "mean",
    "ci_low", "ci_high", "seeds", "mode"} with mode "seeds x documents" or "seeds only"."""
    seeds = tuple(sorted(s for s in variant if s in baseline and _finite([variant[s]]) and _finite([baseline[s]])))
    if not seeds:
        return {"n": 0, "mean": None, "ci_low": None, "ci_high": None, "seeds": [], "mode": None}
    d = np.array([float(variant[s]) - float(baseline[s]) for s in seeds])
    n = len(seeds)
    rng = np.random.default_rng(seed)
    S = rng.integers(0, n, size=(n_resamples, n))
    vd = [(variant_docs or {}).get(s) for s in seeds]
    bd = [(baseline_docs or {}).get(s) for s in seeds]
    mode = "seeds only"
    if all(x is not None for x in vd + bd) and _same_documents(vd + bd):
        mode = "seeds x documents"
        runs = vd + bd                                  # run r: variant seeds 0..n-1, then baseline seeds
        vals = np.zeros((len(runs), n_resamples))
        for k in sorted(runs[0].strata):
            num = np.stack([np.asarray(r.strata[k][0], dtype=np.float64) for r in runs], axis=1)   # [G, runs]
            den = np.asarray(runs[0].strata[k][1], dtype=np.float64)
            G = len(den)
            draws = rng.integers(0, G, size=(n_resamples, G))
            block = max(1, 4_000_000 // max(G, 1))
            for i in range(0, n_resamples, block):
                dr = draws[i: i + block]
                flat = (dr + (np.arange(len(dr)) * G)[:, None]).reshape(-1)
                C = np.bincount(flat, minlength=len(dr) * G).reshape(len(dr), G).astype(np.float64)  # draws/doc
                vals[:, i: i + block] += ((C @ num) / (C @ den)[:, None]).T
        vals /= len(runs[0].strata)
        diff = vals[:n] - vals[n:]                      # [seed, replicate]: variant - baseline on the drawn docs
        reps = diff[S, np.arange(n_resamples)[:, None]].mean(axis=1)
    else:
        reps = d[S].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.percentile(reps, [100 * alpha, 100 * (1 - alpha)])
    return {"n": n, "mean": float(d.mean()), "ci_low": float(lo), "ci_high": float(hi), "seeds": list(seeds),
            "mode": mode}


__all__ = ["Summary", "PairedDiff", "summarize", "bootstrap_ci", "paired_difference", "N_RESAMPLES",
           "BOOTSTRAP_SEED", "LEVEL", "ALPHA", "DocData", "sign_flip_p", "holm", "holm_floor", "seeds_needed",
           "verdict", "hierarchical_ci", "VERDICTS"]
