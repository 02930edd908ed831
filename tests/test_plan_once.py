"""`mlm run` plans the pipeline once (issue 22 item 2): the CLI's plan goes to the flow, the flow hands each stage
task its own plan as JSON, and no task plans again.

Before: the CLI planned (to fail fast), the flow planned, and each of the 7 stage tasks re-planned all 7 stages
(9 calls of ``mlm_core.stages.plan`` per run, O(stages^2) fingerprints). The count here is of real calls through
``flows.cli.main(["run", ...])`` -> the Prefect pipeline flow -> ``tasks.stage.run_stage``; only the stage
functions are stubs (each writes one JSON file), so the test does not train a model.
"""
from __future__ import annotations

import dataclasses
import importlib
import json

import pytest

from conftest import write_en_ru_config
from mlm_core import stages


def _stub(name):
    """The stage's run as a stub: one JSON file, and a manifest with every key its type requires (empty)."""
    from mlm_core.artifacts import artifact_type
    empty = {"dict": {}, "list": [], "str": "", "int": 0, "float": 0.0, "bool": False}
    kinds = {f.name: str(f.type) for f in dataclasses.fields(artifact_type(name))}

    def run(lc, upstream, out_dir, **hooks):
        (out_dir / "out.json").write_text(json.dumps({"stage": name, "upstream": sorted(upstream)}))
        return {k: empty[kinds[k]] for k in artifact_type(name).required_keys()} | {
            "counts": {"upstream": len(upstream)}}
    return run


@pytest.fixture
def counted(monkeypatch):
    """Every stage a stub (no contract); ``stages.plan`` counted; no Prefect server start, no signal handlers."""
    for name, spec in list(stages.STAGES.items()):
        monkeypatch.setitem(stages.STAGES, name, dataclasses.replace(spec, run=_stub(name), partitions=None,
                                                                     suite=None))
    for mod, attr in (("flows.ephemeral", "start"), ("mlm_core.train.signals", "install")):
        m = importlib.import_module(mod)
        monkeypatch.setattr(m, attr, lambda *a, **k: None)
    calls = []
    real = stages.plan

    def plan(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(stages, "plan", plan)
    return calls


def test_mlm_run_plans_once_not_once_per_stage(tmp_path, counted, prefect_harness, capsys):
    from flows.cli import main
    cfg = write_en_ru_config(tmp_path, "planonce", 20, tracking={"enabled": False})
    assert main(["run", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert all(f"{s} " in out for s in stages.STAGES), out     # every stage ran through the task
    assert len(counted) == 1, f"stages.plan ran {len(counted)} times for one `mlm run` of {len(stages.STAGES)} stages"
    work = tmp_path / "work"
    assert all(len(list((work / s).glob("*/out.json"))) == 1 for s in stages.STAGES)
    counted.clear()
    assert main(["run", str(cfg)]) == 0           # all cached: still one plan
    assert len(counted) == 1


def test_a_stage_task_called_alone_plans_for_itself(tmp_path, counted):
    """A direct call of the task (benchmarks, ``run_stage.fn``) without a plan still works: it plans once."""
    from tasks.stage import run_stage
    cfg = write_en_ru_config(tmp_path, "planonce", 20, tracking={"enabled": False})
    r = run_stage.fn(str(cfg), [], "normalize")
    assert r["stage"] == "normalize" and not r["cache_hit"] and len(counted) == 1


def test_stage_plan_json_round_trip(tmp_path):
    from mlm_core.config.io import load_config
    cfg = write_en_ru_config(tmp_path, "planonce", 20)
    for name, p in stages.plan(load_config(str(cfg))).items():
        j = p.to_json()
        assert json.loads(json.dumps(j)) == j, name             # plain JSON (a Prefect task parameter)
        assert stages.StagePlan.from_json(j) == p, name
