"""MLflow tracking: one parent run per pipeline run, one nested run per stage, plus registry helpers.

In: a ``TrackingConfig`` and the workdir. Out: MLflow runs (params, metrics, tags, JSON/table
artifacts, files, dataset lineage) and registered model versions with aliases.

This is the only module (with later model-registry code) that imports mlflow, and it does so inside
functions: ``import mlflow`` costs about 2 s, importing this module costs nothing.

Why ``MlflowClient`` with explicit run ids instead of the fluent ``mlflow.start_run`` stack: the
fluent active run is thread-local, and Prefect runs tasks in worker threads (or other processes), so
a stage could never see the flow's parent run. A nested run is simply a run tagged
``mlflow.parentRunId`` (exactly what ``start_run(nested=True)`` writes).

MLflow 3 defaults to ``sqlite:///<CWD>/mlflow.db`` and artifacts under ``./mlruns`` in the CWD; here
both live in the workdir (``<workdir>/mlflow.db``, ``<workdir>/mlartifacts``). An experiment's
artifact location is fixed when it is created, so it is set then.
"""
from __future__ import annotations

import logging
import numbers
import os
import re
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from mlm_core.errors import MlmError

if TYPE_CHECKING:  # pragma: no cover
    import pandas

    from mlm_core.config import TrackingConfig

log = logging.getLogger(__name__)

# MLflow limits (mlflow.utils.validation, 3.17.2)
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_DATASET_DIGEST = 36
MAX_DATASET_NAME = 500
MAX_DATASET_SOURCE = 65535
RUN_STATUSES = ("FINISHED", "FAILED", "KILLED")

_KEY_BAD = re.compile(r"[^\w\-. /:]")  # MLflow keys: alphanumerics, _ - . space / (and : on most stores)

_MLFLOW_ENV_DEFAULTS = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}


class TrackingError(MlmError):
    """The tracking backend is unusable (server down, bad URI); raised before any work starts."""


def _mlflow():
    """Import mlflow lazily, with quiet defaults (the user's own environment wins)."""
    for k, v in _MLFLOW_ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)
    import mlflow

    # MLflow's own deprecation noise, not ours to fix (SQLAlchemy 2.1 `noload`, pandas 3 `select_dtypes`)
    warnings.filterwarnings("ignore", message=r".*``noload`` loader strategy.*")
    warnings.filterwarnings("ignore", message=r".*'str' dtypes are included by select_dtypes.*")
    for name in ("alembic", "mlflow.store.db.utils", "mlflow.tracking.fluent", "mlflow.pytorch"):
        lg = logging.getLogger(name)
        if lg.level < logging.WARNING:
            lg.setLevel(logging.WARNING)
    return mlflow


def _client(uri: str):
    _mlflow()
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


# --------------------------------------------------------------------------------------- URIs
def resolve_tracking_uri(cfg: "TrackingConfig", workdir: Path) -> str:
    """``cfg.uri`` when given, else ``$MLM_TRACKING_URI`` (`mlm serve` sets it for its worker; not
    MLFLOW_TRACKING_URI, which ``mlflow.set_tracking_uri`` itself exports), else a SQLite file in the workdir."""
    if cfg.uri:
        return cfg.uri
    if os.environ.get("MLM_TRACKING_URI"):
        return os.environ["MLM_TRACKING_URI"]
    return f"sqlite:///{Path(workdir).resolve()}/mlflow.db"


def _is_http(uri: str) -> bool:
    return urlparse(uri).scheme in ("http", "https")


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (SQLAlchemy: 3 slashes + relative, 4 + absolute)."""
    rest = uri[len("sqlite://"):].split("?", 1)[0]
    if not rest.startswith("/"):
        return None
    rest = rest[1:]
    if rest in ("", ":memory:"):
        return None
    return Path(rest)


def check_tracking_server(uri: str, timeout: float = 3.0) -> None:
    """Fail fast, with a fix, when the tracking backend cannot work; call it before any work starts.

    http(s): ``GET <uri>/health`` must answer 200. sqlite: the database's folder must exist or be
    creatable. A file store (``file:`` or a bare path) is refused: MLflow 3 put it in maintenance mode.
    """
    scheme = urlparse(uri).scheme
    if scheme in ("http", "https"):
        url = uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (http(s) only)
                status, reason = resp.status, f"GET /health -> HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            status, reason = exc.code, f"GET /health -> HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TrackingError(
                f"tracking.uri {uri}: MLflow tracking server not reachable ({reason}); "
                "start it with `mlm serve` or unset tracking.uri") from None
        if status != 200:
            raise TrackingError(
                f"tracking.uri {uri}: MLflow tracking server not healthy ({reason}); "
                "start it with `mlm serve` or unset tracking.uri")
        return
    if scheme == "sqlite":
        path = _sqlite_path(uri)
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise TrackingError(
                    f"tracking.uri {uri}: cannot create the folder for the SQLite database ({exc})") from None
            if not os.access(path.parent, os.W_OK):
                raise TrackingError(f"tracking.uri {uri}: folder {path.parent} is not writable")
        return
    if scheme in ("", "file") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
        raise TrackingError(
            f"tracking.uri {uri}: the file store is in maintenance mode in MLflow 3; use "
            "sqlite:///<absolute path>/mlflow.db or http://host:port (or set MLFLOW_ALLOW_FILE_STORE=true)")


# --------------------------------------------------------------------------------------- values
def flatten_params(params: dict, prefix: str = "") -> dict[str, str]:
    """Nested config dict -> ``{"normalize.min_chars": "5"}``; values stringified and cut to MLflow's limit."""
    out: dict[str, str] = {}
    for k, v in (params or {}).items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten_params(v, key))
        else:
            out[_key(key)] = _cut(v if isinstance(v, str) else str(v), MAX_PARAM_VALUE)
    return out


