"""Saving and loading weights (safetensors only) and the Hugging Face export.

In: an ``MLMEncoder`` (+ the tokenizer.json and its special tokens). Out: a ``.safetensors`` file, or a
folder that ``transformers.AutoModelForMaskedLM`` / ``AutoTokenizer.from_pretrained`` load as
``BertForMaskedLM`` + ``PreTrainedTokenizerFast`` (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, special_tokens_map.json).

Never pickle: no ``torch.save`` / ``torch.load``; a weight file is data, not code. The export does not
need transformers at run time: the files are written by hand in the layout transformers 5.24 reads
(parameter names checked against ``BertForMaskedLM().state_dict()``; the tests load the result).
Only the BERT layout exports (post-LN, learned or sinusoidal positions): anything else would load into
``BertForMaskedLM`` without error and compute something different.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_file

from mlm_core.errors import MlmError
from mlm_core.model.encoder import LN_EPS, MLMEncoder
from mlm_core.model.sizes import Arch
from mlm_core.tensorfile import save_module

SPECIAL_KEYS = ("pad", "unk", "cls", "sep", "mask")


class ExportError(MlmError, ValueError):
    """A model or folder that cannot be exported / loaded back faithfully."""


# ---- our own weights ---------------------------------------------------------------------------------
def save_weights(model: MLMEncoder, path: Path) -> None:
    """Write the weights as safetensors (a tied tensor stored once); the Arch goes into the metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # through mlm_core.tensorfile: safetensors orders a multi-key metadata header differently in every process
    save_module(model, path, metadata={"format": "pt", "arch": json.dumps(model.arch.to_dict(), sort_keys=True)})


def load_weights(model: MLMEncoder, path: Path) -> None:
    """Load safetensors weights into ``model`` (strict: every tensor present, none left over)."""
    try:
        load_model(model, str(path), strict=True)
    except RuntimeError as e:
        raise ExportError(f"{path}: weights do not match the model: {e}") from e


def read_arch(path: Path) -> Arch:
    """The Arch stored in the metadata of a file written by ``save_weights``."""
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    if "arch" not in meta:
        raise ExportError(f"{path}: no architecture in the safetensors metadata (not written by save_weights)")
    return Arch.from_dict(json.loads(meta["arch"]))


# ---- Hugging Face layout ----------------------------------------------------------------------------
def check_exportable(arch: Arch) -> None:
    """ExportError unless the architecture is exactly BERT's."""
    why = []
    if arch.position == "rotary":
        why.append("rotary position encoding")
    if arch.norm == "pre":
        why.append("pre-LayerNorm")
    if why:
        raise ExportError(f"this model ({' / '.join(why)}) has no matching transformers architecture: refusing to "
                          "export something that would load wrong; the model is saved as safetensors only")


def hf_config(arch: Arch) -> dict:
    """config.json of the matching ``BertForMaskedLM``."""
    return {
        "architectures": ["BertForMaskedLM"],
        "model_type": "bert",
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden,
        "num_hidden_layers": arch.layers,
        "num_attention_heads": arch.heads,
        "intermediate_size": arch.ffn,
        "hidden_act": "gelu",  # exact erf GELU, as ours
        "hidden_dropout_prob": arch.dropout,
        "attention_probs_dropout_prob": arch.dropout,
        "max_position_embeddings": arch.max_positions,
        "type_vocab_size": 1,
        "initializer_range": 0.02,
        "layer_norm_eps": LN_EPS,
        "pad_token_id": arch.pad_id,
        "tie_word_embeddings": arch.tie_embeddings,
        "dtype": "float32",
    }


