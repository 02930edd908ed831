"""Benchmark: the shards merge as a parallel map (1, 2, 4 workers) against the one-pass merge, same input.

Not a test; prints a table. Input: the real text of ../shared/data/text (7 languages, 4.7 MB), normalized,
tokenized (byte-level BPE, 16k vocabulary: uint16 ids, word starts folded) and encoded once into partitions of
about 1 MB; the merge's input is then those partition folders listed ``--copies`` times per language (the same
arrays memory-mapped again: a stream ``--copies`` times as long, as if the text were repeated; repeating the
raw text instead would be removed by normalize's dedup). Scratch goes to ``--out`` (default
/tmp/mlm-merge-bench), never into the repository.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/merge_parallel.py                 # ~150 MB of text, 3 rounds
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/merge_parallel.py --copies 8 --rounds 1   # quick check

Each merge runs in a fresh process (``common.run_measured``), the variants interleaved round by round
(one-pass, 1, 2, 4 workers, then again), so the machine's load hits every variant alike; the table gives
the median seconds of ``merge_shards`` alone (imports, config and tokenizer load outside the clock), MB of
text per second, the ratio to 1 worker (the named baseline) and to the one-pass merge, and the cores the merge
kept busy (its CPU seconds per wall second: on a shared machine, what the other jobs left it). Each round also times a GIL-free numpy job (8 sorts) on
1, 2 and 4 threads: the speed-up the machine allowed at the time. Every variant's
manifest shard table (names, rows, tokens, sha256 of every file) must equal the one-pass merge's.
The partition arrays are in the page cache after the first round (a cluster merge reads them from a shared
filesystem: not measured here).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from common import MB, run_measured, table  # noqa: E402

TEXT = REPO.parent / "shared" / "data" / "text"
LANGS = ("en", "ru", "hi", "ar", "fr", "de", "zh")


def prepare(out: Path) -> dict:
    """normalize + tokenizer + the shards plan and every partition encoded, once (cached in prep.json)."""
    done = out / "prep.json"
    if done.is_file():
        return json.loads(done.read_text())
    import pyarrow.parquet as pq
    import yaml

    from mlm_core import stages
    from mlm_core.config.io import load_config
    from mlm_core.shards.build import plan_shards, process_shards
    from mlm_core.store import StageStore
    raw = {"name": "merge-bench", "workdir": str(out / "work"),
           "sources": {lang: {"paths": [str(TEXT / f"{lang}.txt")]} for lang in LANGS},
           "normalize": {"min_chars": 5},
           "tokenizer": {"algorithm": "bpe", "vocab_size": 16000},
           "shards": {"seq_len": 128},
           "tracking": {"enabled": False}, "execution": {"partition_mb": 1}}
    cfg = out / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw, allow_unicode=True))
    lc = load_config(cfg)
    plans = stages.plan(lc)
    for name in ("normalize", "tokenizer"):
        stages.execute(lc, name, plans)
    store = StageStore(lc.workdir)
    up = {u: store.load(u, fp) for u, fp in plans["shards"].upstream.items()}
    parts = plan_shards(lc, up)
    dirs = [out / "parts" / f"{p['index']:06d}" for p in parts]
    results = [process_shards(lc, up, p, d) for p, d in zip(parts, dirs)]
    text_bytes = sum(sum(len(t.encode()) for t in pq.read_table(f, columns=["text"]).column(0).to_pylist())
                     for f in (up["normalize"].path / "docs").glob("*.parquet"))
    prep = {"cfg": str(cfg), "parts": parts, "results": results, "dirs": [str(d) for d in dirs],
            "text_bytes": text_bytes}
    done.write_text(json.dumps(prep))
    return prep


def replicated(prep: dict, copies: int) -> tuple[list[dict], list[dict], list[str]]:
    """Every language's partitions listed ``copies`` times in a row: a valid merge input (rows renumbered)."""
    parts, results, dirs = [], [], []
    langs = list(dict.fromkeys(p["lang"] for p in prep["parts"]))
    for lang in langs:
        mine = [i for i, p in enumerate(prep["parts"]) if p["lang"] == lang]
        n = prep["parts"][mine[0]]["docs"]
        for r in range(copies):
            for i in mine:
                p, res = prep["parts"][i], prep["results"][i]
                k = len(parts)
                parts.append({**p, "index": k, "start": r * n + p["start"], "stop": r * n + p["stop"],
                              "docs": copies * n})
                results.append({**res, "index": k})
                dirs.append(prep["dirs"][i])
    return parts, results, dirs


def cpu_pressure() -> str:
    """Linux PSI: the share of the last 60 s some runnable task waited for a CPU ('-' where not available)."""
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return next(f.split("=")[1] for f in first.split() if f.startswith("avg60=")) + "%"
    except (OSError, StopIteration, IndexError):
        return "-"


def calibrate(workers: list[int]) -> None:
    """What the machine gives a GIL-free job right now: 8 numpy sorts of 2M floats on 1, 2, 4 threads
    (seconds each; on an idle machine with 2 cores, 2 threads take ~half of 1 thread's time)."""
    import numpy as np
    from concurrent.futures import ThreadPoolExecutor
    data = [np.random.default_rng(i).random(2_000_000) for i in range(8)]
    got = {}
    for w in workers:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(w) as ex:
            list(ex.map(lambda a: np.sort(a, kind="quicksort"), data))
        got[str(w)] = time.perf_counter() - t0
    print(json.dumps(got))


