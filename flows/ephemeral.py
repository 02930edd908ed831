"""Prefect's temporary ("ephemeral") API server for ``mlm run``: started early, under a lock, and never orphaned.

Without a ``PREFECT_API_URL``, Prefect 3 starts ``python -m uvicorn ... prefect.server.api.server:create_app``
as a plain child process on the first API call (``SubprocessASGIServer``, a per-port singleton) and stops it
from an ``atexit`` hook. Three problems on real runs, fixed here:

- **Orphans.** After ``kill -9`` of ``mlm`` no atexit runs and the server kept running (reparented to init).
  The server now runs under a watchdog: a few lines of Python around ``uvicorn``'s main that poll
  ``os.getppid()`` and SIGTERM the server when its parent is gone (polling the parent id, not
  ``PR_SET_PDEATHSIG``, because that signal fires when the *thread* that forked exits, and Prefect may
  start the server from a worker thread). It also runs in its own session, so a Ctrl-C in the terminal
  reaches only ``mlm``, which then checkpoints and reports to a server that is still up.
- **Start-up under load.** Prefect waits 20 s by default for the server (``PREFECT_SERVER_EPHEMERAL_STARTUP_
  TIMEOUT_SECONDS``, setting ``server.ephemeral.startup_timeout_seconds`` in Prefect 3.9); a first start runs
  the database migrations, 13-22 s on an idle 2-core machine. ``startup_timeout``: 120 s unless the user set one.
- **Two runs on one fresh workdir.** Both ran the SQLite migrations of ``<workdir>/prefect/prefect.db`` at
  once. ``start()`` holds a lock in ``$PREFECT_HOME`` until the server answers its health check.

Reference: prefect/server/api/server.py (``SubprocessASGIServer.start``/``_run_uvicorn_command``), 3.9.1.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

STARTUP_TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
DEFAULT_STARTUP_TIMEOUT_S = "120"
PREFECT_DEFAULT_STARTUP_TIMEOUT_S = 20     # Prefect 3.9's own default (settings/models/server/ephemeral.py)
POLL_S = 0.5

# Runs as ``python -c WATCHDOG <parent pid> <uvicorn args...>``: a daemon thread watches the parent, the
# main thread is uvicorn's own command line.
WATCHDOG = """
import os, signal, sys, threading, time, runpy
parent = int(sys.argv.pop(1))
def watch():
    while os.getppid() == parent:
        time.sleep(%(poll)s)
    os.kill(os.getpid(), signal.SIGTERM)   # uvicorn shuts down cleanly (SQLite closed)
    time.sleep(10)
    os._exit(1)
threading.Thread(target=watch, daemon=True, name="mlm-parent-watchdog").start()
sys.argv[0] = "uvicorn"
runpy.run_module("uvicorn", run_name="__main__", alter_sys=True)
""" % {"poll": POLL_S}


class _GuardedSubprocess:
    """Stands in for the ``subprocess`` module inside ``prefect.server.api.server`` only: its ``Popen``
    wraps the uvicorn command in the watchdog and a new session; everything else is the real module."""

    def __getattr__(self, name):
        return getattr(subprocess, name)

    @staticmethod
    def Popen(args, *a, **kw):  # noqa: N802 (the name Prefect calls)
        args = list(args)
        if args[1:3] == ["-m", "uvicorn"]:
            args = [args[0], "-c", WATCHDOG, str(os.getpid()), *args[3:]]
            kw.setdefault("start_new_session", True)
        return subprocess.Popen(args, *a, **kw)


def install_guard() -> None:
    """Route Prefect's ephemeral server start through the watchdog (idempotent)."""
    import prefect.server.api.server as srv
    if not isinstance(srv.subprocess, _GuardedSubprocess):
        srv.subprocess = _GuardedSubprocess()


def startup_timeout() -> int:
    """Seconds to wait for the temporary server: the user's choice (the environment variable, or a Prefect
    profile setting other than Prefect's default), else ours. Prefect reads its settings once, at import,
    so the value is passed to ``start`` explicitly."""
    if os.environ.get(STARTUP_TIMEOUT_ENV, "").strip():
        return int(float(os.environ[STARTUP_TIMEOUT_ENV]))
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS
    configured = int(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    return configured if configured != PREFECT_DEFAULT_STARTUP_TIMEOUT_S else int(DEFAULT_STARTUP_TIMEOUT_S)


def start(workdir: Path) -> str | None:
    """Start the ephemeral server now (when no ``PREFECT_API_URL`` is set), so its start-up failures are
    reported before any stage runs; Prefect's flows then reuse it. Returns its API URL, or None."""
    if os.environ.get("PREFECT_API_URL"):
        return None
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED
    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return None
    timeout = startup_timeout()
    install_guard()
    from prefect.server.api.server import SubprocessASGIServer

    from mlm_core.errors import MlmError
    from mlm_core.locks import file_lock
    server = SubprocessASGIServer()
    # the first start runs the migrations of $PREFECT_HOME/prefect.db (mlm run puts it in the workdir)
    home = Path(os.environ.get("PREFECT_HOME") or Path(workdir) / "prefect").expanduser()
    with file_lock(home / ".locks" / "prefect-db.lock", f"Prefect database in {home}", timeout=600):
        try:
            server.start(timeout=timeout)
        except RuntimeError as exc:
            first = str(exc).splitlines()[0][:300]
            raise MlmError(f"the temporary Prefect server did not start ({first}); on a loaded machine raise "
                           f"{STARTUP_TIMEOUT_ENV} (now {timeout} s), or run "
                           "`mlm serve` and export PREFECT_API_URL") from exc
    return server.api_url


__all__ = ["install_guard", "start", "startup_timeout", "STARTUP_TIMEOUT_ENV"]
