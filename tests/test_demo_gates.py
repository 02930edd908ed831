"""The demo's claims, checked on the demo itself: configs/demo.yaml with its own gates, shortened only in
pretraining steps and transfer epochs, run stage by stage in-process (no Prefect: ~1 min on 2 cores).

- Every language has >= 500 masked positions in the evaluate stage and >= 500 distinct masked positions in
  the pretrain validation (zh's 5% hash split alone held ~150 tokens: one packed row, 16 positions).
- The model the pipeline would promote passes every demo gate, the bootstrap-interval gate included
  (the lower end of the 95% interval of top-1 - baseline top-1 above 0 in all seven languages).
- Transfer's source score comes from held-out data, not the training file.
"""
from __future__ import annotations

import json

import pytest

from conftest import REPO

# 1,200 steps in the demo; at 500 the margins are already clear (README: the full run's figures)
SHORT = ["pretrain.steps=500", "pretrain.eval_every=500", "pretrain.checkpoint_every=500",
         "evaluate.pll_sentences=0", "evaluate.finetune.epochs=1"]
MIN_POSITIONS = 500


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    from mlm_core import stages
    from mlm_core.configio import load_config
    work = tmp_path_factory.mktemp("demo") / "work"
    lc = load_config(REPO / "configs" / "demo.yaml", [f"workdir={work}", *SHORT])
    plans = stages.plan(lc)
    arts = {name: stages.execute(lc, name, plans)[0] for name in stages.STAGES}
    return lc, arts


def test_every_language_has_enough_validation_positions(demo_run):
    lc, arts = demo_run
    langs = lc.config.languages
    evaluation = json.loads((arts["evaluate"].path / "evaluation.json").read_text())
    pretrain_eval = json.loads((arts["pretrain"].path / "eval.json").read_text())["eval"]
    for lang in langs:
        assert evaluation["intrinsic"][lang]["n_positions"] >= MIN_POSITIONS, lang
        assert pretrain_eval[lang]["positions"] >= MIN_POSITIONS, lang
        assert arts["shards"].manifest["languages"][lang]["content_tokens_validation"] \
            >= lc.config.shards.min_validation_tokens


def test_the_demo_model_passes_the_demo_gates(demo_run):
    lc, arts = demo_run
    gates = {g["name"]: g for g in arts["register"].manifest["gates"]}
    interval = [f"top1_over_baseline_ci_above/{lang}" for lang in lc.config.languages]
    assert set(interval) <= set(gates)
    assert [n for n, g in gates.items() if not g["passed"]] == []
    assert arts["register"].manifest["passed"] is True
    for name in interval:
        assert gates[name]["value"] > 0


def test_transfer_source_score_is_held_out(demo_run):
    _, arts = demo_run
    tr = json.loads((arts["evaluate"].path / "evaluation.json").read_text())["transfer"]
    for task in ("upos", "classification"):
        assert tr[task]["source_score_on"] == "held-out" and tr[task]["n_source_test"] > 0
