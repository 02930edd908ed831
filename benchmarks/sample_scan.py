"""Benchmark: the tokenizer stage's scan of the corpus (its language-balanced training sample), per GB.

Not a test; prints a table. The tokenizer trains on a sample of at most ``tokenizer.sample_mb`` (a fixed cost),
but drawing that sample reads every document's hash, twice per language (``mlm_core/tokenizer/sample.py``:
the held-out threshold, then the draw), so its cost grows with the corpus. It ran on one core in the driver:
at 100 GB it is the one serial part of the data stages that grows with the input (docs/SCALING.md).

Input: a normalize-like ``docs/<lang>.parquet`` folder (the stage's schema, zstd, md5 hex per document) of
``--mb`` MB of generated text in 6 languages (``benchmarks/common.py``), written once under ``--out``.
Measured, interleaved round by round in this one process (the machine's load hits both alike; the Parquet files
are in the page cache after the first round): ``train_sample`` (alpha 0.3, sample_mb 20, 100 held-out
documents per language) with

  (a) **per-document parse** (the named baseline, the code before this benchmark: ``int(h[:16], 16)`` for every
      document, three times per document), patched in;
  (b) **vectorized** (``hash_prefix64``: the 16 leading hex digits gathered from the Arrow buffer, decoded in
      numpy, once per document and pass).

Both must draw the same sample (same texts, held-out documents and summary), or the benchmark fails.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/sample_scan.py --mb 200 --rounds 5
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from common import MB, _lines, table  # noqa: E402

LANGS = ("en", "fr", "ru", "hi", "zh", "ar")
SHARES = {"en": 0.4, "fr": 0.2, "ru": 0.15, "hi": 0.1, "zh": 0.1, "ar": 0.05}   # sizes differ, as real corpora


def write_docs(root: Path, total_mb: float) -> tuple[dict, dict, int]:
    """docs/<lang>.parquet as normalize writes them; returns (chars, bytes) per language and the document count."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from mlm_core.normalize.stage import DOC_SCHEMA
    docs = root / "docs"
    marker = root / "complete"
    chars, nbytes, n_docs = {}, {}, 0
    if not marker.exists():
        docs.mkdir(parents=True, exist_ok=True)
    for p, lang in enumerate(LANGS):
        path = docs / f"{lang}.parquet"
        if not marker.exists():
            w = pq.ParquetWriter(path, DOC_SCHEMA, compression="zstd")
            buf: list[str] = []
            i = 0

            def flush():
                nonlocal buf, i
                w.write_table(pa.table({"doc_id": [(p << 32) | (i + k) for k in range(len(buf))],
                                        "lang": [lang] * len(buf), "text": buf,
                                        "n_chars": [len(t) for t in buf],
                                        "hash": [hashlib.md5(t.encode()).hexdigest() for t in buf]},
                                       schema=DOC_SCHEMA))
                i += len(buf)
                buf = []
            for line in _lines(lang, int(SHARES[lang] * total_mb * MB), seed=0):
                buf.append(line)
                if len(buf) == 65_536:
                    flush()
            if buf:
                flush()
            w.close()
        t = pq.read_table(path, columns=["n_chars", "text"])
        import pyarrow.compute as pc
        chars[lang] = int(pc.sum(t.column("n_chars")).as_py())
        nbytes[lang] = int(pc.sum(pc.binary_length(t.column("text"))).as_py())
        n_docs += t.num_rows
    marker.touch()
    return chars, nbytes, n_docs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200, help="corpus size in MB of text (default 200)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("/tmp/mlm-sample-scan-bench"))
    args = ap.parse_args()
    import numpy as np
    from mlm_core.tokenizer import sample as sample_mod

    root = args.out / f"{args.mb:g}MB"
    t0 = time.perf_counter()
    chars, nbytes, n_docs = write_docs(root, args.mb)
    print(f"corpus: {sum(nbytes.values()) / MB:.1f} MB, {n_docs:,} documents in {root} "
          f"({time.perf_counter() - t0:.0f} s to write or read back)", flush=True)
    fast_fn = sample_mod.hash_prefix64

    def slow_fn(hashes):
        return np.array([int(h[:16], 16) for h in hashes.to_pylist()], dtype=np.uint64)

    variants = {"per-document parse (before)": slow_fn, "vectorized (hash_prefix64)": fast_fn}
    times: dict[str, list[float]] = {k: [] for k in variants}
    results = {}
    for r in range(args.rounds):
        for name, fn in variants.items():
            sample_mod.hash_prefix64 = fn
            t = time.perf_counter()
            s = sample_mod.train_sample(root, chars, 0.3, 20.0, 100, seed=0, byte_counts=nbytes)
            times[name].append(time.perf_counter() - t)
            results[name] = (s.texts, s.heldout, s.summary())
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
    sample_mod.hash_prefix64 = fast_fn
    same = len({repr(v) for v in results.values()}) == 1
    gb = sum(nbytes.values()) / 1e9
    base = statistics.median(times["per-document parse (before)"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append([name, f"{med:.2f}", f"{med / gb:.2f}", f"{sum(nbytes.values()) / MB / med:.0f}",
                     f"{base / med:.2f}", f"{min(ts):.2f}-{max(ts):.2f}"])
    print()
    print(table(["train_sample", "median s", "s per GB", "MB/s", "x before", "range s"], rows))
    print(f"\nsame sample (texts, held-out, summary): {'yes' if same else 'NO'}; load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
