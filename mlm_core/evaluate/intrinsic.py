"""Intrinsic per-language evaluation of a masked language model, next to the unigram-frequency baseline.

In: an ``MLMEncoder``, a ``ShardDataset`` (validation rows to score, train rows for token counts), an
``EvaluateConfig`` and the special token ids. Out, per language (``evaluate_intrinsic``):
n_positions, top-1 / top-5 accuracy, mean reciprocal rank, masked loss (mean cross-entropy, nats) and
perplexity exp(loss), expected calibration error (Guo et al., 2017: sum_b n_b/N |acc_b - conf_b| over
``ece_bins`` equal-width bins of top-1 confidence) with the per-bin table of a reliability diagram,
and, at the same positions, the unigram baseline: a fixed ranking of the vocabulary by the language's
train-split token frequency (ties by id), whose top-1 is the most frequent token.

Masking scores every token once: each validation row is scored in EVAL_PASSES = 7 complementary passes; a
position's pass is drawn from a generator keyed by (seed, row index), so each pass masks ~1/7 (~0.15) of the
row's tokens at random and a row gets the same masks whatever the batch size. Every selected token is
replaced by [MASK] (no 80/10/10: evaluation asks "what is under the mask?"). So the masked positions of a
language are all the tokens of its first ``max_sequences`` validation rows (a small language's estimate is
not limited to 15% of its little held-out text). Specials (UNK included: predicting UNK says nothing about
the language) are never targets and are not counted for the baseline.

Each language also gets percentile-bootstrap 95% intervals (``bootstrap_ci``: documents resampled with
replacement, a fixed seed) of top-1 (``top1_ci_low/high``) and of top-1 minus the baseline's top-1 at the
same positions (``top1_over_baseline`` and ``top1_over_baseline_ci_low/high``), and ``n_documents``.
A language with no validation rows (or no masked position) is reported as {"missing": True, "reason": ...},
never as zeros.

``run_intrinsic`` loads a model folder, the shard set and the normalized documents and returns
{"intrinsic": ..., "pll": ...}; ``reliability_plot`` draws the reliability diagrams into a PNG.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Mapping

import numpy as np

from mlm_core.evaluate.resample import (  # noqa: F401 - the document bootstrap, also this module's API
    BOOTSTRAP_SAMPLES, bootstrap_ci, bootstrap_replicates)
from mlm_core.unigram import frequency_ranks, unigram_counts  # noqa: F401 - one baseline for loop and evaluate

log = logging.getLogger(__name__)

EVAL_MASK_RATE = 0.15
EVAL_PASSES = round(1 / EVAL_MASK_RATE)   # 7 complementary masks per row: each masks ~1/7 of its tokens
ROWS_PER_BATCH = 32
TOP_K = 5
SPECIAL_ROLES = ("pad", "unk", "cls", "sep", "mask")


# ------------------------------------------------------------------------------------------ metrics
def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray,
                               n_bins: int = 15) -> tuple[float, list[dict]]:
    """ECE over ``n_bins`` equal-width bins of (0, 1] (bin b holds b/n < conf <= (b+1)/n; conf 0 goes to bin 0).

    Returns (ece, table); the table has one row per bin: bin_lo, bin_hi, count, mean confidence and accuracy
    (None for an empty bin). ECE is NaN when there is no prediction.
    """
    conf = np.asarray(confidence, dtype=np.float64).reshape(-1)
    ok = np.asarray(correct, dtype=np.float64).reshape(-1)
    if conf.shape != ok.shape:
        raise ValueError(f"confidence and correct differ in length: {conf.shape} vs {ok.shape}")
    b = np.clip(np.ceil(conf * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    count = np.bincount(b, minlength=n_bins)
    sum_conf = np.bincount(b, weights=conf, minlength=n_bins)
    sum_ok = np.bincount(b, weights=ok, minlength=n_bins)
    n = len(conf)
    ece = float(np.abs(sum_ok - sum_conf).sum() / n) if n else float("nan")  # = sum n_b/N |acc_b - conf_b|
    table = [{"bin_lo": i / n_bins, "bin_hi": (i + 1) / n_bins, "count": int(count[i]),
              "confidence": float(sum_conf[i] / count[i]) if count[i] else None,
              "accuracy": float(sum_ok[i] / count[i]) if count[i] else None} for i in range(n_bins)]
    return ece, table


def rank_metrics(ranks: np.ndarray) -> dict[str, float]:
    """top-1, top-5 and mean reciprocal rank from 1-based ranks of the true token."""
    r = np.asarray(ranks, dtype=np.float64)
    return {"top1": float((r <= 1).mean()), "top5": float((r <= TOP_K).mean()), "mrr": float((1.0 / r).mean())}


def pass_assignment(row: int, seq_len: int, seed: int) -> np.ndarray:
    """Which of the EVAL_PASSES masking passes scores each position of validation row ``row``: keyed by
    (seed, row) alone, so a row gets the same masks whatever the batch size or row count."""
    return np.random.default_rng([int(seed), 1117, int(row)]).integers(0, EVAL_PASSES, seq_len)


def _score_language(model, shards, lang: str, n_rows: int, special_ids: Mapping[str, int], seed: int,
                    dev) -> dict[str, np.ndarray]:
    """Every non-special token of the first ``n_rows`` validation rows, each scored once (see the module
    docstring): true ids, ranks, losses, confidences, hits, and the document (row, segment) it belongs to."""
    import torch
    import torch.nn.functional as F
    parts: dict[str, list] = {"target": [], "rank": [], "loss": [], "conf": [], "correct": [], "group": []}
    specials = torch.tensor(sorted(int(i) for i in special_ids.values()))
    mask_id = int(special_ids["mask"])
    for start in range(0, n_rows, ROWS_PER_BATCH):
        idx = np.arange(start, min(start + ROWS_PER_BATCH, n_rows))
        b = shards.get_batch("validation", lang, idx)
        ids, seg = b["input_ids"], b["segment_ids"].to(torch.int32)
        L = ids.shape[1]
        target_ok = ~torch.isin(ids, specials)
        assign = torch.from_numpy(np.stack([pass_assignment(int(r), L, seed) for r in idx]))
        group = torch.from_numpy(idx[:, None] * (L + 1)) + seg        # a document within a row
        for p in range(EVAL_PASSES):
            sel = target_ok & (assign == p)
            if not bool(sel.any()):
                continue
            hidden = model.encode(ids.masked_fill(sel, mask_id).to(dev), seg.to(dev))
            logits = model.mlm_logits(hidden, sel.to(dev)).float()     # [N, V]
            y = ids[sel].to(dev)
            logp = F.log_softmax(logits, dim=-1)
            true_logit = logits.gather(1, y[:, None])
            rank = (logits > true_logit).sum(1) + 1                     # ties counted in the model's favour
            conf, pred = logp.max(-1)
            parts["target"].append(y.cpu().numpy())
            parts["rank"].append(rank.cpu().numpy())
            parts["loss"].append((-logp.gather(1, y[:, None])[:, 0]).double().cpu().numpy())
            parts["conf"].append(conf.exp().double().cpu().numpy())
            parts["correct"].append((pred == y).cpu().numpy())
            parts["group"].append(group[sel].numpy().astype(np.int64))
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in parts.items()}


def evaluate_intrinsic(model, shards, cfg, special_ids: Mapping[str, int], seed: int = 0,
                       counts: dict[str, np.ndarray] | None = None, extended_tokenizer: bool = False,
                       documents: dict | None = None) -> dict:
    """Per-language masked-token metrics on the first ``cfg.max_sequences`` validation rows (see module docstring).

    ``special_ids``: role -> id for pad, cls, sep, mask (unk optional). ``counts``: precomputed train token
    counts per language (default: ``unigram_counts(shards, special_ids)``). ``extended_tokenizer``: the caller
    has checked that the model's tokenizer extends the shards' (every shard id means the same token, new ids
    appended; ``mlm compare``): a larger model vocabulary is then accepted, ranks run over all of it (a
    predicted new token counts as wrong) and the baseline stays the shards' counts. Default: the vocabulary
    sizes must match. ``documents``: when given, filled per scored language with the per-document counts behind
    top-1 (``document_counts``: what ``intrinsic_documents.parquet`` stores).
    """
    import torch
    missing_roles = sorted({"pad", "cls", "sep", "mask"} - set(special_ids))
    if missing_roles:
        raise ValueError(f"special_ids lacks {missing_roles} (has {sorted(special_ids)})")
    vocab = int(model.arch.vocab_size)
    shard_vocab = shards.manifest.get("vocab_size")
    if shard_vocab is not None and int(shard_vocab) != vocab and not (extended_tokenizer and vocab > int(shard_vocab)):
        raise ValueError(f"the shards were encoded with a vocabulary of {shard_vocab} tokens, the model has {vocab}")
    counts = counts if counts is not None else unigram_counts(shards, special_ids)
    langs = sorted(set(shards.languages("train")) | set(shards.languages("validation"))
                   | set(shards.manifest.get("languages", {})) | set(shards.manifest.get("dropped_languages", [])))
    dev = next(model.parameters()).device
    was = model.training
    model.eval()
    out: dict[str, dict] = {}
    from mlm_core.progress import Progress
    shown = Progress("evaluate intrinsic", len(langs), unit="languages")      # display only
    try:
        with torch.inference_mode(), shown:
            for i, lang in enumerate(langs):
                shown.update(i, note=f"scoring {lang}")
                n_val = shards.rows_per_lang("validation").get(lang, 0)
                if n_val == 0:
                    out[lang] = {"missing": True, "reason": "no validation rows"}
                    continue
                s = _score_language(model, shards, lang, min(n_val, cfg.max_sequences), special_ids, seed, dev)
                if len(s["rank"]) == 0:
                    out[lang] = {"missing": True, "reason": "no masked position in the validation rows"}
                    continue
                out[lang] = _summarize(s, counts.get(lang), cfg.ece_bins, seed)
                if documents is not None:
                    documents[lang] = document_counts(s, counts.get(lang))
                r = out[lang]
                log.info("intrinsic: %s: top1 %.3f [%.3f, %.3f] (baseline %s), ppl %.1f, ECE %.3f over %d "
                         "positions in %d documents", lang, r["top1"], r["top1_ci_low"], r["top1_ci_high"],
                         r["baseline_top1"], r["perplexity"], r["ece"], r["n_positions"], r["n_documents"])
            shown.update(len(langs), note="")
    finally:
        model.train(was)
    return out


def _summarize(s: dict[str, np.ndarray], counts: np.ndarray | None, n_bins: int, seed: int) -> dict:
    loss = float(s["loss"].mean())
    ece, table = expected_calibration_error(s["conf"], s["correct"], n_bins)
    _, groups = np.unique(s["group"], return_inverse=True)
    hit = (s["rank"] <= 1).astype(np.float64)
    r = {"n_positions": int(len(s["rank"])), "n_documents": int(groups.max()) + 1, **rank_metrics(s["rank"]),
         "loss": loss, "perplexity": math.exp(loss) if loss < 700 else float("inf"), "ece": ece}
    lo, hi = bootstrap_ci(groups, hit, seed=seed)
    r |= {"top1_ci_low": lo, "top1_ci_high": hi}
    if counts is None or counts.sum() == 0:        # no train tokens for this language: no baseline to stand next to
        r |= {"baseline_top1": None, "baseline_top5": None, "baseline_mrr": None,
              "top1_over_baseline": None, "top1_over_baseline_ci_low": None, "top1_over_baseline_ci_high": None}
    else:
        base_rank = frequency_ranks(counts)[s["target"].astype(np.int64)]
        b = rank_metrics(base_rank)
        lo, hi = bootstrap_ci(groups, hit - (base_rank <= 1), seed=seed)
        r |= {"baseline_top1": b["top1"], "baseline_top5": b["top5"], "baseline_mrr": b["mrr"],
              "top1_over_baseline": r["top1"] - b["top1"], "top1_over_baseline_ci_low": lo,
              "top1_over_baseline_ci_high": hi}
    return r | {"reliability": table}


def document_counts(s: dict[str, np.ndarray], counts: np.ndarray | None) -> dict[str, np.ndarray]:
    """Per held-out document (a [SEP]-delimited segment of a validation row, numbered 0.. in (row, segment)
    order): ``positions`` scored, ``correct`` (the model's top-1 hits) and ``baseline_correct`` (the unigram
    baseline's top-1 hits at the same positions; absent without train counts). Summed over documents they give
    top1 = correct / positions exactly: what a report needs to resample documents (``mlm_core.report``)."""
    _, g = np.unique(s["group"], return_inverse=True)
    n = int(g.max()) + 1 if len(g) else 0
    out = {"positions": np.bincount(g, minlength=n).astype(np.int64),
           "correct": np.bincount(g, weights=(s["rank"] <= 1).astype(np.float64), minlength=n).astype(np.int64)}
    if counts is not None and counts.sum() > 0:
        hit = frequency_ranks(counts)[s["target"].astype(np.int64)] <= 1
        out["baseline_correct"] = np.bincount(g, weights=hit.astype(np.float64), minlength=n).astype(np.int64)
    return out


DOCUMENTS_FILE = "intrinsic_documents.parquet"


def write_documents(documents: dict[str, dict], path: Path) -> Path:
    """``intrinsic_documents.parquet``: one row per (lang, document): lang, document, positions, correct,
    baseline_correct (null where the language has no baseline), sorted by lang then document."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    schema = pa.schema([("lang", pa.string()), ("document", pa.int32()), ("positions", pa.int32()),
                        ("correct", pa.int32()), ("baseline_correct", pa.int32())])
    cols: dict[str, list] = {k: [] for k in schema.names}
    for lang in sorted(documents):
        d = documents[lang]
        n = len(d["positions"])
        cols["lang"] += [lang] * n
        cols["document"] += list(range(n))
        cols["positions"] += d["positions"].tolist()
        cols["correct"] += d["correct"].tolist()
        cols["baseline_correct"] += d["baseline_correct"].tolist() if "baseline_correct" in d else [None] * n
    pq.write_table(pa.Table.from_pydict(cols, schema=schema), path)
    return Path(path)


