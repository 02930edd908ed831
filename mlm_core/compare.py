"""Before vs after: two models scored on the same held-out data, side by side.

In: two model folders (what ``mlm evaluate`` / ``mlm audit`` read), a LoadedConfig whose normalize and
shards outputs hold the held-out data (both models are scored on exactly these rows and texts) and whose
``evaluate`` / ``audit`` sections say what else to run, and two labels. Optionally each model's training
languages, so a language can be marked ``original`` (A was trained on it), ``new`` (B was, A was not) or
``unseen`` (neither): a drop of an ``original`` language is forgetting, a gain on a ``new`` one adaptation.

Out: {"labels", "languages": {lang: status}, "rows": [{metric, lang, status, a, b, delta, better}], "notes",
"evaluation": {"a", "b"}, "audit": {"a", "b"}}; ``write_outputs`` writes ``compare.json``, ``compare.md``
and ``compare.png`` (per-language pseudo-perplexity and masked top-1, A vs B).

Every number comes from the same code as ``mlm evaluate`` (``evaluate_model``) and ``mlm audit``
(``run_audit``): the comparison adds no metric of its own, only B - A.

A model whose tokenizer *extends* the one the held-out shards were encoded with (``tokenizer.extend``: every
shard token, special tokens included, keeps its id; new tokens are appended after them; the embedding table
is larger) is scored on the same token rows like the other model: the rows mean the same tokens to it. Its
ranks run over its whole vocabulary (predicting a new token counts as wrong), the unigram baseline stays the
shards' counts, and a note says it is scored on the base segmentation (its new tokens never occur in the
rows, where its own tokenizer would have used some) and that its pseudo-perplexity, as ``mlm evaluate``'s,
goes through its own (extended) tokenizer on the same held-out texts.
A model with another tokenizer (a shared token at another id, another family) cannot be scored on those
token rows: its masked-token metrics are left empty with a note, and its pseudo-perplexity is still measured
on the same held-out texts through its own tokenizer (per-token figures of two tokenizers are then not
strictly comparable: the note says so).
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Sequence

from mlm_core.errors import MlmError

log = logging.getLogger(__name__)

# (metric, key in evaluate's intrinsic rows, which direction is better)
INTRINSIC_METRICS = (("top1", "top1", "higher"), ("top5", "top5", "higher"),
                     ("top1_over_baseline", "top1_over_baseline", "higher"),
                     ("perplexity", "perplexity", "lower"), ("pseudo_perplexity", "pseudo_perplexity", "lower"),
                     ("ece", "ece", "lower"))
STATUS_ORDER = {"new": 0, "original": 1, "unseen": 2, "": 3}


class CompareError(MlmError, ValueError):
    pass


# ------------------------------------------------------------------------------------------ languages
def training_languages(folder: Path) -> list[str] | None:
    """The languages a pipeline-trained model was validated on during pretraining (its training languages),
    from ``eval.json`` in the folder or, for an ``hf/`` export, next to it; None when the folder does not say."""
    folder = Path(folder)
    for f in (folder / "eval.json", folder.parent / "eval.json"):
        if f.is_file():
            try:
                ev = json.loads(f.read_text(encoding="utf-8")).get("eval") or {}
            except (OSError, ValueError):
                continue
            if ev:
                return sorted(ev)
    return None


def language_status(langs: Sequence[str], train_a: Sequence[str] | None,
                    train_b: Sequence[str] | None) -> dict[str, str]:
    """original (A was trained on it) / new (B was, A was not) / unseen (neither); "" when A's are unknown."""
    out = {}
    for lang in langs:
        if train_a is None:
            out[lang] = ""
        elif lang in train_a:
            out[lang] = "original"
        elif train_b is None:
            out[lang] = "not in A"
        else:
            out[lang] = "new" if lang in train_b else "unseen"
    return out


