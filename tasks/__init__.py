"""Thin Prefect/MLflow/Great Expectations wrappers around the framework-free stages in ``mlm_core``."""
