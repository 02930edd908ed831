"""Partitioned stages: plan the partitions, process each one into its own folder, merge.

A data stage that scales out (normalize, shards) is a ``PartitionedStage``: three pure functions. ``plan``
lists JSON-able partition descriptors in a deterministic order; ``process`` turns one partition into files
in its own folder (nothing else is written, so it can run on any machine that sees the workdir, twice, or
after a crash); ``merge`` reads every partition's folder and writes the stage output, returning its
manifest fields. The output must not depend on how the input was partitioned nor where a partition ran.

Where partitions live: ``<workdir>/partitions/<stage>/<key>/``, ``key`` = hash of the stage's fingerprint
and the partition descriptor (``partition_key``). A partition is written into a temporary sibling and
renamed into place after its ``part.json`` (the result + the size of every file) is written, so a folder
under its key is complete; a rerun after a failure (the stage left as ``.failed-<fp>``) reuses every
complete partition whose files still have their recorded sizes and recomputes only the missing ones.
Once the stage output is stored the partition folders are removed (``cleanup``).

Who runs the partitions: a ``Mapper`` — ``mapper(run_partition, jobs) -> results`` in the jobs' order.
``local_mapper`` is the in-process pool (threads, or processes for GIL-bound work); the tasks layer
(``tasks/engine.py``) maps ``run_partition`` over Prefect tasks on its task runner (Dask). A job is a
plain JSON dict (``PartitionJob``), so it travels to a remote worker without pickling a config object.
This module imports no Prefect.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Protocol

from mlm_core.errors import StageError
from mlm_core.artifacts import StageArtifact, parse
from mlm_core.store import canonical_json, fsync_dir

PART_JSON = "part.json"
PARTITIONS_DIR = "partitions"


class PartitionedStage(Protocol):
    """A stage as map -> reduce. ``upstream``: the stage's upstream outputs by stage name (``StageArtifact``s)."""

    name: str

    def plan(self, lc, upstream: dict[str, StageArtifact]) -> list[dict]:
        """JSON-able partition descriptors, in a deterministic order."""

    def process(self, lc, upstream: dict[str, StageArtifact], part: dict, out_dir: Path) -> dict:
        """Write one partition's files into ``out_dir`` only; return a JSON-able result. Pure and idempotent."""

    def merge(self, lc, upstream: dict[str, StageArtifact], parts: list[dict], results: list[dict],
              part_dirs: list[Path], out_dir: Path) -> dict:
        """Write the stage output into ``out_dir`` from every partition's folder; return the manifest fields."""


# PartitionJob: {"stage", "target", "key", "part", "root", "context": {config, path, base_dir, overrides},
#                "upstream": {name: {"fingerprint", "path"}}, "hints": {...}}  (all JSON)
PartitionJob = dict
Mapper = Callable[[Callable[[PartitionJob], dict], list[PartitionJob]], list[dict]]

def stage_object(target: str) -> PartitionedStage:
    """The ``PartitionedStage`` object a stage declares (``StageSpec.partitions``: "module:attribute"), imported
    where a partition runs (a job carries the reference, not the object)."""
    import importlib
    mod, _, attr = target.partition(":")
    return getattr(importlib.import_module(mod), attr)


def partition_key(stage: str, stage_fp: str, part: dict) -> str:
    """A partition's content key: the stage fingerprint (config, upstream, code version, inputs) + its descriptor."""
    return hashlib.sha256(canonical_json({"stage": stage, "fp": stage_fp, "part": part}).encode()).hexdigest()[:20]


def partitions_root(workdir: Path, stage: str) -> Path:
    return Path(workdir) / PARTITIONS_DIR / stage


# ---------------------------------------------------------------- the job a worker receives
def config_context(lc) -> dict:
    """``lc`` as JSON: the fields set in the file/overrides (so validators see the same "explicitly set" fields),
    with the workdir made absolute (a worker's current directory is not the driver's)."""
    cfg = lc.config.model_dump(mode="json", by_alias=True, exclude_unset=True)
    cfg["workdir"] = str(lc.workdir)
    return {"config": cfg, "path": str(Path(lc.path).resolve()) if lc.path else None,
            "base_dir": str(Path(lc.base_dir).resolve()),
            "overrides": list(lc.overrides)}


def load_context(ctx: dict):
    from mlm_core.config import PipelineConfig
    from mlm_core.config.io import LoadedConfig
    return LoadedConfig(PipelineConfig.model_validate(ctx["config"]), Path(ctx["path"]) if ctx["path"] else None,
                        Path(ctx["base_dir"]), tuple(ctx["overrides"]))


def _upstream_json(upstream: dict[str, StageArtifact]) -> dict:
    return {k: {"fingerprint": a.fingerprint, "path": str(a.path)} for k, a in upstream.items()}


def _load_upstream(up: dict) -> dict[str, StageArtifact]:
    """Upstream outputs from their stored manifests (the driver verified them before planning)."""
    from mlm_core.store import MANIFEST
    out = {}
    for k, v in up.items():
        p = Path(v["path"])
        out[k] = parse(k, p, json.loads((p / MANIFEST).read_text(encoding="utf-8")), v["fingerprint"])
    return out


_CONTEXT_CACHE: dict[str, tuple] = {}     # a worker runs many partitions of one stage: load the config once


def _job_inputs(job: PartitionJob):
    token = hashlib.sha256(canonical_json([job["context"], job["upstream"]]).encode()).hexdigest()
    got = _CONTEXT_CACHE.get(token)
    if got is None:
        got = (load_context(job["context"]), _load_upstream(job["upstream"]))
        _CONTEXT_CACHE.clear()
        _CONTEXT_CACHE[token] = got
    return got