# ------------------------------------------------------------------------------------------ scoring
def tokenizer_relation(folder: Path, tokenizer_dir: Path | None) -> str:
    """How the model's tokenizer relates to the one the held-out shards were encoded with: "same" (every token
    at the same id; also when either is unknown: evaluate's own vocabulary-size check still applies),
    "extension" (a strict superset: every shards' token at the same id, its special tokens still special,
    more tokens besides) or "other"."""
    from tokenizers import Tokenizer
    ours = Path(tokenizer_dir) / "tokenizer.json" if tokenizer_dir is not None else None
    if ours is None or not ours.is_file() or not (Path(folder) / "tokenizer.json").is_file():
        return "same"
    model_tok, base_tok = Tokenizer.from_file(str(Path(folder) / "tokenizer.json")), Tokenizer.from_file(str(ours))
    model_vocab, base_vocab = model_tok.get_vocab(with_added_tokens=True), base_tok.get_vocab(with_added_tokens=True)
    if model_vocab == base_vocab:
        return "same"
    if any(model_vocab.get(token) != i for token, i in base_vocab.items()):
        return "other"
    # the shards' special tokens (never masked targets, never counted) must stay special at their ids
    model_special = {i: t.content for i, t in model_tok.get_added_tokens_decoder().items() if t.special}
    if any(t.special and model_special.get(i) != t.content for i, t in base_tok.get_added_tokens_decoder().items()):
        return "other"
    return "extension"


def same_tokenizer(folder: Path, tokenizer_dir: Path | None) -> bool:
    """Whether the model's tokenizer maps every token to the same id as the one the held-out shards were
    encoded with (unknown: assumed so, and evaluate's own vocabulary-size check still applies)."""
    return tokenizer_relation(folder, tokenizer_dir) == "same"


def _pll_only(folder: Path, shards_dir: Path, normalize_dir: Path | None, lc) -> dict:
    """evaluate's pseudo-perplexity on the held-out texts with the model's own tokenizer (no token rows)."""
    from mlm_core.evaluate.intrinsic import validation_texts
    from mlm_core.evaluate.pll import evaluate_pll, tokenizer_special_ids
    from mlm_core.fillmask import load_model_dir
    from mlm_core.shards.reader import ShardDataset
    cfg = lc.config.evaluate
    with ShardDataset(shards_dir) as ds:
        langs = sorted(set(ds.languages("train")) | set(ds.languages("validation")))
        fraction = (ds.manifest.get("config", {}).get("shards", {}) or {}).get("validation_fraction")
        validation_docs, seq_len = ds.manifest.get("validation_docs"), ds.seq_len
    model, tok, _ = load_model_dir(Path(folder))
    reason = "its tokenizer differs from the one the held-out shards were encoded with"
    out = {"intrinsic": {lang: {"missing": True, "reason": reason} for lang in langs}, "pll": {}}
    if normalize_dir is not None and cfg.pll_sentences > 0:
        texts = validation_texts(Path(normalize_dir), langs, fraction, cfg.pll_sentences, validation_docs)
        out["pll"] = evaluate_pll(model, tok, {lang: texts.get(lang, []) for lang in langs}, cfg,
                                  special_ids=tokenizer_special_ids(tok), max_tokens=seq_len - 2)
    return out


