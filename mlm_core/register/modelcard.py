"""The model card: one markdown page telling what the model was trained on, how it scores, and why it
was (or was not) promoted.

In: the typed stage outputs (``mlm_core.artifacts``: TokenizerArtifact, PretrainedModel; or plain dicts with the
same keys), the data summary and reports of the run (any key may be absent: it shows as "—"), the gate
results and the promotion decision. Out: markdown text. Sections follow Mitchell et al. (2019),
"Model Cards for Model Reporting": details, training data, evaluation, quantitative analyses (per
language), ethical considerations (the bias audit and its limits), and the decision.
"""
from __future__ import annotations

import math

from mlm_core.artifacts import PretrainedModel, ShardSet, StageArtifact, TokenizerArtifact
from mlm_core.register.gates import transfer_gap

DASH = "—"


def _fmt(x, digits: int = 4) -> str:
    if x is None or isinstance(x, bool):
        return DASH if x is None else str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return DASH if not math.isfinite(x) else f"{x:.{digits}f}"
    return str(x)


def _cell(x, digits: int = 4) -> str:
    return _fmt(x, digits).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list]) -> list[str]:
    if not rows:
        return ["_(none)_"]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) if not isinstance(c, str) else c.replace("|", "\\|") for c in r) + " |"
            for r in rows]
    return out


def _get(d, *keys):
    """``d[k1][k2]...`` (None where absent); a typed artifact is read by its fields, by one name each (a name that
    is not one of its manifest keys is an error, not a silent blank)."""
    for k in keys:
        if isinstance(d, StageArtifact):
            if k not in d.keys():
                raise KeyError(f"{type(d).__name__} has no manifest key {k!r} (keys: {', '.join(d.keys())})")
            d = getattr(d, k)
            continue
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _data_section(data: dict) -> list[str]:
    langs = _get(data, "languages") or {}
    alpha = _get(data, "sampling_alpha")
    weights = _get(data, "sampling_weights") or {}
    rows = [[lang, _get(p, "docs"), _get(p, "chars"), _get(p, "bytes"), _get(p, "duplicates"),
             _get(p, "quarantined"), _get(p, "train_tokens"), _fmt(weights.get(lang))]
            for lang, p in sorted(langs.items())]
    out = ["## Training data", "", f"Languages: {', '.join(sorted(langs)) or DASH}. "
           f"Language sampling exponent α = {_fmt(alpha, 2)} (p(l) ∝ n_l^α).", ""]
    out += _table(["lang", "docs", "chars", "bytes", "duplicates dropped", "quarantined", "training tokens",
                   "sampling weight p(l)"], rows)
    counts = _get(data, "counts") or {}
    if counts:
        out += ["", f"Total: {_fmt(counts.get('docs'))} documents, {_fmt(counts.get('chars'))} characters; "
                f"quarantine rate {_fmt(_get(data, 'quarantine_rate'))}."]
    return out + [""]


def _tokenizer_section(tok: TokenizerArtifact | dict) -> list[str]:
    out = ["## Tokenizer", "", f"Algorithm: {_fmt(_get(tok, 'algorithm'))}, vocabulary {_fmt(_get(tok, 'vocab_size'))} "
           f"(requested {_fmt(_get(tok, 'vocab_size_requested'))}), special tokens {_fmt(_get(tok, 'style'))}, "
           f"lowercase {_fmt(_get(tok, 'lowercase'))}.", ""]
    langs = _get(tok, "languages") or {}
    rows = [[lang, _get(s, "tokens_per_word"), _get(s, "tokens_per_char"), _get(s, "unk_rate")]
            for lang, s in sorted(langs.items())]
    return out + _table(["lang", "tokens/word (fertility)", "tokens/char", "UNK rate"], rows) + [""]


def _training_section(tr: PretrainedModel | dict) -> list[str]:
    arch = _get(tr, "arch") or {}
    # family / attention / window / global_every are in a stored arch only away from their defaults (bert,
    # global): a BERT card is unchanged
    shape = ", ".join(f"{k} {arch[k]}" for k in ("family", "layers", "hidden", "heads", "ffn", "position", "norm",
                                                  "max_positions", "vocab_size", "attention", "window",
                                                  "global_every") if k in arch)
    out = ["## Training", "", f"Objective: {_fmt(_get(tr, 'objective'))}. Architecture: {shape or DASH}.",
           f"Steps: {_fmt(_get(tr, 'steps'))}; tokens seen: {_fmt(_get(tr, 'tokens'))}; parameters: "
           f"{_fmt(_get(tr, 'counts', 'params'))}; final training loss: {_fmt(_get(tr, 'final_loss'))}.", ""]
    ev = _get(tr, "eval") or {}
    if ev:
        rows = [[lang, _get(r, "loss"), _get(r, "acc"), _get(r, "baseline_acc")] for lang, r in sorted(ev.items())]
        out += ["Validation at the end of training:", ""]
        out += _table(["lang", "loss", "masked accuracy", "unigram baseline"], rows) + [""]
    return out


