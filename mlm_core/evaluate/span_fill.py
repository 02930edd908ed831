"""Span filling scored on whole spans (``evaluate.span_fill``): the span-sensitive intrinsic evaluation SpanBERT's
claim needs (issue 21 item 3). Token-level [MASK] top-1 masks ~1/7 of a row's tokens scattered, so a model
can lean on the neighbours of every target; here whole spans of 2-4 words are hidden at once and a span counts
only when every one of its tokens is predicted.

In: an ``MLMEncoder`` (``encode`` / ``mlm_logits``), a ``ShardDataset`` (validation rows), the special ids, the
seed and the language's train token counts (the unigram baseline). Out per language: ``span_n`` (spans
scored), ``span_exact`` (share of spans whose every token is the model's top-1), its document-bootstrap 95%
interval (``span_exact_ci_low/high``, as ``resample.bootstrap_ci``), ``span_token_top1`` (top-1 over the
tokens inside spans) and ``span_baseline_exact`` (the unigram baseline: the language's most frequent train
token predicted at every position, scored the same way); and per held-out document (``document_counts``) the
spans, exact model hits and exact baseline hits that ``span_documents.parquet`` stores for the report's
hierarchical bootstrap.

Spans (``choose_spans``): a word is a unit of ``mlm_core.masking.primitives.units`` (a word-start token and its
continuation tokens; specials are units of their own and never part of a span). Walking a row's words in order
from a seeded offset in [0, SPAN_GAP), a span takes the next L words (L uniform in 2..4, drawn per span from a
generator keyed by (seed, row)) when they are consecutive and in one document (never across [SEP]); then
SPAN_GAP words are skipped, so spans never touch, the word before each span is visible, and about
3 / (3 + 16) of the words (~16 %) are hidden, close to training's 15 %. Every span of a row is masked
([MASK] on every token) and predicted in one forward pass. Ties: a position is a hit when no logit exceeds the
true token's (``intrinsic``'s rule).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

SPAN_WORDS = (2, 4)          # a span's length in words: uniform over 2..4
SPAN_GAP = 16                # words skipped after each span (and the range of the first span's offset)
ROWS_PER_BATCH = 32
SPAN_KEYS = ("span_n", "span_exact", "span_exact_ci_low", "span_exact_ci_high", "span_token_top1",
             "span_baseline_exact")
DOCUMENTS_FILE = "span_documents.parquet"


def choose_spans(ids: np.ndarray, word_start: np.ndarray, segment: np.ndarray, specials, row: int,
                 seed: int) -> list[tuple[int, int]]:
    """[(start, end)) token ranges of one row's spans (module docstring), in order."""
    import torch

    from mlm_core.masking.primitives import units
    ids = np.asarray(ids)
    cand = ~np.isin(ids, np.asarray(sorted(specials)))
    uidx, start = units(torch.from_numpy(cand)[None], torch.from_numpy(np.asarray(word_start, dtype=bool))[None])
    uidx, start = uidx[0].numpy(), start[0].numpy()
    first = np.flatnonzero(start)                              # the first token of every unit, in order
    last = np.r_[first[1:], len(ids)]                          # one past its last token
    ok = cand[first]                                           # candidate units = words
    seg = np.asarray(segment)[first]
    rng = np.random.default_rng([int(seed), 2221, int(row)])
    words = np.flatnonzero(ok)                                 # unit numbers of the words
    out = []
    i = int(rng.integers(0, SPAN_GAP))
    lo, hi = SPAN_WORDS
    while i < len(words):
        n = int(rng.integers(lo, hi + 1))
        w = words[i: i + n]
        if len(w) == n and w[-1] - w[0] == n - 1 and (seg[w] == seg[w[0]]).all():
            out.append((int(first[w[0]]), int(last[w[-1]])))
            i += n + SPAN_GAP
        else:
            i += 1
    return out


