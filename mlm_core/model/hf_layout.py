"""The transformers layout of each supported family: config.json <-> Arch and state-dict names <-> ours.

One table (``LAYOUTS``) serves both directions: the export (``export``, ``export_electra``) writes with it
and the import (``pretrained``, ``load_export``) reads with it, so a name is never spelled twice. Names
and config keys are those of transformers 5.24 (checked by the tests against ``XForMaskedLM(cfg)``):

  family       class                   body prefix  MLM head (dense, LayerNorm, bias, decoder)
  bert         BertForMaskedLM         bert.        cls.predictions.transform.{dense,LayerNorm}, cls.predictions.bias,
                                                    cls.predictions.decoder  (head activation = hidden_act)
  roberta      RobertaForMaskedLM      roberta.     lm_head.{dense,layer_norm}, lm_head.bias, lm_head.decoder
                                                    (head activation = exact GELU; positions from padding_idx + 1)
  xlm-roberta  XLMRobertaForMaskedLM   roberta.     as roberta
  electra      ElectraForMaskedLM      electra.     generator_predictions.{dense,LayerNorm}, generator_lm_head
               (generator)                          (exact GELU); ElectraForPreTraining: discriminator_predictions.*
  roformer     RoFormerForMaskedLM     roformer.    as bert (head activation = hidden_act); no position table: the
                                                    rotary sin | cos table is ``encoder.embed_positions.weight``
                                                    (written from our formula, checked on import), and q / k rows
                                                    are permuted (``positions.roformer_permutation``)

A post-LN rotary model of this pipeline (family bert) exports as roformer (``export_family``); ModernBERT's
names share nothing with these and live in ``hf_modernbert``.

The decoder: tied (tie_word_embeddings) = the word embeddings, and transformers also ties BERT's / RoBERTa's
``decoder.bias`` to the head's ``bias``; untied, it reads ``decoder.weight`` and ``decoder.bias`` from the
file, so the export writes both and the import takes ``decoder.bias`` when present.
"""
from __future__ import annotations

import dataclasses

import torch

from mlm_core.model.positions import roformer_permutation, rotary_cos_sin
from mlm_core.model.sizes import Arch


@dataclasses.dataclass(frozen=True)
class Layout:
    architecture: str      # config.json "architectures"[0] of the MLM model
    model_type: str
    prefix: str            # the encoder body's prefix (base_model_prefix + ".")
    dense: str             # MLM head transform dense (H -> E)
    norm: str              # MLM head transform LayerNorm
    bias: str              # the output bias
    decoder: str           # the vocabulary projection (".weight"; ".bias" when decoder_bias)
    decoder_bias: bool     # a decoder.bias tensor tied to ``bias`` (BERT, RoBERTa), not the Linear's own (ELECTRA)
    pad_default: int       # transformers' default pad_token_id of the family's config class


LAYOUTS: dict[str, Layout] = {
    "bert": Layout("BertForMaskedLM", "bert", "bert.", "cls.predictions.transform.dense",
                   "cls.predictions.transform.LayerNorm", "cls.predictions.bias", "cls.predictions.decoder", True, 0),
    "roberta": Layout("RobertaForMaskedLM", "roberta", "roberta.", "lm_head.dense", "lm_head.layer_norm",
                      "lm_head.bias", "lm_head.decoder", True, 1),
    "xlm-roberta": Layout("XLMRobertaForMaskedLM", "xlm-roberta", "roberta.", "lm_head.dense", "lm_head.layer_norm",
                          "lm_head.bias", "lm_head.decoder", True, 1),
    "electra": Layout("ElectraForMaskedLM", "electra", "electra.", "generator_predictions.dense",
                      "generator_predictions.LayerNorm", "generator_lm_head.bias", "generator_lm_head", False, 0),
    "roformer": Layout("RoFormerForMaskedLM", "roformer", "roformer.", "cls.predictions.transform.dense",
                       "cls.predictions.transform.LayerNorm", "cls.predictions.bias", "cls.predictions.decoder", True,
                       0),
}
ROFORMER_TABLE = "encoder.embed_positions.weight"       # below the prefix
# RoBERTa-style position ids (padding_idx + 1 onwards)
OFFSET_FAMILIES = ("roberta", "xlm-roberta")
# ElectraForPreTraining's replaced-token head: ours -> transformers'
DISC_HEAD = {
    "rtd_dense.weight": "discriminator_predictions.dense.weight",
    "rtd_dense.bias": "discriminator_predictions.dense.bias",
    "rtd_out.weight": "discriminator_predictions.dense_prediction.weight",
    "rtd_out.bias": "discriminator_predictions.dense_prediction.bias",
}
# the encoder layer: ours -> transformers' (below "<prefix>encoder.layer.<i>."); q, k, v are fused in ours
_LAYER = (("attn.out", "attention.output.dense"), ("attn_norm", "attention.output.LayerNorm"),
          ("ffn_in", "intermediate.dense"), ("ffn_out", "output.dense"), ("ffn_norm", "output.LayerNorm"))
