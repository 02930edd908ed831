"""The ``mlm`` command line (console script ``mlm = "flows.cli:main"``; ``python -m flows.cli`` runs the same).

``app`` holds the parser and ``main``; one module per command group beside it (``run``, ``status``, ``model``,
``config``, ``compare``, ``sweep``, ``report``, ``registry``), all on the shared leaf ``util``.
"""
from __future__ import annotations

from flows.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
