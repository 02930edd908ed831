"""Streaming readers: a language's sources -> partitions -> batches of raw records.

A partition is an independent unit of work (a byte range of a text/JSONL file aligned to line
starts, a range of Parquet row groups, a whole gzip file, or a `datasets` stream), so a later
executor can fan partitions out to a cluster. Readers never hold more than one block of a file in
memory; a line longer than ``max_line_bytes`` is skipped while streaming and reported.

Each batch is a ``RawBatch``: the decoded texts with their row numbers local to the partition, plus
the records rejected while reading (invalid UTF-8, malformed JSON, missing field...) with a reason.
"""
from __future__ import annotations

import glob
import gzip
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa

from mlm_core.errors import SourceError

BLOCK = 8 * 2**20
BATCH_ROWS = 65_536
PREVIEW = 200



@dataclass(frozen=True)
class Partition:
    index: int
    lang: str
    source: str            # file path, or "datasets:<name>/<config>/<split>"
    fmt: str               # text | jsonl | parquet | dataset
    start: int = 0         # byte offset (text/jsonl) or first row group (parquet)
    end: int = -1          # byte end (exclusive) or row group end; -1 = to the end
    row_offset: int = 0    # rows before this partition in the same source (parquet; text/jsonl fixed up later)
    text_field: str = "text"
    dataset: dict | None = None


@dataclass
class RawBatch:
    rows: np.ndarray                     # int64 row numbers local to the partition (0-based)
    texts: pa.Array                      # string
    rejected: list[tuple[int, str, str]] = field(default_factory=list)   # (row, reason, preview)
    next_row: int = 0                    # rows consumed in the partition after this batch
    blank: int = 0                       # blank lines in this batch (not records)