# ------------------------------------------------------------------------------------------ plot
def reliability_plot(results: Mapping[str, dict], path: Path) -> Path:
    """One reliability diagram per (non-missing) language: accuracy per confidence bin vs the diagonal."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    langs = [lang for lang in sorted(results) if not results[lang].get("missing")]
    n = max(len(langs), 1)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for ax, lang in zip(axes.flat, langs):
        ax.set_visible(True)
        table = results[lang]["reliability"]
        width = table[0]["bin_hi"] - table[0]["bin_lo"]
        full = [t for t in table if t["count"]]
        ax.bar([t["bin_lo"] for t in full], [t["accuracy"] for t in full], width=width, align="edge",
               color="#4878d0", edgecolor="black", linewidth=0.5, label="accuracy")
        ax.bar([t["bin_lo"] for t in full], [t["confidence"] - t["accuracy"] for t in full], width=width,
               bottom=[t["accuracy"] for t in full], align="edge", color="#ee854a", alpha=0.5, label="gap")
        ax.plot([0, 1], [0, 1], "k--", linewidth=0.8)
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy",
               title=f"{lang}: ECE {results[lang]['ece']:.3f} (n={results[lang]['n_positions']})")
        ax.legend(loc="upper left", fontsize=7)
    if not langs:
        axes.flat[0].set_visible(True)
        axes.flat[0].text(0.5, 0.5, "no language evaluated", ha="center", va="center")
        axes.flat[0].set_axis_off()
    from mlm_core.figures import save_figure
    return save_figure(fig, path)


# ------------------------------------------------------------------------------------------ wrapper
def special_ids_from_manifest(manifest: dict) -> dict[str, int]:
    """role -> id from a tokenizer/shards manifest's ``special_tokens`` ({role: {"token", "id"}} or {role: id})."""
    st = manifest.get("special_tokens") or {}
    return {role: int(v["id"] if isinstance(v, dict) else v) for role, v in st.items()}


