"""The train/validation split of the shards stage (``build.py``): which documents go to validation.

In: a language's ``docs/<lang>.parquet`` (its ``hash`` column; the texts only for the top-up). Out: a boolean
validation mask over its documents, in file order.

Split: a document goes to validation when int(hash[:8], 16) / 2**32 < validation_fraction (its md5 from
normalize: stable across runs and machines); a language with at least two documents always gets one
(the smallest hash) when none qualified. ``min_validation_tokens`` tops a small language up: documents are
taken in hash order (so the fraction's documents come first and the split stays a hash-order prefix) until
the validation documents hold that many content tokens, never more than half the language's documents;
only those candidates are encoded for the count. The manifest's ``validation_docs`` says how many
documents each language's validation split took (the first that many in hash order).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mlm_core.errors import StageError
from mlm_core.shards.encode import doc_batches


_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i


def hash_prefix_u32(hashes: pa.Array) -> np.ndarray:
    """int(h[:8], 16) for every md5-hex string, vectorized (no Python loop per document)."""
    pre = pc.utf8_slice_codeunits(hashes.cast(pa.string()), 0, 8)
    if pre.null_count or len(pre) and pc.min(pc.utf8_length(pre)).as_py() < 8:
        raise StageError("normalize output: a document hash is null or shorter than 8 hex digits")
    pre = pre.combine_chunks() if isinstance(pre, pa.ChunkedArray) else pre
    offsets = np.frombuffer(pre.buffers()[1], dtype=np.int32)[pre.offset: pre.offset + len(pre) + 1]
    data = np.frombuffer(pre.buffers()[2], dtype=np.uint8)
    digits = _HEX[data[offsets[:-1, None] + np.arange(8)]]          # (n, 8) nibbles
    if (digits == 255).any():
        raise StageError("normalize output: a document hash is not hexadecimal")
    shifts = np.arange(28, -1, -4, dtype=np.uint32)
    return (digits.astype(np.uint32) << shifts).sum(axis=1, dtype=np.uint64).astype(np.uint32)


def validation_mask(prefix: np.ndarray, fraction: float) -> np.ndarray:
    """True = validation. At least one validation doc when the language has two or more (smallest hash)."""
    mask = (prefix.astype(np.float64) / 2**32) < fraction
    if len(prefix) >= 2 and not mask.any():
        mask[int(np.argmin(prefix))] = True
    return mask


def hash_order_ranks(prefix: np.ndarray) -> np.ndarray:
    """Each document's position in hash order (ties by file order): the validation split is ``rank < k``."""
    order = np.argsort(prefix, kind="stable")
    rank = np.empty(len(prefix), dtype=np.int64)
    rank[order] = np.arange(len(prefix))
    return rank


def top_up_validation(path: Path, prefix: np.ndarray, mask: np.ndarray, min_tokens: int, tok,
                      batch_docs: int) -> tuple[np.ndarray, int]:
    """Extend ``mask`` (a hash-order prefix) with the next documents in hash order until the validation
    documents hold ``min_tokens`` content tokens, capped at half the documents. Returns (mask, tokens);
    only the documents considered are encoded (their number doubles per round)."""
    n, k = len(prefix), int(mask.sum())
    if min_tokens <= 0 or n < 2:
        return mask, -1
    rank = hash_order_ranks(prefix)
    cap = n // 2
    lens = np.zeros(0, dtype=np.int64)           # content tokens of ranks 0 .. len(lens)-1
    want = max(k, 1)
    while True:
        lo, hi = len(lens), min(max(want, k), n)
        if hi > lo:
            got = np.zeros(hi - lo, dtype=np.int64)
            start = 0
            for texts in doc_batches(path, batch_docs):
                r = rank[start: start + len(texts)]
                sel = np.flatnonzero((r >= lo) & (r < hi))
                if len(sel):
                    encs = tok.encode_batch([texts[int(i)].as_py() for i in sel], add_special_tokens=False)
                    got[r[sel] - lo] = [len(e) for e in encs]
                start += len(texts)
            lens = np.concatenate([lens, got])
        cum = np.cumsum(lens)
        reach = int(np.searchsorted(cum, min_tokens)) + 1       # documents needed to hold min_tokens
        if reach <= len(lens) or len(lens) >= cap:
            take = min(max(k, reach), max(cap, k))
            break
        want = min(2 * len(lens) + 1, cap)
    return rank < take, int(cum[take - 1]) if take else 0


def hash_prefixes(path: Path) -> np.ndarray:
    """``hash_prefix_u32`` of every document of one language file, in file order (reads the hash column only):
    what ``validation_mask`` splits on."""
    pf = pq.ParquetFile(path)
    parts = [hash_prefix_u32(b.column(0)) for b in pf.iter_batches(batch_size=262_144, columns=["hash"])]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint32)
