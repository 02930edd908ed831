"""How a pipeline run learns that a sweep started it: the sweep's MLflow run to nest under, and its tags.

In: set by the sweep (``tasks.sweep``) around each run: in this process through a context variable (runs one
after another, inside the ``mlm-sweep`` flow), in a child ``mlm run`` process through the ``MLM_SWEEP_LINK``
environment variable (JSON). Out: ``{"parent_run_id", "tags", "run_name"}`` or ``{}`` (a plain ``mlm run``).
``flows.pipeline.run_pipeline`` reads it when it starts the pipeline's MLflow run. Stdlib only.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import os
from typing import Iterator

LINK_ENV = "MLM_SWEEP_LINK"
_LINK: contextvars.ContextVar[dict | None] = contextvars.ContextVar("mlm_sweep_link", default=None)


def current() -> dict:
    got = _LINK.get()
    if got is not None:
        return got
    raw = os.environ.get(LINK_ENV)
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}


@contextlib.contextmanager
def linked(link: dict) -> Iterator[None]:
    token = _LINK.set(link)
    try:
        yield
    finally:
        _LINK.reset(token)


def env_for(link: dict) -> dict[str, str]:
    return {LINK_ENV: json.dumps(link)}