def validation_texts(normalize_dir: Path, langs: list[str], fraction: float | None, limit: int,
                     validation_docs: Mapping[str, int] | None = None) -> dict[str, list[str]]:
    """Up to ``limit`` documents per language from the shards' validation split (same rule as the shards stage:
    int(hash[:8], 16) / 2**32 < fraction, or, where the shards manifest's ``validation_docs`` gives a count,
    the first that many documents in hash order); the last documents when there is no fraction or hash column."""
    import pyarrow.parquet as pq

    from mlm_core.shards.build import hash_order_ranks, hash_prefix_u32, validation_mask
    validation_docs = validation_docs or {}
    out: dict[str, list[str]] = {}
    for lang in langs:
        f = Path(normalize_dir) / "docs" / f"{lang}.parquet"
        if not f.is_file():
            continue
        cols = [c for c in ("text", "hash") if c in pq.ParquetFile(f).schema_arrow.names]
        tbl = pq.read_table(f, columns=cols)
        texts = tbl.column("text").to_pylist()
        if fraction is not None and "hash" in cols and len(texts):
            prefix = hash_prefix_u32(tbl.column("hash").combine_chunks())
            if lang in validation_docs:
                mask = hash_order_ranks(prefix) < int(validation_docs[lang])
            else:
                mask = validation_mask(prefix, fraction)
            out[lang] = [t for t, v in zip(texts, mask) if v][:limit]
        else:
            out[lang] = texts[-limit:] if limit else []
    return out


