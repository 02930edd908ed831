"""Issue 24 item 3: an orchestration or database outage never loses or hides completed work.

Real processes: a throwaway PostgreSQL (tests/conftest.py ``pg_server``), ``mlm serve --db`` on it
(tests/test_servers.py ``mlm_serve``), a tiny ``mlm run`` that adopts those servers; PostgreSQL is stopped
(``pg_ctl -m immediate stop``) once training has started. The run must end with exit 4 ("work complete, not
recorded"), one closing line naming the unreachable Prefect API, that its database may be down, and the exact
commands to run once it is back; no traceback, no flood of ``Error logging to API`` lines, every stored output
complete. Then PostgreSQL comes back (the servers of ``mlm serve`` are still up: a worker that gave up on the
failing API is restarted) and the printed ``mlm run`` records the run (every stage cached, the model registered,
its own exit status, the runs in MLflow and Prefect).

The cheap tests below classify without a database: which exceptions are an orchestrator outage, work complete
(exit 4) vs not (exit 2), and an MLflow loss alone ending a successful run with exit 4.
"""
from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path

import pytest

from conftest import pg_server
from test_servers import MLM, REPO, _serve_env, _tiny_config, mlm_serve

STEPS = 400          # long enough that PostgreSQL is stopped while training runs (2-core machine: seconds)


def _stages_done(config: Path, overrides: list[str]) -> dict[str, str]:
    from mlm_core.config.io import load_config
    from mlm_core.stages import plan
    return {name: p.status for name, p in plan(load_config(config, overrides)).items()}


@pytest.mark.timeout(1800)
@pytest.mark.heavy
def test_database_outage_mid_run_exits_4_with_one_line_then_the_printed_rerun_records_it(tmp_path):
    import httpx
    from mlflow import MlflowClient

    wd = (tmp_path / "srv").resolve()
    config = _tiny_config(tmp_path)
    overrides = [f"workdir={wd}", f"pretrain.steps={STEPS}", f"pretrain.eval_every={STEPS}",
                 f"pretrain.checkpoint_every={STEPS}"]
    argv = ["run", str(config)] + [w for ov in overrides for w in ("--set", ov)]
    with pg_server() as pg, mlm_serve(wd, "--db", pg.url) as (pport, mport, state):
        env = _serve_env(wd / "prefect")
        err_path = tmp_path / "run.err"
        with open(err_path, "w") as err:
            proc = subprocess.Popen([*MLM, *argv], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        # training has started: its temporary output folder exists (the upstream stages are complete)
        deadline = time.monotonic() + 400
        while not list((wd / "pretrain").glob(".tmp-*")):
            assert proc.poll() is None, f"mlm run ended before training: {proc.returncode}\n{err_path.read_text()}"
            assert time.monotonic() < deadline, err_path.read_text()[-3000:]
            time.sleep(0.1)
        pg.stop("immediate")
        stopped_at = time.monotonic()
        out, _ = proc.communicate(timeout=600)
        took = time.monotonic() - stopped_at
        err = err_path.read_text()
        assert proc.returncode == 4, f"exit {proc.returncode}\n{out[-2000:]}\n{err[-5000:]}"
        # the work is complete on disk: every stage the command asked for
        status = _stages_done(config, overrides)
        assert set(status.values()) == {"done"}, status
        # no traceback, Prefect's log-handler failures collapsed (at most one line and a count)
        for raw in ("Traceback", "PrefectHTTPStatusError"):
            at = err.find(raw)
            assert at < 0, err[max(0, at - 1500):at + 3000]
        assert err.count("Error logging to API") <= 1, err[-5000:]
        last = [ln for ln in err.splitlines() if ln.strip()][-1]
        api = f"http://127.0.0.1:{pport}/api"
        assert api in last and f"its database (postgresql://mlm@127.0.0.1:{pg.port}) may be down" in last, last
        sync_cmd = shlex.join(["mlm", "sync", str(config)] + [w for ov in overrides for w in ("--set", ov)])
        run_cmd = shlex.join(["mlm", *argv])
        assert f"`{sync_cmd}`" in last and f"`{run_cmd}`" in last, last
        assert "pw" not in last.split("://")[0]
        closing = [ln for ln in err.splitlines() if ln.startswith(("error:", "warning: the MLflow server"))]
        assert closing == [last], closing          # one closing line (the MLflow loss is folded into it)

        # the database is back: the printed rerun records the run, reusing every stage
        pg.start()
        deadline = time.monotonic() + 120
        while True:      # the servers reconnect to PostgreSQL (their pools drop the dead connections)
            try:
                if httpx.get(f"{api}/health", timeout=5).status_code == 200 and httpx.post(
                        f"{api}/flow_runs/count", json={}, timeout=10).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the Prefect server did not recover after PostgreSQL restarted"
            time.sleep(1)
        again = subprocess.run([*MLM, *shlex.split(run_cmd)[1:]], cwd=REPO, env=env, capture_output=True,
                               text=True, timeout=600)
        # recorded: its own status now, 0 or 3 (this tiny model fails its quality gates: `register: ... FAILED`)
        assert again.returncode in (0, 3), again.stdout[-3000:] + again.stderr[-3000:]
        assert "register: registered version 1" in again.stdout, again.stdout
        assert "unreachable" not in again.stderr and "not recorded" not in again.stderr, again.stderr[-3000:]
        rows = [ln.split() for ln in again.stdout.splitlines() if ln.split()[:1] and ln.split()[0] in status]
        assert {r[0]: r[1] for r in rows} == {s: "cached" for s in status}, again.stdout
        runs = MlflowClient(f"http://127.0.0.1:{mport}").search_runs(
            [MlflowClient(f"http://127.0.0.1:{mport}").get_experiment_by_name("mlm-e2e").experiment_id])
        finished_parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags
                            and r.info.status == "FINISHED"]
        assert finished_parents, [(r.info.run_name, r.info.status) for r in runs]
        flows = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}}},
                           timeout=10).json()
        assert flows, "no completed flow run in Prefect after the rerun"
    print(f"\noutage: PostgreSQL stopped during pretrain; mlm run ended {took:.0f} s later with exit 4:\n{last}")


