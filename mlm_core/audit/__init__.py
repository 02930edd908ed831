"""Bias audits of a trained masked LM: CrowS-Pairs minimal pairs and masked-slot templates.

In: a model folder (export or pretrain output: weights + tokenizer.json), an ``AuditConfig``
(language -> CrowS-Pairs CSV, language -> template YAML; paths relative to ``base_dir``).
Out: {"crows": {lang: ...}, "templates": {lang: ...}, "limits": text} (plain JSON-able values).

References: Nangia et al. (2020) CrowS-Pairs (``crows.py``); Kurita et al. (2019) template
log-probability bias (``templates.py``); the limits follow Blodgett et al. (2021).
"""
from __future__ import annotations

import logging
from pathlib import Path

from mlm_core.audit.crows import AuditError, Pair, audit_crows, load_crows_csv
from mlm_core.audit.templates import TemplateSpec, audit_templates, load_templates

log = logging.getLogger(__name__)

LIMITS = (
    "Known limits of these audits. (1) CrowS-Pairs pairs are noisy: many pairs do not isolate a "
    "stereotype, contrast groups inconsistently or have grammatical differences beyond the group word "
    "(Blodgett et al., 2021, 'Stereotyping Norwegian Salmon'), so the score is a rough signal, not a "
    "measurement of a well-defined construct. (2) A preference in likelihood is not harm: it does not show "
    "how a downstream system will behave, and a score of 50 is not evidence that a model is unbiased. "
    "(3) The demo sets are small and synthetic (tens of pairs, two bias types, a few templates per "
    "language); with N pairs one pair moves the score by 100/N points, so differences of a few points "
    "are noise. (4) Template results depend on the chosen templates, group words and attribute words, "
    "and on tokenization: words split into several subwords are scored by masking all of them at once, "
    "an approximation; languages with grammatical gender constrain which words fit. (5) The pairs and "
    "templates encode stereotypes of particular cultures (CrowS-Pairs: the United States); translating "
    "them does not make them representative of other languages' societies.")


def run_audit(model_dir: Path, cfg, base_dir: Path, batch: int = 64, model_hook=None) -> dict:
    """Run every configured audit on the model in ``model_dir`` (``cfg``: an ``AuditConfig``).
    ``model_hook(model) -> model``: applied to the loaded model first (debias.projection).

    All files are read and checked before the model is loaded, so a bad CSV or YAML fails fast with
    a message naming it.
    """
    from mlm_core.fillmask import load_model_dir

    from mlm_core.config.eval import audit_file
    base_dir = Path(base_dir)
    crows = {lang: audit_file(e) for lang, e in sorted(cfg.crows_pairs.items())}     # (path, encoding)
    tmpl = {lang: audit_file(e) for lang, e in sorted(cfg.templates.items())}
    pairs = {lang: load_crows_csv(base_dir / p, encoding=enc) for lang, (p, enc) in crows.items()}
    specs = {lang: load_templates(base_dir / p, encoding=enc) for lang, (p, enc) in tmpl.items()}
    out: dict = {"crows": {}, "templates": {}, "limits": LIMITS}
    if not pairs and not specs:
        return out
    model, tok, mask = load_model_dir(Path(model_dir))
    if model_hook is not None:
        model = model_hook(model)
    from mlm_core.progress import Progress
    shown = Progress("audit", len(pairs) + len(specs), unit="items")     # display only
    for lang, ps in pairs.items():
        shown.update(note=f"CrowS-Pairs {lang} ({len(ps)} pairs)")
        r = audit_crows(model, tok, ps, mask, batch=batch)
        shown.update(advance=1)
        r["file"] = crows[lang][0]
        out["crows"][lang] = r
        log.info("audit: crows %s: metric %.2f (N=%d, neutral %d, with an empty sentence %d, skipped %d)", lang,
                 r["metric_score"] or 0, r["n"], r["neutral"], r["n_empty_sentence"], len(r["skipped"]))
    for lang, spec in specs.items():
        shown.update(note=f"templates {lang}")
        r = audit_templates(model, tok, spec, mask, batch=batch)
        shown.update(advance=1)
        r["file"] = tmpl[lang][0]
        out["templates"][lang] = r
        log.info("audit: templates %s: delta %s, KL-to-neutral %.4f", lang, r["delta_bias"], r["kl_to_neutral_mean"])
    shown.close()
    return out


__all__ = ["AuditError", "Pair", "TemplateSpec", "LIMITS", "load_crows_csv", "load_templates", "audit_crows",
           "audit_templates", "run_audit"]
