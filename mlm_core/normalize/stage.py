"""The normalize stage: raw sources -> clean, deduplicated Parquet per language + quarantine + statistics.

In: ``sources`` and ``normalize`` config sections. Out (under the stage folder):
  docs/<lang>.parquet   doc_id, lang, text, n_chars, hash      (doc_id = partition << 32 | row: stable, sortable)
  quarantine.parquet    lang, source, line, reason, detail       (line: 1-based line, or 0-based row for Parquet/datasets)
  stats.parquet         per language: records, docs, chars, bytes, duplicates, quarantined, blank_lines
  quarantine_stats.parquet  per language and reason: n
  docs_sample.parquet   a uniform random sample (bottom-k by a hash of doc_id) of <= 10,000 kept documents,
                        drawn while writing, so validating a 1 GB corpus reads a 10k-row file
Invariant (checked): records = docs + quarantined + duplicates, per language.

Three passes, each streaming: (1) partitions are cleaned in parallel processes, each writing one
Parquet part with a content hash (DuckDB md5); (2) DuckDB ranks the (partition, row, hash) columns
only, to find duplicates (the first occurrence in source order is kept); (3) parts are copied per
language in source order minus the duplicates. Memory stays flat: one block per worker, plus the
hash column during ranking (DuckDB spills beyond ``memory_limit_mb``).
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import shutil
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
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
PARALLEL_MIN_BYTES = 16 * 2**20   # less input than this per worker: process partitions in-process
SAMPLE_ROWS = 10_000   # docs_sample.parquet: a uniform sample of kept documents, for the data contract

DOC_SCHEMA = pa.schema([("doc_id", pa.int64()), ("lang", pa.string()), ("text", pa.string()),
                        ("n_chars", pa.int32()), ("hash", pa.string())])
QUAR_SCHEMA = pa.schema([("part", pa.int32()), ("row", pa.int64()), ("lang", pa.string()), ("source", pa.string()),
                         ("reason", pa.string()), ("detail", pa.string())])


class NormalizeError(StageError):
    """The normalize output is unusable (quarantine rate above the limit, a language left empty)."""


def _process_partition(part: Partition, cfg_dict: dict, scripts: list[str], parts_dir: str, db=None) -> dict:
    """Worker: clean one partition, write its docs part (with md5 hashes) and its quarantine part.
    ``db``: the stage's DuckDB connection when partitions run in this process (a cursor on it costs ~0 s; a
    new database ~35 ms each, a fixed cost that showed at 10 MB); worker processes open their own."""
    from mlm_core.config import NormalizeConfig
    cfg = NormalizeConfig.model_validate(cfg_dict)
    if db is None:
        con = duckdb.connect()
        con.execute("SET threads=1")
    else:
        con = db.cursor()
    docs_path = Path(parts_dir) / f"docs-{part.index:06d}.parquet"
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
        pq.write_table(q, Path(parts_dir) / f"quar-{part.index:06d}.parquet")
    return {"index": part.index, "lang": part.lang, "source": part.source, "fmt": part.fmt,
            "records": records, "kept": kept, "blank": blank, "rows": next_row,
            "row_offset": part.row_offset, "quarantined": dict(reasons)}


def plan(lc) -> list[Partition]:
    cfg = lc.config
    parts: list[Partition] = []
    for lang in cfg.languages:
        parts += plan_partitions(lang, cfg.sources[lang], lc.base_dir, cfg.normalize.partition_mb * 2**20, len(parts))
    return parts


def input_fingerprint(lc) -> list:
    """What identifies the raw inputs without reading them: every file's path, size and mtime."""
    out = []
    for p in plan(lc):
        if p.fmt == "dataset":
            out.append([p.source, p.dataset])
        else:
            st = Path(p.source).stat()
            out.append([p.source, p.start, p.end, st.st_size, st.st_mtime_ns])
    return out


