"""Who provides a stage's tables and suite parameters: the registries ``contracts`` fills.

A *table provider* (``TABLES[stage]``, registered with ``@register_tables``) turns a stage's output folder into
small pandas DataFrames: full statistics tables plus a bounded DuckDB reservoir sample of the big tables, so
Great Expectations' cost does not grow with the corpus. Config-dependent thresholds are suite parameters
(``{"$PARAMETER": "max_chars"}``) whose values come from ``PARAMETERS[stage]`` (``@register_parameters``).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import pandas as pd

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
