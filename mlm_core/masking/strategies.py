"""Masking strategies as objects: which tokens a batch selects (token, whole word, SpanBERT span, PMI), and how
many positions the compiled training step must budget for them.

In:  a ``Draw`` (the batch's ids, candidate and word-start flags, the Masker's per-position hashes and row keys,
     the scheduled rate p). Out: the selected tokens, BoolTensor [B, T]. The 80/10/10 replacement that follows
     is the Masker's, the same for every strategy.

``STRATEGIES`` is the one place a strategy name (``pretrain.masking.strategy``) is looked up; everything else asks
the class it returns (``strategy_class``). Each class owns:

* ``select(draw)``: the selection (the ``mlm_core.masking`` package docstring describes each);
* ``budget_unit(cfg)``: u, the tokens per independently selected unit that the compiled step's fixed
  masked-position budget assumes (``mlm_core.train.compiled.masked_budget``: sigma^2 = p (1 - p) x B x T x u).
  An upper bound on the mean size-weighted unit length on real text: 1 token, 2 for whole words, span_max for
  spans, 10 for PMI (collocations of up to 5 words);
* ``needs_collocations``: whether it reads the PMI n-gram vocabulary (``mlm_core.masking.pmi``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from mlm_core.config import MaskingConfig
from mlm_core.masking import primitives as mp


@dataclass(frozen=True)
class Draw:
    """What a strategy selects from: one batch and the Masker's randomness for it."""
    ids: torch.Tensor          # LongTensor [B, T]
    cand: torch.Tensor         # BoolTensor [B, T]: may be selected (not a special, except UNK)
    word_start: torch.Tensor   # BoolTensor [B, T]
    pos_hash: torch.Tensor     # int64 [B, T]: one 64-bit hash per position (``primitives`` bit layout)
    row_key: torch.Tensor      # int64 [B]: the row's key (static: from the sequence id; dynamic: drawn)
    rate: float                # the scheduled selection rate p


class MaskingStrategy(Protocol):
    """A selection rule; constructed once per Masker as ``cls(cfg, collocations)``."""
    needs_collocations: ClassVar[bool]

    def __init__(self, cfg: MaskingConfig, collocations: dict[int, torch.Tensor] | None = None) -> None: ...

    @classmethod
    def budget_unit(cls, cfg: MaskingConfig) -> float:
        """Tokens per independently selected unit, for the compiled step's masked-position budget."""
        ...

    def select(self, draw: Draw) -> torch.Tensor:
        """Selected tokens, BoolTensor [B, T] (never outside ``draw.cand``)."""
        ...


def selection_key(pos_hash: torch.Tensor) -> torch.Tensor:
    """The top ``SEL_BITS`` of each position's hash: selected at rate p when below ``threshold(p, SEL_BITS)``."""
    return mp.shr(pos_hash, 64 - mp.SEL_BITS)


class TokenMasking:
    """BERT: each candidate token independently with probability p."""
    needs_collocations = False

    def __init__(self, cfg: MaskingConfig, collocations=None):
        self.cfg = cfg

    @classmethod
    def budget_unit(cls, cfg: MaskingConfig) -> float:
        return 1.0

    def select(self, draw: Draw) -> torch.Tensor:
        return (selection_key(draw.pos_hash) < mp.threshold(draw.rate, mp.SEL_BITS)) & draw.cand


class WholeWordMasking:
    """Whole words (BERT's WWM): a word is selected when the key drawn at its first token is below the threshold."""
    needs_collocations = False

    def __init__(self, cfg: MaskingConfig, collocations=None):
        self.cfg = cfg

    @classmethod
    def budget_unit(cls, cfg: MaskingConfig) -> float:
        return 2.0

    def select(self, draw: Draw) -> torch.Tensor:
        cand = draw.cand
        sel_key, thr = selection_key(draw.pos_hash), mp.threshold(draw.rate, mp.SEL_BITS)
        uidx, start = mp.units(cand, draw.word_start)
        b, t = cand.shape
        # spread the start's decision over the word (scatter-add of 0/1 flags: only the start contributes;
        # torch.where is slow on CPU, so avoided)
        chosen = torch.zeros(b, t, dtype=torch.int64, device=cand.device)
        chosen.scatter_add_(1, uidx, ((sel_key < thr) & start).to(torch.int64))
        return chosen.gather(1, uidx).bool() & cand


