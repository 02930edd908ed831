"""One optimizer step, every objective: forward -> loss -> backward (x grad_accum) -> clip -> optimizer step.

In: the model (or its DDP / FSDP wrapper), its ``Objective`` (``objectives``), the optimizer and scheduler,
and this rank's micro-batches of the step (``Micro``, drawn and masked by ``feed.Feed``). Out: ``StepOut``,
the loss parts summed over ranks, the gradient norm before clipping and the learning rate the step used.

Loss normalisation: every micro-batch's mean loss is re-weighted by its share of the *global* batch's
predictions (counted before the forward passes, all-reduced across ranks), so the update equals one big
batch's mean loss: W ranks x accumulation k is the same optimizer step as 1 rank x accumulation W*k.
The objective decides the rest: ELECTRA's forward samples the generator's replacements and scores the
discriminator; its ``step_loss`` adds disc_weight x the discriminator's loss; ``add_bias`` adds
pretrain.bias_regularizer's term; a compiled objective (pretrain.compile) runs its fixed-shape graph.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
from torch import nn

from mlm_core.train.collective import all_reduce_sum


class Micro(NamedTuple):
    """One masked micro-batch on the device."""
    ids: torch.Tensor               # the corrupted input ids
    seg: torch.Tensor               # segment ids (0: padding)
    labels: torch.Tensor            # the original id at selected positions, -100 elsewhere
    n: int                          # selected positions (the MLM's predictions)
    m_real: int                     # non-padding tokens (ELECTRA's discriminator predictions)
    groups: torch.Tensor | None     # pretrain.bias_regularizer's group masks (``GroupFinder``), else None


class StepOut(NamedTuple):
    parts: torch.Tensor             # objective.parts, float64, summed over ranks (each rank's share / W)
    grad_norm: torch.Tensor         # before clipping
    lr: float                       # the learning rate this step used


def autocast(device: torch.device, precision: str):
    if device.type == "cuda" and precision in ("auto", "bf16"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()                 # fp32 on CPU (bf16 matmul is far slower there)


def step(model: nn.Module, objective, optimizer, scheduler, micro: list[Micro], cfg, *, device: torch.device,
         world_size: int = 1, sample_generator: torch.Generator | None = None) -> StepOut:
    """Train one step on ``micro`` (cfg: the ``PretrainConfig``: precision, label_smoothing, clip_norm)."""
    counts = torch.tensor([sum(b.n for b in micro), sum(b.m_real for b in micro)], dtype=torch.float64)
    n_glob, m_glob = all_reduce_sum(counts, world_size, device).tolist()     # the global batch's predictions
    lr = scheduler.get_last_lr()[0]
    parts = torch.zeros(len(objective.parts), dtype=torch.float64, device=device)
    for i, b in enumerate(micro):
        last = i == len(micro) - 1 or not hasattr(model, "no_sync")
        with contextlib.nullcontext() if last else model.no_sync():      # DDP: all-reduce gradients once
            with autocast(device, cfg.precision):
                out = objective.forward(model, b.ids, b.seg, b.labels, cfg.label_smoothing,        # forward
                                        sample_generator=sample_generator, n_sel=b.n, layer=objective.bias_layer)
            loss, logged = objective.step_loss(out, b.n, n_glob, b.m_real, m_glob, world_size)    # loss
            if b.groups is not None:
                loss, logged = objective.add_bias(out, b.groups, loss, logged)
            loss.backward()                                                                       # backward
        parts += torch.stack([x.double() for x in logged]) / world_size
    parts = all_reduce_sum(parts, world_size, device)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(),                               # clip
                                               cfg.clip_norm if cfg.clip_norm else float("inf"))
    optimizer.step()                                                                              # optimizer
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return StepOut(parts, grad_norm, lr)


__all__ = ["step", "Micro", "StepOut", "autocast"]
