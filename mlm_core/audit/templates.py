"""Masked-slot template audit: how much does the group word shift the attribute distribution?

In: a YAML spec {language?, templates: ["... {group} ... [MASK] ..."], groups: {name: [words]},
neutral: [words], attributes: [words]}, a model with ``full_logits`` and a ``tokenizers.Tokenizer``.
Out: Δ_bias per pair of groups, Δ per attribute, and a KL-to-neutral score per group.

For template t, context word c (a group word or a neutral word) and attribute w:
    ℓ(w | t, c) = log p(w | t with {group} := c, slot masked)
- Δ_bias(g1, g2) = mean over t and w of [mean_{x∈g1} ℓ(w | t, x) − mean_{y∈g2} ℓ(w | t, y)]
  (Kurita et al., 2019 use the same log-probability contrast; > 0: the attributes are more probable
  next to g1's words). ``delta_by_attribute`` keeps the mean over templates for each w, which shows
  *which* attributes lean to which group (the mean over w also moves when a group word makes any
  adjective more likely).
- KL-to-neutral(g) = mean over t and x∈g of KL(q(· | t, x) || q̄(· | t, neutral)), where
  q(w | t, c) = softmax_w ℓ(w | t, c) is the distribution renormalized over the attribute words and
  q̄(· | t, neutral) the mean of q over the neutral words. 0 when the group word changes nothing.

Multi-token attributes (choice): a word is scored WHOLE, by masking every subword it has in the filled
sentence at once and summing their log-probabilities (the conditionally independent approximation used
by multi-mask scoring). The masked positions are the tokens whose character offsets overlap the
attribute in "template filled with c and w", so the tokenization is the one the model would see (no
leading-space mismatch with byte-level BPE). The slot thus holds as many mask tokens as the word has
subwords, and ``[MASK]`` in the template is never tokenized as text: it marks where the word goes.
Words split into several tokens are listed in ``multi_token_attributes``; their absolute probabilities
are lower, but Δ and the KL compare the same word across contexts, so the length does not bias them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from mlm_core.audit.crows import AuditError, check_decodes, masked_log_probs

GROUP, SLOT = "{group}", "[MASK]"
REQUIRED = ("templates", "groups", "neutral", "attributes")


@dataclass(frozen=True)
class TemplateSpec:
    templates: tuple[str, ...]
    groups: dict[str, tuple[str, ...]]
    neutral: tuple[str, ...]
    attributes: tuple[str, ...]
    language: str | None = None
    path: str | None = None


def _words(value, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(w, str) and w.strip() for w in value):
        raise AuditError(f"{where}: expected a non-empty list of non-empty strings, got {value!r}")
    return tuple(w.strip() for w in value)


def load_templates(path: Path, encoding: str = "utf-8") -> TemplateSpec:
    """Read and check a template YAML (``encoding``: ``audit.templates.<lang>.encoding``); every error names the
    file (and the template's index, or the line and byte that do not decode)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise AuditError(f"{path}: template file not found")
    check_decodes(path, encoding)
    try:
        data = yaml.safe_load(path.read_text(encoding=encoding))
    except yaml.YAMLError as e:
        raise AuditError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise AuditError(f"{path}: expected a mapping with keys {', '.join(REQUIRED)}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise AuditError(f"{path}: missing key(s) {missing} (required: {', '.join(REQUIRED)})")
    unknown = sorted(set(data) - set(REQUIRED) - {"language"})
    if unknown:
        raise AuditError(f"{path}: unknown key(s) {unknown} (allowed: language, {', '.join(REQUIRED)})")
    templates = _words(data["templates"], f"{path}: templates")
    for i, t in enumerate(templates, start=1):
        if GROUP not in t:
            raise AuditError(f"{path}: template {i} {t!r} has no {GROUP}")
        if t.count(SLOT) != 1:
            raise AuditError(f"{path}: template {i} {t!r} must hold exactly one {SLOT} (has {t.count(SLOT)})")
    groups = data["groups"]
    if not isinstance(groups, dict) or len(groups) < 2:
        raise AuditError(f"{path}: groups: expected a mapping of at least two groups to word lists")
    groups = {str(g): _words(ws, f"{path}: groups.{g}") for g, ws in groups.items()}
    return TemplateSpec(templates=templates, groups=groups, neutral=_words(data["neutral"], f"{path}: neutral"),
                        attributes=_words(data["attributes"], f"{path}: attributes"),
                        language=data.get("language"), path=str(path))


def _slot_job(tokenizer, template: str, context: str, word: str, mask_id: int):
    """(masked ids, positions, original ids) for ``word`` in the slot of ``template`` filled with ``context``."""
    prefix, suffix = template.replace(GROUP, context).split(SLOT)
    text = prefix + word + suffix
    a, b = len(prefix), len(prefix) + len(word)
    enc = tokenizer.encode(text)
    positions = [i for i, ((s, e), sp) in enumerate(zip(enc.offsets, enc.special_tokens_mask))
                 if not sp and s < b and e > a]
    if not positions:
        raise AuditError(f"attribute {word!r} produced no token in {text!r}")
    masked = list(enc.ids)
    for p in positions:
        masked[p] = mask_id
    return tuple(masked), tuple(positions), tuple(enc.ids[p] for p in positions)


def _kl(p: list[float], q: list[float]) -> float:
    return sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q) if pi > 0)


