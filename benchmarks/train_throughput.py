"""Benchmark: one full training step of our encoder against ``transformers.BertForMaskedLM`` (sdpa), plus the
training loop's masking and data-loading overhead and the achieved share of this machine's matmul peak.

Not a test; prints a table. Needs no download (a synthetic shard set in the real on-disk format is written
to a temporary folder and read through ``ShardDataset`` / ``LanguageSampler`` as in training).

    .venv/bin/python benchmarks/train_throughput.py                          # CPU, small, seq 128, batch 32, fp32
    python benchmarks/train_throughput.py --device cuda --size base --dtype bf16 --batch 64

Measured (median seconds per step over --steps timed steps after --warmup; (a), (a'), (b), (b') are timed in
turn, one step each per round, so the machine's load changes hit all four alike):
  (a) ours   MLMEncoder forward (MLM head on the masked positions only) + backward + AdamW step, eager
  (a') ours compiled: the same through ``mlm_core.train.compiled`` (pretrain.compile: the fixed masked-position
             budget graph, torch.compile fullgraph, static shapes) and the fused AdamW kernel, as the loop runs it
  (b) hf     BertForMaskedLM(attn_implementation="sdpa") at the same shape and vocab (head on every position)
  (b') hf compiled: ``torch.compile(model)`` of the same (loss inside the graph), fused AdamW as (a')
  AdamW: foreach in the eager rows (the loop's CPU optimizer), fused in the compiled ones (``opt_kw``)
  (c) loop   ``mlm_core.train.loop.train`` end to end: tokens/s, % of step time drawing rows (data wait) and masking
  (d) peak   a large torch.mm in fp32 (bf16 on --dtype bf16): FLOP/s this process can reach; achieved = model
             FLOPs/token (``MLMEncoder.flops_per_token``) x tokens/s
Targets: (a') >= 3x (b) and >= 2x (b') tokens/s; (a') >= 70 % of (d); masking < 1 %; data wait < 1 %
(MFU vs 989e12 on GPU). Compile time (first call, forward + backward) is reported apart, not in the step time.
--no-compile skips (a') and (b').
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, reps: int = 10) -> float:
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / min(times)


def synthetic_shards(root: Path, vocab: int, seq_len: int, rows: int, langs=("en", "fr", "ru")) -> Path:
    """Arrow IPC shards in the shards-stage layout (Zipf token ids, 1-3 documents per row, word starts)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from mlm_core.shards import segment_dtype, shard_schema, token_dtype
    from mlm_core.store import sha256_file
    rng = np.random.default_rng(0)
    ids_t, seg_t = token_dtype(vocab), segment_dtype(seq_len)
    schema = shard_schema(seq_len, ids_t, seg_t)
    shards = []
    for split, n in (("train", rows), ("validation", max(64, rows // 50))):
        (root / split).mkdir(parents=True, exist_ok=True)
        for lang in langs:
            ids = np.minimum(rng.zipf(1.2, size=(n, seq_len)) + 4, vocab - 1).astype(ids_t)
            seg = np.ones((n, seq_len), seg_t)
            cut = rng.integers(seq_len // 3, seq_len, size=n)
            seg[np.arange(seq_len)[None, :] >= cut[:, None]] = 2
            ids[:, 0] = 2
            ws = (rng.random((n, seq_len)) < 0.7).astype(np.uint8)
            cols = [pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), seq_len) for a in (ids, seg, ws)]
            rel = f"{split}/{lang}-00000.arrow"
            with ipc.new_stream(str(root / rel), schema) as w:
                w.write_batch(pa.record_batch(cols, schema=schema))
            shards.append({"file": rel, "split": split, "lang": lang, "rows": n,
                           "bytes": (root / rel).stat().st_size, "sha256": sha256_file(root / rel)})
    manifest = {"seq_len": seq_len, "vocab_size": vocab, "shards": shards, "tokenizer_fingerprint": "synthetic",
                "special_tokens": {r: {"token": f"[{r.upper()}]", "id": i}
                                   for i, r in enumerate(("pad", "unk", "cls", "sep", "mask"))},
                "sampling": {"table": [{"lang": lg, "p": 1 / len(langs)} for lg in langs]}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def batch(ds, B: int, device: torch.device, masker) -> tuple:
    b = ds.get_batch("train", "en", np.arange(B))
    m = masker(b["input_ids"], b["word_start"], 0, generator=torch.Generator().manual_seed(0))
    return (m.input_ids.to(device), b["segment_ids"].to(device, torch.int32), m.labels.to(device),
            (b["segment_ids"] != 0).to(device))


def time_steps(step, device, warmup: int, steps: int, first: list | None = None) -> float:
    """Median step time; ``first`` (a list) receives the first warm-up call's seconds (the compile)."""
    for i in range(warmup):
        t0 = time.perf_counter()
        step()
        sync(device)
        if i == 0 and first is not None:
            first.append(time.perf_counter() - t0)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def opt_kw(device, compiled: bool) -> dict:
    """The loop's AdamW (``optim.build_optimizer``): fused on CUDA and for the compiled step, foreach otherwise;
    HF gets the same one at the same temperature (the optimizer is not what is compared)."""
    return {"fused": True} if device.type == "cuda" or compiled else {"foreach": True}


def round_robin(steps: dict, device, warmup: int, n: int) -> tuple[dict, dict]:
    """({name: median seconds}, {name: first-call seconds}): each step function warmed up (its first call is
    the compile), then timed one step each in turn, ``n`` rounds: on a shared machine, load changes hit every
    contender alike instead of whichever happened to run then."""
    first = {}
    for name, step in steps.items():
        for i in range(warmup):
            t0 = time.perf_counter()
            step()
            sync(device)
            if i == 0:
                first[name] = time.perf_counter() - t0
        print(f"{name}: warm (first step {first[name]:.1f} s)", flush=True)
    times = {name: [] for name in steps}
    for _ in range(n):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}, first


def bench_ours(arch, data, device, dtype, compiled=False):
    """A closure running one training step of ours."""
    from mlm_core.config import MaskingConfig
    from mlm_core.model import MLMEncoder
    from mlm_core.train.compiled import CompiledForward
    ids, seg, labels, _ = data
    model = MLMEncoder(arch).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **opt_kw(device, compiled))
    ac = torch.autocast("cuda", dtype=torch.bfloat16) if dtype == torch.bfloat16 else None
    n_sel = int((labels != -100).sum())
    fwd = CompiledForward("mlm", MaskingConfig(), *ids.shape, device) if compiled else None

    def step():
        with ac if ac else torch.autocast("cpu", enabled=False):
            loss = fwd(model, ids, seg, labels, 0.0, n_sel)["loss"] if fwd else model(ids, seg, labels)["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def bench_hf(arch, data, device, dtype, compiled=False):
    from transformers import BertConfig, BertForMaskedLM

    from mlm_core.model.hf_layout import hf_config
    ids, _, labels, attn = data
    config = BertConfig(**hf_config(arch), attn_implementation="sdpa")
    model = BertForMaskedLM(config).to(device)
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **opt_kw(device, compiled))
    ac = torch.autocast("cuda", dtype=torch.bfloat16) if dtype == torch.bfloat16 else None
    attn = attn.long()
    fwd = torch.compile(model) if compiled else model

    def step():
        with ac if ac else torch.autocast("cpu", enabled=False):
            loss = fwd(input_ids=ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def bench_loop(size, shards_dir, args) -> dict:
    from mlm_core.config import PretrainConfig
    from mlm_core.shards import ShardDataset
    from mlm_core.train.loop import build_model, train
    n = args.warmup + args.steps
    cfg = PretrainConfig.model_validate({
        "model": {"size": size, "max_positions": max(512, args.seq)}, "steps": n, "batch_size": args.batch,
        "log_every": args.warmup, "eval_every": 10 ** 6, "eval_batches": 1, "checkpoint_every": 10 ** 6,
        "device": args.device, "precision": "bf16" if args.dtype == "bf16" else "fp32"})
    ds = ShardDataset(shards_dir, verify="off")
    model, _ = build_model(cfg, args.vocab, 0)
    recs = []
    with tempfile.TemporaryDirectory() as d:
        train(cfg, ds, model, Path(d), metrics_cb=recs.append)
    steady = [r for r in recs if r["type"] == "train"][-1]          # the window after the warm-up steps
    return steady


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--size", default="small", choices=["tiny", "small", "base"])
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=30000)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled rows (a') and (b')")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    from mlm_core.config import MaskingConfig, ModelConfig
    from mlm_core.masking import Masker
    from mlm_core.model import resolve_arch
    from mlm_core.shards import ShardDataset
    arch = resolve_arch(ModelConfig(size=args.size, max_positions=max(512, args.seq), dropout=0.1), args.vocab, 0)
    tokens = args.batch * args.seq
    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    try:
        shards = synthetic_shards(tmp / "shards", args.vocab, args.seq, rows=max(4 * args.batch, 2048))
        ds = ShardDataset(shards, verify="off")
        masker = Masker(MaskingConfig(), args.vocab, [0, 1, 2, 3, 4], 4, 0, 1, unk_id=1)
        data = batch(ds, args.batch, device, masker)
        print(f"device {args.device} ({torch.get_num_threads()} threads), size {args.size} {arch.layers}x{arch.hidden}, "
              f"vocab {args.vocab}, batch {args.batch} x seq {args.seq}, {args.dtype}", flush=True)
        from mlm_core.model import MLMEncoder
        fpt = MLMEncoder(arch).flops_per_token(args.seq, 0.15)
        peak = matmul_peak(device, dtype, 4096 if device.type == "cpu" else 8192)
        print(f"measured matmul peak ({args.dtype}): {peak / 1e9:,.1f} GFLOP/s", flush=True)
        steps = {"ours": bench_ours(arch, data, device, dtype)}
        if not args.no_compile:
            steps["ours compiled"] = bench_ours(arch, data, device, dtype, compiled=True)
        if not args.skip_hf:
            steps["hf"] = bench_hf(arch, data, device, dtype)
            if not args.no_compile:
                steps["hf compiled"] = bench_hf(arch, data, device, dtype, compiled=True)
        med, first = round_robin(steps, device, args.warmup, args.steps)
        for name, t in med.items():
            print(f"{name}: {t:.3f} s/step", flush=True)
        t_ours, t_ours_c, t_hf, t_hf_c = (med.get(k) for k in ("ours", "ours compiled", "hf", "hf compiled"))
        comp = {"ours": [first["ours compiled"]] if t_ours_c else [], "hf": [first["hf compiled"]] if t_hf_c else []}
        loop = bench_loop(args.size, shards, args)
        # masking cost of one batch, measured on its own too
        b = ds.get_batch("train", "fr", np.arange(args.batch))
        g = torch.Generator().manual_seed(1)
        t_mask = time_steps(lambda: masker(b["input_ids"], b["word_start"], 0, generator=g), torch.device("cpu"), 3, 20)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tps_ours, achieved = tokens / t_ours, fpt * tokens / t_ours
    best = t_ours_c or t_ours
    achieved_c = fpt * tokens / best

    def ratio(num, den):
        return f"{num / den:.2f}x" if num and den else "-"
    rows = [("ours eager tokens/s (fwd+bwd+AdamW)", f"{tps_ours:,.0f}", ""),
            ("ours compiled tokens/s", f"{tokens / t_ours_c:,.0f}" if t_ours_c else "skipped", ""),
            ("HF BertForMaskedLM sdpa eager tokens/s", f"{tokens / t_hf:,.0f}" if t_hf else "skipped", ""),
            ("HF compiled tokens/s", f"{tokens / t_hf_c:,.0f}" if t_hf_c else "skipped", ""),
            ("ours eager / HF eager", ratio(t_hf, t_ours), ""),
            ("ours compiled / ours eager", ratio(t_ours, t_ours_c), ""),
            ("HF compiled / HF eager", ratio(t_hf, t_hf_c), ""),
            ("ours compiled / HF eager", ratio(t_hf, t_ours_c), ">= 3x"),
            ("ours compiled / HF compiled", ratio(t_hf_c, t_ours_c), ">= 2x"),
            ("compile time, ours / HF (first step)",
             f"{comp['ours'][0]:.0f} s / {comp['hf'][0]:.0f} s" if comp["ours"] and comp["hf"] else "-", ""),
            ("loop tokens/s (train(), steady window)", f"{loop['tokens_per_s']:,.0f}", ""),
            ("masking, % of loop step", f"{loop['masking_pct']:.2f} %", "< 1 %"),
            ("masking alone, % of our step", f"{100 * t_mask / t_ours:.2f} %", "< 1 %"),
            ("data wait, % of loop step", f"{loop['data_pct']:.2f} %", "< 1 %"),
            ("model FLOPs/token", f"{fpt / 1e6:,.1f} M", ""),
            ("achieved FLOP/s (ours eager)", f"{achieved / 1e9:,.1f} G", ""),
            ("achieved FLOP/s (ours compiled)", f"{achieved_c / 1e9:,.1f} G" if t_ours_c else "-", ""),
            ("measured matmul peak", f"{peak / 1e9:,.1f} G", ""),
            ("achieved / measured peak (eager)", f"{100 * achieved / peak:.1f} %", ""),
            ("achieved / measured peak (compiled)", f"{100 * achieved_c / peak:.1f} %" if t_ours_c else "-", ">= 70 %"),
            ("loop MFU vs declared peak", f"{100 * loop['mfu']:.2f} %", "")]
    w = max(len(r[0]) for r in rows)
    print()
    for name, val, target in rows:
        print(f"{name:<{w}}  {val:>14}  {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
