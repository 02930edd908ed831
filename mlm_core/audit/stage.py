"""The audit stage: bias audits of the trained model (see ``run_audit``), written as the stage's output.

In: the pretrain output and the ``audit`` config section. Out: ``audit.json`` (everything, with the
benchmarks' known limits) and ``crows.parquet`` (one row per audited language: scores, pairs with an
empty sentence, pairs skipped as too long) for the data contract.
"""
from __future__ import annotations

import json
from pathlib import Path

from mlm_core.audit import run_audit


def run_audit_stage(lc, upstream: dict, out_dir: Path) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    out_dir = Path(out_dir)
    hook, debias = _projection(lc, upstream["pretrain"], upstream.get("normalize"), out_dir)
    result = run_audit(upstream["pretrain"].path, lc.config.audit, lc.base_dir, model_hook=hook)
    if debias is not None:      # the scores below are of the projected representations
        result["debias"] = {"projection": debias}
    (out_dir / "audit.json").write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    rows = [{"lang": lang, "n": r.get("n"), "metric_score": r.get("metric_score"), "stereo_score": r.get("stereo_score"),
             "antistereo_score": r.get("antistereo_score"), "neutral_pct": r.get("neutral_pct"),
             "empty_sentence_pairs": r.get("n_empty_sentence", 0), "skipped": len(r.get("skipped") or [])}
            for lang, r in sorted(result.get("crows", {}).items())]
    schema = pa.schema([("lang", pa.string()), ("n", pa.int64()), ("metric_score", pa.float64()),
                        ("stereo_score", pa.float64()), ("antistereo_score", pa.float64()), ("neutral_pct", pa.float64()),
                        ("empty_sentence_pairs", pa.int64()), ("skipped", pa.int64())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), out_dir / "crows.parquet")
    metrics = {f"{r['lang']}.crows_score": r["metric_score"] for r in rows if r["metric_score"] is not None}
    for lang, t in result.get("templates", {}).items():
        for pair, v in (t.get("delta_bias") or {}).items():
            metrics[f"{lang}.delta_bias.{pair}"] = v
        if t.get("kl_to_neutral_mean") is not None:
            metrics[f"{lang}.kl_to_neutral"] = t["kl_to_neutral_mean"]
    return {"crows": rows, "templates": {k: {kk: vv for kk, vv in v.items() if kk in
                                             ("delta_bias", "kl_to_neutral", "kl_to_neutral_mean", "n_templates")}
                                         for k, v in result.get("templates", {}).items()},
            "limits": result.get("limits"), "metrics": metrics, "counts": {"crows_languages": len(rows)}} | (
                {"debias": result["debias"]} if "debias" in result else {})   # unset: the manifest as before


def _projection(lc, pre, norm, out_dir: Path):
    """(hook, record) of debias.projection ((None, None) when unset). The subspace is estimated from the normalized
    corpus the model was trained on: ``norm``, the audit's context output (``stages.STAGES``), which the audit
    fingerprint already covers through pretrain's (adding normalize to the audit's upstream would change every
    stored audit's fingerprint, projection or not); None: not in the store."""
    if getattr(getattr(lc.config, "debias", None), "projection", None) is None:
        return None, None
    from mlm_core.bias.projection import ProjectionError, prepare
    if norm is None or norm.fingerprint != pre.upstream.get("normalize"):
        raise ProjectionError(f"debias.projection: the normalize output {pre.upstream.get('normalize')} behind the "
                              f"pretrain output {pre.fingerprint} is not in the store {lc.workdir}: run "
                              "`mlm run CONFIG --only normalize` first")
    return prepare(lc, pre.path, norm.path, out_dir)
