"""ELECTRA (Clark et al., 2020): a small MLM generator corrupts the input, a discriminator detects the
replaced tokens.

As the paper and the reference implementation (google-research/electra) do:
  * the generator and the discriminator share the whole embedding block: token, position and
    token-type tables and the embedding LayerNorm (the reference's shared ``electra/embeddings``
    scope). The generator is narrower (``generator_fraction``): it projects the shared E-wide
    embeddings to its width (``embeddings_project``) and its MLM head maps back to E, so the decoder is
    tied to the shared token table (transformers' ``ElectraForMaskedLM`` layout);
  * the generator's input: of the selected positions, 85% become [MASK] and 15% stay unchanged, no
    random replacement (``ELECTRA_MASK_PROB``; pretrain_helpers.mask in the reference);
  * the replacement is a sample of the generator's softmax (Gumbel-max), with every special token's
    logit removed, so a special id can never be written into the text;
  * the discriminator has no MLM head; its head is dense -> GELU -> dense(1) (``ElectraForPreTraining``).

The generator is the model users fill masks with: the pretrain stage saves it as the MLM
(``model.safetensors``) and the discriminator beside it (``discriminator.safetensors``).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mlm_core.model.encoder import MLMEncoder, activation_fn
from mlm_core.model.sizes import Arch, ArchError

ELECTRA_MASK_PROB = 0.85     # reference implementation: 85% [MASK], 15% unchanged, 0% random


def electra_masking(mcfg):
    """The masking config for the generator's input: 85% [MASK] / 15% unchanged (rate, strategy, schedule kept)."""
    return mcfg.model_copy(update={"mask_token_prob": ELECTRA_MASK_PROB, "random_token_prob": 0.0})


