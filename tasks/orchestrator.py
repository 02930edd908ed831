"""The orchestrator (the Prefect API) failing under a run: recognized, kept out of the stage work, counted.

In: exceptions from Prefect's client (``PrefectHTTPStatusError`` 5xx, httpx connection errors and timeouts)
and the calls that only *record* a stage in Prefect (artifacts). Out:
- ``api_failure(exc)``: ``{"api", "url", "status", "reason"}`` when ``exc`` (or its cause chain) is a failed call
  to a Prefect API, else None;
- ``best_effort(call, what)``: a recording call whose API failure is counted, not raised, so a database outage
  under ``mlm serve --db`` no longer fails a stage whose output is complete (it did: the pretrain task failed
  on ``create_markdown_artifact`` -> 500 after training had finished);
- ``quiet_api_log_errors()``: Prefect's API log handler wrote ``--- Error logging to API ---`` and the error
  for every failed batch of log lines (every ~2 s through a whole training run); now one line at the first
  failure, and the count in ``report()`` for the run's closing line;
- ``report()`` / ``reset()``: what this process could not record in Prefect.

Why here (``tasks/``): the stage task uses ``best_effort``; the CLI (``flows/outage.py``) reads the report.
Stdlib only at import; Prefect is imported by ``quiet_api_log_errors`` only.
"""
from __future__ import annotations

import logging
import re
import sys
import threading
from typing import Any, Callable

from mlm_core.redact import redact

log = logging.getLogger(__name__)

# httpx's transport errors (connection refused, reset, timeouts): the server did not answer
TRANSPORT_ERRORS = ("ConnectError", "ConnectTimeout", "ReadTimeout", "WriteTimeout", "PoolTimeout", "ReadError",
                    "WriteError", "RemoteProtocolError", "NetworkError", "TimeoutException")

_lock = threading.Lock()
_REPORT: dict = {"api": None, "records": [], "log_batches": 0, "first": None}


def _chain(exc: BaseException):
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def api_base(url: str) -> str:
    """``http://host:port/api`` from a request URL under it (the URL itself when it has no ``/api`` part)."""
    m = re.match(r"^(\w+://[^/]+(?:/[^?#]*?)?/api)(?:/|$)", url)
    return m.group(1) if m else url


def api_failure(exc: BaseException) -> dict | None:
    """``{"api": base URL, "url": request URL, "status": int | None, "reason": str}`` when ``exc`` or its cause
    chain is a Prefect API call that failed with a 5xx or no answer; None otherwise (a 4xx is a bug or a bad
    request, not an outage)."""
    for e in _chain(exc):
        mod = type(e).__module__ or ""
        if not (mod.startswith("httpx") or mod.startswith("prefect")):
            continue
        try:
            request = e.request                 # httpx raises RuntimeError when an error has no request
        except (RuntimeError, AttributeError):
            continue
        if request is None:
            continue
        url = str(request.url)
        response = getattr(e, "response", None)
        if response is not None and hasattr(response, "status_code"):
            status = int(response.status_code)
            if status < 500:
                return None
            return {"api": redact(api_base(url)), "url": redact(url), "status": status,
                    "reason": f"answered {status} {getattr(response, 'reason_phrase', '') or ''}".strip()}
        if type(e).__name__ in TRANSPORT_ERRORS:
            first = (str(e).splitlines() or [""])[0][:120]
            return {"api": redact(api_base(url)), "url": redact(url), "status": None,
                    "reason": f"did not answer ({type(e).__name__}{': ' + first if first else ''})"}
    return None


def _note(failure: dict, what: str | None = None, log_batch: bool = False) -> bool:
    """Record a failure; True when it is the first of this process."""
    with _lock:
        first = _REPORT["first"] is None
        _REPORT["api"] = failure["api"]
        if first:
            _REPORT["first"] = failure["reason"]
        if what:
            _REPORT["records"].append(what)
        if log_batch:
            _REPORT["log_batches"] += 1
        return first


def best_effort(call: Callable[[], Any], what: str) -> Any:
    """``call()``; when it fails because the Prefect API is down (``api_failure``), the failure is counted (and
    logged once as a warning) and None returned: recording a finished stage never fails the stage."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - anything but an API outage is raised again
        failure = api_failure(exc)
        if failure is None:
            raise
        if _note(failure, what):
            log.warning("the Prefect API %s %s: %s not recorded in Prefect (the stage output is complete; "
                        "further failures are counted)", failure["api"], failure["reason"], what)
        return None


def report() -> dict:
    """``{"api", "records", "log_batches", "first"}``: what this process could not record in Prefect."""
    with _lock:
        return {"api": _REPORT["api"], "records": list(_REPORT["records"]),
                "log_batches": _REPORT["log_batches"], "first": _REPORT["first"]}


def reset() -> None:
    with _lock:
        _REPORT.update(api=None, records=[], log_batches=0, first=None)


def quiet_api_log_errors() -> None:
    """Prefect's ``APILogWorker`` (a batch of run log lines per ~2 s) wrote two lines to stderr per failed batch
    for as long as the API was down. Route its failures here: one line at the first failure, then a count
    (idempotent). Prefect 3.9: the worker's ``_handle_batch`` POSTs the batch to ``/logs/`` and writes
    ``--- Error logging to API ---`` on any exception; the wrapper below does the same request."""
    from prefect.logging.handlers import APILogWorker
    if getattr(APILogWorker._handle_batch, "_mlm_quiet", False):
        return

    async def _handle_batch(self, items: list[bytes]) -> None:
        try:
            await self._client.request("POST", "/logs/", content=b"[" + b",".join(items) + b"]",
                                       headers={"Content-Type": "application/json"})
        except Exception as exc:  # noqa: BLE001 - like Prefect's own handler: a lost log line never fails the run
            failure = api_failure(exc) or {"api": redact(str(getattr(self._client, "base_url", "?"))),
                                           "reason": f"failed ({type(exc).__name__}: {str(exc)[:120]})"}
            if _note(failure, log_batch=True):
                print(redact(f"mlm: the Prefect API {failure['api']} {failure['reason']}: the run's log lines are "
                             "not reaching Prefect (the run goes on; further failures are counted)"),
                      file=sys.stderr, flush=True)

    _handle_batch._mlm_quiet = True      # type: ignore[attr-defined]
    APILogWorker._handle_batch = _handle_batch


__all__ = ["api_failure", "api_base", "best_effort", "report", "reset", "quiet_api_log_errors"]
