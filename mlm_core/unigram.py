"""The unigram-frequency baseline, one definition for the training loop and the evaluate stage.

The baseline ranks the vocabulary by the language's token frequency over the *whole* train split
(specials and padding excluded), ties broken by id; its top-1 prediction is the most frequent token.
Counted with ``np.bincount`` over the memory-mapped shard files, one file at a time (seconds for
millions of rows; no row is copied into Python).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np


def unigram_counts(shards, special_ids: Mapping[str, int] | list[int], split: str = "train",
                   langs: list[str] | None = None) -> dict[str, np.ndarray]:
    """Per language, token counts over every row of ``split`` (specials and padding zeroed).

    ``shards``: a ``ShardDataset``; ``special_ids``: role -> id, or a list of ids."""
    vocab = int(shards.manifest.get("vocab_size") or 0)
    ids = special_ids.values() if isinstance(special_ids, Mapping) else special_ids
    specials = sorted({int(i) for i in ids})
    out = {}
    for lang in langs if langs is not None else shards.languages(split):
        if lang not in shards.languages(split):
            continue
        counts = np.zeros(max(vocab, max(specials) + 1), dtype=np.int64)
        for part in shards.input_ids(split, lang).parts:       # one shard file at a time (memory-mapped)
            c = np.bincount(np.asarray(part).reshape(-1), minlength=len(counts))
            if len(c) > len(counts):
                counts = np.pad(counts, (0, len(c) - len(counts)))
            counts += c
        counts[specials] = 0
        out[lang] = counts
    return out


def frequency_ranks(counts: np.ndarray) -> np.ndarray:
    """rank[token] (1-based) in the baseline's fixed prediction list: by count descending, ties by id."""
    order = np.argsort(-counts, kind="stable")
    ranks = np.empty(len(counts), dtype=np.int64)
    ranks[order] = np.arange(1, len(counts) + 1)
    return ranks


def unigram_top(shards, special_ids, langs: list[str] | None = None) -> dict[str, int]:
    """Per language, the baseline's top-1 prediction (the most frequent non-special train token; ties by id)."""
    return {lang: int(np.argmax(c)) for lang, c in unigram_counts(shards, special_ids, "train", langs).items()}


__all__ = ["unigram_counts", "frequency_ranks", "unigram_top"]
