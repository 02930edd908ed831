"""The pipeline configuration: one frozen pydantic tree, parsed once from one YAML file.

In: a YAML mapping (plus ``--set a.b=value`` overrides). Out: a validated ``PipelineConfig``.
Every field carries a description (with its unit) because it feeds the JSON Schema in
``schemas/config.schema.json`` and the Prefect UI form. Unknown keys are errors naming the
full key path and the closest valid key (see ``mlm_core.configio``).

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
use the feature keeps its stored outputs across the upgrade (``mlm_core.effects.omitted_at_default``).

The markers are read, and the fingerprint / trajectory / threshold views built, in ``mlm_core.effects``
(re-exported here, with the ``Section`` base class).

This module is a leaf: it imports nothing from the rest of the project except the language table and
``mlm_core.effects``.
"""
from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from mlm_core.effects import (  # noqa: F401  (the effect-marker machinery, re-exported: imported from here)
    EFFECTS, FINGERPRINTED, TRAJECTORY, Section, effect_view, field_effect, fingerprint_view, omitted_at_default,
    section_type,
    threshold_view, trajectory_view,
)
from mlm_core.config_bias import (  # noqa: F401  (re-exported)
    BiasRegularizerConfig, CdaConfig, DebiasConfig, ProjectionConfig,
)
from mlm_core.languages import ISO639_1, SCRIPTS, SCRIPTS_BY_LANG as SCRIPTS_BY_LANG_KNOWN


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
    empty_language: Literal["error", "drop"] = Field(
        default="error", description="A language with no documents: fail (error) or drop it with a warning (drop).",
        json_schema_extra={"effect": "output"})
    cda: CdaConfig | None = Field(default=None, description="Counterfactual data augmentation of the training split "
                                  "(None: off).", json_schema_extra={"omit_default": True})


class ModelConfig(Section):
    """Encoder architecture (BERT/RoBERTa family). A named size fills every field left unset."""

    size: Literal["tiny", "small", "base"] = Field(
        default="tiny", description="Named shape (mlm_core.model.SIZES): tiny trains in seconds on CPU, base = BERT-base.",
        json_schema_extra={"effect": "output"})
    layers: int | None = Field(default=None, ge=1, description="Transformer layers (default: from size).",
        json_schema_extra={"effect": "output"})
    hidden: int | None = Field(default=None, ge=8, description="Hidden size (default: from size).",
        json_schema_extra={"effect": "output"})
    heads: int | None = Field(default=None, ge=1, description="Attention heads; must divide hidden (default: from size).",
        json_schema_extra={"effect": "output"})
    ffn: int | None = Field(default=None, ge=8, description="Feed-forward inner size (default: 4 x hidden).",
        json_schema_extra={"effect": "output"})
    dropout: float = Field(default=0.1, ge=0, lt=1, description="Dropout on embeddings, attention output and FFN.",
        json_schema_extra={"effect": "output"})
    max_positions: int = Field(default=512, ge=8, description="Maximum sequence length the position table covers.",
        json_schema_extra={"effect": "output"})
    position: Literal["learned", "sinusoidal", "rotary"] = Field(
        default="learned", description="Position encoding. sinusoidal exports as a fixed learned table; rotary does not export to BERT.",
        json_schema_extra={"effect": "output"})
    norm: Literal["post", "pre"] = Field(default="post", description="post-LN = BERT (exports); pre-LN trains more stably, no BERT export.",
        json_schema_extra={"effect": "output"})
    tie_embeddings: bool = Field(default=True, description="Tie the MLM output projection to the input embeddings.",
        json_schema_extra={"effect": "output"})
    attention: Literal["global", "local_global"] = Field(
        default="global", description="global: every token attends to every token (BERT). local_global: sliding-window "
        "attention of `window` tokens in every layer but each `global_every`-th, which stays global (ModernBERT's "
        "alternation; Longformer / BigBird's local attention): memory grows ~linearly with seq_len. No transformers "
        "equivalent: such a model does not export to BERT.", json_schema_extra={"effect": "output", "omit_default": True})
    window: int = Field(default=128, ge=2, description="local_global: tokens a local layer's query sees (centred on "
                        "it: window/2 each side, i.e. keys with |i - j| <= window/2); even, at most max_positions.",
                        json_schema_extra={"effect": "output", "omit_default": True})
    global_every: int = Field(default=3, ge=1, description="local_global: every k-th layer (k, 2k, ...; counted "
                              "from 1) is global, the others local (k > layers: every layer local).",
                              json_schema_extra={"effect": "output", "omit_default": True})

    @model_validator(mode="after")
    def _heads(self) -> "ModelConfig":
        if self.hidden is not None and self.heads is not None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.attention == "local_global" and (self.window % 2 or self.window > self.max_positions):
            raise ValueError(f"attention local_global: window ({self.window}) must be even and at most max_positions "
                             f"({self.max_positions}) (a wider window is global attention: set attention: global)")
        return self


