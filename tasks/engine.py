"""Execution engines for partitioned stages: batches of partitions as Prefect tasks on the flow's Dask task runner.

``mapper_for(lc, stage)`` returns the ``mlm_core.partitions.Mapper`` a stage's partitions go through:
``None`` for ``execution.engine: local`` (the stage's own in-process pool, today's speed), or a Dask mapper
for ``engine: dask``: prefect-dask's ``DaskTaskRunner`` on an existing scheduler (``execution.address``)
or on a LocalCluster of ``execution.workers`` processes. The partitions go in batches of consecutive
partitions (``batches``: about ``TASKS_PER_THREAD`` per worker thread of the cluster, so many small partitions
do not each pay a Prefect task run and a Dask round trip); each batch is one Prefect task run
(``partition_batch_task``, named ``<stage>[i-j] <first key>``: visible in the UI, retried on its own) that runs
its partitions one after another. Each partition's output is still its own folder, cached by its own content
key (``mlm_core.partitions``: a complete partition folder is reused, so a retried batch or a rerun after a
failure recomputes only the missing partitions). A worker lost mid-stage: Dask reruns its
partitions on the other workers (each writes into a fresh temporary folder, renamed into place once).

Before any partition runs (``check_cluster``), each failure is a clear ``EngineError``:
- an unreachable scheduler address;
- no worker, or a worker whose libraries differ from this process's (Dask's own package list plus the
  fingerprint's library list, ``mlm_core.store.library_versions``): named, with both versions;
- a worker that cannot read and write the workdir (a probe file written here must be read there, and the
  worker's reply file must be visible here): the workdir must be on a filesystem every worker shares.
A scheduler that goes away mid-stage fails the stage with the address named (the store keeps the unfinished
output as ``.failed-<fingerprint>``; the finished partitions stay for the rerun).

``engine: ray`` would be the same switch (prefect-ray's ``RayTaskRunner`` in ``_runner``); not installed.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from pathlib import Path

from prefect import task

from mlm_core.errors import MlmError
from mlm_core.partitions import PARTITIONS_DIR, run_partition

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10
# Dask's own wire-compatibility list, plus what the stages' bytes depend on (the fingerprint's library list)
DASK_PACKAGES = ("python", "dask", "distributed", "cloudpickle", "msgpack", "tornado", "toolz")


class EngineError(MlmError):
    """The execution engine cannot run the stage (scheduler unreachable, workers that differ or cannot see
    the workdir, a scheduler lost mid-stage)."""


TASKS_PER_THREAD = 3    # batches per worker thread: enough to balance uneven batches, few enough to amortize a task


@task(name="partitions", retries=2, retry_delay_seconds=1)
def partition_batch_task(jobs: list[dict]) -> list[dict]:
    """Process a batch of partitions one after another (``mlm_core.partitions.run_partition`` each: every
    partition still writes its own folder atomically, so a retry or a rerun reuses the complete ones)."""
    return [run_partition(j) for j in jobs]


def batches(n_jobs: int, threads: int, per_thread: int = TASKS_PER_THREAD) -> list[range]:
    """Consecutive runs of job indexes, one Dask task each: ``min(n_jobs, threads x per_thread)`` runs whose
    lengths differ by at most one (the first ones longer), covering ``range(n_jobs)`` in order."""
    n = min(n_jobs, max(1, threads) * max(1, per_thread))
    if n <= 0:
        return []
    size, extra = divmod(n_jobs, n)
    out, start = [], 0
    for i in range(n):
        stop = start + size + (i < extra)
        out.append(range(start, stop))
        start = stop
    return out


def cluster_threads(client) -> int:
    """Worker threads of the cluster the client talks to (at least 1)."""
    workers = client.scheduler_info().get("workers", {})
    return max(1, sum(int(w.get("nthreads") or 1) for w in workers.values()))


_SESSION: dict | None = None      # inside ``session()``: LocalClusters kept for every stage of a pipeline run


@contextlib.contextmanager
def session():
    """Around a pipeline run: partitioned stages share one LocalCluster (started at the first stage that needs
    it, closed at the end) instead of starting one each (a few seconds per stage)."""
    global _SESSION
    if _SESSION is not None:
        yield
        return
    _SESSION = {}
    try:
        yield
    finally:
        clusters, _SESSION = _SESSION, None
        for c in clusters.values():
            c.close()


def mapper_for(lc, stage: str):
    """The mapper for ``stage``'s partitions under ``execution`` (None: the stage's local pool)."""
    ex = lc.config.execution
    if ex.engine == "local":
        if ex.address:
            log.warning("execution.address %s is ignored: execution.engine is local (set it to dask)", ex.address)
        return None
    return DaskMapper(lc, stage)


# ---------------------------------------------------------------- checks run on every worker
def _worker_versions() -> dict:
    from mlm_core.store import library_versions
    return library_versions()


def _worker_probe(probe: str, token: str) -> str:
    """Read the driver's probe file, write a reply next to it; returns an error message ('' when fine)."""
    p = Path(probe)
    try:
        got = p.read_text(encoding="utf-8")
    except OSError as exc:
        return f"cannot read {p} ({exc.strerror or exc})"
    if got != token:
        return f"{p} has other content than the driver wrote (a different filesystem at the same path)"
    reply = p.with_name(f"{p.name}.{socket.gethostname()}.{os.getpid()}")
    try:
        reply.write_text(token, encoding="utf-8")
    except OSError as exc:
        return f"cannot write {reply} ({exc.strerror or exc})"
    return str(reply)


