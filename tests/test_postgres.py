"""Team-scale servers (issue 10, part 3): ``mlm serve --db postgresql://... --workers 2`` on a throwaway
PostgreSQL started here (initdb into a temporary folder, pg_ctl on a free loopback port, trust auth).

- the real-server end-to-end test of tests/test_servers.py passes against it, and what it logged is in
  PostgreSQL (MLflow runs, Prefect flow runs), with no SQLite store in the workdir;
- two workers: a pipeline deployment and a stage deployment run at the same time, each on its own worker.

PostgreSQL refuses to run as root: as root the server runs as the ``postgres`` user (``runuser``). Skipped,
with the reason printed, only where no PostgreSQL server binaries exist (``.ci/run`` installs them). The
``postgres`` fixture is shared (tests/conftest.py: ``pg_server``, also used by tests/test_outage.py).
"""
from __future__ import annotations

import time

import pytest

from test_servers import _tiny_config, _worker_log, deploy, end_to_end, mlm_serve, prefect_client_settings

pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def served(postgres, tmp_path_factory):
    """`mlm serve --db <postgres> --workers 2`, deployed; yields (workdir, prefect port, mlflow port, state)."""
    wd = tmp_path_factory.mktemp("pg-serve") / "srv"
    with mlm_serve(wd, "--db", postgres, "--workers", "2") as (pport, mport, state):
        deploy(wd, pport)
        yield wd, pport, mport, state


def _query(url: str, dbname: str, sql: str) -> list[tuple]:
    import psycopg2
    from flows.serve.db import parse_db
    db = parse_db(url)
    with psycopg2.connect(dbname=dbname, user=db.user, host=db.host, port=db.port) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def test_end_to_end_on_postgresql(postgres, served, tmp_path):
    wd, pport, mport, state = served
    assert state["mlflow_store"].startswith("postgresql+psycopg2://mlm@127.0.0.1:")
    assert len([c for c in state["children"] if c.startswith("prefect worker")]) == 2
    end_to_end(tmp_path, wd, pport, mport)
    # what the servers stored is in PostgreSQL, not in SQLite files of the workdir
    assert _query(postgres, "mlm_mlflow", "SELECT count(*) FROM experiments WHERE name = 'mlm-e2e'") == [(1,)]
    n_runs = _query(postgres, "mlm_mlflow", "SELECT count(*) FROM runs")[0][0]
    assert n_runs >= 2 + 1, n_runs                     # 2 parents + the nested stage runs
    flows = {r[0] for r in _query(postgres, "mlm_prefect", "SELECT f.name FROM flow_run r JOIN flow f ON "
                                                           "f.id = r.flow_id WHERE r.state_type = 'COMPLETED'")}
    assert {"mlm-pipeline", "mlm-normalize"} <= flows, flows
    assert not (wd / "mlflow.db").exists() and not list((wd / "prefect").glob("*.db"))


def test_two_workers_run_a_pipeline_and_a_stage_at_once(served, tmp_path):
    """Both deployments submitted together: each runs on its own worker (one flow run at a time each) and
    their running intervals overlap."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    wd, pport, mport, _ = served
    api, mlflow_url = f"http://127.0.0.1:{pport}/api", f"http://127.0.0.1:{mport}"
    config = _tiny_config(tmp_path)

    def params(work: str) -> dict:     # separate workdirs: nothing in the store orders the two runs
        # concurrency, not learning: 10 pretraining steps (the end-to-end test above trains 60)
        return {"config_path": str(config), "overrides": [
            f"tracking.uri={mlflow_url}", f"workdir={tmp_path / work}", "pretrain.steps=10",
            "pretrain.warmup_steps=2", "pretrain.eval_every=10", "pretrain.checkpoint_every=10"]}

    with prefect_client_settings(api, wd / "prefect"):
        runs = {"pipeline": run_deployment("mlm-pipeline/default", parameters=params("a"), timeout=0),
                "stage": run_deployment("mlm-normalize/default", parameters=params("b"), timeout=0)}
        deadline = time.monotonic() + 480
        with get_client(sync_client=True) as client:
            while True:
                got = {k: client.read_flow_run(fr.id) for k, fr in runs.items()}
                if all(fr.state.is_final() for fr in got.values()):
                    break
                assert time.monotonic() < deadline, ({k: fr.state for k, fr in got.items()}, _worker_log(wd))
                time.sleep(1)
    for k, fr in got.items():
        assert fr.state.is_completed(), (k, fr.state, _worker_log(wd))
    p, s = got["pipeline"], got["stage"]
    assert p.start_time < s.end_time and s.start_time < p.end_time, \
        f"not concurrent: pipeline {p.start_time}..{p.end_time}, stage {s.start_time}..{s.end_time}"
    overlap = (min(p.end_time, s.end_time) - max(p.start_time, s.start_time)).total_seconds()
    logs = {log.name: log.read_text(errors="replace") for log in (wd / "logs").glob("prefect-worker-*.log")}
    took = {k: [name for name, text in logs.items() if f"submitting flow run '{fr.id}'" in text]
            for k, fr in got.items()}
    assert all(len(v) == 1 for v in took.values()) and took["pipeline"] != took["stage"], took
    print(f"\npipeline {(p.end_time - p.start_time).total_seconds():.0f} s on {took['pipeline'][0]}, stage "
          f"{(s.end_time - s.start_time).total_seconds():.0f} s on {took['stage'][0]}, overlapping {overlap:.0f} s")
