"""The sweep report, delivered: built from stored outputs (``mlm_core.report``), logged to the sweep's MLflow run
and published as a Prefect markdown artifact.

In: the sweep folder ``<workdir>/sweeps/<name>`` (its plan.json, or a plan document given), the sweep's MLflow
run id (plan.json's ``mlflow_run_id`` by default) and a ``Tracker`` (or the base config's tracking section to
open one). Out: ``report/`` (report.md, report.html, report.json, PNGs) logged under the run's ``report/``
artifact folder, each variant's mean and paired difference of every metric as run metrics
(``report.<variant>.<metric>.mean`` / ``.diff``), and, inside a Prefect flow run, a markdown artifact
``sweep-report-<name>`` with the tables (the figures are files: the artifact names where they are).
Tracking disabled or unreachable: the files only. mlflow and prefect are imported inside functions.
"""
from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

log = logging.getLogger(__name__)


def artifact_key(name: str) -> str:
    return "sweep-report-" + re.sub(r"[^a-z0-9-]", "-", (name or "sweep").lower())


def _metrics(tables: dict) -> dict[str, float]:
    out = {}
    for metric, rows in tables.items():
        for r in rows:
            if r.get("control"):            # the control's rows: shown in the report, not logged per variant
                continue
            key = re.sub(r"[^A-Za-z0-9_.\-/ ]", "_", f"report.{r['variant']}.{metric}")
            if r["mean"] is not None:
                out[f"{key}.mean"] = r["mean"]
            if r.get("diff") and r["diff"].get("mean") is not None:
                out[f"{key}.diff"] = r["diff"]["mean"]
    return out


def prefect_markdown(md: str, where: str) -> str:
    """The report for Prefect's UI: image lines (local PNG files) become a line naming where the figures are."""
    lines = []
    for line in md.splitlines():
        m = re.fullmatch(r"!\[(.*)\]\((.*)\)", line)
        lines.append(f"*Figure `{m.group(2)}`: {where}*" if m else line)
    return "\n".join(lines)


def publish_artifact(md: str, name: str) -> bool:
    """A Prefect markdown artifact on the current flow run (a no-op outside one)."""
    if "prefect" not in sys.modules:     # `mlm report`: no flow run can be active; importing Prefect costs ~2 s
        return False
    try:
        from prefect.artifacts import create_markdown_artifact
        from prefect.context import FlowRunContext
        if FlowRunContext.get() is None:
            return False
        create_markdown_artifact(key=artifact_key(name), markdown=md, description=f"sweep {name}: report")
        return True
    except Exception as exc:  # noqa: BLE001 - the report is written and logged; the artifact is a view
        log.warning("sweep report: Prefect artifact not published: %s", exc)
        return False


def publish_report(sweep_dir: Path, *, plan: dict | None = None, run_id: str | None = None, tracker=None,
                   tracking=None, workdir: Path | None = None) -> dict:
    """Build the report and deliver it (module docstring). ``tracker``: an open ``tasks.tracking.Tracker``;
    without one, ``tracking`` (a TrackingConfig) + ``workdir`` open one when ``run_id`` is known.
    Returns build_report's dict + {"run_id", "logged", "published"}."""
    from mlm_core.report.build import build_report
    from mlm_core.report.collect import read_plan
    sweep_dir = Path(sweep_dir)
    plan = plan if plan is not None else read_plan(sweep_dir)
    res = build_report(sweep_dir, plan)
    run_id = run_id or plan.get("mlflow_run_id")
    logged = False
    if run_id and tracker is None and tracking is not None and tracking.enabled:
        from tasks.tracking import Tracker
        try:
            tracker = Tracker(tracking, Path(workdir or sweep_dir.parent.parent), parent_run_id=run_id)
        except Exception as exc:  # noqa: BLE001 - the report files stand without MLflow
            log.warning("sweep report: MLflow not reachable (%s); report written to %s only", exc, res["dir"])
            tracker = None
    if run_id and tracker is not None and tracker.active:
        tracker._guard("logging the sweep report", tracker.client.log_artifacts, run_id, str(res["dir"]), "report")
        mets = _metrics(res["tables"])
        if mets:
            from mlflow.entities import Metric
            import time
            now = int(time.time() * 1000)
            items = [Metric(k, float(v), now, 0) for k, v in mets.items()]
            for i in range(0, len(items), 500):        # MLflow's batch limit: 1000 metrics per call
                tracker._guard("logging the report's metrics", tracker.client.log_batch, run_id, metrics=items[i:i + 500])
        logged = tracker.active
    where = f"`report/` artifacts of MLflow run `{run_id}`" if logged else f"`{res['dir']}`"
    published = publish_artifact(prefect_markdown(res["markdown"], where), plan.get("name") or sweep_dir.name)
    return res | {"run_id": run_id if logged else None, "logged": logged, "published": published}


__all__ = ["publish_report", "publish_artifact", "prefect_markdown", "artifact_key"]
