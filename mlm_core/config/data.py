"""Config sections of the data stages (normalize, tokenizer, shards) and the raw-text sources, split out of
``mlm_core.config`` (re-exported there; the effect markers are explained in its docstring).

Like ``mlm_core.config`` this module is a leaf.
"""
from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from mlm_core.config.bias import CdaConfig
from mlm_core.config.effects import Section
from mlm_core.languages import SCRIPTS


class DatasetSource(Section):
    """A Hugging Face `datasets` source, read in streaming mode (never downloaded whole to memory)."""

    name: str = Field(description="Dataset name on the hub, or a builder such as 'json', 'text', 'parquet' for local files.",
        json_schema_extra={"effect": "output"})
    config: str | None = Field(default=None, description="Dataset configuration (subset) name, e.g. 'en' or '20231101.fr'.",
        json_schema_extra={"effect": "output"})
    split: str = Field(default="train", description="Split to read.", json_schema_extra={"effect": "output"})
    data_files: list[str] | None = Field(
        default=None, description="Files for builder datasets ('json', 'text', 'parquet'); relative to the config file.",
        json_schema_extra={"effect": "output"})
    revision: str | None = Field(default=None, description="Hub revision (commit, tag or branch) to pin the data.",
        json_schema_extra={"effect": "output"})
    max_records: int | None = Field(default=None, ge=1, description="Read at most this many records (None = all).",
        json_schema_extra={"effect": "output"})


class LanguageSource(Section):
    """Where one language's raw text comes from: local files (`paths`) or a `datasets` source (`dataset`)."""

    paths: list[str] = Field(
        default_factory=list,
        description="Files or globs (text: one document per line; .jsonl; .parquet; optionally .gz), "
        "relative to the config file.", json_schema_extra={"effect": "output"})
    format: Literal["auto", "text", "jsonl", "parquet"] = Field(
        default="auto", description="File format; 'auto' decides by extension (.txt/.jsonl/.json/.parquet, plus .gz).",
        json_schema_extra={"effect": "output"})
    text_field: str = Field(default="text", description="Field holding the text in JSONL/Parquet/datasets records.",
        json_schema_extra={"effect": "output"})
    dataset: DatasetSource | None = Field(default=None, description="A `datasets` source instead of local files.")
    scripts: list[str] | None = Field(
        default=None, description="Unicode scripts this language is written in (overrides the built-in table), "
        "e.g. ['Latin'].", json_schema_extra={"effect": "output"})

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
        default="NFKC", description="Unicode normalization form. NFKC folds compatibility forms (full-width letters, ligatures).",
        json_schema_extra={"effect": "output"})
    lowercase: bool = Field(default=False, description="Lowercase the text (accents are never stripped).",
        json_schema_extra={"effect": "output"})
    min_chars: int = Field(default=5, ge=1, description="Documents shorter than this (characters, after cleaning) are quarantined.",
        json_schema_extra={"effect": "output"})
    max_chars: int = Field(default=100_000, ge=1, description="Documents longer than this (characters) are quarantined.",
        json_schema_extra={"effect": "output"})
    max_line_bytes: int = Field(
        default=16 * 2**20, ge=1024,
        description="A raw line longer than this (bytes) is quarantined without being held in memory.",
        json_schema_extra={"effect": "output"})
    script_check: bool = Field(default=True, description="Quarantine documents whose letters are mostly not in the language's scripts.",
        json_schema_extra={"effect": "output"})
    min_script_ratio: float = Field(
        default=0.5, gt=0, le=1, description="Weighted share of letters that must be in the language's scripts (script check; "
        "0-1). Weights: a Han character 3 Latin letters, a Kana or Hangul one 2, other letters 1; letters of a "
        "capitalized foreign word (a name) half; @handles, #hashtags and URLs not counted.",
        json_schema_extra={"effect": "output"})
    dedup: bool = Field(default=True, description="Drop exact duplicates (by content hash) across the whole corpus; the first occurrence is kept.",
        json_schema_extra={"effect": "output"})
    min_docs_per_language: int = Field(
        default=1, ge=1, description="Data contract: every language keeps at least this many documents "
        "(checked by the normalize suite; fewer fails the stage).", json_schema_extra={"effect": "threshold"})
    max_quarantine_rate: float = Field(
        default=0.05, ge=0, le=1, description="The stage fails (naming the worst files) when quarantined/records exceeds this.",
        json_schema_extra={"effect": "threshold"})
    workers: int = Field(default=2, ge=1, description="Partitions normalized in parallel (threads for text and Parquet, "
                         "whose work runs in Arrow kernels; processes for JSONL and datasets sources).",
        json_schema_extra={"effect": "none"})
    memory_limit_mb: int = Field(default=1024, ge=128, description="DuckDB memory limit for the dedup/statistics pass (MiB); it spills to disk beyond.",
        json_schema_extra={"effect": "none"})

    @model_validator(mode="after")
    def _bounds(self) -> "NormalizeConfig":
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) must be <= max_chars ({self.max_chars})")
        return self


