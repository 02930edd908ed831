"""Issue 13 part 1's test: on a controlled toy corpus where one group term co-occurs with one profession ("he" is
a pilot 90% of the time; "she" and "someone" uniform over five professions; ``bias_toy``), CDA (shards.cda, share
1.0) and the regularizer (pretrain.bias_regularizer) each move the template audit towards neutral versus no
mitigation. The whole pipeline runs (normalize -> tokenizer -> shards -> pretrain -> audit, ``mlm_core.stages``),
fixed seeds, one torch thread, 600 steps of a 2-layer pre-LN rotary model (rotary: the profession slot learns to
look at the subject within the budget; learned positions did not in 1000 steps).

Measured here (2 shared cores, seed 7; the test took 40-45 s):
    variant                     Δ_bias(male, female)  KL-to-neutral(male)  Δ(pilot)   val acc
    none                        -0.191567             0.026764             0.302794   0.606
    CDA (share 1.0)              0.000164             0.000009            -0.000685   0.606
    regularizer (λ 0.1, layer 0) -0.000097             0.000002             0.000272   0.591
(λ 1 at layer 0: Δ 1e-6 but val acc 0.528; λ 10 collapsed training; λ 0.1 at layer 1: acc 0.496.)
Margin stated by the test: a mitigation must bring |Δ_bias| and KL-to-neutral(male) below a quarter of the
unmitigated values (measured: below 1/100), and the unmitigated model must show the bias (|Δ_bias| > 0.1, KL > 0.01;
measured 0.19, 0.027), so the comparison cannot pass on a model that learned nothing.
"""
from __future__ import annotations

import pytest

from bias_toy import run_variant, toy_corpus, measured_rates, write_inputs

pytestmark = pytest.mark.usefixtures("one_torch_thread")
STEPS = 600
MARGIN = 0.25           # a mitigation keeps at most this share of the unmitigated |Δ_bias| and KL-to-neutral(male)
REG = {"weight": 0.1, "layer": 0}


def test_toy_corpus_carries_the_planted_association():
    rates = measured_rates(toy_corpus())
    assert rates["he"] == pytest.approx(0.9, abs=0.03)
    assert rates["she"] == pytest.approx(0.2, abs=0.03) and rates["someone"] == pytest.approx(0.2, abs=0.03)


@pytest.mark.heavy
def test_cda_and_the_regularizer_move_the_template_audit_towards_neutral(tmp_path):
    files = write_inputs(tmp_path)
    res = {"none": run_variant(tmp_path, files, steps=STEPS),
           "cda": run_variant(tmp_path, files, steps=STEPS, cda=True),
           "regularizer": run_variant(tmp_path, files, steps=STEPS, reg=REG)}
    audit = {k: v["templates"] for k, v in res.items()}
    delta = {k: abs(a["delta_bias"]["male_vs_female"]) for k, a in audit.items()}
    kl = {k: a["kl_to_neutral"]["male"] for k, a in audit.items()}
    summary = {k: (delta[k], kl[k], audit[k]["delta_by_attribute"]["male_vs_female"]["pilot"]) for k in audit}
    # the unmitigated model learned the planted association: "he" makes "pilot" more likely than "she" does
    assert delta["none"] > 0.1 and kl["none"] > 0.01, summary
    assert audit["none"]["delta_by_attribute"]["male_vs_female"]["pilot"] > 0.1, summary
    for k in ("cda", "regularizer"):
        assert delta[k] < MARGIN * delta["none"], (k, summary)
        assert kl[k] < MARGIN * kl["none"], (k, summary)
    # each variant really used its method (not a cached unmitigated run)
    assert res["cda"]["fingerprints"]["shards"] != res["none"]["fingerprints"]["shards"]
    assert res["cda"]["shards"]["cda"]["languages"]["en"]["swapped"] > 0
    assert res["regularizer"]["pretrain"]["bias_regularizer"]["groups"] == ["male", "female"]
    assert "bias_regularizer" not in res["none"]["pretrain"]
