"""The sweep report: ``<workdir>/sweeps/<name>/report/`` = report.md + the PNGs + report.html (the same content,
images embedded as base64: one self-contained file) + report.json (every number of the tables).

In: the sweep folder (its plan.json, see ``collect``). Out: one table per metric (``plan['metrics']``, fnmatch
patterns allowed, e.g. ``upos.*.score``): per variant the seeds found, mean ± sample std, and the paired
difference against ``plan['baseline']`` (by seed) with its bootstrap 95% percentile interval (``stats``); the
runs that are missing (no complete pretrain/evaluate output) in a table of their own and in each cell's count.
Only stored outputs are read: nothing trains.
"""
from __future__ import annotations

import base64
import fnmatch
import html
import json
import re
import time
from pathlib import Path

from mlm_core.report import stats
from mlm_core.report.collect import collect
from mlm_core.report.plots import write_plots

# metrics shown when plan.json names none
# (patterns with * list only what some run has: the untrained-encoder control's rows appear where it ran)
DEFAULT_METRICS = ("upos.*.score", "upos.source_score", "upos.mean.score", "upos.mean.untrained_*",
                   "upos.*.gain_over_untrained", "*.top1", "*.top1_over_baseline",
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


def metric_table(metric: str, runs, variants: list[str], baseline: str | None, seeds: list[int]) -> list[dict]:
    """One row per variant: n, mean, std, paired diff vs the baseline and its interval, missing seeds."""
    base_vals = {r.seed: r.metrics.get(metric) for r in runs if r.variant == baseline and r.complete}
    rows = []
    for v in variants:
        vals = {r.seed: r.metrics.get(metric) for r in runs if r.variant == v and r.complete}
        s = stats.summarize(vals.values())
        d = stats.paired_difference(vals, base_vals) if baseline and v != baseline else None
        present = sorted(k for k, x in vals.items() if x is not None)
        rows.append({"variant": v, "n": s.n, "of": len(seeds), "mean": s.mean, "std": s.std,
                     "missing_seeds": [x for x in seeds if x not in present],
                     "diff": d.as_dict() if d else None})
    return rows


def _f(x, digits: int = 4) -> str:
    if x is None:
        return "—"
    x = 0.0 if abs(x) < 1e-12 else x      # float noise of a std over equal values (4e-18) reads as 0
    a = abs(x)
    if a != 0 and (a >= 1e4 or a < 1e-3):
        return f"{x:.3g}"
    return f"{x:.{digits}f}" if a < 10 else f"{x:.2f}"


def _table_md(metric: str, rows: list[dict], baseline: str | None) -> str:
    head = (f"| variant | seeds | mean ± std | Δ vs {baseline or 'baseline'} (paired) | 95% bootstrap CI | missing |\n"
            "|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        ms = f"{_f(r['mean'])} ± {_f(r['std'])}" if r["mean"] is not None else "missing"
        if r["variant"] == baseline:
            dd, ci = "(baseline)", ""
        elif r["diff"] and r["diff"]["n"]:
            dd = f"{r['diff']['mean']:+.4g} (n={r['diff']['n']})"
            ci = (f"[{r['diff']['ci_low']:+.4g}, {r['diff']['ci_high']:+.4g}]" if r["diff"]["n"] > 1
                  else "— (one pair)")
        else:
            dd, ci = "—", ""
        miss = ", ".join(f"seed {s}" for s in r["missing_seeds"]) or ""
        lines.append(f"| {r['variant']} | {r['n']}/{r['of']} | {ms} | {dd} | {ci} | {miss} |")
    return f"### `{metric}`\n\n" + "\n".join(lines) + "\n"


METHOD = (f"Statistics: mean ± sample standard deviation (ddof = 1) over the seeds of each variant. Δ is the mean "
          f"of the paired differences variant − baseline over the seeds both have; its interval is the bootstrap "
          f"percentile interval ({stats.N_RESAMPLES} resamples of the paired differences with replacement, "
          f"numpy default_rng(seed={stats.BOOTSTRAP_SEED}), 2.5th–97.5th percentiles of the resampled means). "
          "With 3 seeds that interval is exactly [smallest, largest] paired difference: it shows whether the "
          "seeds agree in sign, not a population confidence interval. A run is *missing* when its pretrain or "
          "evaluate output is not stored; its cells count only the seeds found (seeds column).")


def render_markdown(plan: dict, runs, tables: dict[str, list[dict]], figures: dict[str, str]) -> str:
    name = plan.get("name") or "sweep"
    seeds = sorted({r.seed for r in runs})
    variants = list(dict.fromkeys(r.variant for r in runs))
    done = sum(r.complete for r in runs)
    out = [f"# Sweep report: {name}", ""] + ([plan["description"], ""] if plan.get("description") else [])
    steps = plan.get("matched_steps") or {}
    out += [f"- base config: `{plan.get('base', '?')}`",
            f"- variants: {', '.join(variants)}; baseline: **{plan.get('baseline') or 'none'}**",
            f"- seeds: {seeds}; budget match: {plan.get('match') or 'none'}"
            + (" (pretrain.steps: " + ", ".join(f"{k} {v}" for k, v in steps.items()) + ")" if steps else ""),
            f"- runs complete: {done} of {len(runs)}",
            f"- built {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} from stored outputs (nothing trained)", ""]
    missing = [r for r in runs if r.missing_stages]
    if missing:
        out += ["## Missing runs", "", "| variant | seed | missing stage outputs | sweep status |", "|---|---|---|---|"]
        out += [f"| {r.variant} | {r.seed} | {', '.join(r.missing_stages)} | {r.sweep_status or '—'} |" for r in missing]
        out += ["", "Runs missing pretrain or evaluate are left out of every mean (their seeds are listed in each "
                "table); a missing audit removes only the audit metrics.", ""]
    out += ["## Metrics", "", METHOD, ""]
    for metric, rows in tables.items():
        out += [_table_md(metric, rows, plan.get("baseline")), ""]
    if figures:
        out += ["## Plots", ""]
        for fn, cap in figures.items():
            out += [f"### {cap}", "", f"![{cap}]({fn})", ""]
    return "\n".join(out)


def render_html(md: str, folder: Path) -> str:
    """A small Markdown subset (headings, lists, tables, images, `code`, **bold**) to HTML, images inlined."""
    def inline(t: str) -> str:
        t = html.escape(t)
        t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
        return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)

    body, table, items = [], [], []

    def flush():
        if table:
            rows = [r for r in table if not re.fullmatch(r"\|[-|\s]+\|", r)]
            cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
            h = "".join(f"<th>{inline(c)}</th>" for c in cells[0])
            b = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in cells[1:])
            body.append(f"<table><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>")
            table.clear()
        if items:
            body.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        if line.startswith("- "):
            items.append(line[2:])
            continue
        flush()
        m = re.fullmatch(r"(#{1,4}) (.*)", line)
        img = re.fullmatch(r"!\[(.*)\]\((.*)\)", line)
        if m:
            body.append(f"<h{len(m.group(1))}>{inline(m.group(2))}</h{len(m.group(1))}>")
        elif img and (folder / img.group(2)).is_file():
            data = base64.b64encode((folder / img.group(2)).read_bytes()).decode("ascii")
            body.append(f'<img alt="{html.escape(img.group(1))}" src="data:image/png;base64,{data}">')
        elif line.strip():
            body.append(f"<p>{inline(line)}</p>")
    flush()
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}img{max-width:100%}")
    return f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head><body>" \
           + "\n".join(body) + "</body></html>"


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
    tables = {m: metric_table(m, runs, variants, plan.get("baseline"), seeds) for m in metrics}
    figures = write_plots(runs, out)
    md = render_markdown(plan, runs, tables, figures)
    (out / "report.md").write_text(md, encoding="utf-8")
    (out / "report.html").write_text(render_html(md, out), encoding="utf-8")
    missing = [{"variant": r.variant, "seed": r.seed, "stages": r.missing_stages} for r in runs if r.missing_stages]
    summary = {"name": plan.get("name"), "baseline": plan.get("baseline"), "seeds": seeds, "variants": variants,
               "tables": tables, "missing": missing, "figures": figures,
               "bootstrap": {"n_resamples": stats.N_RESAMPLES, "seed": stats.BOOTSTRAP_SEED, "level": stats.LEVEL}}
    (out / "report.json").write_text(json.dumps(summary, indent=1, sort_keys=True), encoding="utf-8")
    return {"dir": out, "md": out / "report.md", "html": out / "report.html", "json": out / "report.json",
            "markdown": md, "figures": figures, "missing": missing, "tables": tables}


__all__ = ["build_report", "expand_metrics", "metric_table", "render_markdown", "render_html", "DEFAULT_METRICS"]
