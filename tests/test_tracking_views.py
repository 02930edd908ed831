"""One tracking store and MLflow views that read well (issue 14 items 3 and 4), against real MLflow (SQLite in
tmp_path) and the session's Prefect harness; the served store is checked with a tiny HTTP server standing in
for `mlm serve` (health checks only) and, in the slow test, a real `mlflow server` over the CLI's store."""
from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, write_en_ru_config


# ------------------------------------------------------------------------------------ serve state file
class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        ok = self.path in ("/health", "/api/health")
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b"OK" if ok else b"")

    def log_message(self, *a):
        pass


@pytest.fixture
def fake_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _dead_url() -> str:
    from flows.serve import free_port
    return f"http://127.0.0.1:{free_port()}"      # nothing listens there


def _state(workdir: Path, mlflow_url: str, prefect_url: str, auth: bool = False) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "serve.json").write_text(json.dumps({"mlflow_url": mlflow_url, "api_url": prefect_url + "/api",
                                                    "prefect_url": prefect_url, "auth": auth}))


@pytest.fixture
def clean_env(monkeypatch):
    for k in ("MLM_TRACKING_URI", "PREFECT_API_URL", "PREFECT_HOME", "MLFLOW_TRACKING_USERNAME",
              "PREFECT_API_AUTH_STRING"):
        monkeypatch.setenv(k, "-")     # recorded, so whatever the code under test sets is undone afterwards
        monkeypatch.delenv(k)
    return monkeypatch


def test_cli_uses_the_served_store_when_it_answers(tmp_path, fake_server, clean_env):
    from flows.serve.state import adopt_servers
    wd = tmp_path / "work"
    _state(wd, fake_server, fake_server)
    used = adopt_servers(wd)
    assert os.environ["MLM_TRACKING_URI"] == fake_server
    assert os.environ["PREFECT_API_URL"] == fake_server + "/api"
    assert os.environ["PREFECT_HOME"] == str(wd / "prefect")
    assert len(used) == 2


def test_cli_falls_back_when_the_servers_do_not_answer(tmp_path, clean_env):
    from flows.serve.state import adopt_servers
    wd = tmp_path / "work"
    _state(wd, _dead_url(), _dead_url())            # a stale file after a crash
    t0 = time.monotonic()
    assert adopt_servers(wd, timeout=1.0) == []
    assert time.monotonic() - t0 < 5
    assert "MLM_TRACKING_URI" not in os.environ and "PREFECT_API_URL" not in os.environ
    assert adopt_servers(tmp_path / "no-such-workdir") == []
    (wd / "serve.json").write_text('{"mlflow_u')   # half a file
    assert adopt_servers(wd) == []


def test_explicit_settings_win_over_the_state_file(tmp_path, fake_server, clean_env):
    from flows.serve.state import adopt_servers
    wd = tmp_path / "work"
    _state(wd, fake_server, fake_server)
    clean_env.setenv("MLM_TRACKING_URI", "sqlite:////elsewhere/mlflow.db")
    clean_env.setenv("PREFECT_API_URL", "http://my-prefect/api")
    assert adopt_servers(wd) == []
    assert os.environ["MLM_TRACKING_URI"] == "sqlite:////elsewhere/mlflow.db"
    assert os.environ["PREFECT_API_URL"] == "http://my-prefect/api"
    clean_env.delenv("MLM_TRACKING_URI")
    assert adopt_servers(wd, tracking_uri_set=True) == []   # the config's tracking.uri
    assert "MLM_TRACKING_URI" not in os.environ
    _state(wd, fake_server, fake_server, auth=True)          # --require-auth, no credentials here: skipped
    clean_env.delenv("PREFECT_API_URL")
    assert adopt_servers(wd) == [] and "PREFECT_API_URL" not in os.environ


def test_serve_plan_serves_the_cli_store():
    from flows.serve import Plan
    wd = Path("/tmp/some-workdir")
    cmd = Plan(wd, "127.0.0.1", 4200, 5000, "p", None).mlflow_server().cmd
    assert cmd[cmd.index("--backend-store-uri") + 1] == f"sqlite:///{wd}/mlflow.db"   # what Tracker writes locally
    assert cmd[cmd.index("--default-artifact-root") + 1] == str(wd / "mlartifacts")


