"""Efficiency of a trained encoder: parameters, latency, throughput and peak memory, on a named device.

In: a model folder (``fillmask.load_model_dir``; ELECTRA: the discriminator, the encoder that is deployed and
fine-tuned) or an ``MLMEncoder``. Out (``measure``): {"device", "device_kind", "threads", "parameters",
"weights_mb", "latency_ms": {"p50", "p95", "batch", "seq_len", "repeats"}, "throughput": {"sequences_per_s",
"batch", "seq_len"}, "peak_memory_mb": {"128", "512"}, "memory_batch"}; what it cannot measure is None with a
reason in "skipped" (a length past the model's max_positions).

What is timed: one inference forward of the encoder (``MLMEncoder.encode``: embeddings + blocks, no MLM
head; ``torch.inference_mode``, eval mode) on random non-special ids, after one warm-up pass per shape.
- latency: ``repeats`` passes at batch 1, seq_len 128; p50 / p95 by linear interpolation between order
  statistics (numpy's default percentile).
- throughput: batch 32 x seq_len 128, sequences / median pass time over ``repeats`` passes.
- peak memory at seq_len 128 and 512, batch 32: CUDA: ``torch.cuda.max_memory_allocated`` over one pass
  (weights included). CPU (torch has no CPU allocator statistics): the weights' bytes plus the peak of the
  bytes held by tensors allocated during the pass, tracked with a dispatch mode that adds each new storage's
  size and subtracts it when the storage is freed; allocator caching and fragmentation are not counted.
Sequence lengths are capped at the model's max_positions; a capped memory length is reported as None.
The defaults keep it short: ~2 x repeats + 6 passes (a tiny model: well under a second; BERT-base on 2 CPU
cores: ~20 s, mostly the two batch-32 memory passes).
"""
from __future__ import annotations

import logging
import os
import platform
import time
import weakref
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

LATENCY_BATCH, LATENCY_SEQ = 1, 128
THROUGHPUT_BATCH, THROUGHPUT_SEQ = 32, 128
MEMORY_SEQS = (128, 512)
MEMORY_BATCH = 32
MB = 2 ** 20


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied weight counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel()
    return total


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return name or platform.processor() or platform.machine() or "cpu"


def resolve_device(which: str) -> torch.device:
    if which == "cuda" and not torch.cuda.is_available():
        raise ValueError("evaluate.efficiency_device is 'cuda' but no CUDA device is available")
    if which == "auto":
        which = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(which)


