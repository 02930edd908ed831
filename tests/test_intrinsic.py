"""Intrinsic evaluation: masked-token metrics vs the unigram baseline, calibration, pseudo-log-likelihood."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from mlm_core.config import EvaluateConfig, ModelConfig
from mlm_core.config.io import load_config
from mlm_core.evaluate.intrinsic import (evaluate_intrinsic, expected_calibration_error, reliability_plot,
                                         run_intrinsic, special_ids_from_manifest, unigram_counts)
from mlm_core.evaluate.pll import encode_plain, evaluate_pll, pseudo_perplexity, score_batched, score_loop
from mlm_core.model import MLMEncoder, resolve_arch, save_weights
from mlm_core.shards import ShardDataset
from mlm_core.stages import execute, plan

REPO = Path(__file__).resolve().parent.parent
LANGS = ("en", "hi", "ru")        # Latin, Devanagari, Cyrillic


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    """normalize -> tokenizer -> shards on ~150 lines per language, and a tiny random model folder."""
    root = tmp_path_factory.mktemp("intrinsic")
    sources = {}
    for lang in LANGS:
        lines = (REPO / "configs/demo/corpus" / f"{lang}.txt").read_text(encoding="utf-8").splitlines()[:150]
        (root / f"{lang}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        sources[lang] = {"paths": [str(root / f"{lang}.txt")]}
    lc = load_config(raw={
        "workdir": str(root / "work"), "seed": 3, "sources": sources,
        "normalize": {"workers": 1},
        "tokenizer": {"algorithm": "wordpiece", "vocab_size": 700, "heldout_docs": 10, "sample_mb": 1.0,
                      "min_vocab_fraction": 0.1, "max_unk_rate": 0.5, "max_fertility": 20.0},
        "shards": {"seq_len": 32, "validation_fraction": 0.15, "workers": 1, "rows_per_shard": 64},
        "pretrain": {"model": {"max_positions": 64}}})
    plans = plan(lc)
    arts = {name: execute(lc, name, plans)[0] for name in ("normalize", "tokenizer", "shards")}
    manifest = arts["shards"].manifest
    torch.manual_seed(0)
    arch = resolve_arch(ModelConfig(size="tiny", max_positions=64, dropout=0.0), int(manifest["vocab_size"]),
                        int(manifest["special_tokens"]["pad"]["id"]))
    model = MLMEncoder(arch).eval()
    model_dir = root / "model"
    save_weights(model, model_dir / "model.safetensors")
    shutil.copyfile(arts["tokenizer"].path / "tokenizer.json", model_dir / "tokenizer.json")
    return {"root": root, "arts": arts, "model": model, "model_dir": model_dir,
            "specials": special_ids_from_manifest(manifest)}


CFG = EvaluateConfig(max_sequences=16, pll_sentences=6, pll_batch=16)


# ---- masked-token metrics ------------------------------------------------------------------------------
def test_metrics_in_range_and_consistent(pipe):
    with ShardDataset(pipe["arts"]["shards"]) as ds:
        res = evaluate_intrinsic(pipe["model"], ds, CFG, pipe["specials"], seed=1)
        again = evaluate_intrinsic(pipe["model"], ds, CFG, pipe["specials"], seed=1)
    assert sorted(res) == list(LANGS)
    assert res == again                                        # deterministic masking and scoring
    vocab = pipe["model"].arch.vocab_size
    for lang, r in res.items():
        assert not r.get("missing"), lang
        assert r["n_positions"] > 0
        assert 0 <= r["top1"] <= r["top5"] <= 1
        assert r["top1"] <= r["mrr"] <= 1
        assert r["perplexity"] == pytest.approx(math.exp(r["loss"]), rel=1e-12)
        assert 0.3 * vocab < r["perplexity"] < 3 * vocab      # a random model is near-uniform over the vocabulary
        assert 0 <= r["ece"] <= 1
        assert len(r["reliability"]) == CFG.ece_bins
        assert sum(b["count"] for b in r["reliability"]) == r["n_positions"]
        assert 0 <= r["baseline_top1"] <= r["baseline_top5"] <= 1
        assert r["baseline_top1"] <= r["baseline_mrr"] <= 1
        assert r["baseline_top5"] > 0                         # frequent tokens do get masked
    json.dumps(res)                                           # JSON-ready
    png = reliability_plot(res, pipe["root"] / "rel.png")
    assert png.stat().st_size > 1000


def test_masking_seed_changes_positions(pipe):
    with ShardDataset(pipe["arts"]["shards"]) as ds:
        a = evaluate_intrinsic(pipe["model"], ds, CFG, pipe["specials"], seed=1)
        b = evaluate_intrinsic(pipe["model"], ds, CFG, pipe["specials"], seed=2)
    assert any(a[lg]["loss"] != b[lg]["loss"] for lg in LANGS)


class RankModel(torch.nn.Module):
    """Not a transformer: logits = a fixed score per token (the same at every position)."""

    def __init__(self, arch, scores: np.ndarray):
        super().__init__()
        self.arch = arch
        self.scores = torch.nn.Parameter(torch.tensor(scores, dtype=torch.float32), requires_grad=False)

    def encode(self, input_ids, segment_ids=None):
        return torch.zeros(*input_ids.shape, 1)

    def mlm_logits(self, hidden, positions):
        return self.scores.expand(int(positions.sum()), -1)


def test_baseline_from_train_counts(pipe):
    ds = ShardDataset(pipe["arts"]["shards"])
    specials = pipe["specials"]
    counts = unigram_counts(ds, specials)
    arch = pipe["model"].arch
    for lang in LANGS:                                       # counts = plain bincount of the train rows, no specials
        ids = np.asarray(ds.input_ids("train", lang)).reshape(-1)
        expect = np.bincount(ids, minlength=arch.vocab_size)
        expect[list(specials.values())] = 0
        assert np.array_equal(counts[lang], expect)
        assert expect.sum() > 0
    # a model that predicts the same frequency ranking must score exactly the baseline
    total = sum(counts.values())
    order = np.lexsort((np.arange(len(total)), -total))     # by count descending, ties by id
    scores = np.empty(len(total))
    scores[order] = -np.arange(len(total), dtype=np.float64)
    shared = {lang: total for lang in LANGS}
    res = evaluate_intrinsic(RankModel(arch, scores), ds, CFG, specials, seed=4, counts=shared)
    for lang, r in res.items():
        assert (r["top1"], r["top5"]) == (r["baseline_top1"], r["baseline_top5"])
        assert r["mrr"] == pytest.approx(r["baseline_mrr"], rel=1e-12)
    assert any(r["baseline_top1"] > 0 for r in res.values())
    # the per-language ranking (the default) fits each language at least as well as the pooled one in MRR
    own = evaluate_intrinsic(RankModel(arch, scores), ds, CFG, specials, seed=4)
    for lg in LANGS:
        assert own[lg]["n_positions"] == res[lg]["n_positions"] and own[lg]["top1"] == res[lg]["top1"]
        assert own[lg]["baseline_mrr"] >= res[lg]["baseline_mrr"]
    ds.close()


def test_language_without_validation_rows_is_missing(pipe, tmp_path):
    src = pipe["arts"]["shards"].path
    dst = tmp_path / "shards"
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    gone = [s for s in manifest["shards"] if s["split"] == "validation" and s["lang"] == "hi"]
    assert gone
    for s in gone:
        (dst / s["file"]).unlink()
    manifest["shards"] = [s for s in manifest["shards"] if s not in gone]
    (dst / "manifest.json").write_text(json.dumps(manifest))
    with ShardDataset(dst, verify="off") as ds:
        res = evaluate_intrinsic(pipe["model"], ds, CFG, pipe["specials"])
    assert res["hi"]["missing"] is True
    assert "top1" not in res["hi"]
    assert all(not res[lg].get("missing") and res[lg]["n_positions"] > 0 for lg in ("en", "ru"))
    reliability_plot(res, tmp_path / "rel.png")              # missing languages are left out of the figure


# ---- calibration ------------------------------------------------------------------------------------------
def synthetic(conf_levels, n_per_level: int, acc_of, vocab: int = 10, seed: int = 0):
    """Logits whose top-1 softmax probability is exactly c, with a fraction acc_of(c) of rows correct."""
    rng = np.random.default_rng(seed)
    logits, labels = [], []
    for c in conf_levels:
        row = np.full(vocab, math.log((1 - c) / (vocab - 1)))
        row[0] = math.log(c)
        n_ok = int(round(acc_of(c) * n_per_level))
        for i in rng.permutation(n_per_level):
            logits.append(row)
            labels.append(0 if i < n_ok else 1 + i % (vocab - 1))
    logits = torch.tensor(np.array(logits))
    probs = logits.softmax(-1)
    conf, pred = probs.max(-1)
    return conf.numpy(), (pred == torch.tensor(labels)).numpy()


def test_ece_is_zero_when_confidence_equals_accuracy():
    conf, ok = synthetic([0.2, 0.45, 0.6, 0.8, 0.95], 400, acc_of=lambda c: c)
    ece, table = expected_calibration_error(conf, ok, 15)
    assert ece == pytest.approx(0.0, abs=1e-9)
    assert sum(b["count"] for b in table) == len(conf)
    for b in table:
        if b["count"]:
            assert b["bin_lo"] < b["confidence"] <= b["bin_hi"] + 1e-12
            assert b["accuracy"] == pytest.approx(b["confidence"], abs=1e-9)
        else:
            assert b["confidence"] is None and b["accuracy"] is None


def test_ece_of_an_overconfident_model():
    conf, ok = synthetic([0.9], 1000, acc_of=lambda c: 0.5)
    ece, table = expected_calibration_error(conf, ok, 15)
    assert ece == pytest.approx(0.4, abs=1e-9)
    conf, ok = synthetic([0.3, 0.9], 500, acc_of=lambda c: c - 0.1)    # 10 points too confident everywhere
    assert expected_calibration_error(conf, ok, 15)[0] == pytest.approx(0.1, abs=1e-9)
    assert math.isnan(expected_calibration_error(np.zeros(0), np.zeros(0), 15)[0])


# ---- pseudo-log-likelihood ---------------------------------------------------------------------------------
SENTENCES = ["The old farmer sells fresh bread at the market.", "Молодой турист покупает карту.",
             "बच्चे पार्क में खेल रहे हैं।", "Cats sleep.", "A",
             "Женщины покупают новую карту в Берлине, а турист спит в саду.",
             "The young cook buys a big cake in Paris and the black cow sleeps in the field."]


def test_batched_pll_equals_loop(pipe):
    model, sp = pipe["model"], pipe["specials"]
    tok = pipe["arts"]["tokenizer"].path / "tokenizer.json"
    from tokenizers import Tokenizer
    lists = encode_plain(Tokenizer.from_file(str(tok)), SENTENCES)
    assert len({len(x) for x in lists}) >= 5                  # different lengths: batches mix and pad
    ref = score_loop(model, lists, sp["mask"], sp["cls"], sp["sep"])
    for batch in (1, 5, 64):
        got = score_batched(model, lists, sp["mask"], sp["cls"], sp["sep"], batch=batch)
        assert max(abs(a - b) for a, b in zip(got, ref)) < 1e-4, batch
    assert all(s < 0 for s in ref)
    assert score_batched(model, [[], lists[0]], sp["mask"], sp["cls"], sp["sep"])[0] == 0.0
    assert pseudo_perplexity(-2.0 * 4, 4) == pytest.approx(math.exp(2.0))
    with pytest.raises(ValueError, match="max_positions"):
        score_batched(model, [[7] * 63], sp["mask"], sp["cls"], sp["sep"])


def test_overfit_model_prefers_its_text(pipe):
    """A model trained to fill every masked copy of one sentence scores it above a shuffle of its tokens."""
    sp = pipe["specials"]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(pipe["arts"]["tokenizer"].path / "tokenizer.json"))
    ids = encode_plain(tok, ["The young cook buys a big cake in Paris ."])[0]
    shuffled = list(ids)
    rng = np.random.default_rng(0)
    while shuffled == ids:
        rng.shuffle(shuffled)
    torch.manual_seed(0)
    model = MLMEncoder(pipe["model"].arch)
    seq = torch.tensor([sp["cls"], *ids, sp["sep"]])
    n = len(ids)
    batch = seq.repeat(n, 1)
    labels = torch.full_like(batch, -100)
    rows, pos = torch.arange(n), torch.arange(1, n + 1)
    labels[rows, pos] = batch[rows, pos]
    batch[rows, pos] = sp["mask"]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(60):
        loss = model(batch, labels=labels)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    own, other = score_batched(model, [ids, shuffled], sp["mask"], sp["cls"], sp["sep"])
    assert own > other + 1.0
    assert own > -0.5 * n                                   # nearly memorized: PPPL close to 1


# ---- the wrapper ------------------------------------------------------------------------------------------
def test_run_intrinsic_end_to_end(pipe):
    arts = pipe["arts"]
    out = run_intrinsic(pipe["model_dir"], arts["shards"].path, arts["normalize"].path, CFG, seed=0,
                        plot_path=pipe["root"] / "plots" / "reliability.png")
    assert (pipe["root"] / "plots" / "reliability.png").is_file()
    assert sorted(out["intrinsic"]) == list(LANGS) == sorted(out["pll"])
    with ShardDataset(arts["shards"]) as ds:                # the same numbers as the direct call
        direct = evaluate_intrinsic(pipe["model"], ds, CFG, pipe["specials"], seed=0)
    assert out["intrinsic"] == direct
    for lang, r in out["pll"].items():
        assert 1 <= r["sentences"] <= CFG.pll_sentences
        assert r["tokens"] >= r["sentences"]
        assert r["pll_mean"] < 0
        assert r["pseudo_perplexity"] == pytest.approx(math.exp(-r["pll_per_token"]))
        assert r["pseudo_perplexity"] > 1
    json.dumps(out)


def test_evaluate_pll_options(pipe):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(pipe["model_dir"] / "tokenizer.json"))
    tok.enable_truncation(max_length=4)                       # the caller's settings are neither used nor changed
    texts = {"en": SENTENCES[:3] + [""], "ru": [], "hi": ["बच्चे पार्क में खेल रहे हैं।"] * 9}
    res = evaluate_pll(pipe["model"], tok, texts, EvaluateConfig(pll_sentences=2, pll_batch=8))
    assert res["ru"] == {"missing": True, "reason": "no text to score"}
    assert res["en"]["sentences"] == 2 and res["hi"]["sentences"] == 2
    assert res["en"]["tokens"] > 8
    assert tok.truncation["max_length"] == 4
    short = evaluate_pll(pipe["model"], tok, texts, EvaluateConfig(pll_sentences=2), max_tokens=3)
    assert short["en"]["tokens"] == 6
    assert evaluate_pll(pipe["model"], tok, texts, EvaluateConfig(pll_sentences=0)) == {}


# ---- every token scored once, bootstrap intervals -------------------------------------------------------
def test_every_validation_token_is_scored_once(pipe):
    """The masked positions are all the non-special tokens of the first max_sequences validation rows (counted
    here from the shards), not 15% of them: a small language's little held-out text is used in full."""
    specials = pipe["specials"]
    with ShardDataset(pipe["arts"]["shards"]) as ds:
        res = evaluate_intrinsic(pipe["model"], ds, CFG, specials, seed=1)
        for lang in LANGS:
            ids = np.asarray(ds.input_ids("validation", lang))[:CFG.max_sequences]
            segs = np.asarray(ds.columns("validation", lang)["segment_ids"])[:CFG.max_sequences]
            content = ~np.isin(ids, list(specials.values()))
            assert res[lang]["n_positions"] == int(content.sum()) > 0
            docs = {(r, int(s)) for r, row in enumerate(segs) for s, c in zip(row, content[r]) if c}
            assert res[lang]["n_documents"] == len(docs)
            r = res[lang]
            assert r["top1_over_baseline"] == pytest.approx(r["top1"] - r["baseline_top1"], abs=1e-12)
            assert r["top1_ci_low"] <= r["top1"] <= r["top1_ci_high"]
            assert r["top1_over_baseline_ci_low"] <= r["top1_over_baseline"] <= r["top1_over_baseline_ci_high"]


