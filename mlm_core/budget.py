"""Budget matching for sweeps: the ``pretrain.steps`` that give a variant the same training budget as a reference.

``match: flops`` — every variant spends the reference's training FLOPs; ``match: tokens`` — the same number of
input tokens. One optimizer step processes ``batch_size x grad_accum x world x seq_len`` tokens (padding included,
as the loop's ``tokens`` counter) and costs ``tokens x flops_per_token``; ``flops_per_token`` is the model's own
(``MLMEncoder.flops_per_token`` / ``ElectraModel.flops_per_token``: 6N per token + the attention term, the
vocabulary head on the masked share only; for ELECTRA the generator AND the discriminator with its RTD head), the
same count the loop's MFU uses. The model is built on the meta device: no memory, no init cost, even for ``base``.

Only the config is read, never a stored output, so a sweep planned before the tokenizer stage ran plans the same
steps after it (the fingerprints stay stable across resumes): the vocabulary size is ``tokenizer.vocab_size``
(the trained tokenizer's may be a little smaller; it enters only the head term, on the masked share).
The masking rate of the head term is the schedule's mean: constant = rate; linear / cosine = (rate_min +
rate_max) / 2; cyclical = rate_min + (rate_max - rate_min) x 2/pi (the mean of |sin|).
"""
from __future__ import annotations

import math

from mlm_core.errors import MlmError

MATCHES = ("flops", "tokens")


class BudgetError(MlmError, ValueError):
    """A budget that cannot be matched (unknown mode, a model whose shape the config does not fix)."""


def _config(lc):
    return getattr(lc, "config", lc)   # a LoadedConfig or a PipelineConfig


def mean_mask_rate(mcfg) -> float:
    """The masking schedule's mean rate over training (module docstring)."""
    if mcfg.schedule == "constant":
        return float(mcfg.rate)
    if mcfg.schedule == "cyclical":
        return float(mcfg.rate_min + (mcfg.rate_max - mcfg.rate_min) * 2.0 / math.pi)
    return float((mcfg.rate_min + mcfg.rate_max) / 2.0)     # linear / cosine: symmetric ramps


def tokens_per_step(lc) -> int:
    """Input tokens of one optimizer step: batch_size x grad_accum x world size x seq_len."""
    cfg = _config(lc)
    p = cfg.pretrain
    world = p.distributed.nproc_per_node * p.distributed.nnodes
    return int(p.batch_size * p.grad_accum * world * cfg.shards.seq_len)


def flops_per_token(lc) -> float:
    """Training FLOPs (forward + backward) per input token of the config's model (module docstring)."""
    cfg = _config(lc)
    if cfg.pretrain.init_from is not None:
        raise BudgetError("sweep match: pretrain.init_from is set: the model's shape comes from the checkpoint, "
                          "not the config; match flops/tokens needs a fresh model (remove pretrain.init_from)")
    if cfg.tokenizer_from is not None:
        raise BudgetError("sweep match: tokenizer.from is set: the vocabulary size is the existing tokenizer's, "
                          "unknown from the config; match flops/tokens needs a trained tokenizer (tokenizer.vocab_size)")
    import torch

    from mlm_core.train.objectives import objective_for
    with torch.device("meta"):   # shapes only: nothing allocated, nothing initialized for real
        model = objective_for(cfg.pretrain).build(int(cfg.tokenizer.vocab_size), 0, [])
    return float(model.flops_per_token(cfg.shards.seq_len, mean_mask_rate(cfg.pretrain.masking)))


def step_cost(lc, match: str) -> float:
    """One optimizer step's budget: FLOPs (match flops) or tokens (match tokens)."""
    if match not in MATCHES:
        raise BudgetError(f"sweep match: {match!r} is not one of {', '.join(MATCHES)}")
    t = tokens_per_step(lc)
    return float(t) if match == "tokens" else t * flops_per_token(lc)


def training_budget(lc, match: str) -> float:
    """The whole run's budget: pretrain.steps x step_cost."""
    return _config(lc).pretrain.steps * step_cost(lc, match)


def steps_for_budget(variant_lc, reference_lc, match: str) -> int:
    """``pretrain.steps`` for ``variant_lc`` so its budget equals ``reference_lc``'s (its own steps x step cost):
    the nearest integer, at least 1. ``match``: "flops" or "tokens"."""
    steps = training_budget(reference_lc, match) / step_cost(variant_lc, match)
    return max(1, int(round(steps)))


__all__ = ["BudgetError", "MATCHES", "steps_for_budget", "step_cost", "training_budget", "tokens_per_step",
           "flops_per_token", "mean_mask_rate"]