class TokenizerConfig(Section):
    """Tokenizer training (HF `tokenizers`) on a language-balanced sample of the normalized corpus."""

    # `from` is a Python keyword: the field is from_, read and written as "from" (YAML, --set, dumps, schema)
    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True, serialize_by_alias=True)

    from_: str | None = Field(
        default=None, alias="from", description="Use an existing tokenizer instead of training one: a folder with "
        "tokenizer.json (or Hugging Face tokenizer files: vocab.txt, sentencepiece.bpe.model, vocab.json+merges.txt), "
        "or models:/NAME@ALIAS / models:/NAME/VERSION from the registry. Fertility and UNK rate are still measured "
        "on this corpus and checked by the same contract. Its content hash (not the path) enters the fingerprint; "
        "algorithm/vocab_size/special_tokens/lowercase are then taken from it (min_frequency: the least count of a "
        "token added by extend). Default: "
        "pretrain.init_from when that is set.", json_schema_extra={"effect": "output"})
    extend: int = Field(
        default=0, ge=0, description="With `from` (or pretrain.init_from): learn up to this many new tokens from this corpus that the base "
        "vocabulary lacks (same balanced sample), appended after the existing ids so every old id keeps its "
        "meaning; pretrain initializes each new embedding as the mean of its base pieces. 0 = off.",
        json_schema_extra={"effect": "output"})
    algorithm: Literal["bpe", "wordpiece", "unigram"] = Field(
        default="bpe", description="bpe = byte-level BPE (RoBERTa/GPT-2 style, never emits UNK); wordpiece = BERT "
        "style; unigram = SentencePiece/XLM-R style with Metaspace. Unigram trains ~15x slower than BPE.",
        json_schema_extra={"effect": "output"})
    vocab_size: int = Field(default=8000, ge=64, le=1_000_000, description="Requested vocabulary size (tokens, specials included).",
        json_schema_extra={"effect": "output"})
    min_frequency: int = Field(default=2, ge=1, description="Minimum pair/word frequency for a merge (BPE, WordPiece).",
        json_schema_extra={"effect": "output"})
    special_tokens: Literal["bert", "roberta"] = Field(
        default="bert", description="bert: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4; roberta: <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4.",
        json_schema_extra={"effect": "output"})
    lowercase: bool = Field(default=False, description="Lowercase inside the tokenizer's normalizer (NFKC is always applied; accents never stripped).",
        json_schema_extra={"effect": "output"})
    sampling_alpha: float | None = Field(
        default=None, gt=0, le=1, description="Temperature exponent for the language-balanced training sample; "
        "default: shards.sampling_alpha.", json_schema_extra={"effect": "output"})
    sample_mb: float = Field(default=20.0, gt=0, description="Cap on the training sample (MB of UTF-8 text). Unigram costs ~9 s/MB on 2 cores.",
        json_schema_extra={"effect": "output"})
    heldout_docs: int = Field(default=200, ge=1, description="Documents per language kept out of training to measure fertility and UNK rate.",
        json_schema_extra={"effect": "output"})
    min_vocab_fraction: float = Field(
        default=0.5, gt=0, le=1, description="Fail when the trained vocabulary is smaller than this fraction of vocab_size.",
        json_schema_extra={"effect": "threshold"})
    max_unk_rate: float = Field(default=0.02, ge=0, le=1, description="Maximum share of UNK tokens on held-out text, per language.",
        json_schema_extra={"effect": "threshold"})
    max_fertility: float = Field(default=4.0, gt=0, description="Maximum tokens per whitespace word on held-out text, per language.",
        json_schema_extra={"effect": "threshold"})
    max_fertility_per_lang: dict[str, float] = Field(
        default_factory=dict, description="Per-language overrides of max_fertility (e.g. zh: 8.0, languages without spaces).",
        json_schema_extra={"effect": "threshold"})
    pmi_vocab: int = Field(
        default=0, ge=0, description="PMI-masking (Levine et al. 2021): keep up to this many word n-grams (n = 2..5) per "
        "language, ranked by the paper's PMI measure over the normalized corpus, in pmi_ngrams.parquet (0 = none; the "
        "paper: 800k). pretrain.masking.strategy pmi masks them.", json_schema_extra={"effect": "output"})
    pmi_min_count: int = Field(default=10, ge=2, description="Only n-grams seen at least this often are ranked (the paper: 10).",
        json_schema_extra={"effect": "output"})
    pmi_memory_mb: int = Field(default=1024, ge=128, description="DuckDB memory limit of the n-gram count (it spills to disk beyond).",
        json_schema_extra={"effect": "none"})


