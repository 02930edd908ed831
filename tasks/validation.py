"""Data contracts: validate a stage's output folder against its Great Expectations suite.

In:  a stage name, its output folder and its manifest (with ``manifest["config"]``).
Out: a ``ValidationReport`` (JSON-safe results, a Markdown summary); ``ValidationFailed`` when a
     critical expectation fails. Failed warnings are logged and reported, never raised.

How it works:
- ``schemas/<stage>.suite.json`` is a GE 1.x suite (``{"name", "expectations": [{"type", "kwargs",
  "meta": {"table": ...}, "severity"}]}``). ``severity`` is GE's own field (critical / warning / info);
  ``meta.table`` names the table the expectation runs on.
- A *table provider* (``TABLES[stage]``, registered with ``@register_tables``) turns the output folder
  into small pandas DataFrames: full statistics tables plus a bounded DuckDB reservoir sample of the
  big tables, so GE's cost does not grow with the corpus.
- Config-dependent thresholds are GE suite parameters (``{"$PARAMETER": "max_chars"}``) whose values
  come from ``PARAMETERS[stage]`` (``@register_parameters``), passed to ``batch.validate``.
- One GE call per table; results are mapped back to suite order.

This is the only module of the project that imports great_expectations, and it does so lazily
(the import takes ~4-5 s), inside ``_gx()``.
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from mlm_core.errors import MlmError

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)
logging.getLogger("great_expectations").setLevel(logging.WARNING)

SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "schemas"
SEVERITIES = ("critical", "warning", "info")
N_OFFENDING = 5            # offending values kept per expectation in the report
_INDEX_KEY = "_suite_index"  # temporary meta key mapping GE results back to suite order

# A provider gets (out_dir, options) with options = {"manifest", "sample_rows", "seed"}
# and returns {table name: DataFrame}.
TableProvider = Callable[[Path, dict], "dict[str, pd.DataFrame]"]
TABLES: dict[str, TableProvider] = {}
PARAMETERS: dict[str, Callable[[dict], dict]] = {}


def register_tables(stage: str) -> Callable[[TableProvider], TableProvider]:
    """Decorator: ``fn(out_dir, options) -> {table: DataFrame}`` provides the tables of ``stage``."""
    def deco(fn: TableProvider) -> TableProvider:
        TABLES[stage] = fn
        return fn
    return deco


def register_parameters(stage: str) -> Callable:
    """Decorator: ``fn(manifest) -> {name: value}`` fills the suite's ``$PARAMETER`` placeholders."""
    def deco(fn: Callable[[dict], dict]) -> Callable[[dict], dict]:
        PARAMETERS[stage] = fn
        return fn
    return deco


class SuiteError(MlmError, ValueError):
    """A suite file that cannot be trusted: bad JSON, unknown expectation type, bad kwargs, unknown table."""


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
                r["severity"], r["table"], r["type"], col, _outcome(r), _offending(r))) + " |")
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
            lines.append(f"  - [{r['table']}] {_describe(r)}: {_outcome(r)}; offending: {_offending(r) or '-'}")
        if report.failed_warnings:
            lines.append(f"  (and {len(report.failed_warnings)} warning(s): "
                         + ", ".join(f"[{r['table']}] {r['type']}" for r in report.failed_warnings) + ")")
        super().__init__("\n".join(([detail] if detail else []) + lines))

    def __reduce__(self):  # picklable across Prefect / process boundaries
        return (type(self), (self.report, self.out_dir, self.detail))


# ---------------------------------------------------------------------------------------------------------------
# Great Expectations state (lazy, cached per process)

_LOCK = threading.RLock()
_STATE: dict[str, Any] = {}


def _gx():
    """(gx module, pandas datasource); imports GE and builds one ephemeral context per process."""
    with _LOCK:
        if not _STATE:
            os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
            import great_expectations as gx
            for name in [n for n in logging.root.manager.loggerDict if n.startswith("great_expectations")]:
                logging.getLogger(name).setLevel(logging.WARNING)
            from great_expectations.data_context.types.base import ProgressBarsConfig

            ctx = gx.get_context(mode="ephemeral")   # logs its temporary docs folder at INFO: keep it quiet
            for name in [n for n in logging.root.manager.loggerDict if n.startswith("great_expectations")]:
                logging.getLogger(name).setLevel(logging.WARNING)
            ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
            _STATE.update(gx=gx, ctx=ctx, ds=ctx.data_sources.add_pandas(name="mlm"), batch_defs={})
        return _STATE["gx"], _STATE["ds"]


def _batch_definition(name: str):
    _, ds = _gx()
    bds = _STATE["batch_defs"]
    if name not in bds:
        bds[name] = ds.add_dataframe_asset(name=name).add_batch_definition_whole_dataframe("all")
    return bds[name]


