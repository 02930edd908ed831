"""``mlm sync CONFIG``: bring MLflow up to date with the stored outputs, after the server was lost.

A run is found by its own identity, never by the config's current plan: its MLflow run id and its stage output's
(stage, fingerprint). The outputs to reconcile are
- those the workdir's journal (``tasks.tracking.journal``) names: every run that ended while the server was
  unreachable, whatever ``--set`` overrides it had;
- those of RUNNING runs in the experiment whose process is gone (tags ``stage`` and ``fingerprint``);
- the config's planned outputs that are complete (a run never created at all gets one, tagged ``synced``).

For each, from the stored output (the source of truth): the parameters (its config and thresholds, as a live
run logs them), its metrics, tags, the ``manifest.json`` artifact, its stat table and plots, and every
``metrics.jsonl`` point MLflow lacks are sent; only what the run lacks (a second sync sends nothing).

Statuses: a finished run (FINISHED, FAILED, KILLED) is never changed. A RUNNING run whose process is gone gets
the end its process meant to record (the journal's), else FINISHED when its stage output is complete, else
FAILED (it was killed before its end). A pipeline run left RUNNING the same way gets its journaled end, else
FAILED. Returns a report dict for the CLI.
"""
from __future__ import annotations

import logging
import os
import socket
import tempfile
import time

from mlm_core.errors import MlmError
from mlm_core.train.metrics_file import read_records
from tasks.tracking.journal import entry_key, pending, settle
from tasks.tracking.tracker import Tracker
from tasks.tracking.values import (MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH, chunks, flatten_params,
                                   history_points, tag_values)

log = logging.getLogger(__name__)

FINISHED_STATUSES = ("FINISHED", "FAILED", "KILLED")


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


def orphaned(run) -> bool:
    """A RUNNING run whose mlm process (same host) no longer exists (or is this very process: `mlm sync`
    itself leaves no run open, so one of its own is left over, e.g. in a test)."""
    from mlm_core.store import pid_alive
    pid, host = run.data.tags.get("mlm.pid", ""), run.data.tags.get("mlm.host")
    return host == socket.gethostname() and pid.isdigit() and (int(pid) == os.getpid() or not pid_alive(int(pid)))


def _stage_params(art) -> dict:
    """What the live run logs as its parameters (``Plan.params``): the fingerprinted config plus the
    thresholds the output was validated against, both recorded in its manifest."""
    from mlm_core.stages import with_thresholds
    return with_thresholds({"config": art.manifest.get("config") or {}}, art.manifest.get("thresholds") or {})["config"]


class _Replay:
    """Sends one stored output's record to one MLflow run, only what the run lacks."""

    def __init__(self, tr, lc, report: dict):
        self.tr, self.c, self.lc, self.report = tr, tr.client, lc, report

    def fill(self, name: str, art, run_id: str) -> None:
        from mlflow.entities import Metric, Param, RunTag

        from tasks import publish
        run = self.c.get_run(run_id)
        have_params, have_tags, have_metrics = run.data.params, run.data.tags, run.data.metrics
        params = [Param(k, v) for k, v in flatten_params(_stage_params(art)).items() if k not in have_params]
        want_tags = {"validation": "passed",     # a complete output passed its data contract when it was written
                     **tag_values(publish.run_tags(name, art))}
        tags = [RunTag(k, v) for k, v in want_tags.items() if k not in have_tags]
        if params or tags:
            tags.append(RunTag("synced", "true"))
        ts, step = int(time.time() * 1000), int(art.manifest.get("steps") or 0)
        final = publish.flat_metrics(art.manifest)
        metrics = [Metric(k, float(v), ts, step) for k, v in final.items() if k not in have_metrics]
        for chunk in chunks(params, MAX_PARAMS_TAGS_PER_BATCH):
            self.c.log_batch(run_id, params=chunk)
        for chunk in chunks(tags, MAX_PARAMS_TAGS_PER_BATCH):
            self.c.log_batch(run_id, tags=chunk)
        for chunk in chunks(metrics, MAX_METRICS_PER_BATCH):
            self.c.log_batch(run_id, metrics=chunk)
        self.report["params"] += len(params)
        self.report["tags"] += len([t for t in tags if t.key != "synced"])
        self.report["points"] += len(metrics)
        if "manifest.json" not in {f.path for f in self.c.list_artifacts(run_id)}:
            self.c.log_dict(run_id, art.manifest, "manifest.json")
            n = 1
            for tname, df in publish.stat_tables(name, art).items():
                self.c.log_table(run_id, df, tname)
                n += 1
            with tempfile.TemporaryDirectory() as tmp:
                for p in publish.plots(name, art, tmp):
                    self.c.log_artifact(run_id, str(p), artifact_path="plots")
                    n += 1
            self.report["artifacts"] += n
        points = _missing_points(self.c, run_id, history_points(read_records(art.path / "metrics.jsonl"), ts=ts))
        for chunk in chunks(points, MAX_METRICS_PER_BATCH):
            self.c.log_batch(run_id, metrics=chunk)
        self.report["points"] += len(points)


