"""What a sweep needs besides the pipeline itself: its MLflow parent run, a run in a child process, its artifact.

In: a planned sweep (``mlm_core.sweep.plan``). Out:
- ``SweepTracker``: one MLflow run for the sweep (tagged ``mlm.kind=sweep``, ``sweep=<name>``, its plan.json
  logged; a rerun reopens the run plan.json names, so a resumed sweep stays one run); each variant's pipeline run nests under it through ``tasks.sweep_link`` (``run_pipeline`` reads the
  link), tagged ``sweep``, ``variant`` and ``seed``.
- ``run_child``: one run as ``python -m flows.cli run BASE --set ...`` (exactly ``mlm run``), for concurrency > 1.
  Why a process per run and not a thread: training draws dropout from torch's global generator
  (``torch.manual_seed`` in the loop), so two runs training in one process would interleave their draws and no
  seed would be reproducible. The child gets the sweep's Prefect API (so its flow run shows in the same UI), its
  log goes to ``<workdir>/sweeps/<name>/logs/``, and it is sent SIGTERM when the sweep process dies (even by
  kill -9: ``PR_SET_PDEATHSIG``), so training checkpoints and a rerun of the sweep resumes it.
- ``publish_plan``: the dry-run table as a Prefect markdown artifact (inside a flow run).
mlflow and prefect are imported inside functions.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tasks import sweep_link

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1
# live child runs, so an interrupted sweep (SIGTERM/SIGINT to it alone) can stop them instead of waiting for them
_children: set = set()
_children_lock = threading.Lock()
_stopping = threading.Event()


class SweepTracker:
    """The sweep's MLflow run (a no-op when the base config disables tracking)."""

    def __init__(self, sweep, params: dict, previous_run_id: str | None = None):
        from tasks.tracking import Tracker, check_tracking_server, resolve_tracking_uri
        cfg = sweep.base.config
        if cfg.tracking.enabled:
            check_tracking_server(resolve_tracking_uri(cfg.tracking, sweep.base.workdir))   # before any work
        self.tracker = Tracker(cfg.tracking, sweep.base.workdir)
        self.run_id = None
        if previous_run_id and self.tracker.active:    # a resumed sweep keeps its one MLflow run
            self.run_id = self.tracker._guard("reopening the sweep run", self._reopen, previous_run_id)
        if self.run_id is None:
            stamp = time.strftime("%m-%d %H:%M")
            self.run_id = self.tracker.start_pipeline(f"sweep {sweep.config.name} · {stamp}", params=params,
                                                      tags={"mlm.kind": "sweep", "sweep": sweep.config.name})

    def _reopen(self, run_id: str) -> str | None:
        """The sweep's run from plan.json, RUNNING again (None when it is gone or in another experiment)."""
        from mlflow.exceptions import MlflowException
        c = self.tracker.client
        try:
            r = c.get_run(run_id)
        except MlflowException:
            return None
        if r.info.experiment_id != self.tracker.experiment_id or r.info.lifecycle_stage != "active":
            return None
        c.update_run(run_id, status="RUNNING")
        c.set_tag(run_id, "mlm.resumed", str(int(r.data.tags.get("mlm.resumed", "0")) + 1))
        self.tracker._parent = run_id          # end_pipeline closes it
        close_orphans(self.tracker, run_id)
        return run_id

    def link(self, sweep, run) -> dict:
        """What the run's pipeline reads (``tasks.sweep_link``): nest under the sweep's run, with these tags."""
        return {"parent_run_id": self.run_id, "run_name": f"{run.variant} · seed {run.seed} · {sweep.config.name}",
                "tags": {"sweep": sweep.config.name, "variant": run.variant, "seed": str(run.seed)}}

    def finish(self, plan_doc: dict, status: str) -> None:
        import json
        if self.run_id is not None:
            self.tracker.log_text(self.run_id, json.dumps(plan_doc, indent=2, default=str), "sweep/plan.json")
        self.tracker.end_pipeline(status)


def close_orphans(tracker, run_id: str) -> list[str]:
    """A resumed sweep's MLflow runs that a killed sweep left RUNNING, their process gone (a child killed between
    storing its stages and ending its run; the stage runs under it): KILLED, so the MLflow UI shows none as still
    going. Runs of a live process (another `mlm sweep` of the same file) are left alone. Returns the closed ids."""
    from tasks.tracking.sync import orphaned
    c, exp = tracker.client, tracker.experiment_id
    parent_of: dict[str, str | None] = {}

    def under_sweep(r) -> bool:        # the run descends from the sweep's run (pipeline run, stage run)
        rid, hops = r.data.tags.get("mlflow.parentRunId"), 0
        while rid and rid != run_id and hops < 4:
            if rid not in parent_of:
                parent_of[rid] = c.get_run(rid).data.tags.get("mlflow.parentRunId")
            rid, hops = parent_of[rid], hops + 1
        return rid == run_id
    closed = []
    for r in c.search_runs([exp], "attributes.status = 'RUNNING'", max_results=1000):
        if r.info.run_id != run_id and orphaned(r) and under_sweep(r):
            c.set_terminated(r.info.run_id, status="KILLED")
            log.info("sweep: closed %s (KILLED): its process is gone", r.info.run_name or r.info.run_id)
            closed.append(r.info.run_id)
    return closed


