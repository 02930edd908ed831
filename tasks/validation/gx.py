"""Data contracts, run: validate a stage's output folder against its Great Expectations suite.

In:  a stage name, its output folder and its manifest (with ``manifest["config"]``).
Out: a ``ValidationReport`` (JSON-safe results, a Markdown summary); ``ValidationFailed`` when a
     critical expectation fails. Failed warnings are logged and reported, never raised.

How it works: the suite file (``suite``) is read as JSON and its expectations are grouped by table; the stage's
table provider and suite parameters (``providers``, filled by ``contracts``) give the DataFrames and the
``$PARAMETER`` values, passed to ``batch.validate``. One GE call per table; results are mapped back to suite
order, and each table's Data Docs page is rendered (made to show offline by ``data_docs``).

This is the only module of the project that imports great_expectations, and it does so lazily
(the import takes ~4-5 s), inside ``import_gx()``.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from tasks.validation.providers import parameter_provider, table_provider
from tasks.validation.report import ValidationFailed, ValidationReport, describe, offending, outcome
from tasks.validation.suite import SuiteError, parameter_names, read_suite_json

log = logging.getLogger(__name__)
logging.getLogger("great_expectations").setLevel(logging.WARNING)

N_OFFENDING = 5            # offending values kept per expectation in the report
_INDEX_KEY = "_suite_index"  # temporary meta key mapping GE results back to suite order

# ---------------------------------------------------------------------------------------------------------------
# Great Expectations state (lazy, cached per process)

_LOCK = threading.RLock()
_STATE: dict[str, Any] = {}


def import_gx():
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
    _, ds = import_gx()
    bds = _STATE["batch_defs"]
    if name not in bds:
        bds[name] = ds.add_dataframe_asset(name=name).add_batch_definition_whole_dataframe("all")
    return bds[name]


# ---------------------------------------------------------------------------------------------------------------
# Suites

def _build_suite(name: str, entries: list[dict], path: Path):
    """A gx.ExpectationSuite from raw entries, refusing anything GE would silently drop."""
    gx, _ = import_gx()
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
        raw = read_suite_json(path)
        return _build_suite(raw.get("name", path.stem), raw["expectations"], path), raw


# ---------------------------------------------------------------------------------------------------------------
# Validation

def validate_stage(stage: str, out_dir: Path, manifest: dict, *, sample_rows: int = 10_000, seed: int = 0,
                   schemas_dir: Path | None = None) -> ValidationReport:
    """Validate ``out_dir`` against the suite its ``StageSpec`` declares (``schemas/<suite>.suite.json``), on the
    tables and parameters it declares; raise ValidationFailed on a critical failure. A stage declaring no suite
    has no contract; a declared suite file that is missing is a SuiteError (``plan`` reports it first)."""
    from mlm_core import stages
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    spec = stages.STAGES.get(stage)
    if spec is None or spec.suite is None:
        log.info("validation: stage %r declares no data contract; skipped", stage)
        return ValidationReport(stage, "(none)", True, [], {}, round(time.perf_counter() - t0, 3))
    path = Path(schemas_dir) / f"{spec.suite}.suite.json" if schemas_dir else stages.suite_path(stage)
    tables_fn, params_fn = table_provider(stage), parameter_provider(stage)
    if tables_fn is None:
        raise SuiteError(f"stage {stage!r} declares the suite {path.name} but no contract_tables (StageSpec)")

    raw = read_suite_json(path)       # missing: SuiteError naming the file
    suite_name = raw.get("name", path.stem)
    params = params_fn(manifest) if params_fn else {}
    missing = parameter_names(raw["expectations"]) - set(params)
    if missing:
        raise SuiteError(f"{path}: suite parameter(s) {', '.join(sorted(missing))} are not provided "
                         f"for stage {stage!r} (StageSpec.contract_parameters)")
    tables = tables_fn(out_dir, {"manifest": manifest, "sample_rows": sample_rows, "seed": seed})
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
                    stage, r["table"], describe(r), outcome(r), offending(r) or "-")
    if not report.success:
        raise ValidationFailed(report, out_dir)
    log.info("validation: %s passed %s (%d expectations, %d warning(s), %.2f s)", stage, path.name,
             len(results), len(report.failed_warnings), report.duration_s)
    return report


def _data_docs_page(res) -> str:
    """GE's Data Docs page for one validation result, rendered without a file-backed context, made to show
    without internet access (``tasks.validation.data_docs.offline``)."""
    try:
        from great_expectations.render.renderer import ValidationResultsPageRenderer
        from great_expectations.render.view import DefaultJinjaPageView
        from tasks.validation.data_docs import offline, plain
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


