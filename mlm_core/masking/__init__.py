"""Masking family for masked-language-model pretraining: token, whole-word, SpanBERT span and PMI masking.

The package, by concept:

* ``masker``      ``Masker`` / ``MaskedBatch``: candidates, randomness (row keys, per-position hashes) and the
                  80/10/10 replacement every strategy shares; it picks its strategy from the registry once;
* ``strategies``  the ``MaskingStrategy`` protocol, one class per strategy (selection + the compiled step's
                  budget unit) and ``STRATEGIES``, the one registry of strategy names;
* ``schedule``    ``masking_rate``: the rate p at a step;
* ``primitives``  the integer hashing and word-unit primitives (bit-exact on every device);
* ``pmi``         PMI-masking's collocation vocabulary (built by the tokenizer stage, read by training);
* ``pmi_select``  PMI-masking's selection (collocations first, then words).

References: BERT (Devlin et al. 2019: 15 %, 80/10/10 replacement; whole-word masking from the BERT repo),
SpanBERT (Joshi et al. 2020: span lengths ~ Geometric(0.2) renormalized over 1..10 words, mean ~3.8),
RoBERTa (dynamic masking), and masking-rate schedules (Wettig et al. 2023; Yang et al. 2023).

Design choices (all vectorized torch, no Python loop over tokens or sequences):

* Selection is **independent (Bernoulli)**, not an exact count per sequence: a candidate token (token),
  a word (whole_word) or a span (span) is selected when its uniform key is below a threshold. The expected
  number of selected tokens is exactly ``p * n_candidates`` for every sequence length (an exact
  ``round(p * n)`` biases short rows and needs a sort); per-row counts are therefore binomial-like.
  Token and whole-word masks are nested across rates (selected at p => selected at any p' > p), so a rate
  schedule never reshuffles a static mask, it only grows or shrinks it.
* whole_word: a unit is a word (a word-start token and the following non-start tokens, up to the next word
  start or non-candidate token); each word is selected with probability p, so p of the candidate *tokens*
  are selected in expectation; words are never split.
* span: a renewal process tiles each segment (document between specials) in word units: span lengths
  L ~ Geometric(span_p) truncated to 1..span_max and renormalized (in words; SpanBERT's distribution:
  P(L = l) = p (1-p)^(l-1) / (1 - (1-p)^span_max); clipping instead would pile the tail onto span_max),
  separated by gaps of one word (zero when the rate is too high for gaps). Each segment starts on a whole
  span or on a gap (with the stationary odds, so the first words of a document are as likely selected as
  any), and its last span is clipped at the segment's end: a span never crosses [SEP] (as SpanBERT clips
  at the sentence end). Each span is then kept independently with probability
  ``p * n_candidates / tokens_covered_by_all_spans`` (per row), so the expected selected-token count is
  ``p * n_candidates`` and kept spans are an unbiased sample of span lengths (the keep decision never
  looks at a span's own length). Kept spans never overlap or touch
  (with the one-word gap), so each run of selected words in the output is one span.
* pmi (Levine et al. 2021): whole collocations from the PMI n-gram vocabulary first, then single words, up
  to the same expected budget; never splits a collocation (``pmi_select``, vocabulary ``pmi``).
* 80/10/10 is decided **per token**, also for whole words and spans (as BERT's original WWM code does).
  Random replacements are drawn uniformly from the vocabulary without special ids.
* Randomness: a counter-based hash of (row key, stream, position); static and dynamic row keys: ``masker``.
* Cost (one CPU thread, this repo's 2-core box): ~0.1 ms (token) to ~0.35 ms (span) for 32 x 128, ~1.5 ms to
  ~4 ms for 256 x 512; every op also runs on CUDA (span does one host sync for the segment count).
"""
from mlm_core.masking.masker import IGNORE_INDEX, MaskedBatch, Masker
from mlm_core.masking.schedule import masking_rate
from mlm_core.masking.strategies import (STRATEGIES, Draw, MaskingStrategy, span_length_cdf, span_length_mean,
                                         strategy_class)

__all__ = ["IGNORE_INDEX", "Draw", "MaskedBatch", "Masker", "MaskingStrategy", "STRATEGIES", "masking_rate",
           "span_length_cdf", "span_length_mean", "strategy_class"]
