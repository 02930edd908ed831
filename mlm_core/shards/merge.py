"""The shards merge as a parallel map: plan every output file from the partitions' sizes, then write each alone.

A (split, language) stream is ``doc1 [SEP] doc2 [SEP] ...`` over its partitions in order (the training stream
then the CDA copies, ``build.py``), cut into rows of ``seq_len - 1`` positions after a [CLS] (``pack.py``). Its
length is known from the partitions' document lengths alone (``lens.npy``: a document of n > 0 tokens takes
n + 1 positions, an empty one none), so are its rows (ceil(length / (seq_len - 1))), its files (``rows_per_shard``
rows each) and where each file's rows start and end in the stream. The packing state at a file's start is that
position only: a row's word-start flag after the [CLS] depends on the row's own first position ([SEP] or not),
padding on the stream's end. So:

  plan (``plan_streams``)   reads only ``lens.npy`` of every partition (8 bytes a document) and the headers of its
                            token arrays, no token; fixes each file's stream range, the partition ranges it
                            overlaps and the language tables (the [SEP] positions: 8 bytes a document, held).
  map  (``write_file``)     one output file: its slice of each overlapping partition's token and word-start arrays
                            (read at an offset, nothing else), the [SEP]s put in, rows built and written, in numpy
                            (no loop over tokens or documents); independent of every other file. A worker holds
                            one file's rows (~4 MB at the default 16384 x 128).

The files' bytes equal those of the one-pass ``Packer`` + ``ShardWriter`` (kept as ``build.pack_language``, the
reference the tests compare against), whatever the number of workers.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path

import numpy as np

from mlm_core.errors import StageError
from mlm_core.shards.layout import Layout
from mlm_core.shards.pack import shard_name, write_rows
from mlm_core.store import sha256_file

SPLITS = ("train", "validation")


@dataclass(frozen=True, eq=False)
class Source:
    """One partition's arrays of one split (``part_dir``/``key``.*.npy), as the plan read them: the stream
    position of every document's [SEP] and where the token and word-start data start in their files."""
    part_dir: str
    key: str            # the arrays' split name: train, validation or cda
    seps: np.ndarray    # int64, one per non-empty document
    ids_at: tuple[int, str]     # (byte offset of the data in <key>.ids.npy, dtype)
    ws_at: tuple[int, str]

    @classmethod
    def read(cls, part_dir: str, key: str) -> "Source":
        base = Path(part_dir)
        lens = np.load(base / f"{key}.lens.npy", allow_pickle=False)
        lens = lens[lens > 0]
        return cls(part_dir, key, np.cumsum(lens + 1) - 1, _data_at(base / f"{key}.ids.npy"),
                   _data_at(base / f"{key}.word_start.npy"))

    @property
    def size(self) -> int:
        """Stream positions: every token and one [SEP] per non-empty document."""
        return int(self.seps[-1]) + 1 if len(self.seps) else 0

    def take(self, which: str, start: int, n: int) -> np.ndarray:
        """Elements [start, start + n) of the ids or word-start array, read (not mapped) from its file."""
        off, dt = self.ids_at if which == "ids" else self.ws_at
        dt = np.dtype(dt)
        return np.fromfile(Path(self.part_dir) / f"{self.key}.{which}.npy", dtype=dt, count=n,
                           offset=off + start * dt.itemsize)


def _data_at(path: Path) -> tuple[int, str]:
    """Where a C-order 1-d .npy file's data starts, and its dtype (header only)."""
    from numpy.lib import format as npf
    with open(path, "rb") as f:
        version = npf.read_magic(f)
        shape, fortran, dtype = (npf.read_array_header_1_0 if version == (1, 0) else npf.read_array_header_2_0)(f)
        if fortran or len(shape) != 1 or dtype.hasobject:
            raise StageError(f"shards: {path}: not a 1-d C-order numeric array (shape {shape})")
        return f.tell(), dtype.str


@dataclass(frozen=True)
class Piece:
    """Positions [lo, hi) of one source's stream."""
    src: Source
    lo: int
    hi: int


@dataclass(frozen=True)
class FileJob:
    """One output file: stream positions [start, stop) of (split, lang), padded to whole rows."""
    split: str
    lang: str
    index: int
    start: int
    stop: int
    rows: int
    pieces: tuple[Piece, ...]


