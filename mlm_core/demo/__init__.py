"""The project's own bundled demo corpus: a small, deterministic, multilingual text collection.

Everything here (lexicons, grammars, hand-written sentences, bias-audit pairs) was written for the
project and is released as CC0 / public domain. ``python -m mlm_core.demo.generate`` regenerates
``configs/demo/`` byte for byte; see :mod:`mlm_core.demo.generate`.
"""
