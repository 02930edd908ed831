"""The pipeline configuration: one frozen pydantic tree, parsed once from one YAML file.

In: a YAML mapping (plus ``--set a.b=value`` overrides). Out: a validated ``PipelineConfig``.
Every field carries a description (with its unit) because it feeds the JSON Schema in
``schemas/config.schema.json`` and the Prefect UI form. Unknown keys are errors naming the
full key path and the closest valid key (see ``mlm_core.config.io``).

Every leaf field declares what a change to it does, in ``json_schema_extra={"effect": E}`` (shown in
docs/CONFIG.md and the JSON Schema). ``mlm_core.stages`` derives every stage fingerprint, and
``mlm_core.train`` the training-trajectory key, from these markers alone:

  output     changes the stage's output (pretrain: the trained weights): in the fingerprint and the trajectory
  report     changes only what the stage reports (pretrain: validation cadence): in the fingerprint, not the
             trajectory, so training resumes from its checkpoints
  threshold  a data-contract threshold: in no fingerprint; a change re-validates the stored output
  none       speed / operations only: in no fingerprint
A field holding a section (or a dict/list/optional of sections) carries no marker: its own fields do.
A field added to an existing stage whose default keeps that stage's output as it was (an optional feature left
off) also declares ``"omit_default": True``: at its default it is in no fingerprint, so a config that does not
use the feature keeps its stored outputs across the upgrade (``mlm_core.config.effects.omitted_at_default``).

The markers are read, and the fingerprint / trajectory / threshold views built, in ``mlm_core.config.effects``
(re-exported here, with the ``Section`` base class).

The sections live in leaf modules by stage group, all re-exported here (import them from ``mlm_core.config``):
``config_data`` (sources, normalize, tokenizer, shards), ``config_train`` (pretrain), ``config_eval`` (evaluate,
audit), ``config_ops`` (registry and gates, tracking, execution), ``config_bias`` (bias mitigation). This module
keeps ``PipelineConfig``, the root, with its cross-section checks.

This module and its ``config_*`` sections are leaves: they import nothing from the rest of the project except the
language table and ``mlm_core.config.effects``.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from mlm_core.config.effects import (  # noqa: F401  (the effect-marker machinery, re-exported: imported from here)
    EFFECTS, FINGERPRINTED, TRAJECTORY, Section, effect_view, field_effect, fingerprint_view, omitted_at_default,
    section_type,
    threshold_view, trajectory_view,
)
from mlm_core.config.bias import (  # noqa: F401  (re-exported)
    BiasRegularizerConfig, CdaConfig, DebiasConfig, ProjectionConfig,
)
from mlm_core.config.data import (  # noqa: F401  (re-exported)
    DatasetSource, LanguageSource, NormalizeConfig, ShardsConfig, TokenizerConfig,
)
from mlm_core.config.eval import (  # noqa: F401  (re-exported)
    AuditConfig, EvaluateConfig, FinetuneConfig, TransferTask,
)
from mlm_core.config.ops import (  # noqa: F401  (re-exported)
    ExecutionConfig, GatesConfig, RegistryConfig, TrackingConfig,
)
from mlm_core.config.train import (  # noqa: F401  (re-exported)
    DistributedConfig, ElectraConfig, MaskingConfig, ModelConfig, PlateauConfig, PretrainConfig,
)
from mlm_core.languages import ISO639_1, SCRIPTS, SCRIPTS_BY_LANG as SCRIPTS_BY_LANG_KNOWN  # noqa: F401


class PipelineConfig(Section):
    """The whole pipeline, one YAML file."""

    name: str = Field(default="mlm-pipeline", description="Pipeline name (used in run names).",
        json_schema_extra={"effect": "none"})
    workdir: str = Field(default=".mlm", description="Where every stage writes its outputs (relative to the current directory).",
        json_schema_extra={"effect": "none"})
    verify: Literal["once", "always", "size"] = Field(
        default="once", json_schema_extra={"effect": "none"},
        description="How a stored output is checked against its manifest before it is read (upstream outputs, "
        "cache hits, shard readers): sizes always; sha256 'once' per file (recorded in the stage folder's "
        ".verified.json, re-hashed when a file's size or mtime changes), 'always' on every load, or never ('size').")
    seed: int = Field(default=0, description="Global seed; every stage derives its own from it.",
        json_schema_extra={"effect": "output"})
    sources: dict[str, LanguageSource] = Field(description="Raw text per language, keyed by ISO 639-1 code.")
    normalize: NormalizeConfig = Field(default_factory=NormalizeConfig, description="The normalize stage.")
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig, description="The tokenizer stage.")
    shards: ShardsConfig = Field(default_factory=ShardsConfig, description="The shards stage.")
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig, description="The pretrain stage.")
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig, description="The evaluate stage.")
    audit: AuditConfig = Field(default_factory=AuditConfig, description="The audit stage.")
    debias: DebiasConfig = Field(default_factory=DebiasConfig, description="Post-hoc debiasing the evaluate and "
                                 "audit stages apply to the trained encoder (the stored model is unchanged).",
                                 json_schema_extra={"omit_default": True})
    registry: RegistryConfig = Field(default_factory=RegistryConfig, description="Registration and promotion.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow tracking.")
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig, description="Where data-stage partitions "
                                       "run (local pool or Dask); speed only, in no fingerprint.")

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str) -> str:
        # a stage writes, cleans up and replaces folders under the workdir: never the filesystem root, the
        # home folder or a folder above it (`workdir: ~` or `workdir: /` would scatter stage folders there)
        from pathlib import Path
        resolved = Path(v).expanduser().resolve()
        home = Path.home().resolve()
        if resolved == Path(resolved.anchor) or resolved == home or resolved in home.parents:
            where = "the filesystem root" if resolved == Path(resolved.anchor) else (
                "the home folder" if resolved == home else "a folder above the home folder")
            raise ValueError(f"{v!r} resolves to {resolved}, {where}: stage outputs need a folder of their own "
                             f"(e.g. workdir: .mlm)")
        return v

    @field_validator("sources")
    @classmethod
    def _langs(cls, v: dict[str, LanguageSource]) -> dict[str, LanguageSource]:
        if not v:
            raise ValueError("at least one language is required")
        for lang, src in v.items():
            if lang not in ISO639_1:
                raise ValueError(f"'{lang}' is not an ISO 639-1 language code")
            if src.scripts is None and lang not in SCRIPTS_BY_LANG_KNOWN:
                raise ValueError(f"no script table for '{lang}': set sources.{lang}.scripts")
        return v

    @model_validator(mode="after")
    def _cross(self) -> "PipelineConfig":
        unknown = sorted(set(self.tokenizer.max_fertility_per_lang) - set(self.sources))
        if unknown:
            raise ValueError(f"tokenizer.max_fertility_per_lang: language(s) {unknown} not in sources "
                             f"({', '.join(sorted(self.sources))})")
        for key, langs in (("audit.crows_pairs", self.audit.crows_pairs), ("audit.templates", self.audit.templates)):
            missing = sorted(set(langs) - set(ISO639_1))
            if missing:
                raise ValueError(f"{key}: {missing} are not ISO 639-1 language codes")
        # bias word-pair lists (issue 13 part 1): a list for a language the pipeline does not have is a typo
        for key, sec in (("shards.cda.lists", self.shards.cda), ("pretrain.bias_regularizer.lists",
                         self.pretrain.bias_regularizer), ("debias.projection.lists", self.debias.projection)):
            extra = sorted(set(sec.lists) - set(self.sources)) if sec is not None else []
            if extra:
                raise ValueError(f"{key}.{extra[0]}: language '{extra[0]}' is not in sources "
                                 f"({', '.join(sorted(self.sources))})")
        if self.pretrain.masking.strategy == "pmi" and not self.tokenizer.pmi_vocab:
            raise ValueError("pretrain.masking.strategy 'pmi' needs tokenizer.pmi_vocab > 0 (the tokenizer stage "
                             "builds the PMI n-gram vocabulary it masks)")
        if self.tokenizer.extend and self.tokenizer_from is None:    # pretrain.init_from's own tokenizer counts
            raise ValueError("tokenizer.extend needs tokenizer.from or pretrain.init_from (the tokenizer whose "
                             "vocabulary is extended)")
        # with init_from the max positions are the checkpoint's unless set here (the pretrain stage checks them)
        explicit = self.pretrain.init_from is None or "max_positions" in self.pretrain.model.model_fields_set
        if explicit and self.shards.seq_len > self.pretrain.model.max_positions:
            raise ValueError(f"shards.seq_len ({self.shards.seq_len}) exceeds pretrain.model.max_positions "
                             f"({self.pretrain.model.max_positions})")
        return self

    @property
    def tokenizer_from(self) -> str | None:
        """The existing tokenizer the tokenizer stage uses: tokenizer.from, else pretrain.init_from's, else None (train one)."""
        return self.tokenizer.from_ if self.tokenizer.from_ is not None else self.pretrain.init_from

    @property
    def train_seed(self) -> int:
        """The seed training (and transfer fine-tuning) uses: pretrain.seed, else the global seed."""
        return self.pretrain.seed if self.pretrain.seed is not None else self.seed

    @property
    def tokenizer_alpha(self) -> float:
        return self.tokenizer.sampling_alpha if self.tokenizer.sampling_alpha is not None else self.shards.sampling_alpha

    @property
    def languages(self) -> list[str]:
        return sorted(self.sources)

    def scripts_for(self, lang: str) -> list[str]:
        src = self.sources[lang]
        return list(src.scripts) if src.scripts else list(SCRIPTS_BY_LANG_KNOWN[lang])

