"""Temperature-based language sampling: how often each language is drawn, given its size.

In: a size per language (documents, characters or tokens) and an exponent α. Out: the sampling
probabilities p(l) = n_l^α / Σ_k n_k^α, and a table comparing them with the natural shares.
α = 1 keeps the natural shares; α → 0 flattens toward uniform; α = 0.3 is XLM-R's choice
(Conneau et al. 2020, "Unsupervised Cross-lingual Representation Learning at Scale", §3.1;
Lample & Conneau 2019 use α = 0.5). Pure functions; used by the tokenizer sample and the shards stage.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingRow:
    """One language of the sampling table."""

    lang: str
    n: int                           # size of the language (the unit of the counts given)
    natural: float                   # n_l / Σ n
    p: float                         # sampling probability n_l^α / Σ n^α
    upsampling: float                # p / natural: > 1 means the language is drawn more than its share
    expected_epochs: float | None    # token_budget * p / n_l (counts in tokens), None without a budget


def _check(counts: dict[str, int], alpha: float) -> None:
    if not (0 < alpha <= 1):
        raise ValueError(f"sampling alpha must be in (0, 1], got {alpha}")
    if not counts:
        raise ValueError("no languages to sample from")
    bad = sorted(lang for lang, n in counts.items() if n is None or n <= 0)
    if bad:
        raise ValueError(f"language(s) with no data (count <= 0): {', '.join(bad)}")


def language_weights(counts: dict[str, int], alpha: float) -> dict[str, float]:
    """p(l) = n_l^α / Σ_k n_k^α, keyed like ``counts`` (sums to 1).

    ValueError for α outside (0, 1] or languages with a count <= 0 (named)."""
    _check(counts, alpha)
    langs = list(counts)
    n = np.array([counts[lang] for lang in langs], dtype=np.float64)
    # Work in log space so huge counts with α close to 1 cannot overflow.
    logw = alpha * np.log(n)
    w = np.exp(logw - logw.max())
    p = w / w.sum()
    return {lang: float(x) for lang, x in zip(langs, p)}


def sampling_table(counts: dict[str, int], alpha: float, token_budget: int | None = None) -> list[SamplingRow]:
    """One row per language (in the order of ``counts``): natural share, p, upsampling, expected epochs."""
    p = language_weights(counts, alpha)
    total = float(sum(counts.values()))
    rows = []
    for lang, n in counts.items():
        natural = n / total
        epochs = token_budget * p[lang] / n if token_budget is not None else None
        rows.append(SamplingRow(lang, int(n), natural, p[lang], p[lang] / natural, epochs))
    return rows
