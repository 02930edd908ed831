"""Statistical and contract tests of mlm_core.masking over >= 1M candidate tokens per check (80 batches of 128 x 128)."""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from mlm_core.config import MaskingConfig
from mlm_core.config.io import ConfigError, load_config
from mlm_core.masking import Masker, MaskedBatch, masking_rate

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIALS = [PAD, UNK, CLS, SEP, MASK]
NEVER = [PAD, CLS, SEP, MASK]
VOCAB = 1000
B, T, N_BATCHES = 128, 128, 80


def make_rows(n: int, t: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed rows: [CLS] doc [SEP] doc [SEP] ... [PAD]...; words of ~1.5 tokens; ~1 % UNK; 30 % rows padded."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, VOCAB, size=(n, t))
    ids[rng.random((n, t)) < 0.01] = UNK
    ws = rng.random((n, t)) < 0.65
    ids[rng.random((n, t)) < 1 / 50] = SEP                       # document boundaries (~50 tokens a doc)
    length = np.where(rng.random(n) < 0.3, rng.integers(t // 4, t, size=n), t)
    pos = np.arange(t)[None, :]
    ids[pos == length[:, None] - 1] = SEP
    ids[pos >= length[:, None]] = PAD
    ids[:, 0] = CLS
    special = np.isin(ids, NEVER)
    after = np.zeros_like(special)
    after[:, 1:] = special[:, :-1]
    ws = (ws | after) & ~special
    return torch.from_numpy(ids), torch.from_numpy(ws.astype(np.uint8))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def rows() -> tuple[torch.Tensor, torch.Tensor]:
    return corpus()


@functools.lru_cache(maxsize=1)
def corpus() -> tuple[torch.Tensor, torch.Tensor]:
    return make_rows(B * N_BATCHES, T)


def masker(**kw) -> Masker:
    seed = kw.pop("seed", 0)
    return Masker(MaskingConfig(**kw), VOCAB, SPECIALS, MASK, seed=seed, total_steps=1000, unk_id=UNK)


@functools.lru_cache(maxsize=16)
def masked(**kw) -> MaskedBatch:
    """The whole corpus masked batch by batch (80 calls, one generator), cached across tests."""
    ids, ws = corpus()
    m, g = masker(**kw), torch.Generator().manual_seed(0)
    outs = [m(ids[i:i + B], ws[i:i + B], 0, seq_ids=torch.arange(i, i + B), generator=g)
            for i in range(0, ids.shape[0], B)]
    return MaskedBatch(torch.cat([o.input_ids for o in outs]), torch.cat([o.labels for o in outs]),
                       torch.cat([o.selected for o in outs]), outs[0].rate)


def candidates(ids: torch.Tensor) -> torch.Tensor:
    return ~torch.isin(ids, torch.tensor(NEVER))


def units(ids: torch.Tensor, ws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Word id per position (every non-candidate its own unit) and word-start flags, as the spec defines words."""
    cand = candidates(ids)
    prev = torch.zeros_like(cand)
    prev[:, 1:] = cand[:, :-1]
    start = ~cand | ws.bool() | ~prev
    return start.cumsum(1) - 1, start


def assert_words_whole(ids, ws, sel):
    """Every continuation token of a word has the selection of the token before it (same word)."""
    _, start = units(ids, ws)
    cont = (candidates(ids) & ~start)[:, 1:]
    assert torch.equal(sel[:, 1:][cont], sel[:, :-1][cont]), "a word is partly selected"


# --- selection rate, specials, whole words ------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["token", "whole_word", "span"])
@pytest.mark.parametrize("rate", [0.15, 0.3])
def test_selection_rate_and_specials(rows, strategy, rate):
    ids, ws = rows
    out = masked(strategy=strategy, rate=rate)
    cand = candidates(ids)
    assert cand.sum() >= 1_000_000, "statistics over at least 1M candidate tokens"
    assert not out.selected[~cand].any(), "a special or padding token was selected"
    assert abs(out.selected.sum().item() / cand.sum().item() - rate) < 0.005
    assert out.selected[ids == UNK].any(), "UNK is an ordinary candidate when unk_id is given"
    assert torch.equal(out.labels[out.selected], ids[out.selected])
    assert (out.labels[~out.selected] == -100).all()
    assert torch.equal(out.input_ids[~out.selected], ids[~out.selected])
    if strategy != "token":
        assert_words_whole(ids, ws, out.selected)


def test_word_check_catches_split_words():
    """Sanity of the checker itself: token masking does split words."""
    ids, ws = corpus()
    with pytest.raises(AssertionError, match="partly"):
        assert_words_whole(ids, ws, masked(strategy="token", rate=0.15).selected)


def test_unk_never_selected_without_unk_id(rows):
    ids, ws = rows
    m = Masker(MaskingConfig(strategy="whole_word"), VOCAB, SPECIALS, MASK)
    out = m(ids[:B], ws[:B], 0, generator=torch.Generator().manual_seed(0))
    assert not out.selected[torch.isin(ids[:B], torch.tensor(SPECIALS))].any()


@pytest.mark.parametrize("strategy,pm,pr", [("token", 0.8, 0.1), ("whole_word", 0.8, 0.1), ("span", 0.8, 0.1),
                                           ("token", 0.5, 0.3)])
def test_80_10_10_split(rows, strategy, pm, pr):
    ids, _ = rows
    out = masked(strategy=strategy, rate=0.15, mask_token_prob=pm, random_token_prob=pr)
    sel = out.selected
    n = sel.sum().item()
    to_mask = (sel & (out.input_ids == MASK)).sum().item() / n
    kept = (sel & (out.input_ids == ids)).sum().item() / n       # includes random draws equal to the original
    assert abs(to_mask - pm) < 0.01 and abs(kept - (1 - pm - pr)) < 0.01 and abs(1 - to_mask - kept - pr) < 0.01
    random_pos = sel & (out.input_ids != MASK) & (out.input_ids != ids)
    assert not torch.isin(out.input_ids[random_pos], torch.tensor(SPECIALS)).any()
    # random ids cover the non-special vocabulary roughly uniformly
    counts = torch.bincount(out.input_ids[random_pos], minlength=VOCAB)[len(SPECIALS):].double()
    assert counts.min() > 0 and counts.std() / counts.mean() < 0.25


# --- span length ----------------------------------------------------------------------------------------
# Upper 1e-4 quantiles of chi-square with k degrees of freedom (tables; scipy.stats.chi2.ppf(1 - 1e-4, k)).
CHI2_1E4 = {3: 21.108, 9: 33.720}


def spanbert_pmf(p: float, max_len: int) -> np.ndarray:
    """SpanBERT (Joshi et al. 2020, sec. 3.1): l ~ Geo(p) "clipped at l_max" in the paper's words, which the
    reference code and the paper's stated mean (3.8 for p = 0.2, l_max = 10) show to be a truncation renormalized
    over 1..l_max: P(l) = p (1-p)^(l-1) / sum_{k=1}^{l_max} p (1-p)^(k-1)."""
    w = np.array([p * (1 - p) ** (k - 1) for k in range(1, max_len + 1)])
    return w / w.sum()


def test_spanbert_pmf_matches_the_paper():
    """The paper's figure: mean span length 3.8 words at p = 0.2, l_max = 10 (clipping would give 4.46)."""
    pmf = spanbert_pmf(0.2, 10)
    assert round(float((np.arange(1, 11) * pmf).sum()), 1) == 3.8


@pytest.mark.parametrize("span_p,span_max,rate", [(0.2, 10, 0.15), (0.2, 10, 0.3), (0.5, 4, 0.15)])
def test_span_length_pmf(rows, span_p, span_max, rate):
    """Span lengths in words follow SpanBERT's renormalized geometric pmf (computed here, not by the code).

    Each run of selected words is one span (spans never touch); runs that start at least span_max words before
    the end of their document cannot have been clipped by it, and choosing them looks only at the start, so
    their lengths are an unbiased sample. Chi-square goodness of fit at the 1e-4 level (the masks are seeded,
    so the test is deterministic; the level only says how unlucky a correct sampler could be), plus the mean.
    Clipping instead of renormalizing puts 13 % of spans at 10 words instead of 3 % and fails by a factor ~100."""
    ids, ws = rows
    out = masked(strategy="span", rate=rate, span_p=span_p, span_max=span_max)
    assert_words_whole(ids, ws, out.selected)
    uidx, start = units(ids, ws)
    cand = candidates(ids)
    sel = out.selected
    prev_sel = torch.zeros_like(sel)
    prev_sel[:, 1:] = sel[:, :-1]
    run_start = sel & ~prev_sel
    # words left in the document from each position: up to the first non-candidate (every row ends in one)
    assert not cand[:, -1].any()
    pos = torch.arange(T).expand_as(ids)
    nb_pos = torch.where(~cand, pos, T - 1).flip(1).cummin(1).values.flip(1)
    room = uidx.gather(1, nb_pos) - uidx
    run_id = (run_start.flatten().cumsum(0) - 1).reshape(sel.shape)
    words = torch.bincount(run_id[sel & start], minlength=int(run_start.sum()))
    assert words.min() >= 1 and words.max() <= span_max
    far = words[room[run_start] >= span_max].numpy()
    n = far.size
    assert n > 5000
    observed = np.bincount(far, minlength=span_max + 1)[1:]
    expected = n * spanbert_pmf(span_p, span_max)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_1E4[span_max - 1], (chi2, observed.tolist(), expected.round(1).tolist())
    mean = far.mean()
    expected_mean = float((np.arange(1, span_max + 1) * spanbert_pmf(span_p, span_max)).sum())
    sd = float(np.sqrt((np.arange(1, span_max + 1) ** 2 * spanbert_pmf(span_p, span_max)).sum() - expected_mean ** 2))
    assert abs(mean - expected_mean) < 4 * sd / np.sqrt(n), (mean, expected_mean)


@pytest.mark.parametrize("strategy", ["whole_word", "span"])
def test_first_words_of_a_document_are_not_neglected(rows, strategy):
    """Clipping spans at [SEP] must not leave a shadow over the next document's first words."""
    ids, ws = rows
    uidx, _ = units(ids, ws)
    cand = candidates(ids)
    last_nc = torch.where(~cand, uidx, -1).cummax(1).values
    offset = uidx - last_nc - 1                                   # word index within the document
    sel = masked(strategy=strategy, rate=0.15).selected
    base = sel[cand].double().mean().item()
    for k in range(3):
        at_k = sel[cand & (offset == k)].double().mean().item()
        assert abs(at_k / base - 1) < 0.1, (k, at_k, base)


# --- static / dynamic ------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["token", "whole_word", "span"])
def test_static_mask_is_a_function_of_the_sequence(rows, strategy):
    ids, ws = rows[0][:2 * B], rows[1][:2 * B]
    m = masker(strategy=strategy, mode="static", seed=7)
    seq = torch.arange(1000, 1000 + 2 * B)
    a = m(ids[:B], ws[:B], 0, seq_ids=seq[:B])
    perm = torch.randperm(2 * B, generator=torch.Generator().manual_seed(1))[:B]   # other batch-mates, order
    b = m(ids[perm], ws[perm], 500, seq_ids=seq[perm], generator=torch.Generator().manual_seed(3))
    for j, r in enumerate(perm.tolist()):
        if r < B:
            assert torch.equal(b.selected[j], a.selected[r]) and torch.equal(b.input_ids[j], a.input_ids[r])
    assert (perm < B).sum() > 10
    # another seed, another mask
    c = masker(strategy=strategy, mode="static", seed=8)(ids[:B], ws[:B], 0, seq_ids=seq[:B])
    assert not torch.equal(c.selected, a.selected)
    with pytest.raises(ValueError):
        m(ids[:B], ws[:B], 0)


@pytest.mark.parametrize("strategy", ["token", "whole_word", "span"])
def test_dynamic_differs_per_call_and_resumes_exactly(rows, strategy):
    ids, ws = rows[0][:B], rows[1][:B]
    m = masker(strategy=strategy, mode="dynamic")
    g = torch.Generator().manual_seed(123)
    first = m(ids, ws, 0, generator=g)
    saved = g.get_state()
    second = m(ids, ws, 1, generator=g)
    assert not torch.equal(first.selected, second.selected)
    g2 = torch.Generator()
    g2.set_state(saved)
    again = m(ids, ws, 1, generator=g2)
    assert torch.equal(again.selected, second.selected) and torch.equal(again.input_ids, second.input_ids)
    assert torch.equal(again.labels, second.labels)
    assert m.state_dict() == {}
    m.load_state_dict({})


# --- schedules -------------------------------------------------------------------------------------------
def test_schedules():
    lo, hi, period = 0.1, 0.4, 400
    cyc = MaskingConfig(schedule="cyclical", rate_min=lo, rate_max=hi, period=period)
    for t in (0, period // 4, period // 2, 3 * period // 4, period):
        assert masking_rate(cyc, t, 10_000) == pytest.approx(lo + (hi - lo) * abs(math.sin(2 * math.pi * t / period)))
    assert masking_rate(cyc, 0, 1) == pytest.approx(lo)
    assert masking_rate(cyc, period // 4, 1) == pytest.approx(hi)
    assert masking_rate(cyc, period // 2, 1) == pytest.approx(lo)
    for kind in ("linear", "cosine"):
        c = MaskingConfig(schedule=kind, rate_min=lo, rate_max=hi)
        assert masking_rate(c, 0, 1000) == pytest.approx(hi)
        assert masking_rate(c, 1000, 1000) == pytest.approx(lo)
        assert masking_rate(c, 5000, 1000) == pytest.approx(lo)
        assert masking_rate(c, 500, 1000) == pytest.approx((lo + hi) / 2)
    assert masking_rate(MaskingConfig(schedule="linear", rate_min=lo, rate_max=hi), 250, 1000) == pytest.approx(0.325)
    cos_q = lo + (hi - lo) * 0.5 * (1 + math.cos(math.pi / 4))
    assert masking_rate(MaskingConfig(schedule="cosine", rate_min=lo, rate_max=hi), 250, 1000) == pytest.approx(cos_q)
    assert masking_rate(MaskingConfig(rate=0.2), 12345, 10) == 0.2


def test_scheduled_rate_reaches_the_masker(rows):
    m = Masker(MaskingConfig(schedule="linear", rate_min=0.1, rate_max=0.3), VOCAB, SPECIALS, MASK, total_steps=100)
    ids, ws = rows[0][:B], rows[1][:B]
    assert m(ids, ws, 0).rate == pytest.approx(0.3)
    assert m(ids, ws, 100).rate == pytest.approx(0.1)


# --- config validation -----------------------------------------------------------------------------------
def _load(masking: dict):
    return load_config(raw={"sources": {"en": {"paths": ["x"]}}, "pretrain": {"masking": masking}})


@pytest.mark.parametrize("masking", [{"rate": 0}, {"rate": 1}, {"rate": -0.1}, {"rate": 1.5},
                                     {"mask_token_prob": 0.8, "random_token_prob": 0.3},
                                     {"rate_min": 0.4, "rate_max": 0.2, "schedule": "linear"},
                                     {"strategy": "ngram"}])
def test_bad_masking_config_is_rejected(masking):
    with pytest.raises(ConfigError):
        _load(masking)


def test_good_masking_config_loads():
    cfg = _load({"strategy": "span", "rate": 0.2, "mask_token_prob": 0.9, "random_token_prob": 0.1}).config
    assert cfg.pretrain.masking.strategy == "span"


def test_hash_rng_is_uniform():
    """The counter-based hash gives uniform, uncorrelated keys even for consecutive seq ids and positions."""
    m = Masker(MaskingConfig(mode="static", rate=0.5), VOCAB, SPECIALS, MASK)
    ids = torch.full((4096, 256), 10)
    out = m(ids, torch.ones_like(ids, dtype=torch.uint8), 0, seq_ids=torch.arange(4096))
    s = out.selected.double()
    assert abs(s.mean().item() - 0.5) < 0.002
    # per-position and per-sequence rates scatter as binomial noise does (no stuck bits, no bad seeds)
    assert s.mean(0).std().item() == pytest.approx(0.5 / math.sqrt(4096), rel=0.15)
    assert s.mean(1).std().item() == pytest.approx(0.5 / math.sqrt(256), rel=0.1)
    # neighbours (positions, sequences) are uncorrelated
    assert abs(((s[:, 1:] - 0.5) * (s[:, :-1] - 0.5)).mean().item()) < 0.002
    assert abs(((s[1:] - 0.5) * (s[:-1] - 0.5)).mean().item()) < 0.002


# --- static copies (RoBERTa: k masks per sequence cycled over epochs; issue 21) ---------------------------
# tests/data/static_masks_head.npz: the single static mask of the code before static_copies existed (written by
# mlm_core.masking at commit c7a21bd from make_rows(16, 64, seed=3), seq_ids 37 * (1000..1015), seed 7,
# rate 0.15, 80/10/10): copy 0 must reproduce it bit for bit.
def _head_masks():
    from pathlib import Path
    return np.load(Path(__file__).parent / "data" / "static_masks_head.npz")


@pytest.mark.parametrize("strategy", ["token", "whole_word", "span"])
def test_static_copy_zero_is_the_old_static_mask(strategy):
    d = _head_masks()
    ids, ws, seq = (torch.from_numpy(d[k].astype(np.int64 if k != "ws" else np.uint8)) for k in ("ids", "ws", "seq"))
    want_out, want_sel = d[f"{strategy}_out"].astype(np.int64), d[f"{strategy}_sel"]
    b = len(seq)
    k10 = masker(strategy=strategy, mode="static", seed=7)                        # default static_copies 10
    for m, passes in ((k10, None), (k10, torch.zeros(b, dtype=torch.int64)), (k10, torch.full((b,), 20)),
                      (masker(strategy=strategy, mode="static", seed=7, static_copies=1), torch.arange(b) * 7)):
        out = m(ids, ws, 0, seq_ids=seq, passes=passes)
        assert np.array_equal(out.input_ids.numpy(), want_out), passes
        assert np.array_equal(out.selected.numpy(), want_sel), passes


@pytest.mark.parametrize("strategy", ["token", "whole_word", "span"])
def test_static_copies_differ_and_repeat_with_period_k(rows, strategy):
    ids, ws = rows[0][:B], rows[1][:B]
    k = 4
    m = masker(strategy=strategy, mode="static", seed=5, static_copies=k)
    seq = torch.arange(B) + 300
    by_pass = [m(ids, ws, 0, seq_ids=seq, passes=torch.full((B,), e)).selected for e in range(2 * k + 1)]
    for e in range(k + 1):
        assert torch.equal(by_pass[e], by_pass[e + k]), e                        # period k
    for e1 in range(k):
        for e2 in range(e1 + 1, k):                                              # k distinct masks per sequence
            same_rows = (by_pass[e1] == by_pass[e2]).all(1).double().mean().item()
            assert same_rows < 0.05, (e1, e2, same_rows)
    # every copy is a mask of the configured rate (independent copies: ~ the same share, not the same tokens)
    cand = ~torch.isin(ids, torch.tensor(NEVER))
    for e in range(k):
        assert abs(by_pass[e][cand].double().mean().item() - 0.15) < 0.01
    # per row: the pass of each row picks its own copy (a mixed batch = the rows of the uniform batches)
    mixed = torch.arange(B) % k
    sel = m(ids, ws, 0, seq_ids=seq, passes=mixed).selected
    for r in range(0, B, 9):
        assert torch.equal(sel[r], by_pass[int(mixed[r])][r])


def test_training_feed_cycles_the_copies_by_the_samplers_pass():
    """The loop's Feed hands the masker each draw's pass over its language: with one language of 5 rows,
    pass e of row r (counted here from the stream itself) uses copy e mod k."""
    from mlm_core.shards import LanguageSampler
    from mlm_core.train.feed import Feed

    ids, ws = make_rows(5, 32, seed=9)

    class FiveRows:
        def gather(self, li, rows):
            r = torch.from_numpy(np.asarray(rows, dtype=np.int64))
            return {"input_ids": ids[r], "word_start": ws[r], "segment_ids": (ids[r] != PAD).to(torch.int32),
                    "seq_ids": r + 40}

    k = 3
    m = masker(strategy="token", mode="static", seed=2, static_copies=k, rate=0.4)
    feed = Feed(LanguageSampler({"en": 5}, {"en": 1.0}, seed=1), FiveRows(), m, torch.Generator(), 5,
                torch.device("cpu"))
    seen: dict[int, list[torch.Tensor]] = {}
    sampler_copy = LanguageSampler({"en": 5}, {"en": 1.0}, seed=1)
    for _ in range(4):                                                            # 4 x 5 draws = 4 passes
        _, rows_drawn = sampler_copy.next_indices(5)
        (x, *_rest), = feed.draw(0, 1)
        for j, r in enumerate(rows_drawn.tolist()):
            seen.setdefault(r, []).append(x[j])
    for r, masks in seen.items():
        assert len(masks) == 4                                                   # each row once per pass
        assert torch.equal(masks[0], masks[3]) and not torch.equal(masks[0], masks[1])
        assert not torch.equal(masks[1], masks[2])
