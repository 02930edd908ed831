"""The shards stage as a ``PartitionedStage`` (``mlm_core.partitions``): plan / process / merge (``build.py``).

A partition is one language's run of consecutive documents, about ``execution.partition_mb`` of text; its
descriptor (``build.plan_shards``) also carries the language's train/validation cut, so a partition needs
nothing but its own rows. The output (rows, shard numbering, files, tables, manifest) is the same for any
partitioning and wherever the partitions ran (``parts.py`` says why).

``local_mapper`` (``execution.engine: local``): the partitions one after another in this process, each encoding
as ``shards.workers`` says (<= 2: on the tokenizer's own threads with packing overlapped; >= 3: that many
single-threaded worker processes), which is today's single-pass speed (benchmarks/shards.py measured the
in-process rayon path 1.4x faster than 2 processes on 2 cores).
"""
from __future__ import annotations

from pathlib import Path

from mlm_core.shards import build as B


class ShardsStage:
    name = "shards"

    def plan(self, lc, upstream) -> list[dict]:
        return B.plan_shards(lc, upstream)

    def process(self, lc, upstream, part: dict, out_dir: Path) -> dict:
        return B.process_shards(lc, upstream, part, out_dir)

    def merge(self, lc, upstream, parts: list[dict], results: list[dict], part_dirs: list[Path],
              out_dir: Path) -> dict:
        return B.merge_shards(lc, upstream, parts, results, part_dirs, out_dir)

    def local_mapper(self, lc, parts: list[dict]):
        """Sequential, with the live progress display (documents, as before)."""
        from mlm_core.partitions import local_mapper
        rows = {p["index"]: p["stop"] - p["start"] for p in parts}
        of = {p["index"]: p for p in parts}

        def mapper(fn, jobs):
            from mlm_core.progress import Progress
            with Progress("shards", sum(rows.values()), unit="docs") as shown:     # display only
                def done(r: dict) -> None:
                    p = of[r["index"]]
                    shown.update(advance=rows[r["index"]], note=f"encoded {p['lang']} ({p['part'] + 1}/{p['of']})")
                return local_mapper(1, on_result=done)(fn, jobs)
        return mapper


STAGE = ShardsStage()
