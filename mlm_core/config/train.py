"""Config sections of the pretrain stage (architecture, masking, ELECTRA, torchrun), split out of
``mlm_core.config`` (re-exported there; the effect markers are explained in its docstring).

Like ``mlm_core.config`` this module is a leaf.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from mlm_core.config.bias import BiasRegularizerConfig
from mlm_core.config.effects import Section


class ModelConfig(Section):
    """Encoder architecture (BERT family, or ModernBERT with ``family``). A named size fills every field left unset."""

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
        default="learned", description="Position encoding. sinusoidal exports as a fixed learned table; rotary (post-LN) exports as RoFormerForMaskedLM.",
        json_schema_extra={"effect": "output"})
    position_init: Literal["normal", "sinusoidal"] = Field(
        default="normal", description="position: learned only: the table's initial values. normal: BERT's "
        "N(0, 0.02); sinusoidal: Vaswani et al.'s table scaled to the same per-entry RMS (0.02), then learned: "
        "starts with a position signal the model can read at once and still exports to BERT.",
        json_schema_extra={"effect": "output", "omit_default": True})
    norm: Literal["post", "pre"] = Field(default="post", description="post-LN = BERT / RoFormer (exports); pre-LN trains more stably, no BERT export (family modernbert is pre-LN and exports).",
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
                        json_schema_extra={"effect": "output", "omit_default": True,
                                           "used_when": {"attention": "local_global"}})
    global_every: int = Field(default=3, ge=1, description="local_global: every k-th layer (k, 2k, ...; counted "
                              "from 1) is global, the others local (k > layers: every layer local).",
                              json_schema_extra={"effect": "output", "omit_default": True,
                                                 "used_when": {"attention": "local_global"}})
    family: Literal["bert", "modernbert"] = Field(
        default="bert", description="bert: the layout the fields above describe (post-LN learned or sinusoidal "
        "positions export as BertForMaskedLM, post-LN rotary as RoFormerForMaskedLM). modernbert: ModernBERT's layer "
        "(exports as ModernBertForMaskedLM): pre-LN, GeGLU FFN, no biases, no token types, rotary with base 160000 in "
        "global and 10000 in local layers, layers 0, k, 2k, ... global (k = global_every) and sliding windows of "
        "`window` in the others, ModernBERT's init; norm, position and attention default to pre, rotary and "
        "local_global (post or non-rotary is an error); the named sizes use ffn = 1.5 x hidden (base = "
        "ModernBERT-base: 22 layers, 768, 12 heads, 1152). ModernBERT's own checkpoints use dropout 0.0.",
        json_schema_extra={"effect": "output", "omit_default": True})

    @model_validator(mode="before")
    @classmethod
    def _modernbert_defaults(cls, data):
        # ModernBERT's layer is pre-LN, rotary and alternates local / global attention: family modernbert fills these
        # in as values unless given, so the fingerprint and a dumped config carry what the model is
        if isinstance(data, dict) and data.get("family") == "modernbert":
            data = {"norm": "pre", "position": "rotary", "attention": "local_global"} | data
        return data

    @model_validator(mode="after")
    def _heads(self) -> "ModelConfig":
        if self.hidden is not None and self.heads is not None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.position_init != "normal" and self.position != "learned":
            raise ValueError(f"position_init {self.position_init!r} initialises a learned position table; "
                             f"position is {self.position!r} (set position: learned, or drop position_init)")
        # ModernBERT keeps its window (128) whatever the context: a window wider than the sequence is then global
        wide = self.window > self.max_positions and self.family != "modernbert"
        if self.attention == "local_global" and (self.window % 2 or wide):
            raise ValueError(f"attention local_global: window ({self.window}) must be even and at most max_positions "
                             f"({self.max_positions}) (a wider window is global attention: set attention: global)")
        if self.family == "modernbert" and (self.norm, self.position) != ("pre", "rotary"):
            raise ValueError(f"family modernbert is pre-LN with rotary positions (ModernBERT's layer), but "
                             f"pretrain.model.norm = {self.norm!r}, pretrain.model.position = {self.position!r}: remove "
                             "them (family modernbert sets pre and rotary)")
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
        default="dynamic", description="static: fixed per sequence (seeded by sequence id), cycling through "
        "static_copies masks over the passes through the data (RoBERTa's static masking); dynamic: new each time a "
        "sequence is drawn.",
        json_schema_extra={"effect": "output"})
    static_copies: int = Field(
        default=10, ge=1, description="mode static only: k fixed masks per sequence, cycled over the passes through "
        "its language's rows (pass e uses copy e mod k; RoBERTa: 10 masks over 40 epochs). Copy 0 is the single "
        "static mask of earlier versions, so 1 reproduces those runs.",
        json_schema_extra={"effect": "output", "used_when": {"mode": "static"}})
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


class PlateauConfig(Section):
    """The plateau detector (``mlm_core.train.plateau``): from a declared share of the run on, every validation pass
    asks whether held-out [MASK]-only top-1 is still within the unigram baseline's interval (the 95% paired
    bootstrap interval of mask_acc - mask_baseline_acc reaches 0) in some language, i.e. the model still predicts
    token frequencies. It then says so loudly (a WARNING naming the measured fixes, the progress line, the MLflow
    tag ``plateau``, a ``plateau`` record in eval.json and the manifest). Reporting only: the weights never change."""

    after: float | None = Field(
        default=0.5, ge=0, le=1, description="Share of pretrain.steps after which a model at the baseline is on the "
        "plateau: the detector judges every validation pass at step >= after x steps (the last pass, at the final "
        "step, always counts). None: off.", json_schema_extra={"effect": "report"})
    stop_on_plateau: bool = Field(
        default=False, description="Stop training at the first validation pass that finds the plateau and fail "
        "the pretrain stage (an error naming the step and the figures; the checkpoint of that step is kept, so "
        "turning it off resumes there), so that a scheduled run never registers a frequency model. false: warn "
        "and train on.", json_schema_extra={"effect": "report"})


class PretrainConfig(Section):
    """Masked-language-model pretraining."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Encoder architecture.")
    masking: MaskingConfig = Field(default_factory=MaskingConfig, description="Corruption of the input.")
    init_from: str | None = Field(
        default=None, description="Continue pretraining an existing model instead of a fresh one: a local Hugging Face "
        "folder (BertForMaskedLM, RobertaForMaskedLM, XLMRobertaForMaskedLM, RoFormerForMaskedLM, "
        "ModernBertForMaskedLM, ElectraForPreTraining + generator; "
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
    threads: int | None = Field(
        default=None, ge=1, description="torch intra-op threads for CPU training (one process). None: "
        "$OMP_NUM_THREADS when set, else the cores not busy with other runnable tasks when training starts, at "
        "least 1 (mlm_core.train.threads): torch's default of one spinning thread per core ran 6x slower on a "
        "shared 2-core machine.", json_schema_extra={"effect": "none", "omit_default": True})
    peak_flops: float | None = Field(
        default=None, gt=0, description="Declared peak FLOP/s per process for the MFU estimate (default: 175e9 on CPU, "
        "989e12 bf16 on H100/H200-class GPUs).", json_schema_extra={"effect": "none"})
    distributed: DistributedConfig = Field(default_factory=DistributedConfig, description="torchrun options.")
    bias_regularizer: BiasRegularizerConfig | None = Field(
        default=None, description="Group-mean regularizer against bias, added to the loss (None: off).",
        json_schema_extra={"omit_default": True})
    plateau: PlateauConfig = Field(
        default_factory=PlateauConfig, description="Plateau detector: warn (or stop) when [MASK]-only accuracy "
        "is still within the unigram baseline's interval after a share of the run.",
        json_schema_extra={"omit_default": True})

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_yaml_bool(cls, v):
        # YAML 1.1 (PyYAML) reads a bare on/off as true/false
        return ("on" if v else "off") if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _modernbert_is_an_mlm(self) -> "PretrainConfig":
        # transformers has no ModernBERT ELECTRA pair: such a run could be neither exported nor read back
        if self.objective == "electra" and self.model.family == "modernbert":
            raise ValueError("pretrain.objective electra with pretrain.model.family modernbert: ModernBERT has no "
                             "ELECTRA layout in transformers; use objective mlm, or family bert")
        return self
