"""Packing and writing of the shards stage (``build.py``): encoded documents -> rows -> Arrow IPC files.

In: ``Encoded`` batches of one (split, language) stream. Out: ``<split>/<lang>-NNNNN.arrow`` files of
``rows_per_shard`` rows each, and the list of shard records (file, rows, tokens, bytes, sha256).

Row layout (fairseq RoBERTa "none" break mode, Liu et al. 2019 §4.2 FULL-SENTENCES): each language's
documents form one stream ``doc1 [SEP] doc2 [SEP] ...``, cut into chunks of ``seq_len - 1`` and prefixed
with ``[CLS]``. A document longer than a row continues after the ``[CLS]`` of the next row; a row ends
without ``[SEP]`` when it cuts a document. Rows never mix languages or splits. The last row of a stream
is padded with ``[PAD]``.

What a position stores (format v3, ``layout.py``): its token id with the word-start flag folded into the
id's spare top bit (or bit-packed beside it when the vocabulary leaves none); segment ids are not stored but
rebuilt from the [SEP] positions at read time. The values the reader returns:
  input_ids    the token ids.
  segment_ids  which document a position belongs to, 1..k within the row, 0 = padding. [CLS] belongs to
               segment 1 and a document's [SEP] to its document, so "attend only where segment ids are
               equal" masks attention across documents.
  word_start   1 where a token starts a word, 0 for [CLS]/[SEP]/[PAD]. In space-delimited text a word
               is a pre-token (``Encoding.word_ids`` changes: WordPiece, byte-level BPE and Unigram alike); in
               runs of Han, Kana, Thai, Lao, Khmer and Myanmar, whose pre-tokens are whole clauses, the words
               come from ICU's dictionary word-break iterator, and a word keeps its combining marks (vowel
               signs), where the byte-level pre-tokenizer splits (``words.py``). The first token of a row that
               continues a document is a start too, so every word piece inside a row has a start to group on.

File format: uncompressed Arrow IPC **stream** format, one record batch per file. Under ``pa.memory_map``
it opens zero-copy (0 bytes allocated, like the IPC file format; compression would copy everything) and it
is the format ``datasets.Dataset.from_file`` reads (the IPC *file* format fails there with "Expected to read ...
metadata bytes"); ``reader.as_hf_dataset`` adds the decoding as a transform.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from mlm_core.errors import StageError
from mlm_core.shards.encode import Encoded, select_docs
from mlm_core.shards.layout import Layout, id_capacity, segment_dtype, shard_schema, token_dtype  # noqa: F401
from mlm_core.store import sha256_file


# ------------------------------------------------------------------------------------------ format
# token_dtype, id_capacity, segment_dtype, shard_schema live in layout.py (re-exported here for importers)


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
    rows_per_shard: int
    layout: Layout
    shards: list[dict] = field(default_factory=list)
    _buf: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    _n: int = 0

    def add(self, ids: np.ndarray, ws: np.ndarray) -> None:
        while len(ids):
            take = min(len(ids), self.rows_per_shard - self._n)
            self._buf.append((ids[:take], ws[:take]))
            self._n += take
            ids, ws = ids[take:], ws[take:]
            if self._n == self.rows_per_shard:
                self._write()

    def close(self) -> list[dict]:
        if self._n:
            self._write()
        return self.shards

    def _write(self) -> None:
        ids, ws = (np.concatenate([b[i] for b in self._buf]) for i in range(2))
        rel = shard_name(self.split, self.lang, len(self.shards))
        path = self.out_dir / rel
        write_rows(path, self.layout, ids, ws)
        self.shards.append({"file": rel, "lang": self.lang, "split": self.split, "rows": int(self._n),
                            "tokens": int((ids != self.layout.pad).sum()), "bytes": path.stat().st_size,
                            "sha256": sha256_file(path)})
        self._buf, self._n = [], 0


def write_rows(path: Path, layout: Layout, ids: np.ndarray, ws: np.ndarray) -> None:
    """One shard file: (rows, seq_len) ids and word starts, stored per ``layout`` in one record batch."""
    schema = layout.schema()
    arrays = [pa.FixedSizeListArray.from_arrays(pa.array(c.reshape(-1)), w)
              for c, w in zip(layout.encode(ids, ws), layout.widths().values())]
    path.parent.mkdir(parents=True, exist_ok=True)
    with pa.OSFile(str(path), "wb") as sink, ipc.new_stream(sink, schema) as w:
        w.write_batch(pa.record_batch(arrays, schema=schema))


class Packer:
    """Turns one (split, lang) document stream into rows of exactly seq_len (see the module docstring)."""

    def __init__(self, writer: ShardWriter, cls_id: int, where: str = ""):
        lay = writer.layout
        self.w, self.seq_len, self.width = writer, lay.seq_len, lay.seq_len - 1
        self.cls, self.sep, self.pad = cls_id, lay.sep, lay.pad
        self.ids_dtype, self.where = lay.ids, where
        self.stats = StreamStats()
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []   # (ids, word_start, doc index)
        self._pending_len = 0

    def add(self, enc: Encoded) -> None:
        lens = enc.lens
        keep = lens > 0
        if not keep.any():
            return
        if not keep.all():   # a document with no tokens would only add a lone [SEP]
            enc = select_docs(enc, keep)
            lens = enc.lens
        if len(enc.ids) and ((enc.ids == self.sep).any() or (enc.ids == self.pad).any()):
            # segment ids are rebuilt from [SEP] positions and padding from [PAD] ids (layout.py)
            raise StageError(f"shards: {self.where}: a document encodes to the [SEP] or [PAD] id "
                             f"({self.sep}/{self.pad}) inside its text; the tokenizer must encode special-token "
                             "strings as text (encode_special_tokens)")
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
        real = doc >= 0
        out_ws = np.zeros((n, self.seq_len), np.uint8)
        out_ws[:, 1:] = ws
        out_ws[:, 1] |= (ids[:, 0] != self.sep) & real[:, 0]   # a row continuing a document starts a word
        self.stats.rows += n
        self.stats.tokens += int(real.sum()) + n
        self.w.add(out_ids, out_ws)