def _run_partitions(parts: list[Partition], cfg, lc, parts_dir: Path, db=None) -> list[dict]:
    """Partitions in parallel. Text and Parquet work is Arrow kernels that release the GIL, so threads
    scale without any start-up cost (measured: 2.5 s vs 2.8 s for 100 MB, equal at 1 GB, versus
    processes); JSONL parsing is Python per line (GIL-bound), so JSONL sources use worker processes,
    and only when there are tens of MB to share (a worker costs ~1 s to start)."""
    from mlm_core.progress import Progress
    args = [(p, cfg.model_dump(), lc.config.scripts_for(p.lang), str(parts_dir)) for p in parts]
    with Progress("normalize", len(parts), unit="partitions") as shown:   # display only
        def done(results) -> list[dict]:
            out = []
            for r in results:
                out.append(r)
                shown.update(advance=1, note=f"last {r['lang']} {Path(r['source']).name}")
            return out

        if cfg.workers <= 1 or len(parts) <= 1:
            return done(_process_partition(*a, db=db) for a in args)
        if not any(p.fmt in ("jsonl", "dataset") for p in parts):
            with ThreadPoolExecutor(min(cfg.workers, len(parts))) as ex:
                return done(ex.map(lambda a: _process_partition(*a, db=db), args))
        total = sum(max(p.end - p.start, 0) if p.fmt in ("text", "jsonl") and p.end >= 0 else PARALLEL_MIN_BYTES
                    for p in parts)
        workers = min(cfg.workers, len(parts), max(1, total // PARALLEL_MIN_BYTES))
        if workers <= 1:
            return done(_process_partition(*a, db=db) for a in args)
        ctx = mp.get_context("forkserver")
        with ProcessPoolExecutor(workers, mp_context=ctx) as ex:
            futs = [ex.submit(_process_partition, *a) for a in args]
            return done(f.result() for f in futs)


def run_normalize(lc, out_dir: Path) -> dict:
    """Run the stage into ``out_dir``; returns the manifest fields (counts, per-language stats)."""
    cfg = lc.config.normalize
    parts = plan(lc)
    parts_dir = out_dir / "_parts"
    parts_dir.mkdir(parents=True)
    con = duckdb.connect()              # one database for the stage: in-process partitions take cursors on it
    con.execute("SET threads=1")        # each partition's md5 query runs on its own thread
    results = _run_partitions(parts, cfg, lc, parts_dir, db=con)

    # Line numbers: a text/JSONL partition only knows its local rows; add the rows of earlier partitions of its file.
    offsets, seen = {}, Counter()
    for r in sorted(results, key=lambda r: r["index"]):
        offsets[r["index"]] = r["row_offset"] if r["fmt"] in ("parquet", "dataset") else seen[r["source"]]
        seen[r["source"]] += r["rows"]
    empty_files = sorted({r["source"] for r in results if r["fmt"] != "dataset"} -
                         {r["source"] for r in results if r["rows"] > 0})
    for f in empty_files:
        log.warning("normalize: %s is empty", f)

    con.execute(f"SET memory_limit='{cfg.memory_limit_mb}MB'; SET threads={cfg.workers}; "
                f"SET temp_directory='{out_dir / '_duck'}'; SET preserve_insertion_order=true")
    has_docs = any(parts_dir.glob("docs-*.parquet"))
    dups = _find_duplicates(con, parts_dir) if (cfg.dedup and has_docs) else {}
    docs_dir = out_dir / "docs"
    docs_dir.mkdir()
    lang_stats = _write_docs(parts, parts_dir, docs_dir, dups, lc.config.languages)
    _write_quarantine(con, parts_dir, out_dir, offsets)

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
    shutil.rmtree(parts_dir)
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


def _find_duplicates(con, parts_dir: Path) -> dict[int, np.ndarray]:
    """doc_ids of every occurrence of a hash after its first (in doc_id order = source order), by partition."""
    glob = str(parts_dir / "docs-*.parquet")
    tbl = con.sql(f"""
        SELECT doc_id FROM (
          SELECT doc_id, row_number() OVER (PARTITION BY hash ORDER BY doc_id) AS rn
          FROM read_parquet('{glob}'))
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


def _write_docs(parts, parts_dir: Path, docs_dir: Path, dups: dict, languages: list[str]) -> dict:
    stats = {}
    sample = _BottomK(SAMPLE_ROWS)
    for lang in languages:
        writer = pq.ParquetWriter(docs_dir / f"{lang}.parquet", DOC_SCHEMA, compression="zstd")
        docs = chars = nbytes = ndup = 0
        for p in (p for p in parts if p.lang == lang):
            f = parts_dir / f"docs-{p.index:06d}.parquet"
            if not f.exists():
                continue
            drop = dups.get(p.index)
            for batch in pq.ParquetFile(f).iter_batches(batch_size=65_536):
                if drop is not None and len(drop):
                    mask = ~np.isin(batch.column("doc_id").to_numpy(), drop, assume_unique=True)
                    ndup += int((~mask).sum())
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


def _write_quarantine(con, parts_dir: Path, out_dir: Path, offsets: dict) -> None:
    files = sorted(parts_dir.glob("quar-*.parquet"))
    dest = out_dir / "quarantine.parquet"
    if not files:
        pq.write_table(pa.table({"lang": pa.array([], pa.string()), "source": pa.array([], pa.string()),
                                 "line": pa.array([], pa.int64()), "reason": pa.array([], pa.string()),
                                 "detail": pa.array([], pa.string())}), dest)
        return
    off = pa.table({"part": pa.array(list(offsets), pa.int32()), "off": pa.array(list(offsets.values()), pa.int64())})
    con.register("off_tbl", off)
    glob = str(parts_dir / "quar-*.parquet")
    # text/JSONL lines are 1-based; Parquet/datasets rows stay 0-based row numbers.
    con.execute(f"""COPY (
        SELECT q.lang, q.source, q.row + o.off + CASE WHEN q.source LIKE 'datasets:%' OR q.source LIKE '%.parquet'
                                                      THEN 0 ELSE 1 END AS line,
               q.reason, q.detail
        FROM read_parquet('{glob}') q JOIN off_tbl o USING (part) ORDER BY q.part, q.row)
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
