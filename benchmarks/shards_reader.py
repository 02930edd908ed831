"""The reader half of ``benchmarks/shards.py``: sequences/s to ready tensors from the shards stage's output
(format v3) and from the same rows re-written in format v2, side by side in one process; bytes per position."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path


def _v2_copy(src: Path, dst: Path) -> Path:
    """The same rows re-written in shard format v2 (uint16/32 ids + uint8 segment ids + uint8 word starts)."""
    from mlm_core.shards.layout import Layout
    from mlm_core.shards.pack import write_rows
    from mlm_core.shards.reader import read_shard_file
    m = json.loads((src / "manifest.json").read_text())
    lay = Layout.from_manifest(m)
    v2 = Layout(lay.seq_len, lay.ids, lay.sep, lay.pad, folded=False, version=2)
    shutil.rmtree(dst, ignore_errors=True)
    shards = []
    for s in m["shards"]:
        rows = read_shard_file(src, s["file"], m)
        write_rows(dst / s["file"], v2, rows["input_ids"], rows["word_start"])
        shards.append({**s, "bytes": (dst / s["file"]).stat().st_size})
    legacy = {k: v for k, v in m.items() if k not in ("format_version", "layout")}
    (dst / "manifest.json").write_text(json.dumps({**legacy, "shards": shards}))
    return dst


def job_reader(root: Path, batch: int = 64, rounds: int = 40, chunk: int = 25) -> dict:
    """Reader throughput, sequences/s to ready tensors, format v3 (as the stage wrote it) vs the same rows in
    format v2, interleaved rounds in one process (best round kept): ``train.feed.Rows.gather`` (what pretrain
    calls: random languages and rows -> int64 ids, int32 segment ids, bool word starts) and
    ``ShardDataset.get_batch`` (one language). Each round times ``chunk`` batches of each (format, reader) in
    turn; the fastest round of each is kept (the machine is shared: the minimum is the least disturbed)."""
    import numpy as np

    from mlm_core.shards import ShardDataset
    from mlm_core.train.feed import Rows
    v3 = root / "ours-w2" if (root / "ours-w2").exists() else next(root.glob("ours-w*"))
    v2 = _v2_copy(v3, root / "ours-v2")
    sets = {name: ShardDataset(path, verify="off") for name, path in (("v2", v2), ("v3", v3))}
    langs = sets["v3"].languages("train")
    sizes = np.array([len(sets["v3"].input_ids("train", lg)) for lg in langs])
    rng = np.random.default_rng(0)
    draws = []
    for _ in range(256):
        li = rng.integers(0, len(langs), batch)
        draws.append((li, (rng.random(batch) * sizes[li]).astype(np.int64)))
    best = {(n, k): 0.0 for n in sets for k in ("gather", "get_batch")}
    for n, ds in sets.items():        # same bytes out, or the comparison means nothing
        a, b = Rows(ds, "train", langs).gather(*draws[0]), Rows(sets["v3"], "train", langs).gather(*draws[0])
        assert all((a[k] == b[k]).all() for k in a), n
    readers = {n: Rows(ds, "train", langs) for n, ds in sets.items()}
    for i in range(rounds):
        for n, ds in sets.items():
            for kind in ("gather", "get_batch"):
                t0 = time.perf_counter()
                for k in range(i * chunk, (i + 1) * chunk):
                    li, r = draws[k % len(draws)]
                    if kind == "gather":
                        readers[n].gather(li, r)
                    else:
                        ds.get_batch("train", langs[k % len(langs)], r % sizes[k % len(langs)])
                best[(n, kind)] = max(best[(n, kind)], chunk * batch / (time.perf_counter() - t0))
    disk = {n: sum(s["bytes"] for s in ds.manifest["shards"]) / (ds.manifest["counts"]["rows"] * ds.seq_len)
            for n, ds in sets.items()}
    return {"batch": batch, "seq_per_s": {f"{n}/{k}": v for (n, k), v in best.items()}, "bytes_per_position": disk}


def print_reader(r: dict) -> None:
    sp, bpp = r["seq_per_s"], r["bytes_per_position"]
    print(f"\nreader: sequences/s to ready tensors (batch {r['batch']}, best round), same rows in both formats\n")
    print("| format | bytes/position on disk | Rows.gather seq/s (pretrain) | get_batch seq/s |")
    print("|---|---:|---:|---:|")
    for n, label in (("v2", "v2: ids + segment ids + word starts"), ("v3", "v3: compact (this code)")):
        print(f"| {label} | {bpp[n]:.3f} | {sp[n + '/gather']:,.0f} | {sp[n + '/get_batch']:,.0f} |")
    print(f"\nv3/v2 reader throughput: gather {sp['v3/gather'] / sp['v2/gather']:.2f}, get_batch "
          f"{sp['v3/get_batch'] / sp['v2/get_batch']:.2f}   target >= 1 (must not drop); "
          f"v3 bytes/position {bpp['v3']:.3f}   target <= 2.5")