def span_length_cdf(p: float, max_len: int) -> list[float]:
    """P(L <= k) for k = 1..max_len, L ~ Geometric(p) on {1, 2, ...} conditioned on L <= max_len (SpanBERT)."""
    z = 1.0 - (1.0 - p) ** max_len
    return [(1.0 - (1.0 - p) ** k) / z for k in range(1, max_len + 1)]


def span_length_mean(p: float, max_len: int) -> float:
    """E[L] of that distribution: sum_{k<max_len} P(L > k) (3.797 for SpanBERT's p = 0.2, max_len = 10)."""
    return sum(1.0 - c for c in span_length_cdf(p, max_len)[:-1]) + 1.0


class SpanMasking:
    """SpanBERT spans in word units, tiled by a renewal process per document and kept independently."""
    needs_collocations = False

    def __init__(self, cfg: MaskingConfig, collocations=None):
        self.cfg = cfg
        self.mean_span = span_length_mean(cfg.span_p, cfg.span_max)
        # span lengths by inverse CDF on integer keys (exact to 2**-24 and identical on every device, unlike a
        # float log): L = 1 + #{k in 1..span_max-1 : key >= 2**24 * P(L <= k)}
        cdf = span_length_cdf(cfg.span_p, cfg.span_max)[:-1]
        self._len_bounds_cpu = torch.tensor([mp.threshold(c, mp.SPAN_BITS) for c in cdf], dtype=torch.int64)
        self._const = mp.DeviceConstants()

    @classmethod
    def budget_unit(cls, cfg: MaskingConfig) -> float:
        return float(cfg.span_max)

    def _arange(self, n: int, dev: torch.device) -> torch.Tensor:
        return self._const.get(("arange", n), dev, lambda: torch.arange(n, dtype=torch.int64))

    def select(self, draw: Draw) -> torch.Tensor:
        cfg, cand, row_key, p = self.cfg, draw.cand, draw.row_key, draw.rate
        dev = cand.device
        b, t = cand.shape
        uidx, _ = mp.units(cand, draw.word_start)
        # candidate tokens per unit; a unit with none is a boundary (special, padding, past the row's end)
        tok = torch.zeros(b, t + 1, dtype=torch.int64, device=dev)
        tok.scatter_add_(1, uidx, cand.to(torch.int64))
        bound = tok == 0
        seg_start = ~bound                                        # first unit of each segment (document)
        seg_start[:, 1:] &= bound[:, :-1]
        seg = seg_start.cumsum(1)                                 # segment number, 1-based (0 before the first)
        n_seg = int(seg[:, -1].max()) if b else 0
        # One renewal tiling per row in a coordinate space: span, gap, span, gap, ...; segment k reads it
        # from the first span at/after coordinate sigma_k + (k-1) * stride (so segments never share a span),
        # starting either on that span or on the gap before it (probability 1 - q: stationary coverage at
        # document starts, and every span starts whole); it is clipped at the segment's end.
        gap = 1 if p <= 0.75 * self.mean_span / (self.mean_span + 1) else 0
        stride = cfg.span_max + gap                               # longest cycle: a span start in every stride
        x_max = t + (n_seg + 1) * stride + 1
        m = x_max // (1 + gap) + 1                                # the tiling reaches x_max
        h = mp.stream_hash(row_key, self._const.get(("span", m), dev, lambda: mp.weyl(mp.STREAM_SPAN, m)))
        bounds = self._const.get("len_bounds", dev, lambda: self._len_bounds_cpu)
        length = torch.searchsorted(bounds, mp.shr(h, 64 - mp.SPAN_BITS), right=True).add_(1)   # 1..span_max
        cycle = length + gap
        c = cycle.cumsum(1) - length                              # span starts; the first at coordinate `gap`
        # per segment k (column k of [b, n_seg + 1]; column 0 = before the first segment): its first unit
        # sigma_k, then the coordinate shift that lands it on span j_k (or on the gap before it)
        ar = self._arange(t + 1, dev)
        sigma = torch.zeros(b, n_seg + 1, dtype=torch.int64, device=dev)
        sigma.scatter_add_(1, seg, ar * seg_start)
        tau = sigma + self._arange(n_seg + 1, dev).sub(1).clamp_(min=0) * stride
        j = torch.searchsorted(c, tau).clamp_(max=m - 1)          # first span starting at/after tau
        q = self.mean_span / (self.mean_span + gap)
        gap_first = (h.gather(1, j) & 0xFFFF) >= mp.threshold(q, 16)
        shift = c.gather(1, j) - gap * gap_first - sigma
        shift[:, 0] = 0
        x = (ar + shift.gather(1, seg)).clamp_(0, x_max)
        # which span covers each coordinate (1-based id, 0 in gaps): spans never overlap, so a cumsum of
        # +id at the start and -id at the end gives it
        ids = self._arange(m + 1, dev)[None, 1:].expand(b, m)
        cover = torch.zeros(b, x_max + 2, dtype=torch.int64, device=dev)
        cover.scatter_add_(1, c.clamp(max=x_max + 1), ids)
        cover.scatter_add_(1, (c + length).clamp_(max=x_max + 1), -ids)
        span_of_unit = cover.cumsum_(1).gather(1, x)             # boundary units hold no candidate: harmless
        # keep each span with probability budget / tokens covered by all spans: E[selected] = p * candidates
        covered = (tok * (span_of_unit > 0)).sum(1)
        keep_p = (p * cand.sum(1)) / covered.clamp(min=1)
        keep_thr = (keep_p.clamp_(max=1.0) * (1 << mp.SPAN_BITS)).round_().to(torch.int64)
        keep = torch.zeros(b, m + 1, dtype=torch.bool, device=dev)
        keep[:, 1:] = ((h >> 16) & ((1 << mp.SPAN_BITS) - 1)) < keep_thr[:, None]
        return keep.gather(1, span_of_unit).gather(1, uidx) & cand


