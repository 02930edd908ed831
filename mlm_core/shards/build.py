"""The shards stage: normalized documents -> packed, pre-tokenized Arrow shards + the language sampling table.

In: the normalize output (``docs/<lang>.parquet``: doc_id, lang, text, n_chars, hash) and the tokenizer
output (``tokenizer.json`` + manifest with vocab_size and special token ids). Out (under the stage folder):

  train/<lang>-00000.arrow, validation/<lang>-00000.arrow   packed rows, ``rows_per_shard`` per file
  sampling.parquet   lang, n, natural, p, upsampling, expected_epochs   (p(l) = n_l^α / Σ n_k^α, n = train tokens;
                     expected_epochs is null: `mlm stats` computes it from the current shards.token_budget)
  stats.parquet      per language: docs, tokens, content tokens and rows, per split

The parts, one reason to change each: ``pack.py`` (row layout, columns, file format), ``split.py`` (which
documents go to validation), ``encode.py`` (documents -> token and word-start arrays, in-process or in
worker processes) and ``parts.py`` (partitions: their documents, their files). This module wires them into the
stage as plan -> process -> merge (``plan_shards``, ``process_shards``, ``merge_shards``; the
``PartitionedStage`` object is ``partitioned.py``): the tokenizer-bound encoding runs per language x run of
documents, anywhere (a Dask worker); the merge (``merge.py``) plans every shard file from the partitions'
document lengths, then writes the files independently (``shards.merge_workers`` at a time), so they are those
of a single pass over each language whatever the partitioning and the number of merge workers.
"""
from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mlm_core.errors import StageError
# the stage's parts; re-exported here for existing importers (``from mlm_core.shards.build import ...``)
from mlm_core.shards.encode import (  # noqa: F401
    IN_PROCESS_MAX_WORKERS, Encoded, doc_batches, encode_stream, select_docs,
    encode_texts, encodings_to_arrays, prepare_tokenizer,
)
from mlm_core.shards.pack import (  # noqa: F401
    Layout, Packer, ShardWriter, StreamStats, segment_dtype, shard_name, shard_schema, token_dtype, write_rows,
)
from mlm_core.shards.parts import (
    PartWriter, cached_tokenizer, read_range, row_ranges, split_cut, validation_of,
)
from mlm_core.shards.parts import load as load_part
from mlm_core.shards.split import (  # noqa: F401
    hash_prefixes, hash_order_ranks, hash_prefix_u32, top_up_validation, validation_mask,
)

log = logging.getLogger(__name__)

SPLITS = ("train", "validation")
ROLES = ("pad", "unk", "cls", "sep", "mask")


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


def _language_docs(docs_dir: Path, lang: str) -> int:
    p = docs_dir / f"{lang}.parquet"
    return pq.ParquetFile(p).metadata.num_rows if p.is_file() else 0


def _setup(lc, upstream: dict):
    """The tokenizer file, the prepared tokenizer, vocab size, special ids and the row layout (checked)."""
    cfg = lc.config.shards
    tart = upstream["tokenizer"]
    tok_file = Path(tart.path) / "tokenizer.json"
    if cfg.workers <= IN_PROCESS_MAX_WORKERS:
        # Only effective before the process's first parallel tokenizers call (rayon reads it once).
        os.environ.setdefault("RAYON_NUM_THREADS", str(cfg.workers))
    tok = cached_tokenizer(tok_file)
    vocab_size = int(tart.vocab_size or tok.get_vocab_size(with_added_tokens=True))
    if tok.get_vocab_size(with_added_tokens=True) > vocab_size:
        raise StageError(f"{tok_file}: {tok.get_vocab_size(with_added_tokens=True)} tokens, but the tokenizer "
                         f"manifest says vocab_size={vocab_size}")
    specials = _special_ids(tart.manifest, tok)
    layout = Layout.for_vocab(vocab_size, cfg.seq_len, specials["sep"], specials["pad"])
    return tok_file, tok, vocab_size, specials, layout


def partition_bytes(lc, docs_dir: Path) -> int:
    """Text per encode partition: ``execution.partition_mb`` when it is a number, else (``auto``) sized from the
    languages' text bytes and the workers (``mlm_core.partition_size``). Speed only: the output does not depend
    on it."""
    from mlm_core.partition_size import partition_bytes as sized
    return sized(lc, _text_bytes(docs_dir, lc.config.languages), lc.config.shards.workers)