def run_intrinsic(model_dir: Path, shards_dir: Path, normalize_dir: Path | None, cfg, seed: int = 0,
                  plot_path: Path | None = None, model_hook=None, extended_tokenizer: bool = False,
                  documents: dict | None = None, span_documents: dict | None = None) -> dict:
    """Load the model folder, the shard set and (for PLL) the normalized documents; returns
    {"intrinsic": evaluate_intrinsic(...), "pll": evaluate_pll(...) or {} without normalize_dir, "mlm_model"}.
    An ELECTRA folder: model.safetensors is the generator, so the MLM metrics and PLL are the generator's
    ("mlm_model": "generator"), and each language also gets the discriminator's replaced-token detection
    metrics (``rtd``: rtd_acc, rtd_auc, rtd_baseline_acc, ...).
    ``plot_path``: also write the reliability diagrams there. ``model_hook(model) -> model``: applied to the
    loaded model before scoring (debias.projection: ``mlm_core.bias.projection``). ``extended_tokenizer``:
    see ``evaluate_intrinsic``; the pseudo-perplexity always uses the folder's own tokenizer. ``documents``: filled
    with the per-document top-1 counts (``evaluate_intrinsic``). ``cfg.span_fill``: each language also gets the
    span-filling metrics (``mlm_core.evaluate.span_fill``: span_exact, ...), and ``span_documents`` their
    per-document counts."""
    from mlm_core.evaluate.pll import evaluate_pll
    from mlm_core.fillmask import load_model_dir
    from mlm_core.shards.reader import ShardDataset
    model, tok, _mask = load_model_dir(Path(model_dir))
    if model_hook is not None:
        model = model_hook(model)
    disc = load_discriminator(Path(model_dir))
    with ShardDataset(shards_dir) as ds:
        specials = special_ids_from_manifest(ds.manifest)
        counts = unigram_counts(ds, specials)
        intrinsic = evaluate_intrinsic(model, ds, cfg, specials, seed=seed, counts=counts,
                                       extended_tokenizer=extended_tokenizer, documents=documents)
        if getattr(cfg, "span_fill", False):      # span filling scored on whole spans (issue 21)
            from mlm_core.evaluate.span_fill import evaluate_span_fill
            for lang, r in evaluate_span_fill(model, ds, cfg, specials, seed, counts, span_documents).items():
                if not intrinsic.get(lang, {}).get("missing"):
                    intrinsic[lang] |= r
        if disc is not None:             # ELECTRA: the MLM metrics above are the generator's; add the discriminator's
            from mlm_core.evaluate.rtd import evaluate_rtd
            for lang, r in evaluate_rtd(model, disc, ds, cfg, specials, seed=seed).items():
                if not r.get("missing") and not intrinsic.get(lang, {}).get("missing"):
                    intrinsic[lang] |= r
        fraction = (ds.manifest.get("config", {}).get("shards", {}) or {}).get("validation_fraction")
        validation_docs = ds.manifest.get("validation_docs")
        langs = sorted(intrinsic)
        seq_len = ds.seq_len
    if plot_path is not None:
        reliability_plot(intrinsic, plot_path)
    pll: dict = {}
    if normalize_dir is not None and cfg.pll_sentences > 0:
        texts = validation_texts(Path(normalize_dir), langs, fraction, cfg.pll_sentences, validation_docs)
        texts = {lang: texts.get(lang, []) for lang in langs}
        # score at most one shard row's worth of content per text: PLL costs one forward pass per token
        pll = evaluate_pll(model, tok, texts, cfg, special_ids=specials, max_tokens=seq_len - 2)
    return {"intrinsic": intrinsic, "pll": pll, "mlm_model": "generator" if disc is not None else "model"}


def load_discriminator(model_dir: Path):
    """An ELECTRA pretrain output's discriminator (``discriminator.safetensors``), or None for an MLM folder."""
    f = Path(model_dir) / "discriminator.safetensors"
    if not f.is_file():
        return None
    from mlm_core.model.electra import Discriminator
    from mlm_core.model.weights import load_weights, read_arch
    disc = Discriminator(read_arch(f))
    load_weights(disc, f)
    return disc.eval()


__all__ = ["DOCUMENTS_FILE", "document_counts", "write_documents", "bootstrap_ci", "bootstrap_replicates", "evaluate_intrinsic", "expected_calibration_error", "rank_metrics", "unigram_counts", "frequency_ranks",
           "reliability_plot", "run_intrinsic", "special_ids_from_manifest", "validation_texts"]
