"""Promotion gates (pass/fail per gate, undeclared gates absent, missing data fails) and the model card."""
from __future__ import annotations

import pytest

from mlm_core.config import GatesConfig
from mlm_core.register.gates import GateResult, all_passed, evaluate_gates

EVAL = {
    "intrinsic": {"en": {"top1": 0.42, "baseline_top1": 0.10, "ece": 0.03, "perplexity": 21.5},
                  "fr": {"top1": 0.30, "baseline_top1": 0.12, "ece": 0.08, "perplexity": 35.0}},
    "transfer": {"upos": {"source_lang": "en", "source_score": 0.80,
                          "targets": {"fr": {"score": 0.70}, "de": {"score": 0.65}}},
                 "classification": {"source_score": 0.75, "targets": {"fr": {"score": 0.72}}}},
}
AUDIT = {"crows": {"en": {"metric_score": 55.17}, "fr": {"metric_score": 41.0}},
         "templates": {"en": {"delta_bias": {"female_vs_male": 0.12}, "kl_to_neutral": {"female": 0.01, "male": 0.02},
                              "multi_token_attributes": ["ambitious"]}},
         "limits": "CrowS-Pairs pairs are noisy (Blodgett et al., 2021)."}


def by_name(results):
    return {r.name: r for r in results}


def test_undeclared_gates_are_not_listed():
    none = GatesConfig(min_top1_over_baseline=None)
    assert evaluate_gates(none, EVAL, AUDIT) == [] and all_passed([])
    only = evaluate_gates(GatesConfig(), EVAL, AUDIT)  # default: min_top1_over_baseline = 0.0
    assert sorted(by_name(only)) == ["min_top1_over_baseline/en", "min_top1_over_baseline/fr"]


@pytest.mark.parametrize("gates, name, passed, value", [
    (dict(min_top1=0.35), "min_top1/en", True, 0.42),
    (dict(min_top1=0.35), "min_top1/fr", False, 0.30),
    (dict(min_top1_over_baseline=0.2), "min_top1_over_baseline/en", True, 0.32),
    (dict(min_top1_over_baseline=0.2), "min_top1_over_baseline/fr", False, 0.18),
    (dict(max_ece=0.05), "max_ece/en", True, 0.03),
    (dict(max_ece=0.05), "max_ece/fr", False, 0.08),
    (dict(max_crows_deviation=6), "max_crows_deviation/en", True, 5.17),
    (dict(max_crows_deviation=6), "max_crows_deviation/fr", False, 9.0),
    (dict(max_transfer_gap=0.2), "max_transfer_gap", True, 0.15),
    (dict(max_transfer_gap=0.1), "max_transfer_gap", False, 0.15),
])
def test_each_gate_passes_and_fails(gates, name, passed, value):
    results = by_name(evaluate_gates(GatesConfig(**{"min_top1_over_baseline": None, **gates}), EVAL, AUDIT))
    r = results[name]
    assert r.passed is passed and r.value == pytest.approx(value) and r.threshold == next(iter(gates.values()))
    if name == "max_transfer_gap":
        assert "upos/de" in r.detail  # the worst task/target is named


def test_missing_language_fails_with_no_held_out_data():
    ev = {"intrinsic": {**EVAL["intrinsic"], "hi": {"missing": True}}}
    results = by_name(evaluate_gates(GatesConfig(min_top1=0.1, min_top1_over_baseline=0.0, max_ece=0.5), ev, {}))
    for gate in ("min_top1", "min_top1_over_baseline", "max_ece"):
        r = results[f"{gate}/hi"]
        assert not r.passed and r.value is None and r.detail == "no held-out data"
        assert results[f"{gate}/en"].passed
    assert not all_passed(list(results.values()))


def test_absent_inputs_fail_with_a_clear_detail():
    results = evaluate_gates(GatesConfig(min_top1=0.1, max_crows_deviation=10, max_transfer_gap=0.5),
                             {"intrinsic": {"en": {"baseline_top1": 0.1}}}, {})
    r = by_name(results)
    assert not r["min_top1/en"].passed and "top1 not reported" in r["min_top1/en"].detail
    assert not r["max_crows_deviation"].passed and "no CrowS-Pairs audit" in r["max_crows_deviation"].detail
    assert not r["max_transfer_gap"].passed and "transfer" in r["max_transfer_gap"].detail
    ev = {"transfer": {"upos": {"source_score": 0.8, "targets": {"fr": {"score": 0.7}, "hi": {"missing": True}}}}}
    gates = GatesConfig(min_top1_over_baseline=None, max_transfer_gap=0.5)
    gap = by_name(evaluate_gates(gates, ev, {}))["max_transfer_gap"]
    assert not gap.passed and "upos/hi: no held-out data" in gap.detail
    assert evaluate_gates(GatesConfig(min_top1=0.1), {}, {})[0].detail == "no intrinsic evaluation in the report"


