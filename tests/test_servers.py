"""Real servers, no mocks: ``mlm serve`` (Prefect server + worker + MLflow server) as a subprocess on free
loopback ports, ``mlm deploy`` against it, then the full-pipeline deployment triggered through the Prefect
API as the UI does, checked in MLflow (parent + nested stage runs, validation artifacts) and in Prefect
(artifacts); then one stage deployment rerun with ``force=True``.

Also: the checked-in ``deployments/prefect.yaml`` matches ``flows/pipeline.py`` (pipeline + STAGE_FLOWS),
a busy port / a public host without credentials refuse to start, and with auth on unauthenticated
requests are refused by both servers.

Prefect's state lives in tmp (PREFECT_HOME for servers, worker and this test's client); ~/.prefect is
never touched. Servers are always stopped (fixture ``finally``), process groups included.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MLM = [sys.executable, "-m", "flows.cli"]          # the `mlm` console script, without relying on PATH
READY = "Ctrl-C stops everything."
START_TIMEOUT = 150


# ------------------------------------------------------------------------------ helpers
def _serve_env(home: Path) -> dict:
    env = dict(os.environ)
    for k in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "MLM_SERVE_AUTH", "PREFECT_PROFILES_PATH",
              "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(k, None)
    env.update({"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_WORKER_QUERY_SECONDS": "1",        # default 10 s: the worker picks runs up sooner
                "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])})
    return env


def _groups_alive(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.killpg(pid, 0)
            alive.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return alive


@contextmanager
def mlm_serve(workdir: Path, *extra: str, env_extra: dict | None = None):
    """Run `mlm serve` until it prints its banner; yield (prefect port, mlflow port, state); always stop it."""
    from flows.serve import free_port

    pport = free_port()
    mport = free_port()
    while mport == pport:
        mport = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    env = _serve_env(workdir / "prefect")
    env.update(env_extra or {})
    out = workdir / "serve.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen([*MLM, "serve", "--workdir", str(workdir), "--prefect-port", str(pport),
                                 "--mlflow-port", str(mport), "--timeout", str(START_TIMEOUT), *extra],
                                cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    state: dict = {}
    try:
        deadline = time.monotonic() + START_TIMEOUT + 30
        while READY not in out.read_text(errors="replace"):
            assert proc.poll() is None, f"mlm serve exited {proc.returncode}:\n{out.read_text(errors='replace')}"
            assert time.monotonic() < deadline, f"mlm serve not ready:\n{out.read_text(errors='replace')}"
            time.sleep(0.5)
        state = json.loads((workdir / "serve.json").read_text())
        yield pport, mport, state
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for pid in _groups_alive(state.get("children", {}).values()):  # belt and braces: never leak servers
            os.killpg(pid, signal.SIGKILL)


@contextmanager
def prefect_client_settings(api_url: str, home: Path, auth: str | None = None):
    """Point this process's Prefect client at the test server (settings are cached at import: override them)."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, PREFECT_HOME, temporary_settings

    updates = {PREFECT_API_URL: api_url, PREFECT_HOME: str(home)}
    if auth:
        updates[PREFECT_API_AUTH_STRING] = auth
    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_HOME")}
    os.environ.update({"PREFECT_API_URL": api_url, "PREFECT_HOME": str(home)})
    try:
        with temporary_settings(updates=updates):
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _tiny_config(root: Path) -> Path:
    """3 languages x 50 short lines, absolute paths: the worker runs flows from the project root."""
    lines = {
        "en": [f"Line {i}: the small cat sat near the warm window and watched the rain." for i in range(50)],
        "ru": [f"Строка {i}: маленькая кошка сидела у тёплого окна и смотрела на дождь." for i in range(50)],
        "zh": [f"第{i}行：小猫坐在温暖的窗边，看着外面的雨。" for i in range(50)],
    }
    src = root / "corpus"
    src.mkdir(parents=True, exist_ok=True)
    sources = {}
    for lang, text in lines.items():
        p = src / f"{lang}.txt"
        p.write_text("\n".join(text) + "\n", encoding="utf-8")
        sources[lang] = {"paths": [str(p)]}
    cfg = {"name": "e2e", "workdir": str(root / "work-default"), "seed": 0, "sources": sources,
           "normalize": {"min_chars": 5, "workers": 1},
           # sized for 150 lines (the defaults expect megabytes): a 300-token vocabulary splits words finely;
           # zh has no spaces (one "word" per line). Tokenizer quality is tested elsewhere, wiring here.
           "tokenizer": {"vocab_size": 300, "heldout_docs": 5, "min_vocab_fraction": 0.1,
                         "max_fertility": 50.0, "max_unk_rate": 0.5, "max_fertility_per_lang": {"zh": 100.0}},
           "shards": {"seq_len": 16, "workers": 1},
           # wiring, not learning: a short pretraining keeps the deployment run well inside its timeout
           "pretrain": {"steps": 60, "warmup_steps": 10, "eval_every": 60, "checkpoint_every": 60},
           "tracking": {"experiment": "mlm-e2e"}}
    path = root / "tiny.yaml"
    path.write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")  # JSON is YAML
    return path