def _text_bytes(docs_dir: Path, langs) -> int:
    """The text column's uncompressed bytes in every ``docs/<lang>.parquet`` (metadata only)."""
    total = 0
    for lang in langs:
        p = docs_dir / f"{lang}.parquet"
        if p.is_file():
            md = pq.ParquetFile(p).metadata
            col = md.schema.to_arrow_schema().get_field_index("text")
            total += sum(md.row_group(g).column(col).total_uncompressed_size for g in range(md.num_row_groups))
    return total


def plan_shards(lc, upstream: dict, part_bytes: int | None = None) -> list[dict]:
    """The partitions (language x run of documents), in merge order; also every check that needs no encoding
    (tokenizer, empty languages) and the train/validation split of each language (see ``parts.py``)."""
    cfg = lc.config.shards
    docs_dir = Path(upstream["normalize"].path) / "docs"
    _, tok, _, _, _ = _setup(lc, upstream)
    part_bytes = part_bytes or partition_bytes(lc, docs_dir)
    _cda_lists(lc)          # a bad or missing CDA word list fails here, before any encoding
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

    parts: list[dict] = []
    for lang in langs:
        path = docs_dir / f"{lang}.parquet"
        prefix = hash_prefixes(path)
        mask = validation_mask(prefix, cfg.validation_fraction)
        if cfg.min_validation_tokens:
            mask, held = top_up_validation(path, prefix, mask, cfg.min_validation_tokens, tok, cfg.batch_docs)
            if 0 <= held < cfg.min_validation_tokens:
                log.warning("shards: language '%s': %d validation tokens (half its %d documents), below "
                            "shards.min_validation_tokens=%d", lang, held, len(prefix), cfg.min_validation_tokens)
        if not mask.any():
            log.warning("shards: language '%s' has a single document: no validation data for it", lang)
        k = int(mask.sum())
        cut = split_cut(prefix, k)
        ranges = row_ranges(path, part_bytes)
        for i, (start, stop) in enumerate(ranges):
            parts.append({"index": len(parts), "lang": lang, "part": i, "of": len(ranges), "start": start,
                          "stop": stop, "docs": len(prefix), "validation_docs": k, "cut": cut})
    return parts


def process_shards(lc, upstream: dict, part: dict, out_dir: Path) -> dict:
    """Encode one partition's documents into ``out_dir`` (``parts.PartWriter``); pure and idempotent."""
    cfg = lc.config.shards
    path = Path(upstream["normalize"].path) / "docs" / f"{part['lang']}.parquet"
    tok_file, tok, vocab_size, _, layout = _setup(lc, upstream)
    lang, masks = part["lang"], deque()
    # CDA (mlm_core.bias.cda): the swapped copies of selected training documents, encoded as their own
    # "cda" task batches right after their batch and kept apart, so merge appends them after the language's
    # training documents (the same stream for any partitioning)
    wl = _cda_lists(lc).get(lang)
    counts = {"selected": 0, "swapped": 0, "words": 0}

    def tasks():
        row = part["start"]
        for b in read_range(path, part["start"], part["stop"], cfg.batch_docs,
                            ("text", "hash", "doc_id") if wl else ("text", "hash")):
            rows = np.arange(row, row + b.num_rows, dtype=np.int64)
            row += b.num_rows
            masks.append(validation_of(hash_prefix_u32(b.column(1)), rows, part["cut"]))
            yield lang, b.column(0)
            if wl:
                from mlm_core.bias.cda import augment
                copies, got = augment(b.column(0), b.column(2), ~masks[-1], wl, lc.config.seed, cfg.cda.share)
                counts.update({k: counts[k] + v for k, v in got.items()})
                if copies:
                    yield _CDA, pa.array(copies, pa.string())

    import multiprocessing as mp
    # a daemonic process (a pool or cluster worker) may not start its own pool: encode on the tokenizer's threads
    workers = min(cfg.workers, IN_PROCESS_MAX_WORKERS) if mp.current_process().daemon else cfg.workers
    writer = PartWriter(SPLITS + (_CDA,) if wl else SPLITS)
    for tag, enc in encode_stream(tasks(), workers, str(tok_file), tok, layout.ids):
        if len(enc.ids) and int(enc.ids.max()) >= vocab_size:
            raise StageError(f"shards: {lang}: token id {int(enc.ids.max())} >= vocab_size {vocab_size}")
        if tag == _CDA:
            writer.add(_CDA, enc)
            continue
        val = masks.popleft()
        writer.add("train", select_docs(enc, ~val))
        writer.add("validation", select_docs(enc, val))
    return writer.save(Path(out_dir), layout.ids, {"index": part["index"], "lang": lang,
                                                    "rows": part["stop"] - part["start"],
                                                    **({"cda_counts": counts} if wl else {})})


