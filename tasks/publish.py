"""What a stage shows the world: metrics, statistics tables, lineage and Prefect artifacts.

Per-stage facts come from the stage's manifest (written by ``mlm_core``); this module only
formats them. Which function builds a stage's table and plots is declared in its ``StageSpec`` (``table``,
``table_title``, ``plots``: "module:attribute" references), not in a table here.
"""
from __future__ import annotations

import errno

from mlm_core.artifacts import (Audit, Evaluation, NormalizedCorpus, PretrainedModel, Registration, ShardSet,
                                StageArtifact, TokenizerArtifact)

TRANSIENT_ERRNOS = {errno.EAGAIN, errno.EBUSY, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNREFUSED,
                    errno.EIO, errno.ESTALE}


def is_transient(state) -> bool:
    """Retry only transient I/O errors, never bad data or bad config."""
    try:
        state.result()
    except (TimeoutError, ConnectionError):
        return True
    except OSError as exc:
        return exc.errno in TRANSIENT_ERRNOS
    except Exception:
        return False
    return False


def normalize_rows(art: NormalizedCorpus) -> list[dict]:
    rows = []
    for lang, s in sorted((art.languages or {}).items()):
        rows.append({"lang": lang, "records": s["records"], "docs": s["docs"], "chars": s["chars"],
                     "bytes": s["bytes"], "duplicates": s["duplicates"], "quarantined": s["quarantined"],
                     "quarantine_rate": round(s["quarantined"] / max(s["records"], 1), 5),
                     "blank_lines": s["blank_lines"]})
    return rows


def tokenizer_rows(art: TokenizerArtifact) -> list[dict]:
    # the limits the output was last validated against (thresholds are not part of the stored output)
    tcfg = (art.manifest.get("thresholds") or {}).get("tokenizer") or {}
    per_lang = tcfg.get("max_fertility_per_lang") or {}
    return [{"lang": lang, "heldout_docs": s["heldout_docs"], "tokens_per_word": round(s["tokens_per_word"], 3),
             "tokens_per_char": round(s["tokens_per_char"], 3), "unk_rate": round(s["unk_rate"], 5),
             "no_spaces": s.get("no_spaces", False),
             "max_fertility": per_lang.get(lang, tcfg.get("max_fertility"))}
            for lang, s in sorted((art.languages or {}).items())]


def shards_rows(art: ShardSet) -> list[dict]:
    langs = art.languages or {}
    return [{"lang": r["lang"], "docs": langs[r["lang"]]["docs_train"] + langs[r["lang"]]["docs_validation"],
             "tokens_train": r["n"], "sequences_train": langs[r["lang"]]["rows_train"],
             "natural": round(r["natural"], 4), "p": round(r["p"], 4), "upsampling": round(r["upsampling"], 3)}
            for r in (art.sampling or {}).get("table", [])]


def pretrain_rows(art: PretrainedModel) -> list[dict]:
    """[MASK]-only top-1 vs the baseline first (what measures learning), then the all-target (80/10/10) figures."""
    from mlm_core.train.stage import beats_baseline
    def masked(r: dict) -> dict:
        if r.get("mask_acc") is None:       # an output written before [MASK]-only scoring
            return {}
        return {"mask_acc": round(r["mask_acc"], 4), "mask_baseline_acc": round(r["mask_baseline_acc"], 4),
                "mask_over_baseline_ci_low": round(r["mask_over_baseline_ci_low"], 4),
                "distinct_predictions": r.get("distinct_predictions")}
    return [{"lang": lang, **masked(r), "val_loss": round(r["loss"], 4), "val_acc": round(r["acc"], 4),
             "baseline_acc": round(r["baseline_acc"], 4), "beats_baseline": beats_baseline(r)}
            for lang, r in sorted((art.eval or {}).items())]