def test_bootstrap_interval_matches_a_plain_percentile_bootstrap():
    """Recomputed here with a per-replicate loop: draw G documents with replacement (the same generator calls),
    pool their positions, take the mean; 2.5% / 97.5% percentiles."""
    from mlm_core.evaluate.intrinsic import bootstrap_ci
    rng = np.random.default_rng(5)
    groups = np.repeat(np.arange(40) * 3 + 7, rng.integers(1, 12, 40))      # uneven document sizes, sparse ids
    values = (rng.random(len(groups)) < 0.3).astype(float) - (rng.random(len(groups)) < 0.1)
    lo, hi = bootstrap_ci(groups, values, seed=11, n_boot=500)
    ids = sorted(set(groups.tolist()))
    members = {k: values[groups == gid] for k, gid in enumerate(ids)}
    draws = np.random.default_rng(11).integers(0, len(ids), size=(500, len(ids)))
    stats = [np.concatenate([members[int(k)] for k in row]).mean() for row in draws]
    assert (lo, hi) == pytest.approx(tuple(np.percentile(stats, [2.5, 97.5])), abs=1e-12)
    assert bootstrap_ci(groups, values, seed=11, n_boot=500) == (lo, hi)          # fixed seed: reproducible
    assert bootstrap_ci(np.zeros(0), np.zeros(0)) == (None, None)


