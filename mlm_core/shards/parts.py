"""Partitions of the shards stage: which documents a partition holds, encoding one, and its files.

The stage is plan -> process -> merge (``mlm_core.partitions``; wired in ``build.py``):
  plan     one partition per (language, run of consecutive documents of about ``partition_bytes`` of text),
           in config language order, then file order. A descriptor is a small JSON dict (``part``).
  process  encodes its documents (the tokenizer-bound work) into its own folder: per split, the content token
           ids, word starts and document lengths of its documents, in file order (``save`` / ``load``).
  merge    cuts every (split, language) stream, its partitions in order, into rows and shard files
           (``merge.py``: planned from the documents' lengths, each file then written alone): the rows, their
           numbering and the shard files are those of a single pass over the language's documents, so they do
           not depend on how the documents were partitioned (the rows are a function of the concatenated
           document stream only; where encode batches or partitions end does not enter).

The train/validation split needs the whole language (``split.py``: a hash-order prefix of ``k`` documents, and
``k`` may come from a top-up), so the plan computes it and hands each partition the "cut": the first training
document in hash order, as (hash prefix, file row). A document is validation iff (prefix, row) < cut, which is
exactly "hash-order rank < k" (ties in hash prefix are ordered by file row, as ``hash_order_ranks`` does).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mlm_core.shards.encode import Encoded

SPLITS = ("train", "validation")
_TOKENIZERS: dict[tuple, object] = {}     # per process: a worker encodes many partitions with one tokenizer


def row_ranges(path: Path, partition_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) rows of ``docs/<lang>.parquet`` holding about ``partition_bytes`` of text each.

    Sizes come from the ``n_chars`` column (4 bytes a document) scaled by the file's text bytes per character
    (the text column's uncompressed size in the Parquet metadata), so planning never reads the text.
    Deterministic: the same file and size give the same ranges."""
    pf = pq.ParquetFile(path)
    n = pf.metadata.num_rows
    if n == 0:
        return []
    chars = pf.read(columns=["n_chars"]).column(0).to_numpy().astype(np.int64)
    md, col = pf.metadata, pf.schema_arrow.get_field_index("text")
    text_bytes = sum(md.row_group(g).column(col).total_uncompressed_size for g in range(md.num_row_groups))
    per_char = text_bytes / max(int(chars.sum()), 1)
    budget = max(1.0, partition_bytes / max(per_char, 1e-9))       # characters per partition
    ends = np.cumsum(chars)
    # the partition of a document = how many whole budgets the text before it fills
    which = ((ends - chars) // budget).astype(np.int64)
    cuts = np.flatnonzero(np.diff(which)) + 1
    bounds = [0, *cuts.tolist(), n]
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def split_cut(prefix: np.ndarray, k: int) -> list[int]:
    """The first training document in hash order, (prefix, file row), for a split of ``k`` validation documents."""
    n = len(prefix)
    if k <= 0:
        return [0, -1]                         # nothing is below (0, -1): no validation document
    if k >= n:
        return [2**32, 0]                      # everything is below: all validation
    order = np.argsort(prefix, kind="stable")
    i = int(order[k])
    return [int(prefix[i]), i]


def validation_of(prefix: np.ndarray, rows: np.ndarray, cut: list[int]) -> np.ndarray:
    """True = validation, for documents with hash prefixes ``prefix`` at file rows ``rows``."""
    p = prefix.astype(np.int64)
    return (p < cut[0]) | ((p == cut[0]) & (rows < cut[1]))


def read_range(path: Path, start: int, stop: int, batch_docs: int, columns=("text", "hash")
               ) -> Iterator[pa.RecordBatch]:
    """Record batches of rows [start, stop) of a Parquet file, reading only the row groups that hold them.
    Buffered reads: pages stream in (a row group larger than a partition is not held whole), and the read stops
    at ``stop``; rows of a row group before ``start`` are still decoded (Parquet pages have no row index here)."""
    pf = pq.ParquetFile(path, buffer_size=1 << 20)
    md = pf.metadata
    groups, first, at = [], None, 0
    for g in range(md.num_row_groups):
        rows = md.row_group(g).num_rows
        if at < stop and at + rows > start:
            groups.append(g)
            first = at if first is None else first
        at += rows
    if not groups:
        return
    pos = first
    for b in pf.iter_batches(batch_size=batch_docs, row_groups=groups, columns=list(columns)):
        lo, hi = max(start - pos, 0), min(stop - pos, b.num_rows)
        pos += b.num_rows
        if hi > lo:
            yield b.slice(lo, hi - lo)
        if pos >= stop:
            return


def cached_tokenizer(tok_file: Path):
    """The prepared tokenizer of ``tok_file``, loaded once per process (a 250k vocabulary takes ~1 s)."""
    from tokenizers import Tokenizer

    from mlm_core.shards.encode import prepare_tokenizer
    st = tok_file.stat()
    key = (str(tok_file), st.st_size, st.st_mtime_ns)
    if key not in _TOKENIZERS:
        _TOKENIZERS.clear()
        _TOKENIZERS[key] = prepare_tokenizer(Tokenizer.from_file(str(tok_file)))
    return _TOKENIZERS[key]


# ------------------------------------------------------------------------------------------ files
def _arrays(split: str) -> dict[str, str]:
    return {k: f"{split}.{k}.npy" for k in ("ids", "word_start", "lens")}


class PartWriter:
    """Collects a partition's encoded documents per split and writes them as .npy files (memory-mapped by merge).
    ``splits``: the part's splits (with CDA on, also "cda": the swapped copies of its training documents)."""

    def __init__(self, splits: tuple[str, ...] = SPLITS):
        self.chunks: dict[str, list[Encoded]] = {s: [] for s in splits}

    def add(self, split: str, enc: Encoded) -> None:
        if len(enc.lens):
            self.chunks[split].append(enc)

    def save(self, out_dir: Path, ids_dtype: np.dtype, result: dict) -> dict:
        out_dir.mkdir(parents=True, exist_ok=True)
        for split, ch in self.chunks.items():
            cols = {"ids": np.concatenate([c.ids for c in ch]) if ch else np.zeros(0, ids_dtype),
                    "word_start": np.concatenate([c.word_start for c in ch]) if ch else np.zeros(0, np.uint8),
                    "lens": np.concatenate([c.lens for c in ch]) if ch else np.zeros(0, np.int64)}
            for k, name in _arrays(split).items():
                np.save(out_dir / name, cols[k], allow_pickle=False)
            result[split] = {"docs": int(len(cols["lens"])), "content_tokens": int(cols["lens"].sum())}
        return result


def load(part_dir: Path, split: str, chunk_docs: int) -> Iterator[Encoded]:
    """A partition's encoded documents of one split, ``chunk_docs`` documents at a time (memory-mapped)."""
    names = _arrays(split)
    ids, ws, lens = (np.load(part_dir / names[k], mmap_mode="r", allow_pickle=False)
                     for k in ("ids", "word_start", "lens"))
    if not len(lens):
        return
    ends = np.cumsum(lens)
    for a in range(0, len(lens), chunk_docs):
        b = min(a + chunk_docs, len(lens))
        lo, hi = int(ends[a] - lens[a]), int(ends[b - 1])
        yield Encoded(np.asarray(ids[lo:hi]), np.asarray(ws[lo:hi]), np.asarray(lens[a:b]))
