"""tasks.validation: the normalize data contract, on tiny fake normalize output folders (no pipeline run)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

from tasks import validation as v  # noqa: E402  (cheap: great_expectations is imported lazily)

DOC_SCHEMA = pa.schema([("doc_id", pa.int64()), ("lang", pa.string()), ("text", pa.string()),
                        ("n_chars", pa.int32()), ("hash", pa.string())])
TEXTS = {
    "en": ["The quick brown fox jumps over the lazy dog.", "A second English document, long enough."],
    "fr": ["Le cœur a ses raisons que la raison ignore.", "Où est la bibliothèque, s'il vous plaît ?"],
    "hi": ["यह एक छोटा सा हिंदी दस्तावेज़ है, बस इतना ही।", "दूसरा दस्तावेज़ थोड़ा अलग है और लंबा भी।"],
}


def manifest(languages=("en", "fr", "hi"), min_chars=5, max_chars=1000, max_quarantine_rate=0.05) -> dict:
    return {"config": {"normalize": {"min_chars": min_chars, "max_chars": max_chars,
                                     "max_quarantine_rate": max_quarantine_rate}},
            "languages": {lang: {} for lang in languages}, "counts": {}, "quarantine_rate": 0.0}


def make_out(root: Path, texts: dict[str, list[str]] = TEXTS, stats: dict[str, dict] | None = None,
             hashes: dict[str, list[str]] | None = None) -> Path:
    """A normalize output folder: docs/<lang>.parquet, stats.parquet, quarantine_stats.parquet."""
    (root / "docs").mkdir(parents=True)
    rows = []
    for p, (lang, docs) in enumerate(texts.items()):
        hs = (hashes or {}).get(lang) or [hashlib.md5(t.encode()).hexdigest() for t in docs]
        pq.write_table(pa.table({"doc_id": [(p << 32) | i for i in range(len(docs))], "lang": [lang] * len(docs),
                                 "text": docs, "n_chars": [len(t) for t in docs], "hash": hs}, schema=DOC_SCHEMA),
                       root / "docs" / f"{lang}.parquet")
        row = {"lang": lang, "records": len(docs) + 1, "docs": len(docs), "chars": sum(map(len, docs)),
               "bytes": sum(len(t.encode()) for t in docs), "duplicates": 0, "quarantined": 0, "blank_lines": 0}
        row.update((stats or {}).get(lang, {}))
        rows.append(row)
    pq.write_table(pa.Table.from_pylist(rows), root / "stats.parquet")
    pq.write_table(pa.table({"lang": ["en"], "reason": ["too_short"], "n": [1]},
                            schema=pa.schema([("lang", pa.string()), ("reason", pa.string()), ("n", pa.int64())])),
                   root / "quarantine_stats.parquet")
    return root


@pytest.fixture(scope="module", autouse=True)
def gx_loaded():
    v.import_gx()  # the ~5 s Great Expectations import, once for the module


def test_valid_folder_passes(tmp_path):
    report = v.validate_stage("normalize", make_out(tmp_path), manifest())
    assert report.success and not report.failed_critical and not report.failed_warnings
    assert report.n_rows_sampled == {"stats": 3, "quarantine_stats": 1, "docs_sample": 6}
    assert {r["table"] for r in report.results} == {"stats", "quarantine_stats", "docs_sample"}
    json.dumps(report.to_json())  # JSON-safe as it is
    md = report.summary_markdown()
    assert "| severity | table | expectation |" in md and "passed" in md
    # suite parameters were filled from the manifest
    n_chars = next(r for r in report.results if r["kwargs"].get("column") == "n_chars"
                   and r["type"] == "expect_column_values_to_be_between")
    assert (n_chars["kwargs"]["min_value"], n_chars["kwargs"]["max_value"]) == (5, 1000)


def test_unknown_expectation_type_is_a_suite_error(tmp_path):
    raw = json.loads((v.SCHEMAS_DIR / "normalize.suite.json").read_text())
    raw["expectations"].append({"type": "expect_column_values_to_be_awesome", "kwargs": {"column": "text"},
                                "meta": {"table": "docs_sample"}, "severity": "critical"})
    path = tmp_path / "schemas" / "normalize.suite.json"
    path.parent.mkdir()
    path.write_text(json.dumps(raw))
    with pytest.raises(v.SuiteError, match="expect_column_values_to_be_awesome") as exc:
        v.load_suite(path)
    assert str(path) in str(exc.value)
    with pytest.raises(v.SuiteError, match="expect_column_values_to_be_awesome"):
        v.validate_stage("normalize", make_out(tmp_path / "out"), manifest(), schemas_dir=path.parent)


def test_shipped_suite_loads_completely():
    suite, raw = v.load_suite(v.SCHEMAS_DIR / "normalize.suite.json")
    assert len(suite.expectations) == len(raw["expectations"]) > 10


def test_every_stage_has_a_suite_that_loads_completely():
    """Every shipped stage declares a suite (StageSpec.suite) whose file exists and loads in full, and the table
    and parameter providers it declares resolve."""
    from mlm_core.stages import STAGES, check_declared, suite_path
    for stage, spec in STAGES.items():
        assert spec.suite is not None, f"{stage} declares no data contract"
        check_declared(spec)
        suite, raw = v.load_suite(suite_path(stage))
        assert len(suite.expectations) == len(raw["expectations"]) >= 3, stage
        assert callable(v.table_provider(stage)), f"no table provider for {stage}"
        assert {e["meta"]["table"] for e in raw["expectations"]}, stage
        params = {p for e in raw["expectations"] for p in _parameters(e)}
        assert not params or callable(v.parameter_provider(stage)), f"{stage}: suite parameters {params}, no provider"


def _parameters(obj) -> set:
    if isinstance(obj, dict):
        return {obj["$PARAMETER"]} if set(obj) == {"$PARAMETER"} else set().union(*map(_parameters, obj.values()))
    return set().union(*map(_parameters, obj)) if isinstance(obj, list) else set()


def test_a_declared_suite_file_that_is_missing_fails_at_plan_time(tmp_path):
    """Not a warning at run time: planning names the stage and the missing file."""
    import dataclasses

    from mlm_core import stages
    from mlm_core.config.io import load_config
    from mlm_core.errors import PlanError
    (tmp_path / "en.txt").write_text("A sentence long enough to keep.\n", encoding="utf-8")
    lc = load_config(raw={"workdir": str(tmp_path / "w"), "sources": {"en": {"paths": [str(tmp_path / "en.txt")]}}})
    spec = dataclasses.replace(stages.STAGES["audit"], suite="no_such_suite")
    with pytest.raises(PlanError, match=r"'audit'.*no_such_suite\.suite\.json"):
        stages.check_declared(spec)
    mp = pytest.MonkeyPatch()
    try:
        mp.setitem(stages.STAGES, "audit", spec)
        with pytest.raises(PlanError, match="no_such_suite"):
            stages.plan(lc)
    finally:
        mp.undo()


def test_missing_suite_parameter_is_a_suite_error(tmp_path):
    raw = json.loads((v.SCHEMAS_DIR / "normalize.suite.json").read_text())
    raw["expectations"][0]["kwargs"] = {"column_set": {"$PARAMETER": "no_such_parameter"}}
    (tmp_path / "normalize.suite.json").write_text(json.dumps(raw))
    with pytest.raises(v.SuiteError, match="no_such_parameter"):
        v.validate_stage("normalize", make_out(tmp_path / "out"), manifest(), schemas_dir=tmp_path)


@pytest.mark.parametrize("case, expectation, offending", [
    ("zero_docs", "expect_column_values_to_be_between(column='docs'", "lang='fr': 0"),
    ("control_char", "has_control", "doc_id=0: true"),
    ("too_short", "expect_column_values_to_be_between(column='n_chars'", "doc_id=4294967297: 2"),
    ("undeclared_lang", "expect_column_values_to_be_in_set(column='lang'", "'hi'"),
])
def test_violations_raise(tmp_path, case, expectation, offending):
    texts, stats, m = {k: list(t) for k, t in TEXTS.items()}, None, manifest()
    if case == "zero_docs":
        stats = {"fr": {"docs": 0}}
    elif case == "control_char":
        texts["en"][0] = "Bell \x07 inside a cleaned document, which cleaning forbids."
    elif case == "too_short":
        texts["fr"][1] = "ok"
    elif case == "undeclared_lang":
        m = manifest(languages=("en", "fr"))
    with pytest.raises(v.ValidationFailed) as exc:
        v.validate_stage("normalize", make_out(tmp_path, texts, stats), m)
    msg = str(exc.value)
    line = next(ln for ln in msg.splitlines() if expectation in ln)
    assert "offending: " in line and offending in line.split("offending: ")[1], msg
    report = exc.value.report
    assert not report.success and report.failed_critical
    assert all(r["severity"] == "critical" for r in report.failed_critical)
    assert "FAILED" in report.summary_markdown()
    json.dumps(report.to_json())


def test_duplicate_hashes_only_warn(tmp_path, caplog):
    same = hashlib.md5(b"x").hexdigest()
    out = make_out(tmp_path, hashes={"en": [same, same]})
    report = v.validate_stage("normalize", out, manifest())
    assert report.success
    assert [(r["type"], r["kwargs"]["column"]) for r in report.failed_warnings] == \
        [("expect_column_values_to_be_unique", "hash")]
    assert report.failed_warnings[0]["partial_unexpected_list"] == [same, same]
    assert "validation warning" in caplog.text


def test_sample_is_bounded_and_repeatable(tmp_path):
    n = 10_000
    texts = {"en": [f"English document number {i}, padded to be long enough." for i in range(n)]}
    out = make_out(tmp_path, texts)
    report = v.validate_stage("normalize", out, manifest(languages=("en",)), sample_rows=100)
    assert report.success
    assert report.n_rows_sampled["docs_sample"] == 100
    opts = {"manifest": manifest(languages=("en",)), "sample_rows": 100, "seed": 7}
    a = v.table_provider("normalize")(out, opts)["docs_sample"]["doc_id"].tolist()
    b = v.table_provider("normalize")(out, opts)["docs_sample"]["doc_id"].tolist()
    assert a == b and len(set(a)) == 100