def test_all_passed():
    ok = GateResult("a", True, 1.0, 0.5, "")
    bad = GateResult("b", False, None, 0.5, "no held-out data")
    assert all_passed([ok]) and not all_passed([ok, bad])


def test_model_card_sections_and_decision():
    from mlm_core.register.modelcard import model_card
    gates = evaluate_gates(GatesConfig(min_top1=0.35, max_crows_deviation=10), EVAL, AUDIT)
    common = dict(
        name="mlm-demo", version=3, fingerprints={"normalize": "ab12", "pretrain": "cd34"},
        data={"languages": {"en": {"docs": 7650, "chars": 800000}, "fr": {"docs": 3261}}, "sampling_alpha": 0.3,
              "counts": {"docs": 10911}},
        tokenizer={"algorithm": "bpe", "vocab_size": 8000,
                   "languages": {"en": {"tokens_per_word": 1.3, "unk_rate": 0.0}}},
        training={"arch": {"layers": 2, "hidden": 128}, "steps": 200, "tokens": 800000, "final_loss": 3.21,
                  "eval": {"en": {"loss": 3.0, "acc": 0.4, "baseline_acc": 0.1}}},
        evaluation=EVAL, audit=AUDIT, gates=gates)
    card = model_card(**common, promoted=False)
    for section in ("# Model card: mlm-demo", "## Training data", "## Tokenizer", "## Training", "## Evaluation",
                    "Zero-shot cross-lingual transfer", "## Bias audit", "CrowS-Pairs", "Templates",
                    "**Limits.**", "Blodgett", "## Promotion gates", "## Decision"):
        assert section in card, section
    assert "α = 0.30" in card and "| en | 0.4200 | 0.1000 | 0.3200 | 0.0300 | 21.50 |" in card
    assert "| upos | de | 0.6500 | 0.1500 |" in card
    assert "| min_top1/fr | **FAIL** |" in card and "**Not promoted**" in card and "min_top1/fr" in card
    passed = [g for g in gates if g.passed]
    card = model_card(**{**common, "gates": passed}, promoted=True)
    assert "**Promoted** to alias `champion`" in card and "**FAIL**" not in card
    # sparse inputs still render
    assert "## Decision" in model_card(name="m", version=None, fingerprints={}, data={}, tokenizer={}, training={},
                                       evaluation={}, audit={}, gates=[], promoted=False)


def test_interval_gate_needs_the_lower_end_strictly_above():
    """top1_over_baseline_ci_above: the lower end of the bootstrap interval of top1 - baseline_top1 must exceed
    the threshold; a margin whose interval touches it (zh in the issue: 0.1875 vs 0.1875) fails."""
    ev = {"intrinsic": {"en": {"top1": 0.42, "baseline_top1": 0.10, "top1_over_baseline_ci_low": 0.25},
                        "fr": {"top1": 0.30, "baseline_top1": 0.12, "top1_over_baseline_ci_low": -0.01},
                        "zh": {"top1": 0.1875, "baseline_top1": 0.1875, "top1_over_baseline_ci_low": 0.0},
                        "hi": {"top1": 0.3, "baseline_top1": 0.1},
                        "ru": {"missing": True}}}
    gates = GatesConfig(min_top1_over_baseline=None, top1_over_baseline_ci_above=0.0)
    r = by_name(evaluate_gates(gates, ev, {}))
    assert r["top1_over_baseline_ci_above/en"].passed and r["top1_over_baseline_ci_above/en"].value == 0.25
    assert "> 0" in r["top1_over_baseline_ci_above/en"].detail
    assert not r["top1_over_baseline_ci_above/fr"].passed
    zh = r["top1_over_baseline_ci_above/zh"]
    assert not zh.passed and zh.value == 0.0 and "<= 0" in zh.detail      # equality fails: strictly above
    assert not r["top1_over_baseline_ci_above/hi"].passed and "no bootstrap interval" in r["top1_over_baseline_ci_above/hi"].detail
    assert r["top1_over_baseline_ci_above/ru"].detail == "no held-out data"
    # the same zh passes the old point-estimate gate (>= 0): the reason the interval gate exists
    assert by_name(evaluate_gates(GatesConfig(min_top1_over_baseline=0.0), ev, {}))["min_top1_over_baseline/zh"].passed


