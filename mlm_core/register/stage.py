"""The register stage (framework-free half): promotion gates and the model card.

In: the evaluate and audit outputs and the pretrain output, and, for the card's data and tokenizer sections, the
normalize, tokenizer and shards outputs the model was trained on (the spec's ``context``: handed in, None when
not in the store, and the card then says so). Out:
``gates.json`` (each declared gate: value, threshold, pass/fail), ``model_card.md``. The registry side (moving alias ``champion`` only when
every gate passes, tagging the version with its gate results) is done by the task layer with MLflow.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from mlm_core.artifacts import NormalizedCorpus, ShardSet
from mlm_core.register.gates import all_passed, evaluate_gates
from mlm_core.register.modelcard import bias_mitigations, model_card

log = logging.getLogger(__name__)


def _read(art, name: str) -> dict:
    p = Path(art.path) / name
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else {}


def card_data(norm: NormalizedCorpus | None, shards: ShardSet | None) -> dict:
    """The model card's data section from the normalize and shards outputs: {"languages": {lang: normalize's
    per-language counts (docs, chars, bytes, duplicates, quarantined...) + "train_tokens" from the shards},
    "sampling_alpha" and "sampling_weights" (p(l)) from the shards' sampling table, "counts" and "quarantine_rate"
    from normalize}."""
    langs = {lang: dict(v) for lang, v in (norm.languages if norm else {}).items() if isinstance(v, dict)}
    for lang, v in (shards.languages if shards else {}).items():
        if isinstance(v, dict) and "tokens_train" in v:
            langs.setdefault(lang, {})["train_tokens"] = v["tokens_train"]
    return {"languages": langs, "sampling_alpha": shards.sampling.get("alpha") if shards else None,
            "sampling_weights": shards.sampling_weights() if shards else {},
            "counts": (norm.counts if norm else None) or {}, "quarantine_rate": norm.quarantine_rate if norm else None}


def card(lc, upstream: dict, gates: list, version: str | int, promoted: bool) -> str:
    """The model card from the typed outputs in ``upstream``: pretrain, evaluate and audit, and (optional: None or
    absent leaves their sections empty) the normalize, tokenizer and shards outputs behind the pretrain output."""
    pre, ev, au = upstream["pretrain"], upstream["evaluate"], upstream["audit"]
    arts = {s: upstream.get(s) for s in ("normalize", "tokenizer", "shards")}
    data = card_data(arts["normalize"], arts["shards"])
    audit = _read(au, "audit.json")
    if data["sampling_alpha"] is None:
        data["sampling_alpha"] = lc.config.shards.sampling_alpha
    return model_card(
        name=lc.config.registry.model_name, version=version,
        fingerprints={"pretrain": pre.fingerprint, **pre.upstream, "evaluate": ev.fingerprint, "audit": au.fingerprint},
        data=data, tokenizer=arts.get("tokenizer"), training=pre,
        evaluation=_read(ev, "evaluation.json"), audit=audit, gates=gates, promoted=promoted,
        mitigations=bias_mitigations(arts.get("shards"), pre, audit))


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
