"""Send the engine's live progress lines (``mlm_core.progress``) and its warnings (``mlm_core.*`` at WARNING and
above: the pretrain plateau detector, a model that does not export...) to the Prefect run log while a stage runs.

The ``mlm_core.progress`` logger does not propagate (its reporter writes the console line itself), so
Prefect's console handlers never print a line twice; this adds Prefect's API log handler to it, and a
WARNING-level one to the ``mlm_core`` logger (the engine logs with the standard library only), for the
duration of one stage task. The run ids are stamped on every record when the handler is attached, so a
line logged from a helper thread (no Prefect context there) still lands in this task run's log.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator

from mlm_core.progress import LOGGER_NAME

ENGINE_LOGGER = "mlm_core"


class _StampRun(logging.Filter):
    def __init__(self, flow_run_id, task_run_id):
        super().__init__()
        self.flow_run_id, self.task_run_id = flow_run_id, task_run_id

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "flow_run_id", None):
            record.flow_run_id, record.task_run_id = self.flow_run_id, self.task_run_id
        return True


@contextlib.contextmanager
def to_run_log() -> Iterator[logging.Handler | None]:
    """Inside a Prefect flow/task run: progress lines also go to its run log (yields the handler, else None)."""
    try:
        from prefect.context import get_run_context
        from prefect.logging.handlers import APILogHandler
        ctx = get_run_context()
    except Exception:  # noqa: BLE001 - not in a Prefect run (stage called directly): console only
        yield None
        return
    task_run = getattr(ctx, "task_run", None)
    flow_run = getattr(ctx, "flow_run", None)
    flow_run_id = flow_run.id if flow_run is not None else getattr(task_run, "flow_run_id", None)
    stamp = _StampRun(flow_run_id, getattr(task_run, "id", None))
    handler, warnings = APILogHandler(), APILogHandler()
    handler.addFilter(stamp)
    warnings.addFilter(stamp)
    warnings.setLevel(logging.WARNING)
    lg, engine = logging.getLogger(LOGGER_NAME), logging.getLogger(ENGINE_LOGGER)
    lg.addHandler(handler)
    engine.addHandler(warnings)     # mlm_core.progress does not propagate: no line arrives twice
    try:
        yield handler
    finally:
        lg.removeHandler(handler)
        engine.removeHandler(warnings)


__all__ = ["to_run_log"]