def _fmt_of(path: str, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    name = path[:-3] if path.endswith(".gz") else path
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"


def expand_paths(patterns: list[str], base_dir: Path, key: str) -> list[str]:
    """Expand globs relative to ``base_dir``; a pattern matching nothing is an error naming the key."""
    files: list[str] = []
    for i, pat in enumerate(patterns):
        p = Path(pat).expanduser()
        full = str(p if p.is_absolute() else base_dir / p)
        if glob.has_magic(full):
            hits = sorted(h for h in glob.glob(full, recursive=True) if Path(h).is_file())
            if not hits:
                raise SourceError(f"{key}.paths[{i}]: no file matches {full!r}")
            files += hits
        elif not Path(full).is_file():
            raise SourceError(f"{key}.paths[{i}]: file not found: {full}")
        else:
            files.append(full)
    return files


def _line_aligned(f, pos: int) -> int:
    """First line start at or after ``pos`` (scanning forward to the next newline)."""
    if pos == 0:
        return 0
    f.seek(pos - 1)
    while chunk := f.read(BLOCK):
        i = chunk.find(b"\n")
        if i >= 0:
            return f.tell() - len(chunk) + i + 1
    return f.tell()


def plan_partitions(lang: str, src, base_dir: Path, partition_bytes: int, first_index: int = 0) -> list[Partition]:
    """Split one language's source into partitions (deterministic: sorted files, fixed byte ranges)."""
    key = f"sources.{lang}"
    if src.dataset is not None:
        d = src.dataset
        ds = {"name": d.name, "config": d.config, "split": d.split, "revision": d.revision,
              "max_records": d.max_records,
              "data_files": [str(base_dir / f) if not Path(f).is_absolute() else f for f in d.data_files]
              if d.data_files else None}
        return [Partition(first_index, lang, f"datasets:{d.name}/{d.config or 'default'}/{d.split}", "dataset",
                          text_field=src.text_field, dataset=ds)]
    parts: list[Partition] = []
    for path in expand_paths(list(src.paths), base_dir, key):
        fmt = _fmt_of(path, src.format)
        idx = first_index + len(parts)
        if fmt == "parquet":
            import pyarrow.parquet as pq
            try:
                pf = pq.ParquetFile(path)
            except Exception as exc:
                raise SourceError(f"{path}: not a readable Parquet file ({exc})") from exc
            if src.text_field not in pf.schema_arrow.names:
                raise SourceError(f"{path}: no column {src.text_field!r} (columns: {', '.join(pf.schema_arrow.names)}); "
                                  f"set {key}.text_field")
            rows, group_start, acc = 0, 0, 0
            md = pf.metadata
            for g in range(md.num_row_groups):
                acc += md.row_group(g).total_byte_size
                if acc >= partition_bytes or g == md.num_row_groups - 1:
                    parts.append(Partition(first_index + len(parts), lang, path, fmt, group_start, g + 1, rows,
                                           src.text_field))
                    rows += sum(md.row_group(k).num_rows for k in range(group_start, g + 1))
                    group_start, acc = g + 1, 0
            if md.num_row_groups == 0:
                parts.append(Partition(idx, lang, path, fmt, 0, 0, 0, src.text_field))
        elif path.endswith(".gz"):
            parts.append(Partition(idx, lang, path, fmt, 0, -1, 0, src.text_field))
        else:
            size = Path(path).stat().st_size
            bounds = [0]
            with open(path, "rb") as f:
                while bounds[-1] + partition_bytes < size:
                    nxt = _line_aligned(f, bounds[-1] + partition_bytes)
                    if nxt >= size:
                        break
                    bounds.append(nxt)
            bounds.append(size)
            for a, b in zip(bounds, bounds[1:]):
                parts.append(Partition(first_index + len(parts), lang, path, fmt, a, b, 0, src.text_field))
            if size == 0:
                parts.append(Partition(idx, lang, path, fmt, 0, 0, 0, src.text_field))
    return parts


# ---------------------------------------------------------------- line splitting
def _split_lines(buf: bytes) -> pa.Array:
    """Zero-copy split of a buffer ending in b'\\n' into a binary array (each element keeps its '\\n')."""
    a = np.frombuffer(buf, dtype=np.uint8)
    nl = np.flatnonzero(a == 10)
    offsets = np.empty(len(nl) + 1, dtype=np.int32)
    offsets[0] = 0
    offsets[1:] = nl + 1
    return pa.Array.from_buffers(pa.binary(), len(nl), [None, pa.py_buffer(offsets), pa.py_buffer(buf)])


def _decode(lines: pa.Array, first_row: int) -> RawBatch:
    """Binary lines -> strings; rows with invalid UTF-8 are rejected (the fast path validates in one call)."""
    rows = np.arange(first_row, first_row + len(lines), dtype=np.int64)
    nxt = first_row + len(lines)
    try:
        return RawBatch(rows, lines.cast(pa.string()), next_row=nxt)
    except pa.ArrowInvalid:
        good_rows, good, rejected = [], [], []
        for r, b in zip(rows.tolist(), lines.to_pylist()):
            try:
                good.append(b.decode("utf-8"))
                good_rows.append(r)
            except UnicodeDecodeError as exc:
                rejected.append((r, "invalid_utf8", f"byte {exc.start}: " + b.decode("utf-8", "replace")[:PREVIEW]))
        return RawBatch(np.array(good_rows, dtype=np.int64), pa.array(good, pa.string()), rejected, nxt)


def _iter_line_batches(f, length: int, max_line: int) -> Iterator[RawBatch]:
    """Stream ``length`` bytes (-1: to EOF) of an open binary file as decoded line batches."""
    row, carry, skipping, remaining = 0, b"", False, length
    while remaining != 0:
        data = f.read(BLOCK if remaining < 0 else min(BLOCK, remaining))
        if not data:
            break
        if remaining > 0:
            remaining -= len(data)
        if skipping:
            i = data.find(b"\n")
            if i < 0:
                continue
            yield RawBatch(np.empty(0, np.int64), pa.array([], pa.string()),
                           [(row, "line_too_long", f"more than {max_line} bytes")], row + 1)
            row, skipping, data = row + 1, False, data[i + 1:]
        buf = carry + data if carry else data
        last = buf.rfind(b"\n")
        if last < 0:
            carry = buf
        else:
            lines = _split_lines(buf[:last + 1])
            carry = buf[last + 1:]
            for s in range(0, len(lines), BATCH_ROWS):
                chunk = lines.slice(s, BATCH_ROWS)
                yield _decode(chunk, row)
                row += len(chunk)
        if len(carry) > max_line:
            carry, skipping = b"", True
    if skipping:
        yield RawBatch(np.empty(0, np.int64), pa.array([], pa.string()),
                       [(row, "line_too_long", f"more than {max_line} bytes")], row + 1)
    elif carry:
        yield _decode(pa.array([carry], pa.binary()), row)


class _TruncatedGzip(Exception):
    pass


class _GzipReader:
    """gzip stream whose read() turns a truncated/corrupt stream into _TruncatedGzip after the good data."""

    def __init__(self, path: str):
        self._f = gzip.open(path, "rb")
        self._error: Exception | None = None

    def read(self, n: int) -> bytes:
        """Up to n bytes; the data decompressed before a stream error is returned first, the error next call."""
        if self._error is not None:
            raise _TruncatedGzip(str(self._error)) from self._error
        out = bytearray()
        while len(out) < n:
            try:
                chunk = self._f.read1(min(2**16, n - len(out)))
            except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as exc:
                self._error = exc
                if not out:
                    raise _TruncatedGzip(str(exc)) from exc
                break
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def close(self) -> None:
        self._f.close()


def _iter_text(part: Partition, max_line: int) -> Iterator[RawBatch]:
    if part.source.endswith(".gz"):
        f = _GzipReader(part.source)
        last_row = 0
        try:
            for b in _iter_line_batches(f, -1, max_line):
                last_row = b.next_row
                yield b
        except _TruncatedGzip as exc:
            yield RawBatch(np.empty(0, np.int64), pa.array([], pa.string()),
                           [(last_row, "truncated_gzip", f"stream ends early: {exc}")], last_row + 1)
        finally:
            f.close()
        return
    with open(part.source, "rb") as f:
        f.seek(part.start)
        yield from _iter_line_batches(f, part.end - part.start, max_line)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _records_to_texts(records: list, rows: np.ndarray, field_name: str, rejected: list,
                      next_row: int, blank: int = 0) -> RawBatch:
    keep_rows, texts = [], []
    for r, rec in zip(rows.tolist(), records):
        if rec is None:
            continue
        if not isinstance(rec, dict) or field_name not in rec:
            preview = str(rec)[:PREVIEW].encode("utf-8", "backslashreplace").decode()   # lone surrogates too
            rejected.append((r, "missing_field", f"no {field_name!r} in record: " + preview))
        elif rec[field_name] is None:
            rejected.append((r, "null_text", f"{field_name!r} is null"))
        elif not isinstance(rec[field_name], str):
            rejected.append((r, "not_a_string", f"{field_name!r} is {type(rec[field_name]).__name__}"))
        else:
            keep_rows.append(r)
            texts.append(rec[field_name])
    try:
        arr = pa.array(texts, pa.string())
    except (UnicodeEncodeError, pa.ArrowException):
        # JSON's "\ud800" escape decodes to a lone surrogate, which no UTF-8 string can hold: quarantine it
        good = [i for i, t in enumerate(texts) if not _SURROGATE.search(t)]
        for i in sorted(set(range(len(texts))) - set(good)):
            m = _SURROGATE.search(texts[i])
            rejected.append((keep_rows[i], "invalid_unicode", f"lone surrogate U+{ord(m.group()):04X} at character "
                             f"{m.start()}: " + texts[i].encode("utf-8", "backslashreplace").decode()[:PREVIEW]))
        keep_rows, arr = [keep_rows[i] for i in good], pa.array([texts[i] for i in good], pa.string())
    return RawBatch(np.array(keep_rows, dtype=np.int64), arr, rejected, next_row, blank)


def _iter_jsonl(part: Partition, max_line: int) -> Iterator[RawBatch]:
    for b in _iter_text(part, max_line):
        records, rejected, blank = [], list(b.rejected), 0
        for r, line in zip(b.rows.tolist(), b.texts.to_pylist()):
            if not line.strip():
                records.append(None)     # a blank line is not a record; counted as blank
                blank += 1
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                records.append(None)
                rejected.append((r, "malformed_json", f"{exc.msg} at column {exc.colno}: {line[:PREVIEW]}"))
        yield _records_to_texts(records, b.rows, part.text_field, rejected, b.next_row, blank)


def _iter_parquet(part: Partition) -> Iterator[RawBatch]:
    import pyarrow.parquet as pq
    pf = pq.ParquetFile(part.source)
    row = 0
    groups = list(range(part.start, part.end))
    if not groups:
        return
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=[part.text_field]):
        col = batch.column(0)
        rows = np.arange(row, row + len(col), dtype=np.int64)
        row += len(col)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            raise SourceError(f"{part.source}: column {part.text_field!r} has type {col.type}, expected string")
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        rejected = [(int(r), "null_text", "") for r in rows[~valid]]
        yield RawBatch(rows[valid], col.filter(pa.array(valid)).cast(pa.string()), rejected, row)


