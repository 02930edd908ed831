"""tasks.tracking against real MLflow 3 with a SQLite file in tmp_path (no mocks)."""
from __future__ import annotations

import math
import os
import pickle
import socket
import time
from pathlib import Path

import pytest

for _k, _v in {"MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_LOGGING_LEVEL": "WARNING",
               "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
               "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}.items():
    os.environ.setdefault(_k, _v)

from mlm_core.config import TrackingConfig  # noqa: E402
from tasks import tracking  # noqa: E402
from tasks.tracking import Tracker, TrackingError  # noqa: E402

import mlflow  # noqa: E402,F401  (a required dependency: missing must fail loudly, not skip the module)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def logged(tmp_path, monkeypatch):
    """A pipeline run with two stage runs, logged from an unrelated CWD."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    workdir = tmp_path / "work"
    artifact = tmp_path / "vocab.txt"
    artifact.write_text("[CLS]\nle\ncafé\n", encoding="utf-8")
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}", encoding="utf-8")

    tr = Tracker(TrackingConfig(experiment="t-exp"), workdir)
    parent = tr.start_pipeline("pipe-1", {"seed": 0, "normalize": {"min_chars": 5}}, tags={"git": "abc"})
    norm = tr.log_stage(
        "normalize", fingerprint="fp-norm-0001", cache_hit=False,
        params={"normalize": {"min_chars": 5, "unicode_form": "NFKC"}, "long": "x" * 7000},
        metrics={"records": 12, "quarantine_rate": 0.25, "bad": "n/a", "nan": float("nan")},
        artifacts=[artifact, folder], artifact_dir="outputs",
        dicts={"manifest.json": {"counts": {"records": 12}}, "validation/result.json": {"success": True}},
        tables={"stats.json": __import__("pandas").DataFrame({"lang": ["fr", "sw"], "docs": [7, 5]})},
        inputs=[{"name": "raw-fr", "source": str(tmp_path / "fr.txt"), "digest": "fp-norm-0001",
                 "context": "input"}],
        tags={"validation": "passed"})
    tok = tr.log_stage("tokenizer", fingerprint="fp-tok-0002", cache_hit=True,
                       params={"vocab_size": 1000}, metrics={"vocab_size": 1000.0})
    tr.set_stage_tags(tok, {"validation": "failed"})
    tr.log_text(tok, "# summary", "validation/summary.md")
    tr.end_pipeline()
    return tr, parent, norm, tok, workdir, cwd


def test_parent_and_nested_stage_runs(logged):
    import mlflow
    from mlflow import MlflowClient

    tr, parent, norm, tok, workdir, cwd = logged
    assert tr.uri == f"sqlite:///{workdir.resolve()}/mlflow.db"
    assert tr.parent_run_id is None  # ended
    assert pickle.loads(pickle.dumps(tr)).uri == tr.uri  # travels into Prefect tasks
    c = MlflowClient(tracking_uri=tr.uri)
    assert c.get_run(parent).info.status == "FINISHED"
    assert c.get_run(parent).data.params["normalize.min_chars"] == "5"

    mlflow.set_tracking_uri(tr.uri)
    df = mlflow.search_runs(experiment_names=["t-exp"], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert set(df["run_id"]) == {norm, tok}

    run = c.get_run(norm)
    p, m, t = run.data.params, run.data.metrics, run.data.tags
    assert p["normalize.min_chars"] == "5" and p["normalize.unicode_form"] == "NFKC"
    assert len(p["long"]) <= 6000
    assert m["records"] == 12.0 and m["quarantine_rate"] == 0.25 and math.isnan(m["nan"]) and "bad" not in m
    assert t["stage"] == "normalize" and t["fingerprint"] == "fp-norm-0001" and t["cache"] == "miss"
    assert t["validation"] == "passed" and run.info.run_name == "normalize fp-norm-"   # stage, fingerprint[:8]
    assert run.info.status == "FINISHED"

    t2 = c.get_run(tok).data.tags
    assert t2["cache"] == "hit" and t2["validation"] == "failed"

    # artifacts live in the workdir, not in the CWD
    art_root = Path(run.info.artifact_uri.removeprefix("file://"))
    assert art_root.is_relative_to(workdir.resolve())
    for rel in ("manifest.json", "validation/result.json", "stats.json", "outputs/vocab.txt",
                "outputs/tok/tokenizer.json"):
        assert (art_root / rel).is_file(), rel
    assert (Path(c.get_run(tok).info.artifact_uri.removeprefix("file://")) / "validation/summary.md").is_file()
    assert not (cwd / "mlruns").exists() and not (cwd / "mlflow.db").exists()
    assert tr.run_url(norm) is None  # sqlite: no UI link


def test_lineage_inputs(logged):
    from mlflow import MlflowClient

    tr, _, norm, tok, _, _ = logged
    c = MlflowClient(tracking_uri=tr.uri)
    inputs = c.get_run(norm).inputs.dataset_inputs
    assert len(inputs) == 1
    ds = inputs[0].dataset
    assert ds.digest == "fp-norm-0001" and ds.name == "raw-fr" and ds.source_type == "local"
    assert {t.key: t.value for t in inputs[0].tags}["mlflow.data.context"] == "input"
    assert not c.get_run(tok).inputs.dataset_inputs


def test_stage_without_parent_and_failed_status(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)
    tr = Tracker(TrackingConfig(), tmp_path / "w")
    rid = tr.log_stage("normalize", fingerprint="f", cache_hit=False, params={}, metrics={},
                       inputs=[{"name": "x", "source": "s3://bucket/x", "digest": "d" * 64, "context": "training"}],
                       status="FAILED")
    run = MlflowClient(tracking_uri=tr.uri).get_run(rid)
    assert run.info.status == "FAILED" and "mlflow.parentRunId" not in run.data.tags
    di = run.inputs.dataset_inputs[0]
    assert len(di.dataset.digest) == 36 and {t.key: t.value for t in di.tags}["digest"] == "d" * 64
    with pytest.raises(TrackingError, match="does not exist"):
        tr.log_stage("x", fingerprint="f", cache_hit=False, params={}, metrics={},
                     artifacts=[tmp_path / "missing"])


def test_unreachable_server_fails_fast(tmp_path):
    uri = f"http://127.0.0.1:{_free_port()}"
    t0 = time.time()
    with pytest.raises(TrackingError, match=uri.replace(".", r"\.")):
        tracking.check_tracking_server(uri)
    with pytest.raises(TrackingError, match="mlm serve"):
        Tracker(TrackingConfig(uri=uri), tmp_path)
    assert time.time() - t0 < 5


def test_check_sqlite_and_file_store(tmp_path):
    uri = f"sqlite:///{tmp_path}/a/b/mlflow.db"
    tracking.check_tracking_server(uri)
    assert (tmp_path / "a" / "b").is_dir()
    with pytest.raises(TrackingError, match="maintenance"):
        tracking.check_tracking_server(f"file://{tmp_path}/mlruns")


def test_registry_versions_and_aliases(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tr = Tracker(TrackingConfig(experiment="reg"), tmp_path / "w")
    weights = tmp_path / "model"
    weights.mkdir()
    (weights / "config.json").write_text("{}", encoding="utf-8")
    rid = tr.log_stage("pretrain", fingerprint="fp", cache_hit=False, params={}, metrics={},
                       artifacts=[weights])
    uri = tr.uri
    assert tracking.get_alias_version(uri, "mlm-tiny", "champion") is None  # no model yet
    v1 = tracking.register_version(tr, "mlm-tiny", rid, "model", tags={"fingerprint": "fp"}, description="first")
    v2 = tracking.register_version(uri, "mlm-tiny", rid, "model")
    assert (v1, v2) == (1, 2)
    assert tracking.get_alias_version(uri, "mlm-tiny", "champion") is None  # model, no alias
    tracking.set_alias(uri, "mlm-tiny", "candidate", v2)
    tracking.set_alias(uri, "mlm-tiny", "champion", v1)
    assert tracking.get_alias_version(uri, "mlm-tiny", "champion") == 1
    tracking.set_alias(uri, "mlm-tiny", "champion", v2)
    assert tracking.get_alias_version(uri, "mlm-tiny", "champion") == 2
    assert tracking.get_alias_version(uri, "mlm-tiny", "candidate") == 2
    tracking.tag_version(uri, "mlm-tiny", v2, {"gates": "passed"})

    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=uri, registry_uri=uri)
    mv = c.get_model_version("mlm-tiny", "2")
    assert mv.tags["gates"] == "passed" and mv.run_id == rid and mv.source == f"runs:/{rid}/model"
    assert c.get_model_version("mlm-tiny", "1").tags["fingerprint"] == "fp"
    assert tracking.list_registered_models(uri) == ["mlm-tiny"]
    assert not (tmp_path / "mlruns").exists()


def test_disabled_tracker_is_noop(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tr = Tracker(TrackingConfig(enabled=False, uri="http://127.0.0.1:1"), tmp_path / "w")
    assert tr.start_pipeline("p", {"a": 1}) is None
    assert tr.log_stage("s", fingerprint="f", cache_hit=False, params={"a": 1}, metrics={"m": 1.0},
                        dicts={"x.json": {}}) is None
    assert tr.set_stage_tags("r", {"a": "b"}) is None
    assert tr.log_text("r", "t", "t.txt") is None
    assert tr.run_url("r") is None and tr.parent_run_id is None
    assert tr.end_pipeline("FAILED") is None
    assert list(tmp_path.iterdir()) == []


def test_params_flatten_and_run_url():
    assert tracking.flatten_params({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None, "f": {}}) == {
        "a.b": "1", "a.c.d": "[1, 2]", "e": "None", "f": "{}"}
    tr = Tracker.__new__(Tracker)
    tr.__dict__.update(enabled=True, uri="http://h:5000/", _experiment_id="3")
    assert tr.run_url("abc") == "http://h:5000/#/experiments/3/runs/abc?workflowType=machine_learning"   # training view


def test_resolve_uri(tmp_path):
    assert tracking.resolve_tracking_uri(TrackingConfig(uri="http://x:1"), tmp_path) == "http://x:1"
    assert tracking.resolve_tracking_uri(TrackingConfig(), tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
