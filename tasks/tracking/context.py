"""What every MLflow run says about where it came from: git commit, Prefect flow run, a readable name.

In: the process (the project's git checkout or installed package, the Prefect run context if any).
Out: run tags (``mlflow.source.git.commit``, ``prefect.flow_run_id``, ``prefect.flow_run_url``), the
experiment tag that makes MLflow's UI treat the experiment as model training, and parent-run names
such as ``lr=0.001 · only pretrain · demo · 12-01 16:40`` and stage-run names such as
``pretrain 5e90beae``. Imports nothing heavy; Prefect is consulted only when it is
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

REPO_ROOT = Path(__file__).resolve().parents[2]
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


MAX_OVERRIDES_LABEL = 40
MAX_OVERRIDE_VALUE = 16


def overrides_label(overrides: list[str] | None) -> str:
    """``--set pretrain.lr=0.001 --set seed=2`` -> ``lr=0.001 seed=2``: each override as its last key part and
    its value (cut to 16 chars), redacted first (a secret never reaches a run name), at most 40 chars."""
    from mlm_core.redact import redact
    parts = []
    for o in overrides or []:
        key, sep, value = redact(str(o)).partition("=")
        value = value if len(value) <= MAX_OVERRIDE_VALUE else value[:MAX_OVERRIDE_VALUE - 1] + "…"
        parts.append(f"{key.strip().rsplit('.', 1)[-1]}{sep}{value.strip()}")
    text = " ".join(parts)
    return text if len(text) <= MAX_OVERRIDES_LABEL else text[:MAX_OVERRIDES_LABEL - 1] + "…"


def pipeline_run_name(config_name: str, only: str | None = None, from_stage: str | None = None,
                      when: float | None = None, overrides: list[str] | None = None) -> str:
    """``lr=0.001 · only pretrain · demo · 12-01 16:40``: what tells runs apart first (MLflow's runs table
    shows only the first ~30 characters): the ``--set`` overrides (short: a value sits within ~25 characters)
    and the selection (all / only X / from X), then the config name and the local start time."""
    stamp = time.strftime("%m-%d %H:%M", time.localtime(time.time() if when is None else when))
    head = [overrides_label(overrides), selection_label(only, from_stage)]
    return " · ".join([p for p in head if p] + [config_name, stamp])


def stage_run_name(stage: str, fingerprint: str, cache_hit: bool = False) -> str:
    """``pretrain 5e90beae`` (``… cached`` for a reused output): the stage, then its output's fingerprint, so
    two runs of a stage that computed different outputs differ at a glance."""
    return f"{stage} {str(fingerprint)[:8]}" + (" cached" if cache_hit else "")


__all__ = ["git_commit", "prefect_tags", "run_context_tags", "pipeline_run_name", "selection_label",
           "overrides_label", "stage_run_name",
           "EXPERIMENT_KIND_TAG", "EXPERIMENT_KIND", "GIT_COMMIT_TAG", "FLOW_RUN_ID_TAG", "FLOW_RUN_URL_TAG",
           "UI_QUERY"]