# ---------------------------------------------------------------------------------------------------------------
# Suites

def _read_suite_json(path: Path) -> dict:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SuiteError(f"suite file not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise SuiteError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("expectations"), list):
        raise SuiteError(f"{path}: expected an object with an 'expectations' list")
    for i, e in enumerate(raw["expectations"]):
        if not isinstance(e, dict) or not isinstance(e.get("type"), str):
            raise SuiteError(f"{path}: expectation #{i} has no 'type'")
        if not isinstance((e.get("meta") or {}).get("table"), str):
            raise SuiteError(f"{path}: expectation #{i} ({e['type']}) has no meta.table")
        if e.get("severity", "critical") not in SEVERITIES:
            raise SuiteError(f"{path}: expectation #{i} ({e['type']}): severity {e.get('severity')!r} "
                             f"is not one of {SEVERITIES}")
    return raw


def _build_suite(name: str, entries: list[dict], path: Path):
    """A gx.ExpectationSuite from raw entries, refusing anything GE would silently drop."""
    gx, _ = _gx()
    from great_expectations.expectations.registry import _registered_expectations

    unknown = sorted({e["type"] for e in entries} - set(_registered_expectations))
    if unknown:
        raise SuiteError(f"{path}: unknown expectation type(s) {', '.join(unknown)} "
                         f"(Great Expectations {gx.__version__} would silently drop them)")
    exps = []
    for i, e in enumerate(entries):
        cls = _registered_expectations[e["type"]]
        try:
            exps.append(cls(**e.get("kwargs", {}), meta=e.get("meta"), severity=e.get("severity", "critical")))
        except Exception as exc:  # pydantic ValidationError / InvalidExpectationConfigurationError
            raise SuiteError(f"{path}: expectation #{i} ({e['type']}) is invalid: {exc}") from None
    suite = gx.ExpectationSuite(name=name, expectations=exps)
    # GE logs and DROPS expectations it cannot build; never trust a suite that shrank.
    if len(suite.expectations) != len(entries):
        raise SuiteError(f"{path}: {len(entries)} expectations declared but Great Expectations kept "
                         f"{len(suite.expectations)}")
    return suite


def load_suite(path: Path) -> tuple[object, dict]:
    """(gx.ExpectationSuite, raw JSON) from a suite file; SuiteError if anything would be dropped."""
    path = Path(path)
    with _LOCK:
        raw = _read_suite_json(path)
        return _build_suite(raw.get("name", path.stem), raw["expectations"], path), raw


def _parameter_names(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        if set(obj) == {"$PARAMETER"}:
            return {obj["$PARAMETER"]}
        return set().union(*(_parameter_names(v) for v in obj.values())) if obj else set()
    if isinstance(obj, list):
        return set().union(*(_parameter_names(v) for v in obj)) if obj else set()
    return set()


# ---------------------------------------------------------------------------------------------------------------
# Validation

def validate_stage(stage: str, out_dir: Path, manifest: dict, *, sample_rows: int = 10_000, seed: int = 0,
                   schemas_dir: Path | None = None) -> ValidationReport:
    """Validate ``out_dir`` against ``schemas/<stage>.suite.json``; raise ValidationFailed on a critical failure."""
    import tasks.contracts  # noqa: F401  (registers every stage's tables and parameters)
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    path = Path(schemas_dir or SCHEMAS_DIR) / f"{stage}.suite.json"
    if stage not in TABLES:
        if path.exists():
            raise SuiteError(f"{path} exists but no table provider is registered for stage {stage!r} "
                             f"(add one with @register_tables({stage!r}) in {__name__})")
        log.warning("validation: stage %r has no data contract (no %s); skipped", stage, path.name)
        return ValidationReport(stage, "(none)", True, [], {}, round(time.perf_counter() - t0, 3))

    raw = _read_suite_json(path)
    suite_name = raw.get("name", path.stem)
    params = PARAMETERS[stage](manifest) if stage in PARAMETERS else {}
    missing = _parameter_names(raw["expectations"]) - set(params)
    if missing:
        raise SuiteError(f"{path}: suite parameter(s) {', '.join(sorted(missing))} are not provided "
                         f"for stage {stage!r} (see @register_parameters in {__name__})")
    tables = TABLES[stage](out_dir, {"manifest": manifest, "sample_rows": sample_rows, "seed": seed})
    by_table: dict[str, list[dict]] = {}
    for i, e in enumerate(raw["expectations"]):
        by_table.setdefault(e["meta"]["table"], []).append(
            {**e, "meta": {**e["meta"], _INDEX_KEY: i}})
    unknown = sorted(set(by_table) - set(tables))
    if unknown:
        raise SuiteError(f"{path}: table(s) {', '.join(unknown)} not provided for stage {stage!r} "
                         f"(available: {', '.join(sorted(tables))})")

    rows: dict[int, dict] = {}
    docs: dict[str, str] = {}
    with _LOCK:
        for table, entries in by_table.items():
            suite = _build_suite(f"{suite_name}.{table}", entries, path)
            df = tables[table]
            # meta.index_columns names columns that identify a row (doc_id, lang): GE then reports them with
            # each offending value, so a failure says *which* document, not just "True".
            ids = [c for c in raw.get("meta", {}).get("index_columns", {}).get(table, []) if c in df.columns]
            fmt = {"result_format": "SUMMARY", "unexpected_index_column_names": ids} if ids else "SUMMARY"
            batch = _batch_definition(f"{stage}.{table}").get_batch(batch_parameters={"dataframe": df})
            res = batch.validate(suite, result_format=fmt, expectation_parameters=params)
            for r in res.results:
                idx = r.expectation_config.meta[_INDEX_KEY]
                rows[idx] = _result_row(r, table)
            docs[f"{table}.html"] = _data_docs_page(res)

    results = [rows[i] for i in sorted(rows)]
    report = ValidationReport(
        stage=stage, suite=path.name,
        success=not any(not r["success"] and r["severity"] == "critical" for r in results),
        results=results, n_rows_sampled={t: int(len(df)) for t, df in tables.items()},
        duration_s=round(time.perf_counter() - t0, 3), data_docs=docs)
    for r in report.failed_warnings:
        log.warning("validation warning: %s [%s] %s: %s; offending: %s",
                    stage, r["table"], _describe(r), _outcome(r), _offending(r) or "-")
    if not report.success:
        raise ValidationFailed(report, out_dir)
    log.info("validation: %s passed %s (%d expectations, %d warning(s), %.2f s)", stage, path.name,
             len(results), len(report.failed_warnings), report.duration_s)
    return report


def _data_docs_page(res) -> str:
    """GE's Data Docs page for one validation result, rendered without a file-backed context, made to show
    without internet access (``tasks.validation_html.offline``)."""
    try:
        from great_expectations.render.renderer import ValidationResultsPageRenderer
        from great_expectations.render.view import DefaultJinjaPageView
        from tasks.validation_html import offline, plain
        for r in res.results:   # GE's num_to_str parses repr(): numpy 2's "np.float64(0.5)" breaks it
            r.result = plain(r.result)
        return offline(DefaultJinjaPageView().render(ValidationResultsPageRenderer().render(res)))
    except Exception as exc:  # noqa: BLE001 (a rendering bug must not fail a stage; result.json has it all)
        log.warning("validation: Data Docs page not rendered (%s)", exc)
        return f"<html><body><p>Data Docs rendering failed: {type(exc).__name__}</p></body></html>"


def _result_row(r, table: str) -> dict:
    cfg = r.expectation_config
    kwargs = {k: v for k, v in cfg.kwargs.items() if k != "batch_id"}
    res = r.result or {}
    exc = r.exception_info or {}
    # exception_info is either {raised_exception, exception_message, ...} or {metric id: that dict}.
    infos = [exc] if "raised_exception" in exc else list(exc.values())
    messages = [i.get("exception_message") for i in infos if isinstance(i, dict) and i.get("raised_exception")]
    sev = cfg.severity
    return _json_safe({
        "type": cfg.type, "kwargs": kwargs, "table": table,
        "severity": getattr(sev, "value", sev) or "critical",
        "success": bool(r.success),
        "unexpected_count": res.get("unexpected_count"),
        "element_count": res.get("element_count"),
        "partial_unexpected_list": list(res.get("partial_unexpected_list") or [])[:N_OFFENDING],
        # with meta.index_columns: [{<column>: value, <index column>: id, ...}]
        "partial_unexpected_rows": [r for r in (res.get("partial_unexpected_index_list") or [])
                                    if isinstance(r, dict)][:N_OFFENDING],
        "observed_value": res.get("observed_value"),
        "details": res.get("details"),
        "exception": "; ".join(m for m in messages if m) or None,
    })


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):  # numpy scalars
        try:
            obj = obj.item()
        except Exception:
            return str(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    try:
        import pandas as pd
        if pd.isna(obj):
            return None
    except (TypeError, ValueError, ImportError):
        pass
    return str(obj)


def _describe(r: dict) -> str:
    args = ", ".join(f"{k}={_short(v)}" for k, v in r["kwargs"].items())
    return f"{r['type']}({args})"


def _outcome(r: dict) -> str:
    if r["success"]:
        return "ok"
    if r.get("exception"):
        return f"error: {r['exception']}"
    if r.get("unexpected_count") is not None:
        of = f" of {r['element_count']:,}" if r.get("element_count") is not None else ""
        return f"{r['unexpected_count']:,}{of} rows unexpected"
    return f"observed {_short(r.get('observed_value'))}"


def _offending(r: dict) -> str:
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
