"""Values for MLflow: config dicts -> params, manifests -> metrics, tags, lineage records; MLflow's limits.

In: plain Python values. Out: what ``MlflowClient.log_batch`` / ``log_inputs`` accept (``log_lineage`` sends the
lineage records, retrying MLflow's dataset-insert race), cut to MLflow's
limits, with secrets redacted (a tracking URI with credentials or a secret ``--set`` override would
otherwise be stored as a param in clear). Apart from the tracker (which changes when the tracking protocol
does; this changes when MLflow's limits or our value formats do).
"""
from __future__ import annotations

import numbers
import re
import warnings
from pathlib import Path
from urllib.parse import urlparse

from mlm_core.redact import redact, redact_obj

# MLflow limits (mlflow.utils.validation, 3.17.2)
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_DATASET_DIGEST = 36
MAX_DATASET_NAME = 500
MAX_DATASET_SOURCE = 65535

_KEY_BAD = re.compile(r"[^\w\-. /:]")  # MLflow keys: alphanumerics, _ - . space / (and : on most stores)


def flatten_params(params: dict, prefix: str = "") -> dict[str, str]:
    """Nested config dict -> ``{"normalize.min_chars": "5"}``; values stringified, redacted, cut to MLflow's limit."""
    out: dict[str, str] = {}
    for k, v in (params or {}).items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten_params(v, key))
        else:
            out[_key(key)] = _cut(redact(redact_obj({k: v})[k]), MAX_PARAM_VALUE)
    return out


def _key(key: str) -> str:
    return _KEY_BAD.sub("_", key)[:MAX_KEY]


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def numeric_metrics(metrics: dict) -> dict[str, float]:
    out = {}
    for k, v in (metrics or {}).items():
        if isinstance(v, numbers.Real):  # bool, int, float, numpy scalars; NaN kept
            out[_key(str(k))] = float(v)
    return out


def tag_values(tags: dict | None) -> dict[str, str]:
    return {_key(str(k)): _cut(redact(v), MAX_TAG_VALUE) for k, v in (tags or {}).items()}


def chunks(items: list, n: int):
    for i in range(0, len(items), n):
        yield items[i:i + n]


def log_inputs_racing(client, run_id: str, datasets: list, attempts: int = 4) -> None:
    """``client.log_inputs`` that survives another process registering the same dataset at the same moment.

    MLflow's SQL store looks a dataset up by (experiment, name, digest) and inserts it when absent, in one
    transaction; two runs of a sweep logging the same shards at once can both miss it, and the second insert
    fails on the UNIQUE constraint (``sqlite3.IntegrityError`` ... ``datasets.experiment_id, datasets.name,
    datasets.digest``; seen failing a sweep child run in CI). The failed transaction is rolled back whole, and
    on a retry the lookup finds the row the other process wrote."""
    import time as _time

    from mlflow.exceptions import MlflowException
    for attempt in range(attempts):
        try:
            client.log_inputs(run_id, datasets=datasets)
            return
        except MlflowException as exc:
            if attempt + 1 >= attempts or "UNIQUE constraint failed" not in str(exc):
                raise
            _time.sleep(0.1 * (attempt + 1))


def log_lineage(client, run_id: str, specs: list[dict]) -> None:
    """The run's lineage records (``dataset_input`` each), logged with ``log_inputs_racing``."""
    log_inputs_racing(client, run_id, [dataset_input(s) for s in specs])


def dataset_input(spec: dict):
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


def system_tags(tags: dict[str, str]) -> dict[str, str]:
    """Add what ``mlflow.start_run`` would (user, source name/type, git commit) to the given tags."""
    try:
        from mlflow.tracking.context.registry import resolve_tags

        return resolve_tags(tags)
    except Exception:  # internal API; tags are a nicety
        return tags




def history_points(records: list[dict], step_key: str = "step", ts: int = 0, stage: str = "pretrain") -> list:
    """Step-indexed ``Metric`` points of metrics.jsonl records, named by ``tasks.metric_names`` (a training
    record's ``loss`` -> ``train/loss``, an eval record's ``en.val_acc`` -> ``val/en/acc``).

    A record's own ``_ts`` (ms, stamped when it was queued) wins over ``ts``: a batch sent again after a
    lost response is then identical, and MLflow drops exact duplicates (key, value, timestamp, step)."""
    from mlflow.entities import Metric

    from tasks.metric_names import mlflow_name
    return [Metric(_key(mlflow_name(stage, k, str(r.get("type", "train")))), float(v), int(r.get("_ts", ts)),
                   int(r[step_key]))
            for r in records if step_key in r
            for k, v in r.items() if k not in (step_key, "type") and not k.startswith("_")
            and isinstance(v, numbers.Real) and not isinstance(v, bool)]


RUN_STATUSES = ("FINISHED", "FAILED", "KILLED")


def epoch_ms(t: float | None) -> int | None:
    """Epoch seconds -> MLflow's epoch milliseconds (None: MLflow uses now)."""
    return None if t is None else int(round(t * 1000))


def run_status(status: str) -> str:
    s = str(status).upper()
    if s not in RUN_STATUSES:
        raise ValueError(f"run status must be one of {RUN_STATUSES}, got {status!r}")
    if s == "FAILED" and _stopped_by_signal():
        return "KILLED"     # SIGTERM/SIGINT: the run was stopped (and checkpointed), not broken
    return s


def _stopped_by_signal() -> bool:
    import sys
    exc = sys.exc_info()[1]
    return exc is not None and (isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "Interrupted")
