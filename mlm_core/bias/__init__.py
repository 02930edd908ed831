"""Bias mitigation (issue 13 part 1): the per-language word-pair lists (``wordlists``), counterfactual data
augmentation of the training split (``cda``), the pre-training regularizer (``regularizer``) and the post-hoc
SentenceDebias projection (``projection``). Format of the lists and what each method does: docs/BIAS.md."""
