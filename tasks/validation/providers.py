"""Who provides a stage's tables and suite parameters: what its ``StageSpec`` declares (``mlm_core.stages``).

A *table provider* (``StageSpec.contract_tables``) turns a stage's output folder into small pandas DataFrames:
full statistics tables plus a bounded DuckDB reservoir sample of the big tables, so Great Expectations' cost does
not grow with the corpus. Config-dependent thresholds are suite parameters (``{"$PARAMETER": "max_chars"}``) whose
values come from ``StageSpec.contract_parameters``. The existing stages' providers are in ``contracts``.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import pandas as pd

# A provider gets (out_dir, options) with options = {"manifest", "sample_rows", "seed"}
# and returns {table name: DataFrame}.
TableProvider = Callable[[Path, dict], "dict[str, pd.DataFrame]"]


def _declared(stage: str, what: str):
    from mlm_core import stages
    spec = stages.STAGES.get(stage)
    ref = getattr(spec, what) if spec is not None else None
    return stages.resolve(ref) if ref else None


def table_provider(stage: str) -> TableProvider | None:
    """``fn(out_dir, options) -> {table: DataFrame}`` declared by ``stage`` (None: it declares none)."""
    return _declared(stage, "contract_tables")


def parameter_provider(stage: str) -> Callable[[dict], dict] | None:
    """``fn(manifest) -> {name: value}`` filling the suite's ``$PARAMETER`` placeholders (None: no parameters)."""
    return _declared(stage, "contract_parameters")