class Discriminator(MLMEncoder):
    """The encoder without an MLM head, plus the replaced-token-detection head (one logit per token)."""

    def __init__(self, arch: Arch):
        super().__init__(arch, mlm_head=False)
        H = arch.hidden
        self.rtd_dense = nn.Linear(H, H)
        self.rtd_out = nn.Linear(H, 1)
        self.rtd_act = activation_fn(arch.activation)   # transformers: get_activation(hidden_act); default exact GELU
        for m in (self.rtd_dense, self.rtd_out):
            self._init(m)

    def rtd_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Replaced-token logit per hidden vector [..., H] -> [...] (> 0: replaced)."""
        return self.rtd_out(self.rtd_act(self.rtd_dense(hidden))).squeeze(-1)

    @torch.no_grad()
    def full_rtd_logits(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.rtd_logits(self.encode(input_ids, segment_ids))


def generator_arch(gen: Arch, disc: Arch) -> Arch:
    """The generator's Arch reading the discriminator's embeddings (E = the discriminator's width). The shared
    embedding block also fixes the token-type rows, the position offset and the LayerNorm epsilon (a
    discriminator imported from a checkpoint), so the generator's Arch describes the tables it really uses."""
    return dataclasses.replace(gen, embedding_size=disc.emb_dim if disc.emb_dim != gen.hidden else None,
                               type_vocab_size=disc.type_vocab_size, position_offset=disc.position_offset,
                               ln_eps=disc.ln_eps)


def gumbel_sample(logits: torch.Tensor, disallowed: torch.Tensor | None,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """One sample per row of softmax(logits) by Gumbel-max; ``disallowed`` (bool [V]) ids get -inf first."""
    logits = logits.detach().float()
    if disallowed is not None:
        logits = logits.masked_fill(disallowed.to(logits.device), float("-inf"))
    u = torch.rand(logits.shape, generator=generator, device=logits.device).clamp_(1e-9, 1 - 1e-9)
    return (logits - torch.log(-torch.log(u))).argmax(-1)


class ElectraModel(nn.Module):
    """Generator + discriminator sharing the embedding block (see the module docstring)."""

    def __init__(self, disc_arch: Arch, gen_arch: Arch, special_ids: list[int] | None = None):
        super().__init__()
        if disc_arch.modern or gen_arch.modern:
            # transformers has no ModernBERT ELECTRA pair: the result could not be exported or read back
            raise ArchError("objective electra with pretrain.model.family modernbert: ModernBERT has no ELECTRA "
                            "layout in transformers; use objective mlm, or family bert")
        self.disc = Discriminator(disc_arch)
        self.gen = MLMEncoder(generator_arch(gen_arch, disc_arch))
        for name in ("tok_emb", "type_emb", "emb_norm") + (("pos_emb",) if disc_arch.position == "learned" else ()):
            setattr(self.gen, name, getattr(self.disc, name))      # one module, one set of tensors
        if self.gen.arch.tie_embeddings:
            self.gen.decoder.weight = self.gen.tok_emb.weight
        self.register_buffer("disallowed", torch.zeros(disc_arch.vocab_size, dtype=torch.bool), persistent=False)
        self.set_special_ids(special_ids or [])

    def set_special_ids(self, special_ids: list[int]) -> None:
        """Ids the generator's sample may never write into the text (the pad id always)."""
        self.disallowed.zero_()
        self.disallowed[sorted({int(i) for i in special_ids} | {self.disc.arch.pad_id})] = True

    @property
    def arch_dict(self) -> dict:
        return {"discriminator": self.disc.arch.to_dict(), "generator": self.gen.arch.to_dict()}

    def flops_per_token(self, seq_len: int, mask_rate: float = 0.15) -> float:
        disc = self.disc.flops_per_token(seq_len, 0.0) + 6 * (self.disc.arch.hidden ** 2 + self.disc.arch.hidden)
        return disc + self.gen.flops_per_token(seq_len, mask_rate)

    def forward(self, input_ids, segment_ids, labels, label_smoothing: float = 0.0,
                sample_generator: torch.Generator | None = None, return_layer: int | None = None) -> dict:
        """Generator MLM loss on the selected positions, then the discriminator on the sampled text.

        Returns the generator's {"loss", "logits", "n_predictions"} plus "disc_loss" (mean BCE over the
        non-pad tokens), "disc_logits", "disc_target" (1 = replaced), "sampled" (the generator's sample at
        the selected positions), "n_disc", "disc_correct"; with ``return_layer`` also "layer_hidden": that
        discriminator block's output [B, T, H] (pretrain.bias_regularizer)."""
        g = self.gen(input_ids, segment_ids, labels, label_smoothing)
        sel = labels != -100
        with torch.no_grad():
            sampled = gumbel_sample(g["logits"], self.disallowed, sample_generator)
            original = torch.where(sel, labels, input_ids)
            corrupted = input_ids.masked_scatter(sel, sampled)
            real = segment_ids != 0
            target = (corrupted != original)[real].float()
        extra = {}
        if return_layer is None:
            hd = self.disc.encode(corrupted, segment_ids)
        else:
            hd, extra["layer_hidden"] = self.disc.encode(corrupted, segment_ids, return_layer)
        d = self.disc.rtd_logits(hd[real]).float()
        bce = F.binary_cross_entropy_with_logits(d, target)
        return {"loss": g["loss"], "logits": g["logits"], "n_predictions": g["n_predictions"], "disc_loss": bce,
                "disc_logits": d.detach(), "disc_target": target, "sampled": sampled, "n_disc": int(target.numel()),
                "disc_correct": ((d > 0) == (target > 0.5)).sum(), **extra}


# ------------------------------------------------------------------------------------------------ metrics
def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """Area under the ROC curve = P(score of a random positive > a random negative), ties counted 1/2
    (Mann-Whitney U with mid-ranks); None when one class is absent."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(positive, dtype=bool).reshape(-1)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=np.float64)
    sorted_s = s[order]
    # mid-rank of each run of equal scores
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_s)) + 1]
    ends = np.r_[starts[1:], len(s)]
    mid = (starts + ends + 1) / 2.0                   # 1-based mean rank of the run
    ranks[order] = np.repeat(mid, ends - starts)
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def rtd_summary(logits: np.ndarray, replaced: np.ndarray) -> dict:
    """Replaced-token detection: accuracy (logit > 0 = replaced), AUC, the all-original baseline accuracy
    (predict "original" everywhere = the share of original tokens) and the replaced share."""
    lg = np.asarray(logits, dtype=np.float64).reshape(-1)
    y = np.asarray(replaced, dtype=bool).reshape(-1)
    n = len(y)
    if n == 0:
        return {"rtd_n": 0, "rtd_acc": None, "rtd_auc": None, "rtd_baseline_acc": None, "rtd_replaced_rate": None}
    return {"rtd_n": int(n), "rtd_acc": float(((lg > 0) == y).mean()), "rtd_auc": roc_auc(lg, y),
            "rtd_baseline_acc": float((~y).mean()), "rtd_replaced_rate": float(y.mean())}


__all__ = ["ElectraModel", "Discriminator", "ELECTRA_MASK_PROB", "electra_masking", "generator_arch",
           "gumbel_sample", "roc_auc", "rtd_summary"]
