"""The sweep report: ``<workdir>/sweeps/<name>/report/`` = report.md + the PNGs + report.html (the same content,
images embedded as base64: one self-contained file) + report.json (every number of the tables).

In: the sweep folder (its plan.json, see ``collect``). Out, in order:
  * Primary contrasts (``plan['primary']``, issue 21): per contrast the paired difference on the primary metric,
    its hierarchical 95% interval (seeds x held-out documents), the exact sign-flip p over seeds, the Holm
    correction over the sweep's primary contrasts and the verdict (supported / contradicted / inconclusive,
    ``stats.verdict``); the primary metric's table; under it one reading per contrast that starts with the
    verdict word. A plan without ``primary`` (older sweep files) says so: everything is exploratory.
  * Controls: per variant, mean [MASK] top-1 against the unigram baseline and each transfer task's zero-shot
    mean against the untrained encoder, with the differences' intervals.
  * One exploratory table per metric (``plan['metrics']``, fnmatch patterns allowed, e.g. ``upos.*.score``):
    per variant the seeds found, mean ± sample std, the paired difference against ``plan['baseline']`` with its
    interval and uncorrected p, the difference over the metric's control, and the control's own rows
    (``control_of``); the runs that are missing (no complete pretrain/evaluate output) in a table of their own
    and in each cell's count.
The Markdown and HTML are ``render``'s. Only stored outputs are read: nothing trains.
"""
from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

from mlm_core.report import stats
from mlm_core.report.collect import collect, doc_data
from mlm_core.report.plots import write_plots
from mlm_core.report.render import render_html, render_markdown

# metrics shown when plan.json names none
# (patterns with * list only what some run has: the untrained-encoder control's rows appear where it ran)
DEFAULT_METRICS = ("mean.top1", "upos.*.score", "upos.source_score", "upos.mean.score", "upos.mean.untrained_*",
                   "upos.*.gain_over_untrained", "*.top1", "*.top1_over_baseline", "*.rtd_acc", "*.rtd_auc", "*.span_exact",
                   "small3.*", "large2.*", "*.pseudo_perplexity", "*.crows_score", "pretrain.final_loss")


def expand_metrics(patterns, runs) -> list[str]:
    """The metric names the patterns name, in pattern order; a plain name no run has stays (shown as missing).
    In a pattern ``*`` stands for one dotted component: ``*.top1`` is ``en.top1``, not ``pretrain.en.top1``."""
    names = sorted({k for r in runs for k in r.metrics})
    out: list[str] = []
    for p in patterns:
        if "." not in p and not any(c in p for c in "*?[") and p not in names:
            # a short name: "top1" = every language's top1; "upos" = the task's per-language and source scores
            short = [f"*.{p}", f"{p}.*.score", f"{p}.source_score", f"*.{p}_score", f"pretrain.{p}"]
            hits = [s for s in short if any(fnmatch.fnmatchcase(n, s) for n in names)]
            out += expand_metrics(hits, runs) if hits else [p]
            continue
        if any(c in p for c in "*?["):
            hits = [n for n in names if fnmatch.fnmatchcase(n, p)]
            # "*.top1" must not also catch "upos.fr.top1"-like deeper names of another family
            depth = p.count(".")
            out += [n for n in hits if n.count(".") == depth]
        else:
            out.append(p)
    return list(dict.fromkeys(out))


# each metric's control, shown in its table: (pattern, control metric, label)
CONTROLS = ((re.compile(r"(.+)\.top1"), r"\1.baseline_top1", "unigram baseline"),
            (re.compile(r"(.+)\.score"), r"\1.untrained_score", "untrained encoder"),
            # ELECTRA's replaced-token detection: predict "original" everywhere (accuracy = share of original
            # tokens at the same positions, AUC 0.5)
            (re.compile(r"(.+)\.rtd_acc"), r"\1.rtd_baseline_acc", "all-original baseline"),
            (re.compile(r"(.+)\.rtd_auc"), r"\1.rtd_baseline_auc", "all-original baseline"),
            # evaluate.span_fill: the unigram baseline's whole-span exact match at the same spans
            (re.compile(r"(.+)\.span_exact"), r"\1.span_baseline_exact", "unigram baseline"))


