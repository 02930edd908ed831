"""Sweeps (issue 12): definition and validation, planning, shared stages computed once, resume, MLflow nesting.

Execution counts come from wrappers around the stage functions (``mlm_core.stages.STAGES[...].run`` and
``mlm_core.partitions.run_partitioned``), and stored outputs from the store itself: never from the sweep's own
messages or plan.json.
"""
from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from conftest import write_en_ru_config
from mlm_core import stages
from mlm_core.config.io import load_config
from mlm_core.store import StageStore
from mlm_core.sweep import SweepError, load_sweep, sweep_schema_text

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _base(tmp_path: Path, name: str = "sweeptest") -> Path:
    """A tiny two-language pipeline whose every stage runs in a few seconds."""
    return write_en_ru_config(
        tmp_path, name, 40,
        tokenizer={"vocab_size": 300, "heldout_docs": 5, "min_vocab_fraction": 0.1, "max_fertility": 20},
        shards={"seq_len": 16, "workers": 1, "validation_fraction": 0.25},
        pretrain={"model": {"size": "tiny", "max_positions": 16}, "steps": 3, "batch_size": 4, "warmup_steps": 1,
                  "log_every": 1, "eval_every": 3, "checkpoint_every": 3},
        evaluate={"max_sequences": 4, "pll_sentences": 2},
        tracking={"experiment": name}, registry={"model_name": f"{name}-model"})


def _sweep(tmp_path: Path, body: dict, base: Path | None = None) -> Path:
    base = base or _base(tmp_path)
    f = tmp_path / "sweep.yaml"
    f.write_text(yaml.safe_dump({"name": "s", "base": base.name, **body}))
    return f


@pytest.fixture
def counts(monkeypatch):
    """How many times each stage really computed its output (wrappers around the stage functions)."""
    seen: collections.Counter = collections.Counter()
    for name, spec in list(stages.STAGES.items()):
        if not spec.partitioned:
            def run(*a, _f=spec.run, _n=name, **kw):
                seen[_n] += 1
                return _f(*a, **kw)
            monkeypatch.setitem(stages.STAGES, name, dataclasses.replace(spec, run=run))
    from mlm_core import partitions
    real = partitions.run_partitioned

    def partitioned(name, *a, **kw):
        seen[name] += 1
        return real(name, *a, **kw)
    monkeypatch.setattr(partitions, "run_partitioned", partitioned)
    return seen


def _stored(workdir: Path) -> dict[str, int]:
    store = StageStore(workdir)
    return {name: len(store.complete_outputs(name)) for name in stages.STAGES}


# ------------------------------------------------------------------------------------- definition
def test_unknown_key_names_its_path(tmp_path):
    f = _sweep(tmp_path, {"variants": [{"name": "a", "set": {}}], "seeds": [0], "concurency": 2})
    with pytest.raises(SweepError, match=r"sweep\.yaml: invalid sweep\n  concurency: unknown key \(did you mean "
                                         r"concurrency\?\)"):
        load_sweep(f)
    f = _sweep(tmp_path, {"variants": [{"name": "a", "sett": {}}]})
    with pytest.raises(SweepError, match=r"variants\.0\.sett: unknown key \(did you mean set\?\)"):
        load_sweep(f)
    f = _sweep(tmp_path, {"variants": [{"name": "a"}], "match": "steps"})
    with pytest.raises(SweepError, match=r"match: Input should be 'none', 'flops' or 'tokens'"):
        load_sweep(f)


def test_variant_override_errors_name_the_variant_and_key(tmp_path):
    f = _sweep(tmp_path, {"variants": [{"name": "ok", "set": {"pretrain.lr": 1e-3}},
                                       {"name": "typo", "set": {"pretrain.masking.rat": 0.4}}]})
    with pytest.raises(SweepError) as e:
        load_sweep(f)
    msg = str(e.value)
    assert "variant 'typo'" in msg and "pretrain.masking.rat: unknown key (did you mean rate?)" in msg, msg
    assert "sweep.yaml" in msg
    f = _sweep(tmp_path, {"grid": {"pretrain.masking.rate": [0.15, "lots"]}})
    with pytest.raises(SweepError, match=r"(?s)variant 'pretrain\.masking\.rate=lots'.*pretrain\.masking\.rate: "
                                         r"Input should be a valid number"):
        load_sweep(f)
    f = _sweep(tmp_path, {"variants": [{"name": "a", "set": {"seed": 3}}]})
    with pytest.raises(SweepError, match=r"variant 'a': seed: a variant may not set"):
        load_sweep(f)
    f = _sweep(tmp_path, {"variants": [{"name": "a", "set": {"pretrain.seed": 3}}]})
    with pytest.raises(SweepError, match=r"variant 'a': pretrain\.seed: a variant may not set"):
        load_sweep(f)


