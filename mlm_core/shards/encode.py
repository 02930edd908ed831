"""Documents -> flat token / word-start arrays: the encoding half of the shards stage (``build.py``).

In: document texts (streamed from ``docs/<lang>.parquet``) and a ``tokenizers.Tokenizer``. Out: ``Encoded``
batches (token ids, word starts, per-document lengths), in task order.

Parallelism (measured, benchmarks/shards.py, 2 cores): one process whose background thread runs
``encode_batch`` on the tokenizer's rayon threads while the main thread flattens and packs the previous
batch was ~1.4x faster than 2 single-threaded worker processes, and used half the memory. So
``workers <= 2`` encodes in-process (rayon threads, capped at ``workers`` via RAYON_NUM_THREADS when the
pool is not yet started); ``workers >= 3`` starts that many single-threaded processes, for many-core
machines where the one Python thread that flattens encodings would become the limit. The text is streamed
from Parquet ``batch_docs`` documents at a time with a bounded number of batches in flight, so memory
stays flat: one shard of rows being filled plus the batches in flight.
"""
from __future__ import annotations

import itertools
import multiprocessing as mp
import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mlm_core.shards.words import refine_word_starts


@dataclass
class Encoded:
    """A batch of documents, flattened: token ids, word starts, and each document's length."""

    ids: np.ndarray          # (total,) token dtype
    word_start: np.ndarray   # (total,) uint8
    lens: np.ndarray         # (n_docs,) int64


def prepare_tokenizer(tok):
    """Raw document encoding: no truncation/padding from tokenizer.json, and special-token strings found in
    the text ("[SEP]", "<s>") are encoded as text, so content never contains a special id."""
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = True
    return tok


def encode_texts(tok, texts: list[str], dtype: np.dtype) -> Encoded:
    return encodings_to_arrays(tok.encode_batch(texts, add_special_tokens=False), dtype, texts)


def encodings_to_arrays(encs: list, dtype: np.dtype, texts: list[str]) -> Encoded:
    """Flatten a batch of Encodings (a loop per document; the per-token work is in C). ``texts`` are the
    encoded documents: word starts inside zh/ja/th/... runs come from ICU (``words.py``)."""
    lens = np.fromiter((len(e) for e in encs), dtype=np.int64, count=len(encs))
    total = int(lens.sum())
    ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encs), dtype=dtype, count=total)
    try:
        wid = np.fromiter(itertools.chain.from_iterable(e.word_ids for e in encs), dtype=np.int64, count=total)
    except TypeError:  # a None word id (special token): never expected with encode_special_tokens
        wid = np.array([-1 if w is None else w for e in encs for w in e.word_ids], dtype=np.int64)
    ws = np.ones(total, dtype=np.uint8)
    if total:
        ws[1:] = wid[1:] != wid[:-1]
        starts = np.cumsum(lens) - lens
        ws[starts[lens > 0]] = 1
        ws[wid < 0] = 0
        refine_word_starts(texts, encs, lens, ws)
    return Encoded(ids, ws, lens)


_WORKER_TOK = None


def _init_worker(tokenizer_file: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"   # one thread per process: `workers` processes share the cores
    from tokenizers import Tokenizer
    global _WORKER_TOK
    _WORKER_TOK = prepare_tokenizer(Tokenizer.from_file(tokenizer_file))


def _encode_in_worker(texts: pa.Array, dtype_str: str) -> Encoded:
    return encode_texts(_WORKER_TOK, texts.to_pylist(), np.dtype(dtype_str))


def doc_batches(path: Path, batch_docs: int) -> Iterator[pa.Array]:
    """The text column of a normalized language file, ``batch_docs`` documents at a time."""
    pf = pq.ParquetFile(path)
    for b in pf.iter_batches(batch_size=batch_docs, columns=["text"]):
        yield b.column(0)


def select_docs(enc: Encoded, sel: np.ndarray) -> Encoded:
    """The documents of ``enc`` where the boolean mask ``sel`` (one entry per document) is True."""
    if sel.all():
        return enc
    return Encoded(enc.ids[np.repeat(sel, enc.lens)], enc.word_start[np.repeat(sel, enc.lens)], enc.lens[sel])


IN_PROCESS_MAX_WORKERS = 2   # see the module docstring: in-process rayon threads measured faster on 2 cores


def encode_stream(tasks, workers: int, tok_file: str, tok, dtype: np.dtype):
    """Yield (lang, Encoded) in task order; a bounded number of batches in flight."""
    if workers <= IN_PROCESS_MAX_WORKERS:
        # Pipelined: a thread runs encode_batch (Rust, GIL released, rayon threads) on batch i+1 while this
        # thread turns batch i into arrays and packs it, so the cores are not idle during the Python work.
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(1) as ex:
            pending: deque = deque()
            for lang, texts in tasks:
                batch = texts.to_pylist()
                pending.append((lang, batch, ex.submit(tok.encode_batch, batch, add_special_tokens=False)))
                if len(pending) >= 2:
                    lg, batch, fut = pending.popleft()
                    yield lg, encodings_to_arrays(fut.result(), dtype, batch)
            while pending:
                lg, batch, fut = pending.popleft()
                yield lg, encodings_to_arrays(fut.result(), dtype, batch)
        return
    ctx = mp.get_context("forkserver")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(tok_file,)) as ex:
        inflight: deque = deque()
        for lang, texts in tasks:
            inflight.append((lang, ex.submit(_encode_in_worker, texts, dtype.str)))
            if len(inflight) >= 2 * workers:
                lg, fut = inflight.popleft()
                yield lg, fut.result()
        while inflight:
            lg, fut = inflight.popleft()
            yield lg, fut.result()