def compare_versions(mine: dict, workers: dict[str, dict]) -> list[str]:
    """One line per (worker, library) whose version differs from this process's."""
    out = []
    for addr, theirs in sorted(workers.items()):
        for lib in sorted(set(mine) | set(theirs)):
            if mine.get(lib) != theirs.get(lib):
                out.append(f"worker {addr}: {lib} {theirs.get(lib) or 'missing'} (here: {mine.get(lib) or 'missing'})")
    return out


def check_cluster(client, workdir: Path, where: str) -> list[str]:
    """Versions and workdir visibility on every worker (see the module docstring); returns the worker addresses."""
    workers = sorted(client.scheduler_info().get("workers", {}))
    if not workers:
        raise EngineError(f"{where}: the Dask cluster has no worker: start `dask worker {where}` on each node")
    v = client.get_versions(check=False)
    mine = {k: str(val) for k, val in (v["client"]["packages"] or {}).items() if k in DASK_PACKAGES}
    dask_side = {a: {k: str(val) for k, val in (w["packages"] or {}).items() if k in DASK_PACKAGES}
                 for a, w in (v.get("workers") or {}).items()}
    ours = _run_everywhere(client, _worker_versions)
    problems = compare_versions({**mine, **_worker_versions()}, {a: {**dask_side.get(a, {}), **ours[a]} for a in ours})
    if problems:
        raise EngineError("execution.engine dask: worker libraries differ from this process's (outputs would not "
                          "be byte-identical); install the same versions on every worker:\n  " + "\n  ".join(problems))
    probe_dir = Path(workdir) / PARTITIONS_DIR / ".probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    probe = probe_dir / f"probe-{token[:12]}"
    probe.write_text(token, encoding="utf-8")
    try:
        replies = _run_everywhere(client, _worker_probe, str(probe), token)
        bad = []
        for addr, got in sorted(replies.items()):
            if not got.startswith("/") or not Path(got).is_file():
                bad.append(f"worker {addr}: {got if not got.startswith('/') else f'its reply {got} is not visible here'}")
        if bad:
            raise EngineError(f"the workdir {workdir} is not shared with every Dask worker (it must be on a filesystem "
                              "all workers mount at the same path; see docs/SCALING.md):\n  " + "\n  ".join(bad))
    finally:
        for f in probe_dir.glob(f"{probe.name}*"):
            f.unlink(missing_ok=True)
    return workers


def _run_everywhere(client, fn, *args) -> dict:
    """``fn(*args)`` on every worker; a worker where it raises is named with the error."""
    got = client.run(fn, *args, on_error="return")
    bad = [f"worker {a}: {type(r).__name__}: {r}" for a, r in sorted(got.items()) if isinstance(r, BaseException)]
    if bad:
        raise EngineError(f"the pre-flight check {fn.__name__} failed on Dask workers:\n  " + "\n  ".join(bad))
    return got


