"""The evaluate stage: intrinsic per-language metrics + zero-shot cross-lingual transfer of a trained model.

In: the pretrain output (model folder), the shards (held-out split) and normalize (held-out texts for
pseudo-perplexity) outputs, and the ``evaluate`` config section. Out: ``evaluation.json`` (everything),
``intrinsic.parquet`` (one row per language, next to the unigram baseline), ``transfer.parquet`` (one
row per task and target language, with the untrained-encoder control and the gain over it),
``predictions.parquet`` (UPOS: one row per target word, the tagger's and the control's tag;
``mlm_core.evaluate.predictions``), ``intrinsic_documents.parquet`` (per language and held-out document: masked
positions, the model's and the unigram baseline's top-1 hits; ``intrinsic.write_documents``), ``reliability.png``;
with ``evaluate.span_fill`` also ``span_documents.parquet`` (per language and document: spans, exact hits of the
model and of the unigram baseline; ``span_fill.write_documents``) and the span metrics in every table.
The same code runs on any model folder (``mlm evaluate MODEL``) through ``evaluate_model``.
"""
from __future__ import annotations

import json
from pathlib import Path

from mlm_core.evaluate.control import CONTROL_KEYS

INTRINSIC_KEYS = ("n_positions", "n_documents", "top1", "top1_ci_low", "top1_ci_high", "top5", "mrr", "loss",
                  "perplexity", "ece", "baseline_top1", "baseline_top5", "baseline_mrr",
                  # top-1 minus the baseline's top-1 at the same positions, with its bootstrap 95% interval
                  "top1_over_baseline", "top1_over_baseline_ci_low", "top1_over_baseline_ci_high",
                  # ELECTRA only (None otherwise): the discriminator's replaced-token detection
                  "rtd_acc", "rtd_auc", "rtd_baseline_acc")


def evaluate_model(model_dir: Path, shards_dir: Path, normalize_dir: Path | None, lc, out_dir: Path | None,
                   extended_tokenizer: bool = False) -> dict:
    """``extended_tokenizer``: the model's tokenizer extends the shards' (``mlm compare`` checks it): a larger
    model vocabulary is scored on the shards' rows (``evaluate_intrinsic``); the evaluate stage never sets it."""
    from mlm_core.evaluate.intrinsic import run_intrinsic
    from mlm_core.evaluate.transfer import run_transfer
    cfg = lc.config.evaluate
    plot = out_dir / "reliability.png" if out_dir is not None else None
    # debias.projection (SentenceDebias): every metric below scores the projected representations
    hook, debias = _projection(lc, model_dir, normalize_dir, out_dir)
    documents: dict = {}
    span_documents: dict = {}
    result = run_intrinsic(model_dir, shards_dir, normalize_dir, cfg, seed=lc.config.seed, plot_path=plot,
                           model_hook=hook, extended_tokenizer=extended_tokenizer, documents=documents,
                           span_documents=span_documents)
    if out_dir is not None:         # per-document top-1 counts: the report resamples documents (issue 21)
        from mlm_core.evaluate.intrinsic import DOCUMENTS_FILE, write_documents
        write_documents(documents, out_dir / DOCUMENTS_FILE)
        if getattr(cfg, "span_fill", False):
            from mlm_core.evaluate import span_fill
            span_fill.write_documents(span_documents, out_dir / span_fill.DOCUMENTS_FILE)
    if debias is not None:
        result["debias"] = {"projection": debias}
    if cfg.upos or cfg.classification or cfg.retrieval:
        # fine-tuning is training: the run's training seed (pretrain.seed, else the global seed), so a sweep
        # seed varies it too; the intrinsic masks keep the global seed (the same positions for every run)
        rows: list = []
        result["transfer"] = run_transfer(model_dir, cfg, lc.base_dir, lc.config.train_seed, model_hook=hook,
                                          predictions=rows)
        if out_dir is not None and cfg.upos is not None:
            from mlm_core.evaluate.predictions import FILE, write
            write(rows, out_dir / FILE)
    else:
        result["transfer"] = {}
    if cfg.efficiency:          # parameters, latency, throughput, peak memory (efficiency.py)
        from mlm_core.evaluate.efficiency import measure_model_dir
        result["efficiency"] = measure_model_dir(model_dir, cfg.efficiency_repeats, cfg.efficiency_device,
                                                 lc.config.seed)
    return result


def _projection(lc, model_dir: Path, normalize_dir: Path | None, out_dir: Path | None):
    """(hook, record) of debias.projection ((None, None) when unset); the subspace comes from the normalized corpus."""
    if getattr(getattr(lc.config, "debias", None), "projection", None) is None:
        return None, None
    from mlm_core.bias.projection import ProjectionError, prepare
    if normalize_dir is None:
        raise ProjectionError("debias.projection needs the normalized corpus (the normalize output) to estimate "
                              "its subspace")
    return prepare(lc, model_dir, normalize_dir, out_dir)


