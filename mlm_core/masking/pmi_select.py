"""The ``pmi`` masking strategy's selection (PMI-masking, Levine et al. 2021): whole collocations first, then
single words, up to the budget p * candidates. The vocabulary comes from ``mlm_core.masking.pmi``.

Matching is on word units (``primitives.units``: a word-start token and its continuation tokens), so it needs no
text: a unit's hash mixes its token ids with their offsets in the word; an m-unit n-gram's hash chains its
units' hashes. ``pmi.hash_phrases`` runs the same function on each vocabulary n-gram encoded as the
shards encode documents, so a collocation in a packed row hashes to its vocabulary entry (64-bit; a chance
collision is ~1e-12 per lookup at a million entries).

Occurrences: longest first (5 units down to 2); an occurrence overlapping one already taken is dropped; among
overlapping occurrences of the same length, a few rounds keep local maxima of a random priority (so "a b c"
with both "a b" and "b c" in the vocabulary takes either with equal odds). Taken occurrences never overlap.

Selection (per row, independent Bernoulli like the other strategies; N candidate tokens, C of them inside
taken occurrences, budget B = p * N): when C >= B each occurrence is kept with probability B / C and no single
word is; else every occurrence is kept and each other word with probability (B - C) / (N - C). Either way
E[selected tokens] = B exactly, and an occurrence is selected or not as a whole (one key, drawn at its first
token), so a collocation is never split. The 80/10/10 replacement is then the Masker's, per token
(``strategies.PmiMasking`` calls ``select_pmi``).

Cost (one CPU thread of this repo's busy 2-core box, 4 tables of 200k hashes): ~15 ms for 32 x 128 and
~0.25-0.35 s for 256 x 512 (whole-word ~25 ms, span ~55 ms there); every op also runs on CUDA (host syncs: one
per table for the bitmap's survivors, one per overlap round).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mlm_core.masking import primitives as mp

_WORD_STREAM = mp.i64(0xA0761D6478BD642F)   # offsets a token's position in its word (wyhash constant)
_PRIORITY = mp.i64(0xE7037ED1A0B428DB)      # re-mix constant of the overlap priority (wyhash)
ROUNDS = 3                                # local-maximum rounds among same-length overlapping occurrences


def _shift_left(x: torch.Tensor, k: int, fill) -> torch.Tensor:
    """x[:, u + k] at column u (``fill`` past the end)."""
    if k == 0:
        return x
    out = torch.full_like(x, fill)
    if k < x.shape[1]:
        out[:, : x.shape[1] - k] = x[:, k:]
    return out


def unit_hashes(ids, cand, uidx, start) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hash [B, T] per unit, valid [B, T]: the unit holds candidate tokens, tokens [B, T] per unit)."""
    b, t = ids.shape
    ar = torch.arange(t, device=ids.device).expand(b, t)
    first = torch.cummax(ar * start, dim=1).values            # position of the unit's first token
    th = mp.mix(ids * mp.GOLDEN + (ar - first + 1) * _WORD_STREAM)
    w = torch.zeros(b, t, dtype=torch.int64, device=ids.device).scatter_add_(1, uidx, th * cand)
    tok = torch.zeros(b, t, dtype=torch.int64, device=ids.device).scatter_add_(1, uidx, cand.to(torch.int64))
    return mp.mix(w), tok > 0, tok


