"""AdamW with decoupled weight decay on matrices only, and the warmup-then-decay learning-rate schedule.

In: a model and a ``PretrainConfig``. Out: ``(optimizer, scheduler)``.
Weight decay applies to weight matrices (``param.ndim >= 2``) except embedding tables; biases,
LayerNorm gains/shifts and embeddings get none (BERT / RoBERTa practice; Loshchilov & Hutter 2019 for AdamW).
Schedule: linear warmup from 0 to ``lr`` over ``warmup_steps``, then ``linear`` (to 0 at ``steps``),
``cosine`` (half cosine to 0 at ``steps``) or ``constant``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from mlm_core.config import PretrainConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed weight matrices, and everything else (biases, norms, embedding tables)."""
    emb_params = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay, seen = [], [], set()
    for _, p in model.named_parameters():          # a tied tensor is yielded once
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.ndim >= 2 and id(p) not in emb_params else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay, "name": "decay"},
            {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]


def lr_lambda(step: int, *, warmup: int, total: int, decay: str) -> float:
    """Multiplier of the peak lr after ``step`` optimizer steps."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup              # the first step already gets 1/warmup (never lr = 0)
    if decay == "constant" or total <= warmup:
        return 1.0
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    if decay == "linear":
        return 1.0 - frac
    return 0.5 * (1.0 + math.cos(math.pi * frac))


class _Schedule:
    """A picklable-free callable (LambdaLR saves no lambdas: only its counters go in checkpoints)."""

    def __init__(self, warmup: int, total: int, decay: str):
        self.warmup, self.total, self.decay = warmup, total, decay

    def __call__(self, step: int) -> float:
        return lr_lambda(step, warmup=self.warmup, total=self.total, decay=self.decay)


def build_optimizer(model: nn.Module, cfg: PretrainConfig, fused_ok: bool = True, fused_cpu: bool = False
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """``fused_cpu``: the fused AdamW kernel on CPU too (~4x faster than foreach there, same update to float
    rounding); the compiled step (pretrain.compile) asks for it, the eager one keeps foreach's exact bytes."""
    groups = param_groups(model, cfg.weight_decay)
    on_cuda = any(p.is_cuda for g in groups for p in g["params"])
    kw = {"fused": True} if ((on_cuda or fused_cpu) and fused_ok) else {"foreach": True}
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=1e-6, **kw)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _Schedule(cfg.warmup_steps, cfg.steps, cfg.decay))
    return opt, sched


__all__ = ["param_groups", "lr_lambda", "build_optimizer"]
