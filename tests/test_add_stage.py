"""Adding a stage is one declaration (issue 22 item 2; docs/ARCHITECTURE.md "Adding a stage").

A tiny ``stats`` stage after shards (one JSON: sequences per language) is added the way the docs say, but only
for this test: its code is in this module (as ``mlm_core/stats.py`` would hold it), its ``StageSpec`` is put into
``STAGES`` after shards, and its suite is written next to copies of the shipped ones. It then runs through the
generic stage task (``tasks.stage.run_stage``) with the real normalize, tokenizer and shards before it: planned,
computed, validated against its suite, published and cached, with no entry in any other registry (there is none
left: partitions, contracts and publish tables all read the spec).
"""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import write_en_ru_config
from mlm_core import stages

# The files a real stage of this kind takes, hand-written (the test stands in for each):
HAND_WRITTEN = {
    "mlm_core/stats.py": "run_stats, contract_tables, contract_parameters, stats_rows (this module)",
    "mlm_core/stages.py": "its StageSpec in STAGES (SPEC below)",
    "schemas/stats.suite.json": "its data contract (SUITE below)",
    "mlm_core/config.py": "its config section, for a stage with settings (this one reads only `seed`)",
}
# and regenerated, not written: schemas/config.schema.json, docs/CONFIG.md, deployments/prefect.yaml

SUITE = {"name": "stats", "expectations": [
    {"type": "expect_column_values_to_be_in_set", "meta": {"table": "langs"}, "severity": "critical",
     "kwargs": {"column": "lang", "value_set": {"$PARAMETER": "languages"}}},
    {"type": "expect_column_values_to_be_between", "meta": {"table": "langs"}, "severity": "critical",
     "kwargs": {"column": "sequences", "min_value": 1}},
]}


# ------------------------------------------------------------------ what mlm_core/stats.py would hold
def run_stats(lc, upstream, out_dir):
    """Sequences per language (train + validation) of the shards output, as one JSON file."""
    langs = upstream["shards"].languages           # a ShardSet: execute hands in typed outputs
    per = {lang: {"sequences": s["rows_train"] + s["rows_validation"]} for lang, s in sorted(langs.items())}
    (out_dir / "stats.json").write_text(json.dumps(per, sort_keys=True), encoding="utf-8")
    return {"languages": per, "counts": {"sequences": sum(s["sequences"] for s in per.values())}}


def contract_tables(out_dir, options):
    import pandas as pd
    per = json.loads((out_dir / "stats.json").read_text(encoding="utf-8"))
    return {"langs": pd.DataFrame([{"lang": k, "sequences": v["sequences"]} for k, v in per.items()])}


def contract_parameters(manifest):
    return {"languages": sorted(manifest["languages"])}


def stats_rows(art):
    return [{"lang": k, **v} for k, v in sorted(art.manifest["languages"].items())]


SPEC = stages.StageSpec("stats", ("shards",), code_version="1", reads=("seed",), run=run_stats,
                        suite="stats", contract_tables=f"{__name__}:contract_tables",
                        contract_parameters=f"{__name__}:contract_parameters", table=f"{__name__}:stats_rows",
                        table_title="Sequences per language", summary="count the sequences per language")


# ------------------------------------------------------------------ the test
@pytest.fixture
def with_stats(tmp_path, monkeypatch):
    schemas = tmp_path / "schemas"
    shutil.copytree(stages.SCHEMAS_DIR, schemas)
    (schemas / "stats.suite.json").write_text(json.dumps(SUITE), encoding="utf-8")
    monkeypatch.setattr(stages, "SCHEMAS_DIR", schemas)
    graph = {}
    for name, spec in stages.STAGES.items():
        graph[name] = spec
        if name == "shards":
            graph["stats"] = SPEC
    monkeypatch.setattr(stages, "STAGES", graph)
    return schemas


def _cfg(tmp_path):
    return write_en_ru_config(
        tmp_path, "addstage", 40, tracking={"enabled": False},
        tokenizer={"vocab_size": 1000, "heldout_docs": 5, "min_vocab_fraction": 0.1, "max_fertility": 20},
        shards={"seq_len": 16, "workers": 1, "validation_fraction": 0.25})


def test_a_stage_added_by_its_declaration_runs_through_the_generic_task(tmp_path, with_stats, prefect_harness):
    from mlm_core import partitions
    from mlm_core.config.io import load_config
    from tasks import publish, validation
    from tasks.stage import run_stage
    assert len(HAND_WRITTEN) <= 4
    for module, registry in ((partitions, "REGISTRY"), (validation, "TABLES"), (validation, "PARAMETERS"),
                             (publish, "TABLES"), (publish, "PLOTS"), (publish, "TABLE_TITLES")):
        assert not hasattr(module, registry), f"{module.__name__}.{registry}: a name-keyed registry is back"

    cfg = _cfg(tmp_path)
    lc = load_config(str(cfg))
    plans = stages.plan(lc)
    assert list(plans)[:4] == ["normalize", "tokenizer", "shards", "stats"]
    assert plans["stats"].upstream == {"shards": plans["shards"].fingerprint}
    assert stages.downstream_of("shards")[:2] == ["shards", "stats"]
    results = {name: run_stage.fn(str(cfg), [], name, plan=plans[name].to_json())
               for name in ("normalize", "tokenizer", "shards", "stats")}
    r = results["stats"]
    assert r["validation"] == "passed" and not r["cache_hit"]
    # its output, against the shards output it read (independently: the shards manifest's per-language rows)
    shards_manifest = json.loads((tmp_path / "work" / "shards" / plans["shards"].fingerprint / "manifest.json")
                                 .read_text(encoding="utf-8"))
    want = {lang: s["rows_train"] + s["rows_validation"] for lang, s in shards_manifest["languages"].items()}
    got = json.loads((tmp_path / "work" / "stats" / r["fingerprint"] / "stats.json").read_text(encoding="utf-8"))
    assert {k: v["sequences"] for k, v in got.items()} == want and set(want) == {"en", "ru"}
    assert r["counts"] == {"sequences": sum(want.values())}
    from mlm_core.store import StageStore
    art = StageStore(lc.workdir).load("stats", r["fingerprint"])
    assert publish.table_rows("stats", art) == [{"lang": k, "sequences": v} for k, v in sorted(want.items())]
    assert publish.table_title("stats") == "Sequences per language"
    # the contract really runs: the same output judged by a stricter suite fails, naming the expectation
    strict = {**SUITE, "expectations": [{**SUITE["expectations"][1],
                                         "kwargs": {"column": "sequences", "min_value": 10 ** 9}}]}
    (with_stats / "stats.suite.json").write_text(json.dumps(strict), encoding="utf-8")
    with pytest.raises(validation.ValidationFailed, match="sequences"):
        validation.validate_stage("stats", art.path, art.manifest)
    # a rerun reuses it (cache hit)
    (with_stats / "stats.suite.json").write_text(json.dumps(SUITE), encoding="utf-8")
    again = run_stage.fn(str(cfg), [], "stats", plan=stages.plan(lc)["stats"].to_json())
    assert again["cache_hit"] and again["fingerprint"] == r["fingerprint"]


def test_a_declared_suite_that_is_missing_fails_planning(tmp_path, with_stats):
    from mlm_core.config.io import load_config
    from mlm_core.errors import PlanError
    (with_stats / "stats.suite.json").unlink()
    with pytest.raises(PlanError, match=r"'stats' declares the data contract 'stats'.*stats\.suite\.json"):
        stages.plan(load_config(str(_cfg(tmp_path))))
