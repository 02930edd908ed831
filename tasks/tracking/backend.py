"""Where MLflow lives, whether it answers, and a client for it: URI resolution, health checks, SQLite paths,
the lazy ``import mlflow`` with quiet defaults.

In: a ``TrackingConfig`` (or a URI). Out: the URI to use, or a ``TrackingError`` naming the problem and
its fix before any work starts; an ``MlflowClient``. Credentials in a URI never appear in a message.
Imports nothing heavy: mlflow (about 2 s) is imported inside ``import_mlflow``.
"""
from __future__ import annotations

import logging
import os
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from mlm_core.errors import MlmError
from mlm_core.redact import redact

if TYPE_CHECKING:  # pragma: no cover
    from mlm_core.config import TrackingConfig


_MLFLOW_ENV_DEFAULTS = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
# For an http(s) server: a dead server costs ~3 s per call instead of ~4.5 min (retries 1 s, 2 s); a hung one
# 3 x 30 s at worst, once (the tracker then goes offline). Only defaults: the user's own values win.
HTTP_ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


class TrackingError(MlmError):
    """The tracking backend is unusable (server down, bad URI); raised before any work starts."""


def import_mlflow():
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


def mlflow_client(uri: str):
    """An ``MlflowClient`` for ``uri`` (tracking and registry)."""
    import_mlflow()
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def resolve_tracking_uri(cfg: "TrackingConfig", workdir: Path) -> str:
    """``cfg.uri`` when given, else ``$MLM_TRACKING_URI`` (`mlm serve` sets it for its worker; not
    MLFLOW_TRACKING_URI, which ``mlflow.set_tracking_uri`` itself exports), else a SQLite file in the workdir."""
    if cfg.uri:
        return cfg.uri
    if os.environ.get("MLM_TRACKING_URI"):
        return os.environ["MLM_TRACKING_URI"]
    return f"sqlite:///{Path(workdir).resolve()}/mlflow.db"


def is_http(uri: str) -> bool:
    return urlparse(uri).scheme in ("http", "https")


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (SQLAlchemy: 3 slashes + relative, 4 + absolute)."""
    rest = uri[len("sqlite://"):].split("?", 1)[0]
    if not rest.startswith("/"):
        return None
    rest = rest[1:]
    if rest in ("", ":memory:"):
        return None
    return Path(rest)


def _health_request(uri: str) -> urllib.request.Request:
    """``GET <uri>/health``; credentials in the URI (``http://user:pass@host``) go in a basic-auth header
    (urllib cannot open such a URL: it takes ``user:pass@host`` for the host name)."""
    import base64
    u = urlparse(uri)
    headers = {}
    if u.username is not None:
        from urllib.parse import unquote
        cred = f"{unquote(u.username)}:{unquote(u.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
        u = u._replace(netloc=u.netloc.rsplit("@", 1)[1])
    return urllib.request.Request(u.geturl().rstrip("/") + "/health", headers=headers)


def server_healthy(uri: str, timeout: float = 2.0) -> bool:
    """True when an http(s) server answers ``GET /health`` with 200 (always True for other stores)."""
    if not is_http(uri):
        return True
    try:
        with urllib.request.urlopen(_health_request(uri), timeout=timeout) as resp:  # noqa: S310
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def check_tracking_server(uri: str, timeout: float = 3.0) -> None:
    """Fail fast, with a fix, when the tracking backend cannot work; call it before any work starts.

    http(s): ``GET <uri>/health`` must answer 200. sqlite: the database's folder must exist or be
    creatable. A file store (``file:`` or a bare path) is refused: MLflow 3 put it in maintenance mode.
    Credentials in the URI never appear in the message.
    """
    shown = redact(uri)
    scheme = urlparse(uri).scheme
    if scheme in ("http", "https"):
        try:
            with urllib.request.urlopen(_health_request(uri), timeout=timeout) as resp:  # noqa: S310 (http(s))
                status, reason = resp.status, f"GET /health -> HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            status, reason = exc.code, f"GET /health -> HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = redact(getattr(exc, "reason", exc))
            raise TrackingError(
                f"tracking.uri {shown}: MLflow tracking server not reachable ({reason}); "
                "start it with `mlm serve` or unset tracking.uri") from None
        if status != 200:
            raise TrackingError(
                f"tracking.uri {shown}: MLflow tracking server not healthy ({reason}); "
                "start it with `mlm serve` or unset tracking.uri")
        return
    if scheme == "sqlite":
        path = sqlite_path(uri)
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise TrackingError(
                    f"tracking.uri {shown}: cannot create the folder for the SQLite database ({exc})") from None
            if not os.access(path.parent, os.W_OK):
                raise TrackingError(f"tracking.uri {shown}: folder {path.parent} is not writable")
        return
    if scheme in ("", "file") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
        raise TrackingError(
            f"tracking.uri {shown}: the file store is in maintenance mode in MLflow 3; use "
            "sqlite:///<absolute path>/mlflow.db or http://host:port (or set MLFLOW_ALLOW_FILE_STORE=true)")