# ---------------------------------------------------------------- one partition, atomically
def read_complete(folder: Path) -> dict | None:
    """The result of a complete partition folder whose files still have their recorded sizes, else None."""
    try:
        rec = json.loads((folder / PART_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for rel, size in rec.get("files", {}).items():
        try:
            if (folder / rel).stat().st_size != size:
                return None
        except OSError:
            return None
    return rec.get("result")


def run_partition(job: PartitionJob) -> dict:
    """Process one partition into ``<root>/<key>/`` (reused when complete). Runs anywhere that sees the workdir.

    Returns the stage's result for the partition plus ``_reused`` (bool) and ``_dir`` (the folder)."""
    root, key = Path(job["root"]), job["key"]
    final = root / key
    got = read_complete(final)
    if got is not None:
        return {**got, "_reused": True, "_dir": str(final)}
    _test_delay()
    lc, upstream = _job_inputs(job)
    stage = stage_object(job["target"])
    tmp = root / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        result = stage.process(lc, upstream, job["part"], tmp)
        files = {p.relative_to(tmp).as_posix(): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
        with open(tmp / PART_JSON, "w", encoding="utf-8") as f:
            json.dump({"stage": job["stage"], "key": key, "part": job["part"], "result": result, "files": files},
                      f, sort_keys=True, default=str)
        try:
            tmp.rename(final)
        except OSError:
            # another attempt of the same partition (a retry after a lost worker) finished first: same content
            if read_complete(final) is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    trace = os.environ.get("MLM_PARTITION_TRACE")
    if trace:                     # tests only: which partitions were computed (not reused), one key a line
        with open(trace, "a", encoding="utf-8") as f:
            f.write(key + "\n")
    return {**result, "_reused": False, "_dir": str(final)}


def _test_delay() -> None:
    """Tests only: ``MLM_PARTITION_DELAY_S`` sleeps before each partition, so a test can act mid-stage."""
    delay = os.environ.get("MLM_PARTITION_DELAY_S")
    if delay:
        import time
        time.sleep(float(delay))


# ---------------------------------------------------------------- mappers
def local_mapper(workers: int = 1, processes: bool = False,
                 on_result: Callable[[dict], None] | None = None) -> Mapper:
    """Today's in-process execution: sequential, a thread pool, or (GIL-bound partitions) a process pool.
    ``on_result``: called with each result as it arrives, in order (progress display)."""
    def mapper(fn: Callable[[PartitionJob], dict], jobs: list[PartitionJob]) -> list[dict]:
        n = min(workers, len(jobs))
        if n <= 1:
            return _collect((fn(j) for j in jobs), on_result)
        if processes:
            import multiprocessing as mp
            with ProcessPoolExecutor(n, mp_context=mp.get_context("forkserver")) as ex:
                return _collect(ex.map(fn, jobs), on_result)
        with ThreadPoolExecutor(n) as ex:
            return _collect(ex.map(fn, jobs), on_result)
    return mapper


def _collect(results, on_result) -> list[dict]:
    out = []
    for r in results:
        out.append(r)
        if on_result is not None:
            on_result(r)
    return out


# ---------------------------------------------------------------- the stage: plan -> map -> merge
def run_partitioned(name: str, lc, upstream: dict[str, StageArtifact], out_dir: Path, stage_fp: str,
                    mapper: Mapper | None = None, on_keys: Callable[[list[Path]], None] | None = None,
                    root: Path | None = None, *, target: str) -> dict:
    """Plan, process every partition through ``mapper`` (default: the stage's local mapper), merge.

    ``on_keys(folders)``: told the partition folders before any runs (the caller removes them once the stage
    output is stored). ``root``: where the partition folders go (default ``partitions_root``). ``target``: the
    stage's ``PartitionedStage`` object as "module:attribute" (its ``StageSpec.partitions``). A stage object may define ``local_mapper(lc, parts)`` to pick its own pool, and
    ``hints(lc, parts)`` -> JSON values every job carries (e.g. a per-process shared resource switch)."""
    stage = stage_object(target)
    parts = stage.plan(lc, upstream)
    root = Path(root) if root is not None else partitions_root(lc.workdir, name)
    root.mkdir(parents=True, exist_ok=True)
    ctx, up = config_context(lc), _upstream_json(upstream)
    jobs = [{"stage": name, "target": target, "key": partition_key(name, stage_fp, p), "part": p, "root": str(root),
             "context": ctx, "upstream": up} for p in parts]
    if on_keys is not None:
        on_keys([root / j["key"] for j in jobs])
    if mapper is None:
        pick = getattr(stage, "local_mapper", None)
        mapper = pick(lc, parts) if pick else local_mapper(1)
    results = mapper(run_partition, jobs)
    if len(results) != len(jobs):
        raise StageError(f"{name}: {len(results)} partition results for {len(jobs)} partitions")
    dirs = [Path(r.pop("_dir")) for r in results]
    reused = sum(bool(r.pop("_reused")) for r in results)
    if reused:
        import logging
        logging.getLogger(__name__).info("%s: reused %d of %d partitions", name, reused, len(jobs))
    return stage.merge(lc, upstream, parts, results, dirs, out_dir)


def cleanup(folders: list[Path]) -> None:
    """Remove partition folders once the stage output that merged them is stored, with the temporary folders
    an attempt left when its worker was killed mid-partition (``.tmp-<key>-<pid>-...``)."""
    for f in folders:
        shutil.rmtree(f, ignore_errors=True)
        for t in f.parent.glob(f".tmp-{f.name}-*"):
            shutil.rmtree(t, ignore_errors=True)


__all__ = ["PartitionedStage", "PartitionJob", "Mapper", "stage_object", "partition_key",
           "partitions_root", "run_partition", "run_partitioned", "local_mapper", "cleanup", "read_complete",
           "config_context", "load_context"]
