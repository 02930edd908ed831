"""Roofline: this machine's limits, and every stage as a fraction of the limit that bounds it (Markdown table).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/roofline.py                 # 20 MB corpus, a few minutes
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/roofline.py --mb 5 --steps 3   # quicker
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/roofline.py --compile        # + the compiled training step

Limits, measured first in this process:
  matmul   fp32 ``torch.mm`` of two n x n matrices (n = 2048), best of 5: FLOP/s (``train_throughput.matmul_peak``)
  copy     ``np.copyto`` of a 256 MB buffer, best of 5: (bytes read + bytes written) / s, the memory bandwidth
           a streaming pass can use
  read+write  the raw corpus files read and written to a scratch folder (``shutil.copyfile``): MB/s of text,
           what a pass over the files costs with no work (page cache; the files were just written)
  encode   ``Tokenizer.encode_batch`` (the pipeline's tokenizer, rayon threads, batches of 2000 documents) over
           the normalized documents: MB/s of text and tokens/s, with nothing packed or written
Stages, run in this process on a generated corpus (``common.write_corpus``, 6 languages) through
``mlm_core.stages.execute`` (normalize, tokenizer: BPE 8000, shards: seq 128), then:
  normalize  MB/s of raw text            / read+write MB/s
  shards     content tokens/s            / encode tokens/s
  train      FLOP/s = ``MLMEncoder.flops_per_token`` x tokens/s of one eager training step (``small``, seq 128,
             batch 16, AdamW; ``train_throughput.bench_ours``), compiled too with --compile / matmul FLOP/s
  evaluate   tokens/s of the evaluation forward (eval mode, no grad, masked positions scored: the intrinsic
             evaluation's call) on validation rows; FLOP/s = tokens/s x flops_per_token / 3 (forward only)
             / matmul FLOP/s
Each ratio says how far a stage is from the hardware bound it cannot beat; the table is the README's.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from common import MB, table, write_corpus  # noqa: E402


def copy_bandwidth(nbytes: int = 256 * 2**20, reps: int = 5) -> float:
    import numpy as np
    src = np.ones(nbytes // 8, np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best


def file_copy_rate(files: list[Path], scratch: Path, reps: int = 3) -> float:
    scratch.mkdir(parents=True, exist_ok=True)
    total = sum(f.stat().st_size for f in files)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for i, f in enumerate(files):
            shutil.copyfile(f, scratch / f"{i}.txt")
        best = min(best, time.perf_counter() - t)
    shutil.rmtree(scratch)
    return total / MB / best


def encode_rate(tok_file: Path, docs_dir: Path) -> tuple[float, float]:
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    from mlm_core.shards.encode import prepare_tokenizer
    tok = prepare_tokenizer(Tokenizer.from_file(str(tok_file)))
    texts = [t for f in sorted(docs_dir.glob("*.parquet")) for t in pq.read_table(f, columns=["text"]).column(0).to_pylist()]
    nbytes = sum(len(t.encode()) for t in texts)
    t0 = time.perf_counter()
    n = 0
    for i in range(0, len(texts), 2000):
        n += sum(len(e) for e in tok.encode_batch(texts[i:i + 2000], add_special_tokens=False))
    dt = time.perf_counter() - t0
    return nbytes / MB / dt, n / dt


def eval_rate(shards_path: Path, arch, batch: int, batches: int) -> float:
    import numpy as np
    import torch

    from mlm_core.config import MaskingConfig
    from mlm_core.masking import Masker
    from mlm_core.model import MLMEncoder
    from mlm_core.shards import ShardDataset
    ds = ShardDataset(shards_path, verify="off")
    sp = {r: e["id"] for r, e in ds.manifest["special_tokens"].items()}
    masker = Masker(MaskingConfig(), arch.vocab_size, sorted(sp.values()), sp["mask"], 0, 1, unk_id=sp.get("unk"))
    model = MLMEncoder(arch).eval()
    lang = max(ds.languages("validation"), key=lambda lg: len(ds.input_ids("validation", lg)))
    n = len(ds.input_ids("validation", lang))
    b = ds.get_batch("validation", lang, np.arange(batch) % n)
    m = masker(b["input_ids"], b["word_start"], 0, generator=torch.Generator().manual_seed(0))
    seg = b["segment_ids"].to(torch.int32)
    with torch.no_grad():
        model(m.input_ids, seg, m.labels)                    # warm-up
        t0 = time.perf_counter()
        for _ in range(batches):
            model(m.input_ids, seg, m.labels)
        dt = time.perf_counter() - t0
    return batch * ds.seq_len * batches / dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=20, help="raw corpus size (MB)")
    ap.add_argument("--out", default="bench-out/roofline")
    ap.add_argument("--size", default="small", choices=["tiny", "small", "base"], help="model size for train/evaluate")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5, help="timed training steps (after 2 warm-up steps)")
    ap.add_argument("--compile", action="store_true", help="also the compiled training step (~1 min compile)")
    ap.add_argument("--markdown", help="also write the table to this file")
    args = ap.parse_args(argv)
    import torch

    import train_throughput as tt
    from mlm_core import stages
    from mlm_core.config.io import load_config
    root = Path(args.out).resolve()
    root.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()

    # ---------------------------------------------------------------- limits
    cpu = torch.device("cpu")
    matmul = tt.matmul_peak(cpu, torch.float32, 2048, reps=5)
    copy = copy_bandwidth()
    print(f"matmul fp32 {matmul / 1e9:,.1f} GFLOP/s, memory copy {copy / 1e9:,.2f} GB/s "
          f"({torch.get_num_threads()} torch threads, {os.cpu_count()} cores)", flush=True)
    meta = write_corpus(root, args.mb, log=lambda *a, **k: None)
    files = [Path(f) for fs in meta["files"].values() for f in fs]
    rw = file_copy_rate(files, root / "copy-scratch")
    print(f"corpus {meta['bytes'] / MB:.1f} MB; read+write {rw:,.0f} MB/s", flush=True)

    # ---------------------------------------------------------------- stages
    work = root / "work"
    shutil.rmtree(work, ignore_errors=True)
    lc = load_config(raw={"name": "roofline", "workdir": str(work),
                          "sources": {lang: {"paths": fs} for lang, fs in meta["files"].items()},
                          "normalize": {"workers": 2, "min_chars": 5},
                          "tokenizer": {"algorithm": "bpe", "vocab_size": 8000},
                          "shards": {"seq_len": 128, "workers": 2}})
    seconds, arts = {}, {}
    for st in ("normalize", "tokenizer", "shards"):
        t = time.perf_counter()
        arts[st], _ = stages.execute(lc, st, stages.plan(lc), force=True)
        seconds[st] = time.perf_counter() - t
        print(f"{st}: {seconds[st]:.1f} s", flush=True)
    norm_mbs = meta["bytes"] / MB / seconds["normalize"]
    sm = arts["shards"].manifest
    content = sum(p[f"content_tokens_{s}"] for p in sm["languages"].values() for s in ("train", "validation"))
    shards_tps = content / seconds["shards"]
    enc_mbs, enc_tps = encode_rate(Path(arts["tokenizer"].path) / "tokenizer.json",
                                   Path(arts["normalize"].path) / "docs")
    print(f"encode_batch {enc_mbs:.2f} MB/s, {enc_tps / 1e6:.2f} Mtok/s", flush=True)

    from mlm_core.config import MaskingConfig, ModelConfig
    from mlm_core.masking import Masker
    from mlm_core.model import MLMEncoder, resolve_arch
    from mlm_core.shards import ShardDataset
    vocab = int(sm["vocab_size"])
    arch = resolve_arch(ModelConfig(size=args.size, max_positions=128, dropout=0.1), vocab, 0)
    fpt = MLMEncoder(arch).flops_per_token(128, 0.15)
    ds = ShardDataset(arts["shards"].path, verify="off")
    sp = {r: e["id"] for r, e in sm["special_tokens"].items()}
    lang = max(ds.languages("train"), key=lambda lg: len(ds.input_ids("train", lg)))
    b = ds.get_batch("train", lang, [i % len(ds.input_ids("train", lang)) for i in range(args.batch)])
    m = Masker(MaskingConfig(), vocab, sorted(sp.values()), sp["mask"], 0, 1, unk_id=sp.get("unk"))(
        b["input_ids"], b["word_start"], 0, generator=torch.Generator().manual_seed(0))
    data = (m.input_ids, b["segment_ids"].to(torch.int32), m.labels, b["segment_ids"] != 0)
    t_step = tt.bench_ours(arch, data, cpu, torch.float32, 2, args.steps)
    train_flops = fpt * args.batch * 128 / t_step
    print(f"train step ({args.size}, eager): {t_step:.3f} s, {train_flops / 1e9:,.1f} GFLOP/s", flush=True)
    train_c = None
    if args.compile:
        first: list = []
        t_c = tt.bench_ours(arch, data, cpu, torch.float32, 2, args.steps, compiled=True, first=first)
        train_c = fpt * args.batch * 128 / t_c
        print(f"train step compiled: {t_c:.3f} s (compile {first[0]:.0f} s), {train_c / 1e9:,.1f} GFLOP/s", flush=True)
    ev_tps = eval_rate(Path(arts["shards"].path), arch, args.batch, max(3, args.steps))
    ev_flops = ev_tps * fpt / 3
    print(f"evaluate forward: {ev_tps:,.0f} tokens/s", flush=True)

    # ---------------------------------------------------------------- table
    rows = [
        ["limit: matmul fp32 (torch.mm 2048)", f"{matmul / 1e9:,.1f} GFLOP/s", "-", "-"],
        ["limit: memory copy (np.copyto 256 MB)", f"{copy / 1e9:,.2f} GB/s", "-", "-"],
        ["limit: read+write the raw files", f"{rw:,.0f} MB/s", "-", "-"],
        ["limit: tokenizer encode_batch", f"{enc_mbs:,.2f} MB/s, {enc_tps / 1e6:,.2f} Mtok/s", "-", "-"],
        ["normalize", f"{norm_mbs:,.1f} MB/s", f"read+write {rw:,.0f} MB/s", f"{norm_mbs / rw:.1%}"],
        ["shards", f"{shards_tps / 1e6:,.2f} Mtok/s", f"encode_batch {enc_tps / 1e6:,.2f} Mtok/s",
         f"{shards_tps / enc_tps:.1%}"],
        [f"train step ({args.size}, seq 128, batch {args.batch}, eager)", f"{train_flops / 1e9:,.1f} GFLOP/s",
         f"matmul {matmul / 1e9:,.1f} GFLOP/s", f"{train_flops / matmul:.1%}"],
    ]
    if train_c:
        rows.append([f"train step ({args.size}, compiled)", f"{train_c / 1e9:,.1f} GFLOP/s",
                     f"matmul {matmul / 1e9:,.1f} GFLOP/s", f"{train_c / matmul:.1%}"])
    rows.append([f"evaluate forward ({args.size})", f"{ev_tps:,.0f} tokens/s = {ev_flops / 1e9:,.1f} GFLOP/s",
                 f"matmul {matmul / 1e9:,.1f} GFLOP/s", f"{ev_flops / matmul:.1%}"])
    head = (f"{os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads); corpus "
            f"{meta['bytes'] / MB:.0f} MB (6 languages), vocab {vocab}; {time.perf_counter() - t_all:.0f} s\n")
    md = head + "\n" + table(["what", "measured", "bound", "fraction of bound"], rows, align="llll") + "\n"
    print("\n" + md)
    (root / "roofline.md").write_text(md)
    (root / "roofline.json").write_text(json.dumps({
        "matmul_flops": matmul, "copy_bytes_per_s": copy, "rw_mb_s": rw, "encode_mb_s": enc_mbs,
        "encode_tokens_s": enc_tps, "normalize_mb_s": norm_mbs, "shards_tokens_s": shards_tps,
        "train_flops": train_flops, "train_compiled_flops": train_c, "eval_tokens_s": ev_tps,
        "seconds": seconds}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