def score_model(folder: Path, shards_dir: Path, normalize_dir: Path | None, lc,
                tokenizer_dir: Path | None = None) -> tuple[dict, dict, list[str]]:
    """(evaluate_model's result, run_audit's result, notes) for one model on the config's held-out data."""
    from mlm_core.audit import run_audit
    from mlm_core.evaluate.stage import evaluate_model
    notes = []
    relation = tokenizer_relation(folder, tokenizer_dir)
    if relation == "same":
        ev = evaluate_model(Path(folder), Path(shards_dir), normalize_dir, lc, None)
    elif relation == "extension":
        notes.append(f"{folder}: its tokenizer extends the one the held-out shards were encoded with (every shard "
                     f"token at the same id, new tokens appended): its masked-token metrics are scored on the same "
                     f"token rows, i.e. on the base segmentation (its new tokens never occur in them, where its "
                     f"own tokenizer would have segmented some words differently), ranked over its whole "
                     f"vocabulary (a predicted new token counts as wrong); its pseudo-perplexity uses its own "
                     f"extended tokenizer on the same texts (per-token values of two tokenizers are not strictly "
                     f"comparable)")
        ev = evaluate_model(Path(folder), Path(shards_dir), normalize_dir, lc, None, extended_tokenizer=True)
    else:
        notes.append(f"{folder}: its tokenizer differs from the one the held-out shards were encoded with: masked-"
                     f"token metrics not computed; its pseudo-perplexity uses its own tokenizer on the same texts "
                     f"(per-token values of two tokenizers are not strictly comparable)")
        ev = _pll_only(folder, shards_dir, normalize_dir, lc)
        from mlm_core.evaluate.transfer import run_transfer
        cfg = lc.config.evaluate
        ev["transfer"] = (run_transfer(Path(folder), cfg, lc.base_dir, lc.config.train_seed)
                          if cfg.upos or cfg.classification or cfg.retrieval else {})
    audit = run_audit(Path(folder), lc.config.audit, lc.base_dir)
    return ev, audit, notes