def _evaluation_section(ev: dict) -> list[str]:
    out = ["## Evaluation", "", "### Masked-token prediction (held-out text, per language)", ""]
    intr = _get(ev, "intrinsic") or {}
    rows = []
    for lang, r in sorted(intr.items()):
        if not isinstance(r, dict) or r.get("missing"):
            rows.append([lang, "no held-out data", DASH, DASH, DASH, DASH])
            continue
        t, b = r.get("top1"), r.get("baseline_top1")
        margin = t - b if isinstance(t, (int, float)) and isinstance(b, (int, float)) else None
        rows.append([lang, t, b, margin, r.get("ece"), _fmt(r.get("perplexity"), 2)])
    out += _table(["lang", "top-1", "unigram baseline top-1", "margin", "ECE", "(pseudo-)perplexity"], rows)
    out += ["", "### Zero-shot cross-lingual transfer (fine-tuned on the source language only)", "",
            "Untrained encoder: the same architecture at the run's seed, no pretraining, fine-tuned the same way "
            "(evaluate.untrained_control); the gain's 95% interval is a paired bootstrap over target sentences.", ""]
    rows = []
    for task, r in sorted((_get(ev, "transfer") or {}).items()):
        src, src_lang = _get(r, "source_score"), _get(r, "source_lang")
        if src is None and not _get(r, "targets"):        # retrieval: no source / target protocol
            continue
        src_gain = _get(r, "source_gain_over_untrained") or {}
        rows.append([task, f"{src_lang} (source)" if src_lang else "source", src, DASH,
                     _get(r, "untrained", "source_score"), _gain_cell(src_gain)])
        for lang, t in sorted((_get(r, "targets") or {}).items()):
            score = _get(t, "score")
            gap = transfer_gap(src, score) if isinstance(src, (int, float)) and isinstance(score, (int, float)) else None
            rows.append([task, lang, score, gap, _get(t, "untrained_score"), _gain_cell(t)])
        zs = _get(r, "zero_shot")
        if isinstance(zs, dict):
            rows.append([task, f"zero-shot mean ({len(zs.get('targets') or [])} targets)", _get(zs, "score"), DASH,
                         _get(zs, "untrained_score"), _gain_cell(zs)])
    out += _table(["task", "language", "score", "gap (source − target)", "untrained encoder",
                   "gain over untrained [95% CI]"], rows)
    return out + [""] + _efficiency_section(_get(ev, "efficiency") or {})


def _gain_cell(t) -> str:
    """``+0.0412 [+0.0301, +0.0525]`` from a target's gain_over_untrained and its interval (— when absent)."""
    g, lo, hi = (_get(t, k) for k in ("gain_over_untrained", "gain_over_untrained_ci_low", "gain_over_untrained_ci_high"))
    if not isinstance(g, (int, float)):
        return DASH
    ci = f" [{lo:+.4f}, {hi:+.4f}]" if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) else ""
    return f"{g:+.4f}{ci}"


def _efficiency_section(eff: dict) -> list[str]:
    """Parameters, latency, throughput and peak memory (mlm_core.evaluate.efficiency), with the device."""
    if not eff:
        return []
    lat, thr, mem = eff.get("latency_ms") or {}, eff.get("throughput") or {}, eff.get("peak_memory_mb") or {}
    out = ["### Efficiency", "", f"Measured on {eff.get('device', DASH)} ({eff.get('device_kind', DASH)}, "
           f"{eff.get('threads', DASH)} threads); inference forward of the encoder, {lat.get('repeats', DASH)} timed "
           "passes per figure.", ""]
    rows = [["parameters", f"{eff['parameters']:,}" if isinstance(eff.get("parameters"), int) else DASH],
            [f"latency p50 / p95, batch 1, seq {lat.get('seq_len', DASH)} (ms)",
             f"{_fmt(lat.get('p50'), 2)} / {_fmt(lat.get('p95'), 2)}"],
            [f"throughput, batch {thr.get('batch', DASH)}, seq {thr.get('seq_len', DASH)} (sequences/s)",
             _fmt(thr.get("sequences_per_s"), 1)]]
    rows += [[f"peak memory, batch {eff.get('memory_batch', DASH)}, seq {seq} (MB)", _fmt(v, 1)]
             for seq, v in sorted(mem.items(), key=lambda kv: int(kv[0]))]
    return out + _table(["metric", "value"], rows) + [""]