def _worker_log(workdir: Path) -> str:
    """The worker's log tail (every worker's, `mlm serve --workers N`)."""
    out = []
    for log in sorted((workdir / "logs").glob("prefect-worker*.log")):
        try:
            out.append(f"== {log.name}\n" + log.read_text(errors="replace")[-6000:])
        except OSError:
            pass
    return "\n".join(out)


# ------------------------------------------------------------------------------ fast checks
def test_prefect_yaml_in_sync_with_stage_flows():
    """Adding a stage flow to STAGE_FLOWS without regenerating the YAML fails here, naming the fix."""
    from flows.deploy import PREFECT_FILE, load_prefect_yaml, out_of_sync, render_config

    assert not out_of_sync(), f"{out_of_sync()}: run `mlm deploy --write-yaml`"
    have, want = load_prefect_yaml(), render_config()
    assert have == want, f"{PREFECT_FILE} differs from flows/deploy.py:render_config(); run `mlm deploy --write-yaml`"
    for d in have["deployments"]:
        assert d["work_pool"]["name"] == "mlm-process"
        if d["entrypoint"].startswith("flows/sweep.py"):     # mlm-sweep's parameter is a sweep file
            assert d["parameters"]["sweep_path"] == "configs/sweeps/demo.yaml"
        else:
            assert d["parameters"]["config_path"] == ("configs/adapt.yaml" if d["entrypoint"].startswith(
                "flows/compare.py") else "configs/demo.yaml")
        assert d["schedules"] and all(s["active"] is False and s["cron"] for s in d["schedules"])
    step = have["pull"][0]["prefect.deployments.steps.set_working_directory"]
    assert step["directory"] == "{{ $PWD }}"