def test_demo_declares_the_interval_gate():
    from mlm_core.config.io import load_config
    from conftest import REPO
    gates = load_config(REPO / "configs" / "demo.yaml").config.registry.gates
    assert gates.top1_over_baseline_ci_above == 0.0


def test_transfer_gain_gate_reads_the_lower_end_of_the_interval_per_task_and_target():
    """min_transfer_gain_over_untrained: per task and target, the lower end of the 95% interval of score −
    untrained_score must be strictly above the threshold; a target without the control or without data fails,
    naming what is absent; not declared, not listed."""
    def tgt(score, untrained, low, high):
        return {"score": score, "untrained_score": untrained, "gain_over_untrained": round(score - untrained, 5),
                "gain_over_untrained_ci_low": low, "gain_over_untrained_ci_high": high}
    ev = {"transfer": {
        "upos": {"source_score": 0.8, "targets": {
            "fr": tgt(0.70, 0.60, 0.06, 0.14),      # mean +0.10, interval clear of 0
            "de": tgt(0.62, 0.60, -0.02, 0.06),     # mean +0.02 > 0, but the interval reaches below 0
            "ar": tgt(0.65, 0.60, 0.0, 0.1),        # lower end exactly 0: not strictly above
            "hi": {"missing": True},
            "zh": {"score": 0.4}}},                 # no control (evaluate.untrained_control off)
        "classification": {"source_score": 0.75, "targets": {"fr": tgt(0.72, 0.66, 0.03, 0.09)}},
        "retrieval": {"pivot": "en", "pairs": {}}}}
    gate = "min_transfer_gain_over_untrained"
    r = by_name(evaluate_gates(GatesConfig(min_top1_over_baseline=None, min_transfer_gain_over_untrained=0.0), ev, {}))
    assert sorted(r) == [f"{gate}/classification/fr", f"{gate}/upos/ar", f"{gate}/upos/de", f"{gate}/upos/fr",
                         f"{gate}/upos/hi", f"{gate}/upos/zh"]             # retrieval fine-tunes nothing: no gate
    assert r[f"{gate}/upos/fr"].passed and r[f"{gate}/upos/fr"].value == 0.06 and "> 0" in r[f"{gate}/upos/fr"].detail
    assert not r[f"{gate}/upos/de"].passed and r[f"{gate}/upos/de"].value == -0.02
    assert not r[f"{gate}/upos/ar"].passed and "<= 0" in r[f"{gate}/upos/ar"].detail
    assert not r[f"{gate}/upos/hi"].passed and r[f"{gate}/upos/hi"].detail == "upos/hi: no held-out data"
    zh = r[f"{gate}/upos/zh"]
    assert not zh.passed and zh.value is None and "no untrained-encoder control" in zh.detail and "upos/zh" in zh.detail
    assert r[f"{gate}/classification/fr"].passed
    # a higher threshold: +0.06 still clears 0.05, +0.03 does not
    r = by_name(evaluate_gates(GatesConfig(min_top1_over_baseline=None, min_transfer_gain_over_untrained=0.05), ev, {}))
    assert r[f"{gate}/upos/fr"].passed and not r[f"{gate}/classification/fr"].passed
    # absent inputs fail closed
    for bad in ({}, {"transfer": {}}, {"transfer": {"retrieval": {"pairs": {}}}}):
        (only,) = evaluate_gates(GatesConfig(min_top1_over_baseline=None, min_transfer_gain_over_untrained=0.0), bad, {})
        assert not only.passed and only.value is None and only.detail == "no zero-shot transfer evaluation in the report"
    (empty,) = evaluate_gates(GatesConfig(min_top1_over_baseline=None, min_transfer_gain_over_untrained=0.0),
                              {"transfer": {"upos": {"source_score": 0.8, "targets": {}}}}, {})
    assert not empty.passed and empty.detail == "upos: no targets"
    assert not any(g.name.startswith(gate) for g in evaluate_gates(GatesConfig(), ev, {}))     # not declared