def score_language(model, shards, lang: str, n_rows: int, special_ids: Mapping[str, int], seed: int,
                   top_token: int | None, dev) -> dict[str, np.ndarray]:
    """Per span of the first ``n_rows`` validation rows: tokens, exact (model), token hits, baseline exact, and
    the document (row, segment) it lies in (numbered as ``intrinsic._score_language`` numbers them)."""
    import torch
    specials = sorted(int(i) for i in special_ids.values())
    mask_id = int(special_ids["mask"])
    cols: dict[str, list] = {"tokens": [], "exact": [], "hits": [], "baseline_exact": [], "group": []}
    for s0 in range(0, n_rows, ROWS_PER_BATCH):
        idx = np.arange(s0, min(s0 + ROWS_PER_BATCH, n_rows))
        b = shards.get_batch("validation", lang, idx)
        ids, seg, ws = b["input_ids"], b["segment_ids"].to(torch.int32), b["word_start"]
        L = ids.shape[1]
        span_id = np.full(ids.shape, -1, dtype=np.int64)       # which span (numbered over the batch) a token is in
        spans = []
        for j, r in enumerate(idx):
            for a, e in choose_spans(ids[j].numpy(), ws[j].numpy(), seg[j].numpy(), specials, int(r), seed):
                span_id[j, a:e] = len(spans)
                spans.append((int(r) * (L + 1) + int(seg[j, a]), e - a))
        if not spans:
            continue
        sel = torch.from_numpy(span_id >= 0)
        with torch.inference_mode():
            hidden = model.encode(ids.masked_fill(sel, mask_id).to(dev), seg.to(dev))
            logits = model.mlm_logits(hidden, sel.to(dev)).float()
            y = ids[sel].to(dev)
            hit = (logits > logits.gather(1, y[:, None])).sum(1) == 0     # no logit above the true token's
        sid = span_id[sel.numpy()]                             # row-major, the order of mlm_logits' rows
        n = len(spans)
        tok = np.bincount(sid, minlength=n)
        good = np.bincount(sid, weights=hit.cpu().numpy().astype(np.float64), minlength=n)
        base = (np.bincount(sid, weights=(ids[sel].numpy() == top_token).astype(np.float64), minlength=n)
                if top_token is not None else np.zeros(n))
        cols["tokens"].append(tok)
        cols["hits"].append(good)
        cols["exact"].append(good == tok)
        cols["baseline_exact"].append(base == tok)
        cols["group"].append(np.array([g for g, _ in spans], dtype=np.int64))
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}


def summarize(s: dict[str, np.ndarray], seed: int, has_baseline: bool) -> dict:
    from mlm_core.evaluate.resample import bootstrap_ci
    exact = s["exact"].astype(np.float64)
    lo, hi = bootstrap_ci(s["group"], exact, seed=seed)
    return {"span_n": int(len(exact)), "span_exact": float(exact.mean()), "span_exact_ci_low": lo,
            "span_exact_ci_high": hi, "span_token_top1": float(s["hits"].sum() / s["tokens"].sum()),
            "span_baseline_exact": float(s["baseline_exact"].mean()) if has_baseline else None}


def document_counts(s: dict[str, np.ndarray], has_baseline: bool) -> dict[str, np.ndarray]:
    """Per document holding at least one span, in (row, segment) order: spans, exact (model), baseline_exact
    (absent without a baseline). Summed they give span_exact = exact / spans exactly."""
    _, g = np.unique(s["group"], return_inverse=True)
    n = int(g.max()) + 1 if len(g) else 0
    out = {"spans": np.bincount(g, minlength=n).astype(np.int64),
           "exact": np.bincount(g, weights=s["exact"].astype(np.float64), minlength=n).astype(np.int64)}
    if has_baseline:
        out["baseline_exact"] = np.bincount(g, weights=s["baseline_exact"].astype(np.float64),
                                            minlength=n).astype(np.int64)
    return out


def evaluate_span_fill(model, shards, cfg, special_ids: Mapping[str, int], seed: int,
                       counts: dict[str, np.ndarray], documents: dict | None = None) -> dict[str, dict]:
    """{lang: metrics} for every language with validation rows and at least one span (module docstring);
    ``documents`` is filled per language with ``document_counts``."""
    from mlm_core.unigram import frequency_ranks
    dev = next(model.parameters()).device
    was = model.training
    model.eval()
    out: dict[str, dict] = {}
    try:
        for lang in sorted(shards.languages("validation")):
            n_rows = min(shards.rows_per_lang("validation").get(lang, 0), cfg.max_sequences)
            c = counts.get(lang)
            has_base = c is not None and c.sum() > 0
            top = int(np.flatnonzero(frequency_ranks(c) == 1)[0]) if has_base else None
            s = score_language(model, shards, lang, n_rows, special_ids, seed, top, dev) if n_rows else None
            if s is None or len(s["exact"]) == 0:
                continue
            out[lang] = summarize(s, seed, has_base)
            if documents is not None:
                documents[lang] = document_counts(s, has_base)
    finally:
        model.train(was)
    return out


def write_documents(documents: dict[str, dict], path) -> None:
    """``span_documents.parquet``: one row per (lang, document): lang, document, spans, exact, baseline_exact."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    schema = pa.schema([("lang", pa.string()), ("document", pa.int32()), ("spans", pa.int32()),
                        ("exact", pa.int32()), ("baseline_exact", pa.int32())])
    cols: dict[str, list] = {k: [] for k in schema.names}
    for lang in sorted(documents):
        d = documents[lang]
        n = len(d["spans"])
        cols["lang"] += [lang] * n
        cols["document"] += list(range(n))
        cols["spans"] += d["spans"].tolist()
        cols["exact"] += d["exact"].tolist()
        cols["baseline_exact"] += d["baseline_exact"].tolist() if "baseline_exact" in d else [None] * n
    pq.write_table(pa.Table.from_pydict(cols, schema=schema), path)


__all__ = ["choose_spans", "evaluate_span_fill", "document_counts", "write_documents", "DOCUMENTS_FILE",
           "SPAN_KEYS", "SPAN_GAP", "SPAN_WORDS"]