def bias_mitigations(shards: ShardSet | dict | None, training: PretrainedModel | dict, audit: dict) -> dict:
    """The mitigations this model was trained and scored with, from its stored outputs: ``shards.cda`` (the
    shards manifest's counts), ``pretrain.bias_regularizer`` (the pretrain manifest's config) and
    ``debias.projection`` (the audit's record). {} when none was used (the card is then as before)."""
    got = {"cda": _get(shards, "cda"), "regularizer": _get(training, "config", "pretrain", "bias_regularizer"),
           "projection": _get(audit, "debias", "projection")}
    return {k: v for k, v in got.items() if v}


def _mitigation_lines(m: dict) -> list[str]:
    if not m:
        return []
    rows = []
    cda = m.get("cda")
    if cda:
        per = "; ".join(f"{lang}: {_fmt(_get(v, 'swapped'))} documents, {_fmt(_get(v, 'words'))} words swapped"
                        for lang, v in sorted((_get(cda, "languages") or {}).items()))
        rows.append(["counterfactual data augmentation (`shards.cda`)", "training data",
                     f"share {_fmt(_get(cda, 'share'), 2)} of the listed languages' training documents; {per or DASH}"])
    reg = m.get("regularizer")
    if reg:
        rows.append(["representation regularizer (`pretrain.bias_regularizer`)", "training",
                     f"λ {_fmt(_get(reg, 'weight'))}, layer {_fmt(_get(reg, 'layer'))}, lists: "
                     f"{', '.join(sorted(_get(reg, 'lists') or {})) or DASH}"])
    proj = m.get("projection")
    if proj:
        sents = ", ".join(f"{lang} {_fmt(n)}" for lang, n in sorted((_get(proj, "sentences") or {}).items()))
        var = ", ".join(_fmt(v, 3) for v in _get(proj, "explained_variance") or [])
        rows.append(["SentenceDebias projection (`debias.projection`)", "scoring",
                     f"k = {_fmt(_get(proj, 'components'))} components removed from the final hidden states; "
                     f"sentence pairs {sents or DASH}; explained variance {var or DASH}"])
    out = ["### Mitigation", ""] + _table(["method", "applied to", "details"], rows) + [""]
    if proj:
        out += ["**The audit scores below, and the evaluation metrics above, are of the projected representations.** "
                "The exported model itself is NOT projected: to score as here, apply "
                "`mlm_core.bias.projection.apply_projection` with the subspace stored in the audit output "
                f"(`{_get(proj, 'file') or 'projection.safetensors'}`).", ""]
    return out


def _audit_section(audit: dict, mitigations: dict | None = None) -> list[str]:
    out = ["## Bias audit", ""] + _mitigation_lines(mitigations or {}) + ["### CrowS-Pairs (% of pairs where the model prefers the more stereotypical "
           "sentence; 50 = no preference)", ""]
    rows = [[lang, _get(r, "n"), _fmt(_get(r, "metric_score"), 2), _fmt(_get(r, "stereo_score"), 2),
             _fmt(_get(r, "antistereo_score"), 2), _fmt(_get(r, "neutral_pct"), 2), _get(r, "n_empty_sentence")]
            for lang, r in sorted((_get(audit, "crows") or {}).items())]
    out += _table(["lang", "pairs", "metric score", "stereo score", "anti-stereo score", "neutral %",
                   "pairs with an empty sentence (neutral)"], rows)
    out += ["", "### Templates (Δ = mean log p(attribute | group 1) − log p(attribute | group 2); "
            "KL = divergence of the attribute distribution from the neutral context)", ""]
    rows = []
    for lang, r in sorted((_get(audit, "templates") or {}).items()):
        deltas = ", ".join(f"{k} {_fmt(v)}" for k, v in sorted((_get(r, "delta_bias") or {}).items())) or DASH
        kls = ", ".join(f"{k} {_fmt(v)}" for k, v in sorted((_get(r, "kl_to_neutral") or {}).items())) or DASH
        rows.append([lang, deltas, kls, ", ".join(_get(r, "multi_token_attributes") or []) or DASH])
    out += _table(["lang", "Δ_bias", "KL to neutral", "multi-token attributes"], rows)
    limits = _get(audit, "limits")
    out += ["", "**Limits.** " + (limits or "No limits statement was provided with the audit.")]
    return out + [""]


