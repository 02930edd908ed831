"""evaluate.span_fill (issue 21 item 3): spans of 2-4 whole words masked together and scored on whole spans.

The spans are checked against their definition (whole words, one document, no specials, never touching, the
hidden share), the scores against a hand-made model whose predictions are known (it predicts, at a [MASK], the
nearest visible token on its left), computed here independently, and the report reads the per-document counts
back (hierarchical bootstrap) with the unigram baseline as control row. Off by default: no fingerprint moves."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from mlm_core.evaluate import span_fill

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIALS = {"pad": PAD, "unk": UNK, "cls": CLS, "sep": SEP, "mask": MASK}
V, T = 12, 96


def make_rows(n: int, seed: int):
    """[CLS] doc [SEP] doc [SEP] [PAD]...; tokens mostly 5 (p = 0.7), words of 1-3 tokens; segment ids 1.. per
    document (CLS in the first), 0 on padding."""
    rng = np.random.default_rng(seed)
    ids = np.where(rng.random((n, T)) < 0.7, 5, rng.integers(6, V, size=(n, T)))
    ids[rng.random((n, T)) < 1 / 40] = SEP
    length = rng.integers(T // 2, T + 1, size=n)
    pos = np.arange(T)[None, :]
    ids[pos == length[:, None] - 1] = SEP
    ids[pos >= length[:, None]] = PAD
    ids[:, 0] = CLS
    ws = rng.random((n, T)) < 0.55
    special = np.isin(ids, [PAD, CLS, SEP])
    after = np.zeros_like(special)
    after[:, 1:] = special[:, :-1]
    ws = (ws | after) & ~special
    seg = np.cumsum(np.c_[np.zeros((n, 1), int), (ids == SEP)[:, :-1]], axis=1) + 1
    seg[ids == PAD] = 0
    return ids, ws, seg


class Shards:
    def __init__(self, rows: dict):
        self.rows = rows

    def languages(self, split):
        return sorted(self.rows)

    def rows_per_lang(self, split):
        return {lg: len(r[0]) for lg, r in self.rows.items()}

    def get_batch(self, split, lang, idx):
        ids, ws, seg = (a[np.asarray(idx)] for a in self.rows[lang])
        return {"input_ids": torch.from_numpy(ids).long(), "word_start": torch.from_numpy(ws.astype(np.uint8)),
                "segment_ids": torch.from_numpy(seg).long()}


class CopyLeft(nn.Module):
    """Predicts, at every position, the nearest token at or left of it that is not [MASK] (one-hot logits)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.arch = type("A", (), {"vocab_size": V})()

    def encode(self, ids, seg):
        ar = torch.arange(ids.shape[1]).expand_as(ids)
        last = torch.where(ids != MASK, ar, torch.full_like(ar, -1)).cummax(1).values.clamp(min=0)
        return nn.functional.one_hot(ids.gather(1, last), V).float()

    def mlm_logits(self, hidden, positions):
        return hidden[positions]


class Cfg:
    max_sequences = 60


def _words(ids_row, ws_row):
    """(start, end) of each word, independently of mask_primitives: a word starts at a word-start token or after
    a special, and runs over non-special tokens."""
    out, cur = [], None
    for t, tok in enumerate(ids_row):
        special = tok in (PAD, CLS, SEP, MASK, UNK)
        if cur is not None and (special or ws_row[t]):
            out.append((cur, t))
            cur = None
        if not special and cur is None:
            cur = t
    if cur is not None:
        out.append((cur, len(ids_row)))
    return out


def test_spans_are_2_to_4_whole_words_in_one_document():
    ids, ws, seg = make_rows(200, 1)
    hidden_words = total_words = 0
    for r in range(len(ids)):
        words = _words(ids[r], ws[r])
        starts = {a: i for i, (a, _) in enumerate(words)}
        ends = {e: i for i, (_, e) in enumerate(words)}
        spans = span_fill.choose_spans(ids[r], ws[r], seg[r], SPECIALS.values(), r, seed=3)
        assert spans == span_fill.choose_spans(ids[r], ws[r], seg[r], SPECIALS.values(), r, seed=3)
        prev_end = -1
        for a, e in spans:
            assert a in starts and e in ends, (r, a, e)                     # whole words
            n = ends[e] - starts[a] + 1
            assert 2 <= n <= 4
            assert not np.isin(ids[r, a:e], [PAD, CLS, SEP]).any()          # no special: one document
            assert len(set(seg[r, a:e].tolist())) == 1
            assert starts[a] - (ends[prev_end] if prev_end >= 0 else -17) > span_fill.SPAN_GAP  # >= 16 words apart
            assert ids[r, a - 1] not in (MASK,)
            hidden_words += n
            prev_end = e
        total_words += len(words)
    share = hidden_words / total_words
    assert 0.10 < share < 0.19, share                                       # ~3/19 of the words, less at edges
    other = [span_fill.choose_spans(ids[r], ws[r], seg[r], SPECIALS.values(), r, seed=4) for r in range(20)]
    assert other != [span_fill.choose_spans(ids[r], ws[r], seg[r], SPECIALS.values(), r, seed=3) for r in range(20)]


