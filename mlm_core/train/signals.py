"""Graceful stop on SIGTERM / SIGINT: checkpoint at the next step boundary, then exit non-zero.

Preemptible schedulers (Slurm, Kubernetes, spot instances) send SIGTERM and kill a grace period later
(Kubernetes: 30 s by default). So: the CLI / the torchrun worker ``install()`` a handler that only sets a flag;
the training loop asks ``should_stop()`` at every step boundary, saves a checkpoint and raises
``Interrupted``. Bound: the user waits at most one optimizer step + one checkpoint write (+ one evaluation
pass when the step was an eval step). A rerun resumes from that checkpoint.

Outside training (``graceful()`` not active) the first signal acts at once: SIGINT raises
``KeyboardInterrupt`` as usual and SIGTERM raises ``Interrupted``, so normalize or the tokenizer stop
immediately (their outputs are atomic: nothing half-written becomes complete). A second signal during
training also acts at once, for an operator who does not want to wait for the checkpoint.

Never inside an import: a signal that arrives while the main thread is importing a module (Prefect's
plugins, torch) is not acted on there, because an exception raised from inside an import leaves a half-
initialised module behind and may be swallowed by the importer (Prefect logged "Failed to initialize plugins:
stopped by SIGTERM" and carried on). A helper thread re-delivers the signal once the import has returned.

Orphaned sweep runs: an ``mlm sweep`` child gets ``$MLM_PARENT_PID``; when SIGTERM comes because that parent
died (``PR_SET_PDEATHSIG``, e.g. the sweep was killed with kill -9), the sweep's temporary Prefect server died
with it, and reporting the stop to it would only wait out the client's retries. A thread started by ``install``
watches that parent; once it is gone the run exits (128 + signal) as soon as its checkpoint is written (at once
outside training), after a short grace, whichever handler (ours, or Prefect's inside a flow) took the signal.

Distributed: every rank gets the signal (torchrun forwards it), but maybe not before the same step, so
``should_stop`` takes the max of the flag over ranks (one tiny all-reduce per step) and all ranks stop at
the same step boundary.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Iterator

from mlm_core.errors import MlmError

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT)

_flag = threading.Event()
_state = {"signum": 0, "at": 0.0, "graceful": 0, "installed": False, "deferred": 0, "orphan_exit": False}
PARENT_ENV = "MLM_PARENT_PID"   # set by `mlm sweep` for its child runs (tasks.sweep.child_env)
ORPHAN_GRACE_S = 2.0            # an orphaned run's logs flush in this time after its checkpoint
IMPORT_POLL_S = 0.02
ORPHAN_POLL_S = 0.25


class Interrupted(MlmError):
    """The run was stopped by a signal; training saved a checkpoint first. ``exit_code`` = 128 + signal."""

    def __init__(self, msg: str, signum: int = signal.SIGTERM):
        super().__init__(msg)
        self.signum = int(signum)
        self.exit_code = 128 + int(signum)


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def in_import(frame) -> bool:
    """Whether ``frame`` (or a caller of it) is executing an import statement."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _redeliver_after_import(signum: int) -> None:
    """Thread body: wait until the main thread has left every import, then send it ``signum`` again."""
    main = threading.main_thread()
    while True:
        frame = sys._current_frames().get(main.ident)
        if frame is None:                      # the main thread has ended
            return
        if not in_import(frame):
            break
        time.sleep(IMPORT_POLL_S)
    _state["deferred"] = 0
    signal.pthread_kill(main.ident, signum)


