"""Data contracts: validate a stage's output folder against its Great Expectations suite.

The package, leaves first: ``providers`` (the stage -> tables and suite-parameter registries), ``contracts``
(each stage's tables and suite parameters, registered there), ``suite`` (a suite file read and checked as
JSON), ``report`` (``ValidationReport``, ``ValidationFailed``), ``data_docs`` (Data Docs pages made to show
offline) and ``gx``, the only module of the project that imports great_expectations (lazily: importing this
package costs nothing).
"""
from __future__ import annotations

from tasks.validation.gx import import_gx, load_suite, validate_stage
from tasks.validation.providers import PARAMETERS, TABLES, register_parameters, register_tables
from tasks.validation.report import ValidationFailed, ValidationReport
from tasks.validation.suite import SCHEMAS_DIR, SEVERITIES, SuiteError

__all__ = ["PARAMETERS", "SCHEMAS_DIR", "SEVERITIES", "TABLES", "SuiteError", "ValidationFailed",
           "ValidationReport", "import_gx", "load_suite", "register_parameters", "register_tables",
           "validate_stage"]
