"""Config sections of the evaluate stage (intrinsic metrics, zero-shot transfer and its fine-tuning) and the audit
stage, split out of ``mlm_core.config`` (re-exported there; the effect markers are explained in its docstring).

Like ``mlm_core.config`` this module is a leaf.
"""
from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, with_config
from typing_extensions import NotRequired, TypedDict

from mlm_core.config.effects import Section


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
    threads: int = Field(default=1, ge=1, description="Torch intra-op CPU threads while fine-tuning and predicting "
        "(the caller's count is restored after). CPU matrix products sum in a thread-dependent order, so the "
        "fine-tuned weights, hence the scores and predictions, are byte-identical across processes only for the "
        "same count: it is part of the output. 1 = the same bytes on any machine with the same CPU kernels; more = "
        "faster on a many-core machine.", json_schema_extra={"effect": "output", "omit_default": True})


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
    span_fill: bool = Field(default=False, description="Also score span filling on the same held-out rows: spans "
        "of 2-4 whole words (never across [SEP]) masked together and predicted in one pass, a span counting only when "
        "every token is the top-1 (span_exact per language, with the unigram baseline span_baseline_exact and the "
        "per-document counts in span_documents.parquet; mlm_core.evaluate.span_fill). The span-sensitive metric "
        "SpanBERT's claim needs (issue 21).", json_schema_extra={"effect": "output", "omit_default": True})
    upos: TransferTask | None = Field(default=None, description="UPOS tagging transfer (CoNLL-U files).")
    classification: TransferTask | None = Field(default=None, description="Sentence classification transfer (TSV/JSONL text,label).")
    retrieval: dict[str, str] | None = Field(
        default=None, description="Parallel-sentence retrieval: language -> file of aligned sentences (one per line, "
        "or a JSONL with id,lang,text); every language is paired with the first.",
        json_schema_extra={"effect": "output"})
    retrieval_layer: int = Field(default=-1, description="Hidden layer mean-pooled for retrieval (-1 = last).",
        json_schema_extra={"effect": "output"})
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig, description="Fine-tuning options.")
    untrained_control: bool = Field(default=True, description="Every transfer task (upos, classification) also "
        "fine-tunes the untrained encoder (the same architecture initialised with the run's training seed, as "
        "pretraining starts at step 0; no pretraining), the same way, and reports per target untrained_score and "
        "gain_over_untrained = score − untrained_score with a 95% paired bootstrap interval over target sentences "
        "(gate: registry.gates.min_transfer_gain_over_untrained). Doubles the fine-tuning time.",
        json_schema_extra={"effect": "output", "omit_default": True})
    efficiency: bool = Field(default=False, description="Measure parameters, latency at batch 1 (p50/p95), throughput at "
        "batch 32 and peak memory at seq_len 128 and 512 of the model, on the device named in the report (and the model "
        "card; the efficiency gates need it). Off by default: timings differ from run to run and machine to machine, so "
        "with it on the evaluate output and the model card are no longer byte-reproducible.",
        json_schema_extra={"effect": "output"})
    efficiency_repeats: int = Field(default=5, ge=1, description="Timed forward passes per latency / throughput figure "
        "(after one warm-up pass); more = steadier percentiles, longer evaluate.", json_schema_extra={"effect": "output"})
    efficiency_device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="Device the efficiency figures "
        "are measured on (auto: CUDA when available, else CPU).", json_schema_extra={"effect": "output"})


@with_config(ConfigDict(extra="forbid"))
class AuditFile(TypedDict):
    """One audit file with its text encoding: ``{path: crows_nl.csv, encoding: mac_roman}`` (a plain path string
    means UTF-8). A mapping, not a section: the entry's value goes into the audit fingerprint as written, so a
    plain path string keeps the fingerprint it had."""

    path: str
    encoding: NotRequired[str]


def _check_codecs(v: dict) -> dict:
    import codecs
    for lang, entry in v.items():
        enc = entry.get("encoding", "utf-8") if isinstance(entry, dict) else "utf-8"
        try:
            codecs.lookup(enc)
        except LookupError:
            raise ValueError(f"{lang}.encoding: unknown text encoding {enc!r} (a Python codec name: utf-8, "
                             f"mac_roman, cp1252, latin-1...)") from None
    return v


def audit_file(entry: "str | AuditFile") -> tuple[str, str]:
    """(path, encoding) of an ``audit.crows_pairs`` / ``audit.templates`` entry (a plain path: UTF-8)."""
    return (entry, "utf-8") if isinstance(entry, str) else (entry["path"], entry.get("encoding", "utf-8"))


class AuditConfig(Section):
    """Bias audits: CrowS-Pairs-style pairs and masked-slot templates. Each file is a path, or
    ``{path: ..., encoding: mac_roman}`` for a file that is not UTF-8."""

    crows_pairs: dict[str, str | AuditFile] = Field(default_factory=dict, description="Language -> CrowS-Pairs CSV "
                                        "(sent_more,sent_less,stereo_antistereo,bias_type): a path, or "
                                        "{path, encoding} for a file that is not UTF-8.",
        json_schema_extra={"effect": "output"})
    templates: dict[str, str | AuditFile] = Field(default_factory=dict, description="Language -> template YAML "
                                      "(templates with {group} and [MASK], groups, neutral, attributes): a path, "
                                      "or {path, encoding}.",
        json_schema_extra={"effect": "output"})

    @field_validator("crows_pairs", "templates")
    @classmethod
    def _codecs(cls, v: dict) -> dict:
        return _check_codecs(v)

    def files(self) -> list[tuple[str, str, str, str]]:
        """(key path, language, path, encoding) of every audit file, CrowS-Pairs first, languages sorted."""
        return [(f"audit.{key}.{lang}", lang, *audit_file(entry)) for key in ("crows_pairs", "templates")
                for lang, entry in sorted(getattr(self, key).items())]
