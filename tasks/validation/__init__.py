"""Data contracts: validate a stage's output folder against its Great Expectations suite.

The package, leaves first: ``providers`` (a stage's tables and suite parameters, as its ``StageSpec`` declares
them), ``contracts`` (the existing stages' tables and suite parameters), ``suite`` (a suite file read and checked as
JSON), ``report`` (``ValidationReport``, ``ValidationFailed``), ``data_docs`` (Data Docs pages made to show
offline) and ``gx``, the only module of the project that imports great_expectations (lazily: importing this
package costs nothing).
"""
from __future__ import annotations

from tasks.validation.gx import import_gx, load_suite, validate_stage
from tasks.validation.providers import parameter_provider, table_provider
from tasks.validation.report import ValidationFailed, ValidationReport
from tasks.validation.suite import SCHEMAS_DIR, SEVERITIES, SuiteError

__all__ = ["SCHEMAS_DIR", "SEVERITIES", "SuiteError", "ValidationFailed", "ValidationReport", "import_gx",
           "load_suite", "parameter_provider", "table_provider", "validate_stage"]
