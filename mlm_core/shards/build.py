"""The shards stage: normalized documents -> packed, pre-tokenized Arrow shards + the language sampling table.

In: the normalize output (``docs/<lang>.parquet``: doc_id, lang, text, n_chars, hash) and the tokenizer
output (``tokenizer.json`` + manifest with vocab_size and special token ids). Out (under the stage folder):

  train/<lang>-00000.arrow, validation/<lang>-00000.arrow   packed rows, ``rows_per_shard`` per file
  sampling.parquet   lang, n, natural, p, upsampling, expected_epochs   (p(l) = n_l^α / Σ n_k^α, n = train tokens;
                     expected_epochs is null: `mlm stats` computes it from the current shards.token_budget)
  stats.parquet      per language: docs, tokens, content tokens and rows, per split

The parts, one reason to change each: ``pack.py`` (row layout, columns, file format), ``split.py`` (which
documents go to validation) and ``encode.py`` (documents -> token and word-start arrays, in-process or in
worker processes). This module wires them into the stage and writes the tables.
"""
from __future__ import annotations

import logging
import os
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mlm_core.errors import StageError
# the stage's parts; re-exported here for existing importers (``from mlm_core.shards.build import ...``)
from mlm_core.shards.encode import (  # noqa: F401
    IN_PROCESS_MAX_WORKERS, Encoded, _doc_batches, _encode_in_worker, _encode_stream, _init_worker, _select,
    encode_texts, encodings_to_arrays, prepare_tokenizer,
)
from mlm_core.shards.pack import (  # noqa: F401
    Layout, Packer, ShardWriter, StreamStats, segment_dtype, shard_name, shard_schema, token_dtype, write_rows,
)
from mlm_core.shards.split import (  # noqa: F401
    _split_masks, hash_order_ranks, hash_prefix_u32, top_up_validation, validation_mask,
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
    layout = Layout.for_vocab(vocab_size, cfg.seq_len, specials["sep"], specials["pad"])
    ids_dtype = layout.ids

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
                w = ShardWriter(out_dir, split, lang, cfg.rows_per_shard, layout)
                packers[(split, lang)] = Packer(w, specials["cls"], where=f"{split}/{lang}")
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
        **layout.manifest_fields(),     # format_version, dtype, segment_dtype, layout
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


def _write_tables(out_dir: Path, table: list[dict], per_lang: dict) -> None:
    sschema = pa.schema([("lang", pa.string()), ("n", pa.int64()), ("natural", pa.float64()), ("p", pa.float64()),
                         ("upsampling", pa.float64()), ("expected_epochs", pa.float64())])
    pq.write_table(pa.Table.from_pylist(table, schema=sschema), out_dir / "sampling.parquet")
    rows = [{"lang": lang, **{k: int(v) for k, v in p.items()}} for lang, p in per_lang.items()]
    fields = [("lang", pa.string())] + [(k, pa.int64()) for k in next(iter(per_lang.values()))]
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema(fields)), out_dir / "stats.parquet")
