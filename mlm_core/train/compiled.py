"""The compiled training forward (``pretrain.compile``): one ``torch.compile`` graph per objective whose
shapes never change, so it compiles once and never recompiles, whatever the masking-rate schedule does.

Why a separate forward: the eager one gathers the N selected positions with a boolean index, so its head
and loss have a data-dependent shape [N, V] (a new graph every step under compile, or dynamic shapes).
Here the head runs on a fixed **masked-position budget** Nb per micro-batch (``masked_budget``): the
positions of the selected tokens in row-major order (``torch.nonzero_static``), padded to Nb with a dummy
position whose label is -100; the loss is the sum of per-row cross-entropies (padding gives exactly 0)
over the real count, i.e. the same mean as the eager path. ELECTRA's discriminator runs on every
position with the padding weighted 0 instead of a boolean gather, and the generator's Gumbel noise is
drawn eagerly (same generator, same [N, V] draw as ``gumbel_sample``: the random streams, and so exact
resume, are those of the eager path), padded to Nb and fed to the graph.

Budget: Nb = rate_max x B x T + 5 sigma, rounded up to 32 (rate_max: the schedule's highest rate, the
constant rate otherwise), with sigma^2 = p (1 - p) x B x T x u the variance of the selected count when
units of u tokens are selected independently (u: the strategy's ``budget_unit``, ``mlm_core.masking.strategies``:
1 token, 2 for whole words, span_max for spans, 10 for PMI: upper bounds on the mean size-weighted unit length
on real text). The head's rows are a large share of the step
(a 30k-vocabulary projection), so the margin is a trade: at the default 32 x 128, 15 %, Nb = 736 rows
for ~614 selected (8 sigma would be 832: +13 % head work every step). A micro-batch that still selects
more (a normal tail of ~3e-7 per micro-batch for token masking: about once in 3M steps) runs on the next
rung of a fixed ladder (x1.5 ... up to B x T): one extra compile, the same loss. The rung depends on the
micro-batch only, so a resumed run takes the same rungs as an uninterrupted one.

What differs from eager (``pretrain.compile: off``), and why the effect is "none" (not in the
fingerprint): the values agree to float rounding (fused kernels, a different summation order in the
head's weight gradient), not bit for bit. On CPU the graph draws dropout through aten's own random ops
(inductor's ``fallback_random``), i.e. the very masks the eager step draws from torch's global RNG, so a
compiled run follows the eager one with dropout on too; on CUDA inductor's Philox generator (seeded from
the global RNG) draws other, equally valid masks. Either way the streams live in torch's global RNG,
which checkpoints save: a compiled run is reproducible and resumes exactly.

auto = on for one process on CUDA (Triton present) or on CPU with a C++ compiler (inductor's need) and a
Python dynamo supports, for runs of at least ``AUTO_MIN_MICRO_STEPS`` micro-batches (shorter ones finish
sooner without the compile); on = the same without the length rule (an error where it cannot run); off under torchrun (DDP / FSDP wrap the model and this forward calls the encoder
directly, bypassing the wrapper's hooks) and for the evaluation forward (eval mode / no grad: eager).

``pretrain.bias_regularizer``: the graph also returns the chosen block's output (a fixed [B, T, H] shape) and
the term (``mlm_core.bias.regularizer.bias_term``, static shapes) is computed eagerly on it; its gradient flows
back through the graph's backward, so the regularized step stays compiled.
"""
from __future__ import annotations

import logging
import math
import os
import shutil

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

_ROUND = 32
_SIGMAS = 5.0
# auto compiles a run of at least this many micro-batches: compiling costs ~30-60 s on a 2-core CPU (~1 min on
# a GPU) and saves ~30-40% of a 0.05-0.5 s step, so shorter runs (tests, smoke runs, the 1200-step demo)
# finish sooner eagerly
AUTO_MIN_MICRO_STEPS = 2000


def compile_support(device: torch.device) -> str | None:
    """None when torch.compile can run on ``device`` here, else the reason it cannot."""
    try:
        import torch._dynamo
        if not torch._dynamo.is_dynamo_supported():
            return "torch.compile (dynamo) does not support this Python"
    except Exception as e:                                         # noqa: BLE001 - any import failure means no
        return f"torch._dynamo unavailable ({e})"
    if device.type == "cuda":
        from torch.utils._triton import has_triton
        return None if has_triton() else "Triton is not installed (inductor's CUDA backend)"
    if device.type == "cpu":
        cxx = os.environ.get("CXX") or "g++"
        if shutil.which(cxx) or shutil.which("clang++"):
            return None
        return f"no C++ compiler ({cxx} / clang++) on PATH (inductor compiles CPU kernels with one)"
    return f"device type {device.type!r}"