class MaskingConfig(Section):
    """Which tokens are corrupted and how (BERT 80/10/10; token, whole-word or SpanBERT span masking)."""

    strategy: Literal["token", "whole_word", "span", "pmi"] = Field(default="token", description="Unit of selection; "
        "pmi: whole collocations from the tokenizer stage's PMI n-gram vocabulary first, then single words (Levine et al. "
        "2021; needs tokenizer.pmi_vocab > 0).",
        json_schema_extra={"effect": "output"})
    rate: float = Field(default=0.15, gt=0, lt=1, description="Selection rate p (share of non-special tokens), for the constant schedule.",
        json_schema_extra={"effect": "output"})
    mask_token_prob: float = Field(default=0.8, ge=0, le=1, description="Selected tokens replaced by [MASK].",
        json_schema_extra={"effect": "output"})
    random_token_prob: float = Field(default=0.1, ge=0, le=1, description="Selected tokens replaced by a random non-special token; the rest stay unchanged.",
        json_schema_extra={"effect": "output"})
    mode: Literal["static", "dynamic"] = Field(
        default="dynamic", description="static: fixed per sequence (seeded by sequence id); dynamic: new each time a sequence is drawn.",
        json_schema_extra={"effect": "output"})
    schedule: Literal["constant", "linear", "cosine", "cyclical"] = Field(
        default="constant", description="Masking-rate schedule over training: linear/cosine go rate_max -> rate_min; "
        "cyclical: p(t) = rate_min + (rate_max - rate_min) * |sin(2 pi t / period)|.",
        json_schema_extra={"effect": "output"})
    rate_min: float = Field(default=0.10, gt=0, lt=1, description="Lowest rate for the non-constant schedules.",
        json_schema_extra={"effect": "output"})
    rate_max: float = Field(default=0.30, gt=0, lt=1, description="Highest rate for the non-constant schedules.",
        json_schema_extra={"effect": "output"})
    period: int = Field(default=1000, ge=1, description="Cyclical schedule period T (steps).",
        json_schema_extra={"effect": "output"})
    span_p: float = Field(default=0.2, gt=0, lt=1, description="Span lengths in words ~ Geometric(span_p) renormalized over 1..span_max (SpanBERT: 0.2, mean 3.8 words at span_max 10).",
        json_schema_extra={"effect": "output"})
    span_max: int = Field(default=10, ge=1, description="Longest span, in words: the geometric length distribution is truncated and renormalized over 1..span_max (SpanBERT: 10).",
        json_schema_extra={"effect": "output"})

    @model_validator(mode="after")
    def _parts(self) -> "MaskingConfig":
        if self.mask_token_prob + self.random_token_prob > 1 + 1e-9:
            raise ValueError(f"mask_token_prob + random_token_prob = {self.mask_token_prob + self.random_token_prob:g} "
                             "exceeds 1 (the remainder is kept unchanged)")
        if self.rate_min > self.rate_max:
            raise ValueError(f"rate_min ({self.rate_min}) must be <= rate_max ({self.rate_max})")
        return self


class ElectraConfig(Section):
    """ELECTRA replaced-token detection: a small MLM generator feeds a discriminator over all tokens."""

    generator_fraction: float = Field(default=0.25, gt=0, le=1, description="Generator hidden/FFN size as a fraction of the discriminator's.",
        json_schema_extra={"effect": "output"})
    disc_weight: float = Field(default=50.0, gt=0, description="Weight λ of the discriminator loss (ELECTRA: 50).",
        json_schema_extra={"effect": "output"})


