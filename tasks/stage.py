"""The one task pattern every stage goes through: run (or reuse), validate, log, publish.

In: a config path + overrides, a stage name and the stage's plan as JSON (plain JSON values, so Prefect
never pickles a payload; the pipeline flow plans once per run). Out: a ``StageResult`` dict (stage, fingerprint, path, cache hit, MLflow run id).

1. ``mlm_core.stages.execute`` runs the stage into a temporary folder, or reuses the stored output;
2. the output's data contract (``schemas/<stage>.suite.json``) is checked *before* the output is
   renamed into place, so an output that failed validation never becomes "complete"; the contract's
   thresholds (config fields declared ``threshold``) are not in the fingerprint: a stored output reused
   under thresholds other than those it was validated with is re-validated, never recomputed, and the
   stage fails if it no longer passes;
3. a nested MLflow run records config, statistics, manifest, validation result and lineage;
4. Prefect markdown + table artifacts summarize it in the UI.
"""
from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from mlm_core import stages
from mlm_core.config.io import load_config
from mlm_core.store import StageStore
from tasks import orchestrator, progress_log, publish, registry
from tasks.tracking import Tracker
from tasks.validation import ValidationFailed, validate_stage

log = logging.getLogger(__name__)

# Stage-specific steps after the stage's MLflow run is logged (e.g. registering the trained model).
POST_LOG = {"pretrain": registry.register_pretrained, "evaluate": registry.after_evaluate,
            "register": registry.promote}
# Stages whose function takes a ``metrics_cb``: their MLflow run opens first and receives the metrics live.
STREAMS_METRICS = {"pretrain"}


def revalidate(name: str, art, plan, seed: int):
    """Re-check a reused output when the thresholds in force differ from those it was validated with.

    Returns the ValidationReport (None when nothing changed); raises ValidationFailed when it now fails."""
    if plan.thresholds == art.manifest.get("thresholds"):
        return None
    manifest = stages.with_thresholds(art.manifest, plan.thresholds)
    try:
        return validate_stage(name, art.path, manifest, seed=seed)
    except ValidationFailed as exc:
        if name != "normalize" or exc.detail:
            raise
        from mlm_core.normalize.worst import worst_files_report     # name the worst files, as the first run does
        detail = worst_files_report(art.path, float(manifest["config"]["normalize"]["max_quarantine_rate"]))
        if not detail:
            raise
        raise ValidationFailed(exc.report, exc.out_dir, detail) from None


def _logger():
    try:
        return get_run_logger()
    except Exception:  # called outside a Prefect run (e.g. benchmarks calling .fn)
        return log


def _gates(art) -> dict:
    """The register output's gate outcome for the run's final line: {passed, n, failed: [names]}."""
    gates = art.gates or []                     # a Registration (mlm_core.artifacts)
    return {"passed": bool(art.passed), "n": len(gates), "failed": list(art.failed_gates or [])}


@task(name="stage", task_run_name="{name}", retries=2, retry_delay_seconds=2,
      retry_condition_fn=lambda task, run, state: publish.is_transient(state))