def use_compile(cfg, device: torch.device, world_size: int) -> tuple[bool, str]:
    """(compile?, why) for ``cfg.compile`` (a PretrainConfig): off | on | auto (module docstring)."""
    setting = cfg.compile
    if setting == "off":
        return False, "pretrain.compile: off"
    if world_size > 1:
        return False, "torchrun (DDP/FSDP wrap the model; the compiled forward would bypass their hooks)"
    why = compile_support(device)
    if why is not None:
        if setting == "on":
            from mlm_core.errors import MlmError     # a problem the user fixes in the config
            raise MlmError(f"pretrain.compile: on, but torch.compile cannot run here: {why} "
                           "(set pretrain.compile: auto or off)")
        return False, why
    if setting == "auto" and cfg.steps * cfg.grad_accum < AUTO_MIN_MICRO_STEPS:
        return False, (f"pretrain.compile: auto, {cfg.steps * cfg.grad_accum} micro-steps < {AUTO_MIN_MICRO_STEPS}: "
                       "the compile would not pay for itself")
    return True, f"pretrain.compile: {setting}"


def max_rate(mcfg) -> float:
    return float(mcfg.rate) if mcfg.schedule == "constant" else float(mcfg.rate_max)


def masked_budget(mcfg, batch: int, seq_len: int) -> int:
    """The fixed number of head rows per micro-batch (module docstring): covers the selected count with
    5 standard deviations of margin at the schedule's highest rate; never above batch x seq_len."""
    from mlm_core.masking import strategy_class
    n, p = batch * seq_len, max_rate(mcfg)
    u = strategy_class(mcfg.strategy).budget_unit(mcfg)           # tokens per independently selected unit
    b = p * n + _SIGMAS * math.sqrt(p * (1.0 - p) * n * u)
    return min(n, int(math.ceil(b / _ROUND)) * _ROUND)


def budget_for(count: int, first: int, cap: int) -> int:
    """The smallest rung of the ladder first, 1.5 first, 1.5^2 first, ..., cap holding ``count``."""
    b = first
    while b < count and b < cap:
        b = min(cap, int(math.ceil(b * 1.5 / _ROUND)) * _ROUND)
    return b


# ------------------------------------------------------------------------------------------------ graphs
def _positions(labels: torch.Tensor, budget: int):
    """(gather index [Nb], scatter index [Nb] with padding -> B*T (a dummy slot), targets [Nb] with -100 padding)."""
    flat = labels.reshape(-1)
    pos = torch.nonzero_static(flat != -100, size=budget, fill_value=-1).squeeze(1)
    pad = pos < 0
    gather = pos.clamp(min=0)
    tgt = flat.index_select(0, gather).masked_fill(pad, -100)
    scatter = pos.masked_fill(pad, flat.numel())
    return gather, scatter, tgt


def _encode(enc, ids, seg, layer):
    """(hidden, block ``layer``'s output or None)."""
    return (enc.encode(ids, seg), None) if layer is None else enc.encode(ids, seg, layer)


def _mlm_part(enc, ids, seg, gather, tgt, label_smoothing: float, layer=None):
    """(summed cross-entropy over the real rows / their count, head logits [Nb, V], block ``layer``'s output)."""
    hidden, lh = _encode(enc, ids, seg, layer)
    logits = enc.head(hidden.flatten(0, 1).index_select(0, gather))
    ce = F.cross_entropy(logits.float(), tgt, ignore_index=-100, reduction="none", label_smoothing=label_smoothing)
    n = (tgt != -100).sum()
    return ce.sum() / n.clamp(min=1), logits, lh


def mlm_loss(model, ids, seg, labels, label_smoothing: float, budget: int, layer=None):
    """The loss; with ``layer`` (the bias regularizer) (loss, that block's output)."""
    gather, _, tgt = _positions(labels, budget)
    loss, _, lh = _mlm_part(model, ids, seg, gather, tgt, label_smoothing, layer)
    return loss if layer is None else (loss, lh)


