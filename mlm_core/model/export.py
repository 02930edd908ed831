"""The Hugging Face export (our own safetensors weights file: ``weights``; reading a folder back: ``pretrained``).

In: an ``MLMEncoder`` (+ the tokenizer.json and its special tokens). Out: a
folder that ``transformers.AutoModelForMaskedLM`` / ``AutoTokenizer.from_pretrained`` load as the model's
family (``hf_layout.export_family``: ``BertForMaskedLM`` for this pipeline's own models, ``RoFormerForMaskedLM``
for its rotary post-LN ones, ``ModernBertForMaskedLM`` for family modernbert, ``RobertaForMaskedLM`` /
``XLMRobertaForMaskedLM`` for a model continued from one of those) + ``PreTrainedTokenizerFast``
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json, special_tokens_map.json).

Never pickle: no ``torch.save`` / ``torch.load``; a weight file is data, not code. The export does not
need transformers at run time: the files are written by hand in the layout transformers 5.24 reads
(names and config keys in ``hf_layout`` / ``hf_modernbert``, shared with the import; the tests load the result).
Only layouts a transformers class computes exactly export: post-LN global attention (BERT with learned or
sinusoidal positions, RoFormer with rotary ones) and ModernBERT; anything else (pre-LN or local/global attention
outside family modernbert) would load without error and compute something different, so it is refused.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import save_file

from mlm_core.model.encoder import MLMEncoder
from mlm_core.model.hf_layout import electra_config, hf_config, mlm_to_hf
from mlm_core.model.hf_modernbert import modernbert_config, modernbert_to_hf
from mlm_core.model.sizes import Arch
from mlm_core.model.weights import ExportError

SPECIAL_KEYS = ("pad", "unk", "cls", "sep", "mask")


# ---- Hugging Face layout ----------------------------------------------------------------------------
def check_exportable(arch: Arch) -> None:
    """ExportError unless a transformers class computes exactly this architecture (see the module docstring)."""
    if arch.modern:
        return                  # ModernBertForMaskedLM: the Arch holds nothing ModernBERT cannot express
    why = []
    if arch.norm == "pre":
        why.append("pre-LayerNorm (pretrain.model.norm: pre; BERT and RoFormer are post-LN: use norm: post, or "
                   "family: modernbert for a pre-LN model that exports)"
                   + (" with rotary position encoding" if arch.position == "rotary" else ""))
    if arch.attention != "global":
        # ModernBERT alternates the same way, but its layers are not BERT's (pre-LN, GeGLU, rotary, no biases)
        why.append(f"{arch.attention} attention, window {arch.window}, global_every {arch.global_every}: "
                   "sliding-window layers where BERT / RoFormer attend globally in every layer (pretrain.model."
                   "attention; family: modernbert alternates and exports)")
    if arch.position == "rotary" and arch.family not in ("bert", "roformer"):
        why.append(f"rotary position encoding in a {arch.family} model (transformers' {arch.family} has absolute "
                   "positions; RoFormer is the rotary BERT)")
    if why:
        raise ExportError(f"this model ({' / '.join(why)}) has no matching transformers architecture: refusing to "
                          "export something that would load wrong; the model is saved as safetensors only")


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
    """Write a transformers-loadable folder of the model's family (``export_family``: BertForMaskedLM,
    RoFormerForMaskedLM, ModernBertForMaskedLM, RobertaForMaskedLM, XLMRobertaForMaskedLM; an ELECTRA-family
    generator alone as ElectraForMaskedLM; a generator + discriminator pair: ``export_electra``); returns ``out_dir``.

    special_tokens: {"pad"|"unk"|"cls"|"sep"|"mask": {"token": str, "id": int}}.
    """
    arch = model.arch
    check_exportable(arch)
    # RoFormer has ELECTRA's embedding_size / embeddings_project too; BERT does not
    narrow_ok = arch.family == "electra" or (arch.position == "rotary" and not arch.modern)
    if not getattr(model, "has_mlm_head", True) or (arch.emb_dim != arch.hidden and not narrow_ok):
        raise ExportError("an ELECTRA generator or discriminator exports with mlm_core.model.export_electra "
                          "(ElectraForMaskedLM / ElectraForPreTraining), not as BertForMaskedLM")
    if special_tokens.get("pad", {}).get("id", arch.pad_id) != arch.pad_id:
        raise ExportError(f"pad token id {special_tokens['pad']['id']} differs from the model's pad_id {arch.pad_id}")
    ids = {k: v["id"] for k, v in special_tokens.items() if isinstance(v, dict) and "id" in v}
    if arch.family == "electra":
        cfg, tensors = electra_config(arch, "generator"), mlm_to_hf(model)
    elif arch.modern:
        cfg, tensors = modernbert_config(arch, ids), modernbert_to_hf(model)
    else:
        cfg, tensors = hf_config(arch, ids), mlm_to_hf(model)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer_files(out_dir, Path(tokenizer_file), special_tokens, arch.max_positions)
    return out_dir

