"""The shards stage: normalized documents -> packed, pre-tokenized Arrow shards + the language sampling table.

In: the normalize output (``docs/<lang>.parquet``: doc_id, lang, text, n_chars, hash) and the tokenizer
output (``tokenizer.json`` + manifest with vocab_size and special token ids). Out (under the stage folder):

  train/<lang>-00000.arrow, validation/<lang>-00000.arrow   packed rows, ``rows_per_shard`` per file
  sampling.parquet   lang, n, natural, p, upsampling, expected_epochs   (p(l) = n_l^α / Σ n_k^α, n = train tokens;
                     expected_epochs is null: `mlm stats` computes it from the current shards.token_budget)
  stats.parquet      per language: docs, tokens, content tokens and rows, per split

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

Split: a document goes to validation when int(hash[:8], 16) / 2**32 < validation_fraction (its md5 from
normalize: stable across runs and machines); a language with at least two documents always gets one
(the smallest hash) when none qualified. ``min_validation_tokens`` tops a small language up: documents are
taken in hash order (so the fraction's documents come first and the split stays a hash-order prefix) until
the validation documents hold that many content tokens, never more than half the language's documents;
only those candidates are encoded for the count. The manifest's ``validation_docs`` says how many
documents each language's validation split took (the first that many in hash order).

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
import logging
import multiprocessing as mp
import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from mlm_core.errors import StageError
from mlm_core.shards.words import refine_word_starts
from mlm_core.store import sha256_file

log = logging.getLogger(__name__)

SPLITS = ("train", "validation")
ROLES = ("pad", "unk", "cls", "sep", "mask")


# ------------------------------------------------------------------------------------------ format
def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned type holding every token id."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


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


# ------------------------------------------------------------------------------------------ split
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
            for texts in _doc_batches(path, batch_docs):
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


# ------------------------------------------------------------------------------------------ encode
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


# ------------------------------------------------------------------------------------------ stage
def _special_ids(tok_manifest: dict, tok) -> dict[str, int]:
    st = tok_manifest.get("special_tokens") or {}
    out = {}
    for role in ("pad", "cls", "sep"):
        entry = st.get(role)
        if entry is None:
            raise StageError(f"tokenizer manifest: special_tokens has no '{role}' entry (roles: {sorted(st)})")
        tid = entry["id"] if isinstance(entry, dict) else int(entry)
        token = entry.get("token") if isinstance(entry, dict) else None
        if token is not None and tok.token_to_id(token) != tid:
            raise StageError(f"tokenizer manifest: {role} token {token!r} has id {tok.token_to_id(token)} in "
                             f"tokenizer.json, manifest says {tid}")
        out[role] = int(tid)
    return out


def _doc_batches(path: Path, batch_docs: int) -> Iterator[pa.Array]:
    pf = pq.ParquetFile(path)
    for b in pf.iter_batches(batch_size=batch_docs, columns=["text"]):
        yield b.column(0)


def _split_masks(path: Path) -> np.ndarray:
    """Validation mask over the documents of one language file (reads the hash column only)."""
    pf = pq.ParquetFile(path)
    parts = [hash_prefix_u32(b.column(0)) for b in pf.iter_batches(batch_size=262_144, columns=["hash"])]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint32)


def _language_docs(docs_dir: Path, lang: str) -> int:
    p = docs_dir / f"{lang}.parquet"
    return pq.ParquetFile(p).metadata.num_rows if p.is_file() else 0


def run_shards(lc, upstream: dict, out_dir: Path) -> dict:
    """Run the stage into ``out_dir``; returns the manifest fields (see the module docstring)."""
    from tokenizers import Tokenizer

    from mlm_core.sampling import sampling_table

    cfg = lc.config.shards
    norm, tart = upstream["normalize"], upstream["tokenizer"]
    docs_dir = Path(norm.path) / "docs"
    tok_file = Path(tart.path) / "tokenizer.json"
    if cfg.workers <= IN_PROCESS_MAX_WORKERS:
        # Only effective before the process's first parallel tokenizers call (rayon reads it once).
        os.environ.setdefault("RAYON_NUM_THREADS", str(cfg.workers))
    tok = prepare_tokenizer(Tokenizer.from_file(str(tok_file)))
    vocab_size = int(tart.manifest.get("vocab_size") or tok.get_vocab_size(with_added_tokens=True))
    if tok.get_vocab_size(with_added_tokens=True) > vocab_size:
        raise StageError(f"{tok_file}: {tok.get_vocab_size(with_added_tokens=True)} tokens, but the tokenizer "
                         f"manifest says vocab_size={vocab_size}")
    specials = _special_ids(tart.manifest, tok)
    ids_dtype, seg_dtype = token_dtype(vocab_size), segment_dtype(cfg.seq_len)
    schema = shard_schema(cfg.seq_len, ids_dtype, seg_dtype)

    langs, dropped = [], []
    for lang in lc.config.languages:
        if _language_docs(docs_dir, lang) == 0:
            if cfg.empty_language == "error":
                raise StageError(f"shards: language '{lang}' has no documents after normalization "
                                 f"({docs_dir / (lang + '.parquet')}); set shards.empty_language=drop to skip it")
            log.warning("shards: language '%s' has no documents after normalization: dropped", lang)
            dropped.append(lang)
        else:
            langs.append(lang)
    if not langs:
        raise StageError("shards: no language has any documents")

    masks = {}
    for lang in langs:
        prefix = _split_masks(docs_dir / f"{lang}.parquet")
        masks[lang] = validation_mask(prefix, cfg.validation_fraction)
        if cfg.min_validation_tokens:
            masks[lang], held = top_up_validation(docs_dir / f"{lang}.parquet", prefix, masks[lang],
                                                  cfg.min_validation_tokens, tok, cfg.batch_docs)
            if 0 <= held < cfg.min_validation_tokens:
                log.warning("shards: language '%s': %d validation tokens (half its %d documents), below "
                            "shards.min_validation_tokens=%d", lang, held, len(prefix), cfg.min_validation_tokens)
    for lang in langs:
        if not masks[lang].any():
            log.warning("shards: language '%s' has a single document: no validation data for it", lang)

    def tasks():
        for lang in langs:
            for texts in _doc_batches(docs_dir / f"{lang}.parquet", cfg.batch_docs):
                yield lang, texts

    results = _encode_stream(tasks(), cfg.workers, str(tok_file), tok, ids_dtype)
    from mlm_core.progress import Progress
    shown = Progress("shards", sum(len(m) for m in masks.values()), unit="docs", tokens=0)   # display only
    n_tokens = 0
    packers: dict[tuple[str, str], Packer] = {}
    shards: list[dict] = []
    per_lang: dict[str, dict] = {}
    pos = {lang: 0 for lang in langs}
    current = None

    def finish(lang: str) -> None:
        st = {}
        for split in SPLITS:
            pk = packers.pop((split, lang))
            s = pk.close()
            shards.extend(pk.w.close())
            st[split] = s
        per_lang[lang] = {f"{k}_{split}": getattr(st[split], k) for split in SPLITS
                          for k in ("docs", "tokens", "content_tokens", "rows")}
        log.info("shards: %s: %d train rows, %d validation rows", lang, st["train"].rows, st["validation"].rows)

    for lang, enc in results:
        n_tokens += int(enc.lens.sum())
        shown.update(advance=len(enc.lens), tokens=n_tokens,
                     note=f"encoding {lang} (language {langs.index(lang) + 1}/{len(langs)})")
        if lang != current:
            if current is not None:
                finish(current)
            current = lang
            for split in SPLITS:
                w = ShardWriter(out_dir, split, lang, cfg.seq_len, cfg.rows_per_shard, schema, specials["pad"])
                packers[(split, lang)] = Packer(w, cfg.seq_len, specials["cls"], specials["sep"], specials["pad"],
                                                ids_dtype, seg_dtype)
        if len(enc.ids) and int(enc.ids.max()) >= vocab_size:
            raise StageError(f"shards: {lang}: token id {int(enc.ids.max())} >= vocab_size {vocab_size}")
        n = len(enc.lens)
        val = masks[lang][pos[lang]: pos[lang] + n]
        pos[lang] += n
        for split, sel in (("train", ~val), ("validation", val)):
            if sel.any():
                packers[(split, lang)].add(_select(enc, sel))
    if current is not None:
        finish(current)
    shown.close()

    counts = {lang: per_lang[lang]["tokens_train"] for lang in langs if per_lang[lang]["tokens_train"] > 0}
    # no token budget here: expected epochs are computed on display (`mlm stats`) from the current
    # shards.token_budget, so changing the budget invalidates no stored output
    table = [asdict(r) for r in sampling_table(counts, cfg.sampling_alpha)]
    _write_tables(out_dir, table, per_lang)
    return {
        "seq_len": cfg.seq_len,
        "dtype": ids_dtype.name,
        "segment_dtype": seg_dtype.name,
        "format": "arrow-ipc-stream",
        "vocab_size": vocab_size,
        "tokenizer_fingerprint": tart.fingerprint,
        "special_tokens": tart.manifest.get("special_tokens", {}),
        "shards": shards,
        "sampling": {"alpha": cfg.sampling_alpha, "unit": "train tokens",
                     "table": table},
        "languages": per_lang,
        "counts": {"rows": sum(s["rows"] for s in shards), "tokens": sum(s["tokens"] for s in shards),
                   "docs": sum(p["docs_train"] + p["docs_validation"] for p in per_lang.values())},
        "dropped_languages": dropped,
        "validation_docs": {lang: int(masks[lang].sum()) for lang in langs},
    }


def _select(enc: Encoded, sel: np.ndarray) -> Encoded:
    if sel.all():
        return enc
    return Encoded(enc.ids[np.repeat(sel, enc.lens)], enc.word_start[np.repeat(sel, enc.lens)], enc.lens[sel])


IN_PROCESS_MAX_WORKERS = 2   # see the module docstring: in-process rayon threads measured faster on 2 cores


def _encode_stream(tasks, workers: int, tok_file: str, tok, dtype: np.dtype):
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


def _write_tables(out_dir: Path, table: list[dict], per_lang: dict) -> None:
    sschema = pa.schema([("lang", pa.string()), ("n", pa.int64()), ("natural", pa.float64()), ("p", pa.float64()),
                         ("upsampling", pa.float64()), ("expected_epochs", pa.float64())])
    pq.write_table(pa.Table.from_pylist(table, schema=sschema), out_dir / "sampling.parquet")
    rows = [{"lang": lang, **{k: int(v) for k, v in p.items()}} for lang, p in per_lang.items()]
    fields = [("lang", pa.string())] + [(k, pa.int64()) for k in next(iter(per_lang.values()))]
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema(fields)), out_dir / "stats.parquet")
