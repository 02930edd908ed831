"""Position encodings the encoder computes from a formula (nothing stored with the weights).

In: a length and a width (and a rotary base). Out: the tables the encoder adds (sinusoidal) or rotates q / k by
(rotary), and the rotation itself.

* Sinusoidal (Vaswani et al., 2017): PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same).
* Rotary (RoPE, Su et al., 2021) in the GPT-NeoX "half" layout: feature i is paired with feature i + d/2 and the
  pair is rotated by pos * theta^(-2i/d). RoFormer pairs (2i, 2i+1) instead; the two are the same map up to a
  fixed permutation of q's and k's features (``roformer_permutation``), which the RoFormer export / import
  applies to the rows of the q and k projections (a dot product q.k is unchanged when both are permuted alike).
  ModernBERT uses the half layout with its own bases (``mlm_core.model.sizes.MODERNBERT_THETA``) and computes the
  angles in float32 (transformers' ``ModernBertRotaryEmbedding``): ``float32=True`` repeats that arithmetic, so
  long positions round as they did when the checkpoint was trained.
"""
from __future__ import annotations

import torch


def sinusoidal_table(n_positions: int, dim: int) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d))."""
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, dim, 2, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, two_i / dim)
    table = torch.zeros(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])  # odd dim: one fewer cosine column
    return table.float()


def rotary_cos_sin(n_positions: int, head_dim: int, theta: float = 10000.0,
                   float32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [n_positions, head_dim] for RoPE, frequencies theta^(-2i/d), halves duplicated (GPT-NeoX layout).

    Default: angles in float64, rounded once (as RoFormer's table). ``float32``: ModernBERT's arithmetic
    (inverse frequencies and angles in float32)."""
    if float32:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        angle = torch.arange(n_positions).float()[:, None] * inv_freq[None, :]
        angle = torch.cat([angle, angle], dim=-1)
        return angle.cos(), angle.sin()
    inv_freq = 1.0 / torch.pow(theta, torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angle = torch.arange(n_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    angle = torch.cat([angle, angle], dim=-1)
    return angle.cos().float(), angle.sin().float()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (x_i, x_{i+d/2}) pair of x [B, nh, T, d] by its position's angle."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def roformer_permutation(heads: int, head_dim: int) -> torch.Tensor:
    """Row indices r such that RoFormer's q (or k) projection = ours[r] (within each head, RoFormer's feature
    2i is our feature i and its feature 2i + 1 our feature i + d/2); ``argsort`` of it is the inverse."""
    half = head_dim // 2
    within = torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).reshape(-1)   # 0, h, 1, h+1, ...
    return (torch.arange(heads)[:, None] * head_dim + within[None, :]).reshape(-1)


def sinusoidal_position_init(core) -> None:
    """pretrain.model.position_init=sinusoidal: every learned position table (both ELECTRA networks) starts as
    the sinusoidal table scaled to BERT's init RMS (0.02 per entry; a sinusoid's RMS is 1/sqrt(2)), overwriting
    the normal draw after it was made, so every later random draw is the same as with the normal init."""
    for m in core.modules():
        table = getattr(m, "pos_emb", None)
        if isinstance(table, torch.nn.Embedding):
            off = m.arch.position_offset
            with torch.no_grad():
                t = sinusoidal_table(table.weight.shape[0] - off, table.weight.shape[1]) * (0.02 * 2 ** 0.5)
                table.weight[off:] = t.to(table.weight.dtype)


__all__ = ["sinusoidal_position_init", "sinusoidal_table", "rotary_cos_sin", "apply_rotary", "roformer_permutation"]
