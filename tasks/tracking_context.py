"""What every MLflow run says about where it came from: git commit, Prefect flow run, a readable name.

In: the process (the project's git checkout or installed package, the Prefect run context if any).
Out: run tags (``mlflow.source.git.commit``, ``prefect.flow_run_id``, ``prefect.flow_run_url``), the
experiment tag that makes MLflow's UI treat the experiment as model training, and parent-run names
such as ``demo · all · 12-01 16:40``. Imports nothing heavy; Prefect is consulted only when it is
already imported (a run inside a flow), never imported here.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
GIT_COMMIT_TAG = "mlflow.source.git.commit"
FLOW_RUN_ID_TAG = "prefect.flow_run_id"
FLOW_RUN_URL_TAG = "prefect.flow_run_url"
# MLflow 3 experiment tag: "custom_model_development" is what the UI's kind selector writes for
# "Machine learning" (server/js: setExperimentTag key "mlflow.experimentKind"); "genai_development" is GenAI.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# MLflow 3.17's UI picks the view from a global "workflowType" (URL parameter, else the browser's last choice,
# default "genai"), so links to our runs carry it too.
UI_QUERY = "?workflowType=machine_learning"


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the code that runs: ``git rev-parse HEAD`` in the project checkout (5 s at most), else
    the commit pip recorded when the package was installed from git (``direct_url.json``), else None."""
    if (REPO_ROOT / ".git").exists():
        try:
            r = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                               timeout=5, stdin=subprocess.DEVNULL)
            sha = r.stdout.strip()
            if r.returncode == 0 and len(sha) == 40:
                return sha
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        from importlib.metadata import PackageNotFoundError, distribution
        text = distribution("mlm-pipeline").read_text("direct_url.json")
        sha = ((json.loads(text) if text else {}).get("vcs_info") or {}).get("commit_id")
        return str(sha) if sha else None
    except (PackageNotFoundError, ValueError, OSError):
        return None


def prefect_tags() -> dict[str, str]:
    """The Prefect flow run this code runs in (id; UI link when a Prefect server URL is known), else {}.

    A stage task gets its flow run's id. The UI link is only given for a configured ``PREFECT_API_URL``
    (``mlm serve`` or a user's server): the temporary server of a plain ``mlm run`` dies with the run."""
    if "prefect" not in sys.modules:
        return {}
    try:
        from prefect.runtime import flow_run
        run_id = flow_run.get_id()
        if not run_id:
            return {}
        tags = {FLOW_RUN_ID_TAG: str(run_id)}
        from prefect.settings import PREFECT_API_URL
        if os.environ.get("PREFECT_API_URL") or PREFECT_API_URL.value():
            from prefect.utilities.urls import url_for   # the UI's route (/runs/flow-run/<id>); the runtime's
            url = url_for("flow-run", obj_id=run_id)        # get_flow_run_ui_url() says /flow-runs/flow-run/<id>
            if url:
                tags[FLOW_RUN_URL_TAG] = str(url)
        return tags
    except Exception:  # noqa: BLE001 (outside a run, or an API hiccup: a link is a nicety)
        return {}


def run_context_tags() -> dict[str, str]:
    tags = prefect_tags()
    sha = git_commit()
    if sha:
        tags[GIT_COMMIT_TAG] = sha
    return tags


def selection_label(only: str | None = None, from_stage: str | None = None) -> str:
    return f"only {only}" if only else f"from {from_stage}" if from_stage else "all"


def pipeline_run_name(config_name: str, only: str | None = None, from_stage: str | None = None,
                      when: float | None = None) -> str:
    """``demo · all · 12-01 16:40``: config name, selection (all / only X / from X), local start time."""
    stamp = time.strftime("%m-%d %H:%M", time.localtime(time.time() if when is None else when))
    return f"{config_name} · {selection_label(only, from_stage)} · {stamp}"


__all__ = ["git_commit", "prefect_tags", "run_context_tags", "pipeline_run_name", "selection_label",
           "EXPERIMENT_KIND_TAG", "EXPERIMENT_KIND", "GIT_COMMIT_TAG", "FLOW_RUN_ID_TAG", "FLOW_RUN_URL_TAG",
           "UI_QUERY"]
