"""The MLflow UI at a glance (issue 24 item 11), against real MLflow (SQLite in tmp_path) and the session's
Prefect harness: run names that differ where the runs table still shows them, sectioned metric names with the
loss first (the same for a live and a synced run), and model versions with a handful of tags plus one gate table.

One tiny pipeline (en + ru fox sentences, 20 training steps) is run once for the module; the gates are chosen so
that some pass (min_top1 >= 0, top-1 margin >= -1) and one fails (ECE <= 0: a calibration error is never 0).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import write_en_ru_config

MODEL = "glance-model"
GATES = {"min_top1": 0.0, "min_top1_over_baseline": -1.0, "max_ece": 0.0}
LANGS = ("en", "ru")


def ui_order(keys) -> list[str]:
    """The chart order of MLflow 3.17's run page (server/js, ``RunsChartsCardConfig.getBaseChartAndSectionConfigs``):
    a chart's section is its name up to the last '/', named sections are sorted by name, unprefixed names
    ("Model metrics") come after them, and the charts of a section are sorted by name."""
    def section(k):
        return k.rsplit("/", 1)[0] if "/" in k else None
    named = sorted({section(k) for k in keys} - {None})
    order = []
    for s in named + [None]:
        order += sorted(k for k in keys if section(k) == s)
    return order


@pytest.fixture(scope="module")
def piped(tmp_path_factory, prefect_harness):
    from flows.pipeline import normalize_flow, pipeline
    tmp = tmp_path_factory.mktemp("glance")
    cfg = write_en_ru_config(
        tmp, "glance", 40, tracking={"experiment": "glance"},
        tokenizer={"vocab_size": 300, "heldout_docs": 5, "min_vocab_fraction": 0.1, "max_fertility": 20},
        shards={"seq_len": 16, "workers": 1, "validation_fraction": 0.25},
        pretrain={"model": {"size": "tiny", "max_positions": 16}, "steps": 20, "batch_size": 8, "lr": 2e-3,
                  "eval_every": 10, "checkpoint_every": 20, "warmup_steps": 2, "log_every": 5},
        registry={"model_name": MODEL, "gates": GATES})
    results = pipeline(config_path=str(cfg))
    # two more runs of the same selection that differ only in an override (a threshold: the output is reused)
    for rate in ("0.55", "0.65"):
        normalize_flow(config_path=str(cfg), overrides=[f"normalize.max_quarantine_rate={rate}"])
    return {"cfg": cfg, "uri": f"sqlite:///{tmp / 'work' / 'mlflow.db'}", "results": results}


def _runs(uri: str, experiment: str = "glance"):
    from mlflow import MlflowClient
    c = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = c.get_experiment_by_name(experiment)
    return c, c.search_runs([exp.experiment_id], max_results=1000)


def _stage_run(runs, stage: str):
    hits = [r for r in runs if r.data.tags.get("stage") == stage and r.data.tags.get("cache") == "miss"]
    assert len(hits) == 1, [r.info.run_name for r in hits]
    return hits[0]


def test_pipeline_run_names_differ_where_the_table_shows_them(piped):
    _, runs = _runs(piped["uri"])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    names = sorted(r.info.run_name for r in parents)
    assert len(parents) == 3, names
    over = [n for n in names if "max_quarantine_rate" in n]
    assert len(over) == 2 and over[0][:25] != over[1][:25], over     # the value sits inside the visible part
    assert len({n[:25] for n in names}) == 3, names
    stages = sorted(r.info.run_name for r in runs if r.data.tags.get("stage") == "pretrain")
    assert stages and all(n.startswith("pretrain ") for n in stages), stages


def test_pretrain_metrics_are_sectioned_with_the_loss_first(piped):
    c, runs = _runs(piped["uri"])
    pre = _stage_run(runs, "pretrain")
    keys = set(pre.data.metrics)
    assert keys and all("/" in k and k.split("/", 1)[0] in ("train", "val") for k in keys), sorted(keys)
    assert ui_order(keys)[0] == "train/loss", ui_order(keys)[:5]
    # the curve is the training records' loss, one point per logged step (metrics.jsonl: 5, 10, 15, 20)
    records = [json.loads(x) for x in (Path(piped["results"][3]["path"]) / "metrics.jsonl").read_text().splitlines()]
    want = {r["step"]: r["loss"] for r in records if r["type"] == "train"}
    got = {m.step: m.value for m in c.get_metric_history(pre.info.run_id, "train/loss")}
    assert got == pytest.approx(want) and sorted(want) == [5, 10, 15, 20]
    # in-training validation per language: the [MASK]-only accuracy and its baseline, as at the last eval
    last_eval = [r for r in records if r["type"] == "eval"][-1]
    for lg in LANGS:
        assert pre.data.metrics[f"val/{lg}/mask_acc"] == pytest.approx(last_eval[f"{lg}.val_mask_acc"])
        assert pre.data.metrics[f"val/{lg}/mask_baseline_acc"] == pytest.approx(last_eval[f"{lg}.val_mask_baseline_acc"])
    ev = _stage_run(runs, "evaluate")
    assert all(k.startswith("eval/") for k in ev.data.metrics), sorted(ev.data.metrics)
    assert {f"eval/{lg}/top1" for lg in LANGS} <= set(ev.data.metrics)


def test_synced_run_gets_the_names_of_the_live_one(piped, tmp_path):
    from mlm_core.config.io import load_config
    from tasks.tracking.sync import sync
    other = f"sqlite:///{tmp_path / 'other.db'}"     # a server that never saw these runs
    lc = load_config(str(piped["cfg"]), [f"tracking.uri={other}"])
    sync(lc)
    _, live = _runs(piped["uri"])
    _, synced = _runs(other)
    for stage in ("normalize", "pretrain", "evaluate"):
        a, b = _stage_run(live, stage), _stage_run(synced, stage)
        assert set(a.data.metrics) == set(b.data.metrics), (stage, set(a.data.metrics) ^ set(b.data.metrics))
        assert a.data.metrics == pytest.approx(b.data.metrics)


def test_model_version_has_a_handful_of_tags_and_one_gate_table(piped):
    import mlflow
    c, runs = _runs(piped["uri"])
    mv = c.get_model_version(MODEL, "1")
    own = {k: v for k, v in mv.tags.items() if not k.startswith("alias.")}    # alias history: tasks.aliases
    assert len(own) <= 8, sorted(own)
    # the alias history is one tag per alias the version received (its move as JSON), not one per field
    moves = {k for k in mv.tags if k.startswith("alias.")}
    assert moves <= {"alias.candidate", "alias.champion"}, sorted(moves)
    assert all(json.loads(mv.tags[k])["by"] == "pipeline" for k in moves)
    assert own["gates"] == "failed" and own["failed_gates"] == "max_ece/en,max_ece/ru", own
    assert own["evaluation"] in ("passed", "failed") and own["pretrain_fingerprint"] == piped["results"][3]["fingerprint"]
    assert not any(k.startswith("gate.") for k in mv.tags)
    assert "gates/v1.json" in mv.description, mv.description
    # the table: every declared gate, per language, with its value, threshold and verdict
    got = Path(mlflow.artifacts.download_artifacts(run_id=mv.run_id, artifact_path="gates/v1.json",
                                                   tracking_uri=piped["uri"]))
    table = json.loads(got.read_text())
    rows = {r[0]: dict(zip(table["columns"], r)) for r in table["data"]}
    assert set(rows) == {f"{g}/{lg}" for g in GATES for lg in LANGS}, sorted(rows)
    ev = json.loads((Path(piped["results"][4]["path"]) / "manifest.json").read_text())["languages"]
    for lg in LANGS:        # independent: the evaluate output's own figures against the declared thresholds
        figures = {"min_top1": ev[lg]["top1"], "min_top1_over_baseline": ev[lg]["top1"] - ev[lg]["baseline_top1"],
                   "max_ece": ev[lg]["ece"]}
        for g, thr in GATES.items():
            r = rows[f"{g}/{lg}"]
            assert r["threshold"] == thr and r["value"] == pytest.approx(figures[g], rel=1e-3, abs=1e-6), r
            assert r["pass"] is (figures[g] >= thr if g.startswith("min_") else figures[g] <= thr), r
    reg = _stage_run(runs, "register")
    assert "gates/v1.json" in {f.path for f in c.list_artifacts(reg.info.run_id, "gates")}
