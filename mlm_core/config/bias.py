"""Config sections of bias mitigation (issue 13 part 1), split out of ``mlm_core.config`` (re-exported there).

Three methods, each driven by the same per-language word-pair lists (``configs/bias/<lang>.yaml``, format in
docs/BIAS.md and ``mlm_core.bias.wordlists``):
- ``shards.cda``: counterfactual data augmentation of the training split (a swapped copy of a share of documents);
- ``pretrain.bias_regularizer``: λ Σ_g ‖E[h(x_g)] − E[h(x)]‖² added to the training loss;
- ``debias.projection``: SentenceDebias (Liang et al. 2020), a bias subspace removed from the trained encoder's
  representations when the evaluate and audit stages score it (the stored model is not changed).
Like ``mlm_core.config`` this module is a leaf.
"""
from __future__ import annotations

from pydantic import Field

from mlm_core.config.effects import Section

_LISTS = ("Language -> word-pair list YAML (configs/bias/<lang>.yaml; format in docs/BIAS.md), relative to the "
          "config file. Its content enters the fingerprint.")


class CdaConfig(Section):
    """Counterfactual data augmentation: for a share of each listed language's training documents, also train on a
    copy with every listed word swapped for its partner (he <-> she, ...). Validation documents are never augmented."""

    share: float = Field(default=0.5, gt=0, le=1, description="Share of a listed language's training documents that "
                         "get a swapped copy (chosen by a hash of the document id and the global seed).",
                         json_schema_extra={"effect": "output"})
    lists: dict[str, str] = Field(description=_LISTS, json_schema_extra={"effect": "output"})


class BiasRegularizerConfig(Section):
    """Pull group-conditioned representations towards the mean: L = L_MLM + λ Σ_g ‖E[h(x_g)] − E[h(x)]‖², h the
    hidden state at ``layer``, E over the micro-batch's positions whose word is in group g (resp. all positions)."""

    weight: float = Field(gt=0, description="λ, the weight of the regularizer in the loss.",
                          json_schema_extra={"effect": "output"})
    layer: int = Field(default=-1, description="Encoder layer whose output is h (0 = first; negative counts from the "
                       "end: -1 = the last).", json_schema_extra={"effect": "output"})
    lists: dict[str, str] = Field(description=_LISTS + " The two columns of the pairs are the groups.",
                                  json_schema_extra={"effect": "output"})


class ProjectionConfig(Section):
    """SentenceDebias (Liang et al. 2020): estimate a bias subspace from the word-pair lists (counterfactual sentence
    pairs from the corpus) and remove it from the encoder's final hidden states before the MLM head."""

    lists: dict[str, str] = Field(description=_LISTS, json_schema_extra={"effect": "output"})
    components: int = Field(default=1, ge=1, le=64, description="Dimension k of the removed bias subspace (top "
                            "principal components).", json_schema_extra={"effect": "output"})
    max_sentences: int = Field(default=1000, ge=2, description="Corpus sentences per language (containing a listed "
                               "word) used to estimate the subspace.", json_schema_extra={"effect": "output"})


class DebiasConfig(Section):
    """Post-hoc debiasing of the trained encoder, applied when the evaluate and audit stages score it."""

    projection: ProjectionConfig | None = Field(default=None, description="SentenceDebias projection (None: off).",
                                                json_schema_extra={"omit_default": True})
