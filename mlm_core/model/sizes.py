"""Named encoder shapes and the resolved architecture of one model.

In: a ``ModelConfig`` (named size + optional overrides), the tokenizer's vocabulary size and pad id.
Out: an ``Arch``, a frozen plain value that fully describes the network (it is stored next to the
weights, so a model can be rebuilt without the pipeline config).

Reference shapes: BERT (Devlin et al., 2019): base = 12 layers, hidden 768, 12 heads, FFN 3072.
ELECTRA (Clark et al., 2020) shrinks the generator's width by a factor (``scale``).
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
        if not 0 <= self.pad_id < self.vocab_size:
            raise ArchError(f"pad_id {self.pad_id} is outside the vocabulary (size {self.vocab_size})")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def emb_dim(self) -> int:
        """Width of the embedding tables and of the MLM head's output (E)."""
        return self.embedding_size if self.embedding_size is not None else self.hidden

    def to_dict(self) -> dict:
        """Plain dict; ``embedding_size`` only when set, so a BERT Arch stored before it existed still matches."""
        d = asdict(self)
        if d["embedding_size"] is None:
            del d["embedding_size"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Arch":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ArchError(f"unknown architecture field(s) {unknown}; known: {sorted(known)}")
        return cls(**d)


def _round_to(x: float, multiple: int) -> int:
    """Nearest positive multiple of ``multiple``."""
    return max(multiple, int(round(x / multiple)) * multiple)


def resolve_arch(cfg: ModelConfig, vocab_size: int, pad_id: int, scale: float = 1.0) -> Arch:
    """The concrete architecture: the named size fills every field the config leaves unset.

    ``scale`` < 1 shrinks the width (ELECTRA generator): hidden x scale rounded to a multiple of the
    head count (of 2 x heads for rotary, so the head size stays even), ffn x scale; layers and heads kept.
    """
    if not 0 < scale <= 1:
        raise ArchError(f"scale must be in (0, 1], got {scale}")
    base = SIZES[cfg.size]
    hidden = cfg.hidden if cfg.hidden is not None else base["hidden"]
    heads = cfg.heads if cfg.heads is not None else base["heads"]
    # an explicit hidden without an explicit ffn gets the BERT ratio (4 x hidden), not the size's ffn
    ffn = cfg.ffn if cfg.ffn is not None else (4 * hidden if cfg.hidden is not None else base["ffn"])
    if scale != 1.0:
        hidden = _round_to(hidden * scale, heads * (2 if cfg.position == "rotary" else 1))
        ffn = max(8, int(round(ffn * scale)))
    return Arch(layers=cfg.layers if cfg.layers is not None else base["layers"], hidden=hidden, heads=heads, ffn=ffn,
                dropout=cfg.dropout, max_positions=cfg.max_positions, position=cfg.position, norm=cfg.norm,
                tie_embeddings=cfg.tie_embeddings, vocab_size=vocab_size, pad_id=pad_id)