class DistributedConfig(Section):
    """Multi-process training through torchrun (gloo on CPU, nccl on GPU)."""

    nproc_per_node: int = Field(default=1, ge=1, description="Processes per node; 1 = run in-process without torchrun.",
        json_schema_extra={"effect": "output"})
    nnodes: int = Field(default=1, ge=1, description="Nodes (multi-node uses the rendezvous below).",
        json_schema_extra={"effect": "output"})
    node_rank: int = Field(default=0, ge=0, description="This node's rank (static rendezvous).",
        json_schema_extra={"effect": "none"})
    rdzv_endpoint: str | None = Field(default=None, description="host:port of the rendezvous (multi-node), e.g. 10.0.0.1:29400.",
        json_schema_extra={"effect": "none"})
    rdzv_backend: Literal["c10d", "static"] = Field(default="c10d", description="torchrun rendezvous backend.",
        json_schema_extra={"effect": "none"})
    backend: Literal["auto", "gloo", "nccl"] = Field(default="auto", description="auto: nccl on GPU, gloo on CPU.",
        json_schema_extra={"effect": "none"})
    fsdp: bool = Field(default=False, description="Shard parameters with FSDP2 (fully_shard) for models that do not fit one device.",
        json_schema_extra={"effect": "none"})
    timeout_s: int = Field(default=600, ge=10, description="Collective timeout; a hung rank fails the stage after this.",
        json_schema_extra={"effect": "none"})

    @model_validator(mode="after")
    def _multi_node_needs_endpoint(self):
        # without it every node would start its own standalone group and wait for the others forever
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError(f"pretrain.distributed.rdzv_endpoint is required when nnodes is {self.nnodes} "
                             "(host:port of the rendezvous every node joins, e.g. 10.0.0.1:29400)")
        return self