def encoder_to_hf(model: MLMEncoder, prefix: str) -> dict[str, torch.Tensor]:
    """The encoder body (embeddings [+ projection] + layers) under transformers' names below ``prefix``
    ("bert." or "electra."): fused qkv split, a sinusoidal table written as a learned one."""
    arch, sd = model.arch, model.state_dict()
    if arch.position == "sinusoidal":
        pos = model.pos_table
    else:
        pos = sd["pos_emb.weight"]
    out = {
        prefix + "embeddings.word_embeddings.weight": sd["tok_emb.weight"],
        prefix + "embeddings.position_embeddings.weight": pos,
        prefix + "embeddings.token_type_embeddings.weight": sd["type_emb.weight"],
        prefix + "embeddings.LayerNorm.weight": sd["emb_norm.weight"],
        prefix + "embeddings.LayerNorm.bias": sd["emb_norm.bias"],
    }
    if "emb_proj.weight" in sd:
        out |= {prefix + "embeddings_project.weight": sd["emb_proj.weight"],
                prefix + "embeddings_project.bias": sd["emb_proj.bias"]}
    for i in range(arch.layers):
        ours, hf = f"blocks.{i}.", f"{prefix}encoder.layer.{i}."
        q, k, v = sd[ours + "attn.qkv.weight"].chunk(3, dim=0)
        qb, kb, vb = sd[ours + "attn.qkv.bias"].chunk(3, dim=0)
        out |= {
            hf + "attention.self.query.weight": q, hf + "attention.self.query.bias": qb,
            hf + "attention.self.key.weight": k, hf + "attention.self.key.bias": kb,
            hf + "attention.self.value.weight": v, hf + "attention.self.value.bias": vb,
            hf + "attention.output.dense.weight": sd[ours + "attn.out.weight"],
            hf + "attention.output.dense.bias": sd[ours + "attn.out.bias"],
            hf + "attention.output.LayerNorm.weight": sd[ours + "attn_norm.weight"],
            hf + "attention.output.LayerNorm.bias": sd[ours + "attn_norm.bias"],
            hf + "intermediate.dense.weight": sd[ours + "ffn_in.weight"],
            hf + "intermediate.dense.bias": sd[ours + "ffn_in.bias"],
            hf + "output.dense.weight": sd[ours + "ffn_out.weight"],
            hf + "output.dense.bias": sd[ours + "ffn_out.bias"],
            hf + "output.LayerNorm.weight": sd[ours + "ffn_norm.weight"],
            hf + "output.LayerNorm.bias": sd[ours + "ffn_norm.bias"],
        }
    return out


def to_hf_state_dict(model: MLMEncoder) -> dict[str, torch.Tensor]:
    """Our weights under BertForMaskedLM's names (see ``encoder_to_hf``)."""
    arch, sd = model.arch, model.state_dict()
    out = encoder_to_hf(model, "bert.")
    out |= {
        "cls.predictions.transform.dense.weight": sd["head_dense.weight"],
        "cls.predictions.transform.dense.bias": sd["head_dense.bias"],
        "cls.predictions.transform.LayerNorm.weight": sd["head_norm.weight"],
        "cls.predictions.transform.LayerNorm.bias": sd["head_norm.bias"],
        "cls.predictions.bias": sd["head_bias"],
    }
    # transformers ties decoder.weight to the word embeddings and decoder.bias to cls.predictions.bias only
    # when tie_word_embeddings is true; untied, it reads both from the file (as its own save_pretrained writes)
    if not arch.tie_embeddings:
        out["cls.predictions.decoder.weight"] = sd["decoder.weight"]
        out["cls.predictions.decoder.bias"] = sd["head_bias"]
    return {k: v.detach().cpu().float().contiguous().clone() for k, v in out.items()}


