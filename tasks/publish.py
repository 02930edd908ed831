"""What a stage shows the world: metrics, statistics tables, lineage and Prefect artifacts.

Per-stage facts come from the stage's manifest (written by ``mlm_core``); this module only
formats them. Each stage registers how its per-language table is built in ``TABLES``.
"""
from __future__ import annotations

import errno
from typing import Callable

from mlm_core.store import Artifact

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


def _normalize_rows(art: Artifact) -> list[dict]:
    rows = []
    for lang, s in sorted(art.manifest.get("languages", {}).items()):
        rows.append({"lang": lang, "records": s["records"], "docs": s["docs"], "chars": s["chars"],
                     "bytes": s["bytes"], "duplicates": s["duplicates"], "quarantined": s["quarantined"],
                     "quarantine_rate": round(s["quarantined"] / max(s["records"], 1), 5),
                     "blank_lines": s["blank_lines"]})
    return rows


TABLES: dict[str, Callable[[Artifact], list[dict]]] = {"normalize": _normalize_rows}


def table_rows(stage: str, art: Artifact) -> list[dict]:
    fn = TABLES.get(stage)
    return fn(art) if fn else []


def stat_tables(stage: str, art: Artifact) -> dict:
    rows = table_rows(stage, art)
    if not rows:
        return {}
    import pandas as pd
    return {"stats.json": pd.DataFrame(rows)}


def flat_metrics(manifest: dict) -> dict[str, float]:
    """Totals plus per-language figures as ``<lang>.<name>`` metrics."""
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


def lineage(stage: str, art: Artifact, lc) -> list[dict]:
    """The stage's inputs by fingerprint and source (upstream outputs, or raw sources for normalize)."""
    out = []
    for up, fp in art.manifest.get("upstream", {}).items():
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


def stage_markdown(stage: str, art: Artifact, hit: bool, seconds: float, report, url: str | None) -> str:
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
    counts = art.manifest.get("counts", {})
    if counts:
        lines.append("\n## Totals\n" + _table_md([counts]))
    rows = table_rows(stage, art)
    if rows:
        lines.append("\n## Per language\n" + _table_md(rows))
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
