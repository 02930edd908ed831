"""Attention masks: the global layers' segment mask (``segment_mask``) and local (sliding-window) self-attention
for ``pretrain.model.attention: local_global``.

In: q, k, v [B, nh, T, d] of one layer and a ``LocalMask`` (built once per forward from the segment ids and
shared by every local layer). Out: the attention output [B, nh, T, d], equal to dense attention under the
banded mask ``|i - j| <= window/2`` combined with the encoder's segment mask (``segment_mask``: a
token sees only its own document, never padding; a padding query sees itself) to float rounding.

Layer pattern: every ``global_every``-th layer (counted from 1: k, 2k, ...) stays global, the others are local
(ModernBERT alternates one global layer in three; Longformer / BigBird use sliding windows).

Why blockwise, not a banded [T, T] mask: SDPA on CPU with a dense mask still computes (and, for backward,
keeps) T x T scores per head, so memory stays quadratic in T whatever the mask allows. Here the sequence is
cut into blocks of ``blk`` >= window/2 queries; the keys a block needs lie in that block and its two
neighbours, so each block attends to a [3 blk] key window (a strided view, no gather copy before SDPA's
own). Scores are B x nh x T x 3 blk: linear in T for a fixed window.

Why SDPA on [B * nblocks, nh, blk, 3 blk] and not FlexAttention: torch 2.13's FlexAttention has no backward
on CPU ("FlexAttention does not support backward on CPU"), so it cannot train here; and among the
blockwise variants measured on this CPU (T = 2048, B 2, 4 heads of 32, window 128, forward + backward), the
4-D SDPA call was fastest: 48 ms vs 65 ms for explicit matmul + softmax or a 5-D SDPA call, vs 226 ms for
dense SDPA with the banded [T, T] mask.

The compiled training step (``pretrain.compile``, ``mlm_core.train.compiled``) traces this path as it is: on a
tiny local_global model (B 4 x T 96, window 16, packed rows with padding) the fullgraph compile had no graph
break and gave the eager loss and gradients (rtol 1e-4); no fallback is needed.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# smallest query block: a tiny window (window 2 -> blocks of 1) would run thousands of SDPA rows of 3 keys;
# blocks of 16 keep the call efficient at the price of a few masked-out scores
MIN_BLOCK = 16


def global_layers(layers: int, attention: str, global_every: int, from_first: bool = False) -> list[bool]:
    """Per layer (0-based), True where the layer attends globally: all of them for ``global``; for
    ``local_global`` the k-th, 2k-th, ... layers counted from 1 (k = global_every), or with ``from_first``
    layers 0, k, 2k, ... (ModernBERT: ``i % global_attn_every_n_layers == 0`` is ``full_attention``)."""
    if attention == "global":
        return [True] * layers
    if from_first:
        return [i % global_every == 0 for i in range(layers)]
    return [(i + 1) % global_every == 0 for i in range(layers)]


class LocalMask:
    """Which keys of each query block's 3-block key window a query may see: [B or 1, nb, blk, 3 blk] (True = may).

    Key j of block b's window is position (b - 1) blk + j; positions outside [0, T) are the zero padding
    added around the sequence, never seen except by a padding query (positions >= T, discarded) seeing
    itself, so no softmax row is empty (an all -inf row is NaN forward and poisons the gradients).
    """

    def __init__(self, seq_len: int, window: int, segment_ids: torch.Tensor | None, device: torch.device):
        half = window // 2
        self.T, self.half = seq_len, half
        self.blk = blk = max(half, MIN_BLOCK)
        self.nb = nb = -(-seq_len // blk)
        q_pos = torch.arange(nb * blk, device=device).view(nb, blk)
        k_pos = (torch.arange(nb, device=device)[:, None] - 1) * blk + torch.arange(3 * blk, device=device)[None, :]
        diff = k_pos[:, None, :] - q_pos[:, :, None]                              # [nb, blk, 3 blk]
        allowed = (diff.abs() <= half) & ((k_pos >= 0) & (k_pos < seq_len))[:, None, :]
        if segment_ids is not None:       # segment_mask's rule: same document, key not padding
            B = segment_ids.shape[0]
            segp = F.pad(segment_ids, (blk, nb * blk - seq_len + blk))           # padding keys: segment 0
            kseg = segp.unfold(1, 3 * blk, blk)                                   # [B, nb, 3 blk]
            qseg = segp[:, blk:blk + nb * blk].view(B, nb, blk)
            allowed = allowed & (qseg[..., :, None] == kseg[..., None, :]) & (kseg[..., None, :] > 0)
        else:
            allowed = allowed[None]
        self.allowed = allowed | (diff == 0)    # every query sees itself (segment_mask's diagonal)


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: LocalMask,
                    dropout_p: float = 0.0) -> torch.Tensor:
    """Sliding-window attention of q, k, v [B, nh, T, d] (module docstring); returns [B, nh, T, d]."""
    B, nh, T, d = q.shape
    blk, nb = mask.blk, mask.nb
    tail = nb * blk - T
    qb = F.pad(q, (0, 0, 0, tail)).view(B, nh, nb, blk, d)
    # key / value windows: pad one block each side, then block b's window = padded rows [b blk, (b + 3) blk)
    kw = F.pad(k, (0, 0, blk, tail + blk)).unfold(2, 3 * blk, blk)             # [B, nh, nb, d, 3 blk] (a view)
    vw = F.pad(v, (0, 0, blk, tail + blk)).unfold(2, 3 * blk, blk)
    # blocks into the batch dimension: SDPA's fused CPU kernel takes 4-D inputs and broadcasts the mask over heads
    q4 = qb.permute(0, 2, 1, 3, 4).reshape(B * nb, nh, blk, d)
    k4 = kw.permute(0, 2, 1, 4, 3).reshape(B * nb, nh, 3 * blk, d)
    v4 = vw.permute(0, 2, 1, 4, 3).reshape(B * nb, nh, 3 * blk, d)
    m = mask.allowed.expand(B, nb, blk, 3 * blk).reshape(B * nb, 1, blk, 3 * blk)
    y = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=m, dropout_p=dropout_p, scale=1.0 / math.sqrt(d))
    return y.view(B, nb, nh, blk, d).permute(0, 2, 1, 3, 4).reshape(B, nh, nb * blk, d)[:, :, :T]


def segment_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Boolean attention mask [B, 1, T, T] (True = may attend) from segment ids [B, T].

    Segment 0 is padding, 1..k the documents packed into the row: a token sees only its own document
    (block diagonal), never padding. Padded query rows see themselves so softmax has no empty row (NaN).
    """
    seg = segment_ids
    allowed = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)
    allowed = allowed | torch.eye(seg.shape[1], dtype=torch.bool, device=seg.device)
    return allowed[:, None, :, :]


def banded_mask(seq_len: int, window: int, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The dense equivalent (for tests and the benchmark's reference): [T, T] or, with segment ids,
    [B, 1, T, T] = ``segment_mask`` & ``|i - j| <= window/2``."""
    i = torch.arange(seq_len)
    band = (i[:, None] - i[None, :]).abs() <= window // 2
    if segment_ids is None:
        return band
    return segment_mask(segment_ids) & band.to(segment_ids.device)


__all__ = ["segment_mask", "LocalMask", "local_attention", "global_layers", "banded_mask", "MIN_BLOCK"]
