"""Masking family for masked-language-model pretraining: token, whole-word, SpanBERT span and PMI masking.

In:  ``input_ids`` LongTensor [B, T] (packed rows ``[CLS] doc [SEP] doc [SEP] ... [PAD]...``), ``word_start``
     uint8/bool [B, T] (1 where a token starts a word), the step (for the rate schedule) and, for static
     masking, ``seq_ids`` [B].
Out: ``MaskedBatch`` (corrupted ids, labels with -100 where not selected, the selection mask, the rate used).

References: BERT (Devlin et al. 2019: 15 %, 80/10/10 replacement; whole-word masking from the BERT repo),
SpanBERT (Joshi et al. 2020: span lengths ~ Geometric(0.2) renormalized over 1..10 words, mean ~3.8),
RoBERTa (dynamic masking), and masking-rate schedules (Wettig et al. 2023; Yang et al. 2023).

Design choices (all vectorized torch, no Python loop over tokens or sequences):

* Selection is **independent (Bernoulli)**, not an exact count per sequence: a candidate token (token),
  a word (whole_word) or a span (span) is selected when its uniform key is below a threshold. The expected
  number of selected tokens is exactly ``p * n_candidates`` for every sequence length (an exact
  ``round(p * n)`` biases short rows and needs a sort); per-row counts are therefore binomial-like.
  Token and whole-word masks are nested across rates (selected at p => selected at any p' > p), so a rate
  schedule never reshuffles a static mask, it only grows or shrinks it.
* whole_word: a unit is a word (a word-start token and the following non-start tokens, up to the next word
  start or non-candidate token); each word is selected with probability p, so p of the candidate *tokens*
  are selected in expectation; words are never split.
* span: a renewal process tiles each segment (document between specials) in word units: span lengths
  L ~ Geometric(span_p) truncated to 1..span_max and renormalized (in words; SpanBERT's distribution:
  P(L = l) = p (1-p)^(l-1) / (1 - (1-p)^span_max); clipping instead would pile the tail onto span_max),
  separated by gaps of one word (zero when the rate is too high for gaps). Each segment starts on a whole
  span or on a gap (with the stationary odds, so the first words of a document are as likely selected as
  any), and its last span is clipped at the segment's end: a span never crosses [SEP] (as SpanBERT clips
  at the sentence end). Each span is then kept independently with probability
  ``p * n_candidates / tokens_covered_by_all_spans`` (per row), so the expected selected-token count is
  ``p * n_candidates`` and kept spans are an unbiased sample of span lengths (the keep decision never
  looks at a span's own length). Kept spans never overlap or touch
  (with the one-word gap), so each run of selected words in the output is one span.
* pmi (Levine et al. 2021): whole collocations from the PMI n-gram vocabulary first, then single words, up
  to the same expected budget; never splits a collocation (``mlm_core.pmi_select``, vocabulary ``mlm_core.pmi``).
* 80/10/10 is decided **per token**, also for whole words and spans (as BERT's original WWM code does).
  Random replacements are drawn uniformly from the vocabulary without special ids.
* Randomness: a counter-based hash (splitmix64 finalizer in wrapping int64 torch arithmetic) of
  (row key, stream, position). Static mode: row key = f(seed, seq_id, copy), so the same sequence gets the
  same mask whatever the batch or step on the same pass over the data; RoBERTa's static masking (k masks per
  sequence, cycled over epochs): copy = pass mod ``static_copies``, the pass given by the caller (the
  sampler's pass over that sequence's language, ``passes``). Copy 0 has the key f(seed, seq_id) of the
  single static mask of earlier versions, so static_copies 1 (or no ``passes``) reproduces it bit for bit. Dynamic mode: row keys are B int64 drawn from the caller's
  ``generator``; the generator advances by exactly that per call, so resuming its state is exact.
* Cost (one CPU thread, this repo's 2-core box): ~0.1 ms (token) to ~0.35 ms (span) for 32 x 128, ~1.5 ms to
  ~4 ms for 256 x 512; every op also runs on CUDA (span does one host sync for the segment count).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mlm_core import mask_primitives as mp
from mlm_core.config import MaskingConfig

IGNORE_INDEX = -100


# static masking: copy c of a sequence's mask adds c * _COPY to its row state (an odd constant, so the k copies of
# one sequence have distinct states; copy 0 is the state of the single static mask of earlier versions)
_COPY = mp.i64(0xA0761D6478BD642F)


def masking_rate(cfg: MaskingConfig, step: int, total_steps: int) -> float:
    """Selection rate p at ``step``.

    constant: cfg.rate. linear / cosine: rate_max at step 0 -> rate_min at step total_steps (held after).
    cyclical: rate_min + (rate_max - rate_min) * |sin(2 pi step / period)|.
    """
    if cfg.schedule == "constant":
        return float(cfg.rate)
    lo, hi = float(cfg.rate_min), float(cfg.rate_max)
    if cfg.schedule == "cyclical":
        return lo + (hi - lo) * abs(math.sin(2 * math.pi * step / cfg.period))
    frac = min(max(step / max(total_steps, 1), 0.0), 1.0)
    if cfg.schedule == "linear":
        return hi + (lo - hi) * frac
    if cfg.schedule == "cosine":
        return lo + (hi - lo) * 0.5 * (1.0 + math.cos(math.pi * frac))
    raise ValueError(f"unknown masking schedule {cfg.schedule!r}")


def span_length_cdf(p: float, max_len: int) -> list[float]:
    """P(L <= k) for k = 1..max_len, L ~ Geometric(p) on {1, 2, ...} conditioned on L <= max_len (SpanBERT)."""
    z = 1.0 - (1.0 - p) ** max_len
    return [(1.0 - (1.0 - p) ** k) / z for k in range(1, max_len + 1)]


def span_length_mean(p: float, max_len: int) -> float:
    """E[L] of that distribution: sum_{k<max_len} P(L > k) (3.797 for SpanBERT's p = 0.2, max_len = 10)."""
    return sum(1.0 - c for c in span_length_cdf(p, max_len)[:-1]) + 1.0


@dataclass
class MaskedBatch:
    input_ids: torch.Tensor   # LongTensor [B, T], corrupted
    labels: torch.Tensor      # LongTensor [B, T], original id where selected, -100 elsewhere
    selected: torch.Tensor    # BoolTensor [B, T]
    rate: float               # the scheduled selection rate p used for this batch


class Masker:
    """Corrupts a batch for MLM. Stateless: all randomness comes from the seed (static) or the caller's generator.

    ``special_ids``: PAD/UNK/CLS/SEP/MASK ids. They are never selected, except ``unk_id`` when given (UNK is
    then an ordinary candidate); random replacements never produce any of them.
    """

    def __init__(self, cfg: MaskingConfig, vocab_size: int, special_ids: list[int], mask_id: int,
                 seed: int = 0, total_steps: int = 1, *, unk_id: int | None = None,
                 collocations: dict[int, torch.Tensor] | None = None):
        specials = sorted({int(i) for i in special_ids} | {int(mask_id)})
        if not all(0 <= i < vocab_size for i in specials):
            raise ValueError(f"special ids {specials} outside the vocabulary [0, {vocab_size})")
        if len(specials) >= vocab_size:
            raise ValueError("the vocabulary has no non-special token to draw random replacements from")
        if vocab_size > 1 << 35:
            raise ValueError(f"vocab_size {vocab_size} too large for the {mp.RID_BITS}-bit random-id draw")
        if cfg.strategy == "pmi" and collocations is None:
            raise ValueError("masking strategy 'pmi' needs the collocation vocabulary (mlm_core.pmi: the tokenizer "
                             "stage writes it when tokenizer.pmi_vocab > 0)")
        # pmi: {unit count: sorted int64 n-gram hashes} (mlm_core.pmi_select)
        self.collocations = {int(m): torch.as_tensor(h, dtype=torch.int64) for m, h in (collocations or {}).items()}
        self.cfg, self.vocab_size, self.mask_id = cfg, int(vocab_size), int(mask_id)
        self.special_ids, self.unk_id = specials, unk_id
        self.seed, self.total_steps = int(seed), int(total_steps)
        never = torch.zeros(vocab_size, dtype=torch.bool)
        never[[i for i in specials if i != unk_id]] = True
        allowed = torch.ones(vocab_size, dtype=torch.bool)
        allowed[specials] = False
        self._never_cpu, self._allowed_cpu = never, allowed.nonzero().squeeze(1)
        self._cache: dict[tuple, torch.Tensor] = {}
        self._seed_key = mp.mix_int(self.seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019)
        self._mean_span = span_length_mean(cfg.span_p, cfg.span_max)
        # span lengths by inverse CDF on integer keys (exact to 2**-24 and identical on every device, unlike a
        # float log): L = 1 + #{k in 1..span_max-1 : key >= 2**24 * P(L <= k)}
        cdf = span_length_cdf(cfg.span_p, cfg.span_max)[:-1]
        self._len_bounds_cpu = torch.tensor([mp.threshold(c, mp.SPAN_BITS) for c in cdf], dtype=torch.int64)
        pm, pr = cfg.mask_token_prob, cfg.random_token_prob
        self._act_mask, self._act_rand = mp.threshold(pm, mp.ACT_BITS), mp.threshold(pm + pr, mp.ACT_BITS)

    # -- cached device constants --------------------------------------------------------------------------
    def _const(self, name: str, device: torch.device, n: int = 0) -> torch.Tensor:
        key = (name, device, n)
        if key not in self._cache:
            if name == "never":
                v = self._never_cpu
            elif name == "allowed":
                v = self._allowed_cpu
            elif name == "len_bounds":
                v = self._len_bounds_cpu
            elif name == "arange":
                v = torch.arange(n, dtype=torch.int64)
            else:   # Weyl increments of one stream: offset + i * golden (wrapping)
                v = torch.arange(n, dtype=torch.int64) * mp.GOLDEN + (mp.STREAM_POS if name == "pos" else mp.STREAM_SPAN)
            self._cache[key] = v.to(device)
        return self._cache[key]

    def _colloc(self, m, device: torch.device) -> torch.Tensor:
        """The sorted hashes of m-unit collocations on ``device`` (m = "bits": their prefilter bitmap)."""
        key = ("colloc", device, m)
        if key not in self._cache:
            if m == "bits":
                from mlm_core.pmi_select import prefilter
                self._cache[key] = prefilter(self.collocations).to(device)
            else:
                self._cache[key] = self.collocations[m].to(device)
        return self._cache[key]

    # -- randomness -----------------------------------------------------------------------------------
    def _row_keys(self, b: int, device: torch.device, seq_ids, generator, passes=None) -> torch.Tensor:
        if self.cfg.mode == "static":
            if seq_ids is None:
                raise ValueError("static masking needs seq_ids (the mask is a function of the sequence id)")
            seq = torch.as_tensor(seq_ids, dtype=torch.int64, device=device).reshape(-1)
            if seq.numel() != b:
                raise ValueError(f"seq_ids has {seq.numel()} entries for a batch of {b}")
            state = seq * mp.GOLDEN + self._seed_key
            if passes is not None and self.cfg.static_copies > 1:
                pas = torch.as_tensor(passes, dtype=torch.int64, device=device).reshape(-1)
                if pas.numel() != b or bool((pas < 0).any()):
                    raise ValueError(f"passes must hold {b} non-negative pass indices, got {pas.numel()} entries")
                state += (pas % self.cfg.static_copies) * _COPY     # copy 0 adds nothing: the old key
            return mp.mix(state)
        gdev = generator.device if generator is not None else torch.device("cpu")
        keys = torch.randint(-(1 << 63), (1 << 63) - 1, (b,), generator=generator, dtype=torch.int64, device=gdev)
        return keys.to(device)

    def _hash(self, row_key: torch.Tensor, stream: str, n: int) -> torch.Tensor:
        """[B, n] int64 hashes: splitmix64 over the row's Weyl sequence (state row_key + offset + i * golden)."""
        return mp.mix(row_key[:, None] + self._const(stream, row_key.device, n)[None, :])

    # -- selection --------------------------------------------------------------------------------------
    @staticmethod
    def _units(cand: torch.Tensor, word_start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return mp.units(cand, word_start)

    def _select_whole_word(self, cand, word_start, sel_key, thr) -> torch.Tensor:
        uidx, start = self._units(cand, word_start)
        b, t = cand.shape
        # a word is selected when the key drawn at its first token is below thr; spread that over the word
        # (scatter-add of 0/1 flags: only the start contributes; torch.where is slow on CPU, so avoided)
        chosen = torch.zeros(b, t, dtype=torch.int64, device=cand.device)
        chosen.scatter_add_(1, uidx, ((sel_key < thr) & start).to(torch.int64))
        return chosen.gather(1, uidx).bool() & cand

    def _select_span(self, cand, word_start, row_key, p) -> torch.Tensor:
        cfg, dev = self.cfg, cand.device
        b, t = cand.shape
        uidx, _ = self._units(cand, word_start)
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
        gap = 1 if p <= 0.75 * self._mean_span / (self._mean_span + 1) else 0
        stride = cfg.span_max + gap                               # longest cycle: a span start in every stride
        x_max = t + (n_seg + 1) * stride + 1
        m = x_max // (1 + gap) + 1                                # the tiling reaches x_max
        h = self._hash(row_key, "span", m)
        bounds = self._const("len_bounds", dev)
        length = torch.searchsorted(bounds, mp.shr(h, 64 - mp.SPAN_BITS), right=True).add_(1)   # 1..span_max
        cycle = length + gap
        c = cycle.cumsum(1) - length                              # span starts; the first at coordinate `gap`
        # per segment k (column k of [b, n_seg + 1]; column 0 = before the first segment): its first unit
        # sigma_k, then the coordinate shift that lands it on span j_k (or on the gap before it)
        ar = self._const("arange", dev, t + 1)
        sigma = torch.zeros(b, n_seg + 1, dtype=torch.int64, device=dev)
        sigma.scatter_add_(1, seg, ar * seg_start)
        tau = sigma + self._const("arange", dev, n_seg + 1).sub(1).clamp_(min=0) * stride
        j = torch.searchsorted(c, tau).clamp_(max=m - 1)          # first span starting at/after tau
        q = self._mean_span / (self._mean_span + gap)
        gap_first = (h.gather(1, j) & 0xFFFF) >= mp.threshold(q, 16)
        shift = c.gather(1, j) - gap * gap_first - sigma
        shift[:, 0] = 0
        x = (ar + shift.gather(1, seg)).clamp_(0, x_max)
        # which span covers each coordinate (1-based id, 0 in gaps): spans never overlap, so a cumsum of
        # +id at the start and -id at the end gives it
        ids = self._const("arange", dev, m + 1)[None, 1:].expand(b, m)
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

    # -- public -----------------------------------------------------------------------------------------
    def __call__(self, input_ids: torch.Tensor, word_start: torch.Tensor, step: int,
                 seq_ids: torch.Tensor | None = None, generator: torch.Generator | None = None,
                 passes: torch.Tensor | None = None) -> MaskedBatch:
        """Corrupt a batch. Static mode reads ``seq_ids`` [B] and, when given, ``passes`` [B] (each row's pass
        over its language's rows: copy pass mod static_copies; None = copy 0); dynamic mode reads ``generator``."""
        if input_ids.dim() != 2 or word_start.shape != input_ids.shape:
            raise ValueError(f"expected input_ids and word_start of the same shape [B, T], got "
                             f"{tuple(input_ids.shape)} and {tuple(word_start.shape)}")
        ids = input_ids.to(torch.int64)
        dev = ids.device
        b, t = ids.shape
        p = masking_rate(self.cfg, step, self.total_steps)
        cand = ~torch.take(self._const("never", dev), ids)
        ws = word_start.to(device=dev, dtype=torch.bool)
        row_key = self._row_keys(b, dev, seq_ids, generator, passes)
        h = self._hash(row_key, "pos", t)                          # one 64-bit hash per position
        strategy = self.cfg.strategy
        if strategy == "span":
            sel = self._select_span(cand, ws, row_key, p)
        else:
            sel_key, thr = mp.shr(h, 64 - mp.SEL_BITS), mp.threshold(p, mp.SEL_BITS)
            if strategy == "token":
                sel = (sel_key < thr) & cand
            elif strategy == "whole_word":
                sel = self._select_whole_word(cand, ws, sel_key, thr)
            elif strategy == "pmi":     # PMI-masking: collocations first, then words (mlm_core.pmi_select)
                from mlm_core.pmi_select import select_pmi
                table = {m: self._colloc(m, dev) for m in self.collocations}
                sel = select_pmi(ids, cand, ws, h, p, table, self._colloc("bits", dev))
            else:
                raise ValueError(f"unknown masking strategy {strategy!r}")
        # 80/10/10, decided per token (also inside whole words and spans)
        act = (h >> mp.ACT_SHIFT) & ((1 << mp.ACT_BITS) - 1)
        to_mask = sel & (act < self._act_mask)
        to_rand = sel & (act < self._act_rand) & ~to_mask
        allowed = self._const("allowed", dev)
        rid = torch.take(allowed, ((h & ((1 << mp.RID_BITS) - 1)) * allowed.numel()) >> mp.RID_BITS)
        out = mp.blend(ids, to_mask, self.mask_id)
        out = mp.blend(out, to_rand, rid)
        labels = mp.blend(ids, ~sel, IGNORE_INDEX)
        return MaskedBatch(out, labels, sel, p)

    def state_dict(self) -> dict:
        """Stateless: nothing to save (static masks are a function of the seed; dynamic ones of the caller's RNG)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"Masker is stateless; unexpected state keys {sorted(state)}")
