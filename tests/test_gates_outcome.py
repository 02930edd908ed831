"""Failed gates do not look like success (issue 24 item 9), through the real CLI and the run's own Prefect server.

One tiny pipeline is run by ``mlm run`` with an impossible gate (``registry.gates.min_top1: 1.0``):
- with ``registry.fail_on_gates=true`` it exits 3 (README, "When things go wrong"), prints "register: registered
  version 1, gates FAILED (k of n): ..." under its table, and its Prefect flow run ends Failed with that line;
- without the switch (the default) a rerun of the register stage also exits 3 and prints the line, and its flow
  run is Completed with the line as its state message; the version is reused (still version 1);
- ``mlm status`` shows the registered version and its aliases.
The Prefect states are read back from the workdir's own Prefect database (the ephemeral server `mlm run` used).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO, write_en_ru_config

MLM = [sys.executable, "-m", "flows.cli"]
NAME = "gates-outcome-model"
LINE = re.compile(r"^register: registered version 1, gates FAILED \((\d+) of (\d+)\): (.+)$", re.M)

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.heavy, pytest.mark.timeout(1800)]


def _env(work) -> dict:
    import os
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "PREFECT_HOME", "MLM_TRACKING_URI", "MLFLOW_TRACKING_URI", "MLM_VERBOSE")}
    return env | {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _flow_runs(work) -> list[dict]:
    """[{flow, state, message}] of every flow run in the workdir's Prefect database, oldest first."""
    code = ("import json; from prefect.client.orchestration import get_client\n"
            "with get_client(sync_client=True) as c:\n"
            "    runs = c.read_flow_runs()\n"
            "    names = {f.id: f.name for f in c.read_flows()}\n"
            "    print('FLOWRUNS ' + json.dumps([{'flow': names.get(r.flow_id), 'state': r.state.type.value,\n"
            "        'message': r.state.message, 'start': str(r.start_time)} for r in runs]))\n")
    env = _env(work) | {"PREFECT_HOME": str(work / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120"}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = next((ln for ln in r.stdout.splitlines() if ln.startswith("FLOWRUNS ")), None)
    assert out is not None, r.stdout[-2000:] + r.stderr[-3000:]
    return sorted(json.loads(out[len("FLOWRUNS "):]), key=lambda x: x["start"])


@pytest.fixture(scope="module")
def failed_gates_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gates-outcome")
    cfg = write_en_ru_config(
        root, "gates-outcome", 60,
        tokenizer={"vocab_size": 300, "heldout_docs": 5, "min_vocab_fraction": 0.1, "max_fertility": 20},
        shards={"seq_len": 16, "workers": 1},
        pretrain={"model": {"size": "tiny", "max_positions": 16}, "steps": 10, "batch_size": 8, "eval_every": 1000,
                  "checkpoint_every": 1000, "warmup_steps": 2},
        evaluate={"pll_sentences": 0},
        registry={"model_name": NAME, "gates": {"min_top1_over_baseline": -1.0, "min_top1": 1.0}})
    r = subprocess.run([*MLM, "run", str(cfg), "--set", "registry.fail_on_gates=true"], cwd=REPO,
                       env=_env(root / "work"), capture_output=True, text=True, timeout=900)
    return cfg, root / "work", r


def test_failed_gates_exit_3_print_the_line_and_fail_the_flow_run_with_the_switch(failed_gates_run):
    cfg, work, r = failed_gates_run
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-4000:]
    m = LINE.search(r.stdout)
    assert m, r.stdout[-2000:]
    k, n, names = int(m.group(1)), int(m.group(2)), m.group(3)
    assert 1 <= k < n and "min_top1" in names and "min_top1_over_baseline" not in names
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    # the table still shows every stage, register included
    assert re.search(r"^register\s+ran\s", r.stdout, re.M), r.stdout[-2000:]
    runs = [x for x in _flow_runs(work) if x["flow"] == "mlm-pipeline"]
    assert len(runs) == 1, runs
    assert runs[0]["state"] == "FAILED", runs
    assert "registered version 1, gates FAILED" in (runs[0]["message"] or ""), runs


def test_without_the_switch_the_flow_run_is_completed_with_the_line_and_the_cli_still_exits_3(failed_gates_run):
    cfg, work, _ = failed_gates_run
    r = subprocess.run([*MLM, "run", str(cfg), "--only", "register"], cwd=REPO, env=_env(work),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-4000:]
    assert LINE.search(r.stdout), r.stdout[-2000:]          # still version 1: registration is idempotent
    runs = [x for x in _flow_runs(work) if x["flow"] == "mlm-register"]
    assert len(runs) == 1 and runs[0]["state"] == "COMPLETED", runs
    assert (runs[0]["message"] or "").startswith("registered version 1, gates FAILED ("), runs


def test_status_shows_the_registered_version_and_its_aliases(failed_gates_run):
    cfg, work, _ = failed_gates_run
    from tasks.tracking import mlflow_client
    client = mlflow_client(f"sqlite:///{work.resolve()}/mlflow.db")
    client.set_registered_model_alias(NAME, "reviewed", "1")      # an alias of this version, set by hand
    r = subprocess.run([*MLM, "status", str(cfg)], cwd=REPO, env=_env(work), capture_output=True, text=True,
                       timeout=300)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("registry: ")), None)
    assert line is not None, r.stdout + r.stderr[-2000:]
    assert line.startswith(f"registry: {NAME} version 1 (aliases: "), line
    assert "reviewed" in line.split("(aliases: ", 1)[1].split(")", 1)[0], line
    assert "gates FAILED: " in line and "min_top1" in line, line
    js = subprocess.run([*MLM, "status", str(cfg), "--json"], cwd=REPO, env=_env(work), capture_output=True,
                        text=True, timeout=300)
    reg = next(row for row in json.loads(js.stdout) if row["stage"] == "register")["registry"]
    assert reg["version"] == 1 and "reviewed" in reg["aliases"] and reg["gates"] == "failed", reg