def _end_time(entry: dict | None, art) -> int | None:
    t = (entry or {}).get("ended") or (art.manifest.get("created_at") if art is not None else None)
    return None if t is None else int(round(float(t) * 1000))


def sync(lc) -> dict:
    """Replay the stored outputs' runs to the config's tracking server (see the module doc)."""
    from mlm_core import stages
    from mlm_core.store import StageStore

    if not lc.config.tracking.enabled:
        raise MlmError("tracking.enabled is false in this config: there is no MLflow server to sync to")
    tr = Tracker(lc.config.tracking, lc.workdir)          # TrackingError (one line) when still unreachable
    c = tr.client
    store = StageStore(lc.workdir)
    report: dict = {"uri": tr.uri, "created": [], "finished": [], "points": 0, "params": 0, "tags": 0,
                    "artifacts": 0, "closed": [], "kept": [], "pending": 0}
    journal = pending(lc.workdir)
    ends = {e["run_id"]: e for e in journal if e.get("run_id")}     # the end each run meant to record
    order = {name: i for i, name in enumerate(stages.STAGES)}
    targets: dict[tuple[str, str], None] = {}
    for e in journal:
        if e.get("kind") == "stage" and e.get("stage") in order and e.get("fingerprint"):
            targets[(e["stage"], e["fingerprint"])] = None
    running = c.search_runs([tr.experiment_id], "attributes.status = 'RUNNING'", max_results=1000)
    for r in running:
        st, fp = r.data.tags.get("stage"), r.data.tags.get("fingerprint")
        if st in order and fp and (orphaned(r) or r.info.run_id in ends):
            targets[(st, fp)] = None
    for name, p in stages.plan(lc, store).items():
        if p.status == "done":
            targets[(name, p.fingerprint)] = None
    replay = _Replay(tr, lc, report)
    settled: set[tuple] = set()
    for name, fp in sorted(targets, key=lambda t: order[t[0]]):
        if not store.is_complete(name, fp):
            continue                            # a run that ended before its output: closed below
        art = store.load(name, fp)
        runs = c.search_runs([tr.experiment_id], f"tags.stage = '{name}' AND tags.fingerprint = '{fp}'",
                             max_results=100)
        run = next((r for r in runs if r.data.tags.get("cache") == "miss"), runs[0] if runs else None)
        if run is None:
            # a bare finished run; ``fill`` below sends its parameters, metrics, tags and artifacts
            run_id = tr.log_stage(name, fingerprint=fp, cache_hit=False, params={}, metrics={},
                                  tags={"synced": "true"}, started=art.manifest.get("created_at"),
                                  ended=art.manifest.get("created_at"))
            if run_id is None:
                raise MlmError(f"sync: MLflow at {tr.uri} went away again while creating the {name} run; "
                               "rerun `mlm sync` once it is back")
            report["created"].append(name)
        else:
            run_id = run.info.run_id
        replay.fill(name, art, run_id)
        if run is not None and run.info.status == "RUNNING" and (run_id in ends or orphaned(run)):
            entry = ends.get(run_id)
            status = (entry or {}).get("status") or "FINISHED"   # its output is complete: the work finished
            c.set_terminated(run_id, status=status, end_time=_end_time(entry, art))
            report["finished"].append(f"{name} {status}")
        elif run is not None and run.info.status in FINISHED_STATUSES and run_id in ends \
                and ends[run_id].get("status") != run.info.status:
            report["kept"].append(f"{name} {run.info.status}")   # never changed once finished
        settled |= {entry_key(e) for e in journal if e.get("stage") == name and e.get("fingerprint") == fp}
    # what is still RUNNING with its process gone: pipeline runs, and stage runs whose output never completed
    for r in c.search_runs([tr.experiment_id], "attributes.status = 'RUNNING'", max_results=1000):
        rid = r.info.run_id
        if not (rid in ends or orphaned(r)):
            continue                            # a live run of another process
        entry = ends.get(rid)
        status = (entry or {}).get("status") or "FAILED"      # never reached its end: killed
        c.set_terminated(rid, status=status, end_time=_end_time(entry, None))
        (report["finished"] if entry else report["closed"]).append(
            f"{r.info.run_name or rid} {status}" if entry else (r.info.run_name or rid))
    for e in journal:                           # journaled runs now recorded (or never created: nothing to end)
        rid = e.get("run_id")
        if rid is None:
            if e.get("kind") != "stage" or (e.get("stage"), e.get("fingerprint")) in targets:
                settled.add(entry_key(e))
            continue
        try:
            if c.get_run(rid).info.status in FINISHED_STATUSES:
                settled.add(entry_key(e))
        except Exception:  # noqa: BLE001 - a run of another server or a deleted one: keep the entry
            continue
    if journal:
        report["pending"] = settle(lc.workdir, settled)
    return report


__all__ = ["sync", "orphaned"]
