"""Training metrics to MLflow from a background thread: the training loop never waits on the tracker.

In: metric records (dicts, as written to ``metrics.jsonl``), handed over with ``stream(rec)`` (a non-blocking
put into a bounded queue). Out: step-indexed metrics on an MLflow run. ``metrics.jsonl`` stays the source of
truth: what this thread could not deliver is counted, replayed when the server answers again, and what is
left at the end is replayed by ``mlm sync CONFIG``.

Why: with the MLflow server gone, each ``log_batch`` blocked the training loop in MLflow's HTTP retries
(7 retries, backoff factor 2: ~4.5 min), then raised into the loop and aborted training. Here a failed
delivery only marks the tracker down; the thread probes it every ``probe_every`` seconds and, once it
answers, sends the pending records first (in order). The buffer is bounded (``maxsize`` queued +
``maxsize`` pending records); beyond that records are dropped from memory (never from metrics.jsonl).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable

from mlm_core.redact import redact

log = logging.getLogger(__name__)
MAX_BATCH_RECORDS = 100


def unreachable(exc: BaseException) -> bool:
    """Whether an exception (or its cause chain) says the tracking server could not be reached."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (ConnectionError, TimeoutError)):
            return True
        if type(e).__name__ in ("ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout", "MaxRetryError",
                                "NewConnectionError", "ProtocolError", "RemoteDisconnected", "ChunkedEncodingError"):
            return True
        msg = str(e)
        if any(s in msg for s in ("Max retries exceeded", "Connection refused", "Read timed out",
                                  "Connection aborted", "RemoteDisconnected", "too many 50")):
            return True
        e = e.__cause__ or e.__context__
    return False


# What could not be delivered in this process (the CLI prints it at the end of `mlm run`).
_report_lock = threading.Lock()
_REPORT: dict = {"uri": None, "records": 0, "runs": []}


def delivery_report() -> dict:
    """``{"uri", "records", "runs"}``: metric records and stage runs this process could not deliver."""
    with _report_lock:
        return {"uri": _REPORT["uri"], "records": _REPORT["records"], "runs": list(_REPORT["runs"])}


def reset_delivery_report() -> None:
    with _report_lock:
        _REPORT.update(uri=None, records=0, runs=[])


def note_undelivered(uri: str, records: int = 0, run: str | None = None) -> None:
    with _report_lock:
        _REPORT["uri"] = redact(uri)
        _REPORT["records"] += int(records)
        if run:
            _REPORT["runs"].append(run)


class MetricsStream:
    """``stream(rec)`` queues a record; a daemon thread delivers them with ``deliver(records)``."""

    def __init__(self, deliver: Callable[[list[dict]], None], probe: Callable[[], bool], *, label: str = "",
                 maxsize: int = 10_000, probe_every: float = 5.0):
        self._deliver, self._probe = deliver, probe
        self.label, self.maxsize, self.probe_every = label, maxsize, probe_every
        self._q: queue.Queue = queue.Queue(maxsize)
        self._pending: list[dict] = []
        self._lock = threading.Lock()
        self.delivered = self.dropped = self.rejected = 0
        self.down = False
        self.down_since: float | None = None
        self._next_probe = 0.0
        self._closing = threading.Event()
        self._t = threading.Thread(target=self._run, name=f"mlflow-metrics-{label}", daemon=True)
        self._t.start()

    def __call__(self, rec: dict) -> None:
        try:
            self._q.put_nowait({**rec, "_ts": int(time.time() * 1000)})   # resends stay identical (deduplicated)
        except queue.Full:
            with self._lock:
                self.dropped += 1

    @property
    def undelivered(self) -> int:
        return self._q.qsize() + len(self._pending) + self.dropped + self.rejected

    def _fill(self) -> bool:
        """Move queued records to the pending list (bounded); False when there is nothing to send."""
        if not self._pending:
            try:
                self._pending.append(self._q.get(timeout=0.2))
            except queue.Empty:
                return False
        while len(self._pending) < self.maxsize:
            try:
                self._pending.append(self._q.get_nowait())
            except queue.Empty:
                break
        return True

    def _run(self) -> None:
        while True:
            closing = self._closing.is_set()
            if not self._fill():
                if closing:
                    return
                continue
            if self.down:
                if time.monotonic() < self._next_probe:
                    if closing:
                        return
                    self._closing.wait(0.2)
                    continue
                if not self._safe_probe():
                    self._next_probe = time.monotonic() + self.probe_every
                    if closing:
                        return
                    continue
            batch = self._pending[:MAX_BATCH_RECORDS]
            try:
                self._deliver(batch)
            except Exception as exc:  # noqa: BLE001 (never let a tracker failure reach training)
                if unreachable(exc):
                    if not self.down:
                        self.down, self.down_since = True, time.monotonic()
                        log.warning("MLflow unreachable (%s): training continues; metrics stay in metrics.jsonl "
                                    "and are sent when it is back", first_line(exc))
                    self._next_probe = time.monotonic() + self.probe_every
                    if closing:
                        return
                    continue
                log.warning("MLflow refused %d metric records (%s); they stay in metrics.jsonl",
                            len(batch), first_line(exc))
                self.rejected += len(batch)
                del self._pending[:len(batch)]
                continue
            if self.down:
                log.warning("MLflow is back after %.0f s: sending %d pending metric records",
                            time.monotonic() - (self.down_since or time.monotonic()), len(self._pending))
                self.down = False
            del self._pending[:len(batch)]
            self.delivered += len(batch)

    def _safe_probe(self) -> bool:
        try:
            return bool(self._probe())
        except Exception:  # noqa: BLE001
            return False

    def close(self, timeout: float = 15.0) -> int:
        """Flush what can be flushed within ``timeout`` s (one immediate retry if the server was down);
        returns the number of records not delivered."""
        self._next_probe = 0.0
        self._closing.set()
        self._t.join(timeout)
        return self.undelivered


def first_line(exc: BaseException) -> str:
    from mlm_core.redact import redact
    text = str(exc).strip().splitlines()
    return redact(text[0][:200] if text else type(exc).__name__)


__all__ = ["MetricsStream", "unreachable", "delivery_report", "reset_delivery_report"]