def test_baseline_must_be_a_variant(tmp_path):
    f = _sweep(tmp_path, {"variants": [{"name": "a"}, {"name": "b", "set": {"pretrain.lr": 1e-3}}],
                          "baseline": "c"})
    with pytest.raises(SweepError, match=r"baseline: 'c' is not a variant of this sweep \(variants: a, b\)"):
        load_sweep(f)
    with pytest.raises(SweepError, match="variant names must be unique: a repeated"):
        load_sweep(_sweep(tmp_path, {"variants": [{"name": "a"}, {"name": "a"}]}))


def test_runs_are_variants_crossed_with_grid_and_seeds(tmp_path):
    f = _sweep(tmp_path, {"variants": [{"name": "tok"}, {"name": "span", "set": {"pretrain.masking.strategy": "span"}}],
                          "grid": {"pretrain.lr": [0.001, 0.002]}, "seeds": [0, 1], "baseline": "tok,pretrain.lr=0.001"})
    sw = load_sweep(f)
    assert [(r.variant, r.seed) for r in sw.runs][:3] == [("tok,pretrain.lr=0.001", 0), ("tok,pretrain.lr=0.001", 1),
                                                          ("tok,pretrain.lr=0.002", 0)]
    assert len(sw.runs) == 8
    run = next(r for r in sw.runs if r.variant == "span,pretrain.lr=0.002" and r.seed == 1)
    # the overrides are `mlm run --set` words: loading them gives the variant's config, checked field by field
    cfg = load_config(sw.base_path, list(run.overrides)).config
    assert (cfg.pretrain.masking.strategy, cfg.pretrain.lr, cfg.pretrain.seed, cfg.seed) == ("span", 0.002, 1, 0)
    assert cfg.registry.model_name == "sweeptest-model-sweep-s"      # the base model's aliases stay its own


