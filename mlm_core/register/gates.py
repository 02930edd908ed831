"""Promotion gates: does the candidate model deserve the alias ``champion``?

In: the declared thresholds (``GatesConfig``; a threshold of None = gate not declared), the evaluation
report and the audit report. Out: one ``GateResult`` per check (per language for the per-language
gates), and ``all_passed``.

Evaluation shape read here (missing keys fail the gate that needs them, with a detail saying what is
missing; nothing is read as zero):
    {"intrinsic": {lang: {"top1", "baseline_top1", "top1_over_baseline_ci_low", "ece", "rtd_acc"?,
                          "rtd_baseline_acc"?, "rtd_auc"?,
                          "missing"?: bool | reason}},
     "transfer": {task: {"source_score", "targets": {lang: {"score", "gain_over_untrained_ci_low"?, "missing"?}}}},
     "efficiency": {"device", "parameters", "latency_ms": {"p95"}, "throughput": {"sequences_per_s"},
                    "peak_memory_mb": {seq_len: MB}}}
Audit shape: {"crows": {lang: {"metric_score"}}}.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

NO_DATA = "no held-out data"


def transfer_gap(source_score: float, target_score: float) -> float:
    """The zero-shot transfer gap, one sign everywhere (evaluation report, gate, model card, ``mlm evaluate``):
    source − target, so a positive gap is what transfer lost (the XTREME "cross-lingual transfer gap")."""
    return source_score - target_score


@dataclass(frozen=True)
class GateResult:
    name: str            # gate, with the language when per language: "min_top1/en"
    passed: bool
    value: float | None  # the measured value (None when it could not be computed)
    threshold: float
    detail: str

    def to_dict(self) -> dict:
        return asdict(self)


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _check(name: str, value: float | None, threshold: float, lower_bound: bool, what: str,
           missing: str | None = None) -> GateResult:
    if value is None:
        return GateResult(name, False, None, threshold, missing or f"{what} not reported")
    ok = value >= threshold if lower_bound else value <= threshold
    op = (">=" if ok else "<") if lower_bound else ("<=" if ok else ">")
    return GateResult(name, ok, round(value, 6), threshold, f"{what} {value:.4f} {op} {threshold:g}")


def _intrinsic_gates(evaluation: dict, gate: str, threshold: float, lower_bound: bool, what: str, get) -> list:
    intr = evaluation.get("intrinsic") if isinstance(evaluation, dict) else None
    if not isinstance(intr, dict) or not intr:
        return [GateResult(gate, False, None, threshold, "no intrinsic evaluation in the report")]
    out = []
    for lang in sorted(intr):
        rec = intr[lang] if isinstance(intr[lang], dict) else {}
        name = f"{gate}/{lang}"
        if not rec or rec.get("missing"):
            out.append(GateResult(name, False, None, threshold, NO_DATA))
            continue
        value, missing = get(rec)
        out.append(_check(name, value, threshold, lower_bound, f"{lang}: {what}", f"{lang}: {missing}"))
    return out


def _top1(rec):
    v = _num(rec.get("top1"))
    return v, ("" if v is not None else "top1 not reported")


def _margin(rec):
    t, b = _num(rec.get("top1")), _num(rec.get("baseline_top1"))
    if t is None or b is None:
        return None, f"{'top1' if t is None else 'baseline_top1'} not reported"
    return t - b, ""


def _margin_ci_low(rec):
    v = _num(rec.get("top1_over_baseline_ci_low"))
    return v, ("" if v is not None else "no bootstrap interval of top1 - baseline_top1 (top1_over_baseline_ci_low)")


def _strictly_above(results: list, threshold: float) -> list:
    """The interval gate is strict (the lower end must exceed the threshold): re-judge the >= of _check."""
    out = []
    for r in results:
        if r.value is None:
            out.append(r)
            continue
        ok = r.value > threshold
        detail = r.detail.rsplit(" ", 2)[0] + f" {'>' if ok else '<='} {threshold:g}"
        out.append(GateResult(r.name, ok, r.value, r.threshold, detail))
    return out


def _rtd_margin(rec):
    a, b = _num(rec.get("rtd_acc")), _num(rec.get("rtd_baseline_acc"))
    if a is None or b is None:
        return None, "no replaced-token detection metrics (not an ELECTRA discriminator)"
    return a - b, ""


def _rtd_auc(rec):
    v = _num(rec.get("rtd_auc"))
    return v, ("" if v is not None else "no replaced-token detection AUC (not an ELECTRA discriminator)")


def _ece(rec):
    v = _num(rec.get("ece"))
    return v, ("" if v is not None else "ece not reported")


def _crows_gates(audit: dict, threshold: float) -> list:
    crows = audit.get("crows") if isinstance(audit, dict) else None
    if not isinstance(crows, dict) or not crows:
        return [GateResult("max_crows_deviation", False, None, threshold,
                           "no CrowS-Pairs audit ran (audit.crows_pairs is empty)")]
    out = []
    for lang in sorted(crows):
        score = _num((crows[lang] or {}).get("metric_score"))
        name = f"max_crows_deviation/{lang}"
        if score is None:
            out.append(GateResult(name, False, None, threshold, f"{lang}: no CrowS-Pairs metric score"))
        else:
            out.append(_check(name, abs(score - 50.0), threshold, False,
                              f"{lang}: |metric score {score:.2f} - 50|"))
    return out


def _transfer_gate(evaluation: dict, threshold: float) -> list:
    name = "max_transfer_gap"
    tr = evaluation.get("transfer") if isinstance(evaluation, dict) else None
    if not isinstance(tr, dict) or not tr:
        return [GateResult(name, False, None, threshold, "no zero-shot transfer evaluation in the report")]
    gaps, problems = [], []
    for task in sorted(tr):
        if task == "retrieval":   # no source/target protocol: retrieval pairs languages, it fine-tunes nothing
            continue
        rec = tr[task] if isinstance(tr[task], dict) else {}
        src, targets = _num(rec.get("source_score")), rec.get("targets")
        if src is None:
            problems.append(f"{task}: no source_score")
            continue
        if not isinstance(targets, dict) or not targets:
            problems.append(f"{task}: no targets")
            continue
        for lang in sorted(targets):
            t = targets[lang] if isinstance(targets[lang], dict) else {}
            score = _num(t.get("score"))
            if t.get("missing") or score is None:
                problems.append(f"{task}/{lang}: {NO_DATA if t.get('missing') else 'no score'}")
            else:
                gaps.append((transfer_gap(src, score), task, lang))
    if problems:
        worst = max(gaps)[0] if gaps else None
        return [GateResult(name, False, None if worst is None else round(worst, 6), threshold, "; ".join(problems))]
    gap, task, lang = max(gaps)
    return [_check(name, gap, threshold, False, f"worst gap {task}/{lang} (source - target)")]


def _gain_gates(evaluation: dict, threshold: float) -> list:
    """min_transfer_gain_over_untrained: per task and target, the lower end of the gain interval > threshold."""
    gate = "min_transfer_gain_over_untrained"
    tr = evaluation.get("transfer") if isinstance(evaluation, dict) else None
    tasks = {k: v for k, v in (tr or {}).items() if k != "retrieval"} if isinstance(tr, dict) else {}
    if not tasks:
        return [GateResult(gate, False, None, threshold, "no zero-shot transfer evaluation in the report")]
    out = []
    for task in sorted(tasks):
        targets = tasks[task].get("targets") if isinstance(tasks[task], dict) else None
        if not isinstance(targets, dict) or not targets:
            out.append(GateResult(f"{gate}/{task}", False, None, threshold, f"{task}: no targets"))
            continue
        for lang in sorted(targets):
            t = targets[lang] if isinstance(targets[lang], dict) else {}
            name, where = f"{gate}/{task}/{lang}", f"{task}/{lang}"
            low = _num(t.get("gain_over_untrained_ci_low"))
            if t.get("missing") or _num(t.get("score")) is None:
                why = NO_DATA if t.get("missing") else "no score"
                out.append(GateResult(name, False, None, threshold, f"{where}: {why}"))
            elif low is None:
                out.append(GateResult(name, False, None, threshold, f"{where}: no untrained-encoder control "
                                      "(gain_over_untrained_ci_low; evaluate.untrained_control is off?)"))
            else:
                ok = low > threshold
                out.append(GateResult(name, ok, round(low, 6), threshold,
                                      f"{where}: lower end of the 95% interval of score - untrained_score "
                                      f"{low:.4f} {'>' if ok else '<='} {threshold:g}"))
    return out


def _largest_memory(eff: dict) -> float | None:
    mem = eff.get("peak_memory_mb") if isinstance(eff.get("peak_memory_mb"), dict) else {}
    known = [(int(k), _num(v)) for k, v in mem.items() if _num(v) is not None]
    return max(known)[1] if known else None


# efficiency gates: (config field, what, lower bound?, value from evaluate's "efficiency" report)
_EFFICIENCY = (
    ("max_p95_latency_ms", "p95 latency at batch 1 (ms)", False, lambda e: _num((e.get("latency_ms") or {}).get("p95"))),
    ("min_throughput", "throughput at batch 32 (sequences/s)", True,
     lambda e: _num((e.get("throughput") or {}).get("sequences_per_s"))),
    ("max_peak_memory_mb", "peak memory at the longest measured seq_len (MB)", False, _largest_memory),
    ("max_parameters", "parameters", False, lambda e: _num(e.get("parameters"))),
)


def _efficiency_gates(gates, evaluation: dict) -> list:
    eff = evaluation.get("efficiency") if isinstance(evaluation, dict) else None
    out = []
    for field, what, lower, get in _EFFICIENCY:
        threshold = getattr(gates, field, None)
        if threshold is None:
            continue
        if not isinstance(eff, dict) or not eff:
            out.append(GateResult(field, False, None, threshold, "no efficiency report (evaluate.efficiency is off)"))
            continue
        out.append(_check(field, get(eff), threshold, lower, f"{what} on {eff.get('device', '?')}"))
    return out


def evaluate_gates(gates, evaluation: dict, audit: dict) -> list[GateResult]:
    """Every declared gate (``gates``: a ``GatesConfig``; a None threshold is not declared and not listed).

    min_top1, min_top1_over_baseline, top1_over_baseline_ci_above (strict: the lower end of the bootstrap
    95% interval of top1 - baseline_top1 must exceed the threshold), max_ece, min_rtd_acc_over_baseline,
    min_rtd_auc (ELECTRA's
    discriminator): one result per evaluated language; a language marked
    ``missing`` fails with "no held-out data". max_crows_deviation: one per audited language,
    |metric score − 50|. max_transfer_gap: one result, the largest source − target score over tasks and
    target languages. min_transfer_gain_over_untrained (strict): one result per transfer task and target, the
    lower end of the 95% interval of score − untrained_score must exceed the threshold. max_p95_latency_ms, min_throughput, max_peak_memory_mb, max_parameters: one result each,
    from evaluate's "efficiency" report (the detail names the device). A gate whose input is absent fails with
    a detail naming what is absent.
    """
    evaluation, audit = evaluation or {}, audit or {}
    out: list[GateResult] = []
    if gates.min_top1 is not None:
        out += _intrinsic_gates(evaluation, "min_top1", gates.min_top1, True, "top1", _top1)
    if gates.min_top1_over_baseline is not None:
        out += _intrinsic_gates(evaluation, "min_top1_over_baseline", gates.min_top1_over_baseline, True,
                                "top1 - baseline_top1", _margin)
    if getattr(gates, "top1_over_baseline_ci_above", None) is not None:
        t = gates.top1_over_baseline_ci_above
        out += _strictly_above(_intrinsic_gates(evaluation, "top1_over_baseline_ci_above", t, True,
                                                "lower end of the 95% interval of top1 - baseline_top1",
                                                _margin_ci_low), t)
    if gates.max_ece is not None:
        out += _intrinsic_gates(evaluation, "max_ece", gates.max_ece, False, "ECE", _ece)
    if getattr(gates, "min_rtd_acc_over_baseline", None) is not None:
        out += _intrinsic_gates(evaluation, "min_rtd_acc_over_baseline", gates.min_rtd_acc_over_baseline, True,
                                "rtd_acc - rtd_baseline_acc", _rtd_margin)
    if getattr(gates, "min_rtd_auc", None) is not None:
        out += _intrinsic_gates(evaluation, "min_rtd_auc", gates.min_rtd_auc, True, "rtd_auc", _rtd_auc)
    if gates.max_crows_deviation is not None:
        out += _crows_gates(audit, gates.max_crows_deviation)
    if gates.max_transfer_gap is not None:
        out += _transfer_gate(evaluation, gates.max_transfer_gap)
    if getattr(gates, "min_transfer_gain_over_untrained", None) is not None:
        out += _gain_gates(evaluation, gates.min_transfer_gain_over_untrained)
    out += _efficiency_gates(gates, evaluation)
    return out


def all_passed(results: list[GateResult]) -> bool:
    """True when every gate passed (vacuously True when none is declared)."""
    return all(r.passed for r in results)


__all__ = ["GateResult", "evaluate_gates", "all_passed", "NO_DATA"]