class _PeakBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Bytes of the storages allocated inside the mode that are still alive, and their peak (CPU tensors)."""

    def __init__(self):
        super().__init__()
        self.current = self.peak = 0
        self._live: dict[int, int] = {}

    def _free(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                key, n = st.data_ptr(), st.nbytes()
                if n and key not in self._live:         # a view of a live storage adds nothing
                    self._live[key] = n
                    self.current += n
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(st, self._free, key)
        return out


def _ids(model, batch: int, seq: int, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    vocab = int(model.arch.vocab_size)
    lo = min(5, vocab - 1)      # above the special ids of both id conventions when the vocabulary allows
    return torch.randint(lo, vocab, (batch, seq), generator=gen).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(model, ids: torch.Tensor, repeats: int) -> list[float]:
    model.encode(ids)                    # warm-up (lazy initialization, kernel selection)
    _sync(ids.device)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.encode(ids)
        _sync(ids.device)
        out.append(time.perf_counter() - t0)
    return out


def _peak_mb(model, ids: torch.Tensor, weights_bytes: int) -> float:
    dev = ids.device
    if dev.type == "cuda":
        model.encode(ids)
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        model.encode(ids)
        torch.cuda.synchronize(dev)
        return torch.cuda.max_memory_allocated(dev) / MB
    with _PeakBytes() as tracker:
        model.encode(ids)
    return (weights_bytes + tracker.peak) / MB


@torch.inference_mode()
def measure(model, repeats: int = 5, device: str = "auto", seed: int = 0) -> dict:
    """The efficiency report of ``model`` (an MLMEncoder; moved to the device for the measurement and back)."""
    dev = resolve_device(device)
    home = next(model.parameters()).device
    was_training = model.training
    model.eval().to(dev)
    gen = torch.Generator().manual_seed(seed)
    max_pos = int(model.arch.max_positions)
    weights = sum(p.numel() * p.element_size() for p in {p.data_ptr(): p for p in model.parameters()}.values())
    try:
        lat_seq = min(LATENCY_SEQ, max_pos)
        lat = np.array(_timed(model, _ids(model, LATENCY_BATCH, lat_seq, dev, gen), repeats)) * 1000
        thr_seq = min(THROUGHPUT_SEQ, max_pos)
        thr = _timed(model, _ids(model, THROUGHPUT_BATCH, thr_seq, dev, gen), repeats)
        memory, skipped = {}, {}
        for seq in MEMORY_SEQS:
            if seq > max_pos:
                memory[str(seq)] = None
                skipped[f"peak_memory_mb.{seq}"] = f"seq_len {seq} exceeds the model's max_positions {max_pos}"
                continue
            memory[str(seq)] = round(_peak_mb(model, _ids(model, MEMORY_BATCH, seq, dev, gen), weights), 3)
    finally:
        model.to(home).train(was_training)
    return {"device": device_name(dev), "device_kind": dev.type, "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(), "torch": torch.__version__,
            "parameters": count_parameters(model), "weights_mb": round(weights / MB, 3),
            "latency_ms": {"p50": round(float(np.percentile(lat, 50)), 4), "p95": round(float(np.percentile(lat, 95)), 4),
                           "batch": LATENCY_BATCH, "seq_len": lat_seq, "repeats": repeats},
            "throughput": {"sequences_per_s": round(THROUGHPUT_BATCH / float(np.median(thr)), 3),
                           "batch": THROUGHPUT_BATCH, "seq_len": thr_seq, "repeats": repeats},
            "peak_memory_mb": memory, "memory_batch": MEMORY_BATCH, "skipped": skipped}


def measure_model_dir(model_dir: Path, repeats: int = 5, device: str = "auto", seed: int = 0) -> dict:
    """``measure`` of the model in a folder: the ELECTRA discriminator when there is one, else the MLM."""
    from mlm_core.evaluate.intrinsic import load_discriminator
    from mlm_core.fillmask import load_model_dir
    model, _, _ = load_model_dir(Path(model_dir))
    disc = load_discriminator(Path(model_dir))
    out = measure(disc or model, repeats=repeats, device=device, seed=seed)
    out["model"] = "discriminator" if disc is not None else "mlm"
    log.info("efficiency (%s, %s): %d parameters, latency p50 %.2f ms / p95 %.2f ms, %.1f seq/s, peak memory %s MB",
             out["model"], out["device"], out["parameters"], out["latency_ms"]["p50"], out["latency_ms"]["p95"],
             out["throughput"]["sequences_per_s"], out["peak_memory_mb"])
    return out


def flat(eff: dict) -> dict[str, float]:
    """The efficiency figures as flat metrics (MLflow, the evaluate manifest)."""
    out = {"efficiency.parameters": float(eff["parameters"]),
           "efficiency.latency_p50_ms": float(eff["latency_ms"]["p50"]),
           "efficiency.latency_p95_ms": float(eff["latency_ms"]["p95"]),
           "efficiency.throughput_seq_s": float(eff["throughput"]["sequences_per_s"])}
    for seq, v in (eff.get("peak_memory_mb") or {}).items():
        if v is not None:
            out[f"efficiency.peak_memory_mb_{seq}"] = float(v)
    return out


__all__ = ["count_parameters", "device_name", "flat", "measure", "measure_model_dir"]
