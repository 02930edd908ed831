"""The normalize stage: raw sources -> clean, deduplicated Parquet per language + quarantine + statistics.

In: ``sources`` and ``normalize`` config sections. Out (under the stage folder):
  docs/<lang>.parquet   doc_id, lang, text, n_chars, hash      (doc_id = file << 32 | row: stable, sortable)
  quarantine.parquet    lang, source, line, reason, detail       (line: 1-based line, or 0-based row for Parquet/datasets)
  stats.parquet         per language: records, docs, chars, bytes, duplicates, quarantined, blank_lines
  quarantine_stats.parquet  per language and reason: n
  docs_sample.parquet   a uniform random sample (bottom-k by a hash of doc_id) of <= 10,000 kept documents,
                        drawn while writing, so validating a 1 GB corpus reads a 10k-row file
Invariant (checked): records = docs + quarantined + duplicates, per language.

A partitioned stage (``mlm_core.partitions``; the plan/process/merge object is ``partitioned.STAGE``).
Three passes, each streaming: (1) ``process``: each partition (a file, or a byte range / row groups of
one, ``execution.partition_mb``) is cleaned into its own folder: one Parquet part with a content hash
(DuckDB md5) + its quarantine; (2) ``merge``: DuckDB ranks the (doc_id, hash) columns of every part only,
to find duplicates (the first occurrence in source order is kept); (3) parts are copied per language in
source order minus the duplicates. Memory stays flat: one block per worker, plus the hash column during
ranking (DuckDB spills beyond ``memory_limit_mb``).

The output does not depend on the partitioning: doc ids are numbered by file and row within the file,
and each file's documents are written in row groups of ``WRITE_ROWS`` rows of the file before dedup
(what a file in one partition always gave), whichever partitions they came from.
"""
from __future__ import annotations

import logging
import shutil
import threading
from collections import Counter
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from mlm_core.errors import StageError
from mlm_core.normalize.readers import PREVIEW, Partition, iter_partition, plan_partitions
from mlm_core.normalize.text import clean, filter_reasons, is_blank

log = logging.getLogger(__name__)
ROW_BITS = 32
ROW_MASK = (1 << ROW_BITS) - 1
WRITE_ROWS = 65_536    # rows of a file per batch copied to docs/<lang>.parquet (before dedup): one row group
PARALLEL_MIN_BYTES = 16 * 2**20   # less input than this per worker: process partitions in-process
SAMPLE_ROWS = 10_000   # docs_sample.parquet: a uniform sample of kept documents, for the data contract

DOC_SCHEMA = pa.schema([("doc_id", pa.int64()), ("lang", pa.string()), ("text", pa.string()),
                        ("n_chars", pa.int32()), ("hash", pa.string())])
QUAR_SCHEMA = pa.schema([("part", pa.int32()), ("row", pa.int64()), ("lang", pa.string()), ("source", pa.string()),
                         ("reason", pa.string()), ("detail", pa.string())])


class NormalizeError(StageError):
    """The normalize output is unusable (quarantine rate above the limit, a language left empty)."""


_DB: duckdb.DuckDBPyConnection | None = None
_DB_LOCK = threading.Lock()


def shared_db() -> duckdb.DuckDBPyConnection:
    """This process's one DuckDB database: partitions take cursors on it (a cursor costs ~0 s; a new database
    ~35 ms each, a fixed cost that showed at 10 MB). Each partition's md5 query runs on its own thread."""
    global _DB
    with _DB_LOCK:
        if _DB is None:
            _DB = duckdb.connect()
            _DB.execute("SET threads=1")
        return _DB