def _key(key: str) -> str:
    return _KEY_BAD.sub("_", key)[:MAX_KEY]


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def _numeric_metrics(metrics: dict) -> dict[str, float]:
    out = {}
    for k, v in (metrics or {}).items():
        if isinstance(v, numbers.Real):  # bool, int, float, numpy scalars; NaN kept
            out[_key(str(k))] = float(v)
    return out


def _tag_values(tags: dict | None) -> dict[str, str]:
    return {_key(str(k)): _cut(str(v), MAX_TAG_VALUE) for k, v in (tags or {}).items()}


def _chunks(items: list, n: int):
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _dataset_input(spec: dict):
    """A lineage record that never loads the data: ``MetaDataset`` over a path/URI + a digest."""
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.data.sources import LocalArtifactDatasetSource
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    source = _cut(str(spec["source"]), MAX_DATASET_SOURCE)
    scheme = urlparse(source).scheme
    src = None
    if len(scheme) > 1 and scheme != "file":  # s3://, https://... (one letter = a Windows drive)
        try:
            from mlflow.data.dataset_source_registry import resolve_dataset_source

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                src = resolve_dataset_source(source)
        except Exception:  # unknown scheme (e.g. "datasets:"): keep it as an opaque URI
            src = None
    if src is None:
        # explicit class: from a bare string MLflow warns "can be interpreted in multiple ways" (mlflow#9702)
        src = LocalArtifactDatasetSource(source)
    digest = str(spec.get("digest") or "")
    name = _cut(str(spec.get("name") or Path(source).name or "dataset"), MAX_DATASET_NAME)
    ds = MetaDataset(source=src, name=name, digest=digest[:MAX_DATASET_DIGEST] or None)
    tags = [InputTag(key=MLFLOW_DATASET_CONTEXT, value=str(spec.get("context") or "input"))]
    if len(digest) > MAX_DATASET_DIGEST:  # MLflow caps digests at 36 chars; keep the whole one as a tag
        tags.append(InputTag(key="digest", value=digest))
    return DatasetInput(dataset=ds._to_mlflow_entity(), tags=tags)


def _system_tags(tags: dict[str, str]) -> dict[str, str]:
    """Add what ``mlflow.start_run`` would (user, source name/type, git commit) to the given tags."""
    try:
        from mlflow.tracking.context.registry import resolve_tags

        return resolve_tags(tags)
    except Exception:  # internal API; tags are a nicety
        return tags


