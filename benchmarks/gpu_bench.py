"""GPU training-step benchmark (``benchmarks/gpu.sh`` runs it): our step vs HF ``BertForMaskedLM`` (SDPA) at the
same shape, eager and compiled, at ``base`` size in bf16, seq 128 and 512; tokens/s and MFU against the device's
bf16 peak. Results go to ``<out>/gpu_results.json`` and ``<out>/gpu_results.md`` (and stdout).

    bash benchmarks/gpu.sh                     # on a CUDA machine: < 5 min of device time
    bash benchmarks/gpu.sh --dry-run           # CPU, tiny model, seconds: the same code path end to end

Per (seq, variant), median seconds per step over ``--steps`` steps after ``--warmup`` (the first warm-up call,
which compiles, is reported apart): the step functions are ``benchmarks/train_throughput.py``'s ``bench_ours``
(MLMEncoder, head on the masked positions; compiled = ``mlm_core.train.compiled.CompiledForward``, the
``pretrain.compile`` graph) and ``bench_hf`` (BertForMaskedLM, attn_implementation="sdpa", head on every position;
compiled = ``torch.compile(model)``), forward + backward + fused AdamW. The batch: ``--tokens`` tokens per step
(batch = tokens / seq), Zipf ids, 1-3 documents per row, 15 % token masking (``mlm_core.masking.Masker``).

MFU = model FLOPs per token (``MLMEncoder.flops_per_token``: 6 x weights + attention + the head on the
masked share, the same count for both, so the MFU ratio is the throughput ratio) x tokens/s / peak, where peak
is the device's dense bf16 tensor-core figure from ``PEAK_BF16`` (by device name; ``--peak-tflops`` overrides),
also shown against the bf16 matmul rate measured here. Target: >= 40 % MFU at seq 128.
A time budget (``--budget-s``) skips the remaining variants rather than run past the device time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

# dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, from the vendors' data sheets; first match on the name wins
PEAK_BF16 = (("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("GH200", 989.4), ("B200", 2250.0),
             ("A100", 312.0), ("L40S", 362.1), ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0), ("V100", 125.0))


def device_peak(name: str) -> float | None:
    for key, tflops in PEAK_BF16:
        if key in name:
            return tflops * 1e12
    return None


def make_batch(arch, batch: int, seq: int, device, seed: int = 0):
    """(ids, segment ids, labels, attention mask) of one training micro-batch, on ``device``."""
    import numpy as np
    import torch

    from mlm_core.config import MaskingConfig
    from mlm_core.masking import Masker
    rng = np.random.default_rng(seed)
    V = arch.vocab_size
    ids = np.minimum(rng.zipf(1.2, size=(batch, seq)) + 4, V - 1)
    ids[:, 0] = 2                                                    # [CLS]
    seg = np.ones((batch, seq), np.int64)
    for r in range(batch):                                           # 1-3 documents per row
        cuts = np.sort(rng.integers(seq // 4, seq, size=rng.integers(0, 3)))
        for c in cuts:
            ids[r, c - 1] = 3                                        # [SEP] ends the document before the cut
            seg[r, c:] += 1
    ws = torch.from_numpy(rng.random((batch, seq)) < 0.7)
    masker = Masker(MaskingConfig(), V, [0, 1, 2, 3, 4], 4, 0, 1, unk_id=1)
    m = masker(torch.from_numpy(ids), ws, 0, generator=torch.Generator().manual_seed(seed))
    seg_t = torch.from_numpy(seg).to(torch.int32)
    return (m.input_ids.to(device), seg_t.to(device), m.labels.to(device), torch.ones_like(seg_t).to(device))


def run(args) -> dict:
    import torch

    import train_throughput as tt
    from mlm_core.config import ModelConfig
    from mlm_core.model import MLMEncoder, resolve_arch
    from mlm_core.train.compiled import compile_support
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"
    peak = args.peak_tflops * 1e12 if args.peak_tflops else device_peak(name) if device.type == "cuda" else None
    t_start = time.perf_counter()
    measured = tt.matmul_peak(device, dtype, 8192 if device.type == "cuda" else 1024, reps=5)
    peak = peak or measured
    why_not = compile_support(device)
    res = {"device": name, "dtype": args.dtype, "size": args.size, "tokens_per_step": args.tokens,
           "peak_flops": peak, "peak_source": "--peak-tflops" if args.peak_tflops else (
               "data sheet" if device.type == "cuda" and device_peak(name) else "measured matmul"),
           "measured_matmul_flops": measured, "torch": torch.__version__, "compile": why_not or "available",
           "rows": [], "seconds": 0.0}
    print(f"{name}, torch {torch.__version__}, {args.size} {args.dtype}; peak {peak / 1e12:,.1f} TFLOP/s "
          f"({res['peak_source']}), measured {args.dtype} matmul {measured / 1e12:,.1f} TFLOP/s; compile: "
          f"{res['compile']}", flush=True)
    for i_seq, seq in enumerate(int(s) for s in args.seqs.split(",")):
        # eager rows first after the first shape: each compile costs ~1 min, the budget may not cover them all
        variants = [("ours", False), ("ours", True), ("hf", False), ("hf", True)] if i_seq == 0 else \
            [("ours", False), ("hf", False), ("ours", True), ("hf", True)]
        B = max(1, args.tokens // seq)
        arch = resolve_arch(ModelConfig(size=args.size, max_positions=max(512, seq), dropout=0.1), args.vocab, 0)
        fpt = MLMEncoder(arch).flops_per_token(seq, 0.15)
        data = make_batch(arch, B, seq, device)
        for who, compiled in variants:
            row = {"seq": seq, "batch": B, "impl": who, "compiled": compiled, "flops_per_token": fpt}
            if compiled and (args.no_compile or why_not):
                row["skipped"] = "--no-compile" if args.no_compile else why_not
            elif who == "hf" and args.no_hf:
                row["skipped"] = "--no-hf"
            elif time.perf_counter() - t_start > args.budget_s:
                row["skipped"] = f"time budget {args.budget_s:.0f} s spent"
            else:
                first: list = []
                fn = tt.bench_ours if who == "ours" else tt.bench_hf
                try:
                    step = fn(arch, data, device, dtype, compiled=compiled)     # one training step, a closure
                    t = tt.time_steps(step, device, args.warmup, args.steps, first=first)
                except Exception as e:       # an OOM or a compile failure must not lose the other rows
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    t = None
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                if t:
                    tok_s = B * seq / t
                    row.update(step_s=t, tokens_per_s=tok_s, mfu=fpt * tok_s / peak,
                               of_measured=fpt * tok_s / measured, first_call_s=first[0] if first else None)
            res["rows"].append(row)
            res["seconds"] = time.perf_counter() - t_start
            save(res, Path(args.out))            # after every row: a run cut short still leaves its results
            print("  " + json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}),
                  flush=True)
    return res


def save(res: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_results.json").write_text(json.dumps(res, indent=1))
    (out / "gpu_results.md").write_text(markdown(res))


def markdown(res: dict) -> str:
    lines = [f"{res['device']}, torch {res['torch']}, size {res['size']}, {res['dtype']}, "
             f"{res['tokens_per_step']} tokens/step; MFU vs {res['peak_flops'] / 1e12:,.1f} TFLOP/s "
             f"({res['peak_source']}); measured matmul {res['measured_matmul_flops'] / 1e12:,.1f} TFLOP/s", "",
             "| seq | batch | step | compiled | tokens/s | MFU | of measured matmul | s/step | first call s |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        who = "ours" if r["impl"] == "ours" else "HF BertForMaskedLM (sdpa)"
        if "tokens_per_s" in r:
            lines.append(f"| {r['seq']} | {r['batch']} | {who} | {'on' if r['compiled'] else 'off'} | "
                         f"{r['tokens_per_s']:,.0f} | {r['mfu']:.1%} | {r['of_measured']:.1%} | {r['step_s']:.4f} | "
                         f"{r['first_call_s'] or 0:.1f} |")
        else:
            lines.append(f"| {r['seq']} | {r['batch']} | {who} | {'on' if r['compiled'] else 'off'} | "
                         f"{r.get('skipped') or r.get('error')} | | | | |")
    by = {(r["seq"], r["impl"], r["compiled"]): r.get("tokens_per_s") for r in res["rows"]}
    lines.append("")
    for seq in sorted({r["seq"] for r in res["rows"]}):
        best = max(((c, by.get((seq, "ours", c))) for c in (False, True)), key=lambda x: x[1] or 0)
        hf = max((by.get((seq, "hf", c)) or 0) for c in (False, True))
        if best[1] and hf:
            lines.append(f"seq {seq}: ours (compile {'on' if best[0] else 'off'}) / best HF = {best[1] / hf:.2f}x")
    r128 = [r for r in res["rows"] if r["seq"] == 128 and r["impl"] == "ours" and "mfu" in r]
    if r128:
        m = max(r["mfu"] for r in r128)
        lines.append(f"best MFU at seq 128: {m:.1%}   target >= 40 %   {'OK' if m >= 0.40 else 'MISS'}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--size", default="base", choices=["tiny", "small", "base"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--seqs", default="128,512")
    ap.add_argument("--tokens", type=int, default=32768, help="tokens per step (batch = tokens / seq)")
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=240.0, help="skip remaining variants past this many seconds")
    ap.add_argument("--peak-tflops", type=float, default=None, help="device bf16 peak (default: PEAK_BF16 by name)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--tiny", action="store_true",
                    help="dry run: tiny model, seq 32,64, 256 tokens/step, fp32, 1+2 steps, no compile (same code path)")
    ap.add_argument("--with-compile", action="store_true", help="with --tiny: the compiled rows too (~2 min on CPU)")
    ap.add_argument("--out", default="bench-out/gpu")
    args = ap.parse_args(argv)
    if args.tiny:
        args.size, args.seqs, args.tokens, args.dtype, args.vocab = "tiny", "32,64", 256, "fp32", 1000
        args.warmup, args.steps = 1, 2
        args.no_compile = args.no_compile or not args.with_compile
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("no CUDA device here (torch.cuda.is_available() is False): run `bash benchmarks/gpu.sh --dry-run` "
                  "for the CPU check", file=sys.stderr)
            return 2
    res = run(args)
    out = Path(args.out)
    save(res, out)
    print("\n" + markdown(res) + f"\nwritten: {out / 'gpu_results.md'}, {out / 'gpu_results.json'} "
          f"({res['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
