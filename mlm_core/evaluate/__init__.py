"""Evaluation of a trained encoder, framework-free.

``intrinsic``: per-language masked-token metrics (top-1/top-5, MRR, loss, perplexity, calibration) next
to the unigram-frequency baseline; ``pll``: pseudo-log-likelihood scoring (Salazar et al., 2020);
``transfer`` / ``conll``: zero-shot cross-lingual transfer. Import the submodules directly (this package
imports nothing, so importing it costs nothing and pulls in no torch).
"""