# --------------------------------------------------------------------------------------- tracker
class Tracker:
    """One parent run per pipeline run, one nested run per stage.

    Holds only plain values (URI, experiment id, parent run id), so it pickles into Prefect tasks;
    the MLflow client is rebuilt lazily. ``parent_run_id`` attaches to a parent started elsewhere
    (the flow starts it, each stage task builds its own ``Tracker``).
    Disabled (``cfg.enabled`` False): every method is a no-op returning None, and mlflow is never imported.
    """

    def __init__(self, cfg: "TrackingConfig", workdir: Path, parent_run_id: str | None = None):
        self.enabled = bool(cfg.enabled)
        self.workdir = Path(workdir).resolve()
        self.uri = resolve_tracking_uri(cfg, self.workdir)
        self.experiment = cfg.experiment
        self._parent: str | None = parent_run_id if self.enabled else None
        self._experiment_id: str | None = None
        self._c = None
        if not self.enabled:
            return
        check_tracking_server(self.uri)
        mlflow = _mlflow()
        # also the process default, so later code using the fluent API (model logging) lands here too
        mlflow.set_tracking_uri(self.uri)
        mlflow.set_registry_uri(self.uri)
        self._experiment_id = self._ensure_experiment()

    # -- plumbing
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_c"] = None
        return state

    @property
    def client(self):
        if self._c is None:
            self._c = _client(self.uri)
        return self._c

    @property
    def experiment_id(self) -> str | None:
        return self._experiment_id

    @property
    def parent_run_id(self) -> str | None:
        return self._parent

    def _ensure_experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        c = self.client
        exp = c.get_experiment_by_name(self.experiment)
        if exp is not None and exp.lifecycle_stage == "deleted":
            c.restore_experiment(exp.experiment_id)
        if exp is not None:
            return exp.experiment_id
        # an http server decides its own (proxied) artifact store; locally, keep artifacts in the workdir
        location = None if _is_http(self.uri) else str(self.workdir / "mlartifacts")
        try:
            return c.create_experiment(self.experiment, artifact_location=location)
        except MlflowException as exc:  # another process created it in between
            exp = c.get_experiment_by_name(self.experiment)
            if exp is None:
                raise TrackingError(f"tracking.uri {self.uri}: cannot create experiment "
                                    f"{self.experiment!r} ({exc})") from exc
            return exp.experiment_id

    def _log_batch(self, run_id: str, params: dict[str, str] | None = None,
                   metrics: dict[str, float] | None = None, tags: dict[str, str] | None = None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        ts = int(time.time() * 1000)
        for chunk in _chunks([Param(k, v) for k, v in (params or {}).items()], MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(run_id, params=chunk)
        for chunk in _chunks([RunTag(k, v) for k, v in (tags or {}).items()], MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(run_id, tags=chunk)
        for chunk in _chunks([Metric(k, v, ts, 0) for k, v in (metrics or {}).items()], MAX_METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=chunk)

    def start_stage(self, stage: str, fingerprint: str) -> str | None:
        """Open a stage's run before it computes (so it can stream metrics); finish it with log_stage(run_id=...)."""
        if not self.enabled:
            return None
        return self._create_run(stage, {"stage": stage, "fingerprint": str(fingerprint), "cache": "miss"},
                                parent=self._parent or _active_run_id())

    def fail_stage(self, run_id: str | None) -> None:
        if self.enabled and run_id is not None:
            self.client.set_terminated(run_id, status="FAILED")

    def log_history(self, run_id: str | None, records: list[dict], step_key: str = "step") -> int:
        """Step-indexed metric curves (e.g. a training's metrics.jsonl) on a run; returns the points logged."""
        if not self.enabled or run_id is None:
            return 0
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        points = [Metric(_key(f"train.{k}" if r.get("type", "train") == "train" else k), float(v), ts, int(r[step_key]))
                  for r in records if step_key in r
                  for k, v in r.items() if k not in (step_key, "type") and isinstance(v, numbers.Real)
                  and not isinstance(v, bool)]
        for chunk in _chunks(points, MAX_METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=chunk)
        return len(points)

    def _create_run(self, run_name: str, tags: dict[str, str], parent: str | None) -> str:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        tags = dict(tags)
        if parent:
            tags[MLFLOW_PARENT_RUN_ID] = parent
        run = self.client.create_run(self._experiment_id, run_name=run_name, tags=_system_tags(tags))
        return run.info.run_id

    # -- pipeline (parent) run
    def start_pipeline(self, run_name: str, params: dict, tags: dict | None = None) -> str | None:
        """Start the parent run; stages logged afterwards nest under it. Returns its run id."""
        if not self.enabled:
            return None
        if self._parent is not None:
            log.warning("start_pipeline: a parent run (%s) is already set; starting a new one", self._parent)
        run_id = self._create_run(run_name, _tag_values(tags), parent=None)
        self._log_batch(run_id, params=flatten_params(params))
        self._parent = run_id
        return run_id

    def end_pipeline(self, status: str = "FINISHED") -> None:
        """Close the parent run (``"FAILED"`` when the pipeline failed)."""
        if not self.enabled or self._parent is None:
            return None
        self.client.set_terminated(self._parent, status=_status(status))
        self._parent = None
        return None

    # -- stage (nested) runs
    def log_stage(self, stage: str, *, fingerprint: str, cache_hit: bool, params: dict,
                  metrics: dict[str, float], artifacts: list[Path] | None = None, artifact_dir: str = "",
                  dicts: dict[str, dict] | None = None, tables: dict[str, "pandas.DataFrame"] | None = None,
                  inputs: list[dict] | None = None, tags: dict | None = None,
                  status: str = "FINISHED", run_id: str | None = None) -> str | None:
        """Record one stage as a finished run, nested under the parent when there is one.

        ``artifacts``: files or folders, each logged under ``artifact_dir/<its name>`` (a folder keeps
        its name, like ``cp -r``). ``dicts``: name -> dict (``.json``/``.yaml`` by suffix).
        ``tables``: name -> DataFrame (name must end in ``.json`` or ``.parquet``).
        ``inputs``: lineage records ``{"name", "source", "digest", "context"}``; no data is read.
        If logging fails half-way the run is closed as FAILED and the error propagates.
        ``run_id``: finish a run opened by ``start_stage`` (which streamed metrics while the stage ran).
        """
        if not self.enabled:
            return None
        status = _status(status)
        parent = self._parent or _active_run_id()
        all_tags = {**_tag_values(tags), "stage": stage, "fingerprint": str(fingerprint),
                    "cache": "hit" if cache_hit else "miss"}
        if run_id is None:
            run_id = self._create_run(stage, all_tags, parent=parent)
            tag_now = {}
        else:
            tag_now = all_tags
        try:
            self._log_batch(run_id, params=flatten_params(params), metrics=_numeric_metrics(metrics), tags=tag_now)
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
                self.client.log_inputs(run_id, datasets=[_dataset_input(s) for s in inputs])
        except BaseException:
            self.client.set_terminated(run_id, status="FAILED")
            raise
        self.client.set_terminated(run_id, status=status)
        return run_id

    def set_stage_tags(self, run_id: str | None, tags: dict) -> None:
        """Tag a run after the fact (e.g. ``validation=failed``)."""
        if not self.enabled or not run_id or not tags:
            return None
        self._log_batch(run_id, tags=_tag_values(tags))
        return None

    def log_text(self, run_id: str | None, text: str, artifact_file: str) -> None:
        if not self.enabled or not run_id:
            return None
        self.client.log_text(run_id, text, artifact_file)
        return None

    def run_url(self, run_id: str | None) -> str | None:
        """The UI link of a run on an http tracking server; None for SQLite (no UI is serving it)."""
        if not self.enabled or not run_id or not _is_http(self.uri):
            return None
        return f"{self.uri.rstrip('/')}/#/experiments/{self._experiment_id}/runs/{run_id}"


def _status(status: str) -> str:
    s = str(status).upper()
    if s not in RUN_STATUSES:
        raise ValueError(f"run status must be one of {RUN_STATUSES}, got {status!r}")
    return s


def _active_run_id() -> str | None:
    """A fluent ``mlflow.start_run`` run active in this thread, if any (used as parent)."""
    run = _mlflow().active_run()
    return run.info.run_id if run is not None else None


# --------------------------------------------------------------------------------------- registry
def _uri_of(tracker_or_uri: "Tracker | str") -> str:
    return tracker_or_uri.uri if isinstance(tracker_or_uri, Tracker) else str(tracker_or_uri)


def register_version(tracker_or_uri: "Tracker | str", name: str, run_id: str, artifact_path: str,
                     tags: dict | None = None, description: str | None = None) -> int:
    """Register ``runs:/<run_id>/<artifact_path>`` (a folder of safetensors/json run artifacts, never a
    pickle) as a new version of ``name``, creating the registered model if missing. Returns the version."""
    from mlflow.exceptions import MlflowException

    c = _client(_uri_of(tracker_or_uri))
    try:
        c.create_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    mv = c.create_model_version(name, source=f"runs:/{run_id}/{artifact_path.strip('/')}", run_id=run_id,
                                tags=_tag_values(tags) or None, description=description)
    return int(mv.version)


def set_alias(uri: "Tracker | str", name: str, alias: str, version: int) -> None:
    """Point ``name@alias`` at ``version`` (moves the alias if it was elsewhere)."""
    _client(_uri_of(uri)).set_registered_model_alias(name, alias, str(version))


def get_alias_version(uri: "Tracker | str", name: str, alias: str) -> int | None:
    """The version ``name@alias`` points at; None when the model or the alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        mv = _client(_uri_of(uri)).get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise
    return int(mv.version)


def tag_version(uri: "Tracker | str", name: str, version: int, tags: dict) -> None:
    c = _client(_uri_of(uri))
    for k, v in _tag_values(tags).items():
        c.set_model_version_tag(name, str(version), k, v)


def list_registered_models(uri: "Tracker | str") -> list[str]:
    c = _client(_uri_of(uri))
    names: list[str] = []
    token = None
    while True:
        page = c.search_registered_models(max_results=1000, page_token=token)
        names.extend(m.name for m in page)
        token = page.token
        if not token:
            return sorted(names)
