"""What a validation says: the ``ValidationReport`` (JSON-safe results in suite order, a Markdown summary) and
``ValidationFailed`` (a critical expectation failed), with the one-line descriptions both use.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlm_core.errors import MlmError


@dataclass(frozen=True)
class ValidationReport:
    stage: str
    suite: str
    success: bool                  # no critical expectation failed
    results: list[dict]            # one per expectation, in suite order (see _result_row)
    n_rows_sampled: dict[str, int]  # rows validated per table
    duration_s: float
    # Great Expectations Data Docs: one HTML page per table (file name -> HTML), rendered by GE's own
    # ValidationResultsPageRenderer; not part of result.json
    data_docs: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def failed_critical(self) -> list[dict]:
        return [r for r in self.results if not r["success"] and r["severity"] == "critical"]

    @property
    def failed_warnings(self) -> list[dict]:
        return [r for r in self.results if not r["success"] and r["severity"] == "warning"]

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("data_docs", None)
        d["n_failed_critical"] = len(self.failed_critical)
        d["n_failed_warnings"] = len(self.failed_warnings)
        return d

    def summary_markdown(self) -> str:
        status = "passed" if self.success else "FAILED"
        rows = ", ".join(f"{t}: {n:,}" for t, n in self.n_rows_sampled.items())
        lines = [f"**{self.stage}** validation against `{self.suite}`: **{status}** "
                 f"({len(self.failed_critical)} critical, {len(self.failed_warnings)} warning failure(s); "
                 f"{len(self.results)} expectations; rows validated: {rows or 'none'}; {self.duration_s:.2f} s)", "",
                 "| severity | table | expectation | column | result | offending values |",
                 "|---|---|---|---|---|---|"]
        order = {"critical": 0, "warning": 1, "info": 2}
        for r in sorted(self.results, key=lambda r: (r["success"], order.get(r["severity"], 3))):
            col = r["kwargs"].get("column") or r["kwargs"].get("column_list") or ""
            lines.append("| " + " | ".join(_md(x) for x in (
                r["severity"], r["table"], r["type"], col, outcome(r), offending(r))) + " |")
        return "\n".join(lines) + "\n"


class ValidationFailed(MlmError):
    """A critical expectation failed; ``.report`` holds the full ValidationReport."""

    def __init__(self, report: ValidationReport, out_dir: Path | None = None, detail: str = ""):
        self.report = report
        self.out_dir = out_dir
        self.detail = detail     # what the stage itself can say about it (the normalize re-check: worst files)
        where = f" ({out_dir})" if out_dir else ""
        lines = [f"{report.stage} output{where} violates its data contract {report.suite}: "
                 f"{len(report.failed_critical)} critical expectation(s) failed"]
        for r in report.failed_critical:
            lines.append(f"  - [{r['table']}] {describe(r)}: {outcome(r)}; offending: {offending(r) or '-'}")
        if report.failed_warnings:
            lines.append(f"  (and {len(report.failed_warnings)} warning(s): "
                         + ", ".join(f"[{r['table']}] {r['type']}" for r in report.failed_warnings) + ")")
        super().__init__("\n".join(([detail] if detail else []) + lines))

    def __reduce__(self):  # picklable across Prefect / process boundaries
        return (type(self), (self.report, self.out_dir, self.detail))


def describe(r: dict) -> str:
    args = ", ".join(f"{k}={_short(v)}" for k, v in r["kwargs"].items())
    return f"{r['type']}({args})"


def outcome(r: dict) -> str:
    if r["success"]:
        return "ok"
    if r.get("exception"):
        return f"error: {r['exception']}"
    if r.get("unexpected_count") is not None:
        of = f" of {r['element_count']:,}" if r.get("element_count") is not None else ""
        return f"{r['unexpected_count']:,}{of} rows unexpected"
    return f"observed {_short(r.get('observed_value'))}"


def offending(r: dict) -> str:
    if r["success"]:
        return ""
    col = r["kwargs"].get("column")
    if r.get("partial_unexpected_rows") and col:
        return ", ".join(" ".join(f"{k}={_short(v, 24)}" for k, v in row.items() if k != col)
                         + f": {_short(row.get(col), 40)}" for row in r["partial_unexpected_rows"])
    if r.get("partial_unexpected_list"):
        return ", ".join(_short(v, 40) for v in r["partial_unexpected_list"])
    if (r.get("details") or {}).get("mismatched"):
        return _short(r["details"]["mismatched"], 120)
    return ""


def _short(v: Any, n: int = 80) -> str:
    s = repr(v) if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
    return s if len(s) <= n else s[: n - 1] + "…"


def _md(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")