def _num(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(float(v)) else None


def metric_values(ev: dict, audit: dict) -> dict[tuple[str, str], tuple[float | None, str]]:
    """{(metric, lang): (value, better)} of one model: intrinsic, transfer, CrowS-Pairs, templates."""
    from mlm_core.evaluate.stage import intrinsic_rows, transfer_rows
    out: dict[tuple[str, str], tuple[float | None, str]] = {}
    for row in intrinsic_rows(ev):
        for metric, key, better in INTRINSIC_METRICS:
            out[(metric, row["lang"])] = (_num(row.get(key)), better)
    for lang, p in (ev.get("pll") or {}).items():   # also where the token rows could not be scored (other tokenizer)
        if not p.get("missing"):
            out[("pseudo_perplexity", lang)] = (_num(p.get("pseudo_perplexity")), "lower")
    for row in transfer_rows(ev):
        out[(f"{row['task']}.score", row["lang"])] = (_num(row.get("score")), "higher")
    for task, t in sorted((ev.get("transfer") or {}).items()):
        if isinstance(t, dict) and t.get("source_lang") and "source_score" in t:
            out[(f"{task}.score", t["source_lang"])] = (_num(t.get("source_score")), "higher")
    ret = (ev.get("transfer") or {}).get("retrieval") or {}
    for lang, r in sorted((ret.get("pairs") or {}).items()):
        out[("retrieval.acc1", lang)] = (_num(r.get("mean")), "higher")
    for lang, r in sorted((audit.get("crows") or {}).items()):
        out[("crows.score", lang)] = (_num(r.get("metric_score")), "50")
    for lang, t in sorted((audit.get("templates") or {}).items()):
        for pair, v in sorted((t.get("delta_bias") or {}).items()):
            out[(f"template.delta_bias.{pair}", lang)] = (_num(v), "0")
        out[("template.kl_to_neutral", lang)] = (_num(t.get("kl_to_neutral_mean")), "lower")
    return out


def comparison_rows(values_a: dict, values_b: dict, status: dict[str, str]) -> list[dict]:
    """One row per (metric, language) either model has: a, b and delta = b - a (None when either is missing)."""
    keys = sorted(set(values_a) | set(values_b),
                  key=lambda k: (_metric_rank(k[0]), k[0], STATUS_ORDER.get(status.get(k[1], ""), 3), k[1]))
    rows = []
    for metric, lang in keys:
        a, better = values_a.get((metric, lang), (None, None))
        b, better_b = values_b.get((metric, lang), (None, None))
        rows.append({"metric": metric, "lang": lang, "status": status.get(lang, ""), "a": a, "b": b,
                     "delta": None if a is None or b is None else b - a, "better": better or better_b})
    return rows


def _metric_rank(metric: str) -> int:
    order = ("pseudo_perplexity", "top1", "top5", "top1_over_baseline", "perplexity", "ece")
    return order.index(metric) if metric in order else len(order)


# ------------------------------------------------------------------------------------------ entry point
def compare_models(folder_a: Path, folder_b: Path, lc, labels: Sequence[str] = ("A", "B"),
                   out_dir: Path | None = None, train_langs: Sequence[Sequence[str] | None] | None = None) -> dict:
    """Score both models on the config's held-out data (evaluate + audit) and tabulate B - A.

    ``train_langs``: (A's, B's) training languages; default: read from each folder (``training_languages``).
    ``out_dir``: also write compare.json / compare.md / compare.png there."""
    from mlm_core import stages
    from mlm_core.commands import run_command
    plans = stages.plan(lc)
    for need in ("normalize", "shards"):
        if plans[need].status != "done":
            raise CompareError(f"`mlm compare` needs the {need} output of {lc.path} (the held-out data both models "
                               f"are scored on), which is {plans[need].status}: run "
                               f"`{run_command(lc, '--only', need)}` first")
    folders = [Path(folder_a), Path(folder_b)]
    for label, f in zip(labels, folders):
        if not f.is_dir():
            raise CompareError(f"model {label}: {f} is not a folder")
    if train_langs is None:
        train_langs = [training_languages(f) for f in folders]
    tok_dir = plans["tokenizer"].path if plans["tokenizer"].status == "done" else None
    scored = [score_model(f, plans["shards"].path, plans["normalize"].path, lc, tok_dir) for f in folders]
    values = [metric_values(ev, au) for ev, au, _ in scored]
    langs = sorted({lang for v in values for _, lang in v})
    status = language_status(langs, train_langs[0], train_langs[1])
    rows = comparison_rows(values[0], values[1], status)
    result = {"labels": list(labels), "folders": [str(f) for f in folders],
              "heldout": {"config": str(lc.path), "normalize": plans["normalize"].fingerprint,
                          "shards": plans["shards"].fingerprint},
              "training_languages": [None if t is None else list(t) for t in train_langs],
              "languages": status, "rows": rows, "notes": [n for _, _, ns in scored for n in ns],
              "evaluation": {"a": scored[0][0], "b": scored[1][0]}, "audit": {"a": scored[0][1], "b": scored[1][1]}}
    if out_dir is not None:
        write_outputs(result, Path(out_dir))
    return result


# ------------------------------------------------------------------------------------------ outputs
def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def table_markdown(result: dict) -> str:
    lines = ["| metric | lang | status | A | B | B − A | better |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        d = r["delta"]
        lines.append(f"| {r['metric']} | {r['lang']} | {r['status'] or '-'} | {_fmt(r['a'])} | {_fmt(r['b'])} | "
                     f"{'-' if d is None else f'{d:+.4g}'} | {_better_label(r['better'])} |")
    return "\n".join(lines) + "\n"


def _better_label(better: str | None) -> str:
    return {"higher": "higher", "lower": "lower", "50": "near 50", "0": "near 0"}.get(better or "", "-")


def summary_lines(result: dict) -> list[str]:
    """Per language: pseudo-perplexity A -> B (x the ratio B/A) and top-1 A -> B (the headline of the report)."""
    by = {(r["metric"], r["lang"]): r for r in result["rows"]}
    out = []
    for lang, st in sorted(result["languages"].items(), key=lambda kv: (STATUS_ORDER.get(kv[1], 3), kv[0])):
        p, t = by.get(("pseudo_perplexity", lang)), by.get(("top1", lang))
        if p is None and t is None:
            continue
        bits = []
        if p is not None and p["a"] is not None and p["b"] is not None:
            bits.append(f"pseudo-perplexity {p['a']:.4g} -> {p['b']:.4g} (x{p['b'] / p['a']:.3g})")
        if t is not None and t["a"] is not None and t["b"] is not None:
            bits.append(f"top-1 {t['a']:.4f} -> {t['b']:.4f} ({t['b'] - t['a']:+.4f})")
        if bits:
            out.append(f"- {lang}{f' ({st})' if st else ''}: " + "; ".join(bits))
    return out


def markdown(result: dict, extra_lines: Sequence[str] = ()) -> str:
    a, b = result["labels"]
    lines = ["# Model comparison: A vs B", "", f"- A: `{a}`", f"- B: `{b}`", *extra_lines]
    ta, tb = result.get("training_languages") or (None, None)
    if ta is not None or tb is not None:
        lines.append(f"- training languages: A {', '.join(ta) if ta else 'unknown'}; B {', '.join(tb) if tb else 'unknown'}"
                     " (status: original = A was trained on it, new = only B, unseen = neither)")
    lines.append("- both scored on the same held-out data (the config's normalize and shards outputs)")
    lines += [f"- note: {n}" for n in result.get("notes") or []]
    head = summary_lines(result)
    if head:
        lines += ["", "## Per language", "", *head]
    lines += ["", "## All metrics", "", table_markdown(result)]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> Path:
    """Two panels, per language: pseudo-perplexity (log scale) and masked top-1, A next to B."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    by = {(r["metric"], r["lang"]): r for r in result["rows"]}
    langs = sorted(result["languages"], key=lambda lg: (STATUS_ORDER.get(result["languages"][lg], 3), lg))
    names = [f"{lg}\n({result['languages'][lg]})" if result["languages"][lg] else lg for lg in langs]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.3 * len(langs) + 3), 4.6))
    x = list(range(len(langs)))
    for ax, metric, title in ((axes[0], "pseudo_perplexity", "pseudo-perplexity (lower is better)"),
                              (axes[1], "top1", "masked top-1 (higher is better)")):
        for k, (key, color) in enumerate((("a", "#4878d0"), ("b", "#ee854a"))):
            vals = [(by.get((metric, lg)) or {}).get(key) for lg in langs]
            bars = ax.bar([i + (k - 0.5) * 0.4 for i in x], [v if v is not None else 0 for v in vals], 0.4,
                          label=key.upper(), color=color)
            for bar, v in zip(bars, vals):      # the value on each bar; "n/a" where a model has none
                ax.annotate("n/a" if v is None else f"{v:.3g}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=6)
        ax.set_xticks(x, names, fontsize=8)
        got = [v for lg in langs for k in ("a", "b") if (v := (by.get((metric, lg)) or {}).get(k))]
        if metric == "pseudo_perplexity" and got and max(got) / min(got) > 20:   # values orders of magnitude apart
            ax.set_yscale("log")
            title += ", log scale"
        ax.set_title(title)
        ax.legend(fontsize=8)
    a, b = (_short_label(lbl) for lbl in result["labels"])
    fig.suptitle(f"A: {a}    B: {b}", fontsize=9)
    from mlm_core.figures import save_figure
    return save_figure(fig, path)


def _short_label(ref: str, width: int = 48) -> str:
    return ref if len(ref) <= width else "…" + ref[-(width - 1):]


def write_outputs(result: dict, out_dir: Path, extra_lines: Sequence[str] = ()) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "compare.json", "md": out_dir / "compare.md", "png": out_dir / "compare.png"}
    paths["json"].write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    paths["md"].write_text(markdown(result, extra_lines), encoding="utf-8")
    plot(result, paths["png"])
    return paths


__all__ = ["CompareError", "compare_models", "comparison_rows", "language_status", "markdown", "metric_values",
           "plot", "score_model", "summary_lines", "table_markdown", "tokenizer_relation", "training_languages",
           "write_outputs"]
