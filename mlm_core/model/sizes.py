"""Named encoder shapes and the resolved architecture of one model.

In: a ``ModelConfig`` (named size + optional overrides), the tokenizer's vocabulary size and pad id.
Out: an ``Arch``, a frozen plain value that fully describes the network (it is stored next to the
weights, so a model can be rebuilt without the pipeline config).

Reference shapes: BERT (Devlin et al., 2019): base = 12 layers, hidden 768, 12 heads, FFN 3072.
ELECTRA (Clark et al., 2020) shrinks the generator's width by a factor (``scale``).
ModernBERT (Warner et al., 2024; ``family: modernbert``): base = 22 layers, hidden 768, 12 heads, GeGLU inner
width 1152 (1.5 x hidden; Wi projects to twice that), the smaller names keep BERT's depth and width with that
ratio.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from mlm_core.config import ModelConfig
from mlm_core.errors import MlmError

SIZES: dict[str, dict] = {
    # tiny: trains in seconds on a laptop CPU; for tests and smoke runs (~0.4M non-embedding params)
    "tiny": {"layers": 2, "hidden": 128, "heads": 2, "ffn": 512},
    # small: a real-but-cheap model, minutes per thousand steps on CPU (~3.2M non-embedding params)
    "small": {"layers": 4, "hidden": 256, "heads": 4, "ffn": 1024},
    # base: BERT-base (~85M non-embedding params, ~110M with a 30k vocabulary); wants a GPU
    "base": {"layers": 12, "hidden": 768, "heads": 12, "ffn": 3072},
}
# family modernbert: the GeGLU inner width is 1.5 x hidden (ModernBERT-base: 768 -> 1152), which keeps the FFN's
# parameter count near BERT's 4 x hidden MLP (3 matrices of 1.5 H^2 vs 2 of 4 H^2)
MODERNBERT_SIZES: dict[str, dict] = {
    "tiny": {"layers": 2, "hidden": 128, "heads": 2, "ffn": 192},
    "small": {"layers": 4, "hidden": 256, "heads": 4, "ffn": 384},
    "base": {"layers": 22, "hidden": 768, "heads": 12, "ffn": 1152},     # ModernBERT-base
}
MODERNBERT_FFN_RATIO = 1.5
# ModernBERT's rotary bases (transformers' ModernBertConfig.default_theta): global layers 160k, local ones 10k
MODERNBERT_THETA = {"global": 160_000.0, "local": 10_000.0}


# transformers' hidden_act names the encoder implements (mlm_core.model.encoder.activation_fn)
ACTIVATIONS = ("gelu", "gelu_python", "gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_fast",
               "gelu_accurate", "quick_gelu", "gelu_10", "relu", "relu6", "silu", "swish", "tanh", "mish", "sigmoid")
# roformer: a rotary post-LN BERT (RoFormerForMaskedLM); modernbert: ModernBertForMaskedLM (pre-LN, GeGLU, no
# biases, no token types, alternating local/global attention with its two rotary bases)
FAMILIES = ("bert", "roberta", "xlm-roberta", "electra", "roformer", "modernbert")
# fields that ``to_dict`` leaves out at their default (added after models were stored without them)
_OPTIONAL = ("embedding_size", "ln_eps", "activation", "position_offset", "type_vocab_size", "family", "attention",
             "window", "global_every", "rope_theta", "local_rope_theta")
ATTENTIONS = ("global", "local_global")


class ArchError(MlmError, ValueError):
    """An architecture that cannot be built (heads not dividing hidden, odd rotary head size...)."""


@dataclass(frozen=True)
class Arch:
    """Everything needed to build an ``MLMEncoder``; saved as JSON beside the weights."""

    layers: int            # transformer blocks
    hidden: int            # model width H
    heads: int             # attention heads; head size = hidden // heads
    ffn: int               # feed-forward inner width (BERT: 4 x hidden)
    dropout: float         # on embeddings, attention probabilities, attention output and FFN output
    max_positions: int     # longest sequence the position encoding covers
    position: str          # learned | sinusoidal | rotary
    norm: str              # post (BERT) | pre (LayerNorm before each sublayer + a final LayerNorm)
    tie_embeddings: bool   # MLM decoder weight = word embeddings
    vocab_size: int        # from the tokenizer artifact
    pad_id: int            # from the tokenizer artifact; its embedding row starts at zero
    # width E of the embedding tables when it differs from ``hidden`` (an ELECTRA generator reads the
    # discriminator's embeddings: E = the discriminator's width, projected to its own width, as
    # transformers' ElectraConfig.embedding_size); None = hidden (BERT)
    embedding_size: int | None = None
    # Imported checkpoints (mlm_core.model.pretrained). Defaults = this pipeline's own BERT layout; ``to_dict``
    # leaves a field out at its default, so the stored JSON of a model built before these existed is unchanged.
    ln_eps: float = 1e-12          # every LayerNorm's epsilon (config.layer_norm_eps; RoBERTa / XLM-R: 1e-5)
    activation: str = "gelu"       # FFN activation, transformers' hidden_act name (ACTIVATIONS)
    position_offset: int = 0       # first position id (RoBERTa / XLM-R: padding_idx + 1); table = max_positions + offset rows
    type_vocab_size: int = 1       # rows of the token-type table (kept for the export; the forward uses row 0)
    family: str = "bert"           # transformers family the export writes (FAMILIES); also picks the MLM head's activation
    # local/global attention (mlm_core.model.attention); window / global_every stay at their defaults for global
    attention: str = "global"      # global (BERT) | local_global: sliding windows but in every global_every-th layer
    window: int = 128              # local layers: a query sees keys with |i - j| <= window / 2
    global_every: int = 3          # layers k, 2k, ... (counted from 1) stay global; modernbert: layers 0, k, 2k, ...
    # rotary bases: every layer's (BERT rotary, RoFormer); modernbert: the global layers' and the local layers'
    rope_theta: float = 10_000.0
    local_rope_theta: float = 10_000.0

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ArchError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.position not in ("learned", "sinusoidal", "rotary"):
            raise ArchError(f"unknown position encoding {self.position!r} (learned, sinusoidal, rotary)")
        if self.norm not in ("post", "pre"):
            raise ArchError(f"unknown norm placement {self.norm!r} (post, pre)")
        if self.position == "rotary" and self.head_dim % 2:
            raise ArchError(f"rotary position encoding needs an even head size, got {self.head_dim} "
                            f"(hidden {self.hidden} / heads {self.heads})")
        if self.embedding_size is not None and self.embedding_size < 1:
            raise ArchError(f"embedding_size must be positive, got {self.embedding_size}")
        if self.activation not in ACTIVATIONS:
            raise ArchError(f"unknown activation {self.activation!r} ({', '.join(ACTIVATIONS)})")
        if self.family not in FAMILIES:
            raise ArchError(f"unknown model family {self.family!r} ({', '.join(FAMILIES)})")
        if self.position_offset < 0 or (self.position_offset and self.position != "learned"):
            raise ArchError(f"position_offset {self.position_offset} needs learned positions and must be >= 0")
        if self.family in ("roberta", "xlm-roberta") and self.position_offset != self.pad_id + 1:
            raise ArchError(f"a {self.family} model's positions start at pad_id + 1 = {self.pad_id + 1}, "
                            f"not {self.position_offset}")
        if self.type_vocab_size < 1 or not self.ln_eps > 0:
            raise ArchError(f"type_vocab_size ({self.type_vocab_size}) must be >= 1 and ln_eps ({self.ln_eps}) > 0")
        if self.attention not in ATTENTIONS:
            raise ArchError(f"unknown attention {self.attention!r} ({', '.join(ATTENTIONS)})")
        if self.window < 2 or self.window % 2 or self.global_every < 1:
            raise ArchError(f"window ({self.window}) must be even and >= 2, global_every ({self.global_every}) >= 1")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ArchError(f"pad_id {self.pad_id} is outside the vocabulary (size {self.vocab_size})")
        if not (self.rope_theta > 0 and self.local_rope_theta > 0):
            raise ArchError(f"rope_theta ({self.rope_theta}) and local_rope_theta ({self.local_rope_theta}) "
                            "must be > 0")
        # the families whose layout is fixed by transformers' class: anything else would not be that class
        if self.family == "roformer" and (self.position, self.norm, self.attention) != ("rotary", "post", "global"):
            raise ArchError(f"a roformer model is rotary, post-LN and global (got position {self.position}, norm "
                            f"{self.norm}, attention {self.attention})")
        if self.family == "modernbert" and (self.position, self.norm, self.emb_dim, self.position_offset) != (
                "rotary", "pre", self.hidden, 0):
            raise ArchError(f"a modernbert model is rotary and pre-LN with embeddings as wide as hidden (got position "
                            f"{self.position}, norm {self.norm}, embedding_size {self.embedding_size})")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def emb_dim(self) -> int:
        """Width of the embedding tables and of the MLM head's output (E)."""
        return self.embedding_size if self.embedding_size is not None else self.hidden

    @property
    def head_activation(self) -> str:
        """The MLM head's activation, as transformers 5.24 computes it: BERT's and RoFormer's head use hidden_act;
        RoBERTa's and XLM-R's ``lm_head`` and ELECTRA's generator head always use exact (erf) GELU; ModernBERT's
        head uses classifier_activation (gelu: the import refuses another)."""
        return self.activation if self.family in ("bert", "roformer") else "gelu"

    @property
    def modern(self) -> bool:
        """ModernBERT's layer: GeGLU FFN, no biases (LayerNorm included), no token-type table, no LayerNorm
        before the first layer's attention (the embedding norm precedes it), layer 0 global."""
        return self.family == "modernbert"

    def to_dict(self) -> dict:
        """Plain dict; a field added after the first stored models only when it differs from its default, so
        a BERT Arch stored before it existed still matches (same JSON, same safetensors metadata)."""
        d = asdict(self)
        for f in fields(self):
            if f.name in _OPTIONAL and d[f.name] == f.default:
                del d[f.name]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Arch":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ArchError(f"unknown architecture field(s) {unknown}; known: {sorted(known)}")
        return cls(**d)