_EMB = (("tok_emb.weight", "embeddings.word_embeddings.weight"),
        ("type_emb.weight", "embeddings.token_type_embeddings.weight"),
        ("emb_norm.weight", "embeddings.LayerNorm.weight"), ("emb_norm.bias", "embeddings.LayerNorm.bias"))


def family_of_architecture(name: str) -> str | None:
    return next((f for f, lay in LAYOUTS.items() if lay.architecture == name), None)


def export_family(arch: Arch) -> str:
    """The transformers family a model exports as: its own, but a rotary BERT is RoFormer's network."""
    return "roformer" if arch.family == "bert" and arch.position == "rotary" else arch.family


def roformer_table(arch: Arch) -> torch.Tensor:
    """RoFormer's ``embed_positions`` [max_positions, head_dim]: sin of every pair's angle, then cos (its
    ``RoFormerSinusoidalPositionalEmbedding.create_weight``), from our rotary formula (same angles)."""
    cos, sin = rotary_cos_sin(arch.max_positions, arch.head_dim, arch.rope_theta)
    half = arch.head_dim // 2
    return torch.cat([sin[:, :half], cos[:, :half]], dim=-1)


def _qk_rows(arch: Arch, inverse: bool = False) -> torch.Tensor:
    """Rows of the fused qkv that give RoFormer's q, k, v (``inverse``: ours from RoFormer's); v is not rotated
    (rotary_value false) and keeps its order."""
    perm = roformer_permutation(arch.heads, arch.head_dim)
    if inverse:
        perm = torch.argsort(perm)
    H = arch.hidden
    return torch.cat([perm, perm + H, torch.arange(2 * H, 3 * H)])


# ---- config.json ---------------------------------------------------------------------------------------
def hf_config(arch: Arch, special_ids: dict[str, int] | None = None) -> dict:
    """config.json of the family's MLM class (``arch.family``). The BERT config is key for key what the
    export wrote before other families existed (same bytes for the same model).
    ``special_ids`` ({"cls": id, "sep": id}): RoBERTa's bos / eos ids."""
    family = export_family(arch)
    lay = LAYOUTS[family]
    cfg = {
        "architectures": [lay.architecture],
        "model_type": lay.model_type,
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden,
        "num_hidden_layers": arch.layers,
        "num_attention_heads": arch.heads,
        "intermediate_size": arch.ffn,
        "hidden_act": arch.activation,
        "hidden_dropout_prob": arch.dropout,
        "attention_probs_dropout_prob": arch.dropout,
        # RoBERTa: the table holds the offset rows too (514 for 512 usable positions)
        "max_position_embeddings": arch.max_positions + arch.position_offset,
        "type_vocab_size": arch.type_vocab_size,
        "initializer_range": 0.02,
        "layer_norm_eps": arch.ln_eps,
        "pad_token_id": arch.pad_id,
        "tie_word_embeddings": arch.tie_embeddings,
        "dtype": "float32",
    }
    if arch.family in OFFSET_FAMILIES and special_ids:
        cfg |= {"bos_token_id": special_ids["cls"], "eos_token_id": special_ids["sep"]}
    if family == "roformer":        # RoFormerConfig's own keys; the rotary base is its fixed 10000
        cfg |= {"embedding_size": arch.emb_dim, "rotary_value": False}
    return cfg


