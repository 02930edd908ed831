"""Fill-mask inference on a trained model folder: top-k predictions for each mask token in a text.

In: a folder holding either a Hugging Face export (config.json + model.safetensors + tokenizer.json)
or a pretrain stage output (model.safetensors with the architecture in its metadata + tokenizer.json),
and a text containing the tokenizer's mask token. Out: per mask position, the top-k tokens with
probabilities and the filled-in text. Weights are read from safetensors only.
"""
from __future__ import annotations

import json
from pathlib import Path

from mlm_core.errors import MlmError


class FillMaskError(MlmError, ValueError):
    pass


def load_model_dir(folder: Path):
    """(model, tokenizers.Tokenizer, mask token) from an export or a pretrain output folder."""
    from tokenizers import Tokenizer

    from mlm_core.model.encoder import MLMEncoder
    from mlm_core.model.pretrained import load_export
    from mlm_core.model.weights import load_weights, read_arch
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        raise FillMaskError(f"{folder}: no tokenizer.json (expected a Hugging Face export or a pretrain output folder)")
    if (folder / "config.json").is_file():
        model = load_export(folder)     # any supported family (BERT, RoBERTa, XLM-R, ELECTRA)
        mask = None
        # our export writes special_tokens_map.json; transformers 5 writes the names into tokenizer_config.json only
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            if mask is None and (folder / name).is_file():
                mask = json.loads((folder / name).read_text(encoding="utf-8")).get("mask_token")
                mask = mask["content"] if isinstance(mask, dict) else mask
    elif (folder / "model.safetensors").is_file():
        model = MLMEncoder(read_arch(folder / "model.safetensors"))
        load_weights(model, folder / "model.safetensors")
        mask = None
    else:
        raise FillMaskError(f"{folder}: no config.json or model.safetensors")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    if mask is None:   # BERT-style or RoBERTa-style specials
        mask = "[MASK]" if tok.token_to_id("[MASK]") is not None else "<mask>"
    model.eval()
    return model, tok, mask


def fill_mask(folder: Path, text: str, top_k: int = 5) -> list[list[dict]]:
    return fill_mask_loaded(load_model_dir(folder), text, top_k)


def fill_mask_loaded(loaded: tuple, text: str, top_k: int = 5) -> list[list[dict]]:
    """``fill_mask`` with a model already loaded by ``load_model_dir`` (a served model loads once)."""
    import torch
    model, tok, mask = loaded
    mask_id = tok.token_to_id(mask)
    enc = tok.encode(text)
    ids = torch.tensor([enc.ids], dtype=torch.long)
    where = (ids[0] == mask_id).nonzero().flatten().tolist()
    if not where:
        raise FillMaskError(f"the text has no mask token {mask!r}: {text!r}")
    if ids.shape[1] > model.arch.max_positions:
        raise FillMaskError(f"the text is {ids.shape[1]} tokens long; the model takes at most {model.arch.max_positions}")
    with torch.no_grad():
        probs = model.full_logits(ids)[0].float().softmax(-1)
    out = []
    for pos in where:
        p, idx = probs[pos].topk(top_k)
        preds = []
        for score, tid in zip(p.tolist(), idx.tolist()):
            filled = list(enc.ids)
            filled[pos] = tid
            preds.append({"token": tok.decode([tid]).strip() or tok.id_to_token(tid), "token_id": tid,
                          "score": round(score, 5), "sequence": " ".join(tok.decode(filled).split())})
        out.append(preds)
    return out