def chain(w: torch.Tensor, valid: torch.Tensor, max_n: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """{m: (hash of units u..u+m-1 at column u, all m units valid)} for m = 1..max_n."""
    out = {1: (w, valid)}
    h, v = w, valid
    for m in range(2, max_n + 1):
        h = mp.mix(h * mp.GOLDEN + _shift_left(w, m - 1, 0))
        v = v & _shift_left(valid, m - 1, False)
        out[m] = (h, v)
    return out


def ngram_hashes(ids, cand, word_start, max_n: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """``chain`` over the word units of a batch (what ``pmi.hash_phrases`` stores)."""
    uidx, start = mp.units(cand, word_start)
    w, valid, _ = unit_hashes(ids.to(torch.int64), cand, uidx, start)
    return chain(w, valid, max_n)


PREFILTER_BITS = 22     # a 4 MB bitmap of the hashes' top bits (~5% full at 200k entries)


def prefilter(table: dict[int, torch.Tensor]) -> torch.Tensor:
    """Bool [2**PREFILTER_BITS]: True at the top PREFILTER_BITS bits of every hash of every table."""
    bits = torch.zeros(1 << PREFILTER_BITS, dtype=torch.bool)
    for h in table.values():
        bits[mp.shr(h.cpu(), 64 - PREFILTER_BITS)] = True
    return bits


def _member(h: torch.Tensor, table: torch.Tensor, bits: torch.Tensor | None = None) -> torch.Tensor:
    """h in ``table`` (sorted): the bitmap ``bits`` (``prefilter``) rules most misses out with one lookup, a
    binary search checks the rest (torch.isin re-sorts the table on every call: ~0.4 s per 32 x 128 batch at
    800k entries; a binary search of every element ~90 ms at 256 x 512 and 200k, the bitmap first ~20 ms)."""
    if table.numel() == 0:
        return torch.zeros_like(h, dtype=torch.bool)
    if bits is None:
        return table[torch.searchsorted(table, h).clamp_(max=table.numel() - 1)] == h
    flat = h.reshape(-1)
    maybe = torch.take(bits, mp.shr(flat, 64 - PREFILTER_BITS)).nonzero().squeeze(1)    # 1-D indexing is the fast path
    sub = flat[maybe]
    out = torch.zeros(flat.shape, dtype=torch.bool, device=h.device)
    out[maybe] = table[torch.searchsorted(table, sub).clamp_(max=table.numel() - 1)] == sub
    return out.view(h.shape)


def take_occurrences(table: dict[int, torch.Tensor], grams, pr: torch.Tensor, bits: torch.Tensor | None = None):
    """(covered [B, T] units inside a taken occurrence, occ [B, T]: that occurrence's first unit, -1 elsewhere).
    ``table``: {m: sorted unique int64 hashes}; ``pr``: distinct priorities per row (< 2**53, exact in float64).

    Window sums by cumsum differences and the local maximum by a max-pool over 2m - 1 starts, so the cost does
    not grow with m (a shifted copy per offset was ~15x slower at 256 x 512)."""
    b, t = pr.shape
    dev = pr.device
    ar = torch.arange(t, device=dev)
    covered = torch.zeros(b, t, dtype=torch.bool, device=dev)
    starts = torch.zeros(b, t, dtype=torch.bool, device=dev)
    prf = pr.to(torch.float64)
    for m in sorted((k for k in table if k in grams and k >= 2), reverse=True):
        h, v = grams[m]
        match = v & _member(h, table[m], bits)
        ahead = (ar + m).clamp(max=t).expand(b, t)        # units u .. u+m-1 of an occurrence starting at u
        behind = (ar - m + 1).clamp(min=0).expand(b, t)   # starts u-m+1 .. u of occurrences covering u
        for _ in range(ROUNDS):
            cs = F.pad(covered.cumsum(1), (1, 0))
            free = match & ((cs.gather(1, ahead) - cs[:, :t]) == 0)
            if not bool(free.any()):
                break
            # keep an occurrence when no overlapping free one (start within m-1 either side) has a higher priority
            score = torch.where(free, prf, torch.full_like(prf, -1.0))
            best = F.max_pool1d(score[:, None], 2 * m - 1, stride=1, padding=m - 1)[:, 0]
            win = free & (best == prf)
            cw = F.pad(win.cumsum(1), (1, 0))
            covered |= (cw[:, 1:] - cw.gather(1, behind)) > 0
            starts |= win
            match &= ~win
    # taken occurrences are contiguous and disjoint: a covered unit belongs to the last start at or before it
    last = torch.cummax(torch.where(starts, ar.expand(b, t), torch.full_like(pr, -1)), dim=1).values
    return covered, torch.where(covered, last, torch.full_like(pr, -1))


def select_pmi(ids, cand, word_start, h, p: float, table: dict[int, torch.Tensor],
               bits: torch.Tensor | None = None) -> torch.Tensor:
    """Selected tokens [B, T] (module docstring). ``h``: the Masker's 64-bit per-position hashes (the top
    ``mp.SEL_BITS`` are the selection key, as for whole words)."""
    b, t = ids.shape
    uidx, start = mp.units(cand, word_start)
    w, valid, tok = unit_hashes(ids, cand, uidx, start)
    grams = chain(w, valid, max(table, default=1))
    zeros = torch.zeros(b, t, dtype=torch.int64, device=ids.device)
    ukey = zeros.scatter_add(1, uidx, mp.shr(h, 64 - mp.SEL_BITS) * start)
    # priority among overlapping occurrences: 40 bits of a re-mixed hash, NOT the selection key (the winners
    # of a priority contest would otherwise carry high keys and be selected less than p), then the position
    upr = zeros.scatter_add(1, uidx, mp.shr(mp.mix(h ^ _PRIORITY), 24) * start)
    pr = upr * (t + 1) + torch.arange(t, device=ids.device)
    covered, occ = take_occurrences(table, grams, pr, bits)
    n = cand.sum(1).to(torch.float64)
    c = (tok * covered).sum(1).to(torch.float64)
    budget = p * n
    q_occ = (budget / c.clamp(min=1)).clamp(max=1.0)
    q_word = ((budget - c) / (n - c).clamp(min=1)).clamp(0.0, 1.0)
    scale = float(1 << mp.SEL_BITS)
    thr_occ = (q_occ * scale).round().to(torch.int64)[:, None]
    thr_word = (q_word * scale).round().to(torch.int64)[:, None]
    occ_key = ukey.gather(1, occ.clamp(min=0))
    sel_unit = (covered & (occ_key < thr_occ)) | (~covered & valid & (ukey < thr_word))
    return sel_unit.gather(1, uidx) & cand


__all__ = ["chain", "ngram_hashes", "prefilter", "select_pmi", "take_occurrences", "unit_hashes"]