def run_stage(config_path: str, overrides: list[str], name: str, force: bool = False,
              parent_run_id: str | None = None, plan: dict | None = None) -> dict:
    """Run one stage (or reuse its stored output), validate it, log it, publish it.

    ``plan``: this stage's ``StagePlan.to_json()``, made once per run by the pipeline flow (``flows.pipeline``);
    without one (a direct call) the task plans the pipeline itself."""
    logger = _logger()
    lc = load_config(config_path, overrides)
    store = StageStore(lc.workdir)
    if plan is None:
        plan = stages.plan(lc, store)[name].to_json()
    plans = {name: stages.StagePlan.from_json(plan)}      # execute reads only the stage's own plan
    todo = force or not store.is_complete(name, plans[name].fingerprint)
    tracker = Tracker(lc.config.tracking, lc.workdir, parent_run_id=parent_run_id)
    reports: dict = {}

    def check(tmp: Path, manifest: dict) -> None:
        reports["validation"] = validate_stage(name, tmp, manifest, seed=lc.config.seed)

    t0 = time.time()
    live = None
    hooks = {}
    if name in STREAMS_METRICS and todo:
        live = tracker.start_stage(name, plans[name].fingerprint, started=t0)   # curves appear while it trains
        if live is not None:
            hooks["metrics_cb"] = tracker.stream(live)   # a background thread: training never waits on MLflow
    if stages.STAGES[name].partitioned:
        from tasks.engine import mapper_for
        mapper = mapper_for(lc, name)          # execution.engine: each partition a Prefect task on Dask
        if mapper is not None:
            if todo:
                mapper.preflight()             # an unreachable scheduler / unshared workdir: fail before any work
            hooks["mapper"] = mapper
    hit = False
    try:
        with progress_log.to_run_log():     # live progress lines also reach the Prefect run log
            art, hit = stages.execute(lc, name, plans, force=force, check=check, store=store, hooks=hooks)
        if hit:
            reports["validation"] = revalidate(name, art, plans[name], lc.config.seed)
    except ValidationFailed as exc:
        run_id = tracker.log_stage(name, fingerprint=plans[name].fingerprint, cache_hit=hit,
                                   params=plans[name].params(), metrics={},
                                   dicts={"validation/result.json": exc.report.to_json()},
                                   tags={"validation": "failed"}, status="FAILED", run_id=live,
                                   started=t0, ended=time.time())
        tracker.log_validation(run_id, exc.report)     # summary.md + GE Data Docs HTML
        if name == "evaluate":     # the model version is tagged evaluation=failed and gets no alias
            try:
                registry.evaluation_failed(tracker, lc, plans[name].upstream["pretrain"], exc.report)
            except Exception as tag_exc:  # noqa: BLE001 - the contract failure is the error to report
                log.warning("evaluate: tagging the model version failed: %s", tag_exc)
        publish.stage_failed(name, plans[name].fingerprint, exc.report, tracker.run_url(run_id))
        raise
    except BaseException as exc:
        # an engine error may carry tags for the failed run (pretrain's PlateauError: plateau=true, its step)
        tracker.set_stage_tags(live, getattr(exc, "run_tags", None) or {})
        tracker.fail_stage(live, ended=time.time())
        raise
    t1 = time.time()       # the stage's run spans t0..t1 (the real work), not the logging below
    seconds = t1 - t0
    report = reports.get("validation")
    metrics = publish.flat_metrics(art.manifest)
    tags = {"validation": ("passed" if report.success else "failed") if report else "cached"}
    if report is not None and report.failed_warnings:
        tags["validation_warnings"] = str(len(report.failed_warnings))
    tags |= publish.run_tags(name, art)
    dicts = {"manifest.json": art.manifest}
    if report is not None:
        dicts["validation/result.json"] = report.to_json()
    with tempfile.TemporaryDirectory() as tmp:
        figures = publish.plots(name, art, tmp) if tracker.enabled else []
        run_id = tracker.log_stage(
            name, fingerprint=art.fingerprint, cache_hit=hit, params=plans[name].params(), metrics=metrics,
            dicts=dicts, tables=publish.stat_tables(name, art), inputs=publish.lineage(name, art, lc),
            tags=tags, artifacts=figures, artifact_dir="plots", run_id=live, started=t0, ended=t1,
            step=int(art.manifest.get("steps") or 0))   # pretrain: final metrics at the last step, not 0
    if report is not None:
        tracker.log_validation(run_id, report)     # summary.md + GE Data Docs HTML
    registered = POST_LOG[name](art, tracker, run_id, lc) if name in POST_LOG else None
    url = tracker.run_url(run_id)
    # recording in Prefect is best effort: an API (or database) outage must not fail a stage whose output is
    # complete; the CLI's closing line says what was not recorded (tasks/orchestrator.py, flows/outage.py)
    markdown = publish.stage_markdown(name, art, hit, seconds, report, url)
    orchestrator.best_effort(lambda: create_markdown_artifact(
        key=f"{name}-summary", markdown=markdown, description=f"{name}: {'cache hit' if hit else 'ran'}"),
        f"{name} artifacts")
    rows = publish.table_rows(name, art)
    if rows:
        orchestrator.best_effort(lambda: create_table_artifact(
            key=f"{name}-stats", table=rows, description=f"{name}: {publish.table_title(name)}"),
            f"{name} table")
    logger.info("%s: %s %s in %.1fs -> %s", name, "cached" if hit else "ran", art.fingerprint, seconds, art.path)
    return {"stage": name, "fingerprint": art.fingerprint, "path": str(art.path), "cache_hit": hit,
            "model_version": registered,
            "gates": _gates(art) if name == "register" else None,
            "seconds": round(seconds, 3), "mlflow_run_id": run_id,
            "validation": tags["validation"], "counts": json.loads(json.dumps(art.manifest.get("counts", {})))}