def _watch_parent(parent: int) -> None:
    """Thread body for a sweep's child run: once the parent is gone (it was killed; ``PR_SET_PDEATHSIG``
    has sent SIGTERM, handled by whichever handler is active, ours or Prefect's), wait until no training is in
    its graceful window (its checkpoint is written), give the logs a moment, then leave without reporting to
    the orchestrator that died with the parent."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL_S)
    log.warning("the parent sweep is gone (and its Prefect server with it): exiting once the checkpoint is "
                "written; rerun the sweep to resume")
    time.sleep(ORPHAN_POLL_S)              # the SIGTERM from the parent's death reaches the handler first
    while _state["graceful"] > 0:
        time.sleep(0.1)
    time.sleep(ORPHAN_GRACE_S)
    signum = _state["signum"] or signal.SIGTERM
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(128 + int(signum))


def _handler(signum, frame) -> None:
    if in_import(frame):
        # act once the import has returned (module docstring); a second signal meanwhile changes nothing
        if not _state["deferred"]:
            _state["deferred"] = signum
            threading.Thread(target=_redeliver_after_import, args=(signum,), daemon=True,
                             name="mlm-signal-after-import").start()
        return
    first = not _flag.is_set()
    _state["signum"], _state["at"] = signum, _state["at"] or time.monotonic()
    _flag.set()
    if first and _state["graceful"] > 0:
        log.warning("%s received: saving a checkpoint at the next step boundary, then stopping "
                    "(send it again to stop at once)", _name(signum))
        return
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Interrupted(f"stopped by {_name(signum)}", signum)


def install() -> dict:
    """Install the handler for SIGTERM and SIGINT (main thread only; elsewhere a no-op); returns the previous
    handlers for ``restore``."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    prev = {s: signal.signal(s, _handler) for s in SIGNALS}
    parent = os.environ.get(PARENT_ENV, "")
    if not _state["installed"] and parent.isdigit():
        threading.Thread(target=_watch_parent, args=(int(parent),), daemon=True, name="mlm-parent-watch").start()
    _state["installed"] = True
    return prev


def restore(prev: dict) -> None:
    """Put back the handlers ``install`` replaced (a CLI called in-process, e.g. by a test)."""
    for s, h in (prev or {}).items():
        signal.signal(s, h)


def reset() -> None:
    """Forget a received signal (tests; a new run in the same process)."""
    _flag.clear()
    _state.update(signum=0, at=0.0)


def requested() -> int:
    """The signal number received (0 if none)."""
    return int(_state["signum"]) if _flag.is_set() else 0


@contextlib.contextmanager
def graceful() -> Iterator[None]:
    """Within this block the first signal only sets the flag (the training loop checkpoints and stops).

    In the main thread the handler is (re)installed for the block and the previous one restored after:
    Prefect's flow engine swaps in its own SIGTERM handler while a flow runs (``capture_sigterm``)."""
    prev = {}
    if threading.current_thread() is threading.main_thread():
        prev = {s: signal.signal(s, _handler) for s in SIGNALS}
    _state["graceful"] += 1
    try:
        yield
    finally:
        _state["graceful"] -= 1
        for s, h in prev.items():
            signal.signal(s, h)


def should_stop(world_size: int = 1, device=None) -> bool:
    """Whether to stop at this step boundary; the same answer on every rank (max over ranks)."""
    if world_size <= 1:
        return _flag.is_set()
    import torch

    from mlm_core.train.collective import all_reduce_sum
    flag = torch.tensor([1.0 if _flag.is_set() else 0.0], dtype=torch.float64)
    return bool(all_reduce_sum(flag, world_size, device or torch.device("cpu")).item() > 0)


def interrupted(step: int, checkpoint) -> Interrupted:
    """The error the loop raises after saving ``checkpoint`` at ``step``."""
    signum = _state["signum"] or signal.SIGTERM
    waited = time.monotonic() - _state["at"] if _state["at"] else 0.0
    return Interrupted(f"pretrain: stopped by {_name(signum)} at step {step} ({waited:.1f} s after the signal); "
                       f"checkpoint saved in {checkpoint}: rerun the same command to resume", signum)


__all__ = ["Interrupted", "in_import", "PARENT_ENV", "install", "restore", "reset", "requested", "graceful", "should_stop", "interrupted"]
