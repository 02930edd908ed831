"""Inter-process locks on a workdir: one run at a time per stage output, and per shared database.

In: a workdir and a lock name. Out: an exclusive ``fcntl.flock`` on ``<workdir>/.locks/<name>.lock``, held
for the ``with`` block. Why flock: the kernel drops it when the holding process dies (kill -9 included), so
a crashed run never leaves a stale lock to clean up by hand. The lock file names its holder (pid, host,
start time) so the waiting run can say whom it waits for.

Used for: ``stages.execute`` (``stage_lock``: two runs computing the same stage and fingerprint would write
the same folder twice; the second waits, then reuses the output) and the creation of the MLflow and Prefect
SQLite databases in a fresh workdir (``workdir_lock``: two processes running the migrations at once failed
with ``ValueError: No such index``).
Reference: flock(2); the lock is advisory, only our own processes take it. NFS: flock works on NFSv4 only.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)
LOCK_DIR = ".locks"
POLL_S = 0.2


def lock_path(workdir: Path, name: str) -> Path:
    return Path(workdir) / LOCK_DIR / f"{name}.lock"


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8") or "{}")
        return f"pid {info.get('pid')} on {info.get('host')}, since {time.strftime('%H:%M:%S', time.localtime(info['t']))}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another run"


@contextlib.contextmanager
def file_lock(path: Path, what: str, timeout: float | None = None,
              on_wait=None) -> Iterator[bool]:
    """Hold an exclusive flock on ``path``; yields True when another process held it first (we waited).

    ``timeout`` None waits as long as the holder runs (it dies -> the kernel releases the lock);
    otherwise ``TimeoutError`` after ``timeout`` seconds. ``on_wait(holder)`` is called once when waiting starts.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    waited = False
    try:
        t0 = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    waited = True
                    holder = _holder(fd)
                    (on_wait or (lambda h: log.warning("%s: waiting for %s, which holds %s", what, h, path)))(holder)
                if timeout is not None and time.monotonic() - t0 > timeout:
                    raise TimeoutError(f"{what}: still locked by {_holder(fd)} after {timeout:.0f} s ({path})") from None
                time.sleep(POLL_S)
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "t": time.time(), "what": what})
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode("utf-8"), 0)
        if waited:
            log.warning("%s: the other run finished after %.1f s; continuing", what, time.monotonic() - t0)
        yield waited
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def stage_lock(workdir: Path, stage: str, fingerprint: str) -> contextlib.AbstractContextManager[bool]:
    """One process at a time computes ``<stage>/<fingerprint>``; a second one waits (and then reuses it)."""
    return file_lock(lock_path(workdir, f"{stage}-{fingerprint}"), f"{stage} ({fingerprint})",
                     on_wait=lambda h: log.warning("%s (%s): another run is computing this output (%s); waiting "
                                                   "for it, then reusing its result", stage, fingerprint, h))


@contextlib.contextmanager
def tag_stage(stage: str, workdir: Path | None = None) -> Iterator[None]:
    """Attach the stage's name and workdir to any error raised inside (``exc.mlm_stage``, ``exc.mlm_workdir``),
    for the CLI's one-line error (a full disk raised by a library often names no file)."""
    try:
        yield
    except BaseException as exc:
        if getattr(exc, "mlm_stage", None) is None:
            try:
                exc.mlm_stage, exc.mlm_workdir = stage, workdir
            except AttributeError:   # exceptions with __slots__
                pass
        raise


def workdir_lock(workdir: Path, name: str, timeout: float | None = 600.0) -> contextlib.AbstractContextManager[bool]:
    """A short critical section on a shared file of the workdir (database creation, server start)."""
    return file_lock(lock_path(workdir, name), f"{name} in {workdir}", timeout=timeout)


__all__ = ["file_lock", "stage_lock", "workdir_lock", "lock_path", "tag_stage"]