def test_bootstrap_interval_covers_the_true_mean_about_95_percent():
    """Coverage against a known distribution: Bernoulli(0.3) positions in documents of 5; the true mean is 0.3."""
    from mlm_core.evaluate.intrinsic import bootstrap_ci
    rng = np.random.default_rng(0)
    trials, hits = 300, 0
    groups = np.repeat(np.arange(120), 5)
    for t in range(trials):
        lo, hi = bootstrap_ci(groups, (rng.random(600) < 0.3).astype(float), seed=t, n_boot=400)
        hits += lo <= 0.3 <= hi
    assert 0.90 <= hits / trials <= 0.99


def test_pseudo_perplexity_of_a_hopeless_model_is_inf_not_an_error():
    """exp overflows above ~709.78 nats: a model that is that wrong gets PPPL = inf (like intrinsic perplexity),
    so one broken model does not abort an evaluation or a comparison. Below it the exact value."""
    import math

    from mlm_core.evaluate.pll import pseudo_perplexity
    assert pseudo_perplexity(-800.0 * 10, 10) == float("inf")
    assert pseudo_perplexity(-2.0 * 4, 4) == pytest.approx(math.exp(2.0), rel=1e-12)
    assert math.isnan(pseudo_perplexity(0.0, 0))


def test_span_fill_adds_span_metrics_and_changes_nothing_else(pipe):
    """evaluate.span_fill (issue 21): on real shards and a real encoder every language gets the span metrics, the
    per-document counts give span_exact back exactly, and every other intrinsic number is the one without it."""
    arts = pipe["arts"]
    cfg = CFG.model_copy(update={"span_fill": True, "pll_sentences": 0})
    docs: dict = {}
    out = run_intrinsic(pipe["model_dir"], arts["shards"].path, None, cfg, seed=0, span_documents=docs)
    off = run_intrinsic(pipe["model_dir"], arts["shards"].path, None, CFG.model_copy(update={"pll_sentences": 0}),
                        seed=0)
    for lang in LANGS:
        r = out["intrinsic"][lang]
        assert r["span_n"] > 0 and 0 <= r["span_exact"] <= r["span_token_top1"] <= 1
        assert r["span_exact"] == pytest.approx(docs[lang]["exact"].sum() / docs[lang]["spans"].sum())
        assert docs[lang]["spans"].sum() == r["span_n"]
        assert {k: v for k, v in r.items() if not k.startswith("span_")} == off["intrinsic"][lang]