def _span_keys(result: dict) -> tuple[str, ...]:
    """evaluate.span_fill's columns, only where some language has them (off: the tables keep their old columns)."""
    from mlm_core.evaluate.span_fill import SPAN_KEYS
    on = any("span_n" in r for r in result.get("intrinsic", {}).values() if isinstance(r, dict))
    return SPAN_KEYS if on else ()


def intrinsic_rows(result: dict) -> list[dict]:
    keys = INTRINSIC_KEYS + _span_keys(result)
    rows = []
    for lang, r in sorted(result.get("intrinsic", {}).items()):
        if r.get("missing"):
            rows.append({"lang": lang, "missing": True, **{k: None for k in keys}})
            continue
        row = {"lang": lang, "missing": False, **{k: r.get(k) for k in keys}}
        pll = result.get("pll", {}).get(lang, {})
        row["pseudo_perplexity"] = None if pll.get("missing") else pll.get("pseudo_perplexity")
        rows.append(row)
    return rows


def transfer_rows(result: dict) -> list[dict]:
    rows = []
    for task, t in sorted(result.get("transfer", {}).items()):
        if not isinstance(t, dict):
            continue
        for lang, r in sorted((t.get("targets") or {}).items()):
            if not isinstance(r, dict):
                continue
            rows.append({"task": task, "lang": lang, "score": r.get("score"),
                         "source_score": t.get("source_score", r.get("source_score")),
                         "gap": r.get("gap"), "majority_baseline": r.get("majority_baseline"),
                         "macro_f1": r.get("macro_f1"), "n": r.get("n"),
                         **{k: r.get(k) for k in CONTROL_KEYS}})
    return rows


def flat_metrics(result: dict) -> dict[str, float]:
    out = {}
    for row in intrinsic_rows(result):
        for k in ("top1", "top1_ci_low", "top1_ci_high", "top5", "mrr", "perplexity", "ece", "baseline_top1",
                  "top1_over_baseline", "top1_over_baseline_ci_low", "top1_over_baseline_ci_high", "pseudo_perplexity",
                  "rtd_acc", "rtd_auc", "rtd_baseline_acc", "span_exact", "span_exact_ci_low", "span_exact_ci_high",
                  "span_token_top1", "span_baseline_exact"):
            if isinstance(row.get(k), (int, float)):
                out[f"{row['lang']}.{k}"] = float(row[k])
    for row in transfer_rows(result):
        for k in ("score", "gap", "macro_f1", *CONTROL_KEYS):
            if isinstance(row.get(k), (int, float)):
                out[f"{row['task']}.{row['lang']}.{k}"] = float(row[k])
    for task, t in sorted(result.get("transfer", {}).items()):       # zero-shot mean vs the untrained control
        for k, v in ((t.get("zero_shot") or {}) if isinstance(t, dict) else {}).items():
            if isinstance(v, (int, float)):
                out[f"{task}.zero_shot.{k}"] = float(v)
    for task, t in sorted(result.get("transfer", {}).items()):       # cross-validation: mean and std over folds
        for m, v in ((t.get("cv") or {}) if isinstance(t, dict) else {}).items():
            if isinstance(v, dict) and {"mean", "std"} <= set(v):
                out[f"{task}.cv.{m}.mean"], out[f"{task}.cv.{m}.std"] = float(v["mean"]), float(v["std"])
    if result.get("efficiency"):
        from mlm_core.evaluate.efficiency import flat
        out |= flat(result["efficiency"])
    return out


def write_transfer_table(result: dict, path: Path) -> Path:
    """transfer.parquet: ``transfer_rows`` with fixed column types (a column no row fills is still typed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    schema = pa.schema([("task", pa.string()), ("lang", pa.string()), ("score", pa.float64()),
                        ("source_score", pa.float64()), ("gap", pa.float64()), ("majority_baseline", pa.float64()),
                        ("macro_f1", pa.float64()), ("n", pa.int64()),
                        *((k, pa.float64()) for k in CONTROL_KEYS)])
    pq.write_table(pa.Table.from_pylist(transfer_rows(result), schema=schema), path)
    return Path(path)


def run_evaluate(lc, upstream: dict, out_dir: Path) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    out_dir = Path(out_dir)
    result = evaluate_model(upstream["pretrain"].path, upstream["shards"].path, upstream["normalize"].path, lc, out_dir)
    (out_dir / "evaluation.json").write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    intrinsic = intrinsic_rows(result)
    pq.write_table(pa.Table.from_pylist(intrinsic), out_dir / "intrinsic.parquet")
    write_transfer_table(result, out_dir / "transfer.parquet")
    missing = [r["lang"] for r in intrinsic if r["missing"]]
    return {"mlm_model": result.get("mlm_model", "model"),
            "languages": {r["lang"]: {k: v for k, v in r.items() if k != "lang"} for r in intrinsic},
            "missing_languages": missing, "transfer": transfer_rows(result), "metrics": flat_metrics(result),
            "efficiency": result.get("efficiency"),
            "counts": {"languages": len(intrinsic), "missing": len(missing)}} | (
                {"debias": result["debias"]} if "debias" in result else {})   # unset: the manifest as before
