"""The Hugging Face export of an ELECTRA model: two transformers folders.

  <out>/hf/               the generator as ``ElectraForMaskedLM`` (the model to fill masks with)
  <out>/hf-discriminator/ the discriminator as ``ElectraForPreTraining`` (one replaced-token logit per token;
                          the encoder to fine-tune)

Both hold config.json, model.safetensors and the tokenizer files, written by hand in the layout
transformers 5.24 reads (names checked against ``ElectraForMaskedLM().state_dict()`` /
``ElectraForPreTraining().state_dict()``; the tests load both and compare logits). The generator reads
the discriminator's E-wide embeddings through ``embeddings_project`` (``embedding_size`` = E); the shared
embedding tensors are written into both folders.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mlm_core.model.encoder import MLMEncoder
from mlm_core.model.export import (ExportError, check_exportable, encoder_from_hf, encoder_to_hf, hf_config,
                                   write_tokenizer_files)
from mlm_core.model.sizes import Arch

GENERATOR_DIR, DISCRIMINATOR_DIR = "hf", "hf-discriminator"


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


def _electra_state_dict(model: MLMEncoder, head: dict[str, str]) -> dict[str, torch.Tensor]:
    """The encoder under "electra." plus the ``head`` tensors (transformers name -> ours), as float32 CPU copies."""
    sd = model.state_dict()
    out = encoder_to_hf(model, "electra.") | {theirs: sd[ours] for theirs, ours in head.items()}
    return {k: v.detach().cpu().float().contiguous().clone() for k, v in out.items()}


def generator_to_hf(gen: MLMEncoder) -> dict[str, torch.Tensor]:
    head = {
        "generator_predictions.dense.weight": "head_dense.weight",
        "generator_predictions.dense.bias": "head_dense.bias",
        "generator_predictions.LayerNorm.weight": "head_norm.weight",
        "generator_predictions.LayerNorm.bias": "head_norm.bias",
        "generator_lm_head.bias": "head_bias",
    }
    if not gen.arch.tie_embeddings:                # tied: transformers takes it from the word embeddings
        head["generator_lm_head.weight"] = "decoder.weight"
    return _electra_state_dict(gen, head)


def discriminator_to_hf(disc) -> dict[str, torch.Tensor]:
    return _electra_state_dict(disc, {
        "discriminator_predictions.dense.weight": "rtd_dense.weight",
        "discriminator_predictions.dense.bias": "rtd_dense.bias",
        "discriminator_predictions.dense_prediction.weight": "rtd_out.weight",
        "discriminator_predictions.dense_prediction.bias": "rtd_out.bias",
    })


def _write(out_dir: Path, cfg: dict, tensors: dict, tokenizer_file: Path, special_tokens: dict, arch: Arch) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer_files(out_dir, Path(tokenizer_file), special_tokens, arch.max_positions)
    return out_dir


def export_electra(gen: MLMEncoder, disc, out_dir: Path, tokenizer_file: Path,
                   special_tokens: dict[str, dict]) -> tuple[Path, Path]:
    """Write ``out_dir/hf`` (generator, ElectraForMaskedLM) and ``out_dir/hf-discriminator``
    (ElectraForPreTraining); returns both folders. ExportError for a non-BERT layout (rotary, pre-LN)."""
    for a in (gen.arch, disc.arch):
        check_exportable(a)
        if special_tokens.get("pad", {}).get("id", a.pad_id) != a.pad_id:
            raise ExportError(f"pad token id {special_tokens['pad']['id']} differs from the model's pad_id {a.pad_id}")
    out_dir = Path(out_dir)
    g = _write(out_dir / GENERATOR_DIR, electra_config(gen.arch, "generator"), generator_to_hf(gen),
               tokenizer_file, special_tokens, gen.arch)
    d = _write(out_dir / DISCRIMINATOR_DIR, electra_config(disc.arch, "discriminator"), discriminator_to_hf(disc),
               tokenizer_file, special_tokens, disc.arch)
    return g, d


def arch_from_electra_config(cfg: dict) -> Arch:
    E, H = cfg.get("embedding_size", cfg["hidden_size"]), cfg["hidden_size"]
    return Arch(layers=cfg["num_hidden_layers"], hidden=H, heads=cfg["num_attention_heads"],
                ffn=cfg["intermediate_size"], dropout=cfg.get("hidden_dropout_prob", 0.1),
                max_positions=cfg["max_position_embeddings"], position="learned", norm="post",
                tie_embeddings=cfg.get("tie_word_embeddings", True), vocab_size=cfg["vocab_size"],
                pad_id=cfg.get("pad_token_id") or 0, embedding_size=E if E != H else None)


def load_electra_export(out_dir: Path):
    """An ``export_electra`` folder back into our classes: the generator as an MLMEncoder, the
    discriminator as a ``Discriminator`` (eval mode)."""
    from mlm_core.model.electra import Discriminator
    out_dir = Path(out_dir)
    cfg = json.loads((out_dir / "config.json").read_text(encoding="utf-8"))
    arch = arch_from_electra_config(cfg)
    with safe_open(str(out_dir / "model.safetensors"), "pt") as f:
        hf = {k: f.get_tensor(k) for k in f.keys()}
    generator = "ElectraForMaskedLM" in cfg.get("architectures", [])
    try:
        sd = encoder_from_hf(arch, hf, "electra.")
        if generator:
            model = MLMEncoder(arch)
            sd |= {"head_dense.weight": hf["generator_predictions.dense.weight"],
                   "head_dense.bias": hf["generator_predictions.dense.bias"],
                   "head_norm.weight": hf["generator_predictions.LayerNorm.weight"],
                   "head_norm.bias": hf["generator_predictions.LayerNorm.bias"],
                   "head_bias": hf["generator_lm_head.bias"],
                   "decoder.weight": sd["tok_emb.weight"] if arch.tie_embeddings else hf["generator_lm_head.weight"]}
        else:
            model = Discriminator(arch)
            sd |= {"rtd_dense.weight": hf["discriminator_predictions.dense.weight"],
                   "rtd_dense.bias": hf["discriminator_predictions.dense.bias"],
                   "rtd_out.weight": hf["discriminator_predictions.dense_prediction.weight"],
                   "rtd_out.bias": hf["discriminator_predictions.dense_prediction.bias"]}
    except KeyError as e:
        raise ExportError(f"{out_dir}/model.safetensors lacks tensor {e}") from e
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ExportError(f"{out_dir}: weights do not match the architecture (missing {missing}, unexpected {unexpected})")
    return model.eval()


__all__ = ["export_electra", "load_electra_export", "electra_config", "GENERATOR_DIR", "DISCRIMINATOR_DIR"]
