"""Sweep reports (issue 12): statistics over seeds (``stats``), the stored outputs of every run (``collect``),
figures (``plots``) and the report files (``build``). Reads stored outputs only; imports no Prefect/MLflow."""
from mlm_core.report.build import build_report

__all__ = ["build_report"]