def round_to(x: float, multiple: int) -> int:
    """Nearest positive multiple of ``multiple``."""
    return max(multiple, int(round(x / multiple)) * multiple)


def resolve_arch(cfg: ModelConfig, vocab_size: int, pad_id: int, scale: float = 1.0) -> Arch:
    """The concrete architecture: the named size fills every field the config leaves unset.

    ``scale`` < 1 shrinks the width (ELECTRA generator): hidden x scale rounded to a multiple of the
    head count (of 2 x heads for rotary, so the head size stays even), ffn x scale; layers and heads kept.
    """
    if not 0 < scale <= 1:
        raise ArchError(f"scale must be in (0, 1], got {scale}")
    modern = getattr(cfg, "family", "bert") == "modernbert"
    base = (MODERNBERT_SIZES if modern else SIZES)[cfg.size]
    hidden = cfg.hidden if cfg.hidden is not None else base["hidden"]
    heads = cfg.heads if cfg.heads is not None else base["heads"]
    # an explicit hidden without an explicit ffn gets the family's ratio (BERT 4 x hidden), not the size's ffn
    ratio = MODERNBERT_FFN_RATIO if modern else 4
    ffn = cfg.ffn if cfg.ffn is not None else (int(round(ratio * hidden)) if cfg.hidden is not None else base["ffn"])
    if scale != 1.0:
        hidden = round_to(hidden * scale, heads * (2 if cfg.position == "rotary" else 1))
        ffn = max(8, int(round(ffn * scale)))
    # window / global_every only for local_global: a global model's Arch (and stored JSON) stays BERT's
    local = {"attention": cfg.attention, "window": cfg.window, "global_every": cfg.global_every} \
        if cfg.attention == "local_global" else {}
    if modern:      # ModernBERT's fixed arithmetic (transformers' ModernBertConfig defaults)
        local |= {"family": "modernbert", "ln_eps": 1e-5, "rope_theta": MODERNBERT_THETA["global"],
                  "local_rope_theta": MODERNBERT_THETA["local"]}
    return Arch(layers=cfg.layers if cfg.layers is not None else base["layers"], hidden=hidden, heads=heads, ffn=ffn,
                dropout=cfg.dropout, max_positions=cfg.max_positions, position=cfg.position, norm=cfg.norm,
                tie_embeddings=cfg.tie_embeddings, vocab_size=vocab_size, pad_id=pad_id, **local)