def control_of(metric: str) -> tuple[str, str] | None:
    """(control metric, label) of a metric: ``<x>.top1`` -> the unigram baseline at the same positions,
    ``<task>.<lang|mean>.score`` -> the untrained encoder fine-tuned the same way, ``<x>.rtd_acc`` / ``<x>.rtd_auc``
    -> the all-original baseline (ELECTRA's discriminator); None for others."""
    for rx, repl, label in CONTROLS:
        if rx.fullmatch(metric):
            return rx.sub(repl, metric), label
    return None


def _values(runs, variant: str, metric: str) -> dict:
    return {r.seed: r.metrics.get(metric) for r in runs if r.variant == variant and r.complete}


def _docs(runs, variant: str, metric: str) -> dict:
    return {r.seed: doc_data(r, metric) for r in runs if r.variant == variant and r.complete}


def contrast(runs, metric: str, variant: str, baseline: str, control: bool = False) -> dict:
    """Paired difference variant - baseline over seeds: mean, hierarchical 95% interval, exact sign-flip p.
    ``control``: compare each run of ``variant`` with its own control (``baseline`` is then the control metric
    of the same runs)."""
    if control:
        a, b = _values(runs, variant, metric), _values(runs, variant, baseline)
        da, db = _docs(runs, variant, metric), _docs(runs, variant, baseline)
    else:
        a, b = _values(runs, variant, metric), _values(runs, baseline, metric)
        da, db = _docs(runs, variant, metric), _docs(runs, baseline, metric)
    h = stats.hierarchical_ci(a, b, da, db)
    h["p"] = stats.sign_flip_p([a[s] - b[s] for s in h["seeds"]]) if h["n"] else None
    return h


def metric_table(metric: str, runs, variants: list[str], baseline: str | None, seeds: list[int]) -> list[dict]:
    """One row per variant: n, mean, std, paired diff vs the baseline (hierarchical interval, exact p), the
    difference over its control, missing seeds; then the control's rows (``control_of``): one per variant
    when the variants' controls differ, else one for all."""
    ctrl = control_of(metric)
    rows = []
    for v in variants:
        vals = _values(runs, v, metric)
        s = stats.summarize(vals.values())
        d = contrast(runs, metric, v, baseline) if baseline and v != baseline else None
        present = sorted(k for k, x in vals.items() if x is not None)
        vc = contrast(runs, metric, v, ctrl[0], control=True) if ctrl else None
        # complete runs, none holding the metric: the variant does not report it (MLM has no rtd_acc), not missing
        absent = bool(vals) and not present
        # the variant's own seeds (a sweep may give a variant its own `seeds`), else the sweep's
        own = sorted({r.seed for r in runs if r.variant == v}) or seeds
        rows.append({"variant": v, "n": s.n, "of": len(own), "mean": s.mean, "std": s.std,
                     "missing_seeds": [] if absent else [x for x in own if x not in present], "diff": d,
                     "vs_control": vc if vc and vc["n"] else None, "not_reported": absent})
    if ctrl:
        per = {v: stats.summarize(_values(runs, v, ctrl[0]).values()) for v in variants}
        per = {v: c for v, c in per.items() if c.n}
        means = {round(c.mean, 9) for c in per.values()}
        if len(means) == 1:
            allv = stats.summarize([r.metrics.get(ctrl[0]) for r in runs if r.complete])
            groups = [(f"{ctrl[1]} (control)", allv)]
        else:
            groups = [(f"{ctrl[1]} (control, {v})", c) for v, c in per.items()]
        for name, c in groups:
            rows.append({"variant": name, "control": ctrl[0], "n": c.n, "of": None, "mean": c.mean, "std": c.std,
                         "missing_seeds": [], "diff": None, "vs_control": None})
    return rows


