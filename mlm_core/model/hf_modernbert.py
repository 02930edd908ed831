"""The transformers layout of ModernBERT (``ModernBertForMaskedLM``, transformers 5.24): config.json <-> Arch and
state-dict names <-> ours, both directions from one name table (``_names``), as ``hf_layout`` does for the BERT
families (whose names ModernBERT shares none of).

  ours                          ModernBertForMaskedLM
  tok_emb                       model.embeddings.tok_embeddings
  emb_norm                      model.embeddings.norm                  (LayerNorm without bias: norm_bias false)
  blocks.i.attn_norm            model.layers.i.attn_norm               (i > 0; layer 0 has none)
  blocks.i.attn.qkv / .out      model.layers.i.attn.Wqkv / .Wo         (q | k | v rows, rotary in the same half layout)
  blocks.i.ffn_norm             model.layers.i.mlp_norm
  blocks.i.ffn_in / ffn_out     model.layers.i.mlp.Wi / .Wo            (Wi: input | gate rows)
  final_norm                    model.final_norm
  head_dense / head_norm        head.dense / head.norm                 (classifier_bias false)
  head_bias                     decoder.bias                           (decoder_bias true)
  decoder (untied only)         decoder.weight                         (tied: the token embeddings)

What the encoder computes for family modernbert is ModernBERT with its defaults for everything the Arch does not
carry (no biases, GELU head, default RoPE); a checkpoint whose config.json asks for anything else is refused with
the key named (``ModernBertConfigError``), never read into a network that would compute something different.
"""
from __future__ import annotations

import torch

from mlm_core.model.attention import global_layers
from mlm_core.model.sizes import Arch, MODERNBERT_THETA

ARCHITECTURE = "ModernBertForMaskedLM"
# ModernBertConfig's defaults (transformers 5.24), for keys a config.json leaves out
DEFAULTS = {"max_position_embeddings": 8192, "norm_eps": 1e-5, "pad_token_id": 50283, "local_attention": 128,
            "hidden_activation": "gelu", "tie_word_embeddings": True, "global_attn_every_n_layers": 3}
# keys whose value must be ModernBertConfig's default: the encoder has no other arithmetic for them
_FIXED = {"norm_bias": False, "attention_bias": False, "mlp_bias": False, "classifier_bias": False,
          "decoder_bias": True, "classifier_activation": "gelu"}


class ModernBertConfigError(ValueError):
    """A ModernBERT config.json this encoder cannot compute exactly (the message names the key)."""


def layer_types(arch: Arch) -> list[str]:
    return ["full_attention" if g else "sliding_attention"
            for g in global_layers(arch.layers, arch.attention, arch.global_every, from_first=True)]


def modernbert_config(arch: Arch, special_ids: dict[str, int] | None = None) -> dict:
    """config.json of ``ModernBertForMaskedLM`` for a family-modernbert Arch (one dropout rate for embeddings,
    attention and MLP, as the encoder has one)."""
    ids = special_ids or {}
    cfg = {
        "architectures": [ARCHITECTURE],
        "model_type": "modernbert",
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden,
        "intermediate_size": arch.ffn,
        "num_hidden_layers": arch.layers,
        "num_attention_heads": arch.heads,
        "hidden_activation": arch.activation,
        "max_position_embeddings": arch.max_positions,
        "initializer_range": 0.02,
        "initializer_cutoff_factor": 2.0,
        "norm_eps": arch.ln_eps,
        "pad_token_id": arch.pad_id,
        "embedding_dropout": arch.dropout,
        "attention_dropout": arch.dropout,
        "mlp_dropout": arch.dropout,
        "layer_types": layer_types(arch),
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": arch.rope_theta},
                            "sliding_attention": {"rope_type": "default", "rope_theta": arch.local_rope_theta}},
        # what transformers 4.x reads instead of layer_types / rope_parameters (5.x ignores them when those are set)
        "global_attn_every_n_layers": arch.global_every if arch.attention == "local_global" else 1,
        "global_rope_theta": arch.rope_theta,
        "local_rope_theta": arch.local_rope_theta,
        "local_attention": arch.window,
        "tie_word_embeddings": arch.tie_embeddings,
        "dtype": "float32",
        **_FIXED,
    }
    for role, keys in (("cls", ("bos_token_id", "cls_token_id")), ("sep", ("eos_token_id", "sep_token_id"))):
        if role in ids:
            cfg |= {k: int(ids[role]) for k in keys}
    return cfg


def _global_every(types: list[str]) -> tuple[str, int]:
    """(attention, global_every) of a layer_types list, which must be ModernBERT's alternation (layers 0, k, 2k,
    ... full)."""
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    if len(full) == len(types):
        return "global", 3
    k = full[1] if len(full) > 1 else len(types)
    if not full or [i % k == 0 for i in range(len(types))] != [t == "full_attention" for t in types]:
        raise ModernBertConfigError(f"layer_types {types} is not ModernBERT's alternation (full_attention at layers "
                                    "0, k, 2k, ..., sliding_attention elsewhere)")
    return "local_global", k