def _die_with_parent(parent: int):
    """The child's preexec hook (between fork and exec): SIGTERM when the sweep process dies."""
    def hook() -> None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):   # not Linux: the child may outlive a killed sweep
            return
        # the sweep may have died between fork and prctl (no signal then: it is orphaned already): exit now
        if os.getppid() != parent:
            os._exit(143)
    return hook


def prefect_api_url() -> str | None:
    """The Prefect API this process uses (a server, or the temporary one `mlm sweep` started), for the children."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    try:
        from prefect.settings import PREFECT_API_URL
        if PREFECT_API_URL.value():
            return str(PREFECT_API_URL.value())
        from prefect.server.api.server import SubprocessASGIServer
        server = SubprocessASGIServer()
        return server.api_url if server.running else None
    except Exception:  # noqa: BLE001 - without it each child starts its own temporary server
        return None


def log_file(sweep, run) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.+=,-]", "_", run.variant)
    return sweep.state_dir / "logs" / f"{safe}@seed{run.seed}.log"


def child_command(sweep, run) -> list[str]:
    cmd = [sys.executable, "-m", "flows.cli", "run", str(sweep.base_path)]
    for word in run.overrides:
        cmd += ["--set", word]
    return cmd


def child_env(link: dict, api_url: str | None) -> dict:
    """The environment of a child run: the sweep's link, its Prefect API and this process as the parent.

    Prefect's client keeps its default retries (5, with 2^n s backoff) against the sweep's server: with two
    runs writing at once the server's SQLite answers 503 to a write that meets another (WAL cannot upgrade a
    read to a write while another writer commits; Prefect maps that to 503), and capping the retries at 1 made
    a child run fail on it under load (issue 24 item 0). When the sweep process dies, its server dies with it:
    then ``$MLM_PARENT_PID`` lets the child's SIGTERM handler exit once its checkpoint is written instead of
    waiting out those retries against a server that is gone (``mlm_core.train.signals``).
    """
    from mlm_core.train.signals import PARENT_ENV
    env = {**os.environ, **sweep_link.env_for(link), PARENT_ENV: str(os.getpid())}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def run_child(sweep, run, link: dict, api_url: str | None) -> tuple[int, Path]:
    """``mlm run BASE --set ...`` in a child process; returns (exit code, its log file)."""
    out = log_file(sweep, run)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = child_env(link, api_url)
    cmd = child_command(sweep, run)
    with open(out, "a", encoding="utf-8") as f:    # appended: a resumed run's log follows the killed one's
        f.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        f.flush()
        with _children_lock:
            if _stopping.is_set():
                return 143, out
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                    stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent(os.getpid()))
            _children.add(proc)
        try:
            return proc.wait(), out
        finally:
            with _children_lock:
                _children.discard(proc)


def stop_children(timeout: float = 120) -> None:
    """SIGTERM every live child run (training checkpoints at its next step, then exits) and wait for them;
    no new child starts afterwards (until ``allow_children``)."""
    with _children_lock:
        _stopping.set()
        procs = list(_children)
    for p in procs:
        p.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()


def stopping() -> bool:
    return _stopping.is_set()


def allow_children() -> None:
    _stopping.clear()


def tail(path: Path, n: int = 3) -> str:
    try:
        lines = [x for x in path.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    errors = [x for x in lines if x.startswith("error:")]
    return " | ".join((errors or lines)[-n:])


def publish_plan(lines: list[str], name: str) -> None:
    """The dry-run table as a Prefect markdown artifact (a no-op outside a flow run)."""
    if "prefect" not in sys.modules:     # a dry run from the CLI: no flow run, no Prefect import (~3 s)
        return
    try:
        from prefect.artifacts import create_markdown_artifact
        from prefect.context import FlowRunContext
        if FlowRunContext.get() is None:
            return
        create_markdown_artifact(key=f"sweep-plan-{re.sub(r'[^a-z0-9-]', '-', name.lower())}",
                                 markdown="```\n" + "\n".join(lines) + "\n```", description=f"sweep {name}: plan")
    except Exception as exc:  # noqa: BLE001 - an artifact is a view; the sweep goes on
        log.warning("sweep plan artifact not published: %s", exc)


__all__ = ["SweepTracker", "close_orphans", "run_child", "stop_children", "allow_children", "stopping", "child_command", "prefect_api_url", "publish_plan", "log_file", "tail"]