class ShardsConfig(Section):
    """Pre-tokenized, packed Arrow IPC shards and the per-language sampling table."""

    seq_len: int = Field(default=128, ge=8, le=8192, description="Tokens per packed sequence ([CLS]/[SEP] included).",
        json_schema_extra={"effect": "output"})
    sampling_alpha: float = Field(
        default=0.3, gt=0, le=1, description="Temperature exponent α: p(l) ∝ n_l^α. 1 = natural shares; 0.3 = XLM-R.",
        json_schema_extra={"effect": "output"})
    validation_fraction: float = Field(
        default=0.05, gt=0, lt=0.5, description="Share of each language's documents held out for validation (by doc hash).",
        json_schema_extra={"effect": "output"})
    min_validation_tokens: int = Field(
        default=0, ge=0, description="Minimum content tokens in each language's validation split: a small language's "
        "split takes further documents in hash order until it holds this many tokens (at most half its documents; "
        "0 = off). The evaluate stage scores every token of up to evaluate.max_sequences validation rows once, "
        "so this is also the minimum number of masked positions it scores per language.",
        json_schema_extra={"effect": "output"})
    token_budget: int = Field(
        default=10_000_000, ge=1, description="Planned training tokens, for the expected-epochs column that "
        "`mlm stats` computes from the stored sampling table (not stored itself).", json_schema_extra={"effect": "none"})
    rows_per_shard: int = Field(default=16384, ge=1, description="Sequences per Arrow IPC shard file.",
        json_schema_extra={"effect": "output"})
    batch_docs: int = Field(default=2000, ge=1, description="Documents per encode_batch call.",
        json_schema_extra={"effect": "none"})
    workers: int = Field(
        default=2, ge=1, description="Encoding parallelism: <= 2 encodes in-process on the tokenizer's own threads "
        "(packing overlaps encoding; fastest on 2 cores), >= 3 starts that many single-threaded processes.",
        json_schema_extra={"effect": "none"})
    merge_workers: int = Field(
        default=2, ge=1, description="Shard files written in parallel by the merge (threads; each output file is "
        "written alone once the partitions' sizes fix its rows: the bytes do not depend on it).",
        json_schema_extra={"effect": "none"})
    empty_language: Literal["error", "drop"] = Field(
        default="error", description="A language with no documents: fail (error) or drop it with a warning (drop).",
        json_schema_extra={"effect": "output"})
    cda: CdaConfig | None = Field(default=None, description="Counterfactual data augmentation of the training split "
                                  "(None: off).", json_schema_extra={"omit_default": True})