def evaluate_rows(art: Evaluation) -> list[dict]:
    rows = []
    for lang, r in sorted((art.languages or {}).items()):
        if r.get("missing"):
            rows.append({"lang": lang, "top1": "missing", "baseline_top1": "", "top5": "", "mrr": "", "ece": "",
                         "perplexity": "", "pseudo_perplexity": ""})
            continue
        rows.append({"lang": lang, **{k: None if r.get(k) is None else round(r[k], 4) for k in
                                      ("top1", "baseline_top1", "top5", "mrr", "ece", "perplexity", "pseudo_perplexity")}})
    return rows


def audit_rows(art: Audit) -> list[dict]:
    return [dict(r) for r in art.crows or []]


def _sig(v, digits: int = 4):
    """A measured value to ``digits`` significant digits (a tiny value such as 2e-06 stays visible)."""
    return v if not isinstance(v, float) else float(f"{v:.{digits}g}")


def register_rows(art: Registration) -> list[dict]:
    return [{"gate": g["name"], "threshold": _sig(g["threshold"]), "value": _sig(g["value"]),
             "pass": g["passed"], "detail": g["detail"]} for g in art.gates or []]


def shares_plot(art: ShardSet, dest) -> list:
    """Natural vs temperature-sampled language shares for several α (PNG under ``dest``)."""
    from pathlib import Path

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mlm_core.stats import ALPHAS, shares_by_alpha
    table = art.sampling["table"]
    counts = {r["lang"]: r["n"] for r in table}
    alpha = art.sampling["alpha"]
    alphas = sorted(set(ALPHAS) | {alpha}, reverse=True)
    shares = shares_by_alpha(counts, alphas)
    langs = sorted(counts, key=counts.get, reverse=True)
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(alphas)
    for k, a in enumerate(alphas):
        label = "natural (α=1.0)" if a == 1.0 else f"α={a}" + (" (configured)" if a == alpha else "")
        ax.bar([i + k * width for i in range(len(langs))], [shares[a][lang] for lang in langs], width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(langs))], langs)
    ax.set_ylabel("share of sampled sequences")
    ax.set_title("Language shares: natural vs temperature-sampled, p(l) ∝ n_l^α")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(dest) / "language_shares.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return [out]


def reliability_plot(art: StageArtifact, dest) -> list:
    """evaluate's reliability diagram (written by the stage)."""
    return [p for p in [art.path / "reliability.png"] if p.exists()]


def _declared(stage: str, what: str):
    """The function stage ``stage`` declares as ``what`` in its spec (``mlm_core.stages.StageSpec``), or None."""
    from mlm_core import stages
    spec = stages.STAGES.get(stage)
    ref = getattr(spec, what) if spec is not None else None
    return stages.resolve(ref) if ref else None


def table_title(stage: str) -> str:
    """The heading of a stage's table and its table artifact's description (``StageSpec.table_title``)."""
    from mlm_core import stages
    spec = stages.STAGES.get(stage)
    return spec.table_title if spec is not None else "Per-language statistics"


def plots(stage: str, art: StageArtifact, dest) -> list:
    """Figure files to log with a stage's run (``StageSpec.plots``; new ones are drawn under ``dest``)."""
    fn = _declared(stage, "plots")
    return fn(art, dest) if fn else []


def table_rows(stage: str, art: StageArtifact) -> list[dict]:
    """The stage's statistics table (``StageSpec.table``), as rows."""
    fn = _declared(stage, "table")
    return fn(art) if fn else []


def stat_tables(stage: str, art: StageArtifact) -> dict:
    rows = table_rows(stage, art)
    if not rows:
        return {}
    import pandas as pd
    return {"stats.json": pd.DataFrame(rows)}


def run_tags(stage: str, art: StageArtifact) -> dict[str, str]:
    """Stage-specific MLflow tags read from the manifest: pretrain's plateau detector (``plateau=true`` with the
    step and languages; ``mlm_core.train.plateau``)."""
    if stage == "pretrain":
        from mlm_core.train.plateau import run_tags as plateau_tags
        return plateau_tags(art.plateau)
    return {}


def flat_metrics(manifest: dict) -> dict[str, float]:
    """Totals plus per-language figures, keyed by their MLflow names (``tasks.metric_names``: the manifest's
    ``<lang>.<name>`` of stage S becomes e.g. ``eval/<lang>/<name>``). Live runs and ``mlm sync`` both log these."""
    from tasks.metric_names import mlflow_metrics
    return mlflow_metrics(str(manifest.get("stage") or ""), manifest_metrics(manifest))


