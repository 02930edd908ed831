"""The report's figures (matplotlib, Agg backend: no display needed). Each takes the collected runs and writes one
PNG, or returns None when no run has the data (e.g. no transfer task declared); bars are the mean over seeds
with the sample std as the error bar."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from mlm_core.figures import save_figure
from mlm_core.report.stats import summarize


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _variants(runs) -> list[str]:
    return list(dict.fromkeys(r.variant for r in runs))


def _values(runs, variant: str, metric: str) -> list:
    return [r.metrics.get(metric) for r in runs if r.variant == variant and r.complete]


def _langs(runs, pattern: str) -> list[str]:
    rx = re.compile(pattern)
    found = {m.group(1) for r in runs for k in r.metrics for m in [rx.fullmatch(k)] if m}
    return sorted(found)


def _bars(ax, runs, variants, langs, metric_of):
    width = 0.8 / max(len(variants), 1)
    x = np.arange(len(langs))
    for i, v in enumerate(variants):
        s = [summarize(_values(runs, v, metric_of(lg))) for lg in langs]
        means = [x.mean if x.mean is not None else np.nan for x in s]
        errs = [x.std if x.std is not None else 0.0 for x in s]
        ax.bar(x + (i - (len(variants) - 1) / 2) * width, means, width, yerr=errs, capsize=2, label=v)
    ax.set_xticks(x, langs)
    return x, width


def val_loss_vs_flops(runs, path: Path) -> Path | None:
    """Mean validation loss (over languages) against training FLOPs, one line per variant (mean over seeds,
    band = ± sample std where at least 2 seeds reached that eval)."""
    variants = [v for v in _variants(runs) if any(r.curve for r in runs if r.variant == v)]
    if not variants:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for v in variants:
        curves = [r.curve for r in runs if r.variant == v and r.curve]
        pts: dict[float, list] = {}
        for c in curves:
            for x, y in c:
                pts.setdefault(round(x, -3), []).append(y)
        xs = sorted(pts)
        s = [summarize(pts[x]) for x in xs]
        m = np.array([q.mean for q in s])
        sd = np.array([q.std if q.std is not None else 0.0 for q in s])
        line, = ax.plot(xs, m, marker="o", ms=3, label=f"{v} ({len(curves)} seeds)")
        ax.fill_between(xs, m - sd, m + sd, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("validation loss (mean over languages)")
    ax.set_title("Validation loss vs training compute")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=110)


def top1_vs_baseline(runs, path: Path) -> Path | None:
    """Per-language masked-token top-1 per variant, with the unigram baseline's top-1 as a black tick."""
    langs = _langs(runs, r"([a-z]{2,3})\.top1")
    if not langs:
        return None
    plt = _plt()
    variants = _variants(runs)
    fig, ax = plt.subplots(figsize=(max(6.4, 1.0 * len(langs) * max(1, len(variants)) * 0.45 + 2), 4.2))
    x, _ = _bars(ax, runs, variants, langs, lambda lg: f"{lg}.top1")
    for i, lg in enumerate(langs):
        b = summarize([r.metrics.get(f"{lg}.baseline_top1") for r in runs if r.complete]).mean
        if b is not None:
            ax.hlines(b, x[i] - 0.45, x[i] + 0.45, colors="black", linewidth=2,
                      label="unigram baseline" if i == 0 else None)
    ax.set_ylabel("held-out masked-token top-1")
    ax.set_title("Top-1 per language vs the unigram baseline")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path, dpi=110)


def transfer(runs, path: Path) -> Path | None:
    """Zero-shot transfer score per target language, one panel per task; dashed line = the source language's own
    score (mean over every complete run)."""
    tasks = sorted({k.split(".")[0] for r in runs for k in r.metrics
                    if k.endswith(".score") and k.count(".") == 2 and not k.split(".")[1] == "mean"})
    if not tasks:
        return None
    plt = _plt()
    variants = _variants(runs)
    fig, axes = plt.subplots(len(tasks), 1, figsize=(7.5, 3.6 * len(tasks)), squeeze=False)
    for ax, task in zip(axes[:, 0], tasks):
        langs = [lg for lg in _langs(runs, rf"{re.escape(task)}\.([a-z]{{2,3}})\.score")]
        _bars(ax, runs, variants, langs, lambda lg, t=task: f"{t}.{lg}.score")
        src = summarize([r.metrics.get(f"{task}.source_score") for r in runs if r.complete]).mean
        if src is not None:
            ax.axhline(src, color="gray", linestyle="--", linewidth=1, label="source language (all runs)")
        ax.set_ylabel(f"{task} score")
        ax.set_title(f"Zero-shot {task} transfer per target language")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=110)


def crows(runs, path: Path) -> Path | None:
    """CrowS-Pairs metric score per language (% of pairs where the more stereotyping sentence is likelier; 50 =
    no preference)."""
    langs = _langs(runs, r"([a-z]{2,3})\.crows_score")
    if not langs:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    _bars(ax, runs, _variants(runs), langs, lambda lg: f"{lg}.crows_score")
    ax.axhline(50, color="black", linewidth=1, label="50 (no preference)")
    ax.set_ylabel("CrowS-Pairs metric score (%)")
    ax.set_title("CrowS-Pairs per language")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path, dpi=110)


PLOTS = {
    "val_loss_vs_flops.png": (val_loss_vs_flops, "Validation loss vs training FLOPs"),
    "top1_vs_unigram.png": (top1_vs_baseline, "Per-language top-1 vs the unigram baseline"),
    "transfer.png": (transfer, "Zero-shot transfer per language"),
    "crows_pairs.png": (crows, "CrowS-Pairs"),
}


def write_plots(runs, out_dir: Path) -> dict[str, str]:
    """{file name: caption} of the figures written (those with data)."""
    out = {}
    complete = [r for r in runs if r.complete]
    for name, (fn, caption) in PLOTS.items():
        # the bars are means over complete runs; a curve is shown for every run that trained
        if fn(runs if fn is val_loss_vs_flops else complete, Path(out_dir) / name) is not None:
            out[name] = caption
    return out


__all__ = ["write_plots", "PLOTS"]