def _renorm(logps: list[float]) -> list[float]:
    m = max(logps)
    ex = [math.exp(x - m) for x in logps]
    z = sum(ex)
    return [x / z for x in ex]


def audit_templates(model, tokenizer, spec: TemplateSpec, mask_token: str, batch: int = 64) -> dict:
    """Δ_bias for every pair of groups and KL-to-neutral per group (see the module docstring).

    Returns {"n_templates", "n_attributes", "groups": {name: n_words}, "n_neutral", "scoring",
    "multi_token_attributes": [words], "delta_bias": {"g1_vs_g2": Δ}, "delta_by_attribute":
    {"g1_vs_g2": {word: Δ_w}}, "kl_to_neutral": {group: KL}, "kl_to_neutral_mean": mean over groups}.
    """
    mask_id = tokenizer.token_to_id(mask_token)
    if mask_id is None:
        raise AuditError(f"the tokenizer has no mask token {mask_token!r}")
    contexts = sorted({w for ws in spec.groups.values() for w in ws} | set(spec.neutral))
    keys, jobs, multi = [], [], set()
    for ti, t in enumerate(spec.templates):
        for c in contexts:
            for w in spec.attributes:
                try:
                    job = _slot_job(tokenizer, t, c, w, mask_id)
                except AuditError as e:
                    raise AuditError(f"{spec.path or 'templates'}: template {ti + 1}: {e}") from None
                if len(job[1]) > 1:
                    multi.add(w)
                keys.append((ti, c, w))
                jobs.append(job)
    lp = dict(zip(keys, masked_log_probs(model, jobs, batch=batch)))
    T, W = range(len(spec.templates)), spec.attributes

    def group_mean(t, g, w):
        ws = spec.groups[g]
        return sum(lp[(t, x, w)] for x in ws) / len(ws)

    delta, by_attr = {}, {}
    for g1, g2 in combinations(spec.groups, 2):
        per_w = {w: sum(group_mean(t, g1, w) - group_mean(t, g2, w) for t in T) / len(T) for w in W}
        delta[f"{g1}_vs_{g2}"] = round(sum(per_w.values()) / len(W), 6)
        by_attr[f"{g1}_vs_{g2}"] = {w: round(v, 6) for w, v in per_w.items()}
    kl = {}
    for g, ws in spec.groups.items():
        total = 0.0
        for t in T:
            neutral = [_renorm([lp[(t, n, w)] for w in W]) for n in spec.neutral]
            ref = [sum(col) / len(neutral) for col in zip(*neutral)]
            total += sum(_kl(_renorm([lp[(t, x, w)] for w in W]), ref) for x in ws) / len(ws)
        kl[g] = round(max(0.0, total / len(T)), 6)
    return {"n_templates": len(spec.templates), "n_attributes": len(W),
            "groups": {g: len(ws) for g, ws in spec.groups.items()}, "n_neutral": len(spec.neutral),
            "scoring": "whole word: all its subword positions masked at once, log-probabilities summed",
            "multi_token_attributes": sorted(multi), "delta_bias": delta, "delta_by_attribute": by_attr,
            "kl_to_neutral": kl, "kl_to_neutral_mean": round(sum(kl.values()) / len(kl), 6)}


__all__ = ["TemplateSpec", "load_templates", "audit_templates"]