class PmiMasking:
    """PMI-masking (Levine et al. 2021): collocations first, then words (``pmi_select``; vocabulary ``pmi``)."""
    needs_collocations = True

    def __init__(self, cfg: MaskingConfig, collocations: dict[int, torch.Tensor] | None = None):
        if collocations is None:
            raise ValueError("masking strategy 'pmi' needs the collocation vocabulary (mlm_core.masking.pmi: the "
                             "tokenizer stage writes it when tokenizer.pmi_vocab > 0)")
        self.cfg = cfg
        # {unit count: sorted int64 n-gram hashes} (pmi_select)
        self.collocations = {int(m): torch.as_tensor(h, dtype=torch.int64) for m, h in collocations.items()}
        self._const = mp.DeviceConstants()

    @classmethod
    def budget_unit(cls, cfg: MaskingConfig) -> float:
        return 10.0

    def select(self, draw: Draw) -> torch.Tensor:
        from mlm_core.masking.pmi_select import prefilter, select_pmi
        dev = draw.ids.device
        table = {m: self._const.get(("colloc", m), dev, lambda m=m: self.collocations[m]) for m in self.collocations}
        bits = self._const.get("bits", dev, lambda: prefilter(self.collocations))
        return select_pmi(draw.ids, draw.cand, draw.word_start, draw.pos_hash, draw.rate, table, bits)


# the one registry: ``pretrain.masking.strategy`` -> its class (config_train.MaskingConfig lists the same names)
STRATEGIES: dict[str, type[MaskingStrategy]] = {
    "token": TokenMasking,
    "whole_word": WholeWordMasking,
    "span": SpanMasking,
    "pmi": PmiMasking,
}


def strategy_class(name: str) -> type[MaskingStrategy]:
    """The class of ``pretrain.masking.strategy`` ``name``."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown masking strategy {name!r} (pretrain.masking.strategy: one of "
                         f"{', '.join(STRATEGIES)})") from None


__all__ = ["Draw", "MaskingStrategy", "PmiMasking", "STRATEGIES", "SpanMasking", "TokenMasking", "WholeWordMasking",
           "selection_key", "span_length_cdf", "span_length_mean", "strategy_class"]