def test_a_variant_may_run_its_own_seeds(tmp_path, capsys):
    """Issue 21: 6 seeds for the variants of a primary contrast, 3 for the exploratory ones, in one sweep file."""
    from flows.cli import main
    f = _sweep(tmp_path, {"variants": [{"name": "a", "seeds": [0, 1, 2, 3]}, {"name": "b", "set": {"pretrain.lr": 1e-3}}],
                          "seeds": [0, 1]})
    sw = load_sweep(f)
    assert [(r.variant, r.seed) for r in sw.runs] == [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("b", 0), ("b", 1)]
    assert main(["sweep", str(f), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 variant(s) x seeds per variant (a 4, b 2) = 6 run(s)" in out, out
    assert "pretrain   6 outputs for 6 runs: 0 done, 6 to run" in out, out
    with pytest.raises(SweepError, match=r"variants\.0\.seeds.*seeds must be distinct"):
        load_sweep(_sweep(tmp_path, {"variants": [{"name": "a", "seeds": [1, 1]}]}))


def test_schema_file_in_sync():
    path = REPO / "schemas" / "sweep.schema.json"
    assert path.read_text(encoding="utf-8") == sweep_schema_text(), (
        "schemas/sweep.schema.json is stale: regenerate with .venv/bin/python -c \"from mlm_core.sweep import "
        "sweep_schema_text as t; open('schemas/sweep.schema.json', 'w').write(t())\"")
    assert set(json.loads(path.read_text())["properties"]) >= {"base", "grid", "variants", "seeds", "metrics",
                                                               "baseline", "match", "concurrency", "name"}


def test_shipped_sweeps_load():
    files = sorted((REPO / "configs").rglob("sweeps/*.yaml")) + sorted((REPO / "configs" / "experiments").glob("*.yaml"))
    files = [f for f in files if not f.name.endswith("base.yaml")]
    assert len(files) >= 9
    for f in files:
        load_sweep(f)


# ------------------------------------------------------------------------------------- planning
def test_dry_run_table_shares_upstream_and_writes_nothing(tmp_path, capsys):
    from flows.cli import main
    f = _sweep(tmp_path, {"variants": [{"name": "a"}, {"name": "b", "set": {"pretrain.lr": 0.001}}], "seeds": [0, 1]})
    assert main(["sweep", str(f), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "normalize  1 output shared by 4 runs (to run)" in out, out
    # sweep seeds are pretrain.seed (training only): one tokenizer for every seed
    assert "tokenizer  1 output shared by 4 runs (to run)" in out, out
    assert "pretrain   4 outputs for 4 runs: 0 done, 4 to run" in out, out
    assert not (tmp_path / "work").exists()              # a dry run writes nothing


# ------------------------------------------------------------------------------------- running
def _weights_digest(work: Path, entry: dict) -> str:
    import hashlib
    folder = StageStore(work).out_dir("pretrain", entry["config_fingerprints"]["pretrain"])
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def _registered(workdir: Path, name: str) -> dict | None:
    """The registry's versions and aliases of model ``name`` (None when it is not registered)."""
    import mlflow
    from mlflow.exceptions import MlflowException
    if not (workdir / "mlflow.db").is_file():      # do not create the database before the sweep does
        return None
    c = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}",
                            registry_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    try:
        m = c.get_registered_model(name)
    except MlflowException:
        return None
    return {"aliases": dict(m.aliases or {}), "versions": len(c.search_model_versions(f"name='{name}'"))}


def _runs(workdir: Path, experiment: str):
    import mlflow
    mlflow.set_tracking_uri(f"sqlite:///{workdir / 'mlflow.db'}")
    return mlflow.search_runs(experiment_names=[experiment], output_format="list")


def test_caching_2x2_shares_upstream_and_nests_runs(tmp_path, prefect_harness, counts):
    from flows.sweep import run_sweep
    f = _sweep(tmp_path, {"variants": [{"name": "token"}, {"name": "p30", "set": {"pretrain.masking.rate": 0.3}}],
                          "seeds": [0, 1], "baseline": "token", "metrics": ["top1"]})
    base_cfg = load_config(tmp_path / "cfg.yaml").config
    registered = _registered(tmp_path / "work", base_cfg.registry.model_name)      # None: not registered yet
    doc = run_sweep(str(f), echo=lambda line: None)
    work = tmp_path / "work"
    assert dict(counts) == {"normalize": 1, "tokenizer": 1, "shards": 1, "pretrain": 4, "evaluate": 4,
                            "audit": 4, "register": 4}
    assert _stored(work) == {"normalize": 1, "tokenizer": 1, "shards": 1, "pretrain": 4, "evaluate": 4,
                             "audit": 4, "register": 4}
    # plan.json: each run's fingerprints are those the pipeline computes for base + its overrides
    sw = load_sweep(f)
    stored = json.loads((work / "sweeps" / "s" / "plan.json").read_text())
    assert stored == json.loads(json.dumps(doc, default=str))
    for entry, run in zip(stored["variants"], sw.runs):
        plans = stages.plan(load_config(sw.base_path, list(run.overrides)))
        assert entry["config_fingerprints"] == {k: p.fingerprint for k, p in plans.items()}
        assert all(p.status == "done" for p in plans.values()) and entry["status"] == "done"
    assert stored["baseline"] == "token" and stored["metrics"] == ["top1"]
    # seeds vary training only: the 4 trained models differ pairwise (init, masking, order, dropout per seed)
    weights = {entry["config_fingerprints"]["pretrain"]: _weights_digest(work, entry) for entry in stored["variants"]}
    assert len(set(weights.values())) == 4, weights
    # every run registered under the sweep's own model name; the base config's model name is untouched
    assert _registered(work, base_cfg.registry.model_name) == registered
    swept = _registered(work, f"{base_cfg.registry.model_name}-sweep-s")
    assert swept is not None and swept["versions"] == 4, swept
    assert {r["stage"]: (r["outputs"], r["to_run"]) for r in stored["stages"]} == {
        name: (1 if name in ("normalize", "tokenizer", "shards") else 4, 0) for name in stages.STAGES}

    # MLflow: one sweep run; each run's pipeline run nested under it, tagged with its variant and seed
    runs = _runs(work, "sweeptest")
    sweep_run = [r for r in runs if r.data.tags.get("mlm.kind") == "sweep"]
    assert len(sweep_run) == 1 and sweep_run[0].info.run_id == stored["mlflow_run_id"]
    assert sweep_run[0].info.status == "FINISHED"
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == stored["mlflow_run_id"]]
    assert sorted((r.data.tags["variant"], r.data.tags["seed"]) for r in nested) == sorted(
        (r.variant, str(r.seed)) for r in sw.runs)
    stage_runs = [r for r in runs if r.data.tags.get("mlflow.parentRunId") in {n.info.run_id for n in nested}]
    assert len(stage_runs) == 4 * len(stages.STAGES)
    # the report is built at the end and logged to the sweep's run
    import mlflow
    assert (work / "sweeps" / "s" / "report" / "report.md").is_file()
    # ... from the real stored outputs (issue 22: not hand-made manifests): every variant's en.top1 mean and the
    # paired difference equal what pyarrow reads from each run's evaluate/intrinsic.parquet, computed here
    import pyarrow.parquet as pq
    report = json.loads((work / "sweeps" / "s" / "report" / "report.json").read_text())
    en = {}
    for entry in stored["variants"]:
        table = pq.read_table(StageStore(work).out_dir("evaluate", entry["config_fingerprints"]["evaluate"])
                              / "intrinsic.parquet").to_pylist()
        en[(entry["name"], entry["seed"])] = next(r["top1"] for r in table if r["lang"] == "en")
    rows = {r["variant"]: r for r in report["tables"]["en.top1"]}
    for v in ("token", "p30"):
        assert rows[v]["n"] == 2 and rows[v]["mean"] == pytest.approx((en[(v, 0)] + en[(v, 1)]) / 2, abs=1e-12)
    diffs = [en[("p30", s)] - en[("token", s)] for s in (0, 1)]
    assert rows["p30"]["diff"]["mean"] == pytest.approx(sum(diffs) / 2, abs=1e-12)
    assert rows["token"]["diff"] is None
    logged = {a.path for a in mlflow.MlflowClient().list_artifacts(stored["mlflow_run_id"], "report")}
    assert "report/report.md" in logged, logged

    # a rerun computes nothing: every run is complete
    run_sweep(str(f), echo=lambda line: None)
    assert counts["pretrain"] == 4 and counts["normalize"] == 1

    # a stored run whose pipeline run did not end is run again on the next sweep, and only such runs: one left
    # "unrecorded" by its child (exit 4: an MLflow/Prefect outage), one left "running" (the sweep was killed
    # between its child storing register and ending its MLflow run; the CLI kill -9 test below meets it). The
    # child is a marker here: what is tested is which runs the sweep starts
    import sys

    from tasks import sweep as tsweep
    plan_file = work / "sweeps" / "s" / "plan.json"
    doc = json.loads(plan_file.read_text())
    doc["variants"][1]["status"], doc["variants"][2]["status"] = "unrecorded", "running"
    plan_file.write_text(json.dumps(doc))
    started = tmp_path / "started"
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(tsweep, "child_command", lambda sweep, run: [
        sys.executable, "-c", f"open({str(started)!r}, 'a').write({run.key!r} + '\\n')"])
    try:
        lines: list[str] = []
        run_sweep(str(f), echo=lines.append, concurrency=2)
    finally:
        monkeypatch.undo()
    keys = sorted(f"{v['name']}@seed{v['seed']}" for v in doc["variants"][1:3])
    assert sorted(started.read_text().split()) == keys
    assert "2 run(s) stored, 2 to run (2 stored but not recorded as finished: they run again, every stage " \
           "reused)" in "\n".join(lines), lines
    assert [v["status"] for v in json.loads(plan_file.read_text())["variants"]] == ["done"] * 4
    assert counts["pretrain"] == 4


def test_resume_after_stop_recomputes_no_finished_run(tmp_path, prefect_harness, counts):
    from flows.sweep import run_sweep
    f = _sweep(tmp_path, {"variants": [{"name": "a"}, {"name": "b", "set": {"pretrain.lr": 0.001}}], "seeds": [0]},
               base=_base(tmp_path, "resumetest"))

    class Stop(Exception):
        pass

    def stop(run, status):
        raise Stop(run.key)
    with pytest.raises(Stop, match="a@seed0"):
        run_sweep(str(f), echo=lambda line: None, after_run=stop)
    work = tmp_path / "work"
    assert counts["pretrain"] == 1
    plan = json.loads((work / "sweeps" / "s" / "plan.json").read_text())
    assert [v["status"] for v in plan["variants"]] == ["done", "pending"]
    store = StageStore(work)
    first = {name: (store.out_dir(name, fp) / "manifest.json").stat().st_mtime_ns
             for name, fp in plan["variants"][0]["config_fingerprints"].items()}

    lines: list[str] = []
    run_sweep(str(f), echo=lines.append)
    assert "pretrain   2 outputs for 2 runs: 1 done, 1 to run" in lines
    assert dict(counts) == {"normalize": 1, "tokenizer": 1, "shards": 1, "pretrain": 2, "evaluate": 2,
                            "audit": 2, "register": 2}
    assert {name: (store.out_dir(name, fp) / "manifest.json").stat().st_mtime_ns
            for name, fp in plan["variants"][0]["config_fingerprints"].items()} == first
    # the resumed sweep is still one MLflow run, finished, with both runs' pipelines nested under it
    runs = _runs(work, "resumetest")
    sweeps = [r for r in runs if r.data.tags.get("mlm.kind") == "sweep"]
    assert [(r.info.status, r.data.tags["mlm.resumed"]) for r in sweeps] == [("FINISHED", "1")]
    assert sorted(r.data.tags["variant"] for r in runs
                  if r.data.tags.get("mlflow.parentRunId") == sweeps[0].info.run_id) == ["a", "b"]


def _procs_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (to check that no run outlived the sweep)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
                state = next((x for x in (d / "status").read_text().splitlines() if x.startswith("State:")), "")
            except OSError:
                continue
            if text in cmd and "Z" not in state.split()[1:2]:
                out.append(int(d.name))
    return out


@pytest.mark.timeout(1200)
@pytest.mark.heavy
def test_cli_kill9_midway_then_rerun_finishes_with_concurrency(tmp_path):
    """`mlm sweep` with concurrency 2 (each run an `mlm run` process) killed with SIGKILL after its first run is
    stored: its runs stop too, and a rerun finishes the sweep without recomputing the stored run."""
    import os
    import signal
    import subprocess
    import sys
    import time
    base = _base(tmp_path, "clitest")
    f = _sweep(tmp_path, {"variants": [{"name": n, "set": {"pretrain.lr": lr}} for n, lr in
                                       (("a", 0.001), ("b", 0.002), ("c", 0.003))], "seeds": [0], "concurrency": 2},
               base=base)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {"HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "flows.cli", "sweep", str(f)]
    plan_file = tmp_path / "work" / "sweeps" / "s" / "plan.json"
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 400
    done: list[dict] = []
    while time.time() < deadline and proc.poll() is None:
        time.sleep(1)
        try:
            done = [v for v in json.loads(plan_file.read_text())["variants"] if v["status"] == "done"]
        except (OSError, ValueError):
            continue
        if done:
            break
    assert done and proc.poll() is None, proc.stdout.read() if proc.poll() is not None else "no run finished"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    t0 = time.time()
    while _procs_mentioning(str(base)) and time.time() - t0 < 60:   # the runs got SIGTERM: checkpoint, exit
        time.sleep(0.5)
    assert not _procs_mentioning(str(base)), "a run outlived the killed sweep"
    store = StageStore(tmp_path / "work")
    kept = {name: (store.out_dir(name, fp) / "manifest.json").stat().st_mtime_ns
            for name, fp in done[0]["config_fingerprints"].items()}

    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "pretrain   3 outputs for 3 runs: " in r.stdout and "normalize  1 output shared by 3 runs (done)" in r.stdout
    assert {name: (store.out_dir(name, fp) / "manifest.json").stat().st_mtime_ns
            for name, fp in done[0]["config_fingerprints"].items()} == kept      # the stored run: not recomputed
    assert _stored(tmp_path / "work") == {name: 1 if name in ("normalize", "tokenizer", "shards") else 3
                                          for name in stages.STAGES}
    plan = json.loads(plan_file.read_text())
    assert [v["status"] for v in plan["variants"]] == ["done"] * 3
    # the child processes' pipeline runs are nested under the second sweep's MLflow run (or the first's, for
    # runs it finished), tagged with their variant
    runs = _runs(tmp_path / "work", "clitest")
    sweeps = {r.info.run_id for r in runs if r.data.tags.get("mlm.kind") == "sweep"}
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") in sweeps]
    logs = {q.name: q.read_text()[-1500:] for q in (tmp_path / "work" / "sweeps" / "s" / "logs").glob("*.log")}
    assert {r.data.tags["variant"] for r in nested if r.info.status == "FINISHED"} == {"a", "b", "c"}, \
        ([(r.data.tags.get("variant"), r.info.status) for r in nested], r.stdout[-2000:], logs)
    # the killed sweep's children that never ended their runs are closed by the rerun: nothing shows as going
    assert not [(x.info.run_name, x.data.tags.get("stage")) for x in runs if x.info.status == "RUNNING"]


def test_flow_form_is_typed_and_described():
    """The Prefect UI renders the mlm-sweep form from the flow's parameter schema."""
    from flows.sweep import sweep_flow
    props = sweep_flow.parameters.model_dump()["properties"]
    assert set(props) == {"sweep_path", "dry_run", "concurrency", "overrides", "variants", "seeds"}
    assert props["seeds"]["items"]["type"] == "integer" and props["variants"]["items"]["type"] == "string"
    assert props["overrides"]["type"] == "array" and props["overrides"]["items"]["type"] == "string"
    assert props["sweep_path"]["type"] == "string" and props["dry_run"]["type"] == "boolean"
    assert {"type": "integer", "minimum": 1} in props["concurrency"]["anyOf"]
    assert all(p.get("description") for p in props.values())
    assert sweep_flow.name == "mlm-sweep"


def test_stopped_sweep_stops_its_child_runs(tmp_path, monkeypatch):
    """Concurrency > 1: a sweep interrupted while runs are going stops them (SIGTERM) instead of waiting for them,
    and starts no new one. The child command is replaced by a sleeper: what is tested is the process handling."""
    import sys
    import time

    from flows.sweep import run_sweep
    from tasks import sweep as tsweep
    base = write_en_ru_config(tmp_path, "stoptest", 10, tracking={"enabled": False})
    f = _sweep(tmp_path, {"variants": [{"name": n, "set": {"pretrain.lr": lr}} for n, lr in
                                       (("fast", 0.001), ("slow", 0.002), ("never", 0.003))], "concurrency": 2},
               base=base)
    def sleeper(sweep, run):     # each child leaves a file when it really starts; "fast" ends once "slow" runs
        mark, slow = tmp_path / f"started-{run.variant}", tmp_path / "started-slow"
        wait = (f"t = time.time()\nwhile not os.path.exists({str(slow)!r}) and time.time() - t < 60: time.sleep(0.1)"
                if run.variant == "fast" else "time.sleep(120)")
        return [sys.executable, "-c", f"import os, time\nopen({str(mark)!r}, 'w').close()\n{wait}"]
    monkeypatch.setattr(tsweep, "child_command", sleeper)

    class Stop(Exception):
        pass

    def stop(run, status):
        raise Stop(run.key)
    t0 = time.monotonic()
    with pytest.raises(Stop, match="fast@seed0"):
        run_sweep(str(f), echo=lambda line: None, after_run=stop)
    assert time.monotonic() - t0 < 60
    assert sorted(p.name for p in tmp_path.glob("started-*")) == ["started-fast", "started-slow"]   # not "never"
    assert not tsweep._children
    plan = json.loads((tmp_path / "work" / "sweeps" / "s" / "plan.json").read_text())
    assert [v["status"] for v in plan["variants"]] == ["done", "failed", "pending"]


def test_a_run_not_recorded_is_retried_once_then_left_unrecorded(tmp_path, monkeypatch):
    """A child that exits 4 (work complete, not recorded: MLflow or Prefect lost, e.g. SQLite's 503 under load)
    is not "done": it runs once more at the end of the sweep; if it is still not recorded plan.json says
    "unrecorded" and the closing line says how to record it. Children are scripts that count their starts."""
    import sys

    from flows.sweep import run_sweep
    from tasks import sweep as tsweep
    base = write_en_ru_config(tmp_path, "unrecorded", 10, tracking={"enabled": False})
    f = _sweep(tmp_path, {"variants": [{"name": n, "set": {"pretrain.lr": lr}} for n, lr in
                                       (("ok", 0.001), ("once", 0.002), ("never", 0.003))], "concurrency": 2},
               base=base)

    def child(sweep, run):    # "once": exit 4 on its first start only; "never": always
        mark = tmp_path / f"starts-{run.variant}"
        code = {"ok": "0", "once": "4 if n == 1 else 0", "never": "4"}[run.variant]
        return [sys.executable, "-c", f"p = {str(mark)!r}\nopen(p, 'a').write('x')\nn = len(open(p).read())\n"
                                      f"print('error: the Prefect API answered 503')\nraise SystemExit({code})"]
    monkeypatch.setattr(tsweep, "child_command", child)
    lines: list[str] = []
    doc = run_sweep(str(f), echo=lines.append)
    starts = {p.name.split("-", 1)[1]: len(p.read_text()) for p in tmp_path.glob("starts-*")}
    assert starts == {"ok": 1, "once": 2, "never": 2}
    assert [v["status"] for v in doc["variants"]] == ["done", "done", "unrecorded"]
    plan = json.loads((tmp_path / "work" / "sweeps" / "s" / "plan.json").read_text())
    assert [v["status"] for v in plan["variants"]] == ["done", "done", "unrecorded"]
    text = "\n".join(lines)
    assert "never seed 0: work stored, NOT RECORDED error: the Prefect API answered 503" in text, text
    assert f"1 run(s) complete but NOT RECORDED in MLflow/Prefect (never@seed0); once the servers answer, rerun " \
           f"`mlm sweep {f}` to record them" in text, text


def test_variants_and_seeds_select_the_runs_that_run(tmp_path, monkeypatch):
    """`mlm sweep --variants/--seeds` (and the flow's `variants`/`seeds`): only the selected runs start; plan.json
    still lists every run (the others pending); unknown names or seeds, and a selection of nothing, are errors
    naming what the sweep has. Children are markers: what is tested is which runs the sweep starts."""
    import sys

    from flows.cli.sweep import _seeds
    from flows.sweep import SweepFailed, run_sweep
    from tasks import sweep as tsweep
    base = write_en_ru_config(tmp_path, "select", 10, tracking={"enabled": False})
    f = _sweep(tmp_path, {"variants": [{"name": "a"}, {"name": "b", "set": {"pretrain.lr": 0.002}},
                                       {"name": "c", "set": {"pretrain.lr": 0.003}, "seeds": [0]}],
                          "seeds": [0, 1, 2], "concurrency": 2}, base=base)
    started = tmp_path / "started"
    monkeypatch.setattr(tsweep, "child_command", lambda sweep, run: [
        sys.executable, "-c", f"open({str(started)!r}, 'a').write({run.key!r} + '\\n')"])
    lines: list[str] = []
    doc = run_sweep(str(f), echo=lines.append, variants=["b", "c"], seeds=[0, 2])
    assert sorted(started.read_text().split()) == ["b@seed0", "b@seed2", "c@seed0"]
    assert {f"{v['name']}@seed{v['seed']}": v["status"] for v in doc["variants"]} == {
        "a@seed0": "pending", "a@seed1": "pending", "a@seed2": "pending", "b@seed0": "done", "b@seed1": "pending",
        "b@seed2": "done", "c@seed0": "done"}
    assert "0 run(s) stored, 3 to run, 4 not selected (--variants/--seeds), 2 at a time" in "\n".join(lines)
    # a failed selected run: the retry command keeps the selection
    monkeypatch.setattr(tsweep, "child_command", lambda sweep, run: [sys.executable, "-c", "raise SystemExit(2)"])
    with pytest.raises(SweepFailed, match=rf"rerun `mlm sweep {f} --variants a --seeds 1` to retry them"):
        run_sweep(str(f), echo=lines.append, variants=["a"], seeds=[1])
    sw = load_sweep(f)
    with pytest.raises(SweepError, match=r"--variants x,y: not a variant of this sweep \(variants: a, b, c\)"):
        sw.select(["a", "x", "y"])
    with pytest.raises(SweepError, match=r"--seeds 7: no run of this sweep has that seed \(seeds: 0, 1, 2\)"):
        sw.select(None, [0, 7])
    with pytest.raises(SweepError, match="select no run"):
        sw.select(["c"], [1])
    assert sw.select(["c"]) == {"c@seed0"} and len(sw.select()) == 7
    assert _seeds("0-2,5, 1") == [0, 1, 2, 5] and _seeds(None) == []
    with pytest.raises(SweepError, match=r"--seeds 0-x: '0-x' is not a seed or a range like 0-2"):
        _seeds("0-x")
    from flows.cli import main
    assert main(["sweep", str(f), "--dry-run", "--variants", "nope"]) == 2


def test_match_tokens_sets_steps_from_the_baseline(tmp_path):
    """match: tokens gives every variant the baseline's input tokens: steps x batch_size x seq_len, by hand."""
    f = _sweep(tmp_path, {"variants": [{"name": "b4"}, {"name": "b8", "set": {"pretrain.batch_size": 8}},
                                       {"name": "b2", "set": {"pretrain.batch_size": 2}}],
                          "baseline": "b4", "match": "tokens"})
    sw = load_sweep(f)
    base = load_config(sw.base_path).config
    budget = base.pretrain.steps * base.pretrain.batch_size * base.shards.seq_len      # 3 x 4 x 16 tokens
    for run in sw.runs:
        cfg = sw.load_run(run).config
        assert cfg.pretrain.steps == max(1, round(budget / (cfg.pretrain.batch_size * cfg.shards.seq_len))), run
    assert [sw.load_run(r).config.pretrain.steps for r in sw.runs] == [3, 2, 6]
    f = _sweep(tmp_path, {"variants": [{"name": "a"}, {"name": "b", "set": {"pretrain.steps": 9}}], "match": "flops"})
    with pytest.raises(SweepError, match=r"variant 'b': pretrain\.steps: match: flops sets the steps"):
        load_sweep(f)


def test_sweep_section_and_concurrency_override(tmp_path):
    base = _base(tmp_path)
    f = tmp_path / "in-section.yaml"
    f.write_text(yaml.safe_dump({"sweep": {"name": "sec", "base": base.name, "variants": [{"name": "a"}]}}))
    sw = load_sweep(f, concurrency=3)
    assert sw.config.name == "sec" and sw.config.concurrency == 3
    with pytest.raises(SweepError, match="--concurrency 0: give at least 1"):
        load_sweep(f, concurrency=0)
    with pytest.raises(SweepError, match=r"base: nope\.yaml: config file not found"):
        load_sweep(_sweep(tmp_path, {"base": "nope.yaml", "variants": [{"name": "a"}]}, base=base))


def test_set_overrides_every_run_before_the_variants(tmp_path, capsys):
    """`mlm sweep --set` / `mlm report --set`: applied to the base config of every run, the variant's own win."""
    f = _sweep(tmp_path, {"variants": [{"name": "a"}, {"name": "b", "set": {"pretrain.lr": 0.001}}], "seeds": [0, 1]})
    sw = load_sweep(f, overrides=["pretrain.lr=0.003", "pretrain.steps=7"])
    got = {(r.variant, r.seed): sw.load_run(r).config for r in sw.runs}
    assert {k: (c.pretrain.lr, c.pretrain.steps, c.pretrain.seed) for k, c in got.items()} == {
        ("a", 0): (0.003, 7, 0), ("a", 1): (0.003, 7, 1), ("b", 0): (0.001, 7, 0), ("b", 1): (0.001, 7, 1)}
    assert sw.base.config.pretrain.steps == 7
    # the overridden runs are other runs than the plain sweep's: other pretrain fingerprints
    plain = load_sweep(f)
    fp = lambda s, r: stages.plan(s.load_run(r))["pretrain"].fingerprint  # noqa: E731
    assert fp(sw, sw.runs[0]) != fp(plain, plain.runs[0])
    with pytest.raises(SweepError, match=r"--set pretrain\.seed=3: the sweep's `seeds` set pretrain\.seed"):
        load_sweep(f, overrides=["pretrain.seed=3"])
    with pytest.raises(SweepError, match=r"(?s)base: .*pretrain\.stepz: unknown key"):
        load_sweep(f, overrides=["pretrain.stepz=3"])
    from flows.cli import main
    assert main(["sweep", str(f), "--dry-run", "--set", "pretrain.steps=7"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[2] for line in out.splitlines() if line.startswith(("a ", "b "))] == ["7"] * 4, out
    # a variant that names its own registry.model_name keeps it
    f = _sweep(tmp_path, {"variants": [{"name": "a", "set": {"registry.model_name": "mine"}}, {"name": "b"}]})
    assert [load_sweep(f).load_run(r).config.registry.model_name for r in load_sweep(f).runs] == [
        "mine", "sweeptest-model-sweep-s"]


def test_a_resumed_sweep_closes_the_runs_its_killed_children_left_running(tmp_path):
    """``close_orphans``: under the sweep's MLflow run, a pipeline run and its stage run left RUNNING by a process
    that is gone become KILLED; a RUNNING run of a live process (another sweep of the same file), a run of
    another sweep, and finished runs are left as they are. The runs are made here with MLflow's own client."""
    import socket
    import subprocess
    import sys

    from mlflow import MlflowClient

    from mlm_core.config import TrackingConfig
    from tasks.sweep import close_orphans
    from tasks.tracking.tracker import Tracker
    tr = Tracker(TrackingConfig(experiment="orphans"), tmp_path / "w")
    c: MlflowClient = tr.client
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    host = socket.gethostname()

    def run(parent: str | None, pid: str, status: str = "RUNNING") -> str:
        tags = {"mlm.pid": pid, "mlm.host": host, **({"mlflow.parentRunId": parent} if parent else {})}
        rid = c.create_run(tr.experiment_id, tags=tags).info.run_id
        if status != "RUNNING":
            c.set_terminated(rid, status=status)
        return rid
    try:
        sweep, other = run(None, dead), run(None, dead)
        killed = run(sweep, dead)
        killed_stage = run(killed, dead)
        finished = run(sweep, dead, "FINISHED")
        live_run = run(sweep, str(live.pid))
        other_child = run(other, dead)
        assert sorted(close_orphans(tr, sweep)) == sorted([killed, killed_stage])
        status = {rid: c.get_run(rid).info.status for rid in (sweep, killed, killed_stage, finished, live_run,
                                                              other_child)}
        assert status == {sweep: "RUNNING", killed: "KILLED", killed_stage: "KILLED", finished: "FINISHED",
                          live_run: "RUNNING", other_child: "RUNNING"}
    finally:
        live.kill()
        live.wait()