def test_patched_config_sets_pool_schedule_and_root(tmp_path):
    from flows.deploy import patched_config

    cfg = patched_config(pool="other-pool", schedule=True, root=tmp_path)
    assert cfg["pull"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == str(tmp_path)
    assert {d["work_pool"]["name"] for d in cfg["deployments"]} == {"other-pool"}
    assert all(s["active"] is True for d in cfg["deployments"] for s in d["schedules"])


def _run_mlm(*args: str, home: Path, env_extra: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = _serve_env(home)
    env.update(env_extra or {})
    return subprocess.run([*MLM, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_busy_port_refuses_and_starts_nothing(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = _run_mlm("serve", "--workdir", str(tmp_path / "w"), "--prefect-port", str(port), "--mlflow-port", "0",
                     home=tmp_path / "prefect")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"port {port}" in r.stderr and "Prefect server" in r.stderr
    assert not (tmp_path / "w").exists()   # nothing started, nothing written


def test_bad_or_unreachable_database_refuses_and_starts_nothing(tmp_path):
    from flows.serve import free_port

    r = _run_mlm("serve", "--workdir", str(tmp_path / "w"), "--db", "mysql://u@h/db", home=tmp_path / "prefect")
    assert r.returncode == 2 and "expected postgresql://USER@HOST:PORT/NAME" in r.stderr, r.stderr
    port = free_port()                  # nothing listens there
    r = _run_mlm("serve", "--workdir", str(tmp_path / "w"), "--db", f"postgresql://mlm:s3cret@127.0.0.1:{port}/mlm",
                 home=tmp_path / "prefect")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"postgresql://mlm:***@127.0.0.1:{port}/mlm: cannot connect" in r.stderr and "s3cret" not in r.stderr
    assert not (tmp_path / "w").exists()   # checked before anything started


def test_public_host_without_credentials_refuses(tmp_path):
    r = _run_mlm("serve", "--workdir", str(tmp_path / "w"), "--host", "0.0.0.0", home=tmp_path / "prefect")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "refusing to start" in r.stderr and "--auth-file" in r.stderr
    weak = tmp_path / "weak.txt"
    weak.write_text("admin:short\n")
    r = _run_mlm("serve", "--workdir", str(tmp_path / "w"), "--host", "0.0.0.0", "--auth-file", str(weak),
                 home=tmp_path / "prefect")
    assert r.returncode == 2 and "at least 12 characters" in r.stderr


# ------------------------------------------------------------------------------ real servers
@pytest.mark.heavy
def test_auth_refuses_unauthenticated_requests(tmp_path):
    import importlib.util

    from flows.serve import http_get, http_post_json

    assert importlib.util.find_spec("flask_wtf"), "MLflow's basic-auth app needs Flask-WTF: install mlflow[auth]"
    cred = "mlm:correct-horse-battery"
    auth_file = tmp_path / "auth.txt"
    auth_file.write_text(f"# user:password\n{cred}\n")
    wd = tmp_path / "srv"
    with mlm_serve(wd, "--require-auth", "--auth-file", str(auth_file)) as (pport, mport, state):
        api = f"http://127.0.0.1:{pport}/api"
        assert http_post_json(f"{api}/flows/filter", {})[0] == 401
        assert http_post_json(f"{api}/flows/filter", {}, auth="mlm:wrong-password-here")[0] == 401
        assert http_post_json(f"{api}/flows/filter", {}, auth=cred)[0] == 200
        search = f"http://127.0.0.1:{mport}/api/2.0/mlflow/experiments/search?max_results=1"
        assert http_get(search)[0] == 401
        assert http_get(search, auth="mlm:wrong-password-here")[0] == 401
        assert http_get(search, auth=cred)[0] == 200
        check = _run_mlm("serve", "--check", "--prefect-port", str(pport), "--mlflow-port", str(mport),
                         "--auth-file", str(auth_file), home=wd / "prefect")
        assert check.returncode == 0, check.stdout + check.stderr
        assert check.stdout.count(" up") == 3
        children = list(state["children"].values())
    assert not _groups_alive(children), "mlm serve left processes behind"
    assert not (wd / "serve.json").exists()
    check = _run_mlm("serve", "--check", "--prefect-port", str(pport), "--mlflow-port", str(mport), home=wd / "prefect")
    assert check.returncode == 1 and "DOWN" in check.stdout


@pytest.mark.timeout(1200)
@pytest.mark.heavy
def test_deployments_end_to_end_with_real_servers(tmp_path):
    wd = tmp_path / "srv"
    with mlm_serve(wd) as (pport, mport, _state):
        deploy(wd, pport)
        end_to_end(tmp_path, wd, pport, mport)


def deploy(wd: Path, pport: int) -> None:
    """`mlm deploy` against the served Prefect API; every deployment READY when it returns."""
    api = f"http://127.0.0.1:{pport}/api"
    dep = _run_mlm("deploy", "--api-url", api, home=wd / "prefect", timeout=180)
    assert dep.returncode == 0, dep.stdout + dep.stderr
    with prefect_client_settings(api, wd / "prefect"):   # ready the moment `mlm deploy` returns, not later
        from flows.deploy import deployment_status, flow_specs
        ready = deployment_status([f"{name}/default" for name, _, _ in flow_specs()])
    assert set(ready.values()) == {"READY"}, (ready, dep.stdout)


def end_to_end(tmp_path: Path, wd: Path, pport: int, mport: int) -> None:
    """The full-pipeline deployment as the UI's Run button starts it, checked in MLflow and Prefect; then one
    stage deployment forced (also run against `mlm serve --db postgresql://...`: tests/test_postgres.py)."""
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.deployments import run_deployment

    from mlm_core.stages import stage_names

    config = _tiny_config(tmp_path)
    api, mlflow_url = f"http://127.0.0.1:{pport}/api", f"http://127.0.0.1:{mport}"
    params = {"config_path": str(config),
              "overrides": [f"tracking.uri={mlflow_url}", f"workdir={tmp_path / 'work'}"]}
    client = MlflowClient(tracking_uri=mlflow_url)

    with prefect_client_settings(api, wd / "prefect"):
        # 1. the full pipeline, as the UI's "Run" button does it
        fr = run_deployment("mlm-pipeline/default", parameters=params, timeout=480, poll_interval=1)
        assert fr.state is not None and fr.state.is_completed(), f"{fr.state}\n{_worker_log(wd)}"

        exp = client.get_experiment_by_name("mlm-e2e")
        assert exp is not None, "no MLflow experiment: the flow did not log to the served MLflow"
        runs = client.search_runs([exp.experiment_id])
        parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        assert len(parents) == 1, [r.info.run_name for r in runs]
        parent = parents[0]
        assert parent.info.status == "FINISHED"
        nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert sorted(r.data.tags["stage"] for r in nested) == sorted(stage_names())
        for r in nested:
            assert r.data.tags["cache"] == "miss", (r.data.tags["stage"], r.data.tags)
            assert r.data.tags.get("validation") == "passed", r.data.tags
            files = [f.path for f in client.list_artifacts(r.info.run_id, "validation")]
            assert "validation/result.json" in files, files
            result = client.download_artifacts(r.info.run_id, "validation/result.json", str(tmp_path / "dl"))
            assert json.loads(Path(result).read_text())["success"] is True

        with get_client(sync_client=True) as pc:
            arts = pc.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[fr.id])))
        keys = {a.key for a in arts}
        assert {"normalize-summary", "normalize-stats"} <= keys, keys

        # 2. one stage deployment, forced: only that stage executes, in a new pipeline run
        fr2 = run_deployment("mlm-normalize/default", parameters={**params, "force": True}, timeout=180,
                             poll_interval=1)
        assert fr2.state is not None and fr2.state.is_completed(), f"{fr2.state}\n{_worker_log(wd)}"

    runs = client.search_runs([exp.experiment_id])
    parents2 = [r for r in runs if "mlflow.parentRunId" not in r.data.tags
                and r.info.run_id != parent.info.run_id]
    assert len(parents2) == 1, [r.info.run_name for r in runs]
    nested2 = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents2[0].info.run_id]
    assert [(r.data.tags["stage"], r.data.tags["cache"]) for r in nested2] == [("normalize", "miss")]