def _gates_section(gates: list, promoted: bool) -> list[str]:
    out = ["## Promotion gates", ""]
    rows = [[g.name, "pass" if g.passed else "**FAIL**", g.value, g.threshold, g.detail] for g in gates]
    out += _table(["gate", "result", "value", "threshold", "detail"], rows) if gates else ["_(no gate declared)_"]
    failed = [g.name for g in gates if not g.passed]
    out += ["", "## Decision", ""]
    if promoted:
        out.append("**Promoted** to alias `champion`: every declared gate passed.")
    else:
        why = f"failing gate(s): {', '.join(failed)}" if failed else "promotion was not requested"
        out.append(f"**Not promoted** to `champion` ({why}); `candidate` is the latest version that passed evaluation.")
    return out + [""]


def summary(training: PretrainedModel | dict, evaluation: dict | None = None, gates: list | None = None,
            promoted: bool | None = None) -> str:
    """The card's first paragraph (also the registered version's description): architecture and objective,
    languages, steps and tokens, then, once known, the held-out top-1 against the unigram baseline and the
    promotion decision. ``evaluation`` None: not evaluated yet (at registration, before the evaluate stage)."""
    tr = training or {}
    arch = _get(tr, "arch") or {}
    shape = ", ".join(f"{arch[k]} {w}" for k, w in (("layers", "layers"), ("hidden", "hidden"), ("heads", "heads"))
                      if k in arch)
    langs = sorted(_get(tr, "eval") or {})
    out = [f"Multilingual masked language model ({_fmt(_get(tr, 'objective'))}"
           + (f"; {shape}" if shape else "") + f") pretrained by mlm-pipeline on {', '.join(langs) or DASH}: "
           f"{_fmt(_get(tr, 'steps'))} steps, {_fmt(_get(tr, 'tokens'))} tokens, final training loss "
           f"{_fmt(_get(tr, 'final_loss'))}."]
    if evaluation is None:
        out.append("Not evaluated yet.")
    else:
        intr = {k: v for k, v in (_get(evaluation, "intrinsic") or {}).items() if isinstance(v, dict) and not v.get("missing")}
        beats = [k for k, v in intr.items() if isinstance(v.get("top1"), (int, float))
                 and isinstance(v.get("baseline_top1"), (int, float)) and v["top1"] > v["baseline_top1"]]
        top1 = [v["top1"] for v in intr.values() if isinstance(v.get("top1"), (int, float))]
        out.append(f"Held-out masked-token top-1 {_fmt(min(top1)) if top1 else DASH}–{_fmt(max(top1)) if top1 else DASH} "
                   f"across languages; above the unigram baseline in {len(beats)}/{len(intr)}.")
    if gates is not None:
        failed = [g.name for g in gates if not g.passed]
        out.append("Every promotion gate passed: champion." if promoted else
                   f"Not promoted (failed: {', '.join(failed) or 'none'}).")
    return " ".join(out)


def model_card(*, name: str, version, fingerprints: dict, data: dict, tokenizer: TokenizerArtifact | dict | None,
               training: PretrainedModel | dict,
               evaluation: dict, audit: dict, gates: list, promoted: bool, mitigations: dict | None = None) -> str:
    """The markdown model card (sections: details, training data, tokenizer, training, evaluation,
    zero-shot transfer, bias audit with its limits and mitigations (``bias_mitigations``), promotion gates,
    decision)."""
    fp_rows = [[stage, f"`{fp}`"] for stage, fp in sorted((fingerprints or {}).items())]
    lines = [f"# Model card: {name} (version {_fmt(version)})", "",
             summary(training, evaluation or {}, list(gates or []), promoted), "",
             "## Details", "", "Intended use: research and fill-mask experiments, and as a starting point for "
             "fine-tuning; not evaluated for any deployment. Provenance (content-addressed stage outputs):", ""]
    lines += _table(["stage", "fingerprint"], fp_rows) + [""]
    lines += _data_section(data or {})
    lines += _tokenizer_section(tokenizer or {})
    lines += _training_section(training or {})
    lines += _evaluation_section(evaluation or {})
    lines += _audit_section(audit or {}, mitigations)
    lines += _gates_section(list(gates or []), promoted)
    return "\n".join(lines)


__all__ = ["bias_mitigations", "model_card", "summary"]