_CDA = "cda"     # a partition's swapped copies (process) -> appended to the training split (merge)


def _cda_lists(lc) -> dict:
    if lc.config.shards.cda is None:
        return {}
    from mlm_core.bias.cda import shard_lists
    return shard_lists(lc)


def pack_language(lang: str, dirs: list[Path], cda: bool, out_dir: Path, layout: Layout, cls_id: int,
                  rows_per_shard: int, batch_docs: int) -> tuple[list[dict], dict]:
    """The one-pass merge of one language (the merge before the map of ``merge.py``, issue 23): every partition's
    documents, in order, through one ``Packer`` per split. Kept as the reference the map's bytes are checked
    against (``merge_shards(serial=True)``; tests/test_shards_merge_parallel.py, benchmarks/merge_parallel.py)."""
    st, files = {}, []
    for split in SPLITS:
        w = ShardWriter(out_dir, split, lang, rows_per_shard, layout)
        pk = Packer(w, cls_id, where=f"{split}/{lang}")
        for d in dirs:
            for enc in load_part(Path(d), split, batch_docs):
                pk.add(enc)
        if split == "train" and cda:                     # CDA copies after every original document
            for d in dirs:
                for enc in load_part(Path(d), _CDA, batch_docs):
                    pk.add(enc)
        st[split] = pk.close()
        files.extend(w.close())
    return files, {f"{k}_{split}": getattr(st[split], k) for split in SPLITS
                   for k in ("docs", "tokens", "content_tokens", "rows")}


def merge_shards(lc, upstream: dict, parts: list[dict], results: list[dict], part_dirs: list[Path],
                 out_dir: Path, serial: bool = False) -> dict:
    """Write every language's shard files + tables from its partitions; returns the manifest fields.

    Plan + map (``merge.py``): the files' stream ranges from the partitions' document lengths, then each file
    written alone, ``shards.merge_workers`` at a time. ``serial=True``: the one-pass packer per language instead
    (``pack_language``, languages side by side in threads): the same bytes, kept as the reference."""
    from mlm_core.sampling import sampling_table
    from mlm_core.shards.merge import plan_streams, write_files
    cfg, tart = lc.config.shards, upstream["tokenizer"]
    _, _, vocab_size, specials, layout = _setup(lc, upstream)
    _check_cover(parts, results)
    langs = list(dict.fromkeys(p["lang"] for p in parts))
    dropped = [lang for lang in lc.config.languages if lang not in langs]
    cda_lists = _cda_lists(lc)
    dirs_of = {lang: [str(d) for p, d in zip(parts, part_dirs) if p["lang"] == lang] for lang in langs}

    if serial:
        def pack(lang: str) -> tuple[list[dict], dict]:
            return pack_language(lang, [Path(d) for d in dirs_of[lang]], lang in cda_lists, out_dir, layout,
                                 specials["cls"], cfg.rows_per_shard, cfg.batch_docs)
        # languages never share a row or a file: packed side by side (numpy, Arrow writes and sha256 release the
        # GIL), listed in language order
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max(1, min(len(langs), os.cpu_count() or 1))) as ex:
            packed = list(ex.map(pack, langs))
        shards = [f for files, _ in packed for f in files]
        per_lang = {lang: st for lang, (_, st) in zip(langs, packed)}
    else:
        jobs, per_lang = plan_streams(langs, dirs_of, set(cda_lists), layout, cfg.rows_per_shard)
        shards = write_files(jobs, out_dir, layout, specials["cls"], cfg.merge_workers)
    for lang in langs:
        st = per_lang[lang]
        log.info("shards: %s: %d train rows, %d validation rows", lang, st["rows_train"], st["rows_validation"])

    counts = {lang: per_lang[lang]["tokens_train"] for lang in langs if per_lang[lang]["tokens_train"] > 0}
    # no token budget here: expected epochs are computed on display (`mlm stats`) from the current
    # shards.token_budget, so changing the budget invalidates no stored output
    table = [asdict(r) for r in sampling_table(counts, cfg.sampling_alpha)]
    _write_tables(out_dir, table, per_lang)
    return {
        "seq_len": cfg.seq_len,
        **layout.manifest_fields(),     # format_version, dtype, segment_dtype, layout
        "format": "arrow-ipc-stream",
        "vocab_size": vocab_size,
        "tokenizer_fingerprint": tart.fingerprint,
        "special_tokens": tart.special_tokens or {},
        "shards": shards,
        "sampling": {"alpha": cfg.sampling_alpha, "unit": "train tokens",
                     "table": table},
        "languages": per_lang,
        "counts": {"rows": sum(s["rows"] for s in shards), "tokens": sum(s["tokens"] for s in shards),
                   "docs": sum(p["docs_train"] + p["docs_validation"] for p in per_lang.values())},
        "dropped_languages": dropped,
        "validation_docs": {lang: next(p["validation_docs"] for p in parts if p["lang"] == lang) for lang in langs},
        **({"cda": _cda_manifest(lc, langs, cda_lists, parts, results)} if lc.config.shards.cda else {}),
    }