# ------------------------------------------------------------------------------ cheap: no database, no server
API = "http://127.0.0.1:4200/api"


def _status_error(code: int, path: str = "/flow_runs/abc/set_state"):
    import httpx
    from prefect.exceptions import PrefectHTTPStatusError
    req = httpx.Request("POST", API + path)
    resp = httpx.Response(code, request=req, json={"exception_message": "Internal Server Error"})
    return PrefectHTTPStatusError.from_httpx_error(httpx.HTTPStatusError("boom", request=req, response=resp))


def test_api_failure_recognizes_5xx_and_no_answer_but_not_4xx_or_other_errors():
    import httpx

    from tasks.orchestrator import api_failure
    got = api_failure(_status_error(500))
    assert got["api"] == API and got["status"] == 500 and got["reason"] == "answered 500 Internal Server Error"
    try:                         # wrapped by someone else: the cause chain is followed
        raise RuntimeError("flow run failed") from _status_error(503, "/logs/")
    except RuntimeError as exc:
        assert api_failure(exc)["status"] == 503
    refused = httpx.ConnectError("[Errno 111] Connection refused", request=httpx.Request("GET", API + "/health"))
    got = api_failure(refused)
    assert got["api"] == API and got["status"] is None and "did not answer (ConnectError" in got["reason"]
    assert api_failure(_status_error(404)) is None          # a bad request is a bug, not an outage
    assert api_failure(ValueError("x")) is None and api_failure(OSError(28, "full")) is None
    secret = _status_error(500)
    secret.request.url = httpx.URL("http://bob:s3cret@10.0.0.1:4200/api/flow_runs/")
    assert "s3cret" not in str(api_failure(secret)), api_failure(secret)


@pytest.fixture(scope="module")
def normalized(tmp_path_factory):
    """A config whose normalize output is stored (nothing else): (loaded config, its path, its overrides)."""
    from conftest import write_en_ru_config
    from mlm_core.config.io import load_config
    from mlm_core.stages import execute, plan
    root = tmp_path_factory.mktemp("outage")
    cfg = write_en_ru_config(root, "outage", 30)
    overrides = ["normalize.min_chars=5", "tracking.experiment=it's mine"]   # a quote: the command is shell-quoted
    lc = load_config(cfg, overrides)
    execute(lc, "normalize", plan(lc))
    return lc, cfg, overrides


def _cmd(*words: str) -> str:
    return shlex.join(words)


def test_outage_after_the_asked_work_is_complete_is_exit_4_with_the_commands(normalized):
    from flows.guard import EXIT_NOT_RECORDED, error_line, exit_code
    from flows.outage import classify
    lc, cfg, overrides = normalized
    sets = [w for ov in overrides for w in ("--set", ov)]
    out = classify(_status_error(500), lc, ["normalize"], "normalize", ["--only", "normalize"])
    assert out is not None and out.complete and EXIT_NOT_RECORDED == 4 and exit_code(out) == 4
    line = error_line(out)
    assert "\n" not in line and line.startswith("error: work complete, not recorded: the Prefect API " + API)
    assert f"`{_cmd('mlm', 'sync', str(cfg), *sets)}`" in line, line
    assert f"`{_cmd('mlm', 'run', str(cfg), *sets, '--only', 'normalize')}`" in line, line
    assert "database" not in line          # no `mlm serve --db` for this workdir: nothing said about a database


def test_outage_before_the_work_is_complete_is_exit_2_rerun(normalized):
    from flows.guard import error_line, exit_code
    from flows.outage import classify
    lc, cfg, overrides = normalized
    sets = [w for ov in overrides for w in ("--set", ov)]
    out = classify(_status_error(502), lc, ["normalize", "tokenizer", "shards"], None, [])
    assert out is not None and not out.complete and exit_code(out) == 2
    line = error_line(out)
    assert "Not complete: tokenizer, shards (complete: normalize)" in line, line
    assert f"rerun `{_cmd('mlm', 'run', str(cfg), *sets)}` (finished stages are reused)" in line, line
    assert "mlm sync" not in line


