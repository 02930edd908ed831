"""Weights and the Hugging Face export: safetensors roundtrip, transformers loads the export and computes
the same logits (BERT, and RoFormer for rotary positions), fill-mask works, variants no transformers class
computes (pre-LN, local/global attention outside family modernbert) refuse, and nothing is pickled."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import torch  # a required dependency: missing must fail loudly, not skip the module

from mlm_core.config import ModelConfig  # noqa: E402
from mlm_core.model import ExportError, MLMEncoder, export_hf, load_export, load_weights, read_arch, resolve_arch, save_weights  # noqa: E402,E501

TEXTS = ["the cat sat on the mat", "le chat est sur le tapis", "der hund schläft im haus", "el perro come en la casa",
         "the dog eats in the house", "le chien dort dans la maison", "die katze sitzt auf der matte"] * 20
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def wordpiece(path: Path) -> dict[str, dict]:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.train_from_iterator(TEXTS, trainers.WordPieceTrainer(vocab_size=200, special_tokens=BERT_SPECIALS,
                                                             show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(path))
    return {k: {"token": t, "id": i} for i, (k, t) in enumerate(zip(("pad", "unk", "cls", "sep", "mask"), BERT_SPECIALS))}


def byte_bpe(path: Path) -> dict[str, dict]:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=400, special_tokens=ROBERTA_SPECIALS, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=True)
    tok.save(str(path))
    names = ("cls", "pad", "sep", "unk", "mask")
    return {k: {"token": t, "id": i} for i, (k, t) in enumerate(zip(names, ROBERTA_SPECIALS))}


def model_for(tok_file: Path, specials: dict, **kw) -> MLMEncoder:
    from tokenizers import Tokenizer
    vocab = Tokenizer.from_file(str(tok_file)).get_vocab_size()
    cfg = ModelConfig(size="tiny", layers=2, hidden=32, heads=4, ffn=64, max_positions=64, **kw)
    torch.manual_seed(0)
    m = MLMEncoder(resolve_arch(cfg, vocab_size=vocab, pad_id=specials["pad"]["id"]))
    with torch.no_grad():  # non-trivial LayerNorm and bias values so a wrong mapping shows up
        for name, p in m.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return m.eval()


@pytest.mark.parametrize("style,position,tie", [("bert", "learned", True), ("bert", "sinusoidal", True),
                                                ("roberta", "learned", False), ("bert", "rotary", True),
                                                ("bert", "rotary", False)])
def test_export_loads_in_transformers_with_equal_logits(tmp_path, style, position, tie):
    import transformers  # the test extra: missing must fail, not skip
    transformers.logging.set_verbosity_error()
    tok_file = tmp_path / "tokenizer.json"
    specials = (wordpiece if style == "bert" else byte_bpe)(tok_file)
    m = model_for(tok_file, specials, position=position, tie_embeddings=tie)
    out = export_hf(m, tmp_path / "hf", tok_file, specials)
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json",
                                               "tokenizer_config.json", "special_tokens_map.json"}
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is tie

    hf, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert type(hf).__name__ == ("RoFormerForMaskedLM" if position == "rotary" else "BertForMaskedLM")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    tok = transformers.AutoTokenizer.from_pretrained(out)
    mask = specials["mask"]["token"]
    assert tok.mask_token == mask and tok.pad_token_id == specials["pad"]["id"]

    enc = tok("le chat dort sur la matte", return_tensors="pt")
    assert "token_type_ids" not in enc
    with torch.no_grad():
        theirs = hf.eval()(**enc).logits
    ours = m.full_logits(enc["input_ids"])
    assert (theirs - ours).abs().max().item() < 1e-4
    # and back: the export folder loads into our class with the same function
    torch.testing.assert_close(load_export(out).full_logits(enc["input_ids"]), ours, atol=1e-5, rtol=0)

    fill = transformers.pipeline("fill-mask", model=hf, tokenizer=tok, top_k=3)
    preds = fill(f"le chat {mask} sur le tapis")
    assert len(preds) == 3 and all({"score", "token_str", "sequence"} <= set(p) for p in preds)


@pytest.mark.parametrize("kw,why", [({"norm": "pre"}, "pre-LayerNorm"),
                                    ({"position": "rotary", "norm": "pre"}, "pretrain.model.norm: pre"),
                                    ({"attention": "local_global", "window": 8}, "local_global attention")])
def test_non_bert_variants_refuse_to_export(tmp_path, kw, why):
    tok_file = tmp_path / "tokenizer.json"
    specials = wordpiece(tok_file)
    m = model_for(tok_file, specials, **kw)
    with pytest.raises(ExportError, match=why) as e:
        export_hf(m, tmp_path / "hf", tok_file, specials)
    assert "safetensors only" in str(e.value)
    assert not (tmp_path / "hf" / "model.safetensors").exists()


@pytest.mark.parametrize("kw", [{}, {"tie_embeddings": False}, {"position": "rotary", "norm": "pre"}])
def test_safetensors_roundtrip_is_exact(tmp_path, kw):
    tok_file = tmp_path / "tokenizer.json"
    m = model_for(tok_file, wordpiece(tok_file), **kw)
    save_weights(m, tmp_path / "w.safetensors")
    assert read_arch(tmp_path / "w.safetensors") == m.arch
    torch.manual_seed(123)
    fresh = MLMEncoder(m.arch).eval()
    load_weights(fresh, tmp_path / "w.safetensors")
    for (k, a), (_, b) in zip(m.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), k
    if m.arch.tie_embeddings:
        assert fresh.decoder.weight is fresh.tok_emb.weight  # still tied after loading
    other = MLMEncoder(resolve_arch(ModelConfig(size="tiny"), 200, 0))
    with pytest.raises(ExportError):
        load_weights(other, tmp_path / "w.safetensors")


def test_no_pickle_anywhere(tmp_path, monkeypatch):
    """Weights are data, never pickles: the save/export paths never call torch.save or pickle, and the
    model package never mentions them in code."""
    import pickle
    import re

    def refuse(*a, **k):
        raise AssertionError("pickle used")
    monkeypatch.setattr(torch, "save", refuse)
    monkeypatch.setattr(pickle, "dump", refuse)
    monkeypatch.setattr(pickle, "dumps", refuse)
    tok_file = tmp_path / "tokenizer.json"
    specials = wordpiece(tok_file)
    m = model_for(tok_file, specials)
    save_weights(m, tmp_path / "w.safetensors")
    load_export(export_hf(m, tmp_path / "hf", tok_file, specials))

    repo = Path(__file__).resolve().parent.parent
    call = re.compile(r"\btorch\.(save|load)\(|^\s*(import|from) (pickle|dill|cloudpickle)\b", re.M)
    offenders = [str(f.relative_to(repo)) for f in (repo / "mlm_core" / "model").rglob("*.py")
                 if call.search(f.read_text(encoding="utf-8"))]
    assert not offenders, f"torch.save/torch.load/pickle used in {offenders}: write safetensors instead"
