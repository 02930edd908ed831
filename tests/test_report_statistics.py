"""Issue 21 items 1-2: the statistics a sweep report's verdicts rest on, each checked against an independent
computation written here (scipy's exact permutation test, all sign flips enumerated by hand, Holm's procedure
from its definition, plain bootstraps written out), the hierarchical bootstrap by its properties (it reduces to
the seed bootstrap and to the document bootstrap, and covers a known effect ~95% of the time), the verdict words
on constructed sweeps, and a report built end to end from real stored pipeline outputs."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from mlm_core.report import stats
from mlm_core.report.build import build_report

# ------------------------------------------------------------------------------------------ sign-flip p


def _p_by_enumeration(d):
    d = np.asarray(d, dtype=float)
    obs = abs(d.mean())
    hits = sum(abs(np.mean(np.array(signs) * d)) >= obs - 1e-12 for signs in itertools.product((1, -1), repeat=len(d)))
    return hits / 2 ** len(d)


@pytest.mark.parametrize("n", [2, 3, 4, 6, 7, 9])
def test_sign_flip_p_matches_scipy_and_enumeration(n):
    from scipy.stats import permutation_test
    rng = np.random.default_rng(n)
    for _ in range(5):
        d = rng.normal(0.2, 1.0, size=n)
        ref = permutation_test((d,), lambda x, axis: np.mean(x, axis=axis), permutation_type="samples",
                               n_resamples=np.inf, vectorized=True, alternative="two-sided").pvalue
        assert stats.sign_flip_p(d) == pytest.approx(ref, abs=1e-12)
        assert stats.sign_flip_p(d) == pytest.approx(_p_by_enumeration(d), abs=1e-12)


def test_sign_flip_floor_by_number_of_seeds():
    # every difference of one sign: only the observed pattern and its mirror are as extreme -> 2 / 2^n
    assert stats.sign_flip_p([0.1, 0.2, 0.3]) == 0.25
    assert stats.sign_flip_p([0.1, 0.2, 0.3, 0.1, 0.2, 0.05]) == 2 / 64
    assert stats.sign_flip_p([0.0, 0.0]) == 1.0 and stats.sign_flip_p([]) is None


# ------------------------------------------------------------------------------------------ Holm


def _holm_rejections(p, alpha):
    """Holm (1979) from its definition: order the p-values; reject H_(1), H_(2), ... while p_(k) <= alpha/(m-k+1)."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    rejected = set()
    for k, i in enumerate(order, start=1):
        if p[i] <= alpha / (len(p) - k + 1):
            rejected.add(i)
        else:
            break
    return rejected


def test_holm_adjusted_by_hand():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> running max 0.06
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, None, 0.9]) == [pytest.approx(1.0), None, pytest.approx(1.0)]
    rng = np.random.default_rng(7)
    for _ in range(200):
        p = list(rng.uniform(0, 0.08, size=rng.integers(1, 7)))
        adj = stats.holm(p)
        for alpha in (0.01, 0.025, 0.05, 0.1):
            assert {i for i, a in enumerate(adj) if a <= alpha} == _holm_rejections(p, alpha)


# ------------------------------------------------------------------------------------------ verdict


def test_verdict_words():
    assert stats.verdict(0.01, 0.02, 0.05, "higher") == "supported"
    assert stats.verdict(0.01, -0.05, -0.02, "lower") == "supported"
    assert stats.verdict(0.01, -0.05, -0.02, "higher") == "contradicted"
    assert stats.verdict(0.01, 0.02, 0.05, "lower") == "contradicted"
    assert stats.verdict(0.06, 0.02, 0.05, "higher") == "inconclusive"       # corrected p not below 0.05
    assert stats.verdict(0.01, -0.01, 0.05, "higher") == "inconclusive"      # the interval holds 0
    assert stats.verdict(None, None, None, "higher") == "inconclusive"


# ------------------------------------------------------------------------------------------ hierarchical bootstrap


def _docdata(strata):
    return stats.DocData({k: (np.asarray(n, float), np.asarray(d, float)) for k, (n, d) in strata.items()})