def electra_config(arch: Arch, role: str) -> dict:
    """config.json of the matching ``ElectraForMaskedLM`` (role generator) / ``ElectraForPreTraining``:
    BERT's (``hf_config``, same key order) with ``embedding_size``; the discriminator's embeddings always tied."""
    head = {
        "architectures": ["ElectraForMaskedLM" if role == "generator" else "ElectraForPreTraining"],
        "model_type": "electra",
        "vocab_size": arch.vocab_size,
        "embedding_size": arch.emb_dim,
    }
    cfg = head | {k: v for k, v in hf_config(arch).items() if k not in head}
    if role != "generator":
        cfg["tie_word_embeddings"] = True
    return cfg


def arch_from_hf_config(cfg: dict, family: str, dropout: float | None = None) -> Arch:
    """The Arch of a transformers config.json of ``family`` (keys transformers' config class defaults when
    absent). KeyError for a missing required key; ArchError for a shape the encoder cannot build."""
    pad = cfg.get("pad_token_id")
    pad = LAYOUTS[family].pad_default if pad is None else int(pad)
    offset = pad + 1 if family in OFFSET_FAMILIES else 0
    H = int(cfg["hidden_size"])
    E = int(cfg.get("embedding_size", 128)) if family == "electra" else H
    if family == "roformer":        # RoFormerConfig: embedding_size None = hidden, 1536 positions by default
        E = int(cfg.get("embedding_size") or H)
    rotary = family == "roformer"
    return Arch(layers=int(cfg["num_hidden_layers"]), hidden=H, heads=int(cfg["num_attention_heads"]),
                ffn=int(cfg["intermediate_size"]),
                dropout=float(cfg.get("hidden_dropout_prob", 0.1)) if dropout is None else dropout,
                max_positions=int(cfg.get("max_position_embeddings", 1536 if rotary else 512)) - offset,
                position="rotary" if rotary else "learned", norm="post",
                tie_embeddings=bool(cfg.get("tie_word_embeddings", True)), vocab_size=int(cfg["vocab_size"]),
                pad_id=pad, embedding_size=E if E != H else None, ln_eps=float(cfg.get("layer_norm_eps", 1e-12)),
                activation=str(cfg.get("hidden_act", "gelu")), position_offset=offset,
                type_vocab_size=int(cfg.get("type_vocab_size", 2)), family=family)


# ---- state dicts -----------------------------------------------------------------------------------------
def encoder_to_hf(model, prefix: str) -> dict[str, torch.Tensor]:
    """The encoder body (embeddings [+ projection] + layers) under transformers' names below ``prefix``
    ("bert." / "roberta." / "electra." / "roformer."): fused qkv split, a sinusoidal table written as a learned one;
    rotary: RoFormer's sin | cos table and q / k rows in its pair order."""
    arch, sd = model.arch, model.state_dict()
    out = {prefix + theirs: sd[ours] for ours, theirs in _EMB}
    if arch.position == "rotary":
        out[prefix + ROFORMER_TABLE] = roformer_table(arch)
        rows = _qk_rows(arch)
        sd = sd | {f"blocks.{i}.attn.qkv.{kind}": sd[f"blocks.{i}.attn.qkv.{kind}"][rows]
                   for i in range(arch.layers) for kind in ("weight", "bias")}
    else:
        out[prefix + "embeddings.position_embeddings.weight"] = (model.pos_table if arch.position == "sinusoidal"
                                                                 else sd["pos_emb.weight"])
    if "emb_proj.weight" in sd:
        out |= {prefix + "embeddings_project.weight": sd["emb_proj.weight"],
                prefix + "embeddings_project.bias": sd["emb_proj.bias"]}
    for i in range(arch.layers):
        ours, hf = f"blocks.{i}.", f"{prefix}encoder.layer.{i}."
        for kind in ("weight", "bias"):
            for name, part in zip(("query", "key", "value"), sd[ours + f"attn.qkv.{kind}"].chunk(3, dim=0)):
                out[hf + f"attention.self.{name}.{kind}"] = part
            for mine, theirs in _LAYER:
                out[hf + f"{theirs}.{kind}"] = sd[ours + f"{mine}.{kind}"]
    return out


