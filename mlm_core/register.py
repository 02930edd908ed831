"""The register stage (framework-free half): promotion gates and the model card.

In: the evaluate and audit outputs and the pretrain output. Out: ``gates.json`` (each declared gate:
value, threshold, pass/fail), ``model_card.md``. The registry side (moving alias ``champion`` only when
every gate passes, tagging the version with its gate results) is done by the task layer with MLflow.
"""
from __future__ import annotations

import json
from pathlib import Path

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
