"""MLflow model registry helpers: register a run's model folder, move aliases, tag versions, list models.

In: a ``Tracker`` or a tracking URI. Out: registered model versions and aliases (re-exported by
``tasks.tracking``); mlflow is imported inside the functions.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.tracking.backend import mlflow_client
from tasks.tracking.values import tag_values

if TYPE_CHECKING:  # pragma: no cover
    from tasks.tracking.tracker import Tracker


def _uri_of(tracker_or_uri: "Tracker | str") -> str:
    return str(getattr(tracker_or_uri, "uri", tracker_or_uri))


def register_version(tracker_or_uri: "Tracker | str", name: str, run_id: str, artifact_path: str,
                     tags: dict | None = None, description: str | None = None) -> int:
    """Register ``runs:/<run_id>/<artifact_path>`` (a folder of safetensors/json run artifacts, never a
    pickle) as a new version of ``name``, creating the registered model if missing. Returns the version."""
    from mlflow.exceptions import MlflowException

    c = mlflow_client(_uri_of(tracker_or_uri))
    try:
        c.create_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    mv = c.create_model_version(name, source=f"runs:/{run_id}/{artifact_path.strip('/')}", run_id=run_id,
                                tags=tag_values(tags) or None, description=description)
    return int(mv.version)


def set_alias(uri: "Tracker | str", name: str, alias: str, version: int) -> None:
    """Point ``name@alias`` at ``version`` (moves the alias if it was elsewhere)."""
    mlflow_client(_uri_of(uri)).set_registered_model_alias(name, alias, str(version))


def get_alias_version(uri: "Tracker | str", name: str, alias: str) -> int | None:
    """The version ``name@alias`` points at; None when the model or the alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        mv = mlflow_client(_uri_of(uri)).get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise
    return int(mv.version)


def tag_version(uri: "Tracker | str", name: str, version: int, tags: dict) -> None:
    c = mlflow_client(_uri_of(uri))
    for k, v in tag_values(tags).items():
        c.set_model_version_tag(name, str(version), k, v)


def list_registered_models(uri: "Tracker | str") -> list[str]:
    c = mlflow_client(_uri_of(uri))
    names: list[str] = []
    token = None
    while True:
        page = c.search_registered_models(max_results=1000, page_token=token)
        names.extend(m.name for m in page)
        token = page.token
        if not token:
            return sorted(names)