def process_partition(part: Partition, cfg, scripts: list[str], out_dir: Path) -> dict:
    """Clean one partition into ``out_dir``: docs.parquet (doc_id = partition << 32 | local row, with md5 hashes;
    renumbered by file at merge) and quar.parquet. Returns its counts."""
    con = shared_db().cursor()
    docs_path = Path(out_dir) / "docs.parquet"
    writer = None
    q_rows: list[tuple] = []
    records = blank = kept = 0
    next_row = 0
    reasons: Counter = Counter()
    for b in iter_partition(part, cfg.max_line_bytes):
        next_row = max(next_row, b.next_row)
        blank += b.blank
        for row, reason, detail in b.rejected:
            q_rows.append((row, reason, detail[:PREVIEW]))
            reasons[reason] += 1
        records += len(b.rejected)
        if not len(b.texts):
            continue
        texts, rows = b.texts, b.rows
        if part.fmt == "text":
            nb = is_blank(texts)
            blank += int(nb.sum())
            if nb.any():
                texts, rows = texts.filter(pa.array(~nb)), rows[~nb]
        records += len(texts)
        cleaned = clean(texts, cfg.unicode_form, cfg.lowercase)
        n_chars = pa.compute.utf8_length(cleaned).to_numpy(zero_copy_only=False)
        why = filter_reasons(cleaned, n_chars, cfg, scripts)
        bad = np.flatnonzero(why != "")
        if len(bad):
            previews = cleaned.take(pa.array(bad)).to_pylist()
            for i, pv in zip(bad.tolist(), previews):
                q_rows.append((int(rows[i]), why[i], f"{n_chars[i]} chars: {pv[:PREVIEW]}"))
                reasons[why[i]] += 1
        keep = why == ""
        if not keep.any():
            continue
        ids = (np.int64(part.index) << ROW_BITS) | rows[keep]
        tbl = pa.table({"doc_id": pa.array(ids, pa.int64()), "lang": pa.array([part.lang] * int(keep.sum())),
                        "text": cleaned.filter(pa.array(keep)), "n_chars": pa.array(n_chars[keep], pa.int32())})
        tbl = con.sql("SELECT doc_id, lang, text, n_chars, md5(text) AS hash FROM tbl").to_arrow_table().cast(DOC_SCHEMA)
        if writer is None:
            writer = pq.ParquetWriter(docs_path, DOC_SCHEMA, compression="none")  # temporary part: speed over size
        writer.write_table(tbl)
        kept += len(tbl)
    if writer is not None:
        writer.close()
    q = pa.table({"part": pa.array([part.index] * len(q_rows), pa.int32()),
                  "row": pa.array([r[0] for r in q_rows], pa.int64()),
                  "lang": pa.array([part.lang] * len(q_rows), pa.string()),
                  "source": pa.array([part.source] * len(q_rows), pa.string()),
                  "reason": pa.array([r[1] for r in q_rows], pa.string()),
                  "detail": pa.array([r[2] for r in q_rows], pa.string())}, schema=QUAR_SCHEMA)
    if len(q):
        pq.write_table(q, Path(out_dir) / "quar.parquet")
    return {"index": part.index, "lang": part.lang, "source": part.source, "fmt": part.fmt,
            "records": records, "kept": kept, "blank": blank, "rows": next_row,
            "row_offset": part.row_offset, "quarantined": dict(reasons)}


def plan(lc) -> list[Partition]:
    """Every language's sources as partitions (``execution.partition_mb``, or ``auto``: sized from the
    sources' total bytes, ``mlm_core.partition_size``), in source order."""
    from mlm_core.partition_size import partition_bytes
    cfg = lc.config
    size = partition_bytes(lc, _source_bytes(lc), cfg.normalize.workers)
    parts: list[Partition] = []
    for lang in cfg.languages:
        parts += plan_partitions(lang, cfg.sources[lang], lc.base_dir, size, len(parts))
    return parts


def _source_bytes(lc) -> int:
    """The sources' file sizes summed (a ``datasets`` source counts 0: its size is unknown before reading)."""
    from mlm_core.normalize.readers import expand_paths
    total = 0
    for lang in lc.config.languages:
        src = lc.config.sources[lang]
        if src.dataset is None:
            total += sum(Path(p).stat().st_size for p in expand_paths(list(src.paths), lc.base_dir, f"sources.{lang}"))
    return total


def file_indexes(parts: list[Partition]) -> dict[str, int]:
    """Source -> its index in source order (doc ids are numbered by file, not by partition)."""
    out: dict[str, int] = {}
    for p in parts:
        out.setdefault(p.source, len(out))
    return out


def input_fingerprint(lc) -> list:
    """What identifies the raw inputs: every file's path, size and content sha256 (not its mtime: the same
    bytes copied or re-synced keep the fingerprint; not how they are partitioned: the output does not depend
    on it). Digests are cached per file under ``<workdir>/.cache`` while size, mtime and inode hold."""
    from mlm_core.external import cache_dir, file_hash
    out = []
    for p in plan(lc):
        if p.fmt == "dataset":
            out.append([p.source, p.dataset])
        elif not out or out[-1][0] != p.source:
            out.append([p.source, Path(p.source).stat().st_size, file_hash(p.source, cache_dir(lc))])
    return out


