"""The register stage (framework-free half): promotion gates and the model card.

In: the evaluate and audit outputs and the pretrain output. Out: ``gates.json`` (each declared gate:
value, threshold, pass/fail), ``model_card.md``. The registry side (moving alias ``champion`` only when
every gate passes, tagging the version with its gate results) is done by the task layer with MLflow.
"""
from __future__ import annotations

import json
from pathlib import Path

from mlm_core.audit import run_audit  # noqa: F401  (re-exported for the audit stage)
from mlm_core.gates import all_passed, evaluate_gates
from mlm_core.modelcard import model_card


def _read(art, name: str) -> dict:
    p = Path(art.path) / name
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else {}


def card(lc, upstream: dict, gates: list, version: str | int, promoted: bool) -> str:
    pre, ev, au = upstream["pretrain"], upstream["evaluate"], upstream["audit"]
    up = pre.manifest.get("upstream", {})
    return model_card(
        name=lc.config.registry.model_name, version=version,
        fingerprints={"pretrain": pre.fingerprint, **up, "evaluate": ev.fingerprint, "audit": au.fingerprint},
        data={"languages": pre.manifest.get("data_languages", {}), "sampling_alpha": lc.config.shards.sampling_alpha},
        tokenizer=pre.manifest.get("tokenizer", {}), training=pre.manifest,
        evaluation=_read(ev, "evaluation.json"), audit=_read(au, "audit.json"), gates=gates, promoted=promoted)


def run_register(lc, upstream: dict, out_dir: Path) -> dict:
    out_dir = Path(out_dir)
    evaluation, audit = _read(upstream["evaluate"], "evaluation.json"), _read(upstream["audit"], "audit.json")
    gates = evaluate_gates(lc.config.registry.gates, evaluation, audit)
    passed = all_passed(gates)
    (out_dir / "gates.json").write_text(json.dumps([g.to_dict() for g in gates], indent=2), encoding="utf-8")
    (out_dir / "model_card.md").write_text(card(lc, upstream, gates, "pending", passed), encoding="utf-8")
    failed = [g.name for g in gates if not g.passed]
    return {"gates": [g.to_dict() for g in gates], "passed": passed, "failed_gates": failed,
            "model_name": lc.config.registry.model_name, "pretrain_fingerprint": upstream["pretrain"].fingerprint,
            "counts": {"gates": len(gates), "failed": len(failed)}}


def run_audit_stage(lc, upstream: dict, out_dir: Path) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    out_dir = Path(out_dir)
    result = run_audit(upstream["pretrain"].path, lc.config.audit, lc.base_dir)
    (out_dir / "audit.json").write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    rows = [{"lang": lang, "n": r.get("n"), "metric_score": r.get("metric_score"), "stereo_score": r.get("stereo_score"),
             "antistereo_score": r.get("antistereo_score"), "neutral_pct": r.get("neutral_pct")}
            for lang, r in sorted(result.get("crows", {}).items())]
    schema = pa.schema([("lang", pa.string()), ("n", pa.int64()), ("metric_score", pa.float64()),
                        ("stereo_score", pa.float64()), ("antistereo_score", pa.float64()), ("neutral_pct", pa.float64())])
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
            "limits": result.get("limits"), "metrics": metrics, "counts": {"crows_languages": len(rows)}}
