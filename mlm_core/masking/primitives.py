"""The integer primitives every masker shares: splitmix64 hashing on int64 tensors, integer thresholds, the
bit layout of a position's hash, and word units.

In: int64 tensors (a row's Weyl sequence), probabilities, candidate and word-start flags. Out: hashes, keys,
unit indices. Bit-exact on every device (no float draws), so a static mask or a PMI selection is the same
everywhere. The leaf of the masking package: imported by ``masker`` (row keys, 80/10/10), ``strategies``
(token / whole-word / span selection) and ``pmi_select`` (PMI).
"""
from __future__ import annotations

import torch

U64 = 1 << 64
LOW32 = (1 << 32) - 1


def i64(c: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return c - U64 if c >= 1 << 63 else c



GOLDEN = i64(0x9E3779B97F4A7C15)
MIX1 = i64(0xBF58476D1CE4E5B9)
MIX2 = i64(0x94D049BB133111EB)
# stream offsets: per-position draws and per-span draws walk disjoint stretches of a row's Weyl sequence
STREAM_POS = i64(0xD1B54A32D192ED03)
STREAM_SPAN = i64(0x8CB92BA72F3D8DD7)
# bit layout of one per-position hash: [63..44] selection key, [43..28] 80/10/10 action, [27..0] random id
SEL_BITS, ACT_SHIFT, ACT_BITS, RID_BITS = 20, 28, 16, 28
# per-span hash: [63..40] length, [39..16] keep key
SPAN_BITS = 24


def shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic on negative values)."""
    out = z >> k
    out &= (1 << (64 - k)) - 1
    return out


def mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64 finalizer, in place on a tensor the caller owns; int64 multiplication wraps mod 2**64."""
    z ^= shr(z, 30)
    z *= MIX1
    z ^= shr(z, 27)
    z *= MIX2
    z ^= shr(z, 31)
    return z


def mix_int(z: int) -> int:
    """The same finalizer on a Python int (for the seed key, computed once)."""
    m = U64 - 1
    z &= m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return i64(z ^ (z >> 31))


def threshold(prob: float, bits: int) -> int:
    """An integer key of `bits` uniform bits is below this with probability `prob` (to 2**-bits)."""
    return int(round(min(max(prob, 0.0), 1.0) * (1 << bits)))


def blend(x: torch.Tensor, where: torch.Tensor, value: torch.Tensor | int) -> torch.Tensor:
    """``torch.where(where, value, x)`` for int64 by bit masking (torch.where is several times slower on CPU)."""
    m = where.to(torch.int64).neg_()                          # all ones where selected
    return x ^ ((x ^ value) & m)


def weyl(offset: int, n: int) -> torch.Tensor:
    """The Weyl increments of one stream on CPU: offset + i * golden (wrapping), i = 0..n-1."""
    return torch.arange(n, dtype=torch.int64) * GOLDEN + offset


def stream_hash(row_key: torch.Tensor, increments: torch.Tensor) -> torch.Tensor:
    """[B, n] int64 hashes: splitmix64 over each row's Weyl sequence (state row_key + increments[i])."""
    return mix(row_key[:, None] + increments[None, :])


class DeviceConstants:
    """Constant tensors built once on CPU and kept per (key, device)."""

    def __init__(self):
        self._by_key: dict[tuple, torch.Tensor] = {}

    def get(self, key, device: torch.device, make) -> torch.Tensor:
        """The tensor ``make()`` (a CPU tensor) on ``device``, built on the first call for ``key``."""
        k = (key, device)
        if k not in self._by_key:
            self._by_key[k] = make().to(device)
        return self._by_key[k]


def units(cand: torch.Tensor, word_start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit (word) index per position and the unit-start flags. Every non-candidate is a unit of its own;
    a candidate starts a unit at a word start or right after a non-candidate (robust to bad word_start)."""
    start = word_start | ~cand
    start[:, 1:] |= ~cand[:, :-1]
    start[:, 0] = True
    return start.cumsum(1) - 1, start


__all__ = ["ACT_BITS", "ACT_SHIFT", "GOLDEN", "LOW32", "MIX1", "MIX2", "RID_BITS", "SEL_BITS", "SPAN_BITS",
           "STREAM_POS", "STREAM_SPAN", "U64", "DeviceConstants", "blend", "i64", "mix", "mix_int", "shr",
           "stream_hash", "threshold", "units", "weyl"]
