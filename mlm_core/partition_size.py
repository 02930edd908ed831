"""How big a partition of a data stage is: ``execution.partition_mb``, or sized from the input (``auto``).

Speed only: the normalize and shards outputs are byte-identical whatever the partitioning (and no
fingerprint holds it), so this only trades per-partition overhead against parallelism and memory.

``auto`` (the default): ``input MiB / (workers x PARTS_PER_WORKER)``, clamped to [FLOOR_MB, CAP_MB]:
- a mid-sized input gets about ``PARTS_PER_WORKER`` partitions per worker (enough to balance uneven
  partitions, few enough that the per-partition overhead stays small);
- a small input gets partitions of at least ``FLOOR_MB`` (below that the per-task overhead, 0.01-0.2 s, is
  a visible share of the ~1-3 s a few MiB of encoding takes), so fewer partitions than that;
- a large input gets partitions of at most ``CAP_MB`` (a worker holds one partition's text and token arrays:
  memory stays flat), so the count grows with the input.
``workers``: the parallelism the partitions run on: ``execution.workers`` for ``engine: dask`` (with an
``address``, set it to the cluster's worker threads), the stage's own pool size for ``engine: local``.
An explicit number is used as it is.
"""
from __future__ import annotations

FLOOR_MB = 8.0
CAP_MB = 64.0
PARTS_PER_WORKER = 4
MIB = 2**20


def parallelism(lc, local_workers: int) -> int:
    """The workers the partitions run on (see the module docstring)."""
    ex = getattr(lc.config, "execution", None)
    if ex is not None and ex.engine == "dask":
        return max(1, int(ex.workers))
    return max(1, int(local_workers))


def auto_partition_mb(total_bytes: int, workers: int) -> float:
    """The ``auto`` partition size in MiB for ``total_bytes`` of input on ``workers`` workers."""
    per = total_bytes / MIB / (max(1, workers) * PARTS_PER_WORKER)
    return min(CAP_MB, max(FLOOR_MB, per))


def partition_bytes(lc, total_bytes: int, local_workers: int) -> int:
    """Bytes per partition: ``execution.partition_mb`` when it is a number, else the ``auto`` size."""
    ex = getattr(lc.config, "execution", None)
    mb = getattr(ex, "partition_mb", None)
    if mb is None or mb == "auto":
        mb = auto_partition_mb(total_bytes, parallelism(lc, local_workers))
    return max(1, int(float(mb) * MIB))


__all__ = ["FLOOR_MB", "CAP_MB", "PARTS_PER_WORKER", "parallelism", "auto_partition_mb", "partition_bytes"]
