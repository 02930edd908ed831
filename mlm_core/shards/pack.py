"""Packing and writing of the shards stage (``build.py``): encoded documents -> rows -> Arrow IPC files.

In: ``Encoded`` batches of one (split, language) stream. Out: ``<split>/<lang>-NNNNN.arrow`` files of
``rows_per_shard`` rows each, and the list of shard records (file, rows, tokens, bytes, sha256).

Row layout (fairseq RoBERTa "none" break mode, Liu et al. 2019 §4.2 FULL-SENTENCES): each language's
documents form one stream ``doc1 [SEP] doc2 [SEP] ...``, cut into chunks of ``seq_len - 1`` and prefixed
with ``[CLS]``. A document longer than a row continues after the ``[CLS]`` of the next row; a row ends
without ``[SEP]`` when it cuts a document. Rows never mix languages or splits. The last row of a stream
is padded with ``[PAD]``.

Columns (each a ``fixed_size_list<_, seq_len>``):
  input_ids    uint16 when vocab_size <= 65536, else uint32
  segment_ids  which document a position belongs to, 1..k within the row, 0 = padding. [CLS] belongs to
               segment 1 and a document's [SEP] to its document, so "attend only where segment ids are
               equal" masks attention across documents. uint8 when seq_len <= 256 (k < seq_len), else uint16.
  word_start   uint8, 1 where a token starts a word, 0 for [CLS]/[SEP]/[PAD]. In space-delimited text a word
               is a pre-token (``Encoding.word_ids`` changes: WordPiece, byte-level BPE and Unigram alike); in
               runs of Han, Kana, Thai, Lao, Khmer and Myanmar, whose pre-tokens are whole clauses, the words
               come from ICU's dictionary word-break iterator, and a word keeps its combining marks (vowel
               signs), where the byte-level pre-tokenizer splits (``words.py``). The first token of a row that
               continues a document is a start too, so every word piece inside a row has a start to group on.

File format: uncompressed Arrow IPC **stream** format, one record batch per file. Under ``pa.memory_map``
it opens zero-copy (0 bytes allocated, like the IPC file format; compression would copy everything) and it
is the format ``datasets.Dataset.from_file`` reads, so the shards are a Hugging Face dataset as they are
(the IPC *file* format fails there with "Expected to read ... metadata bytes").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from mlm_core.shards.encode import Encoded, _select
from mlm_core.store import sha256_file


# ------------------------------------------------------------------------------------------ format
def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned type holding every token id."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def id_capacity(vocab_size: int) -> int:
    """How many ids the token dtype chosen for ``vocab_size`` holds (65536 for uint16): the room a
    vocabulary has to grow (tokenizer.extend) without changing the dtype of its stored ids."""
    return int(np.iinfo(token_dtype(vocab_size)).max) + 1


def segment_dtype(seq_len: int) -> np.dtype:
    """A row holds fewer than seq_len segments, so uint8 is enough up to seq_len 256."""
    return np.dtype(np.uint8) if seq_len <= 256 else np.dtype(np.uint16)


def shard_schema(seq_len: int, ids: np.dtype, seg: np.dtype) -> pa.Schema:
    return pa.schema([
        ("input_ids", pa.list_(pa.from_numpy_dtype(ids), seq_len)),
        ("segment_ids", pa.list_(pa.from_numpy_dtype(seg), seq_len)),
        ("word_start", pa.list_(pa.uint8(), seq_len)),
    ])


def shard_name(split: str, lang: str, index: int) -> str:
    return f"{split}/{lang}-{index:05d}.arrow"


# ------------------------------------------------------------------------------------------ pack
@dataclass
class StreamStats:
    docs: int = 0
    content_tokens: int = 0    # document tokens, without [CLS]/[SEP]/[PAD]
    tokens: int = 0            # non-pad positions ([CLS] and [SEP] included)
    rows: int = 0


@dataclass
class ShardWriter:
    """Collects rows of one (split, lang) and writes a file every ``rows_per_shard`` rows."""

    out_dir: Path
    split: str
    lang: str
    seq_len: int
    rows_per_shard: int
    schema: pa.Schema
    pad_id: int
    shards: list[dict] = field(default_factory=list)
    _buf: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    _n: int = 0

    def add(self, ids: np.ndarray, seg: np.ndarray, ws: np.ndarray) -> None:
        while len(ids):
            take = min(len(ids), self.rows_per_shard - self._n)
            self._buf.append((ids[:take], seg[:take], ws[:take]))
            self._n += take
            ids, seg, ws = ids[take:], seg[take:], ws[take:]
            if self._n == self.rows_per_shard:
                self._write()

    def close(self) -> list[dict]:
        if self._n:
            self._write()
        return self.shards

    def _write(self) -> None:
        cols = [np.concatenate([b[i] for b in self._buf]) for i in range(3)]
        arrays = [pa.FixedSizeListArray.from_arrays(pa.array(c.reshape(-1)), self.seq_len) for c in cols]
        batch = pa.record_batch(arrays, schema=self.schema)
        rel = shard_name(self.split, self.lang, len(self.shards))
        path = self.out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with pa.OSFile(str(path), "wb") as sink, ipc.new_stream(sink, self.schema) as w:
            w.write_batch(batch)
        self.shards.append({"file": rel, "lang": self.lang, "split": self.split, "rows": int(self._n),
                            "tokens": int((cols[0] != self.pad_id).sum()), "bytes": path.stat().st_size,
                            "sha256": sha256_file(path)})
        self._buf, self._n = [], 0


class Packer:
    """Turns one (split, lang) document stream into rows of exactly seq_len (see the module docstring)."""

    def __init__(self, writer: ShardWriter, seq_len: int, cls_id: int, sep_id: int, pad_id: int,
                 ids_dtype: np.dtype, seg_dtype: np.dtype):
        self.w, self.seq_len, self.width = writer, seq_len, seq_len - 1
        self.cls, self.sep, self.pad = cls_id, sep_id, pad_id
        self.ids_dtype, self.seg_dtype = ids_dtype, seg_dtype
        self.stats = StreamStats()
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []   # (ids, word_start, doc index)
        self._pending_len = 0

    def add(self, enc: Encoded) -> None:
        lens = enc.lens
        keep = lens > 0
        if not keep.any():
            return
        if not keep.all():   # a document with no tokens would only add a lone [SEP]
            enc = _select(enc, keep)
            lens = enc.lens
        n = len(lens)
        total = int(lens.sum()) + n
        sep_pos = np.cumsum(lens + 1) - 1
        ids = np.empty(total, dtype=self.ids_dtype)
        ws = np.zeros(total, dtype=np.uint8)
        is_tok = np.ones(total, dtype=bool)
        is_tok[sep_pos] = False
        ids[is_tok] = enc.ids
        ids[sep_pos] = self.sep
        ws[is_tok] = enc.word_start
        doc = np.repeat(np.arange(self.stats.docs, self.stats.docs + n, dtype=np.int64), lens + 1)
        self.stats.docs += n
        self.stats.content_tokens += int(lens.sum())
        self._pending.append((ids, ws, doc))
        self._pending_len += total
        if self._pending_len >= self.width:
            self._emit(final=False)

    def close(self) -> StreamStats:
        self._emit(final=True)
        return self.stats

    def _emit(self, final: bool) -> None:
        if not self._pending_len:
            return
        ids, ws, doc = (np.concatenate([p[i] for p in self._pending]) for i in range(3))
        n_full = len(ids) // self.width
        cut = n_full * self.width
        rest = (ids[cut:], ws[cut:], doc[cut:])
        if final and len(rest[0]):
            pad = self.width - len(rest[0])
            ids = np.concatenate([ids, np.full(pad, self.pad, self.ids_dtype)])
            ws = np.concatenate([ws, np.zeros(pad, np.uint8)])
            doc = np.concatenate([doc, np.full(pad, -1, np.int64)])
            n_full, cut, rest = n_full + 1, len(ids), None
        self._pending = [] if final or rest is None or not len(rest[0]) else [rest]
        self._pending_len = 0 if not self._pending else len(rest[0])
        if not n_full:
            return
        self._rows(ids[:cut].reshape(n_full, self.width), ws[:cut].reshape(n_full, self.width),
                   doc[:cut].reshape(n_full, self.width))

    def _rows(self, ids: np.ndarray, ws: np.ndarray, doc: np.ndarray) -> None:
        n = len(ids)
        out_ids = np.empty((n, self.seq_len), self.ids_dtype)
        out_ids[:, 0] = self.cls
        out_ids[:, 1:] = ids
        seg = np.zeros((n, self.seq_len), self.seg_dtype)
        real = doc >= 0
        seg[:, 1:] = np.where(real, doc - doc[:, :1] + 1, 0)
        seg[:, 0] = 1
        out_ws = np.zeros((n, self.seq_len), np.uint8)
        out_ws[:, 1:] = ws
        out_ws[:, 1] |= (ids[:, 0] != self.sep) & real[:, 0]   # a row continuing a document starts a word
        self.stats.rows += n
        self.stats.tokens += int(real.sum()) + n
        self.w.add(out_ids, seg, out_ws)