def job(out: Path, copies: int, variant: str, tag: str) -> None:
    """One merge in this (fresh) process; prints a JSON line."""
    from mlm_core import stages
    from mlm_core.config.io import load_config
    from mlm_core.shards.build import merge_shards
    from mlm_core.store import StageStore
    prep = json.loads((out / "prep.json").read_text())
    serial = variant == "one-pass"
    lc = load_config(prep["cfg"], [] if serial else [f"shards.merge_workers={variant}"])
    plans = stages.plan(lc)
    store = StageStore(lc.workdir)
    up = {u: store.load(u, fp) for u, fp in plans["shards"].upstream.items()}
    parts, results, dirs = replicated(prep, copies)
    dest = out / f"run-{tag}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    # outside the clock: the tokenizer load (cached per process) and the imports the merge does lazily
    import pandas  # noqa: F401  (pyarrow imports it at the first pa.array)

    import mlm_core.sampling  # noqa: F401
    import mlm_core.shards.merge  # noqa: F401
    from mlm_core.shards.parts import cached_tokenizer
    cached_tokenizer(Path(up["tokenizer"].path) / "tokenizer.json")
    t0, c0 = time.perf_counter(), time.process_time()
    m = merge_shards(lc, up, parts, results, [Path(d) for d in dirs], dest, serial=serial)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    out_bytes = sum(s["bytes"] for s in m["shards"])
    shutil.rmtree(dest, ignore_errors=True)
    print(json.dumps({"seconds": secs, "cpu": cpu, "shards": m["shards"], "files": len(m["shards"]),
                      "out_bytes": out_bytes, "rows": m["counts"]["rows"], "tokens": m["counts"]["tokens"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=32, help="times each language's partitions are listed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--out", default="/tmp/mlm-merge-bench")
    ap.add_argument("--job", nargs=2, metavar=("VARIANT", "TAG"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    out = Path(a.out)
    if a.job and a.job[0] == "calibrate":
        return calibrate([int(w) for w in a.workers.split(",")])
    if a.job:
        return job(out, a.copies, *a.job)
    out.mkdir(parents=True, exist_ok=True)
    prep = prepare(out)
    mb = prep["text_bytes"] * a.copies / MB
    variants = ["one-pass"] + a.workers.split(",")
    secs: dict[str, list[float]] = {v: [] for v in variants}
    busy: dict[str, list[float]] = {v: [] for v in variants}
    ref, info = None, {}
    load0, psi0 = os.getloadavg(), cpu_pressure()
    calib: dict[str, list[float]] = {}
    for r in range(a.rounds):
        res = run_measured([sys.executable, __file__, "--workers", a.workers, "--job", "calibrate", "-"])
        for w in a.workers.split(","):
            calib.setdefault(w, []).append(res[w])
        for v in variants:
            res = run_measured([sys.executable, __file__, "--out", str(out), "--copies", str(a.copies),
                                "--job", v, f"{v}-{r}"])
            ref = ref or res["shards"]
            if res["shards"] != ref:
                raise SystemExit(f"merge variant {v}: the shard table differs from the one-pass merge's")
            secs[v].append(res["seconds"])
            busy[v].append(res["cpu"] / res["seconds"])
            info = res
            print(f"round {r + 1}, {v}: {res['seconds']:.2f} s", file=sys.stderr)
    load1, psi1 = os.getloadavg(), cpu_pressure()
    med = {v: statistics.median(s) for v, s in secs.items()}
    base = med[variants[1]]
    rows = [[v if v == "one-pass" else f"{v} worker{'s' if v != '1' else ''}",
             " / ".join(f"{s:.2f}" for s in secs[v]), f"{med[v]:.2f}", f"{mb / med[v]:.1f}",
             f"{base / med[v]:.2f}", f"{med['one-pass'] / med[v]:.2f}", f"{statistics.median(busy[v]):.2f}"]
            for v in variants]
    print(f"\nmerge of {mb:.0f} MB of text ({prep['text_bytes'] / MB:.2f} MB x {a.copies}; {len(LANGS)} languages; "
          f"{info['files']} files, {info['rows']:,} rows, {info['out_bytes'] / MB:.0f} MB of shards); "
          f"{os.cpu_count()} CPUs; load average {load0[0]:.1f} before, {load1[0]:.1f} after; CPU pressure (PSI some "
          f"avg60) {psi0} before, {psi1} after\n")
    print(table(["merge", "seconds per round", "median s", "MB text/s", "x 1 worker", "x one-pass", "CPU s / s"],
                rows))
    print("\nCPU s / s: the merge process's CPU time over its wall time (median): how many cores it kept busy.")
    cal = {w: statistics.median(s) for w, s in calib.items()}
    one = cal[a.workers.split(",")[0]]
    print(f"calibration, a GIL-free numpy job (8 sorts of 2M floats) on {a.workers} threads in the same rounds: "
          + ", ".join(f"{w} thread{'s' if w != '1' else ''} {one / t:.2f}x" for w, t in cal.items())
          + " (the speed-up the machine allowed)")
    print("\nevery variant's shard table (every file's sha256) equal to the one-pass merge's: yes")


if __name__ == "__main__":
    main()
