"""Planning a sweep: every run's stage fingerprints, which outputs runs share, and the stored ``plan.json``.

In: a ``Sweep`` (``mlm_core.sweep``). Out: ``SweepPlan`` — per run, ``stages.plan`` of its config (fingerprint
and status of every stage, nothing run); per stage, the distinct outputs across runs and how many are stored.
Runs that differ only in pretraining get the same normalize / tokenizer / shards fingerprints, so those are
computed once and shared (the store's per-output lock makes concurrent runs wait for, then reuse, the first).

The dry-run table (also printed before any work) reads, per stage::

    normalize   1 output shared by 4 runs (done)
    pretrain    4 outputs for 4 runs: 2 done, 2 to run

``plan.json`` (``<workdir>/sweeps/<name>/plan.json``, the interface the report reads): the sweep's name, file,
base config, baseline, metrics, primary (metric and contrasts, each with its baseline filled in; null when the
sweep declares none), match, seeds, the MLflow run, and ``variants``: one entry per run with
``name``, ``seed``, ``overrides`` (the ``--set`` words), ``settings``, ``config_fingerprints`` {stage: fp} and
``status`` (done / pending before a run; running / done / failed while the sweep runs). Written atomically.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mlm_core import stages
from mlm_core.store import StageStore
from mlm_core.sweep import Sweep, SweepRun, variant_seeds

PLAN_FILE = "plan.json"


@dataclass(frozen=True)
class RunPlan:
    run: SweepRun
    stages: dict[str, stages.StagePlan]

    @property
    def fingerprints(self) -> dict[str, str]:
        return {name: p.fingerprint for name, p in self.stages.items()}

    @property
    def done(self) -> bool:
        return all(p.status == "done" for p in self.stages.values())


@dataclass(frozen=True)
class SweepPlan:
    sweep: Sweep
    runs: tuple[RunPlan, ...]

    def stage_rows(self) -> list[dict]:
        """Per stage: distinct outputs across runs, how many runs use them, and how many are stored."""
        rows = []
        for name in stages.stage_names():
            outputs: dict[str, str] = {}
            for rp in self.runs:
                p = rp.stages[name]
                outputs[p.fingerprint] = p.status
            done = sum(s == "done" for s in outputs.values())
            rows.append({"stage": name, "outputs": len(outputs), "runs": len(self.runs), "done": done,
                         "to_run": len(outputs) - done})
        return rows

    def pending(self) -> list[RunPlan]:
        return [rp for rp in self.runs if not rp.done]


def plan_sweep(sweep: Sweep, store: StageStore | None = None) -> SweepPlan:
    """``stages.plan`` for every run (nothing runs; only the fingerprints' cheap inputs are read)."""
    store = store or StageStore(sweep.base.workdir)
    return SweepPlan(sweep, tuple(RunPlan(r, stages.plan(sweep.load_run(r), store)) for r in sweep.runs))


def stage_line(row: dict) -> str:
    if row["outputs"] == 1:
        state = "done" if row["done"] else "to run"
        who = f"shared by {row['runs']} runs" if row["runs"] > 1 else "for 1 run"
        return f"{row['stage']:<10} 1 output {who} ({state})"
    shared = f" (each shared by {row['runs'] // row['outputs']})" if row["runs"] % row["outputs"] == 0 and \
        row["outputs"] < row["runs"] else ""
    return (f"{row['stage']:<10} {row['outputs']} outputs for {row['runs']} runs{shared}: {row['done']} done, "
            f"{row['to_run']} to run")


def table_lines(sp: SweepPlan) -> list[str]:
    """The dry-run table: the stages shared and to run, then one line per run."""
    cfg = sp.sweep.config
    per_variant = any(v.seeds is not None for v in cfg.variants)
    seeds = (f"{len(cfg.seeds)} seed(s)" if not per_variant else
             "seeds per variant (" + ", ".join(f"{n} {len(variant_seeds(cfg, n))}" for n in sp.sweep.variant_names)
             + ")")
    lines = [f"sweep {cfg.name}: {len(sp.sweep.variant_names)} variant(s) x {seeds} = "
             f"{len(sp.runs)} run(s) on {sp.sweep.base_path.name}; concurrency {cfg.concurrency}"
             + (f"; steps matched ({cfg.match}) to {cfg.baseline or sp.sweep.variant_names[0]}"
                if cfg.match != "none" else ""), ""]
    lines += [stage_line(r) for r in sp.stage_rows()]
    lines += ["", f"{'variant':<28} {'seed':>4} {'steps':>6}  {'status':<8} pretrain"]
    for rp in sp.runs:
        steps = sp.sweep.load_run(rp.run).config.pretrain.steps
        lines.append(f"{rp.run.variant:<28} {rp.run.seed:>4} {steps:>6}  {'done' if rp.done else 'to run':<8} "
                     f"{rp.stages['pretrain'].fingerprint}")
    return lines


def plan_path(sweep: Sweep) -> Path:
    return sweep.state_dir / PLAN_FILE


def plan_document(sp: SweepPlan, status: dict[str, str] | None = None, mlflow_run_id: str | None = None) -> dict:
    """What ``plan.json`` holds (module docstring); ``status``: {run key: status} overriding the planned one."""
    sw, cfg = sp.sweep, sp.sweep.config
    status = status or {}
    return {
        "name": cfg.name, "sweep_file": str(sw.path.resolve()), "base": str(sw.base_path), "baseline": cfg.baseline,
        "metrics": list(cfg.metrics), "match": cfg.match, "seeds": list(cfg.seeds), "description": cfg.description,
        "matched_steps": dict(sw.steps),
        "primary": None if cfg.primary is None else {
            "metric": cfg.primary.metric,
            "contrasts": [{"variant": c.variant, "baseline": c.baseline or cfg.baseline, "expect": c.expect,
                           "claim": c.claim} for c in cfg.primary.contrasts]}, "mlflow_run_id": mlflow_run_id, "updated": time.time(),
        "stages": sp.stage_rows(),
        "variants": [{"name": rp.run.variant, "seed": rp.run.seed, "overrides": list(rp.run.overrides),
                      "settings": rp.run.settings, "config_fingerprints": rp.fingerprints,
                      "status": status.get(rp.run.key, "done" if rp.done else "pending")} for rp in sp.runs],
    }


def write_plan(sweep: Sweep, doc: dict) -> Path:
    """Atomic: a reader (the report, a second `mlm sweep`) never sees half a file."""
    out = plan_path(sweep)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".plan-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, ensure_ascii=False, default=str)
    os.replace(tmp, out)
    return out


def read_plan(sweep: Sweep) -> dict | None:
    p = plan_path(sweep)
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


__all__ = ["RunPlan", "SweepPlan", "plan_sweep", "table_lines", "stage_line", "plan_document", "write_plan",
           "read_plan", "plan_path", "PLAN_FILE"]
