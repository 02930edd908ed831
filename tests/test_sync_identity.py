"""`mlm sync` finds a run by its own identity, whatever its `--set` overrides (issue 24 item 1).

Real processes: a real ``mlflow server`` behind the TCP relay of tests/test_faults.py, a real ``mlm run CONFIG
--set ...`` whose server goes away once training has started, then ``mlm sync CONFIG`` run exactly as the old
warning printed it: without the overrides. Before the fix that sync sent 0 metric points, 0 of the run's
parameters, and closed the successful pretrain run (and its pipeline run) as FAILED.

Expected values come from elsewhere than the sync code: the parameters from the plan of the overridden config
(``Plan.params``, what a live run logs), the metric steps from the stored ``metrics.jsonl``.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from test_faults import MLM, REPO, Relay, _config, _env, mlflow_server  # noqa: F401 - the fixture, reused

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.heavy, pytest.mark.timeout(1800)]


def _train_lines(workdir: Path) -> int:
    n = 0
    for f in (workdir / "pretrain").glob(".tmp-*/metrics.jsonl"):
        n = max(n, sum(1 for ln in f.read_text(errors="replace").splitlines() if '"type": "train"' in ln))
    return n


def test_sync_without_the_overrides_finishes_the_run_and_replays_params_tags_artifacts(tmp_path, mlflow_server):
    from mlflow import MlflowClient

    from mlm_core import stages
    from mlm_core.config.io import load_config
    from tasks.tracking.values import flatten_params

    relay = Relay(mlflow_server)
    workdir = tmp_path / "work"
    cfg = _config(tmp_path, workdir, steps=40)
    cfg.write_text(cfg.read_text().replace("experiment: faults", "experiment: sync-id"), encoding="utf-8")
    uri = f"http://127.0.0.1:{relay.port}"
    overrides = ["pretrain.steps=160", "pretrain.lr=0.0007"]
    sets = [a for o in overrides for a in ("--set", o)]
    # the server comes from the environment (as under `mlm serve`), so the config and its overrides are all
    env = _env(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="30", MLM_TRACKING_URI=uri)
    proc = subprocess.Popen([*MLM, "run", str(cfg), *sets], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while _train_lines(workdir) < 5:       # the server goes away once training has started
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.2)
        relay.cut()
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, 4), out[-2000:] + err[-4000:]     # 4: work complete, not recorded
    assert "Traceback" not in err, err[-4000:]
    assert "mlm sync" in err, err[-3000:]

    lc = load_config(cfg, overrides)
    assert lc.workdir.resolve() == workdir.resolve()
    plan = stages.plan(lc)
    assert all(p.status == "done" for p in plan.values()), {k: p.status for k, p in plan.items()}
    fp = plan["pretrain"].fingerprint
    steps = [json.loads(ln)["step"] for ln in (workdir / "pretrain" / fp / "metrics.jsonl").read_text().splitlines()
             if '"type": "train"' in ln]
    assert steps == list(range(1, 161))
    direct = MlflowClient(f"http://127.0.0.1:{mlflow_server}")
    exp = direct.get_experiment_by_name("sync-id")
    [pre] = direct.search_runs([exp.experiment_id], f"tags.stage = 'pretrain' AND tags.fingerprint = '{fp}'")
    assert pre.info.status == "RUNNING"                 # its end never reached the server
    assert not pre.data.params                          # nor its parameters (logged when a run ends)
    journal = workdir / "tracking-pending.jsonl"
    assert journal.is_file()

    # exactly as the old warning printed it: the config alone, without the run's --set overrides
    relay.restore()
    t0 = time.monotonic()
    r = subprocess.run([*MLM, "sync", str(cfg)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    sync_s = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    pre = direct.get_run(pre.info.run_id)
    assert pre.info.status == "FINISHED", r.stdout       # never FAILED: its output is complete
    want = flatten_params(plan["pretrain"].params())
    assert {k: pre.data.params.get(k) for k in want} == want, set(want) - set(pre.data.params)
    assert len(want) >= 20
    assert pre.data.tags.get("validation") == "passed" and pre.data.tags.get("synced") == "true"
    arts = {f.path for f in direct.list_artifacts(pre.info.run_id)}
    assert "manifest.json" in arts, arts
    loss = next(k for k in pre.data.metrics if k in ("train.loss", "train/loss"))   # the UI's name (item 11)
    hist = sorted(m.step for m in direct.get_metric_history(pre.info.run_id, loss))
    assert hist == steps, "every step exactly once"
    parent = direct.get_run(pre.data.tags["mlflow.parentRunId"])
    assert parent.info.status == "FINISHED", parent.info.run_name     # the pipeline succeeded: never FAILED
    assert not journal.exists(), journal.read_text()

    # a second sync sends nothing and changes no status
    statuses = {x.info.run_id: x.info.status for x in direct.search_runs([exp.experiment_id])}
    r2 = subprocess.run([*MLM, "sync", str(cfg)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert " 0 parameter(s), 0 tag(s), 0 artifact(s) and 0 metric point(s) sent" in r2.stdout, r2.stdout
    assert {x.info.run_id: x.info.status for x in direct.search_runs([exp.experiment_id])} == statuses
    relay.cut()
    print(f"\nsync without the overrides ({sync_s:.1f} s): {r.stdout.strip()}")


def test_a_finished_run_keeps_its_status_and_a_killed_one_is_closed_failed(tmp_path, mlflow_server):
    """Statuses: sync never changes FINISHED/FAILED; a RUNNING run of a dead process with no complete output
    (and no journaled end) was killed: FAILED; a journaled end wins over that rule."""
    from mlflow import MlflowClient

    from mlm_core.config.io import load_config
    from tasks.tracking.journal import record
    from tasks.tracking.sync import sync

    direct = MlflowClient(f"http://127.0.0.1:{mlflow_server}")
    cfg = _config(tmp_path, tmp_path / "work2")
    lc = load_config(cfg, [f"tracking.uri=http://127.0.0.1:{mlflow_server}", "tracking.experiment=sync-status"])
    exp = direct.get_experiment_by_name("sync-status") or direct.get_experiment(
        direct.create_experiment("sync-status"))
    eid = getattr(exp, "experiment_id", exp)
    dead = subprocess.Popen(["true"])
    dead.wait()
    tags = {"mlm.pid": str(dead.pid), "mlm.host": __import__("socket").gethostname()}
    done = direct.create_run(eid, run_name="done", tags={**tags, "stage": "pretrain", "fingerprint": "f" * 16})
    direct.set_terminated(done.info.run_id, "FAILED")
    killed = direct.create_run(eid, run_name="killed", tags={**tags, "stage": "pretrain", "fingerprint": "e" * 16})
    ended = direct.create_run(eid, run_name="pipeline ended", tags=tags)
    record(lc.workdir, kind="pipeline", run_id=ended.info.run_id, status="FINISHED", ended=time.time())
    rep = sync(lc)
    assert direct.get_run(done.info.run_id).info.status == "FAILED"
    assert direct.get_run(killed.info.run_id).info.status == "FAILED" and "killed" in rep["closed"]
    assert direct.get_run(ended.info.run_id).info.status == "FINISHED"
    assert rep["pending"] == 0
