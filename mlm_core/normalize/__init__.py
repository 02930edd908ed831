"""The normalize stage (see ``stage.py``)."""
from mlm_core.normalize.stage import NormalizeError, run_normalize

__all__ = ["NormalizeError", "run_normalize"]