# ------------------------------------------------------------------------------------ runs and experiment
def test_run_tags_experiment_kind_and_final_metric_step(tmp_path):
    from mlflow import MlflowClient

    from mlm_core.config import TrackingConfig
    from tasks.tracking import Tracker

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    tr = Tracker(TrackingConfig(experiment="views-exp"), tmp_path / "work")
    parent = tr.start_pipeline("p", {})
    run = tr.log_stage("pretrain", fingerprint="f", cache_hit=False, params={}, metrics={"en.val_acc": 0.5},
                       step=300)
    tr.end_pipeline()
    c = MlflowClient(tr.uri)
    if len(head) == 40:                               # a git checkout (CI clones one)
        assert c.get_run(parent).data.tags["mlflow.source.git.commit"] == head
        assert c.get_run(run).data.tags["mlflow.source.git.commit"] == head
    assert c.get_experiment(tr.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert [m.step for m in c.get_metric_history(run, "en.val_acc")] == [300]

    # an experiment made before (no kind) gets the tag; a user's own choice is left alone
    c.create_experiment("old-exp")
    Tracker(TrackingConfig(experiment="old-exp"), tmp_path / "work")
    assert c.get_experiment_by_name("old-exp").tags["mlflow.experimentKind"] == "custom_model_development"
    e = c.create_experiment("genai-exp", tags={"mlflow.experimentKind": "genai_development"})
    Tracker(TrackingConfig(experiment="genai-exp"), tmp_path / "work")
    assert c.get_experiment(e).tags["mlflow.experimentKind"] == "genai_development"


def test_pipeline_run_name():
    from tasks.tracking import pipeline_run_name
    when = time.mktime((2026, 12, 1, 16, 40, 0, 0, 0, -1))
    assert pipeline_run_name("demo", when=when) == "all · demo · 12-01 16:40"
    assert pipeline_run_name("demo", only="shards", when=when) == "only shards · demo · 12-01 16:40"
    assert pipeline_run_name("demo", from_stage="pretrain", when=when) == "from pretrain · demo · 12-01 16:40"
    assert pipeline_run_name("demo", only="pretrain", when=when, overrides=["pretrain.lr=0.001", "seed=2"]) == \
        "lr=0.001 seed=2 · only pretrain · demo · 12-01 16:40"


# ------------------------------------------------------------------------------------ through the flow
@pytest.fixture
def cfg_file(tmp_path):
    return write_en_ru_config(tmp_path, "views", 30, tracking={"experiment": "views"})


def test_stage_run_spans_the_work_and_links_back(cfg_file, prefect_harness, monkeypatch):
    from mlflow import MlflowClient

    from flows.pipeline import normalize_flow
    from mlm_core import stages

    real = stages.execute

    def slow(*a, **kw):                               # a stage whose work takes at least 1 s
        time.sleep(1.0)
        return real(*a, **kw)

    monkeypatch.setattr(stages, "execute", slow)
    t_before = time.time()
    state = normalize_flow(config_path=str(cfg_file), return_state=True)
    assert state.is_completed()
    c = MlflowClient(f"sqlite:///{cfg_file.parent / 'work' / 'mlflow.db'}")
    exp = c.get_experiment_by_name("views")
    runs = c.search_runs([exp.experiment_id])
    stage = next(r for r in runs if r.data.tags.get("stage") == "normalize")
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    assert stage.info.end_time - stage.info.start_time >= 1000, (stage.info.start_time, stage.info.end_time)
    assert stage.info.start_time >= int(t_before * 1000) - 1000
    assert parent.info.run_name.startswith("only normalize · views · "), parent.info.run_name
    flow_run_id = str(state.state_details.flow_run_id)
    assert stage.data.tags["prefect.flow_run_id"] == flow_run_id == parent.data.tags["prefect.flow_run_id"]
    assert parent.data.tags["prefect.flow_run_url"].endswith(f"/runs/flow-run/{flow_run_id}"), parent.data.tags
    assert "mlflow.source.git.commit" in stage.data.tags or not (REPO / ".git").exists()

    # GE Data Docs: one HTML page per validated table, next to result.json
    docs = [f.path for f in c.list_artifacts(stage.info.run_id, "validation/data_docs")]
    assert docs and all(p.endswith(".html") for p in docs), docs
    page = Path(c.download_artifacts(stage.info.run_id, docs[0], str(cfg_file.parent / "dl"))).read_text()
    assert "<html" in page.lower() and "Expectation Validation Result" in page and "rendering failed" not in page
    assert "<script src=\"http" not in page and "bootstrapcdn" not in page   # shows in MLflow's frame offline


# ------------------------------------------------------------------------------------ a real served store
@pytest.mark.heavy
def test_real_mlflow_server_over_the_cli_store(tmp_path):
    """A run logged through `mlflow server` (as `mlm serve` starts it) lands in <workdir>/mlflow.db, where a
    CLI run without the server finds it (one store), with its artifacts in <workdir>/mlartifacts."""
    from mlflow import MlflowClient

    from flows.serve import Plan, free_port, stop_children
    from mlm_core.config import TrackingConfig
    from tasks.tracking import Tracker

    wd = (tmp_path / "work").resolve()
    plan = Plan(wd, "127.0.0.1", free_port(), free_port(), "p", None)
    child = plan.mlflow_server()
    child.start()
    try:
        deadline = time.monotonic() + 120
        from flows.serve import mlflow_up
        while not mlflow_up(plan):
            assert child.alive() and time.monotonic() < deadline, child.tail()
            time.sleep(0.5)
        served = Tracker(TrackingConfig(experiment="one-store", uri=plan.mlflow_url), wd)
        parent = served.start_pipeline("served", {})
        run = served.log_stage("normalize", fingerprint="f", cache_hit=False, params={}, metrics={"m": 1.0},
                               dicts={"manifest.json": {"a": 1}})
        served.end_pipeline()
        from flows.serve import http_get      # what the UI fetches: the server reads the workdir's artifact files
        status, body = http_get(f"{plan.mlflow_url}/get-artifact?path=manifest.json&run_uuid={run}", timeout=10)
        assert status == 200 and json.loads(body) == {"a": 1}, (status, body[:300])
    finally:
        stop_children([child], grace=10)
    local = Tracker(TrackingConfig(experiment="one-store"), wd)    # the CLI's store, no server
    c = MlflowClient(local.uri)
    assert {r.info.run_id for r in c.search_runs([local.experiment_id])} == {parent, run}
    assert c.get_run(run).info.artifact_uri.startswith(str(wd / "mlartifacts"))
    # and the CLI can keep logging to the experiment the server created (its artifact location is a path)
    tok = local.log_stage("tokenizer", fingerprint="g", cache_hit=False, params={}, metrics={}, dicts={"x.json": {}})
    assert c.get_run(tok).info.status == "FINISHED"


@pytest.mark.heavy
def test_mlm_run_logs_to_a_running_mlm_serve(tmp_path):
    """`mlm serve` for a workdir, then `mlm run` with a config using that workdir: the run is in the served
    MLflow (same mlflow.db) and in the served Prefect, and its MLflow runs link to the Prefect flow run."""
    from mlflow import MlflowClient
    from test_servers import MLM, _serve_env, _tiny_config, mlm_serve

    wd = (tmp_path / "srv").resolve()
    config = _tiny_config(tmp_path)
    with mlm_serve(wd) as (pport, mport, state):
        assert state["mlflow_store"] == f"sqlite:///{wd}/mlflow.db"
        env = _serve_env(wd / "prefect")
        r = subprocess.run([*MLM, "run", str(config), "--only", "normalize", "--set", f"workdir={wd}"], cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert f"logging to the servers of `mlm serve` (MLflow http://127.0.0.1:{mport}" in r.stderr, r.stderr[-2000:]
        c = MlflowClient(f"http://127.0.0.1:{mport}")
        exp = c.get_experiment_by_name("mlm-e2e")
        runs = c.search_runs([exp.experiment_id])
        stage = next(x for x in runs if x.data.tags.get("stage") == "normalize")
        assert stage.data.tags["prefect.flow_run_url"].startswith(f"http://127.0.0.1:{pport}/runs/flow-run/")
        assert stage.data.tags["prefect.flow_run_id"] in stage.data.tags["prefect.flow_run_url"]
    # the same runs in the workdir's own store, where `mlm run` logs when no server runs
    local = MlflowClient(f"sqlite:///{wd}/mlflow.db")
    assert stage.info.run_id in {x.info.run_id for x in local.search_runs([exp.experiment_id])}
