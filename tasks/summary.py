"""The pipeline-level Prefect artifact: one table for the whole run, on the parent flow run.

In: the selected stage names, the ``StageResult`` dicts of the stages that finished, the failed stage (if
any), the ``Tracker`` (for MLflow links and the registered version). Out: a markdown artifact with key
``pipeline-summary`` holding each stage's status, cache hit, seconds, validation, fingerprint and MLflow
run, and the model version this run registered (with its aliases and gate result).

Why: each stage published its own artifact, but nothing said how the run as a whole went, nor which
model version it produced; a user had to open seven artifacts to find out.
"""
from __future__ import annotations

import logging

from mlm_core.redact import redact
from tasks.tracking import is_http

log = logging.getLogger(__name__)
KEY = "pipeline-summary"
REGISTERING = ("pretrain", "register")   # the stages whose result carries the registered version


def _link(url: str | None, run_id: str | None) -> str:
    if url:
        return f"[{run_id[:8] if run_id else 'run'}]({url})"
    return f"`{run_id}`" if run_id else "-"


def stage_rows(chosen: list[str], results: list[dict], failed: str | None, tracker) -> list[dict]:
    """One row per selected stage: finished ones from their result, then the failed one, then those not run."""
    by_stage = {r["stage"]: r for r in results}
    rows = []
    for name in chosen:
        r = by_stage.get(name)
        if r is None:
            rows.append({"stage": name, "status": "FAILED" if name == failed else "not run", "cache": "-",
                         "seconds": "-", "validation": "-", "fingerprint": "-", "mlflow": "-"})
            continue
        run_id = r.get("mlflow_run_id")
        rows.append({"stage": name, "status": "cached" if r["cache_hit"] else "ran",
                     "cache": "hit" if r["cache_hit"] else "miss", "seconds": f"{r['seconds']:.1f}",
                     "validation": r.get("validation", "-"), "fingerprint": f"`{r['fingerprint']}`",
                     "mlflow": _link(tracker.run_url(run_id), run_id)})
    return rows


def registered(results: list[dict], tracker, model_name: str) -> dict | None:
    """The version this run registered or promoted (None when no registering stage ran or tracking is off),
    with its aliases and gate tags read back from the registry."""
    versions = [r.get("model_version") for r in results if r["stage"] in REGISTERING and r.get("model_version")]
    if not versions:
        return None
    out = {"name": model_name, "version": int(versions[-1]), "aliases": [], "gates": None, "url": None}
    try:
        mv = tracker.client.get_model_version(model_name, str(out["version"]))
        out["aliases"] = sorted(mv.aliases or [])
        out["gates"] = (mv.tags or {}).get("gates")
    except Exception as exc:  # noqa: BLE001 - the summary must not fail a finished pipeline
        log.warning("pipeline summary: reading %s version %s failed: %s", model_name, out["version"], exc)
    if is_http(tracker.uri):   # a server with a UI: link its model-version page
        out["url"] = f"{redact(tracker.uri).rstrip('/')}/#/models/{model_name}/versions/{out['version']}"
    return out


def _registered_line(reg: dict | None, chosen: list[str], tracker, failed: str | None) -> str:
    if reg is not None:
        name = f"`{reg['name']}` version {reg['version']}"
        if reg["url"]:
            name = f"[{name}]({reg['url']})"
        aliases = ", ".join(f"`@{a}`" for a in reg["aliases"]) or "none"
        gates = {"passed": "passed", "failed": "FAILED"}.get(reg["gates"] or "", "not evaluated yet")
        return f"- registered model: {name}; aliases: {aliases}; gates: {gates}"
    if not tracker.enabled:
        return "- registered model: none (tracking is disabled: `tracking.enabled: false`)"
    if not any(s in chosen for s in REGISTERING):
        return f"- registered model: none (this run did not include {' or '.join(REGISTERING)})"
    if failed:
        return f"- registered model: none (the run failed at {failed})"
    return "- registered model: none (MLflow was unreachable; `mlm sync CONFIG` replays the runs)"


def heading(title: str, failed: str | None) -> str:
    """The artifact's description, shown once by Prefect above the table: "<name> (<selection>): completed"."""
    return redact(f"{title}: {'FAILED at ' + failed if failed else 'completed'}")


def markdown(title: str, chosen: list[str], results: list[dict], failed: str | None, tracker, model_name: str,
             config_line: str, parent_run_id: str | None) -> str:
    """The artifact's body. No heading: Prefect shows the artifact's description (``heading``) above it, and a
    ``# title`` here showed the title twice."""
    rows = stage_rows(chosen, results, failed, tracker)
    total = sum(r["seconds"] for r in results)
    lines = [f"- command: {config_line}",
             f"- stages: {len(results)} of {len(chosen)} finished "
             f"({sum(r['cache_hit'] for r in results)} cache hit(s)), {total:.1f} s in stages",
             f"- MLflow pipeline run: {_link(tracker.run_url(parent_run_id), parent_run_id)}",
             _registered_line(registered(results, tracker, model_name), chosen, tracker, failed),
             "", "## Stages", "",
             "| stage | status | cache | seconds | validation | fingerprint | MLflow run |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['stage']} | {r['status']} | {r['cache']} | {r['seconds']} | {r['validation']} | "
              f"{r['fingerprint']} | {r['mlflow']} |" for r in rows]
    return redact("\n".join(lines) + "\n")


def publish(title: str, chosen: list[str], results: list[dict], failed: str | None, tracker, model_name: str,
            config_line: str, parent_run_id: str | None) -> str | None:
    """Create the ``pipeline-summary`` artifact on the current flow run (no-op outside one). Never raises:
    a summary that cannot be written must not turn a finished pipeline into a failed one."""
    try:
        from prefect.artifacts import create_markdown_artifact
        from prefect.context import FlowRunContext
        if FlowRunContext.get() is None:
            return None
        md = markdown(title, chosen, results, failed, tracker, model_name, config_line, parent_run_id)
        create_markdown_artifact(key=KEY, markdown=md, description=heading(title, failed))
        return md
    except Exception as exc:  # noqa: BLE001
        log.warning("pipeline summary artifact not written: %s", exc)
        return None