def run_normalize(lc, out_dir: Path, mapper=None) -> dict:
    """Run the stage into ``out_dir`` outside the store (its partitions in ``out_dir/_parts``, then removed)."""
    from mlm_core.partitions import run_partitioned
    try:
        return run_partitioned("normalize", lc, {}, out_dir, "direct", mapper, root=out_dir / "_parts",
                               target="mlm_core.normalize.partitioned:STAGE")
    finally:
        shutil.rmtree(out_dir / "_parts", ignore_errors=True)


def merge(lc, parts: list[Partition], results: list[dict], part_dirs: list[Path], out_dir: Path) -> dict:
    """Dedup and statistics over the partition folders (DuckDB), docs per language, quarantine; the manifest."""
    cfg = lc.config.normalize
    # Line numbers: a text/JSONL partition only knows its local rows; add the rows of earlier partitions of its file.
    offsets, seen = {}, Counter()
    for r in sorted(results, key=lambda r: r["index"]):
        offsets[r["index"]] = r["row_offset"] if r["fmt"] in ("parquet", "dataset") else seen[r["source"]]
        seen[r["source"]] += r["rows"]
    empty_files = sorted({r["source"] for r in results if r["fmt"] != "dataset"} -
                         {r["source"] for r in results if r["rows"] > 0})
    for f in empty_files:
        log.warning("normalize: %s is empty", f)

    docs_files = {p.index: d / "docs.parquet" for p, d in zip(parts, part_dirs) if (d / "docs.parquet").exists()}
    quar_files = [str(d / "quar.parquet") for d in part_dirs if (d / "quar.parquet").exists()]
    con = shared_db().cursor()
    con.execute(f"SET memory_limit='{cfg.memory_limit_mb}MB'; SET threads={cfg.workers}; "
                f"SET temp_directory='{out_dir / '_duck'}'; SET preserve_insertion_order=true")
    try:
        dups = _find_duplicates(con, list(docs_files.values())) if (cfg.dedup and docs_files) else {}
        docs_dir = out_dir / "docs"
        docs_dir.mkdir()
        lang_stats = _write_docs(parts, docs_files, docs_dir, dups, lc.config.languages, offsets)
        _write_quarantine(con, quar_files, out_dir, offsets)
    finally:
        con.execute("SET threads=1")     # partitions run on this database next (one thread each)
    per_lang = {}
    for lang in lc.config.languages:
        rs = [r for r in results if r["lang"] == lang]
        q = Counter()
        for r in rs:
            q.update(r["quarantined"])
        s = lang_stats[lang]
        per_lang[lang] = {"records": sum(r["records"] for r in rs), "docs": s["docs"], "chars": s["chars"],
                          "bytes": s["bytes"], "duplicates": s["duplicates"], "quarantined": sum(q.values()),
                          "blank_lines": sum(r["blank"] for r in rs), "quarantine_reasons": dict(sorted(q.items()))}
        p = per_lang[lang]
        if p["records"] != p["docs"] + p["quarantined"] + p["duplicates"]:
            raise NormalizeError(f"internal error: {lang}: records {p['records']} != docs {p['docs']} + "
                                 f"quarantined {p['quarantined']} + duplicates {p['duplicates']}")
    _write_stats(per_lang, out_dir)
    shutil.rmtree(out_dir / "_duck", ignore_errors=True)

    totals = {k: sum(p[k] for p in per_lang.values()) for k in ("records", "docs", "chars", "bytes", "duplicates",
                                                               "quarantined", "blank_lines")}
    rate = totals["quarantined"] / max(totals["records"], 1)
    if rate > cfg.max_quarantine_rate:
        raise NormalizeError(_quarantine_report(results, rate, cfg.max_quarantine_rate, out_dir))
    zero = [lang for lang, p in per_lang.items() if p["docs"] == 0]
    if zero:
        raise NormalizeError(f"no documents left after normalization for language(s) {', '.join(zero)} "
                             f"(empty files: {empty_files or 'none'}; see quarantine.parquet in the kept output)")
    return {"counts": totals, "languages": per_lang, "quarantine_rate": rate, "empty_files": empty_files,
            "partitions": len(parts)}