def test_scores_of_a_model_with_known_predictions():
    data = {"en": make_rows(60, 5), "fr": make_rows(45, 6)}
    counts = {"en": np.bincount(data["en"][0].ravel(), minlength=V).astype(np.int64), "fr": None}
    counts["en"][[PAD, UNK, CLS, SEP, MASK]] = 0
    docs: dict = {}
    got = span_fill.evaluate_span_fill(CopyLeft(), Shards(data), Cfg(), SPECIALS, seed=9, counts=counts,
                                       documents=docs)
    for lang, (ids, ws, seg) in data.items():
        n_exact = n_spans = n_tok = n_hit = n_base = 0
        per_doc: dict = {}
        for r in range(len(ids)):
            for a, e in span_fill.choose_spans(ids[r], ws[r], seg[r], SPECIALS.values(), r, seed=9):
                guess = ids[r, a - 1]                        # copy-left sees the token before the span
                ok = ids[r, a:e] == guess
                n_spans, n_exact, n_tok, n_hit = n_spans + 1, n_exact + ok.all(), n_tok + (e - a), n_hit + ok.sum()
                n_base += (ids[r, a:e] == 5).all()           # 5: the most frequent train token of en
                d = per_doc.setdefault((r, seg[r, a]), [0, 0, 0])
                d[0] += 1
                d[1] += ok.all()
                d[2] += (ids[r, a:e] == 5).all()
        g = got[lang]
        assert g["span_n"] == n_spans > 50
        assert g["span_exact"] == pytest.approx(n_exact / n_spans) and 0.05 < g["span_exact"] < 0.95
        assert g["span_token_top1"] == pytest.approx(n_hit / n_tok)
        assert g["span_exact_ci_low"] <= g["span_exact"] <= g["span_exact_ci_high"]
        want = np.array([per_doc[k] for k in sorted(per_doc)])
        assert docs[lang]["spans"].tolist() == want[:, 0].tolist()
        assert docs[lang]["exact"].tolist() == want[:, 1].tolist()
        if lang == "en":
            assert g["span_baseline_exact"] == pytest.approx(n_base / n_spans)
            assert docs[lang]["baseline_exact"].tolist() == want[:, 2].tolist()
        else:
            assert g["span_baseline_exact"] is None and "baseline_exact" not in docs[lang]


def test_off_by_default_and_in_the_evaluate_fingerprint_when_on(tmp_path):
    from conftest import REPO
    from mlm_core import stages
    from mlm_core.config.io import load_config
    from mlm_core.evaluate.stage import intrinsic_rows
    demo = REPO / "configs" / "demo.yaml"
    fps = lambda ov: {n: p.fingerprint for n, p in stages.plan(load_config(demo, ov + [f"workdir={tmp_path}"])).items()}  # noqa: E731
    base = fps([])
    assert fps(["evaluate.span_fill=false"]) == base
    on = fps(["evaluate.span_fill=true"])
    assert sorted(n for n in base if on[n] != base[n]) == ["evaluate", "register"]
    # the intrinsic table keeps its columns when span filling is off
    res = {"intrinsic": {"en": {"top1": 0.5}}}
    assert not any(k.startswith("span") for k in intrinsic_rows(res)[0])
    res["intrinsic"]["en"] |= {"span_n": 3, "span_exact": 1 / 3}
    assert intrinsic_rows(res)[0]["span_exact"] == pytest.approx(1 / 3)


def test_report_resamples_span_documents_with_the_unigram_control(tmp_path):
    from mlm_core.report.build import build_report
    wd = tmp_path / "wd"
    rng = np.random.default_rng(0)
    G = 30
    spans = rng.integers(1, 6, size=G)
    entries, exact_by = [], {}
    for v, lift in (("token", 0.0), ("span", 0.1)):
        for s in range(6):
            fp = f"{v}{s}"
            entries.append({"name": v, "seed": s, "config_fingerprints": {"pretrain": "p" + fp, "evaluate": "e" + fp}})
            for stage, m in (("pretrain", {}), ("evaluate", None)):
                d = wd / stage / (stage[0] + fp)
                d.mkdir(parents=True)
            exact = rng.binomial(spans, min(0.3 + lift + 0.01 * s, 1.0))
            base = rng.binomial(spans, 0.02)
            exact_by[(v, s)] = (exact.sum() / spans.sum(), base.sum() / spans.sum())
            span_fill.write_documents({"en": {"spans": spans, "exact": exact, "baseline_exact": base}},
                                      wd / "evaluate" / ("e" + fp) / span_fill.DOCUMENTS_FILE)
            metrics = {"en.top1": 0.3, "en.baseline_top1": 0.1, "en.span_exact": exact_by[(v, s)][0],
                       "en.span_baseline_exact": exact_by[(v, s)][1]}
            (wd / "evaluate" / ("e" + fp) / "manifest.json").write_text(json.dumps({"languages": ["en"],
                                                                                "metrics": metrics}))
            (wd / "pretrain" / ("p" + fp) / "manifest.json").write_text(json.dumps(
                {"objective": "mlm", "arch": {}, "steps": 10, "tokens": 1280, "metrics": {}}))
    sweep = wd / "sweeps" / "s"
    sweep.mkdir(parents=True)
    (sweep / "plan.json").write_text(json.dumps({"name": "s", "baseline": "token", "variants": entries,
                                                 "metrics": ["span_exact"]}))
    res = build_report(sweep)
    rows = {r["variant"]: r for r in res["tables"]["mean.span_exact"]}
    d = [exact_by[("span", s)][0] - exact_by[("token", s)][0] for s in range(6)]
    assert rows["span"]["diff"]["mean"] == pytest.approx(np.mean(d))
    assert rows["span"]["diff"]["mode"] == "seeds x documents"                # the documents are resampled too
    c = [exact_by[("span", s)][0] - exact_by[("span", s)][1] for s in range(6)]
    assert rows["span"]["vs_control"]["mean"] == pytest.approx(np.mean(c))
    assert any(r["variant"].startswith("unigram baseline (control") for r in res["tables"]["en.span_exact"])
