"""The register stage (framework-free half): promotion gates and the model card.

In: the evaluate and audit outputs and the pretrain output (and, for the card's data and tokenizer
sections, the manifests of the normalize, tokenizer and shards outputs it was trained on). Out:
``gates.json`` (each declared gate: value, threshold, pass/fail), ``model_card.md``. The registry side (moving alias ``champion`` only when
every gate passes, tagging the version with its gate results) is done by the task layer with MLflow.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from mlm_core.gates import all_passed, evaluate_gates
from mlm_core.modelcard import bias_mitigations, model_card
from mlm_core.store import StageStore

log = logging.getLogger(__name__)


def _read(art, name: str) -> dict:
    p = Path(art.path) / name
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else {}


def data_manifests(lc, pre) -> dict[str, dict]:
    """The manifests of the data stages behind a pretrain output ({stage: manifest}, normalize / tokenizer /
    shards), read from the store by the fingerprints the pretrain manifest recorded. A missing one is {}
    (the card then says so) rather than an error: the card must still be written."""
    store = StageStore(lc.workdir)
    out = {}
    for stage, fp in sorted((pre.manifest.get("upstream") or {}).items()):
        try:
            out[stage] = store.load(stage, fp).manifest
        except (OSError, ValueError) as exc:
            log.warning("model card: the %s output %s is unreadable (%s); its card section stays empty", stage, fp, exc)
            out[stage] = {}
    return out


def card_data(manifests: dict[str, dict]) -> tuple[dict, dict]:
    """(data, tokenizer) sections of the model card from the normalize, shards and tokenizer manifests.

    data: {"languages": {lang: normalize's per-language counts (docs, chars, bytes, duplicates,
    quarantined...) + "train_tokens" from the shards}, "sampling_alpha" and "sampling_weights" (p(l)) from
    the shards' sampling table, "counts" and "quarantine_rate" from normalize}. tokenizer: the tokenizer
    manifest (algorithm, vocab_size, vocab_size_requested, style, lowercase, per-language fertility)."""
    norm, shards = manifests.get("normalize") or {}, manifests.get("shards") or {}
    langs = {lang: dict(v) for lang, v in (norm.get("languages") or {}).items() if isinstance(v, dict)}
    for lang, v in (shards.get("languages") or {}).items():
        if isinstance(v, dict) and "tokens_train" in v:
            langs.setdefault(lang, {})["train_tokens"] = v["tokens_train"]
    sampling = shards.get("sampling") or {}
    weights = {r["lang"]: r["p"] for r in sampling.get("table") or [] if isinstance(r, dict) and "lang" in r and "p" in r}
    data = {"languages": langs, "sampling_alpha": sampling.get("alpha"), "sampling_weights": weights,
            "counts": norm.get("counts") or {}, "quarantine_rate": norm.get("quarantine_rate")}
    return data, manifests.get("tokenizer") or {}


def card(lc, upstream: dict, gates: list, version: str | int, promoted: bool) -> str:
    pre, ev, au = upstream["pretrain"], upstream["evaluate"], upstream["audit"]
    up = pre.manifest.get("upstream", {})
    manifests = data_manifests(lc, pre)
    data, tokenizer = card_data(manifests)
    audit = _read(au, "audit.json")
    if data["sampling_alpha"] is None:
        data["sampling_alpha"] = lc.config.shards.sampling_alpha
    return model_card(
        name=lc.config.registry.model_name, version=version,
        fingerprints={"pretrain": pre.fingerprint, **up, "evaluate": ev.fingerprint, "audit": au.fingerprint},
        data=data, tokenizer=tokenizer, training=pre.manifest,
        evaluation=_read(ev, "evaluation.json"), audit=audit, gates=gates, promoted=promoted,
        mitigations=bias_mitigations(manifests.get("shards") or {}, pre.manifest, audit))


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