def _cda_manifest(lc, langs: list[str], cda_lists: dict, parts: list[dict], results: list[dict]) -> dict:
    """Per listed language: training documents selected, swapped (changed: their copies are in the training
    split, counted in its docs) and words swapped."""
    per = {}
    for lang in langs:
        if lang in cda_lists:
            got = [r["cda_counts"] for p, r in zip(parts, results) if p["lang"] == lang]
            per[lang] = {k: sum(g[k] for g in got) for k in ("selected", "swapped", "words")}
    return {"share": lc.config.shards.cda.share, "seed": lc.config.seed, "languages": per,
            "note": "selected: training documents chosen by hash(doc id, seed) < share; swapped: those containing "
                    "a listed word, whose swapped copy was appended to the training split (docs_train counts them)"}


def _check_cover(parts: list[dict], results: list[dict]) -> None:
    """Every document of every language in exactly one partition, each partition's result present and its
    own: no document missing or encoded twice, whatever ran the partitions (and retried them)."""
    if len(results) != len(parts):
        raise StageError(f"shards: {len(parts)} partitions planned, {len(results)} results")
    at: dict[str, int] = {}
    for p, r in zip(parts, results):
        if not r or r.get("index") != p["index"] or r.get("lang") != p["lang"] or r.get("rows") != p["stop"] - p["start"]:
            raise StageError(f"shards: partition {p['index']} ({p['lang']} rows {p['start']}..{p['stop']}): "
                             f"result {r!r} does not belong to it")
        if p["start"] != at.get(p["lang"], 0):
            raise StageError(f"shards: {p['lang']}: partition {p['index']} starts at row {p['start']}, "
                             f"expected {at.get(p['lang'], 0)}")
        at[p["lang"]] = p["stop"]
        if r["train"]["docs"] + r["validation"]["docs"] > p["stop"] - p["start"]:
            raise StageError(f"shards: partition {p['index']} holds more documents than its rows")
    for p in parts:
        if at[p["lang"]] != p["docs"]:
            raise StageError(f"shards: {p['lang']}: partitions cover {at[p['lang']]} of {p['docs']} documents")


def run_shards(lc, upstream: dict, out_dir: Path, mapper=None) -> dict:
    """Run the stage into ``out_dir``: plan, process every partition (through ``mapper(fn, items)`` when given,
    e.g. Prefect tasks; else one after another here, each encoding on the tokenizer's threads / worker
    processes as ``shards.workers`` says), merge. Returns the manifest fields (see the module docstring)."""
    import shutil
    out_dir = Path(out_dir)
    parts = plan_shards(lc, upstream)
    work = out_dir / ".parts"
    dirs = [work / f"{p['index']:06d}" for p in parts]
    from mlm_core.progress import Progress
    shown = Progress("shards", sum(p["stop"] - p["start"] for p in parts), unit="docs")   # display only

    def one(item):
        p, d = item
        r = process_shards(lc, upstream, p, d)
        shown.update(advance=p["stop"] - p["start"], note=f"encoding {p['lang']} ({p['part'] + 1}/{p['of']})")
        return r
    try:
        results = mapper(one, list(zip(parts, dirs))) if mapper else [one(x) for x in zip(parts, dirs)]
    finally:
        shown.close()
    manifest = merge_shards(lc, upstream, parts, results, dirs, out_dir)
    shutil.rmtree(work, ignore_errors=True)
    return manifest


def _write_tables(out_dir: Path, table: list[dict], per_lang: dict) -> None:
    sschema = pa.schema([("lang", pa.string()), ("n", pa.int64()), ("natural", pa.float64()), ("p", pa.float64()),
                         ("upsampling", pa.float64()), ("expected_epochs", pa.float64())])
    pq.write_table(pa.Table.from_pylist(table, schema=sschema), out_dir / "sampling.parquet")
    rows = [{"lang": lang, **{k: int(v) for k, v in p.items()}} for lang, p in per_lang.items()]
    fields = [("lang", pa.string())] + [(k, pa.int64()) for k in next(iter(per_lang.values()))]
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema(fields)), out_dir / "stats.parquet")