# ---------------------------------------------------------------- the Dask mapper
class DaskMapper:
    """``mapper(run_partition, jobs)`` as Prefect tasks on a DaskTaskRunner (``execution.address`` / ``workers``)."""

    def __init__(self, lc, stage: str):
        self.lc, self.stage = lc, stage
        self.ex = lc.config.execution
        self._checked = False

    def _runner(self):
        from prefect_dask import DaskTaskRunner
        if self.ex.address:
            return DaskTaskRunner(address=self.ex.address)
        kwargs = {"n_workers": self.ex.workers, "threads_per_worker": 1, "processes": True,
                  "dashboard_address": ":0", "silence_logs": logging.WARNING}    # any free dashboard port
        if _SESSION is None:
            return DaskTaskRunner(cluster_kwargs=kwargs)      # this stage's own LocalCluster
        if self.ex.workers not in _SESSION:                  # one LocalCluster for every stage of the run
            from distributed import LocalCluster
            _SESSION[self.ex.workers] = LocalCluster(**kwargs)
        return DaskTaskRunner(cluster=_SESSION[self.ex.workers])

    def preflight(self) -> None:
        """An existing scheduler: reachable, workers alike and sharing the workdir, before any work (once)."""
        if not self.ex.address or self._checked:
            return
        from distributed import Client
        _tcp_reachable(self.ex.address)
        try:
            client = Client(self.ex.address, timeout=f"{CONNECT_TIMEOUT_S}s", set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise EngineError(f"execution.address {self.ex.address}: no Dask scheduler answers within "
                              f"{CONNECT_TIMEOUT_S} s ({type(exc).__name__}: {exc}); start one with `dask scheduler` "
                              "or fix the address") from None
        try:
            check_cluster(client, self.lc.workdir, self.ex.address)
        finally:
            client.close()
        self._checked = True

    def __call__(self, fn, jobs: list[dict]) -> list[dict]:
        if fn is not run_partition:
            raise EngineError("the Dask engine runs mlm_core.partitions.run_partition only")
        self.preflight()
        where = self.ex.address or f"LocalCluster({self.ex.workers} workers)"
        with _api_settings(), self._runner() as runner:
            if not self.ex.address:
                check_cluster(runner.client, self.lc.workdir, where)
            groups = batches(len(jobs), cluster_threads(runner.client))
            futures = [runner.submit(partition_batch_task.with_options(task_run_name=self._name(g, jobs)),
                                     {"jobs": [jobs[i] for i in g]}) for g in groups]
            results = []
            for f in futures:
                try:
                    results.extend(f.result())
                except Exception as exc:
                    if _lost_scheduler(exc, runner):
                        raise EngineError(
                            f"{self.stage}: the Dask scheduler at {where} went away mid-stage ({type(exc).__name__}; "
                            f"{len(results)} of {len(jobs)} partition results received). The finished partitions are "
                            "kept: rerun the stage once the scheduler is back, only the missing partitions run") from None
                    raise
            log.info("%s: %d partitions in %d tasks on %s", self.stage, len(results), len(groups), where)
            return results

    def _name(self, g: range, jobs: list[dict]) -> str:
        """The task run's name: ``<stage>[i] <key>`` for one partition, ``<stage>[i-j] <first key>`` for a batch."""
        idx = f"{g[0]}" if len(g) == 1 else f"{g[0]}-{g[-1]}"
        return f"{self.stage}[{idx}] {jobs[g[0]]['key']}"


def _tcp_reachable(address: str) -> None:
    """A refused or unroutable tcp:// address fails at once (Dask's client would retry until its timeout)."""
    from urllib.parse import urlsplit
    u = urlsplit(address if "://" in address else f"tcp://{address}")
    if u.scheme != "tcp" or not u.hostname or not u.port:
        return                             # tls://, inproc://...: left to Dask's client
    try:
        socket.create_connection((u.hostname, u.port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise EngineError(f"execution.address {address}: no Dask scheduler answers ({exc.strerror or exc}); "
                          "start one with `dask scheduler` or fix the address") from None


def _lost_scheduler(exc: BaseException, runner) -> bool:
    from distributed.client import FutureCancelledError
    try:
        status = runner.client.status
    except Exception:      # noqa: BLE001 - a client that cannot say: treat as lost
        status = "closed"
    # a partition's own error (bad input, a full disk) arrives with the client still connected: not this
    return isinstance(exc, FutureCancelledError) or status not in ("running", "newly-created")


def _api_settings():
    """The Prefect API this process talks to, made explicit in the settings every task carries to its worker:
    with the temporary server of `mlm run` no PREFECT_API_URL is set, and a worker would start its own."""
    from prefect.settings import PREFECT_API_URL, temporary_settings
    if PREFECT_API_URL.value():
        return contextlib.nullcontext()
    from prefect.client.orchestration import get_client
    with get_client(sync_client=True) as c:
        url = str(c.api_url)
    if not url.startswith("http") or "ephemeral-prefect" in url:
        return contextlib.nullcontext()
    return temporary_settings({PREFECT_API_URL: url})


__all__ = ["EngineError", "mapper_for", "partition_batch_task", "batches", "cluster_threads", "check_cluster",
           "compare_versions", "DaskMapper"]
