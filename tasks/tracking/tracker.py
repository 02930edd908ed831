"""The tracker: one parent run per pipeline run, one nested run per stage; survives losing the server.

In: a ``TrackingConfig`` and the workdir. Out: MLflow runs (params, metrics, tags, JSON/table
artifacts, files, dataset lineage). Where the server lives and the client: ``backend``; value
conversions and lineage: ``values``; run names and context tags: ``context``; live metric streaming and
the delivery report: ``stream``; what an offline run could not tell: ``journal`` (replayed by ``sync``).

mlflow is imported inside functions: ``import mlflow`` costs about 2 s, importing this module costs nothing.

Why ``MlflowClient`` with explicit run ids instead of the fluent ``mlflow.start_run`` stack: the
fluent active run is thread-local, and Prefect runs tasks in worker threads (or other processes), so
a stage could never see the flow's parent run. A nested run is simply a run tagged
``mlflow.parentRunId`` (exactly what ``start_run(nested=True)`` writes).

MLflow 3 defaults to ``sqlite:///<CWD>/mlflow.db`` and artifacts under ``./mlruns`` in the CWD; here
both live in the workdir (``<workdir>/mlflow.db``, ``<workdir>/mlartifacts``). An experiment's
artifact location is fixed when it is created, so it is set then. Creating the SQLite database runs
MLflow's migrations; two runs doing it at once failed (``No such index``), so it happens under a lock.

Losing the server: the tracker is checked before any work starts (``check_tracking_server``). If it
goes away later, a failed call marks this tracker *offline*: later calls return at once, the outputs
are still written, and the numbers of metric records and stage runs not delivered are collected in
``delivery_report()`` for the CLI's closing warning (``mlm sync CONFIG`` replays them). MLflow's own HTTP
retries (7 retries, backoff 2: ~4.5 min per call) are shortened unless the user set them.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mlm_core.redact import redact
from tasks.tracking.backend import (HTTP_ENV_DEFAULTS, TrackingError, check_tracking_server, import_mlflow, is_http,
                                    mlflow_client, resolve_tracking_uri, server_healthy, sqlite_path)
from tasks.tracking.context import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, UI_QUERY, run_context_tags, stage_run_name
from tasks.tracking.stream import MetricsStream, first_line, note_undelivered, unreachable
from tasks.tracking.values import (MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH, chunks, epoch_ms,
                                   flatten_params, history_points, log_lineage, numeric_metrics, run_status,
                                   system_tags, tag_values)

if TYPE_CHECKING:  # pragma: no cover
    import pandas

    from mlm_core.config import TrackingConfig

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------- tracker
class Tracker:
    """One parent run per pipeline run, one nested run per stage.

    Holds only plain values (URI, experiment id, parent run id), so it pickles into Prefect tasks;
    the MLflow client is rebuilt lazily. ``parent_run_id`` attaches to a parent started elsewhere
    (the flow starts it, each stage task builds its own ``Tracker``).
    Disabled (``cfg.enabled`` False): every method is a no-op returning None, and mlflow is never imported.
    Offline (the server went away after the run started): every method is a no-op returning None, and
    what was not delivered is counted in ``delivery_report()``.
    """

    def __init__(self, cfg: "TrackingConfig", workdir: Path, parent_run_id: str | None = None):
        self.enabled = bool(cfg.enabled)
        self.workdir = Path(workdir).resolve()
        self.uri = resolve_tracking_uri(cfg, self.workdir)
        self.experiment = cfg.experiment
        self._parent: str | None = parent_run_id if self.enabled else None
        self._experiment_id: str | None = None
        self._c = None
        self.offline = False
        self._streams: dict[str, MetricsStream] = {}
        if not self.enabled:
            return
        if is_http(self.uri):
            for k, v in HTTP_ENV_DEFAULTS.items():
                os.environ.setdefault(k, v)
        try:
            check_tracking_server(self.uri)
        except TrackingError as exc:
            if parent_run_id is None:     # before any work: fail fast
                raise
            self._go_offline(exc, "stage logging")   # mid-pipeline: the outputs matter more than their logs
            return
        mlflow = import_mlflow()
        # also the process default, so later code using the fluent API (model logging) lands here too
        mlflow.set_tracking_uri(self.uri)
        mlflow.set_registry_uri(self.uri)
        db = sqlite_path(self.uri)
        if db is not None:
            from mlm_core.locks import workdir_lock
            with workdir_lock(db.parent, f"{db.name}-create"):   # MLflow's migrations, once
                self._experiment_id = self._guard("open the experiment", self._ensure_experiment)
        else:
            self._experiment_id = self._guard("open the experiment", self._ensure_experiment)

    # -- plumbing
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_c"] = None
        state["_streams"] = {}
        return state

    @property
    def client(self):
        if self._c is None:
            self._c = mlflow_client(self.uri)
        return self._c

    @property
    def experiment_id(self) -> str | None:
        return self._experiment_id

    @property
    def parent_run_id(self) -> str | None:
        return self._parent

    @property
    def active(self) -> bool:
        return self.enabled and not self.offline

    def _go_offline(self, exc: BaseException, what: str) -> None:
        if not self.offline:
            log.warning("MLflow at %s is unreachable (%s): %s skipped; the pipeline goes on and `mlm sync CONFIG` "
                        "replays it later", redact(self.uri), first_line(exc), what)
        self.offline = True
        note_undelivered(self.uri)

    def _guard(self, what: str, fn, *args, run: str | None = None, **kw):
        """Call ``fn``; a server that went away turns this tracker offline instead of failing the pipeline."""
        if not self.active:
            if self.enabled and run:
                note_undelivered(self.uri, run=run)
            return None
        try:
            return fn(*args, **kw)
        except Exception as exc:
            if not unreachable(exc):
                raise
            self._go_offline(exc, what)
            if run:
                note_undelivered(self.uri, run=run)
            return None

    def _ensure_experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        c = self.client
        exp = c.get_experiment_by_name(self.experiment)
        if exp is not None and exp.lifecycle_stage == "deleted":
            c.restore_experiment(exp.experiment_id)
        if exp is not None:
            if EXPERIMENT_KIND_TAG not in (exp.tags or {}):  # training view, not GenAI; a user choice wins
                try:
                    c.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
                except MlflowException as exc:   # e.g. read-only permission on a shared server: only a view
                    log.info("experiment %s: kind tag not set (%s)", self.experiment, first_line(exc))
            return exp.experiment_id
        # an http server decides its own (proxied) artifact store; locally, keep artifacts in the workdir
        location = None if is_http(self.uri) else str(self.workdir / "mlartifacts")
        try:
            return c.create_experiment(self.experiment, artifact_location=location,
                                       tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except MlflowException as exc:  # another process created it in between
            exp = c.get_experiment_by_name(self.experiment)
            if exp is None:
                raise TrackingError(f"tracking.uri {redact(self.uri)}: cannot create experiment "
                                    f"{self.experiment!r} ({redact(exc)})") from exc
            return exp.experiment_id

    def _log_batch(self, run_id: str, params: dict[str, str] | None = None,
                   metrics: dict[str, float] | None = None, tags: dict[str, str] | None = None,
                   step: int = 0) -> None:
        from mlflow.entities import Metric, Param, RunTag

        ts = int(time.time() * 1000)
        for chunk in chunks([Param(k, v) for k, v in (params or {}).items()], MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(run_id, params=chunk)
        for chunk in chunks([RunTag(k, v) for k, v in (tags or {}).items()], MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(run_id, tags=chunk)
        for chunk in chunks([Metric(k, v, ts, int(step)) for k, v in (metrics or {}).items()], MAX_METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=chunk)

    def start_stage(self, stage: str, fingerprint: str, started: float | None = None) -> str | None:
        """Open a stage's run before it computes (so it can stream metrics); finish it with log_stage(run_id=...).
        ``started``: the stage's start (epoch seconds; default now)."""
        if not self.enabled:
            return None
        return self._guard(f"opening the {stage} run", self._create_run, stage_run_name(stage, fingerprint),
                           {"stage": stage, "fingerprint": str(fingerprint), "cache": "miss"},
                           parent=self._parent or _active_run_id(), started=started)

    def stream(self, run_id: str | None, **kw) -> MetricsStream | None:
        """A non-blocking metrics callback for ``run_id``, delivering from a background thread; closed (and
        counted) by ``log_stage``/``fail_stage`` on the same run."""
        if not self.active or run_id is None:
            return None
        s = MetricsStream(lambda recs: self._history(run_id, recs), lambda: server_healthy(self.uri),
                          label=run_id[:8], **kw)
        self._streams[run_id] = s
        return s

    def _close_stream(self, run_id: str | None, timeout: float = 15.0) -> None:
        s = self._streams.pop(run_id, None) if run_id else None
        if s is None:
            return
        left = s.close(timeout)
        if left:
            log.warning("%d metric record(s) of run %s were not delivered to MLflow (they are in metrics.jsonl)",
                        left, run_id)
            note_undelivered(self.uri, records=left)
            if s.down:
                self._go_offline(ConnectionError("server down since the stream lost it"), "closing the run")

    def fail_stage(self, run_id: str | None, status: str = "FAILED", ended: float | None = None) -> None:
        if self.enabled and run_id is not None:
            self._close_stream(run_id)
            self._guard("closing a failed run", self.client.set_terminated, run_id, status=run_status(status),
                        end_time=epoch_ms(ended))
            if not self.active:
                self._journal(kind="stage", run_id=run_id, status=run_status(status),
                              ended=ended if ended is not None else time.time())

    def log_history(self, run_id: str | None, records: list[dict], step_key: str = "step") -> int:
        """Step-indexed metric curves (e.g. a training's metrics.jsonl) on a run; returns the points logged."""
        if not self.enabled or run_id is None:
            return 0
        return self._guard("logging metric history", self._history, run_id, records, step_key) or 0

    def _history(self, run_id: str, records: list[dict], step_key: str = "step") -> int:
        points = history_points(records, step_key, int(time.time() * 1000))
        for chunk in chunks(points, MAX_METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=chunk)
        return len(points)

    def _create_run(self, run_name: str, tags: dict[str, str], parent: str | None,
                    started: float | None = None) -> str:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        # who runs it: `mlm sync` closes runs whose process died (left RUNNING by a crash or kill -9);
        # where it came from: the git commit and the Prefect flow run (id, UI link when a server is known)
        tags = {**run_context_tags(), **tags, "mlm.pid": str(os.getpid()), "mlm.host": socket.gethostname()}
        if parent:
            tags[MLFLOW_PARENT_RUN_ID] = parent
        system = system_tags(tags)
        system.update({k: v for k, v in tags.items() if k.startswith("mlflow.source.git")})  # ours, not argv[0]'s
        run = self.client.create_run(self._experiment_id, run_name=run_name, tags=system, start_time=epoch_ms(started))
        return run.info.run_id

    # -- pipeline (parent) run
    def start_pipeline(self, run_name: str, params: dict, tags: dict | None = None,
                       parent: str | None = None) -> str | None:
        """Start the parent run; stages logged afterwards nest under it. Returns its run id.
        ``parent``: a run this one nests under (a sweep's run, ``tasks.sweep``)."""
        if not self.enabled:
            return None
        if self._parent is not None:
            log.warning("start_pipeline: a parent run (%s) is already set; starting a new one", self._parent)

        def start() -> str:
            run_id = self._create_run(run_name, tag_values(tags), parent=parent)
            self._log_batch(run_id, params=flatten_params(params))
            return run_id

        self._parent = self._guard("starting the pipeline run", start, run="pipeline")
        return self._parent

    def end_pipeline(self, status: str = "FINISHED") -> None:
        """Close the parent run (``"FAILED"`` when the pipeline failed)."""
        if not self.enabled or self._parent is None:
            return None
        self._guard("closing the pipeline run", self.client.set_terminated, self._parent, status=run_status(status),
                    run="pipeline")
        if not self.active:     # the server never heard the end: `mlm sync` records it from the workdir's journal
            self._journal(kind="pipeline", run_id=self._parent, status=run_status(status), ended=time.time())
        self._parent = None
        return None

    def _journal(self, **entry) -> None:
        from tasks.tracking.journal import record
        record(self.workdir, uri=redact(self.uri), experiment=self.experiment, **entry)

    # -- stage (nested) runs
    def log_stage(self, stage: str, *, fingerprint: str, cache_hit: bool, params: dict,
                  metrics: dict[str, float], artifacts: list[Path] | None = None, artifact_dir: str = "",
                  dicts: dict[str, dict] | None = None, tables: dict[str, "pandas.DataFrame"] | None = None,
                  inputs: list[dict] | None = None, tags: dict | None = None,
                  status: str = "FINISHED", run_id: str | None = None, started: float | None = None,
                  ended: float | None = None, step: int = 0) -> str | None:
        """Record one stage as a finished run, nested under the parent when there is one.

        ``artifacts``: files or folders, each logged under ``artifact_dir/<its name>`` (a folder keeps
        its name, like ``cp -r``). ``dicts``: name -> dict (``.json``/``.yaml`` by suffix).
        ``tables``: name -> DataFrame (name must end in ``.json`` or ``.parquet``).
        ``inputs``: lineage records ``{"name", "source", "digest", "context"}``; no data is read.
        If logging fails half-way the run is closed as FAILED and the error propagates; if the server
        is gone, the tracker goes offline and returns None (the stage's output is already stored).
        ``run_id``: finish a run opened by ``start_stage`` (which streamed metrics while the stage ran).
        ``started``/``ended``: the stage's real start and end (epoch seconds), so the run's duration is the
        stage's, not that of this bookkeeping. ``step``: the step of ``metrics`` (a training's last step: its
        final validation figures then end its curves instead of starting them at step 0).
        """
        if not self.enabled:
            return None
        self._close_stream(run_id)
        status = run_status(status)
        done = None
        if not self.active:
            note_undelivered(self.uri, run=stage)
        else:
            done = self._guard(f"logging the {stage} run", self._log_stage, stage, fingerprint, cache_hit, params,
                               metrics, artifacts, artifact_dir, dicts, tables, inputs, tags, status, run_id,
                               started, ended, step, run=stage)
        if done is None:     # not recorded: `mlm sync` finds it by (stage, fingerprint) and run id in the journal
            self._journal(kind="stage", run_id=run_id, stage=stage, fingerprint=str(fingerprint), status=status,
                          cache_hit=bool(cache_hit), started=started, ended=ended if ended is not None else time.time())
        return done

    def _log_stage(self, stage, fingerprint, cache_hit, params, metrics, artifacts, artifact_dir, dicts, tables,
                   inputs, tags, status, run_id, started=None, ended=None, step=0) -> str:
        parent = self._parent or _active_run_id()
        all_tags = {**tag_values(tags), "stage": stage, "fingerprint": str(fingerprint),
                    "cache": "hit" if cache_hit else "miss"}
        if cache_hit:   # a short run is right: the stored output was reused, not recomputed
            all_tags["mlm.duration"] = "cache hit: the run spans the reuse (check, re-validation), not a computation"
        if run_id is None:
            run_id = self._create_run(stage_run_name(stage, fingerprint, cache_hit), all_tags, parent=parent,
                                      started=started)
            tag_now = {}
        else:
            tag_now = all_tags
        try:
            self._log_batch(run_id, params=flatten_params(params), metrics=numeric_metrics(metrics), tags=tag_now,
                            step=step)
            for name, d in (dicts or {}).items():
                self.client.log_dict(run_id, d, name)
            for name, df in (tables or {}).items():
                self.client.log_table(run_id, df, name)
            for p in artifacts or []:
                p = Path(p)
                if p.is_dir():
                    dest = f"{artifact_dir.strip('/')}/{p.name}" if artifact_dir.strip("/") else p.name
                    self.client.log_artifacts(run_id, str(p), artifact_path=dest)
                elif p.is_file():
                    self.client.log_artifact(run_id, str(p), artifact_path=artifact_dir.strip("/") or None)
                else:
                    raise TrackingError(f"log_stage({stage}): artifact {p} does not exist")
            if inputs:
                log_lineage(self.client, run_id, inputs)
        except BaseException as exc:
            if not (isinstance(exc, Exception) and unreachable(exc)):
                self.client.set_terminated(run_id, status="FAILED")
            raise
        self.client.set_terminated(run_id, status=status, end_time=epoch_ms(ended))
        return run_id

    def set_stage_tags(self, run_id: str | None, tags: dict) -> None:
        """Tag a run after the fact (e.g. ``validation=failed``)."""
        if not self.enabled or not run_id or not tags:
            return None
        self._guard("tagging a run", self._log_batch, run_id, tags=tag_values(tags))
        return None

    def log_text(self, run_id: str | None, text: str, artifact_file: str) -> None:
        if not self.enabled or not run_id:
            return None
        self._guard("logging a text artifact", self.client.log_text, run_id, text, artifact_file)
        return None

    def log_validation(self, run_id: str | None, report) -> None:
        """A validation report's Markdown summary and its Great Expectations Data Docs pages (HTML, which
        MLflow's artifact viewer shows) under ``validation/``."""
        if not self.enabled or not run_id or report is None:
            return None
        self.log_text(run_id, report.summary_markdown(), "validation/summary.md")
        for name, html in (getattr(report, "data_docs", None) or {}).items():
            self.log_text(run_id, html, f"validation/data_docs/{name}")
        return None

    def run_url(self, run_id: str | None) -> str | None:
        """The UI link of a run on an http tracking server; None for SQLite (no UI is serving it)."""
        if not self.enabled or not run_id or not is_http(self.uri):
            return None
        return f"{redact(self.uri).rstrip('/')}/#/experiments/{self._experiment_id}/runs/{run_id}{UI_QUERY}"


def _active_run_id() -> str | None:
    """A fluent ``mlflow.start_run`` run active in this thread, if any (used as parent)."""
    run = import_mlflow().active_run()
    return run.info.run_id if run is not None else None

