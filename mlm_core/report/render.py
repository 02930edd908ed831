"""Rendering a sweep report: the Markdown (``render_markdown``: method, primary contrasts with their verdicts and
readings, controls, exploratory tables, plots) and a self-contained HTML page of it (``render_html``). Numbers
come from ``build`` (the tables, contrasts and controls); nothing is computed here but formatting."""
from __future__ import annotations

import base64
import html
import re
import time
from pathlib import Path

from mlm_core.report import stats


def _f(x, digits: int = 4) -> str:
    if x is None:
        return "—"
    x = 0.0 if abs(x) < 1e-12 else x      # float noise of a std over equal values (4e-18) reads as 0
    a = abs(x)
    if a != 0 and (a >= 1e4 or a < 1e-3):
        return f"{x:.3g}"
    return f"{x:.{digits}f}" if a < 10 else f"{x:.2f}"


def _p(p) -> str:
    return "—" if p is None else f"{p:.3g}"


def _ci(d: dict) -> str:
    if not d or not d.get("n"):
        return ""
    if d["n"] == 1:
        return "— (one pair)"
    return f"[{d['ci_low']:+.4g}, {d['ci_high']:+.4g}]"


def _table_md(metric: str, rows: list[dict], baseline: str | None, label: str = "") -> str:
    ctrl = next((r for r in rows if r.get("control")), None)
    vs = f"Δ vs {ctrl['variant'].split(' (')[0]} [95% CI]" if ctrl else "Δ vs control"
    head = (f"| variant | seeds | mean ± std | Δ vs {baseline or 'baseline'} (paired) | 95% CI | p (sign-flip) | "
            f"{vs} | missing |\n|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        ms = (f"{_f(r['mean'])} ± {_f(r['std'])}" if r["mean"] is not None
              else "not reported by this variant" if r.get("not_reported") else "missing")
        if r.get("control"):
            lines.append(f"| {r['variant']} | {r['n']} runs | {ms} | | | | | |")
            continue
        if r["variant"] == baseline:
            dd, ci, p = "(baseline)", "", ""
        elif r["diff"] and r["diff"]["n"]:
            dd, ci, p = f"{r['diff']['mean']:+.4g} (n={r['diff']['n']})", _ci(r["diff"]), _p(r["diff"]["p"])
        else:
            dd, ci, p = "—", "", ""
        vc = r.get("vs_control")
        vcs = f"{vc['mean']:+.4g} {_ci(vc)}".strip() if vc else ""
        miss = ", ".join(f"seed {s}" for s in r["missing_seeds"]) or ""
        lines.append(f"| {r['variant']} | {r['n']}/{r['of']} | {ms} | {dd} | {ci} | {p} | {vcs} | {miss} |")
    return f"### `{metric}`{label}\n\n" + "\n".join(lines) + "\n"


def _mode_note(rows: list[dict]) -> str:
    modes = {d["mode"] for r in rows for d in (r.get("diff"), r.get("vs_control")) if d and d.get("mode")}
    if not modes:
        return ""
    if modes == {"seeds x documents"}:
        return "intervals resample seeds and held-out documents"
    if modes == {"seeds only"}:
        return "intervals resample seeds only (no per-document data stored for this metric)"
    return "intervals resample seeds and documents where per-document data is stored, else seeds only"


def reading(c: dict) -> str:
    """The sentence under a primary table: it starts with the verdict word."""
    word = c["verdict"].capitalize()
    if not c.get("n"):
        return f"**{word}**: no seed has both {c['variant']} and {c['baseline']} (nothing to compare)."
    claim = f" ({c['claim']})" if c.get("claim") else ""
    text = (f"**{word}**: {c['variant']} − {c['baseline']} = {c['mean']:+.4g}, 95% CI [{c['ci_low']:+.4g}, "
            f"{c['ci_high']:+.4g}] over {c['n']} paired seeds ({c['mode']}); exact sign-flip p = {_p(c['p'])}, "
            f"Holm-corrected p = {_p(c['p_holm'])}; the paper expects {c['variant']} {c['expect']}{claim}.")
    # the smallest corrected p the data could ever give; at or above alpha the verdict can only be "inconclusive"
    m = int(c.get("m") or 1)
    floor = stats.holm_floor(c["n"], m)
    if floor >= stats.ALPHA:
        need = stats.seeds_needed(m)
        what = ("exact p" if m == 1 else
                f"Holm-corrected p over the {m} primary contrasts (2 / 2^{c['n']} x {m})")
        text += (f" With {c['n']} seeds the smallest possible {what} is {floor:.3g}: no verdict other than "
                 f"inconclusive is possible ({need} seeds are needed).")
    return text


