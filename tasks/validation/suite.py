"""A suite file, read and checked as plain JSON: ``schemas/<stage>.suite.json``.

A GE 1.x suite (``{"name", "expectations": [{"type", "kwargs", "meta": {"table": ...}, "severity"}]}``).
``severity`` is GE's own field (critical / warning / info); ``meta.table`` names the table the expectation runs
on. Building the Great Expectations objects from it is ``tasks.validation.gx``'s (GE is not imported here).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlm_core.errors import MlmError

SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "schemas"
SEVERITIES = ("critical", "warning", "info")


class SuiteError(MlmError, ValueError):
    """A suite file that cannot be trusted: bad JSON, unknown expectation type, bad kwargs, unknown table."""


def read_suite_json(path: Path) -> dict:
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


def parameter_names(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        if set(obj) == {"$PARAMETER"}:
            return {obj["$PARAMETER"]}
        return set().union(*(parameter_names(v) for v in obj.values())) if obj else set()
    if isinstance(obj, list):
        return set().union(*(parameter_names(v) for v in obj)) if obj else set()
    return set()