def encoder_from_hf(arch: Arch, hf: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The inverse of ``encoder_to_hf`` (learned positions, or RoFormer's rotary: its table is read and left to
    the caller to check). KeyError names a missing tensor."""
    sd = {ours: hf[prefix + theirs] for ours, theirs in _EMB}
    rotary = arch.position == "rotary"
    if rotary:
        _ = hf[prefix + ROFORMER_TABLE]     # read (marked used); pretrained checks it against the formula
    else:
        sd["pos_emb.weight"] = hf[prefix + "embeddings.position_embeddings.weight"]
    if prefix + "embeddings_project.weight" in hf:
        sd |= {"emb_proj.weight": hf[prefix + "embeddings_project.weight"],
               "emb_proj.bias": hf[prefix + "embeddings_project.bias"]}
    for i in range(arch.layers):
        ours, p = f"blocks.{i}.", f"{prefix}encoder.layer.{i}."
        for kind in ("weight", "bias"):
            sd[ours + f"attn.qkv.{kind}"] = torch.cat([hf[p + f"attention.self.{n}.{kind}"]
                                                       for n in ("query", "key", "value")])
            for mine, theirs in _LAYER:
                sd[ours + f"{mine}.{kind}"] = hf[p + f"{theirs}.{kind}"]
            if rotary:
                sd[ours + f"attn.qkv.{kind}"] = sd[ours + f"attn.qkv.{kind}"][_qk_rows(arch, inverse=True)]
    return sd


def _cpu_copies(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().float().contiguous().clone() for k, v in d.items()}


def mlm_to_hf(model, family: str | None = None) -> dict[str, torch.Tensor]:
    """An MLMEncoder's weights under its family's (or ``family``'s) MLM class names (float32 CPU copies)."""
    arch, sd = model.arch, model.state_dict()
    lay = LAYOUTS[family or export_family(arch)]
    out = encoder_to_hf(model, lay.prefix) | {
        lay.dense + ".weight": sd["head_dense.weight"], lay.dense + ".bias": sd["head_dense.bias"],
        lay.norm + ".weight": sd["head_norm.weight"], lay.norm + ".bias": sd["head_norm.bias"],
        lay.bias: sd["head_bias"],
    }
    if not arch.tie_embeddings:          # tied: transformers takes it from the word embeddings
        out[lay.decoder + ".weight"] = sd["decoder.weight"]
        if lay.decoder_bias:             # untied, transformers reads decoder.bias itself (not the head's bias)
            out[lay.decoder + ".bias"] = sd["head_bias"]
    return _cpu_copies(out)


def mlm_from_hf(arch: Arch, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of ``mlm_to_hf`` (MLMEncoder state-dict names). KeyError names a missing tensor."""
    lay = LAYOUTS[arch.family]
    sd = encoder_from_hf(arch, hf, lay.prefix) | {
        "head_dense.weight": hf[lay.dense + ".weight"], "head_dense.bias": hf[lay.dense + ".bias"],
        "head_norm.weight": hf[lay.norm + ".weight"], "head_norm.bias": hf[lay.norm + ".bias"],
    }
    untied_bias = lay.decoder + ".bias"
    sd["head_bias"] = hf[untied_bias] if (not arch.tie_embeddings and lay.decoder_bias and untied_bias in hf) \
        else hf[lay.bias]
    sd["decoder.weight"] = sd["tok_emb.weight"] if arch.tie_embeddings else hf[lay.decoder + ".weight"]
    return sd


def disc_to_hf(disc) -> dict[str, torch.Tensor]:
    """A Discriminator's weights under ElectraForPreTraining's names."""
    sd = disc.state_dict()
    return _cpu_copies(encoder_to_hf(disc, "electra.") | {theirs: sd[ours] for ours, theirs in DISC_HEAD.items()})


def disc_from_hf(arch: Arch, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return encoder_from_hf(arch, hf, "electra.") | {ours: hf[theirs] for ours, theirs in DISC_HEAD.items()}


__all__ = ["LAYOUTS", "Layout", "OFFSET_FAMILIES", "DISC_HEAD", "ROFORMER_TABLE", "family_of_architecture",
           "export_family", "roformer_table", "hf_config", "electra_config",
           "arch_from_hf_config", "encoder_to_hf", "encoder_from_hf", "mlm_to_hf", "mlm_from_hf", "disc_to_hf",
           "disc_from_hf"]