def primary_results(plan: dict, runs) -> list[dict] | None:
    """The sweep's primary contrasts (plan['primary']) with their Holm-corrected p and verdict; None without."""
    prim = plan.get("primary")
    if not prim:
        return None
    out = []
    for c in prim["contrasts"]:
        h = contrast(runs, prim["metric"], c["variant"], c.get("baseline") or plan.get("baseline"))
        out.append({**c, "baseline": c.get("baseline") or plan.get("baseline"), **h})
    # Holm over every declared contrast: one whose runs are not (yet) stored counts with p = 1, so a partly run
    # sweep never gets a smaller corrected p, and so no verdict, that the complete sweep could not give
    for r, adj in zip(out, stats.holm([1.0 if r["p"] is None else r["p"] for r in out])):
        r["p_holm"] = None if r["p"] is None else adj
        r["m"] = len(out)          # the contrasts Holm corrects over (the reading's floor)
        r["verdict"] = stats.verdict(r["p_holm"], r["ci_low"], r["ci_high"], r["expect"])
    return out


def controls_table(runs, variants: list[str]) -> list[dict]:
    """Per variant: mean [MASK] top-1 against the unigram baseline, each transfer task's zero-shot mean
    against the untrained encoder and, in a sweep with ELECTRA runs, the mean replaced-token detection accuracy
    and AUC against the all-original baseline; each difference with its interval."""
    out = []
    tasks = sorted({k.split(".")[0] for r in runs for k in r.metrics if k.endswith(".mean.untrained_score")})
    rtd = [m for m in ("mean.rtd_acc", "mean.rtd_auc") if any(m in r.metrics for r in runs)]
    for v in variants:
        row = {"variant": v}
        for m in ["mean.top1"] + [f"{t}.mean.score" for t in tasks] + rtd:
            c = control_of(m)
            vals = stats.summarize(_values(runs, v, m).values())
            cv = stats.summarize(_values(runs, v, c[0]).values())
            h = contrast(runs, m, v, c[0], control=True)
            row[m] = {"mean": vals.mean, "control": c[0], "control_label": c[1], "control_mean": cv.mean,
                      "diff": h if h["n"] else None}
        out.append(row)
    return out


def build_report(sweep_dir: Path, plan: dict | None = None) -> dict:
    """Write the report into ``<sweep_dir>/report``; returns {"dir", "md", "html", "json", "markdown", "figures",
    "missing"}."""
    sweep_dir = Path(sweep_dir)
    plan, runs = collect(sweep_dir, plan)
    out = sweep_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    seeds = sorted({r.seed for r in runs})
    variants = list(dict.fromkeys(r.variant for r in runs))
    metrics = expand_metrics(plan.get("metrics") or DEFAULT_METRICS, runs)
    pm = (plan.get("primary") or {}).get("metric")
    if pm:
        metrics = [pm] + [m for m in metrics if m != pm]
    tables = {m: metric_table(m, runs, variants, plan.get("baseline"), seeds) for m in metrics}
    primary = primary_results(plan, runs)
    controls = controls_table(runs, variants)
    figures = write_plots(runs, out)
    md = render_markdown(plan, runs, tables, figures, primary, controls)
    (out / "report.md").write_text(md, encoding="utf-8")
    (out / "report.html").write_text(render_html(md, out), encoding="utf-8")
    missing = [{"variant": r.variant, "seed": r.seed, "stages": r.missing_stages} for r in runs if r.missing_stages]
    summary = {"name": plan.get("name"), "baseline": plan.get("baseline"), "seeds": seeds, "variants": variants,
               "tables": tables, "missing": missing, "figures": figures, "primary_metric": pm,
               "primary": primary, "controls": controls, "alpha": stats.ALPHA,
               "bootstrap": {"n_resamples": stats.N_RESAMPLES, "seed": stats.BOOTSTRAP_SEED, "level": stats.LEVEL}}
    (out / "report.json").write_text(json.dumps(summary, indent=1, sort_keys=True), encoding="utf-8")
    return {"dir": out, "md": out / "report.md", "html": out / "report.html", "json": out / "report.json",
            "markdown": md, "figures": figures, "missing": missing, "tables": tables, "primary": primary,
            "controls": controls}


__all__ = ["build_report", "expand_metrics", "metric_table", "DEFAULT_METRICS",
           "contrast", "control_of", "controls_table", "primary_results"]
