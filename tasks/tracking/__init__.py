"""MLflow tracking: one parent run per pipeline run, one nested run per stage; survives losing the server.

The package, leaves first: ``backend`` (where MLflow lives, health checks, the client), ``values`` (params,
metrics, tags and lineage within MLflow's limits), ``context`` (run names, git/Prefect tags), ``stream`` (live
metrics from a background thread, the delivery report), ``journal`` (what an offline run could not tell),
``tracker`` (the ``Tracker``), ``registry`` (model versions and aliases) and ``sync`` (``mlm sync``, imported
on its own: ``from tasks.tracking.sync import sync``). Importing it imports nothing heavy (mlflow: inside
functions).
"""
from __future__ import annotations

from tasks.tracking.backend import (HTTP_ENV_DEFAULTS, TrackingError, check_tracking_server, import_mlflow,
                                    is_http, mlflow_client, resolve_tracking_uri, server_healthy, sqlite_path)
from tasks.tracking.context import pipeline_run_name, stage_run_name
from tasks.tracking.registry import (get_alias_version, list_registered_models, register_version, set_alias,
                                     tag_version)
from tasks.tracking.stream import MetricsStream, delivery_report, note_undelivered, reset_delivery_report
from tasks.tracking.tracker import Tracker
from tasks.tracking.values import flatten_params, history_points, log_lineage, tag_values

__all__ = ["HTTP_ENV_DEFAULTS", "MetricsStream", "Tracker", "TrackingError", "check_tracking_server",
           "delivery_report", "flatten_params", "get_alias_version", "history_points", "import_mlflow", "is_http",
           "list_registered_models", "log_lineage", "mlflow_client", "note_undelivered", "pipeline_run_name",
           "register_version", "reset_delivery_report", "resolve_tracking_uri", "server_healthy", "set_alias",
           "sqlite_path", "stage_run_name", "tag_values", "tag_version"]
