"""Use the servers of a running ``mlm serve`` for the same workdir: its state file, checked by health.

In: a workdir whose ``serve.json`` (written by ``flows.serve``) names an MLflow and a Prefect server. Out:
``$MLM_TRACKING_URI`` / ``$PREFECT_API_URL`` set for this process when those servers answer, so a CLI run
lands in the store the served UIs show. Stdlib only (``mlm --help`` stays instant).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from flows.procs import http_get

STATE_FILE = "serve.json"            # <workdir>/serve.json: URLs + child pids while `mlm serve` serves


def read_state(workdir: Path) -> dict | None:
    """``<workdir>/serve.json`` as a dict, or None (absent, unreadable, half-written by an older version)."""
    try:
        state = json.loads((Path(workdir) / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def adopt_servers(workdir: Path, tracking_uri_set: bool = False, timeout: float = 1.0) -> list[str]:
    """Point this process at the servers ``mlm serve`` runs for ``workdir``, when they answer.

    MLflow: sets ``$MLM_TRACKING_URI`` unless the config (``tracking_uri_set``) or the environment names a
    tracking URI. Prefect: sets ``$PREFECT_API_URL`` (and ``$PREFECT_HOME`` to the server's) unless
    ``$PREFECT_API_URL`` is set. Each server must answer ``GET /health`` within ``timeout`` seconds; one that
    does not is ignored (a stale file after a crash), and the CLI logs locally as without ``mlm serve``.
    With ``mlm serve --require-auth`` the client needs its credentials (``$MLFLOW_TRACKING_USERNAME``,
    ``$PREFECT_API_AUTH_STRING``); without them that server is skipped. Returns what was adopted, for a note.
    Must run before Prefect is imported (it reads its settings once)."""
    state = read_state(workdir)
    if not state:
        return []
    auth = bool(state.get("auth"))
    used = []
    mlflow_url, api_url = state.get("mlflow_url"), state.get("api_url")
    if (mlflow_url and not tracking_uri_set and not os.environ.get("MLM_TRACKING_URI")
            and (not auth or os.environ.get("MLFLOW_TRACKING_USERNAME"))
            and http_get(f"{mlflow_url}/health", timeout=timeout)[0] == 200):
        os.environ["MLM_TRACKING_URI"] = mlflow_url
        used.append(f"MLflow {mlflow_url}")
    if (api_url and not os.environ.get("PREFECT_API_URL")
            and (not auth or os.environ.get("PREFECT_API_AUTH_STRING"))
            and http_get(f"{api_url}/health", timeout=timeout,
                         auth=os.environ.get("PREFECT_API_AUTH_STRING") if auth else None)[0] == 200):
        os.environ["PREFECT_API_URL"] = api_url
        os.environ.setdefault("PREFECT_HOME", str(Path(workdir) / "prefect"))   # the server's home
        used.append(f"Prefect {api_url[:-len('/api')] if api_url.endswith('/api') else api_url}")
    return used


__all__ = ["read_state", "adopt_servers"]
