"""``mlm run`` after an orchestrator (Prefect API) or database outage: work complete or not, said in one line.

In: the exception that ended the run, the loaded config, the stages the command asked for, and whether they
were forced. Out: ``NotRecorded`` (an ``MlmError``: one ``error:`` line, no traceback), exit status
``guard.EXIT_NOT_RECORDED`` (4) when every asked stage has a complete stored output (the plan, read again
after the failure) and 2 when not; None when the exception is not an outage (it is reported as before).

The line names the API that failed (credentials redacted), that its database may be down when the answer
was a 5xx from a server ``mlm serve --db`` started for this workdir (its ``serve.json``), an MLflow server
lost too (``tasks.tracking.stream.delivery_report``), and the exact commands for once it is back: ``mlm sync``
with the run's config and ``--set`` overrides (MLflow), then the ``mlm run`` that records the run in Prefect
(every finished stage is reused). Observed before: the run exited 1 on a raw ``PrefectHTTPStatusError 500``.
"""
from __future__ import annotations

import urllib.parse
from pathlib import Path

from mlm_core.commands import mlm_command, run_command
from mlm_core.errors import MlmError
from mlm_core.redact import redact


class NotRecorded(MlmError):
    """The run ended on an orchestrator outage; ``exit_code`` 4 (work complete) or 2 (rerun once it is back)."""

    def __init__(self, message: str, exit_code: int, complete: bool):
        super().__init__(message)
        self.exit_code = exit_code
        self.complete = complete


def served_database(workdir: Path, api: str) -> str | None:
    """``postgresql://user@host:port`` when ``api`` is the Prefect API of an ``mlm serve --db`` for ``workdir``."""
    from flows.serve.state import read_state
    state = read_state(workdir) or {}
    store = str(state.get("mlflow_store") or "")
    if not store.startswith("postgres") or (state.get("api_url") or "").rstrip("/") != api.rstrip("/"):
        return None
    u = urllib.parse.urlsplit(store)
    return redact(f"postgresql://{u.netloc}")


def snapshot(lc, names: list[str]) -> dict[str, int | None]:
    """The identity (inode) of each stage's stored output now: a forced stage is redone only if it changes."""
    from mlm_core.stages import plan
    plans = plan(lc)
    out = {}
    for name in names:
        try:
            out[name] = plans[name].path.stat().st_ino if plans[name].status == "done" else None
        except OSError:
            out[name] = None
    return out


def complete_stages(lc, chosen: list[str], before: dict[str, int | None] | None = None) -> tuple[list[str], list[str]]:
    """(complete, not complete) among ``chosen``, from the plan read now; a stage in ``before`` (forced) counts
    as complete only when its stored output is a new one."""
    from mlm_core.stages import plan
    plans = plan(lc)
    done, left = [], []
    for name in chosen:
        ok = plans[name].status == "done"
        if ok and before and name in before and before[name] is not None:
            try:
                ok = plans[name].path.stat().st_ino != before[name]
            except OSError:
                ok = False
        (done if ok else left).append(name)
    return done, left


def closing_line(failure: dict, lc, chosen: list[str], done: list[str], left: list[str], only: str | None,
                 asked: list[str], tracker: dict | None, log_batches: int = 0) -> tuple[str, int]:
    """(the one line, exit status) for an outage ``failure`` (``tasks.orchestrator.api_failure``)."""
    from flows.guard import EXIT_NOT_RECORDED
    api = failure["api"]
    what = f"the Prefect API {api} {failure['reason']}"
    db = served_database(lc.workdir, api) if (failure.get("status") or 0) >= 500 else None
    if db:
        what += f" (a server of `mlm serve --db`: its database ({db}) may be down)"
    if tracker and tracker.get("uri"):
        what += (f"; the MLflow server {tracker['uri']} was unreachable too ({tracker['records']} metric record(s), "
                 f"runs {', '.join(sorted(set(tracker['runs']))) or '-'} not delivered)")
    if log_batches:
        what += f"; {log_batches} batch(es) of log lines did not reach Prefect"
    if not left:
        rerun = run_command(lc, *(["--only", only] if only else []))
        sync = mlm_command("sync", lc.path, lc.overrides)
        line = (f"work complete, not recorded: {what}. Every stage asked for is complete in {lc.workdir} "
                f"({', '.join(done)}). Once it is back, run `{sync}` (MLflow) and `{rerun}` (Prefect; every "
                f"finished stage is reused) to record the run.")
        return redact(line), EXIT_NOT_RECORDED
    rerun = run_command(lc, *asked)
    reused = "" if "--force" in asked or "--from" in asked else " (finished stages are reused)"
    line = (f"not finished: {what}. Not complete: {', '.join(left)}" + (f" (complete: {', '.join(done)})" if done
                                                                        else "")
            + f". Once it is back, rerun `{rerun}`{reused}.")
    return redact(line), 2


FRAMEWORK_MODULES = ("prefect", "httpx", "httpcore", "anyio", "asyncio", "concurrent", "websockets")


def underlying(exc: BaseException) -> BaseException | None:
    """The run's own error behind an API failure: a stage raised, then the flow engine's report of that failure
    to the API failed too (the API error's context chain holds the stage's error). None when there is none."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        mod = type(e).__module__ or ""
        if e is not exc and not mod.startswith(FRAMEWORK_MODULES) and not isinstance(e, (ConnectionError,
                                                                                        TimeoutError)):
            return e
        e = e.__cause__ or e.__context__
    return None


def classify(exc: BaseException, lc, chosen: list[str], only: str | None, asked: list[str],
             before: dict[str, int | None] | None = None) -> NotRecorded | None:
    """``NotRecorded`` for an orchestrator outage (exit 4 when the asked work is complete, else 2); else None
    (not an outage, or the work is incomplete because a stage itself failed: that error is the one to report)."""
    from tasks import orchestrator
    failure = orchestrator.api_failure(exc)
    if failure is None:
        return None
    tracker = None
    import sys
    if "tasks.tracking.stream" in sys.modules:
        from tasks.tracking.stream import delivery_report
        tracker = delivery_report()
    done, left = complete_stages(lc, chosen, before)
    own = underlying(exc) if left else None
    if own is not None:
        own.add_note(redact(f"(the Prefect API {failure['api']} {failure['reason']} as well: the run is not "
                            "recorded in Prefect)"))
        return None
    line, code = closing_line(failure, lc, chosen, done, left, only, asked, tracker,
                              orchestrator.report()["log_batches"])
    return NotRecorded(line, code, complete=not left)


__all__ = ["NotRecorded", "classify", "underlying", "closing_line", "complete_stages", "served_database", "snapshot"]
