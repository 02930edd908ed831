"""The files that contributed most to a stored normalize output's quarantine, for an error message.

In: a complete normalize output folder (``quarantine.parquet``: lang, source, line, reason, detail;
``stats.parquet``: per language records and quarantined) and the limit in force. Out: text lines naming the
worst files, as the first run's ``quarantine rate ... exceeds ...; worst files:`` error does. Used when a stored
output is re-checked against a changed ``normalize.max_quarantine_rate`` (no partition results then: the
counts come from the stored tables). Stdlib + pyarrow only.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq


def over_limit(out_dir: Path, limit: float) -> dict[str, tuple[int, int]]:
    """{lang: (quarantined, records)} for each language whose quarantine rate exceeds ``limit``."""
    rows = pq.read_table(Path(out_dir) / "stats.parquet", columns=["lang", "records", "quarantined"]).to_pylist()
    return {r["lang"]: (int(r["quarantined"]), int(r["records"])) for r in rows
            if r["quarantined"] / max(int(r["records"]), 1) > limit}


def worst_files_report(out_dir: Path, limit: float, n: int = 5) -> str:
    """``quarantine rate ... exceeds normalize.max_quarantine_rate=...`` per language over the limit, then the
    ``n`` files with the most quarantined records in them, with their top reasons; "" when none is over."""
    langs = over_limit(out_dir, limit)
    if not langs:
        return ""
    table = pq.read_table(Path(out_dir) / "quarantine.parquet", columns=["lang", "source", "reason"]).to_pylist()
    by_file: dict[tuple[str, str], Counter] = {}
    for r in table:
        if r["lang"] in langs:
            by_file.setdefault((r["source"], r["lang"]), Counter())[r["reason"]] += 1
    worst = sorted(by_file.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))[:n]
    head = "; ".join(f"{lang} {q}/{rec} ({q / max(rec, 1):.2%})" for lang, (q, rec) in sorted(langs.items()))
    lines = [f"  {src} ({lang}): {sum(c.values())} quarantined; reasons: {dict(c.most_common(3))}"
             for (src, lang), c in worst]
    return (f"quarantine rate exceeds normalize.max_quarantine_rate={limit:.2%} in {head}; worst files:\n"
            + "\n".join(lines) + f"\n(every quarantined record, with its reason: {Path(out_dir) / 'quarantine.parquet'})")


__all__ = ["over_limit", "worst_files_report"]
