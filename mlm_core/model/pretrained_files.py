"""The files of a model folder that ``pretrained`` reads: safetensors weights (one file or shards; a pickle is
refused unopened) and the tokenizer with its special tokens. Every error names the file and the config field.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from mlm_core.model.weights import ExportError

ROLES = ("pad", "unk", "cls", "sep", "mask")
# the usual spellings (BERT-style, RoBERTa-style), when a folder has no transformers tokenizer config naming them
_USUAL = {"pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"), "cls": ("[CLS]", "<s>"), "sep": ("[SEP]", "</s>"),
          "mask": ("[MASK]", "<mask>")}
_PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack", "model.ckpt",
            "model.pt", "model.pth")
CONVERT_HINT = ('convert it once to safetensors where transformers is installed: python -c "from transformers import '
                'AutoModelForMaskedLM as M; M.from_pretrained(F).save_pretrained(F, safe_serialization=True)" '
                '(F = the folder; only if you trust its origin: loading a pickle runs its code)')


class PretrainedError(ExportError):
    """A pretrained folder that cannot be used; the message names the file and the config field."""


def refuse_missing_weights(folder: Path, field: str) -> None:
    """PretrainedError unless ``folder`` holds safetensors weights (a pickle is named, never opened)."""
    if (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file():
        return
    pickles = sorted({p.name for p in folder.iterdir() if p.name in _PICKLES or p.suffix in (".bin", ".pt", ".pth",
                                                                                                ".ckpt", ".h5")})
    if pickles:
        raise PretrainedError(f"{field}: {folder} holds weights only as {', '.join(pickles)}, not safetensors; this "
                              f"pipeline never unpickles a file (it can run code): {CONVERT_HINT}")
    raise PretrainedError(f"{field}: {folder} holds no weights (model.safetensors or model.safetensors.index.json)")


def read_hf_tensors(folder: Path, field: str) -> tuple[dict[str, torch.Tensor], Path]:
    """All tensors of a transformers folder (single file or shards) and the file to name in errors."""
    from safetensors import SafetensorError, safe_open
    refuse_missing_weights(folder, field)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        shards, where, expect = [single], single, None
    else:
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PretrainedError(f"{field}: cannot read the weight_map of {index}: {e}") from None
        shards, where, expect = [folder / s for s in sorted(set(weight_map.values()))], index, set(weight_map)
    out: dict[str, torch.Tensor] = {}
    for path in shards:
        if not path.is_file():
            raise PretrainedError(f"{field}: {index} lists shard {path.name}, which is missing")
        try:
            with safe_open(str(path), "pt") as f:
                for k in f.keys():
                    out[k] = f.get_tensor(k)
        except (SafetensorError, OSError) as e:
            raise PretrainedError(f"{field}: {path} is not a readable safetensors file: {e}") from None
    if expect is not None and expect - set(out):
        raise PretrainedError(f"{field}: tensors listed in {index} are in none of its shards: "
                              f"{sorted(expect - set(out))[:5]}")
    return out, where


def _token(v) -> str | None:
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) and v else None


def _named_specials(folder: Path) -> dict[str, str]:
    """role -> token string from transformers' tokenizer files (tokenizer_config.json wins)."""
    names: dict[str, str] = {}
    for fname in ("special_tokens_map.json", "tokenizer_config.json"):
        path = folder / fname
        if not path.is_file():
            continue
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            continue
        for role in ROLES:
            if _token(d.get(f"{role}_token")):
                names[role] = _token(d[f"{role}_token"])
        # RoBERTa-style configs may name only bos / eos: they frame the sequence as cls / sep do
        for role, alt in (("cls", "bos_token"), ("sep", "eos_token")):
            if role not in names and _token(d.get(alt)):
                names[role] = _token(d[alt])
    return names


def read_special_tokens(folder: Path, arch, cfg_path: Path, field: str) -> tuple[dict[str, dict], Path, int]:
    """(role -> {"token", "id"}, tokenizer.json path, ids the tokenizer can produce) for a model folder;
    checks them against the model (vocabulary rows, pad id)."""
    from tokenizers import Tokenizer
    tok_file = folder / "tokenizer.json"
    if not tok_file.is_file():
        raise PretrainedError(f"{field}: {folder} has no tokenizer.json (the model's fast tokenizer; save it with "
                              "transformers: AutoTokenizer.from_pretrained(F).save_pretrained(F))")
    try:
        tok = Tokenizer.from_file(str(tok_file))
    except Exception as e:     # the tokenizers library raises a bare Exception for a malformed file
        raise PretrainedError(f"{field}: {tok_file} is not a readable tokenizer: {e}") from None
    vocab = tok.get_vocab(with_added_tokens=True)
    names = _named_specials(folder)
    specials = {}
    for role in ROLES:
        token = names.get(role) or next((t for t in _USUAL[role] if t in vocab), None)
        if token is None or token not in vocab:
            raise PretrainedError(f"{field}: no {role} token in {tok_file}"
                                  + (f" ({token!r}, named in the tokenizer config, is not in it)" if token else
                                     f" (none of {list(_USUAL[role])}, and no tokenizer_config.json naming it)"))
        specials[role] = {"token": token, "id": int(vocab[token])}
    n_ids = max(vocab.values()) + 1 if vocab else 0
    if n_ids > arch.vocab_size:
        raise PretrainedError(f"{field}: the tokenizer {tok_file} has ids up to {n_ids - 1}, but the model has "
                              f"{arch.vocab_size} embedding rows ({cfg_path} vocab_size): this tokenizer does not "
                              "belong to these weights")
    if specials["pad"]["id"] != arch.pad_id:
        raise PretrainedError(f"{field}: the pad token {specials['pad']['token']!r} is id {specials['pad']['id']} in "
                              f"{tok_file}, but {cfg_path} has pad_token_id {arch.pad_id}")
    return specials, tok_file, n_ids


__all__ = ["PretrainedError", "ROLES", "CONVERT_HINT", "refuse_missing_weights", "read_hf_tensors",
           "read_special_tokens"]