def test_one_document_is_the_seed_bootstrap():
    rng = np.random.default_rng(1)
    v = {s: float(x) for s, x in enumerate(rng.uniform(0.3, 0.5, 5))}
    b = {s: float(x) for s, x in enumerate(rng.uniform(0.3, 0.5, 5))}
    vd = {s: _docdata({"en": ([v[s] * 10], [10])}) for s in v}
    bd = {s: _docdata({"en": ([b[s] * 10], [10])}) for s in b}
    h = stats.hierarchical_ci(v, b, vd, bd)
    # the seed bootstrap written out: default_rng(0), integers(0, n, (10000, n)), mean, percentiles
    d = np.array([v[s] - b[s] for s in range(5)])
    idx = np.random.default_rng(0).integers(0, 5, size=(10_000, 5))
    ref = np.percentile(d[idx].mean(axis=1), [2.5, 97.5])
    assert h["mode"] == "seeds x documents"
    assert (h["ci_low"], h["ci_high"]) == (pytest.approx(ref[0], abs=1e-12), pytest.approx(ref[1], abs=1e-12))
    assert h["mean"] == pytest.approx(d.mean())


def test_zero_seed_variance_is_the_document_bootstrap():
    rng = np.random.default_rng(2)
    G = 60
    den = rng.integers(5, 40, G).astype(float)
    cv, cb = rng.binomial(den.astype(int), 0.35).astype(float), rng.binomial(den.astype(int), 0.25).astype(float)
    # every seed's models score the documents identically: only the documents vary
    vd = {s: _docdata({"en": (cv, den)}) for s in range(4)}
    bd = {s: _docdata({"en": (cb, den)}) for s in range(4)}
    v, b = {s: x.value() for s, x in vd.items()}, {s: x.value() for s, x in bd.items()}
    h = stats.hierarchical_ci(v, b, vd, bd)
    # a plain document bootstrap of one model pair, written out (own generator: agreement within Monte Carlo error)
    draws = np.random.default_rng(99).integers(0, G, size=(20_000, G))
    reps = cv[draws].sum(1) / den[draws].sum(1) - cb[draws].sum(1) / den[draws].sum(1)
    lo, hi = np.percentile(reps, [2.5, 97.5])
    half = (hi - lo) / 2
    assert h["ci_low"] == pytest.approx(lo, abs=0.06 * half) and h["ci_high"] == pytest.approx(hi, abs=0.06 * half)
    # the seed-only interval is a point: the seeds agree exactly, evaluation noise is what is left out
    s = stats.hierarchical_ci(v, b)
    assert s["mode"] == "seeds only" and s["ci_high"] - s["ci_low"] < 1e-12


def _synthetic(rng, n_seeds, G, effect, sd_seed, sd_doc):
    """Two strata of G documents shared by every run; the variant's per-document rate = the baseline's + effect +
    a seed effect + a document effect (shared across seeds) + noise; the population effect is ``effect``."""
    v, b, vd, bd = {}, {}, {}, {}
    strata = {k: (rng.integers(5, 30, G).astype(float), rng.uniform(0.2, 0.4, G), rng.normal(0, sd_doc, G))
              for k in ("en", "fr")}
    for s in range(n_seeds):
        u = rng.normal(0, sd_seed)
        sv, sb = {}, {}
        for k, (den, base, e) in strata.items():
            sb[k] = (den * base, den)
            sv[k] = (den * (base + effect + u + e + rng.normal(0, 0.01, G)), den)
        vd[s], bd[s] = _docdata(sv), _docdata(sb)
        v[s], b[s] = vd[s].value(), bd[s].value()
    return v, b, vd, bd


def test_coverage_of_a_known_effect():
    """~95% of the hierarchical intervals hold the true effect; seeds alone undercover when documents are noisy."""
    rng = np.random.default_rng(5)
    n_rep, hits, seed_only_hits = 200, 0, 0
    for i in range(n_rep):
        v, b, vd, bd = _synthetic(rng, n_seeds=16, G=40, effect=0.03, sd_seed=0.01, sd_doc=0.04)
        h = stats.hierarchical_ci(v, b, vd, bd, n_resamples=1000, seed=i)
        hits += h["ci_low"] <= 0.03 <= h["ci_high"]
        s = stats.hierarchical_ci(v, b, n_resamples=1000, seed=i)
        seed_only_hits += s["ci_low"] <= 0.03 <= s["ci_high"]
    assert 0.88 <= hits / n_rep <= 0.99, hits / n_rep
    assert seed_only_hits / n_rep < 0.75, seed_only_hits / n_rep