def _thetas(cfg: dict) -> tuple[float, float]:
    rope = cfg.get("rope_parameters") or {}
    out = []
    for kind, legacy in (("full_attention", "global"), ("sliding_attention", "local")):
        params = rope.get(kind) or {}
        if params.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
            raise ModernBertConfigError(f"rope_parameters.{kind}.rope_type {params.get('rope_type')!r} / rope_scaling: "
                                        "only the default RoPE is supported")
        out.append(float(params.get("rope_theta", cfg.get(f"{legacy}_rope_theta", MODERNBERT_THETA[legacy]))))
    return out[0], out[1]


def arch_from_modernbert_config(cfg: dict, dropout: float | None = None) -> Arch:
    """The Arch of a ModernBERT config.json (absent keys: ModernBertConfig's defaults). KeyError for a missing
    shape key; ModernBertConfigError for a setting the encoder does not compute; ArchError for a bad shape."""
    for key, want in _FIXED.items():
        if cfg.get(key, want) != want:
            raise ModernBertConfigError(f"{key} = {cfg[key]!r}: only ModernBERT's default {want!r} is supported")
    get = lambda k: cfg.get(k, DEFAULTS[k])        # noqa: E731
    layers = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types") or ["sliding_attention" if i % int(get("global_attn_every_n_layers")) else
                                       "full_attention" for i in range(layers)]
    if len(types) != layers:
        raise ModernBertConfigError(f"layer_types has {len(types)} entries for {layers} layers")
    attention, every = _global_every(list(types))
    theta, local_theta = _thetas(cfg)
    rates = [float(cfg.get(k, 0.0)) for k in ("embedding_dropout", "attention_dropout", "mlp_dropout")]
    return Arch(layers=layers, hidden=int(cfg["hidden_size"]), heads=int(cfg["num_attention_heads"]),
                ffn=int(cfg["intermediate_size"]), dropout=max(rates) if dropout is None else dropout,
                max_positions=int(get("max_position_embeddings")), position="rotary", norm="pre",
                tie_embeddings=bool(get("tie_word_embeddings")), vocab_size=int(cfg["vocab_size"]),
                pad_id=int(DEFAULTS["pad_token_id"] if cfg.get("pad_token_id") is None else cfg["pad_token_id"]),
                ln_eps=float(get("norm_eps")), activation=str(get("hidden_activation")), family="modernbert",
                # ModernBERT's window is |i - j| <= local_attention // 2, ours |i - j| <= window / 2
                attention=attention, window=max(2, 2 * (int(get("local_attention")) // 2)), global_every=every,
                rope_theta=theta, local_rope_theta=local_theta)


def _names(arch: Arch) -> list[tuple[str, str]]:
    """(our state-dict name, ModernBertForMaskedLM's) for every tensor of the checkpoint."""
    out = [("tok_emb.weight", "model.embeddings.tok_embeddings.weight"),
           ("emb_norm.weight", "model.embeddings.norm.weight"),
           ("final_norm.weight", "model.final_norm.weight"),
           ("head_dense.weight", "head.dense.weight"), ("head_norm.weight", "head.norm.weight"),
           ("head_bias", "decoder.bias")]
    for i in range(arch.layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        pairs = [("attn.qkv", "attn.Wqkv"), ("attn.out", "attn.Wo"), ("ffn_norm", "mlp_norm"), ("ffn_in", "mlp.Wi"),
                 ("ffn_out", "mlp.Wo")] + ([("attn_norm", "attn_norm")] if i else [])
        out += [(f"{ours}{a}.weight", f"{theirs}{b}.weight") for a, b in pairs]
    if not arch.tie_embeddings:
        out.append(("decoder.weight", "decoder.weight"))
    return out


def modernbert_to_hf(model) -> dict[str, torch.Tensor]:
    """An MLMEncoder (family modernbert) under ModernBertForMaskedLM's names (float32 CPU copies)."""
    sd = model.state_dict()
    return {theirs: sd[ours].detach().cpu().float().contiguous().clone() for ours, theirs in _names(model.arch)}


def modernbert_from_hf(arch: Arch, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of ``modernbert_to_hf`` (MLMEncoder names; a tied decoder is the embedding). KeyError names a
    missing tensor."""
    sd = {ours: hf[theirs] for ours, theirs in _names(arch)}
    if arch.tie_embeddings:
        sd["decoder.weight"] = sd["tok_emb.weight"]
    return sd


__all__ = ["ARCHITECTURE", "DEFAULTS", "ModernBertConfigError", "layer_types", "modernbert_config",
           "arch_from_modernbert_config", "modernbert_to_hf", "modernbert_from_hf"]