def _find_duplicates(con, files: list[Path]) -> dict[int, np.ndarray]:
    """doc_ids of every occurrence of a hash after its first (in doc_id order = source order), by partition."""
    listing = "[" + ", ".join(f"'{f}'" for f in files) + "]"
    tbl = con.sql(f"""
        SELECT doc_id FROM (
          SELECT doc_id, row_number() OVER (PARTITION BY hash ORDER BY doc_id) AS rn
          FROM read_parquet({listing}))
        WHERE rn > 1""").to_arrow_table()
    ids = tbl.column("doc_id").to_numpy()
    parts = ids >> ROW_BITS
    return {int(p): np.sort(ids[parts == p]) for p in np.unique(parts)}


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: a uniform-looking 64-bit key per doc_id (for an unbiased bottom-k sample)."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class _BottomK:
    """A uniform sample of at most k rows of a stream: the k rows with the smallest hash keys (bottom-k)."""

    def __init__(self, k: int):
        self.k, self.keys, self.tables = k, np.empty(0, np.uint64), []

    def add(self, batch: pa.RecordBatch) -> None:
        keys = _mix64(batch.column("doc_id").to_numpy())
        if len(self.keys) >= self.k and keys.min() >= self.keys.max():
            return
        tbl = pa.Table.from_batches([batch])
        allk = np.concatenate([self.keys, keys])
        merged = pa.concat_tables(self.tables + [tbl]) if self.tables else tbl
        if len(allk) > self.k:
            keep = np.sort(np.argpartition(allk, self.k - 1)[: self.k])
            allk, merged = allk[keep], merged.take(pa.array(keep))
        self.keys, self.tables = allk, [merged.combine_chunks()]

    def table(self) -> pa.Table:
        return self.tables[0] if self.tables else DOC_SCHEMA.empty_table()


def _file_batches(parts: list[Partition], docs_files: dict[int, Path], offsets: dict, fidx: dict[str, int]):
    """Each file's documents (before dedup) in batches of WRITE_ROWS rows of that file, whichever partitions
    they come from, with doc_id renumbered file << 32 | row in file. Yields (batch, old partition-local ids)."""
    def renumbered(p: Partition):
        f = docs_files.get(p.index)
        if f is None:
            return
        base = (np.int64(fidx[p.source]) << ROW_BITS) + np.int64(offsets[p.index])
        for b in pq.ParquetFile(f).iter_batches(batch_size=WRITE_ROWS):
            old = b.column("doc_id").to_numpy()
            new = base + (old & ROW_MASK)
            yield pa.RecordBatch.from_arrays([pa.array(new, pa.int64()), *b.columns[1:]], schema=DOC_SCHEMA), old

    by_file: dict[str, list[Partition]] = {}
    for p in parts:
        by_file.setdefault(p.source, []).append(p)
    for ps in by_file.values():
        pending: list[tuple[pa.RecordBatch, np.ndarray]] = []
        n = 0
        for p in ps:
            for b, old in renumbered(p):
                pending.append((b, old))
                n += b.num_rows
                while n >= WRITE_ROWS:
                    yield _take_rows(pending, WRITE_ROWS)
                    n -= WRITE_ROWS
        if n:
            yield _take_rows(pending, n)


def _take_rows(pending: list, k: int) -> tuple[pa.RecordBatch, np.ndarray]:
    """The first ``k`` rows of the pending (batch, old ids) list, removed from it, as one batch."""
    got, olds, need = [], [], k
    while need:
        b, old = pending[0]
        if b.num_rows <= need:
            got.append(b)
            olds.append(old)
            need -= b.num_rows
            pending.pop(0)
        else:
            got.append(b.slice(0, need))
            olds.append(old[:need])
            pending[0] = (b.slice(need), old[need:])
            need = 0
    if len(got) == 1:
        return got[0], olds[0]
    tbl = pa.Table.from_batches(got).combine_chunks()
    return tbl.to_batches()[0], np.concatenate(olds)


