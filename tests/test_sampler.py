"""LanguageSampler: exact resume, shares close to p(l), disjoint rank streams, epochs without replacement."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mlm_core.sampling import language_weights
from mlm_core.shards import LanguageSampler

ROWS = {"en": 5000, "fr": 1200, "hi": 300, "sw": 40, "zh": 800}
PROBS = language_weights(ROWS, 0.3)


def stream(s: LanguageSampler, n: int, batch: int = 97) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    while len(out) < n:
        out += s.next_batch(min(batch, n - len(out)))
    return out


def test_resume_mid_epoch_gives_the_same_stream():
    epoch = sum(ROWS.values())
    n = 2 * epoch
    full = stream(LanguageSampler(ROWS, PROBS, seed=7), n)
    a = LanguageSampler(ROWS, PROBS, seed=7)
    first = stream(a, epoch // 2)                              # stop at 50% of an epoch
    state = json.loads(json.dumps(a.state_dict()))             # JSON round trip, as a checkpoint would
    b = LanguageSampler(ROWS, PROBS, seed=7)
    b.load_state_dict(state)
    assert first + stream(b, n - epoch // 2, batch=64) == full


def test_draw_t_does_not_depend_on_earlier_draws():
    s = LanguageSampler(ROWS, PROBS, seed=3)
    li, rows = s.draws(np.array([123_456, 5, 99_999]))
    li2, rows2 = LanguageSampler(ROWS, PROBS, seed=3).draws(np.array([5, 99_999, 123_456]))
    assert (li[[1, 2, 0]] == li2).all() and (rows[[1, 2, 0]] == rows2).all()


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_shares_within_one_point_of_p(seed):
    s = LanguageSampler(ROWS, PROBS, seed=seed)
    li, _ = s.next_indices(10_000)
    share = np.bincount(li, minlength=len(s.langs)) / 10_000
    for i, lang in enumerate(s.langs):
        assert abs(share[i] - PROBS[lang]) < 0.01, (lang, share[i], PROBS[lang])
    # and for every prefix of 2,000 draws or more, not only at the end
    counts = np.zeros(len(s.langs))
    for k in range(1, 6):
        counts = np.bincount(li[: 2000 * k], minlength=len(s.langs)) / (2000 * k)
        assert np.abs(counts - s.p).max() < 0.01


def test_tiny_language_still_gets_its_share():
    rows = {"en": 10**6, "sw": 10}
    probs = {"en": 0.9995, "sw": 0.0005}
    li, _ = LanguageSampler(rows, probs, seed=0).next_indices(200_000)
    assert abs((li == 1).sum() - 100) <= 1


def test_rows_without_replacement_within_a_language_epoch():
    s = LanguageSampler(ROWS, PROBS, seed=5)
    draws = stream(s, 20_000)
    for lang, n in ROWS.items():
        rows = [r for lg, r in draws if lg == lang]
        full_epochs = len(rows) // n
        for e in range(full_epochs):
            assert sorted(rows[e * n:(e + 1) * n]) == list(range(n))
        tail = rows[full_epochs * n:]
        assert len(set(tail)) == len(tail) and all(0 <= r < n for r in tail)
    # upsampled small languages see a new order each epoch
    sw = [r for lg, r in draws if lg == "sw"]
    assert sw[:40] != sw[40:80]


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_draw_disjoint_streams_whose_union_is_the_single_stream(world):
    n = 3000
    single = stream(LanguageSampler(ROWS, PROBS, seed=11), n * world)
    per_rank = [stream(LanguageSampler(ROWS, PROBS, seed=11, rank=r, world_size=world), n) for r in range(world)]
    interleaved = [per_rank[i % world][i // world] for i in range(n * world)]
    assert interleaved == single
    # disjoint as draws: within one language epoch no row is drawn twice across ranks
    li, rows = LanguageSampler(ROWS, PROBS, seed=11).draws(np.arange(n * world))
    owner = np.arange(n * world) % world
    en = li == 0
    first_epoch = np.flatnonzero(en)[: ROWS["en"]]
    assert len(set(rows[first_epoch].tolist())) == len(first_epoch)
    assert set(owner[first_epoch].tolist()) == set(range(world))


def test_resume_on_another_world_size():
    a = LanguageSampler(ROWS, PROBS, seed=2, rank=0, world_size=2)
    a.next_batch(600)                                         # each of 2 ranks took 600 -> 1200 global draws
    state = a.state_dict()
    single = LanguageSampler(ROWS, PROBS, seed=2)
    single.load_state_dict(state)
    assert single.step == 1200
    rest = LanguageSampler(ROWS, PROBS, seed=2).draws(np.arange(1200, 1300))
    li, rows = single.next_indices(100)
    assert (li == rest[0]).all() and (rows == rest[1]).all()
    bad = LanguageSampler(ROWS, PROBS, seed=2, world_size=7)
    with pytest.raises(ValueError, match="not a multiple"):
        bad.load_state_dict(state)


def test_state_from_another_sampler_is_refused():
    state = LanguageSampler(ROWS, PROBS, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        LanguageSampler(ROWS, PROBS, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="rows"):
        LanguageSampler({**ROWS, "en": 4999}, PROBS, seed=1).load_state_dict(state)


def test_bad_arguments():
    with pytest.raises(ValueError, match="no rows"):
        LanguageSampler({"en": 0}, {"en": 1.0}, seed=0)
    with pytest.raises(ValueError, match="rank"):
        LanguageSampler(ROWS, PROBS, seed=0, rank=2, world_size=2)


def test_passes_count_earlier_draws_of_the_same_language():
    """draws(..., passes=True): a draw's pass = (draws of its language before it) div that language's rows,
    counted here by walking the stream."""
    s = LanguageSampler(ROWS, PROBS, seed=4)
    n = 3 * sum(ROWS.values())
    li, rows, passes = s.draws(np.arange(n), passes=True)
    li2, rows2 = s.draws(np.arange(n))
    assert (li == li2).all() and (rows == rows2).all()
    sizes = [ROWS[lang] for lang in s.langs]
    count = [0] * len(sizes)
    want = np.empty(n, dtype=np.int64)
    for g, lang_i in enumerate(li.tolist()):
        want[g] = count[lang_i] // sizes[lang_i]
        count[lang_i] += 1
    assert (passes == want).all() and passes.max() >= 2
    # the same through next_indices, in batches
    b = LanguageSampler(ROWS, PROBS, seed=4)
    got = np.concatenate([b.next_indices(997, passes=True)[2] for _ in range(-(-n // 997))])[:n]
    assert (got == want).all()