def test_different_documents_fall_back_to_seeds():
    vd = {0: _docdata({"en": ([3, 4], [10, 10])}), 1: _docdata({"en": ([3, 4], [10, 10])})}
    bd = {0: _docdata({"en": ([3, 4], [10, 11])}), 1: _docdata({"en": ([3, 4], [10, 11])})}
    h = stats.hierarchical_ci({0: 0.35, 1: 0.35}, {0: 0.3, 1: 0.3}, vd, bd)
    assert h["mode"] == "seeds only"


# ------------------------------------------------------------------------------------------ verdicts in a report
SEEDS = list(range(8))
# per seed: baseline top-1 in every language, and the variants' shifts; 8 seeds: the smallest exact p is
# 2/256 = 0.0078, x3 (Holm over 3 contrasts) = 0.023 < 0.05
SHIFT = {"base": [0.0] * 8, "up": [0.02, 0.03, 0.025, 0.02, 0.04, 0.03, 0.02, 0.035],
         "down": [-0.02, -0.03, -0.025, -0.02, -0.04, -0.03, -0.02, -0.035],
         "noisy": [0.02, -0.03, 0.025, -0.02, 0.04, -0.03, 0.02, -0.035]}


def _write(wd, stage, fp, manifest):
    d = wd / stage / fp
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def _verdict_sweep(tmp_path, primary=True):
    wd = tmp_path / "wd"
    entries = []
    for v, shifts in SHIFT.items():
        for s in SEEDS:
            fp = f"{v}{s}"
            entries.append({"name": v, "seed": s, "config_fingerprints": {"pretrain": "p" + fp, "evaluate": "e" + fp},
                            "status": "done"})
            _write(wd, "pretrain", "p" + fp, {"objective": v, "arch": {}, "steps": 0, "tokens": 0, "metrics": {}})
            top = {lg: 0.2 + 0.01 * s + 0.05 * i + shifts[s] for i, lg in enumerate(("en", "fr"))}
            m = {f"{lg}.top1": t for lg, t in top.items()} | {f"{lg}.baseline_top1": 0.05 for lg in top}
            m |= {"upos.fr.score": 0.5 + shifts[s], "upos.fr.untrained_score": 0.45}
            _write(wd, "evaluate", "e" + fp, {"metrics": m, "languages": {}, "transfer": [
                {"task": "upos", "lang": "fr", "score": 0.5 + shifts[s], "untrained_score": 0.45}]})
    sweep = wd / "sweeps" / "v"
    sweep.mkdir(parents=True)
    plan = {"name": "v", "baseline": "base", "metrics": ["en.top1", "upos.fr.score"], "variants": entries,
            "primary": {"metric": "mean.top1", "contrasts": [
                {"variant": v, "baseline": "base", "expect": "higher", "claim": ""} for v in ("up", "down", "noisy")]}
            if primary else None}
    (sweep / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    return sweep


def test_report_writes_each_verdict(tmp_path):
    res = build_report(_verdict_sweep(tmp_path))
    prim = {c["variant"]: c for c in res["primary"]}
    assert {v: c["verdict"] for v, c in prim.items()} == {"up": "supported", "down": "contradicted",
                                                         "noisy": "inconclusive"}
    # the figures, against the independent computations above
    for v, c in prim.items():
        d = SHIFT[v]
        assert c["mean"] == pytest.approx(np.mean(d)) and c["n"] == 8
        assert c["p"] == pytest.approx(_p_by_enumeration(d))
    ps = [prim[v]["p"] for v in ("up", "down", "noisy")]
    assert [prim[v]["p_holm"] for v in ("up", "down", "noisy")] == pytest.approx(stats.holm(ps))
    assert prim["up"]["p_holm"] == pytest.approx(3 * 2 / 256)
    md = res["markdown"]
    readings = [ln for ln in md.splitlines() if ln.startswith("**") and "paired seeds" in ln]
    assert [r.split(":")[0] for r in readings] == ["**Supported**", "**Contradicted**", "**Inconclusive**"]
    # the controls, in the same tables: the unigram baseline under top-1, the untrained encoder under UPOS
    assert "| unigram baseline (control) | 32 runs | 0.0500 ± 0.0000 |" in md
    assert "| untrained encoder (control) | 32 runs | 0.4500 ± 0.0000 |" in md
    assert "## Controls" in md and "`mean.top1` (primary)" in md and "`en.top1` (exploratory)" in md
    up = next(r for r in res["tables"]["upos.fr.score"] if r["variant"] == "up")
    assert up["vs_control"]["mean"] == pytest.approx(0.5 + np.mean(SHIFT["up"]) - 0.45)


def test_holm_counts_every_declared_contrast_even_one_not_run_yet(tmp_path):
    """A primary contrast whose variant has no stored runs still counts in Holm's m: 'up' is corrected over the
    three declared contrasts (3 x 2/256), not over the two that could be tested (2 x 2/256), and the untested one
    is inconclusive with no p."""
    sweep = _verdict_sweep(tmp_path)
    plan = json.loads((sweep / "plan.json").read_text(encoding="utf-8"))
    plan["primary"]["contrasts"][2]["variant"] = "not_run"
    (sweep / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    prim = {c["variant"]: c for c in build_report(sweep)["primary"]}
    assert prim["up"]["p_holm"] == pytest.approx(3 * 2 / 256) and prim["up"]["verdict"] == "supported"
    assert prim["not_run"]["n"] == 0 and prim["not_run"]["p_holm"] is None
    assert prim["not_run"]["verdict"] == "inconclusive"


def test_report_without_primary_is_exploratory_only(tmp_path):
    res = build_report(_verdict_sweep(tmp_path, primary=False))
    assert res["primary"] is None
    assert "declares no primary metric" in res["markdown"] and "supported" not in res["markdown"].lower()


def test_sweep_file_primary_is_validated(tmp_path):
    from conftest import REPO
    from mlm_core.sweep import SweepError, load_sweep
    f = tmp_path / "s.yaml"
    body = (f"name: s\nbase: {REPO / 'configs' / 'demo.yaml'}\nbaseline: a\nvariants:\n  - {{name: a}}\n"
            "  - {name: b, set: {pretrain.masking.rate: 0.4}}\n")
    f.write_text(body + "primary: {metric: mean.top1, contrasts: [{variant: c, expect: higher}]}\n")
    with pytest.raises(SweepError, match=r"primary.contrasts.0.variant: 'c' is not a variant"):
        load_sweep(f)
    f.write_text(body + "primary: {metric: '*.top1', contrasts: [{variant: b, expect: higher}]}\n")
    with pytest.raises(SweepError, match="no wildcards"):
        load_sweep(f)
    f.write_text(body + "primary: {metric: mean.top1, contrasts: [{variant: b, expect: up}]}\n")
    with pytest.raises(SweepError, match="expect"):
        load_sweep(f)
    f.write_text(body + "primary: {metric: mean.top1, contrasts: [{variant: b, expect: higher}]}\n")
    assert load_sweep(f).config.primary.contrasts[0].baseline is None     # the sweep's baseline, at planning


# ------------------------------------------------------------------------------------------ real stored outputs


def _crossed_bootstrap_by_hand(tops, docs, seeds, B=stats.N_RESAMPLES, seed=stats.BOOTSTRAP_SEED):
    """The documented interval written out with fancy indexing: seeds first, then per language (sorted) the
    documents, one draw for every run; per run the mean over languages of sum(correct) / sum(positions)."""
    rng = np.random.default_rng(seed)
    n = len(seeds)
    S = rng.integers(0, n, size=(B, n))
    langs = sorted(docs[("a", seeds[0])])
    per_run = {k: np.zeros(B) for k in docs}
    for lg in langs:
        den = docs[("a", seeds[0])][lg][1]
        draws = rng.integers(0, len(den), size=(B, len(den)))
        for k in docs:
            num = docs[k][lg][0]
            per_run[k] += num[draws].sum(1) / den[draws].sum(1) / len(langs)
    diff = np.stack([per_run[("b", s)] - per_run[("a", s)] for s in seeds])       # [seed, replicate]
    reps = np.array([diff[S[i], i].mean() for i in range(B)])
    return np.percentile(reps, [2.5, 97.5])


@pytest.mark.heavy
def test_report_end_to_end_on_stored_outputs(tmp_path):
    """Four real pipeline runs (masking rate 0.15 / 0.40 x seeds 0, 1; 3 training steps): the per-document file
    gives back the stored top-1 and baseline, and the report's primary interval is the bootstrap written out."""
    import pyarrow.parquet as pq

    from conftest import run_demo_pipeline
    from mlm_core.evaluate.intrinsic import DOCUMENTS_FILE
    seeds = [0, 1]
    entries, docs, tops = [], {}, {}
    for name, rate in (("a", 0.15), ("b", 0.40)):
        for s in seeds:
            arts = run_demo_pipeline(tmp_path, 120, pretrain={"steps": 3, "seed": s, "masking": {"rate": rate}},
                                     evaluate={"efficiency": False})
            ev = arts["evaluate"]
            intr = {r["lang"]: r for r in pq.read_table(ev.path / "intrinsic.parquet").to_pylist()}
            per = {}
            for lg, rows in itertools.groupby(pq.read_table(ev.path / DOCUMENTS_FILE).to_pylist(),
                                              key=lambda r: r["lang"]):
                rows = list(rows)
                pos = np.array([r["positions"] for r in rows], float)
                cor = np.array([r["correct"] for r in rows], float)
                base = np.array([r["baseline_correct"] for r in rows], float)
                # the stored per-language figures, from the per-document counts
                assert cor.sum() / pos.sum() == pytest.approx(intr[lg]["top1"], abs=1e-12)
                assert base.sum() / pos.sum() == pytest.approx(intr[lg]["baseline_top1"], abs=1e-12)
                assert (len(rows), int(pos.sum())) == (intr[lg]["n_documents"], intr[lg]["n_positions"])
                per[lg] = (cor, pos)
            assert set(per) == {"en", "fr"}
            docs[(name, s)], tops[(name, s)] = per, np.mean([intr[lg]["top1"] for lg in per])
            fps = {k: arts[k].fingerprint for k in ("shards", "pretrain", "evaluate")}
            entries.append({"name": name, "seed": s, "status": "done", "config_fingerprints": fps})
    sweep = tmp_path / "work" / "sweeps" / "e2e"
    sweep.mkdir(parents=True)
    plan = {"name": "e2e", "baseline": "a", "metrics": ["top1"], "variants": entries,
            "primary": {"metric": "mean.top1", "contrasts": [{"variant": "b", "baseline": "a", "expect": "higher",
                                                              "claim": "40% beats 15%"}]}}
    (sweep / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    res = build_report(sweep)
    (c,) = res["primary"]
    assert c["mode"] == "seeds x documents" and c["n"] == 2
    assert c["mean"] == pytest.approx(np.mean([tops[("b", s)] - tops[("a", s)] for s in seeds]), abs=1e-12)
    lo, hi = _crossed_bootstrap_by_hand(tops, docs, seeds)
    assert (c["ci_low"], c["ci_high"]) == (pytest.approx(lo, abs=1e-12), pytest.approx(hi, abs=1e-12))
    assert c["p"] == pytest.approx(_p_by_enumeration([tops[("b", s)] - tops[("a", s)] for s in seeds]))
    # two seeds: the exact p cannot go below 0.5, so the verdict can only be inconclusive, and the reading says so
    assert c["verdict"] == "inconclusive"
    reading = next(ln for ln in res["markdown"].splitlines() if ln.startswith("**Inconclusive**"))
    assert "smallest possible exact p is 0.5" in reading
    assert "| unigram baseline (control) |" in res["markdown"]


@pytest.mark.parametrize("m, n, floor, need", [
    (1, 2, "0.5", 6),        # one contrast: 2 / 2^2
    (1, 5, "0.0625", 6),     # 2 / 32
    (1, 6, None, None),      # 2 / 64 = 0.031 < 0.05: a verdict is possible
    (2, 6, "0.0625", 7),     # Holm's first step doubles 2 / 64: the masking-strategy design flaw
    (2, 7, None, None),      # 2 x 2 / 128 = 0.031
    (3, 6, "0.0938", 7),     # 3 x 2 / 64 = 0.09375; 3 x 2 / 128 = 0.047 < 0.05
])
def test_reading_names_the_floor_of_the_corrected_p(m, n, floor, need):
    """The reading under a primary table says when no verdict but "inconclusive" is possible: the smallest
    Holm-corrected p (every pair agreeing, 2 / 2^n, times the m contrasts) at or above 0.05, and how many seeds
    would be needed. The floors are worked by hand in the parameters."""
    from mlm_core.report.render import reading
    c = {"verdict": "inconclusive", "variant": "b", "baseline": "a", "mean": 0.01, "ci_low": 0.001,
         "ci_high": 0.02, "n": n, "mode": "seeds only", "p": 2.0 / 2 ** n, "p_holm": min(1.0, m * 2.0 / 2 ** n),
         "expect": "higher", "m": m}
    text = reading(c)
    if floor is None:
        assert "smallest possible" not in text
    else:
        assert f"is {floor}: no verdict other than inconclusive is possible ({need} seeds are needed)" in text
        assert ("Holm-corrected p over the 2 primary contrasts" in text) == (m == 2)


def test_upos_documents_are_sentences_of_predictions_parquet(tmp_path):
    """UPOS metrics resample sentences: predictions.parquet (written by its own writer) gives per sentence the
    tagger's and the control's correct words, and the source language's mean is left out of the task mean."""
    from mlm_core.evaluate.predictions import COLUMNS, write
    from mlm_core.report.collect import Run, doc_data

    def rows(lang, sents):      # sents: [[(gold, predicted, untrained), ...], ...]
        cols = {c: [] for c in COLUMNS}
        for i, words in enumerate(sents):
            for w, (g, p, u) in enumerate(words):
                for c, v in zip(COLUMNS, ("upos", lang, "test", i, f"s{i}", w, "x", g, p, u, False, 0)):
                    cols[c].append(v)
        return cols
    fr = [[("N", "N", "V"), ("V", "V", "V")], [("N", "V", "N")]]           # tagger 2/2, 0/1; control 1/2, 1/1
    de = [[("N", "N", "N")], [("V", None, "N"), ("N", "N", "N")]]           # tagger 1/1, 1/2; control 1/1, 1/2
    en = [[("N", "N", "N")]]
    write([rows("fr", fr), rows("de", de), rows("en", en)], tmp_path / "predictions.parquet")
    run = Run("v", 0, {}, evaluate_dir=tmp_path, source_langs={"upos": "en"})
    run.metrics = {"upos.fr.score": 2 / 3, "upos.de.score": 2 / 3, "upos.en.score": 1.0,
                   "upos.fr.untrained_score": 2 / 3, "upos.fr.gain_over_untrained": 0.0,
                   "upos.de.untrained_score": 2 / 3, "upos.mean.score": 2 / 3}
    d = doc_data(run, "upos.fr.score")
    assert d.strata["fr"][0].tolist() == [2, 0] and d.strata["fr"][1].tolist() == [2, 1]
    g = doc_data(run, "upos.fr.gain_over_untrained")
    assert g.strata["fr"][0].tolist() == [1, -1]
    m = doc_data(run, "upos.mean.score")
    assert sorted(m.strata) == ["de", "fr"]                  # en is the source language
    run.metrics["upos.de.score"] = 0.5                       # a stored value the file does not give back
    run._docs.clear()
    assert doc_data(run, "upos.de.score") is None and doc_data(run, "upos.mean.score") is None