METHOD = ("Statistics: mean ± sample standard deviation (ddof = 1) over the seeds of each variant. Δ is the mean "
          "of the paired differences variant − baseline over the seeds both have. Its 95% interval is a "
          f"hierarchical percentile bootstrap ({stats.N_RESAMPLES} replicates, numpy default_rng(seed="
          f"{stats.BOOTSTRAP_SEED})): each replicate resamples the seeds (paired) and, where the evaluate outputs "
          "store per-document data ([MASK] top-1 per held-out document, UPOS per sentence), the held-out "
          "documents too, the same draw for every run (they are scored on the same documents), so evaluation "
          "noise is inside the interval; other metrics resample seeds only (each table says which). p is the "
          "exact paired permutation test over seeds (all 2^n sign flips, two-sided): with 3 seeds it cannot go "
          "below 0.25, with 6 it can reach 0.031. The controls (the unigram baseline for top-1, the untrained "
          "encoder fine-tuned the same way for transfer scores, the all-original baseline for ELECTRA's "
          "replaced-token detection: predict \"original\" everywhere, accuracy = the share of original tokens, "
          "AUC 0.5) are rows of the same tables, and each variant's "
          "difference over its own control is a column. A run is *missing* when its pretrain or evaluate output "
          "is not stored; its cells count only the seeds found (seeds column).")

VERDICT_RULE = ("Verdict rule: *supported* when the Holm-corrected p (over this sweep's primary contrasts) is "
                f"< {stats.ALPHA} and the 95% interval excludes 0 on the side the paper expects; *contradicted* "
                "when the same holds on the other side; otherwise *inconclusive*.")


def _controls_md(rows: list[dict]) -> list[str]:
    if not rows or len(rows[0]) == 1:
        return []
    metrics = [k for k in rows[0] if k != "variant"]
    head = "| variant | " + " | ".join(f"`{m}` | {rows[0][m]['control_label']} | Δ [95% CI]" for m in metrics) + " |"
    lines = ["## Controls", "", "Every variant next to its controls: the unigram baseline at the same masked "
             "positions, and the untrained encoder (same architecture, the run's seed, no pretraining) fine-tuned "
             "the same way" + (", and for ELECTRA's replaced-token detection (`rtd_acc`, `rtd_auc`) the all-original "
             "baseline (accuracy = share of original tokens, AUC 0.5)" if any("rtd" in m for m in metrics) else "")
             + ".", "", head, "|" + "---|" * (1 + 3 * len(metrics))]
    for r in rows:
        cells = []
        for m in metrics:
            c = r[m]
            d = c["diff"]
            cells += [_f(c["mean"]), _f(c["control_mean"]), f"{d['mean']:+.4g} {_ci(d)}".strip() if d else "—"]
        lines.append(f"| {r['variant']} | " + " | ".join(cells) + " |")
    return lines + [""]


def render_markdown(plan: dict, runs, tables: dict[str, list[dict]], figures: dict[str, str],
                    primary: list[dict] | None = None, controls: list[dict] | None = None) -> str:
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
        out += [f"| {r.variant} | {r.seed} | {', '.join(r.missing_stages)} | {r.sweep_status or '—'} |"
                for r in missing]
        out += ["", "Runs missing pretrain or evaluate are left out of every mean (their seeds are listed in each "
                "table); a missing audit removes only the audit metrics.", ""]
    pm = (plan.get("primary") or {}).get("metric")
    out += ["## Method", "", METHOD, ""]
    if primary is not None:
        out += ["## Primary contrasts", "", f"Primary metric: `{pm}`. {VERDICT_RULE}", "",
                "| contrast | expected | seeds | Δ | 95% CI | p (sign-flip) | Holm p | verdict |",
                "|---|---|---|---|---|---|---|---|"]
        for c in primary:
            dd = f"{c['mean']:+.4g}" if c.get("n") else "—"
            out.append(f"| {c['variant']} vs {c['baseline']} | {c['expect']} | {c['n']} | {dd} | {_ci(c)} | "
                       f"{_p(c['p'])} | {_p(c.get('p_holm'))} | **{c['verdict']}** |")
        out += [""]
        if pm in tables:
            out += [_table_md(pm, tables[pm], plan.get("baseline"), " (primary)")]
        for c in primary:
            out += [reading(c), ""]
    else:
        out += ["## Primary contrasts", "", "This sweep declares no primary metric (`primary:` in the sweep file): "
                "every table below is exploratory and no verdict is given.", ""]
    out += _controls_md(controls or [])
    out += ["## Exploratory metrics", "", "Every table in this section is exploratory: its p-values are "
            "not corrected for the many metrics read, and no verdict is drawn from it.", ""]
    for metric, rows in tables.items():
        if metric == pm and primary is not None:
            continue
        note = _mode_note(rows)
        out += [_table_md(metric, rows, plan.get("baseline"), " (exploratory)"),
                "Exploratory: uncorrected" + (f"; {note}" if note else "") + ".", ""]
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


__all__ = ["render_markdown", "render_html", "reading", "METHOD", "VERDICT_RULE"]
