"""mlm_core.sampling: temperature-based language weights p(l) ∝ n_l^α and the sampling table."""
from __future__ import annotations

import math

import pytest

from mlm_core.sampling import SamplingRow, language_weights, sampling_table

COUNTS = {"en": 1_000_000, "fr": 200_000, "hi": 30_000, "zh": 5_000}


@pytest.mark.parametrize("alpha", [0.1, 0.3, 0.5, 0.7, 1.0])
def test_weights_sum_to_one(alpha):
    p = language_weights(COUNTS, alpha)
    assert set(p) == set(COUNTS)
    assert math.isclose(sum(p.values()), 1.0, rel_tol=1e-12)
    assert all(0 < v < 1 for v in p.values())


def test_alpha_one_gives_natural_shares():
    p = language_weights(COUNTS, 1.0)
    total = sum(COUNTS.values())
    for lang, n in COUNTS.items():
        assert math.isclose(p[lang], n / total, rel_tol=1e-12)


def test_small_alpha_flattens_toward_uniform():
    spread = {a: max(language_weights(COUNTS, a).values()) - min(language_weights(COUNTS, a).values())
              for a in (1.0, 0.5, 0.3, 0.1, 0.01)}
    assert spread[1.0] > spread[0.5] > spread[0.3] > spread[0.1] > spread[0.01]
    uniform = 1 / len(COUNTS)
    assert all(abs(v - uniform) < 0.01 for v in language_weights(COUNTS, 0.01).values())


def test_alpha_0_3_values_computed_by_hand():
    """XLM-R's α = 0.3, numbers worked out by hand (not by the code under test):
    {a: 100, b: 1}: 100^0.3 = 10^0.6 = 3.98107; p(a) = 3.98107 / 4.98107 = 0.79924, p(b) = 1 / 4.98107 = 0.20076.
    {en: 1000, fr: 10, zh: 1}: 10^0.9 = 7.94328, 10^0.3 = 1.99526, 1; sum 10.93854;
    p = 0.72617, 0.18241, 0.09142; zh's natural share is 1/1011, so it is drawn 92.4 x as often as its share."""
    p = language_weights({"a": 100, "b": 1}, 0.3)
    assert p["a"] == pytest.approx(0.79924, abs=1e-5) and p["b"] == pytest.approx(0.20076, abs=1e-5)
    p = language_weights({"en": 1000, "fr": 10, "zh": 1}, 0.3)
    assert [round(p[k], 5) for k in ("en", "fr", "zh")] == [0.72617, 0.18241, 0.09142]
    by = {r.lang: r for r in sampling_table({"en": 1000, "fr": 10, "zh": 1}, 0.3)}
    assert by["zh"].upsampling == pytest.approx(92.425, abs=1e-3)
    assert by["en"].upsampling == pytest.approx(0.73416, abs=1e-5)


def test_order_is_kept_and_large_counts_do_not_overflow():
    p = language_weights({"zh": 10**15, "en": 10**18}, 1.0)
    assert list(p) == ["zh", "en"]
    assert math.isclose(p["en"], 1000 / 1001)


def test_table_upsamples_the_smallest_language():
    rows = sampling_table(COUNTS, 0.3)
    assert all(isinstance(r, SamplingRow) for r in rows)
    by = {r.lang: r for r in rows}
    assert by["zh"].upsampling > 1 and by["en"].upsampling < 1
    assert by["zh"].upsampling == max(r.upsampling for r in rows)
    for r in rows:
        assert math.isclose(r.natural, r.n / sum(COUNTS.values()))
        assert math.isclose(r.upsampling, r.p / r.natural)
        assert r.expected_epochs is None
    assert math.isclose(sum(r.natural for r in rows), 1.0)


def test_table_at_alpha_one_has_no_upsampling():
    assert all(math.isclose(r.upsampling, 1.0) for r in sampling_table(COUNTS, 1.0))


def test_expected_epochs():
    budget = 2_000_000
    rows = sampling_table(COUNTS, 0.5, token_budget=budget)
    p = language_weights(COUNTS, 0.5)
    for r in rows:
        assert math.isclose(r.expected_epochs, budget * p[r.lang] / COUNTS[r.lang])
    by = {r.lang: r for r in rows}
    assert by["zh"].expected_epochs > by["en"].expected_epochs


@pytest.mark.parametrize("alpha", [0.0, -0.3, 1.01, 2.0])
def test_alpha_out_of_range(alpha):
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\]"):
        language_weights(COUNTS, alpha)
    with pytest.raises(ValueError, match="alpha"):
        sampling_table(COUNTS, alpha)


def test_zero_counts_name_the_languages():
    with pytest.raises(ValueError, match="fr, hi"):
        language_weights({"en": 10, "hi": 0, "fr": 0}, 0.3)
    with pytest.raises(ValueError, match="no languages"):
        language_weights({}, 0.3)