def _iter_dataset(part: Partition) -> Iterator[RawBatch]:
    import datasets  # heavy; only for `datasets` sources
    d = part.dataset or {}
    kwargs = {"split": d["split"], "streaming": True}
    if d.get("data_files"):
        kwargs["data_files"] = d["data_files"]
    if d.get("revision"):
        kwargs["revision"] = d["revision"]
    try:
        ds = datasets.load_dataset(d["name"], d.get("config"), **kwargs)
    except Exception as exc:
        raise SourceError(f"{part.source}: cannot open dataset ({type(exc).__name__}: {exc})") from exc
    cols = ds.column_names
    if cols is not None and part.text_field not in cols:
        raise SourceError(f"{part.source}: no field {part.text_field!r} (fields: {', '.join(cols)}); "
                          f"set sources.{part.lang}.text_field")
    row, limit = 0, d.get("max_records")
    for batch in ds.iter(batch_size=10_000):
        n = len(next(iter(batch.values()))) if batch else 0
        if limit is not None:
            n = min(n, limit - row)
        records = [{part.text_field: v} for v in batch.get(part.text_field, [None] * n)[:n]]
        rejected: list = []
        for i, rec in enumerate(records):
            if rec[part.text_field] is None:
                rejected.append((row + i, "null_text", ""))
                records[i] = None
        yield _records_to_texts(records, np.arange(row, row + n, dtype=np.int64), part.text_field, rejected, row + n)
        row += n
        if limit is not None and row >= limit:
            break


def iter_partition(part: Partition, max_line_bytes: int) -> Iterator[RawBatch]:
    if part.fmt == "text":
        return _iter_text(part, max_line_bytes)
    if part.fmt == "jsonl":
        return _iter_jsonl(part, max_line_bytes)
    if part.fmt == "parquet":
        return _iter_parquet(part)
    if part.fmt == "dataset":
        return _iter_dataset(part)
    raise SourceError(f"{part.source}: unknown format {part.fmt!r}")
