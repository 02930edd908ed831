"""The pipeline configuration: one frozen pydantic tree, parsed once from one YAML file.

In: a YAML mapping (plus ``--set a.b=value`` overrides). Out: a validated ``PipelineConfig``.
Every field carries a description (with its unit) because it feeds the JSON Schema in
``schemas/config.schema.json`` and the Prefect UI form. Unknown keys are errors naming the
full key path and the closest valid key (see ``mlm_core.configio``).

This module is a leaf: it imports nothing from the rest of the project except the language table.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mlm_core.languages import ISO639_1, SCRIPTS, SCRIPTS_BY_LANG as SCRIPTS_BY_LANG_KNOWN


class Section(BaseModel):
    """Base for every config section: frozen, unknown keys forbidden."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class DatasetSource(Section):
    """A Hugging Face `datasets` source, read in streaming mode (never downloaded whole to memory)."""

    name: str = Field(description="Dataset name on the hub, or a builder such as 'json', 'text', 'parquet' for local files.")
    config: str | None = Field(default=None, description="Dataset configuration (subset) name, e.g. 'en' or '20231101.fr'.")
    split: str = Field(default="train", description="Split to read.")
    data_files: list[str] | None = Field(
        default=None, description="Files for builder datasets ('json', 'text', 'parquet'); relative to the config file.")
    revision: str | None = Field(default=None, description="Hub revision (commit, tag or branch) to pin the data.")
    max_records: int | None = Field(default=None, ge=1, description="Read at most this many records (None = all).")


class LanguageSource(Section):
    """Where one language's raw text comes from: local files (`paths`) or a `datasets` source (`dataset`)."""

    paths: list[str] = Field(
        default_factory=list,
        description="Files or globs (text: one document per line; .jsonl; .parquet; optionally .gz), "
        "relative to the config file.")
    format: Literal["auto", "text", "jsonl", "parquet"] = Field(
        default="auto", description="File format; 'auto' decides by extension (.txt/.jsonl/.json/.parquet, plus .gz).")
    text_field: str = Field(default="text", description="Field holding the text in JSONL/Parquet/datasets records.")
    dataset: DatasetSource | None = Field(default=None, description="A `datasets` source instead of local files.")
    scripts: list[str] | None = Field(
        default=None, description="Unicode scripts this language is written in (overrides the built-in table), "
        "e.g. ['Latin'].")

    @model_validator(mode="after")
    def _one_kind(self) -> "LanguageSource":
        if bool(self.paths) == (self.dataset is not None):
            raise ValueError("give exactly one of 'paths' or 'dataset'")
        if self.scripts:
            bad = [s for s in self.scripts if s not in SCRIPTS]
            if bad:
                raise ValueError(f"unknown script(s) {bad}; known: {sorted(SCRIPTS)}")
        return self


class NormalizeConfig(Section):
    """Unicode normalization, cleaning, filtering and exact deduplication of the raw corpus."""

    unicode_form: Literal["NFC", "NFKC"] = Field(
        default="NFKC", description="Unicode normalization form. NFKC folds compatibility forms (full-width letters, ligatures).")
    lowercase: bool = Field(default=False, description="Lowercase the text (accents are never stripped).")
    min_chars: int = Field(default=5, ge=1, description="Documents shorter than this (characters, after cleaning) are quarantined.")
    max_chars: int = Field(default=100_000, ge=1, description="Documents longer than this (characters) are quarantined.")
    max_line_bytes: int = Field(
        default=16 * 2**20, ge=1024,
        description="A raw line longer than this (bytes) is quarantined without being held in memory.")
    script_check: bool = Field(default=True, description="Quarantine documents whose letters are mostly not in the language's scripts.")
    min_script_ratio: float = Field(
        default=0.5, gt=0, le=1, description="Share of letters that must be in the language's scripts (script check).")
    dedup: bool = Field(default=True, description="Drop exact duplicates (by content hash) across the whole corpus; the first occurrence is kept.")
    max_quarantine_rate: float = Field(
        default=0.05, ge=0, le=1, description="The stage fails (naming the worst files) when quarantined/records exceeds this.")
    partition_mb: int = Field(
        default=64, ge=1, description="Large files are split into partitions of about this many MiB, processed independently.")
    workers: int = Field(default=2, ge=1, description="Processes normalizing partitions in parallel.")
    memory_limit_mb: int = Field(default=1024, ge=128, description="DuckDB memory limit for the dedup/statistics pass (MiB); it spills to disk beyond.")

    @model_validator(mode="after")
    def _bounds(self) -> "NormalizeConfig":
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) must be <= max_chars ({self.max_chars})")
        return self


class TrackingConfig(Section):
    """MLflow tracking: where runs, metrics and artifacts go."""

    uri: str | None = Field(
        default=None,
        description="MLflow tracking URI (http://host:port or sqlite:///path). Default: a SQLite file in the workdir.")
    experiment: str = Field(default="mlm-pipeline", description="MLflow experiment name.")
    enabled: bool = Field(default=True, description="Log to MLflow at all.")


class PipelineConfig(Section):
    """The whole pipeline, one YAML file."""

    name: str = Field(default="mlm-pipeline", description="Pipeline name (used in run names).")
    workdir: str = Field(default=".mlm", description="Where every stage writes its outputs (relative to the current directory).")
    seed: int = Field(default=0, description="Global seed; every stage derives its own from it.")
    sources: dict[str, LanguageSource] = Field(description="Raw text per language, keyed by ISO 639-1 code.")
    normalize: NormalizeConfig = Field(default_factory=NormalizeConfig, description="The normalize stage.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow tracking.")

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

    @property
    def languages(self) -> list[str]:
        return sorted(self.sources)

    def scripts_for(self, lang: str) -> list[str]:
        src = self.sources[lang]
        return list(src.scripts) if src.scripts else list(SCRIPTS_BY_LANG_KNOWN[lang])

