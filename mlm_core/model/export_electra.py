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
from safetensors.torch import save_file

from mlm_core.model.encoder import MLMEncoder
from mlm_core.model.export import check_exportable, write_tokenizer_files
from mlm_core.model.hf_layout import arch_from_hf_config, disc_to_hf, electra_config, mlm_to_hf
from mlm_core.model.pretrained import load_export
from mlm_core.model.sizes import Arch
from mlm_core.model.weights import ExportError

GENERATOR_DIR, DISCRIMINATOR_DIR = "hf", "hf-discriminator"


def generator_to_hf(gen: MLMEncoder) -> dict[str, torch.Tensor]:
    # a generator this pipeline trained has family "bert" (its Arch predates families): ELECTRA's names regardless
    return mlm_to_hf(gen, family="electra")


discriminator_to_hf = disc_to_hf


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
        if a.position == "rotary":      # RoFormer's rotary layers exist, but transformers has no RoFormer ELECTRA
            raise ExportError("rotary position encoding in an ELECTRA pair: transformers' ELECTRA has absolute "
                              "positions only; the model is saved as safetensors only")
        if special_tokens.get("pad", {}).get("id", a.pad_id) != a.pad_id:
            raise ExportError(f"pad token id {special_tokens['pad']['id']} differs from the model's pad_id {a.pad_id}")
    out_dir = Path(out_dir)
    g = _write(out_dir / GENERATOR_DIR, electra_config(gen.arch, "generator"), generator_to_hf(gen),
               tokenizer_file, special_tokens, gen.arch)
    d = _write(out_dir / DISCRIMINATOR_DIR, electra_config(disc.arch, "discriminator"), discriminator_to_hf(disc),
               tokenizer_file, special_tokens, disc.arch)
    return g, d


def arch_from_electra_config(cfg: dict) -> Arch:
    return arch_from_hf_config(cfg, "electra")


def load_electra_export(out_dir: Path):
    """An ``export_electra`` folder back into our classes: the generator as an MLMEncoder, the
    discriminator as a ``Discriminator`` (eval mode)."""
    return load_export(out_dir)


__all__ = ["export_electra", "load_electra_export", "electra_config", "GENERATOR_DIR", "DISCRIMINATOR_DIR"]