class PretrainConfig(Section):
    """Masked-language-model pretraining."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Encoder architecture.")
    masking: MaskingConfig = Field(default_factory=MaskingConfig, description="Corruption of the input.")
    init_from: str | None = Field(
        default=None, description="Continue pretraining an existing model instead of a fresh one: a local Hugging Face "
        "folder (BertForMaskedLM, RobertaForMaskedLM, XLMRobertaForMaskedLM, ElectraForPreTraining + generator; "
        "safetensors only), a model folder this pipeline wrote, or models:/NAME@ALIAS / models:/NAME/VERSION. The "
        "architecture, special tokens and max positions come from it (a contradicting pretrain.model value is an "
        "error naming both); the export goes back to the same family. Its content hash enters the fingerprint.",
        json_schema_extra={"effect": "output"})
    objective: Literal["mlm", "electra"] = Field(default="mlm", description="mlm, or ELECTRA replaced-token detection.",
        json_schema_extra={"effect": "output"})
    electra: ElectraConfig = Field(default_factory=ElectraConfig, description="ELECTRA options (objective: electra).")
    label_smoothing: float = Field(default=0.0, ge=0, lt=1, description="Label smoothing ε of the MLM cross-entropy.",
        json_schema_extra={"effect": "output"})
    steps: int = Field(default=200, ge=1, description="Optimizer steps.", json_schema_extra={"effect": "output"})
    batch_size: int = Field(default=32, ge=1, description="Sequences per micro-batch per process.",
        json_schema_extra={"effect": "output"})
    seed: int | None = Field(
        default=None, description="Seed of training only: initialization, masking, data order, dropout (and the "
        "evaluate stage's transfer fine-tuning). None: the global `seed`. Sweeps vary this one, so runs that differ "
        "only in it share the tokenizer and shards.", json_schema_extra={"effect": "output"})
    grad_accum: int = Field(default=1, ge=1, description="Micro-batches accumulated per optimizer step.",
        json_schema_extra={"effect": "output"})
    lr: float = Field(default=5e-4, gt=0, description="Peak learning rate (AdamW).",
        json_schema_extra={"effect": "output"})
    weight_decay: float = Field(default=0.01, ge=0, description="AdamW weight decay (never on norms and biases).",
        json_schema_extra={"effect": "output"})
    betas: tuple[float, float] = Field(default=(0.9, 0.98), description="AdamW betas.",
        json_schema_extra={"effect": "output"})
    warmup_steps: int = Field(default=20, ge=0, description="Linear warmup steps.",
        json_schema_extra={"effect": "output"})
    decay: Literal["linear", "cosine", "constant"] = Field(default="linear", description="Learning-rate decay after warmup.",
        json_schema_extra={"effect": "output"})
    clip_norm: float | None = Field(default=1.0, gt=0, description="Gradient clipping max norm (None: off).",
        json_schema_extra={"effect": "output"})
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto", description="auto: bf16 autocast on GPU, fp32 on CPU (bf16 matmul is ~150x slower on these CPUs).",
        json_schema_extra={"effect": "output"})
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="auto: cuda when available.",
        json_schema_extra={"effect": "none"})
    log_every: int = Field(default=10, ge=1, description="Steps between metric logs (loss, lr, masking rate, tokens/s, MFU).",
        json_schema_extra={"effect": "none"})
    eval_every: int = Field(default=100, ge=1, description="Steps between per-language validation passes.",
        json_schema_extra={"effect": "report"})
    eval_batches: int = Field(default=4, ge=1, description="Validation batches per language per pass.",
        json_schema_extra={"effect": "report"})
    checkpoint_every: int = Field(default=100, ge=1, description="Steps between checkpoints (one more at the end).",
        json_schema_extra={"effect": "none"})
    keep_checkpoints: int = Field(default=2, ge=1, description="Complete checkpoints kept (oldest deleted).",
        json_schema_extra={"effect": "none"})
    compile: Literal["auto", "on", "off"] = Field(
        default="auto", description="torch.compile the training forward (fixed masked-position budget: one graph, "
        "no recompiles). auto: on for one process on CUDA or a CPU with a C++ compiler, when the run has at least "
        "2000 micro-batches (shorter runs finish sooner without the ~1 min compile); on: always (an error where "
        "it cannot run); off: eager. Speed only: losses agree with eager to float rounding (on CUDA the "
        "compiled run draws other dropout masks). Off under torchrun.", json_schema_extra={"effect": "none"})
    peak_flops: float | None = Field(
        default=None, gt=0, description="Declared peak FLOP/s per process for the MFU estimate (default: 175e9 on CPU, "
        "989e12 bf16 on H100/H200-class GPUs).", json_schema_extra={"effect": "none"})
    distributed: DistributedConfig = Field(default_factory=DistributedConfig, description="torchrun options.")
    bias_regularizer: BiasRegularizerConfig | None = Field(
        default=None, description="Group-mean regularizer against bias, added to the loss (None: off).",
        json_schema_extra={"omit_default": True})

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_yaml_bool(cls, v):
        # YAML 1.1 (PyYAML) reads a bare on/off as true/false
        return ("on" if v else "off") if isinstance(v, bool) else v


class FinetuneConfig(Section):
    """Fine-tuning for zero-shot transfer (XTREME protocol: source language only)."""

    lr: float = Field(default=1e-3, gt=0, description="Peak learning rate of the task head and top layer.",
        json_schema_extra={"effect": "output"})
    epochs: int = Field(default=5, ge=1, description="Maximum epochs over the source training data.",
        json_schema_extra={"effect": "output"})
    batch_size: int = Field(default=32, ge=1, description="Examples per step.", json_schema_extra={"effect": "output"})
    layer_decay: float = Field(default=0.9, gt=0, le=1, description="Layer-wise LR decay α: η_l = η·α^(L−l) (1 = off).",
        json_schema_extra={"effect": "output"})
    adapters: bool = Field(default=False, description="Train bottleneck adapters h + W_up·ReLU(W_down·h) on a frozen encoder.",
        json_schema_extra={"effect": "output"})
    adapter_dim: int = Field(default=32, ge=1, description="Adapter bottleneck size.",
        json_schema_extra={"effect": "output"})
    l2sp: float = Field(default=0.0, ge=0, description="L2-SP penalty λ·‖θ − θ₀‖² toward the pretrained weights (0 = off).",
        json_schema_extra={"effect": "output"})
    patience: int = Field(default=2, ge=1, description="Early stopping: epochs without improvement on the source validation split.",
        json_schema_extra={"effect": "output"})
    max_train_examples: int | None = Field(default=2000, ge=1, description="Cap on source training examples (None = all).",
        json_schema_extra={"effect": "output"})
    primary_metric: Literal["accuracy", "macro_f1"] = Field(
        default="accuracy", description="The metric early stopping maximizes on the held-out split or fold.",
        json_schema_extra={"effect": "output"})
    cv: bool = Field(default=False, description="Sentence classification, for small source sets: also run stratified "
        "k-fold cross-validation on the source training file (fold i tests, fold i+1 is early stopping's held-out fold, "
        "the rest train); reports mean ± std of accuracy and macro-F1 over the folds.", json_schema_extra={"effect": "output"})
    cv_folds: int = Field(default=5, ge=3, description="k of the cross-validation.", json_schema_extra={"effect": "output"})


class TransferTask(Section):
    """One zero-shot task: a source-language training file and target-language evaluation files."""

    source_lang: str = Field(default="en", description="The only language seen in fine-tuning.",
        json_schema_extra={"effect": "output"})
    train: str = Field(description="Source training file (CoNLL-U for upos; TSV/JSONL with text,label for classification), "
                       "relative to the config file.", json_schema_extra={"effect": "output"})
    dev: str | None = Field(default=None, description="Source validation file for early stopping (default: 10% of train).",
        json_schema_extra={"effect": "output"})
    targets: dict[str, str] = Field(default_factory=dict, description="Target language -> evaluation file.",
        json_schema_extra={"effect": "output"})


class EvaluateConfig(Section):
    """Per-language intrinsic metrics and zero-shot cross-lingual transfer."""

    max_sequences: int = Field(default=64, ge=1, description="Held-out sequences per language for masked-token metrics.",
        json_schema_extra={"effect": "output"})
    pll_sentences: int = Field(default=40, ge=0, description="Sentences per language for pseudo-perplexity (0 = skip).",
        json_schema_extra={"effect": "output"})
    pll_batch: int = Field(default=64, ge=1, description="Masked copies per forward pass when scoring pseudo-log-likelihood.",
        json_schema_extra={"effect": "none"})
    ece_bins: int = Field(default=15, ge=2, description="Equal-width bins of the expected calibration error.",
        json_schema_extra={"effect": "output"})
    upos: TransferTask | None = Field(default=None, description="UPOS tagging transfer (CoNLL-U files).")
    classification: TransferTask | None = Field(default=None, description="Sentence classification transfer (TSV/JSONL text,label).")
    retrieval: dict[str, str] | None = Field(
        default=None, description="Parallel-sentence retrieval: language -> file of aligned sentences (one per line, "
        "or a JSONL with id,lang,text); every language is paired with the first.",
        json_schema_extra={"effect": "output"})
    retrieval_layer: int = Field(default=-1, description="Hidden layer mean-pooled for retrieval (-1 = last).",
        json_schema_extra={"effect": "output"})
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig, description="Fine-tuning options.")
    efficiency: bool = Field(default=False, description="Measure parameters, latency at batch 1 (p50/p95), throughput at "
        "batch 32 and peak memory at seq_len 128 and 512 of the model, on the device named in the report (and the model "
        "card; the efficiency gates need it). Off by default: timings differ from run to run and machine to machine, so "
        "with it on the evaluate output and the model card are no longer byte-reproducible.",
        json_schema_extra={"effect": "output"})
    efficiency_repeats: int = Field(default=5, ge=1, description="Timed forward passes per latency / throughput figure "
        "(after one warm-up pass); more = steadier percentiles, longer evaluate.", json_schema_extra={"effect": "output"})
    efficiency_device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="Device the efficiency figures "
        "are measured on (auto: CUDA when available, else CPU).", json_schema_extra={"effect": "output"})


class AuditConfig(Section):
    """Bias audits: CrowS-Pairs-style pairs and masked-slot templates."""

    crows_pairs: dict[str, str] = Field(default_factory=dict, description="Language -> CrowS-Pairs CSV "
                                        "(sent_more,sent_less,stereo_antistereo,bias_type).",
        json_schema_extra={"effect": "output"})
    templates: dict[str, str] = Field(default_factory=dict, description="Language -> template YAML "
                                      "(templates with {group} and [MASK], groups, neutral, attributes).",
        json_schema_extra={"effect": "output"})


class GatesConfig(Section):
    """Promotion gates: the model moves to alias `champion` only when every declared gate passes."""

    min_top1: float | None = Field(default=None, ge=0, le=1, description="Minimum masked-token top-1 accuracy in every language.",
        json_schema_extra={"effect": "output"})
    min_top1_over_baseline: float | None = Field(
        default=0.0, description="Minimum top-1 margin over the unigram-frequency baseline in every language.",
        json_schema_extra={"effect": "output"})
    top1_over_baseline_ci_above: float | None = Field(
        default=None, ge=-1, lt=1, description="The lower end of the bootstrap 95% interval of (top-1 − unigram "
        "baseline top-1), at the same masked positions, must be strictly above this value in every language "
        "(0 = the model beats the baseline beyond sampling noise of the validation documents).",
        json_schema_extra={"effect": "output"})
    max_ece: float | None = Field(default=None, ge=0, le=1, description="Maximum expected calibration error in every language.",
        json_schema_extra={"effect": "output"})
    max_crows_deviation: float | None = Field(default=None, ge=0, le=50, description="Maximum |CrowS-Pairs score − 50| in every audited language.",
        json_schema_extra={"effect": "output"})
    max_transfer_gap: float | None = Field(default=None, ge=0, description="Maximum zero-shot transfer gap (source − target score).",
        json_schema_extra={"effect": "output"})
    min_rtd_acc_over_baseline: float | None = Field(
        default=None, ge=-1, le=1, description="ELECTRA: minimum margin of the discriminator's replaced-token "
        "detection accuracy over predicting 'original' everywhere, in every language (fraction of tokens). "
        "A model without a discriminator fails it.", json_schema_extra={"effect": "output"})
    min_rtd_auc: float | None = Field(
        default=None, ge=0, le=1, description="ELECTRA: minimum ROC AUC of the discriminator's replaced-token "
        "logits on held-out rows, in every language (0.5 = chance).", json_schema_extra={"effect": "output"})
    max_p95_latency_ms: float | None = Field(default=None, gt=0, description="Maximum p95 inference latency at batch 1 "
        "(ms; evaluate's efficiency report, on the device it names).", json_schema_extra={"effect": "output"})
    min_throughput: float | None = Field(default=None, gt=0, description="Minimum inference throughput at batch 32 "
        "(sequences/s).", json_schema_extra={"effect": "output"})
    max_peak_memory_mb: float | None = Field(default=None, gt=0, description="Maximum peak inference memory (MB) at the "
        "longest measured seq_len (512, or 128 when the model is shorter).", json_schema_extra={"effect": "output"})
    max_parameters: int | None = Field(default=None, ge=1, description="Maximum number of model parameters.",
        json_schema_extra={"effect": "output"})


class RegistryConfig(Section):
    """The MLflow model registry: where trained models are registered and when they are promoted."""

    model_name: str = Field(default="mlm-model", description="Registered model name.",
        json_schema_extra={"effect": "output"})
    gates: GatesConfig = Field(default_factory=GatesConfig, description="Promotion gates.")


class TrackingConfig(Section):
    """MLflow tracking: where runs, metrics and artifacts go."""

    uri: str | None = Field(
        default=None,
        description="MLflow tracking URI (http://host:port or sqlite:///path). Default: a SQLite file in the workdir.",
        json_schema_extra={"effect": "none"})
    experiment: str = Field(default="mlm-pipeline", description="MLflow experiment name.",
        json_schema_extra={"effect": "none"})
    enabled: bool = Field(default=True, description="Log to MLflow at all.", json_schema_extra={"effect": "none"})


class ExecutionConfig(Section):
    """Where the partitions of the data stages (normalize, shards) run: speed only, outputs are byte-identical
    whatever is set here (docs/SCALING.md)."""

    engine: Literal["local", "dask"] = Field(
        default="local", description="local: this process's own pool (normalize.workers / shards.workers); "
        "dask: every partition is a Prefect task on prefect-dask's DaskTaskRunner (a cluster at `address`, else "
        "a LocalCluster of `workers` processes). Workers must see the workdir (shared filesystem).",
        json_schema_extra={"effect": "none"})
    address: str | None = Field(
        default=None, description="engine dask: the scheduler of an existing cluster, e.g. tcp://10.0.0.5:8786 "
        "(unset: a LocalCluster on this machine). Ignored, with a warning, by engine local.",
        json_schema_extra={"effect": "none"})
    workers: int = Field(default=2, ge=1, description="engine dask without address: LocalCluster worker processes "
                         "(one thread each).", json_schema_extra={"effect": "none"})
    partition_mb: float = Field(
        default=64, gt=0, description="Large inputs are split into partitions of about this many MiB (normalize: "
        "by file and byte range; shards: by language and run of documents), each processed independently.",
        json_schema_extra={"effect": "none"})


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

