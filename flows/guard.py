"""What stands between a fault and the user: one-line errors, signals, a workdir check, the tracker's warning.

In: the CLI's exceptions, signals and workdir. Out:
- ``error_line(exc)``: one ``error: stage <s>: <cause> (<file>)`` line for any exception (ours, OSError,
  safetensors, Prefect's wrappers), credentials redacted; the traceback only with ``MLM_VERBOSE=1``;
- ``quiet_expected_tracebacks()``: Prefect logs every failed task with its traceback (~90 lines for a
  quarantine-rate error); for our expected error types and full/read-only disks the console gets the one
  message line (the Prefect API and UI keep the traceback);
- ``check_workdir(path)``: writable, with some free space, before Prefect starts (else Prefect fills the
  screen with ~900 lines of SQLite tracebacks);
- ``tracking_warning(config, overrides)``: the closing warning when the MLflow server was lost during the run
  (exit status ``EXIT_NOT_RECORDED``, 4: work complete, not recorded; flows/outage.py for a lost Prefect API).
Imports nothing heavy (``mlm --help`` stays instant).
"""
from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

from mlm_core.errors import MlmError
from mlm_core.redact import redact

VERBOSE_ENV = "MLM_VERBOSE"
MIN_FREE_ENV = "MLM_MIN_FREE_MB"
MIN_FREE_MB = 100          # below this a run cannot even write Prefect's database and a checkpoint
DISK_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EROFS: "read-only file system",
               errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
               errno.EDQUOT: "disk quota exceeded", errno.EFBIG: "file too large (size limit)"}


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").lower() not in ("", "0", "false", "no")


