"""Benchmark: training-step tokens/s and peak memory of global vs local/global attention at seq_len 512 / 1024 / 2048.

Not a test; prints a Markdown table. Each (attention, seq_len) runs in its own fresh interpreter
(``common.run_measured``); torch has no CPU allocator statistics, so memory is the process's peak RSS
(``ru_maxrss``), the one figure that counts every tensor the step keeps alive. The table's memory is the part
that grows with seq_len: peak RSS at T minus the peak RSS of the same variant's step at seq_len 64 (which
holds torch, the model, the optimizer-free gradients and the kernels' fixed workspaces), so the ratios
between lengths compare what the sequence length costs, not the interpreter.

    .venv/bin/python benchmarks/long_context.py                 # ~2-4 min on 2 busy cores
    .venv/bin/python benchmarks/long_context.py --seqs 512,1024 --steps 2

Step = forward (MLM head on the ~15 % masked positions) + backward of ``MLMEncoder`` on packed rows (two
documents per row, so every variant runs with its segment mask, as in training), dropout on.

Variants (same weights' shapes; ``--window`` 128, ``--layers`` 6):
  global        BERT: every layer attends to the whole row; scores B x heads x T^2 per layer
  local_global  sliding window in all layers but every ``--global-every``-th (3: ModernBERT's one in three)
  local         sliding window in every layer (global_every > layers): the local layers' own growth
Memory ratios 1024/512 and 2048/1024: quadratic attention memory -> towards 4x per doubling once scores
dominate; linear -> 2x. local_global lies between: its global layers stay quadratic.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

VOCAB = 2000       # small: embeddings and the head must not hide the attention's memory
MODES = {"global": {}, "local_global": {"attention": "local_global"}, "local": {"attention": "local_global"}}


def child(a) -> None:
    import torch
    from mlm_core.config import ModelConfig
    from mlm_core.model import MLMEncoder, resolve_arch
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    extra = dict(MODES[a.mode])
    if extra:
        extra |= {"window": a.window, "global_every": a.layers + 1 if a.mode == "local" else a.global_every}
    cfg = ModelConfig(size="tiny", layers=a.layers, hidden=a.hidden, heads=a.heads, ffn=4 * a.hidden,
                      max_positions=max(a.seq, a.window), dropout=0.1, **extra)
    model = MLMEncoder(resolve_arch(cfg, VOCAB, 0)).train()
    B, T = a.batch, a.seq
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB, (B, T), generator=g)
    seg = torch.ones(B, T, dtype=torch.long)
    seg[:, T // 3:] = 2                                     # two packed documents per row
    labels = torch.where(torch.rand(B, T, generator=g) < 0.15, ids, -100)
    times = []
    for i in range(a.steps + 1):            # step 0: warm-up (allocator, kernels), not timed; --steps 0: memory only
        t0 = time.perf_counter()
        out = model(ids, seg, labels=labels)
        out["loss"].backward()
        model.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - t0)
    best = min(times) if times else None          # best of the timed steps: the least disturbed by other load
    print(json.dumps({"step_s": best, "tokens_per_s": B * T / best if best else None}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqs", default="512,1024,2048")
    p.add_argument("--modes", default="global,local_global,local")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--global-every", type=int, default=3)
    p.add_argument("--steps", type=int, default=2, help="timed steps per configuration (after one warm-up)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per job (1: steady on a shared machine)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="global", help=argparse.SUPPRESS)
    p.add_argument("--seq", type=int, default=512, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a)
    from common import run_measured, table
    seqs = [int(s) for s in a.seqs.split(",")]
    modes = a.modes.split(",")
    common = ["--layers", str(a.layers), "--hidden", str(a.hidden), "--heads", str(a.heads), "--batch", str(a.batch),
              "--window", str(a.window), "--global-every", str(a.global_every), "--threads", str(a.threads)]
    env = {"OMP_NUM_THREADS": str(a.threads), "HF_HUB_OFFLINE": "1"}
    # memory jobs (one step, untimed) under glibc's fixed mmap threshold: every block above 64 KiB is mapped on
    # its own and unmapped when freed, so peak RSS follows the peak of live tensors; with the default (dynamic,
    # up to 32 MiB) threshold freed 8-32 MiB score tensors go back to the heap, whose fragmentation added
    # ~200 MiB of noise at seq 512 here. Speed jobs keep the default allocator (a mmap per tensor costs time).
    mem_env = {**env, "MALLOC_MMAP_THRESHOLD_": "65536"}

    def job(mode: str, seq: int, steps: int) -> dict:
        cmd = [sys.executable, __file__, "--child", "--mode", mode, "--seq", str(seq), "--steps", str(steps), *common]
        return run_measured(cmd, env=env if steps else mem_env)

    t_start = time.perf_counter()
    base = {mode: job(mode, 64, 0)["ru_maxrss_children"] for mode in modes}    # the fixed part of a step
    res = {}
    for seq in seqs:
        for mode in modes:
            r = job(mode, seq, a.steps)
            res[mode, seq] = {"tok_s": r["tokens_per_s"], "mem": job(mode, seq, 0)["ru_maxrss_children"] - base[mode]}
            print(f"  {mode:>12} seq {seq:>5}: {r['tokens_per_s']:8.0f} tok/s, step memory "
                  f"{res[mode, seq]['mem'] / 2**20:7.1f} MiB", file=sys.stderr, flush=True)
    print(f"\nmodel: {a.layers} layers, hidden {a.hidden}, {a.heads} heads, ffn {4 * a.hidden}, vocab {VOCAB}; batch "
          f"{a.batch}; window {a.window}, global every {a.global_every}th layer (local: none); torch threads "
          f"{a.threads}; peak RSS of a seq-64 step (subtracted): "
          f"{', '.join(f'{m} {b / 2**20:.0f} MiB' for m, b in base.items())}; {time.perf_counter() - t_start:.0f} s\n")
    rows = []
    for mode in modes:
        row = [mode]
        for seq in seqs:
            r = res[mode, seq]
            row += [f"{r['tok_s']:,.0f}", f"{r['mem'] / 2**20:,.0f}"]
        for lo, hi in zip(seqs, seqs[1:]):
            row.append(f"{res[mode, hi]['mem'] / max(res[mode, lo]['mem'], 1):.2f}x")
        rows.append(row)
    headers = ["attention"] + [h for s in seqs for h in (f"tok/s {s}", f"MiB {s}")] + \
        [f"mem {hi}/{lo}" for lo, hi in zip(seqs, seqs[1:])]
    print(table(headers, rows))
    print("\nMiB = peak RSS of the step's process minus that of the same variant's seq-64 step (MiB = 2^20 bytes); "
          "tok/s = best of the timed forward + backward steps; quadratic attention memory -> towards 4x per doubling, "
          "linear -> 2x")


if __name__ == "__main__":
    main()
