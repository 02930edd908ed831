"""Console logging of the ``mlm`` command: WARNING, or INFO with ``MLM_VERBOSE=1``; HTTP clients stay quiet.

``MLM_VERBOSE`` is for our own messages (and tracebacks, see ``flows.guard``). At INFO, the HTTP clients
underneath Prefect and MLflow would log every request (``INFO httpx: HTTP Request: POST .../csrf-token
"HTTP/1.1 422"`` and the like), which buries everything else; they log at WARNING and above only.
Live progress is not a log message: ``mlm_core.progress`` writes it to the console itself.
"""
from __future__ import annotations

import logging
import os

VERBOSE_ENV = "MLM_VERBOSE"
HTTP_LOGGERS = ("httpx", "httpcore", "urllib3", "requests", "hpack", "h2", "websockets",
                "mlflow.utils.rest_utils", "mlflow.store.artifact.http_artifact_repo")


def quiet_http_loggers() -> None:
    """HTTP client loggers at WARNING or above (a stricter level set by someone else is kept)."""
    for name in HTTP_LOGGERS:
        lg = logging.getLogger(name)
        if lg.level < logging.WARNING:          # NOTSET included: it would inherit the verbose root level
            lg.setLevel(logging.WARNING)


def configure() -> None:
    verbose = bool(os.environ.get(VERBOSE_ENV))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    quiet_http_loggers()


__all__ = ["configure", "quiet_http_loggers", "HTTP_LOGGERS"]