def test_forced_stage_counts_as_done_only_when_its_output_was_rewritten(normalized):
    from flows.outage import complete_stages, snapshot
    lc, _, _ = normalized
    before = snapshot(lc, ["normalize"])
    assert before["normalize"] is not None
    assert complete_stages(lc, ["normalize"], before) == ([], ["normalize"])    # --force, outage before the rewrite
    assert complete_stages(lc, ["normalize"], None) == (["normalize"], [])


def test_a_5xx_from_a_server_of_mlm_serve_db_says_its_database_may_be_down(normalized, tmp_path):
    import json

    import httpx

    from flows.outage import closing_line, served_database
    from tasks.orchestrator import api_failure
    lc, _, _ = normalized
    state = {"api_url": API, "mlflow_store": "postgresql+psycopg2://mlm:***@db.example:5433/mlm_mlflow"}
    (lc.workdir / "serve.json").write_text(json.dumps(state))
    try:
        assert served_database(lc.workdir, API) == "postgresql://mlm:***@db.example:5433"
        assert served_database(lc.workdir, "http://127.0.0.1:9999/api") is None     # another server
        line, code = closing_line(api_failure(_status_error(500)), lc, ["normalize"], ["normalize"], [], None, [],
                                  {"uri": "http://127.0.0.1:5000", "records": 7, "runs": ["pretrain", "pipeline"]}, 3)
        assert code == 4 and "its database (postgresql://mlm:***@db.example:5433) may be down" in line, line
        assert "MLflow server http://127.0.0.1:5000 was unreachable too (7 metric record(s)" in line, line
        assert "3 batch(es) of log lines" in line
        refused = httpx.ConnectError("refused", request=httpx.Request("GET", API + "/flow_runs/"))
        line, _ = closing_line(api_failure(refused), lc, ["normalize"], ["normalize"], [], None, [], None)
        assert "database" not in line and "did not answer" in line      # no answer: the server itself is down
    finally:
        (lc.workdir / "serve.json").unlink()


def test_mlflow_loss_alone_ends_a_successful_command_with_exit_4_and_the_sync_command(monkeypatch, capsys):
    from flows.cli import app as cli     # the parser reads its commands from flows.cli.app
    from tasks.tracking import note_undelivered     # loaded, as after any run: the warning is armed (test_verify.py)

    def lost_tracker(args):
        note_undelivered("http://127.0.0.1:5000", records=5, run="pretrain")
        return 0
    monkeypatch.setattr(cli, "cmd_verify", lost_tracker)
    assert cli.main(["verify", "my cfg.yaml", "--set", "a=b c"]) == 4
    err = capsys.readouterr().err
    assert "`mlm sync 'my cfg.yaml' --set 'a=b c'`" in err, err
    monkeypatch.setattr(cli, "cmd_verify", lambda args: 0)
    assert cli.main(["verify", "my cfg.yaml"]) == 0            # nothing lost this time: 0


def test_prefect_log_handler_failures_collapse_to_one_line_and_a_count(capsys):
    import asyncio

    from prefect.logging.handlers import APILogWorker

    from flows.guard import prefect_log_warning
    from tasks import orchestrator
    orchestrator.reset()
    orchestrator.quiet_api_log_errors()
    orchestrator.quiet_api_log_errors()          # idempotent

    class Down:
        async def request(self, *a, **kw):
            raise _status_error(500, "/logs/")

    worker = type("W", (), {"_client": Down()})()
    for _ in range(25):
        asyncio.run(APILogWorker._handle_batch(worker, [b"{}"]))
    err = capsys.readouterr().err
    assert "Error logging to API" not in err
    assert err.count("\n") == 1 and f"the Prefect API {API} answered 500" in err, err
    assert orchestrator.report()["log_batches"] == 25
    assert "25 batch(es)" in prefect_log_warning()
    orchestrator.reset()


def test_a_stage_error_behind_the_api_failure_is_reported_not_the_outage(normalized):
    """A stage raised, then the flow engine's report of it to the API failed (the 500 carries the stage's error
    as its context): the work is incomplete because of the stage, so that error is the one reported."""
    from flows.outage import classify, underlying
    lc, _, _ = normalized
    try:
        try:
            raise TypeError("next_indices() got an unexpected keyword argument")
        except TypeError:
            raise _status_error(500)
    except Exception as exc:  # noqa: BLE001
        api_error = exc
    own = underlying(api_error)
    assert isinstance(own, TypeError)
    assert classify(api_error, lc, ["normalize", "tokenizer"], None, []) is None
    assert any("the Prefect API " + API in n for n in own.__notes__), own.__notes__
    assert underlying(_status_error(500)) is None           # a plain outage has no error of its own