def from_hf_state_dict(arch: Arch, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of ``to_hf_state_dict`` for a learned-position, post-LN model."""
    sd = encoder_from_hf(arch, hf, "bert.") | {
        "head_dense.weight": hf["cls.predictions.transform.dense.weight"],
        "head_dense.bias": hf["cls.predictions.transform.dense.bias"],
        "head_norm.weight": hf["cls.predictions.transform.LayerNorm.weight"],
        "head_norm.bias": hf["cls.predictions.transform.LayerNorm.bias"],
        "head_bias": hf["cls.predictions.bias"],
    }
    sd["decoder.weight"] = sd["tok_emb.weight"] if arch.tie_embeddings else hf["cls.predictions.decoder.weight"]
    return sd


def encoder_from_hf(arch: Arch, hf: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The inverse of ``encoder_to_hf`` (learned positions)."""
    sd = {
        "tok_emb.weight": hf[prefix + "embeddings.word_embeddings.weight"],
        "pos_emb.weight": hf[prefix + "embeddings.position_embeddings.weight"],
        "type_emb.weight": hf[prefix + "embeddings.token_type_embeddings.weight"],
        "emb_norm.weight": hf[prefix + "embeddings.LayerNorm.weight"],
        "emb_norm.bias": hf[prefix + "embeddings.LayerNorm.bias"],
    }
    if prefix + "embeddings_project.weight" in hf:
        sd |= {"emb_proj.weight": hf[prefix + "embeddings_project.weight"],
               "emb_proj.bias": hf[prefix + "embeddings_project.bias"]}
    for i in range(arch.layers):
        ours, p = f"blocks.{i}.", f"{prefix}encoder.layer.{i}."
        sd[ours + "attn.qkv.weight"] = torch.cat([hf[p + f"attention.self.{n}.weight"] for n in ("query", "key", "value")])
        sd[ours + "attn.qkv.bias"] = torch.cat([hf[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value")])
        for mine, theirs in (("attn.out", "attention.output.dense"), ("attn_norm", "attention.output.LayerNorm"),
                             ("ffn_in", "intermediate.dense"), ("ffn_out", "output.dense"),
                             ("ffn_norm", "output.LayerNorm")):
            sd[ours + mine + ".weight"] = hf[p + theirs + ".weight"]
            sd[ours + mine + ".bias"] = hf[p + theirs + ".bias"]
    return sd


def write_tokenizer_files(out_dir: Path, tokenizer_file: Path, special_tokens: dict[str, dict],
                          model_max_length: int) -> None:
    """tokenizer.json (copied) + tokenizer_config.json + special_tokens_map.json, without transformers.

    ``model_input_names`` leaves out token_type_ids: the model has a single token type, and a pair
    template ($B:1) would otherwise index past it.
    """
    missing = [k for k in SPECIAL_KEYS if k not in special_tokens]
    if missing:
        raise ExportError(f"special_tokens lacks {missing} (needs {list(SPECIAL_KEYS)})")
    shutil.copyfile(tokenizer_file, out_dir / "tokenizer.json")
    vocab = json.loads((out_dir / "tokenizer.json").read_text(encoding="utf-8"))
    added = {t["content"]: t["id"] for t in vocab.get("added_tokens", [])}
    for key, tok in special_tokens.items():
        if tok["token"] in added and added[tok["token"]] != tok["id"]:
            raise ExportError(f"special token {key} {tok['token']!r} has id {added[tok['token']]} in "
                              f"{tokenizer_file}, not {tok['id']}")
    names = {f"{k}_token": special_tokens[k]["token"] for k in SPECIAL_KEYS}
    if special_tokens["cls"]["token"] == "<s>":  # RoBERTa style: <s> / </s> are also bos / eos
        names |= {"bos_token": special_tokens["cls"]["token"], "eos_token": special_tokens["sep"]["token"]}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
              "model_input_names": ["input_ids", "attention_mask"], "clean_up_tokenization_spaces": False, **names}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(names, indent=2, ensure_ascii=False) + "\n",
                                                     encoding="utf-8")


def export_hf(model: MLMEncoder, out_dir: Path, tokenizer_file: Path, special_tokens: dict[str, dict]) -> Path:
    """Write a transformers-loadable BertForMaskedLM folder; returns ``out_dir``.

    special_tokens: {"pad"|"unk"|"cls"|"sep"|"mask": {"token": str, "id": int}}.
    """
    arch = model.arch
    check_exportable(arch)
    if arch.emb_dim != arch.hidden or not getattr(model, "has_mlm_head", True):
        raise ExportError("an ELECTRA generator or discriminator exports with mlm_core.model.export_electra "
                          "(ElectraForMaskedLM / ElectraForPreTraining), not as BertForMaskedLM")
    if special_tokens.get("pad", {}).get("id", arch.pad_id) != arch.pad_id:
        raise ExportError(f"pad token id {special_tokens['pad']['id']} differs from the model's pad_id {arch.pad_id}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(hf_config(arch), indent=2) + "\n", encoding="utf-8")
    save_file(to_hf_state_dict(model), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer_files(out_dir, Path(tokenizer_file), special_tokens, arch.max_positions)
    return out_dir


def load_export(out_dir: Path) -> MLMEncoder:
    """Read an ``export_hf`` folder (config.json + model.safetensors) back into an MLMEncoder (eval mode);
    an ELECTRA export (``export_electra``) loads as its generator (MLMEncoder) or discriminator."""
    out_dir = Path(out_dir)
    cfg = json.loads((out_dir / "config.json").read_text(encoding="utf-8"))
    if cfg.get("model_type") == "electra":
        from mlm_core.model.export_electra import load_electra_export
        return load_electra_export(out_dir)
    if cfg.get("model_type") != "bert" or cfg.get("type_vocab_size", 1) != 1 or cfg.get("hidden_act", "gelu") != "gelu":
        raise ExportError(f"{out_dir}: not a folder written by export_hf (model_type {cfg.get('model_type')!r}, "
                          f"type_vocab_size {cfg.get('type_vocab_size')}, hidden_act {cfg.get('hidden_act')!r})")
    arch = Arch(layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], heads=cfg["num_attention_heads"],
                ffn=cfg["intermediate_size"], dropout=cfg.get("hidden_dropout_prob", 0.1),
                max_positions=cfg["max_position_embeddings"], position="learned", norm="post",
                tie_embeddings=cfg.get("tie_word_embeddings", True), vocab_size=cfg["vocab_size"],
                pad_id=cfg.get("pad_token_id") or 0)
    with safe_open(str(out_dir / "model.safetensors"), "pt") as f:
        hf = {k: f.get_tensor(k) for k in f.keys()}
    model = MLMEncoder(arch)
    try:
        sd = from_hf_state_dict(arch, hf)
    except KeyError as e:
        raise ExportError(f"{out_dir}/model.safetensors lacks tensor {e}") from e
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ExportError(f"{out_dir}: weights do not match the architecture (missing {missing}, unexpected {unexpected})")
    return model.eval()