# ------------------------------------------------------------------------------------------ causes
def _chain(exc: BaseException):
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def disk_error(exc: BaseException) -> tuple[str, str | None] | None:
    """(cause, file) when ``exc`` (or its cause) is a full / read-only / forbidden disk, else None."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
            return DISK_ERRNOS[e.errno] + f" (errno {e.errno})", e.filename
        text = str(e)
        m = re.search(r"os error (\d+)", text)               # safetensors and other Rust code
        if m and int(m.group(1)) in DISK_ERRNOS:
            return DISK_ERRNOS[int(m.group(1))] + f" (errno {m.group(1)})", None
        if "No space left on device" in text or "database or disk is full" in text:   # SQLite
            return "no space left on the device (errno 28)", None
        if "readonly database" in text or "Read-only file system" in text:
            return "read-only file system (errno 30)", None
    return None


def expected(exc: BaseException) -> bool:
    """Errors the user fixes (bad data, config, disk): no traceback unless MLM_VERBOSE is set."""
    return isinstance(exc, MlmError) or disk_error(exc) is not None or _outage(exc)


def _outage(exc: BaseException) -> bool:
    """A Prefect API that answered 5xx or not at all (tasks/orchestrator.py): rerun once it is back."""
    if "tasks.orchestrator" not in sys.modules and "prefect" not in sys.modules:
        return False
    from tasks.orchestrator import api_failure
    return api_failure(exc) is not None


def _stage_of(exc: BaseException) -> tuple[str | None, Path | None]:
    for e in _chain(exc):
        if getattr(e, "mlm_stage", None):
            return e.mlm_stage, getattr(e, "mlm_workdir", None)
    return None, None


def error_line(exc: BaseException) -> str:
    """One line (plus the exception's notes) naming the stage, the file and the cause; secrets redacted."""
    stage, workdir = _stage_of(exc)
    disk = disk_error(exc)
    if isinstance(exc, MlmError):
        msg = str(exc)
    elif disk is not None:
        cause, fname = disk
        where = fname or (f"under {workdir}" if workdir else "the workdir")
        msg = f"cannot write {where}: {cause} ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        msg += "; free some space or choose another workdir" if "space" in cause or "quota" in cause else ""
    else:
        fname = getattr(exc, "filename", None)
        msg = f"{type(exc).__name__}: {exc}" + (f" ({fname})" if fname and str(fname) not in str(exc) else "")
    first, *rest = (msg.strip() or type(exc).__name__).splitlines()
    if stage and not first.startswith(f"{stage}:") and f"stage {stage!r}" not in first:
        first = f"stage {stage}: {first}"
    lines = [f"error: {first}"] + [f"  {ln}" for ln in rest[:20]]
    lines += [f"  {note}" for note in getattr(exc, "__notes__", [])]
    if not verbose():
        lines.append(f"  (set {VERBOSE_ENV}=1 for the traceback)" if not expected(exc) else "")
    return redact("\n".join(ln for ln in lines if ln))


def report(exc: BaseException, stream=None) -> None:
    stream = stream or sys.stderr
    if verbose():
        traceback.print_exception(exc, file=stream)
    print(error_line(exc), file=stream)


def exit_code(exc: BaseException) -> int:
    """128+N for a signal, ``EXIT_NOT_RECORDED`` (4) for an outage after complete work (flows/outage.py), 2 for an
    error the user fixes or waits out (an outage before the work was complete), 1 for a bug."""
    code = getattr(exc, "exit_code", None)    # signals.Interrupted: 128 + signal number; outage.NotRecorded: 4 or 2
    return int(code) if code else 2 if expected(exc) else 1


def fast_exit(code: int) -> None:
    """Exit now: atexit handlers (Prefect stops its temporary server) and stream flushes run, but not the
    interpreter's final garbage collection of torch/Prefect/MLflow objects, which took 10-20 s after a
    pipeline run on a loaded 2-core machine: too long for a scheduler's SIGTERM grace period."""
    import atexit
    logging.shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


# ------------------------------------------------------------------------------------------ Prefect's console
class _ShortExpected(logging.Filter):
    """Drop the traceback of an expected error from a console log record (the API handler ran before)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and not verbose() and record.name.startswith("prefect") and _outage(exc):
            return False     # the Prefect API itself failed: the run's closing line says it (flows/outage.py)
        if exc is not None and expected(exc) and not verbose():
            record.exc_info, record.exc_text = None, None
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 (a bad format string: leave the record to the handler)
            return True
        redacted = redact(text)
        if redacted != text:
            record.msg, record.args = redacted, None
        return True


def quiet_expected_tracebacks() -> None:
    """Add the filter to the console handlers Prefect configured (root and ``prefect`` loggers)."""
    for lg in (logging.getLogger(), logging.getLogger("prefect")):
        for h in lg.handlers:
            if not any(isinstance(f, _ShortExpected) for f in h.filters):
                h.addFilter(_ShortExpected())


# ------------------------------------------------------------------------------------------ workdir
def check_workdir(workdir: Path) -> None:
    """The workdir exists or can be made, is writable, and has ``$MLM_MIN_FREE_MB`` (100) MB free."""
    workdir = Path(workdir)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=workdir, prefix=".write-test-") as f:
            f.write(b"x" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        cause = DISK_ERRNOS.get(exc.errno, exc.strerror or str(exc))
        raise MlmError(f"workdir {workdir} is not writable: {cause} (errno {exc.errno}); "
                       "choose another workdir (config `workdir:` or --set workdir=PATH)") from None
    need = float(os.environ.get(MIN_FREE_ENV, MIN_FREE_MB))
    free = shutil.disk_usage(workdir).free / 2**20
    if free < need:
        raise MlmError(f"workdir {workdir}: only {free:.0f} MB free on its file system, {need:.0f} MB needed "
                       f"to start ({MIN_FREE_ENV} sets the minimum); free some space or choose another workdir")


# ------------------------------------------------------------------------------------------ tracking
# `mlm run` (and any command that tracks): every stage the command asked for has a complete stored output, but the
# orchestrator (Prefect API) or the tracker (MLflow) could not record it. README "Exit statuses of `mlm run`".
EXIT_NOT_RECORDED = 4


def tracking_warning(config: str, overrides=()) -> str | None:
    """The closing warning when some metrics or stage runs never reached MLflow (None when all did); its
    ``mlm sync`` command carries the run's config path and ``--set`` overrides, shell-quoted."""
    if "tasks.tracking" not in sys.modules:
        return None
    from tasks.tracking import delivery_report
    rep = delivery_report()
    if not rep["uri"]:
        return None
    from mlm_core.commands import mlm_command
    runs = sorted(set(rep["runs"]))
    return redact(f"warning: the MLflow server {rep['uri']} was unreachable during this run: {rep['records']} metric "
            f"record(s) and {len(rep['runs'])} run update(s) ({', '.join(runs) or '-'}) were not delivered. "
            f"The outputs and metrics.jsonl are complete; when the server is back run "
            f"`{mlm_command('sync', config, list(overrides))}` (exit status {EXIT_NOT_RECORDED}: work complete, "
            f"not recorded).")


def prefect_log_warning() -> str | None:
    """The count of the run's log-line batches the Prefect API did not take (None when all reached it)."""
    if "tasks.orchestrator" not in sys.modules:
        return None
    from tasks.orchestrator import report as prefect_report
    rep = prefect_report()
    if not rep["log_batches"]:
        return None
    return redact(f"warning: {rep['log_batches']} batch(es) of this run's log lines did not reach the Prefect API "
                  f"{rep['api']} ({rep['first']}); the outputs are complete, the Prefect UI misses those lines.")


__all__ = ["error_line", "report", "exit_code", "expected", "disk_error", "quiet_expected_tracebacks",
           "check_workdir", "tracking_warning", "prefect_log_warning", "verbose", "EXIT_NOT_RECORDED"]