def plan_stream(split: str, lang: str, sources: list[tuple[str, str]], width: int, rows_per_shard: int,
                read: dict | None = None) -> tuple[list[FileJob], dict]:
    """The files of one (split, lang) stream made of ``sources`` (partition folder, array key) in order, and
    its totals (docs, tokens, content_tokens, rows: as ``pack.StreamStats`` counts them). ``read``: sources
    already read, by (folder, key) (a folder listed twice is read once)."""
    read = {} if read is None else read
    srcs = []
    for d, key in sources:
        if (d, key) not in read:
            read[(d, key)] = Source.read(d, key)
        srcs.append(read[(d, key)])
    sizes = [s.size for s in srcs]
    docs = sum(len(s.seps) for s in srcs)
    content = sum(sizes) - docs
    ends = np.cumsum(np.asarray(sizes, np.int64)).tolist()
    total = ends[-1] if ends else 0
    rows = -(-total // width)
    per_file = rows_per_shard * width
    jobs = []
    for k in range(-(-rows // rows_per_shard)):
        a, b = k * per_file, min((k + 1) * per_file, total)
        pieces = []
        for src, size, end in zip(srcs, sizes, ends):
            s0 = end - size
            lo, hi = max(a, s0), min(b, end)
            if hi > lo:
                pieces.append(Piece(src, lo - s0, hi - s0))
        jobs.append(FileJob(split, lang, k, a, b, min(rows_per_shard, rows - k * rows_per_shard), tuple(pieces)))
    return jobs, {"docs": docs, "tokens": total + rows, "content_tokens": content, "rows": rows}


def _piece_stream(p: Piece, sep: int, ids_out: np.ndarray, ws_out: np.ndarray) -> np.ndarray:
    """Fill ``ids_out``/``ws_out`` (length hi - lo) with positions [lo, hi) of the piece's stream; returns the
    content token ids it placed (for the [SEP]/[PAD] check)."""
    seps = p.src.seps
    i0, i1 = np.searchsorted(seps, [p.lo, p.hi])       # the [SEP]s in [lo, hi); i0 of them lie before lo
    c0 = p.lo - int(i0)                                # content tokens before lo
    nc = (p.hi - p.lo) - int(i1 - i0)
    ids, ws = p.src.take("ids", c0, nc), p.src.take("word_start", c0, nc)
    if len(ids) != nc or len(ws) != nc:
        raise StageError(f"shards: {p.src.part_dir}: {p.src.key} arrays shorter than their document lengths say")
    at = seps[i0:i1] - p.lo
    if not len(at):
        ids_out[:] = ids
        ws_out[:] = ws
        return ids
    ids_out[at] = sep
    ws_out[at] = 0
    is_tok = np.ones(len(ids_out), bool)
    is_tok[at] = False
    ids_out[is_tok] = ids
    ws_out[is_tok] = ws
    return ids


def write_file(job: FileJob, out_dir: Path, layout: Layout, cls_id: int) -> dict:
    """Write one output file of the plan; its shard record (as ``pack.ShardWriter`` writes it)."""
    width, seq_len = layout.seq_len - 1, layout.seq_len
    n = job.rows * width
    real = job.stop - job.start
    stream = np.full(n, layout.pad, layout.ids)
    ws = np.zeros(n, np.uint8)
    at = 0
    for p in job.pieces:
        m = p.hi - p.lo
        content = _piece_stream(p, layout.sep, stream[at:at + m], ws[at:at + m])
        if len(content) and ((content == layout.sep).any() or (content == layout.pad).any()):
            raise StageError(f"shards: {job.split}/{job.lang}: a document encodes to the [SEP] or [PAD] id "
                             f"({layout.sep}/{layout.pad}) inside its text; the tokenizer must encode special-token "
                             "strings as text (encode_special_tokens)")
        at += m
    if at != real:
        raise StageError(f"shards: {job.split}/{job.lang} file {job.index}: the partitions hold {at} positions "
                         f"of its stream, the plan {real}")
    chunk, cws = stream.reshape(job.rows, width), ws.reshape(job.rows, width)
    out_ids = np.empty((job.rows, seq_len), layout.ids)
    out_ids[:, 0] = cls_id
    out_ids[:, 1:] = chunk
    out_ws = np.zeros((job.rows, seq_len), np.uint8)
    out_ws[:, 1:] = cws
    out_ws[:, 1] |= chunk[:, 0] != layout.sep          # a row continuing a document starts a word
    rel = shard_name(job.split, job.lang, job.index)
    path = Path(out_dir) / rel
    write_rows(path, layout, out_ids, out_ws)
    return {"file": rel, "lang": job.lang, "split": job.split, "rows": int(job.rows),
            "tokens": int((out_ids != layout.pad).sum()), "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def plan_streams(langs: list[str], dirs_of: dict[str, list[str]], cda_langs: set[str], layout: Layout,
                 rows_per_shard: int) -> tuple[list[FileJob], dict[str, dict]]:
    """Every output file, in manifest order (language, split, number), and per language the stats fields
    (``docs_train``, ``tokens_train``, ...)."""
    jobs, per_lang, read = [], {}, {}
    for lang in langs:
        st = {}
        for split in SPLITS:
            src = [(d, split) for d in dirs_of[lang]]
            if split == "train" and lang in cda_langs:     # CDA copies after every original document
                src += [(d, "cda") for d in dirs_of[lang]]
            js, st[split] = plan_stream(split, lang, src, layout.seq_len - 1, rows_per_shard, read)
            jobs.extend(js)
        per_lang[lang] = {f"{k}_{split}": st[split][k] for split in SPLITS
                          for k in ("docs", "tokens", "content_tokens", "rows")}
    return jobs, per_lang


def write_files(jobs: list[FileJob], out_dir: Path, layout: Layout, cls_id: int, workers: int) -> list[dict]:
    """The map: every file written independently, ``workers`` threads at a time (numpy, the reads, the Arrow
    write and sha256 release the GIL); records in ``jobs`` order. (A forkserver process pool was tried: its
    ~1 s start on the 2-core machine cost more than a whole 150 MB merge.)"""
    n = min(workers, len(jobs))
    if n <= 1:
        return [write_file(j, out_dir, layout, cls_id) for j in jobs]
    with ThreadPoolExecutor(n) as ex:
        return list(ex.map(write_file, jobs, repeat(Path(out_dir)), repeat(layout), repeat(cls_id)))


__all__ = ["FileJob", "Piece", "Source", "plan_stream", "plan_streams", "write_file", "write_files"]
