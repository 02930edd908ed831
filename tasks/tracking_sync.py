"""``mlm sync CONFIG``: bring MLflow up to date with the stored outputs, after the server was lost.

In: a loaded config (its workdir and tracking settings). Out: for every complete stage output of the
config's plan, an MLflow run tagged with its stage and fingerprint, holding its manifest's metrics and
its full ``metrics.jsonl`` history (the source of truth: only the (key, step) points MLflow lacks are
sent, so a second sync sends nothing); runs left RUNNING by a process that no longer exists (killed, or
cut off from the server) are closed as FAILED. Returns a report dict for the CLI.
"""
from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

from mlm_core.errors import MlmError

log = logging.getLogger(__name__)


def _records(path: Path) -> list[dict]:
    out = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:      # a line cut short by a killed process
                continue
    return out


def _missing_points(client, run_id: str, points: list) -> list:
    """The points whose (key, step) the run does not have yet."""
    have: dict[str, set[int]] = {}
    out = []
    for p in points:
        if p.key not in have:
            have[p.key] = {m.step for m in client.get_metric_history(run_id, p.key)}
        if p.step not in have[p.key]:
            have[p.key].add(p.step)
            out.append(p)
    return out


def _orphaned(run) -> bool:
    """A RUNNING run whose mlm process (same host) no longer exists (or is this very process: `mlm sync`
    itself leaves no run open, so one of its own is left over, e.g. in a test)."""
    from mlm_core.store import pid_alive
    pid, host = run.data.tags.get("mlm.pid", ""), run.data.tags.get("mlm.host")
    return host == socket.gethostname() and pid.isdigit() and (int(pid) == os.getpid() or not pid_alive(int(pid)))


def sync(lc) -> dict:
    """Replay the stored outputs' runs and metric histories to the config's tracking server (see module doc)."""
    import time

    from mlm_core import stages
    from mlm_core.store import StageStore
    from tasks.publish import flat_metrics
    from tasks.tracking import Tracker, _chunks, history_points
    from tasks.tracking_values import MAX_METRICS_PER_BATCH

    if not lc.config.tracking.enabled:
        raise MlmError("tracking.enabled is false in this config: there is no MLflow server to sync to")
    tr = Tracker(lc.config.tracking, lc.workdir)          # TrackingError (one line) when still unreachable
    c = tr.client
    store = StageStore(lc.workdir)
    report: dict = {"uri": tr.uri, "created": [], "finished": [], "points": 0, "closed": []}
    for name, p in stages.plan(lc, store).items():
        if p.status != "done":
            continue
        art = store.load(name, p.fingerprint)
        runs = c.search_runs([tr.experiment_id], f"tags.stage = '{name}' AND tags.fingerprint = '{p.fingerprint}'",
                             max_results=100)
        run = next((r for r in runs if r.data.tags.get("cache") == "miss"), runs[0] if runs else None)
        if run is None:
            run_id = tr.log_stage(name, fingerprint=p.fingerprint, cache_hit=False, params=p.config,
                                  metrics=flat_metrics(art.manifest), dicts={"manifest.json": art.manifest},
                                  tags={"synced": "true"})
            report["created"].append(name)
        else:
            run_id = run.info.run_id
            if run.info.status == "RUNNING" and _orphaned(run):   # its process lost the server, then ended
                tr.log_stage(name, fingerprint=p.fingerprint, cache_hit=False, params={},
                             metrics=flat_metrics(art.manifest), dicts={"manifest.json": art.manifest},
                             tags={"synced": "true"}, run_id=run_id)
                report["finished"].append(name)
        points = _missing_points(c, run_id, history_points(_records(art.path / "metrics.jsonl"),
                                                           ts=int(time.time() * 1000)))
        for chunk in _chunks(points, MAX_METRICS_PER_BATCH):
            c.log_batch(run_id, metrics=chunk)
        report["points"] += len(points)
    for r in c.search_runs([tr.experiment_id], "attributes.status = 'RUNNING'", max_results=1000):
        if _orphaned(r):
            c.set_terminated(r.info.run_id, status="FAILED")
            report["closed"].append(r.info.run_name or r.info.run_id)
    return report


__all__ = ["sync"]
