"""What the Prefect UI shows (issue 14 item 6): the pipeline-level summary artifact on the parent flow run, and
`mlm deploy` returning only once a worker polls every deployment. Under the session's Prefect test harness;
the full-pipeline summary (registered version, gates table) is checked in tests/test_flows.py."""
from __future__ import annotations

import pytest

from conftest import write_en_ru_config


@pytest.fixture
def cfg_file(tmp_path):
    return write_en_ru_config(tmp_path, "views", 30, tracking={"experiment": "views"})


def summary_of(flow_run_id) -> str:
    """What the UI shows of the ``pipeline-summary`` artifact attached to that flow run (exactly one): its
    description, then its markdown."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
    with get_client(sync_client=True) as c:
        arts = c.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["pipeline-summary"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    assert len(arts) == 1, arts
    return f"{arts[0].description}\n{arts[0].data}"


def _normalize_run_id(cfg_file) -> str:
    import mlflow
    mlflow.set_tracking_uri(f"sqlite:///{cfg_file.parent / 'work' / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["views"], output_format="list", order_by=["attributes.start_time DESC"],
                              filter_string="tags.stage = 'normalize'")
    return runs[0].info.run_id


def test_pipeline_summary_on_the_parent_flow_run(cfg_file, prefect_harness):
    from flows.pipeline import normalize_flow, pipeline
    state = normalize_flow(config_path=str(cfg_file), return_state=True)
    assert state.is_completed()
    md = summary_of(state.state_details.flow_run_id)
    run_id = _normalize_run_id(cfg_file)                  # read back from MLflow, not from the flow's result
    assert md.startswith("views (only normalize): completed\n")
    assert md.count("views (only normalize)") == 1           # the title once (issue 24 item 12: it was twice)
    assert "| normalize | ran | miss |" in md and f"`{run_id}`" in md, md
    assert f"`mlm run {cfg_file} --only normalize`" in md  # the CLI command this run equals
    assert "registered model: none (this run did not include pretrain or register)" in md

    again = normalize_flow(config_path=str(cfg_file), return_state=True)
    assert "| normalize | cached | hit |" in summary_of(again.state_details.flow_run_id)

    # a failed run: the failing stage and the stages it kept from running are named
    failed = pipeline(config_path=str(cfg_file), overrides=["normalize.min_docs_per_language=1000"], return_state=True)
    assert failed.is_failed()
    md = summary_of(failed.state_details.flow_run_id)
    assert md.startswith("views (all stages): FAILED at normalize\n"), md
    assert md.count("views (all stages)") == 1
    assert "| normalize | FAILED |" in md and "| tokenizer | not run |" in md and "| register | not run |" in md
    assert "--set normalize.min_docs_per_language=1000" in md
    assert "registered model: none (the run failed at normalize)" in md


def test_deploy_waits_until_every_deployment_is_ready(prefect_harness, capsys, monkeypatch):
    """A deployment is READY only once a worker polled its pool; before that `mlm deploy` must not return 0."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL

    from flows.deploy import (deploy, ensure_work_pool, flow_specs, not_ready_message, online_workers,
                              wait_until_ready)

    pool = "h10-views"
    ensure_work_pool(pool)
    with get_client(sync_client=True) as c:
        fid = c.create_flow_from_name("mlm-views-probe")
        c.create_deployment(flow_id=fid, name="default", work_pool_name=pool, entrypoint="flows/pipeline.py:pipeline")
    names = ["mlm-views-probe/default"]
    pending = wait_until_ready(names + ["no-such-flow/default"], timeout=1.5, interval=0.5)
    assert pending == {"mlm-views-probe/default": "NOT_READY", "no-such-flow/default": "MISSING"}
    msg = not_ready_message(pending, pool, 1.5, online_workers(pool))
    assert "2 deployment(s) not ready" in msg and "mlm-views-probe/default (NOT_READY)" in msg
    assert f"no worker is polling pool {pool}" in msg and "mlm serve" in msg

    with get_client(sync_client=True) as c:    # what a worker does every PREFECT_WORKER_QUERY_SECONDS
        c.get_scheduled_flow_runs_for_work_pool(pool)
    assert wait_until_ready(names, timeout=30, interval=0.5) == {}

    # the command itself: deployments applied, no worker on the pool -> exit 1 naming every deployment
    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())   # deploy() sets it: restored after the test
    assert deploy(api_url=PREFECT_API_URL.value(), pool=pool, wait=2) == 1
    err = capsys.readouterr().err
    assert f"{len(flow_specs())} deployment(s) not ready after 2s" in err and "mlm-pipeline/default (NOT_READY)" in err, err
    assert "mlm-register/default (NOT_READY)" in err


def test_summary_title_is_shown_once(monkeypatch):
    """Issue 24 item 12, without a server: the description carries the title; the markdown has no heading."""
    import types

    import prefect.artifacts
    import prefect.context

    from tasks import summary
    made = {}
    monkeypatch.setattr(prefect.context.FlowRunContext, "get", classmethod(lambda cls: object()))
    monkeypatch.setattr(prefect.artifacts, "create_markdown_artifact", lambda **kw: made.update(kw))
    tracker = types.SimpleNamespace(run_url=lambda run_id: None, enabled=False, uri="sqlite:///x.db")
    results = [{"stage": "normalize", "cache_hit": False, "seconds": 1.5, "fingerprint": "f" * 16,
                "mlflow_run_id": None, "validation": "passed"}]
    md = summary.publish("demo (only normalize)", ["normalize"], results, None, tracker, "m", "`mlm run c.yaml`", None)
    assert made["description"] == "demo (only normalize): completed"
    assert made["markdown"] == md and "demo (only normalize)" not in md and not md.startswith("#")
    assert "| normalize | ran | miss | 1.5 | passed |" in md