def electra_loss(model, ids, seg, labels, label_smoothing: float, budget: int, noise, layer=None):
    """Generator MLM loss and discriminator BCE (mean over non-pad tokens), as ``ElectraModel.forward``;
    ``noise`` [Nb, V]: the uniform draws of ``gumbel_sample`` (rows past the real count are padding)."""
    gather, scatter, tgt = _positions(labels, budget)
    mlm, logits, _ = _mlm_part(model.gen, ids, seg, gather, tgt, label_smoothing)
    with torch.no_grad():
        lg = logits.detach().float().masked_fill(model.disallowed, float("-inf"))
        sampled = (lg - torch.log(-torch.log(noise))).argmax(-1)
        flat = ids.reshape(-1)
        dummy = flat.new_zeros(1)
        original = torch.cat([flat, dummy]).index_put((scatter,), tgt)[:-1]
        corrupted = torch.cat([flat, dummy]).index_put((scatter,), sampled)[:-1].view_as(ids)
        real = seg != 0
        target = (corrupted.reshape(-1) != original).view_as(ids).float()
    hd, lh = _encode(model.disc, corrupted, seg, layer)
    d = model.disc.rtd_logits(hd).float()
    bce = F.binary_cross_entropy_with_logits(d, target, reduction="none")
    w = real.float()
    disc = (bce * w).sum() / w.sum().clamp(min=1.0)
    return (mlm, disc) if layer is None else (mlm, disc, lh)


class CompiledForward:
    """``objective.forward`` for training micro-batches of one shape, through a fixed-shape compiled graph of the
    objective's ``compiled_loss`` (``mlm_loss``, ``electra_loss``)."""

    def __init__(self, objective, mcfg, batch: int, seq_len: int, device: torch.device | None = None):
        self.objective, self.B, self.T = objective, batch, seq_len
        self.first = masked_budget(mcfg, batch, seq_len)
        fn = objective.compiled_loss()
        # fullgraph: a graph break is an error, not a silent slow path; dynamic=False: the shapes are fixed.
        # CPU: dropout through aten's vectorized bernoulli (fallback_random) - inductor's own per-element
        # Philox C++ loop cost ~0.24 s of a 1.5 s small-model step here; Triton's on CUDA is fast, so kept there
        cpu = device is None or device.type == "cpu"
        self.fn = torch.compile(fn, fullgraph=True, dynamic=False, options={"fallback_random": cpu})
        self.overflows = 0

    def applies(self, model, ids) -> bool:
        return model.training and torch.is_grad_enabled() and tuple(ids.shape) == (self.B, self.T)

    def __call__(self, model, ids, seg, labels, label_smoothing: float, n_sel: int | None = None,
                 sample_generator: torch.Generator | None = None, layer: int | None = None) -> dict:
        if n_sel is None:
            n_sel = int((labels != -100).sum())
        budget = budget_for(n_sel, self.first, self.B * self.T)
        if budget != self.first:
            self.overflows += 1
            log.info("compiled step: %d selected positions exceed the budget %d; this micro-batch runs at %d",
                     n_sel, self.first, budget)
        extra = self.objective.compiled_inputs(model, n_sel, budget, sample_generator, ids.device)
        if layer is not None:
            *got, lh = self.fn(model, ids, seg, labels, float(label_smoothing), budget, *extra, layer)
            return {**dict(zip(self.objective.compiled_outputs, got)), "n_predictions": n_sel, "layer_hidden": lh}
        got = self.fn(model, ids, seg, labels, float(label_smoothing), budget, *extra)
        got = got if isinstance(got, tuple) else (got,)
        return {**dict(zip(self.objective.compiled_outputs, got)), "n_predictions": n_sel}


def gumbel_noise(model, n: int, budget: int, generator, device) -> torch.Tensor:
    """The uniforms ``gumbel_sample`` draws for n rows (same call, same generator), padded to the budget."""
    V = model.disallowed.numel()
    u = torch.rand((n, V), generator=generator, device=device).clamp_(1e-9, 1 - 1e-9)
    if budget > n:
        u = torch.cat([u, torch.full((budget - n, V), 0.5, device=device)])
    return u


__all__ = ["CompiledForward", "compile_support", "use_compile", "masked_budget", "budget_for", "mlm_loss",
           "electra_loss", "gumbel_noise"]