def manifest_metrics(manifest: dict) -> dict[str, float]:
    """Totals plus per-language figures as stored in the manifest (``<lang>.<name>``)."""
    out: dict[str, float] = {}
    for k, v in manifest.get("counts", {}).items():
        if isinstance(v, (int, float)):
            out[k] = float(v)
    for lang, s in manifest.get("languages", {}).items():
        for k, v in s.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[f"{lang}.{k}"] = float(v)
    for k in ("quarantine_rate",):
        if isinstance(manifest.get(k), (int, float)):
            out[k] = float(manifest[k])
    for k, v in manifest.get("metrics", {}).items():
        if isinstance(v, (int, float)):
            out[k] = float(v)
    return out


def lineage(stage: str, art: StageArtifact, lc) -> list[dict]:
    """The stage's inputs by fingerprint and source (upstream outputs, or raw sources for normalize)."""
    out = []
    for up, fp in (art.upstream or {}).items():
        out.append({"name": f"{up}-{fp}", "source": str(lc.workdir / up / fp), "digest": fp, "context": "input"})
    if stage == "normalize":
        for lang, src in sorted(lc.config.sources.items()):
            if src.dataset is not None:
                source = f"datasets:{src.dataset.name}/{src.dataset.config or 'default'}/{src.dataset.split}"
            else:
                source = ";".join(str(lc.resolve(p)) for p in src.paths)
            out.append({"name": f"raw-{lang}", "source": source, "digest": art.fingerprint, "context": "input"})
    return out


def _table_md(rows: list[dict]) -> str:
    if not rows:
        return ""
    cols = list(rows[0])
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    return head + "".join("| " + " | ".join(str(r[c]) for c in cols) + " |\n" for r in rows)


def stage_markdown(stage: str, art: StageArtifact, hit: bool, seconds: float, report, url: str | None) -> str:
    lines = [f"# {stage}: {'cache hit' if hit else 'ran'}",
             f"- fingerprint: `{art.fingerprint}`",
             f"- output: `{art.path}` ({art.size_bytes() / 1e6:.2f} MB)",
             f"- time: {seconds:.1f} s"]
    if report is not None:
        lines.append(f"- validation: {'passed' if report.success else 'FAILED'}"
                     f" ({len(report.failed_warnings)} warning(s))")
    elif hit:
        lines.append("- validation: passed when this output was written")
    if url:
        lines.append(f"- MLflow run: [{url}]({url})")
    if "failed_gates" in art.manifest:   # register: the verdict before the table
        failed = art.manifest["failed_gates"]
        lines.append(f"- gates: {'all passed' if not failed else 'FAILED: ' + ', '.join(failed)}"
                     f" ({len(art.manifest.get('gates', []))} checked)")
    plateau = art.manifest.get("plateau") if stage == "pretrain" else None
    if plateau and plateau.get("fired"):     # the plateau detector (mlm_core.train.plateau): said loudly
        lines.append(f"- **PLATEAU**: {plateau['message']}")
    counts = art.manifest.get("counts", {})
    if counts:
        lines.append("\n## Totals\n" + _table_md([counts]))
    rows = table_rows(stage, art)
    if rows:
        lines.append(f"\n## {table_title(stage)}\n" + _table_md(rows))
    if report is not None and report.failed_warnings:
        lines.append("\n## Validation\n" + report.summary_markdown())
    return "\n".join(lines)


def stage_failed(stage: str, fp: str, report, url: str | None) -> None:
    from prefect.artifacts import create_markdown_artifact
    md = f"# {stage}: validation FAILED\n- fingerprint: `{fp}`\n"
    if url:
        md += f"- MLflow run: [{url}]({url})\n"
    md += "\n" + report.summary_markdown()
    create_markdown_artifact(key=f"{stage}-validation-failed", markdown=md, description=f"{stage}: validation failed")