def _write_docs(parts, docs_files: dict[int, Path], docs_dir: Path, dups: dict, languages: list[str],
                offsets: dict) -> dict:
    stats = {}
    sample = _BottomK(SAMPLE_ROWS)
    fidx = file_indexes(parts)
    drop = np.sort(np.concatenate(list(dups.values()))) if dups else np.empty(0, np.int64)
    for lang in languages:
        writer = pq.ParquetWriter(docs_dir / f"{lang}.parquet", DOC_SCHEMA, compression="zstd")
        docs = chars = nbytes = ndup = 0
        for batch, old in _file_batches([p for p in parts if p.lang == lang], docs_files, offsets, fidx):
            lo, hi = np.searchsorted(drop, [old.min(), old.max()], side="left") if len(old) else (0, 0)
            near = drop[lo:hi + 1]           # the duplicates within this batch's id range (sorted drop list)
            if len(near):
                mask = ~np.isin(old, near, assume_unique=True)
                ndup += int((~mask).sum())
                if not mask.all():
                    batch = batch.filter(pa.array(mask))
            if not batch.num_rows:
                continue
            writer.write_batch(batch)
            sample.add(batch)
            docs += batch.num_rows
            chars += int(pa.compute.sum(batch.column("n_chars")).as_py() or 0)
            nbytes += int(pa.compute.sum(pa.compute.binary_length(batch.column("text"))).as_py() or 0)
        writer.close()
        stats[lang] = {"docs": docs, "chars": chars, "bytes": nbytes, "duplicates": ndup}
    pq.write_table(sample.table(), docs_dir.parent / "docs_sample.parquet")
    return stats


def _write_quarantine(con, files: list[str], out_dir: Path, offsets: dict) -> None:
    dest = out_dir / "quarantine.parquet"
    if not files:
        pq.write_table(pa.table({"lang": pa.array([], pa.string()), "source": pa.array([], pa.string()),
                                 "line": pa.array([], pa.int64()), "reason": pa.array([], pa.string()),
                                 "detail": pa.array([], pa.string())}), dest)
        return
    off = pa.table({"part": pa.array(list(offsets), pa.int32()), "off": pa.array(list(offsets.values()), pa.int64())})
    con.register("off_tbl", off)
    listing = "[" + ", ".join(f"'{f}'" for f in files) + "]"
    # text/JSONL lines are 1-based; Parquet/datasets rows stay 0-based row numbers.
    con.execute(f"""COPY (
        SELECT q.lang, q.source, q.row + o.off + CASE WHEN q.source LIKE 'datasets:%' OR q.source LIKE '%.parquet'
                                                      THEN 0 ELSE 1 END AS line,
               q.reason, q.detail
        FROM read_parquet({listing}) q JOIN off_tbl o USING (part) ORDER BY q.part, q.row)
        TO '{dest}' (FORMAT parquet, COMPRESSION zstd)""")


def _write_stats(per_lang: dict, out_dir: Path) -> None:
    rows = [{"lang": lang, **{k: v for k, v in p.items() if k != "quarantine_reasons"}} for lang, p in per_lang.items()]
    pq.write_table(pa.Table.from_pylist(rows), out_dir / "stats.parquet")
    qrows = [{"lang": lang, "reason": r, "n": n} for lang, p in per_lang.items()
             for r, n in p["quarantine_reasons"].items()]
    schema = pa.schema([("lang", pa.string()), ("reason", pa.string()), ("n", pa.int64())])
    pq.write_table(pa.Table.from_pylist(qrows, schema=schema), out_dir / "quarantine_stats.parquet")


def _quarantine_report(results: list[dict], rate: float, limit: float, out_dir: Path) -> str:
    by_file: dict[str, list[int]] = {}
    for r in results:
        q = sum(r["quarantined"].values())
        acc = by_file.setdefault(r["source"], [0, 0, Counter()])
        acc[0] += q
        acc[1] += r["records"]
        acc[2].update(r["quarantined"])
    worst = sorted(by_file.items(), key=lambda kv: kv[1][0], reverse=True)[:5]
    lines = [f"  {src}: {q}/{n} quarantined ({q / max(n, 1):.1%}); reasons: {dict(c.most_common(3))}"
             for src, (q, n, c) in worst if q]
    return (f"quarantine rate {rate:.2%} exceeds normalize.max_quarantine_rate={limit:.2%}; worst files:\n"
            + "\n".join(lines) + "\n(every quarantined record, with its reason: quarantine.parquet in the kept output)")
