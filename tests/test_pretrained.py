"""pretrain.init_from at the model level: tiny random transformers checkpoints of each family (saved with
save_pretrained, tokenizers built with the ``tokenizers`` library: tests/hf_tiny.py) read into our encoder
give transformers' logits; the export writes the same family back and transformers loads it with equal
logits; bad folders are refused with the file and the field named. The reference is always transformers."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

from hf_tiny import save_tiny  # noqa: E402

from mlm_core.config import ModelConfig  # noqa: E402
from mlm_core.model import MLMEncoder, export_hf, load_export, resolve_arch, save_weights  # noqa: E402
from mlm_core.model.export_electra import export_electra  # noqa: E402
from mlm_core.model.pretrained import (SUPPORTED_ARCHITECTURES, PretrainedError, build_electra,  # noqa: E402
                                       build_encoder, check_model_config, read_pretrained)

TEXTS = [
    "the cat sat on the mat and the dog sat on the log",
    "a quick brown fox jumps over the lazy dog near the river bank",
    "colorless green ideas sleep furiously while the river flows",
    "der hund schläft unter dem tisch und die katze auf dem stuhl",
    "le chat dort sur le tapis et le chien dans le jardin",
] * 4
BATCH = ["the cat sat on the mat", "a quick brown fox jumps over the lazy dog near the river", "le chien"]
# non-default epsilon / activation wherever the family computes with them; untied heads in some. Weights
# drawn wider than the usual 0.02 (initializer_range) and a large epsilon, so that a wrong GELU variant or
# epsilon moves the logits far beyond the tolerance (test_logits_equal... checks that it does)
_WIDE = {"initializer_range": 0.4}
CASES = {
    "bert": dict(config=_WIDE | {"layer_norm_eps": 1e-3, "hidden_act": "gelu_new", "type_vocab_size": 2}),
    "bert-untied": dict(family="bert", tie=False, config=_WIDE | {"hidden_act": "relu", "layer_norm_eps": 1e-2}),
    # RoBERTa's lm_head applies exact gelu whatever hidden_act says
    "roberta": dict(config=_WIDE | {"layer_norm_eps": 1e-3, "hidden_act": "gelu_new"}),
    "xlm-roberta": dict(tie=False, config=_WIDE | {"layer_norm_eps": 1e-3, "hidden_act": "gelu_pytorch_tanh"}),
    "electra": dict(config=_WIDE | {"layer_norm_eps": 1e-3, "hidden_act": "gelu_fast"}),
}
TOL = 1e-4


def _family(case: str) -> str:
    return CASES[case].get("family", case)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for case, kw in CASES.items():
        kw = {k: v for k, v in kw.items() if k != "family"}
        out[case] = save_tiny(root / case, _family(case), TEXTS, vocab_size=200, **kw)
    return out


def _batch(folder: Path):
    tok = tf.AutoTokenizer.from_pretrained(str(folder))
    enc = tok(BATCH, padding=True, return_tensors="pt")
    assert (enc["attention_mask"] == 0).any()          # a padded batch: pad positions must not leak
    return enc["input_ids"], enc["attention_mask"]


def _ours(model, ids, mask):
    return model.full_logits(ids, mask)                # segment ids = attention mask: pads neither attend nor count


def _max_diff(a, b, mask):
    m = mask.bool()
    return (a[m] - b[m]).abs().max().item()


@pytest.mark.parametrize("case", [c for c in CASES if c != "electra"])
def test_logits_equal_transformers_before_training(folders, case):
    folder = folders[case]
    p = read_pretrained(folder)
    assert p.family == _family(case)
    theirs_model = tf.AutoModelForMaskedLM.from_pretrained(str(folder)).eval()
    assert type(theirs_model).__name__ == json.loads((folder / "config.json").read_text())["architectures"][0]
    cfg = theirs_model.config
    assert p.max_positions == cfg.max_position_embeddings - (cfg.pad_token_id + 1 if case in ("roberta", "xlm-roberta")
                                                             else 0) == 64
    assert p.arch.ln_eps == cfg.layer_norm_eps and p.arch.activation == cfg.hidden_act
    assert p.arch.tie_embeddings == cfg.tie_word_embeddings
    tok = tf.AutoTokenizer.from_pretrained(str(folder))
    for role in ("pad", "unk", "cls", "sep", "mask"):
        want = {"token": getattr(tok, f"{role}_token"), "id": getattr(tok, f"{role}_token_id")}
        assert p.special_tokens[role] == want
    ids, mask = _batch(folder)
    with torch.no_grad():
        theirs = theirs_model(input_ids=ids, attention_mask=mask).logits
    ours = _ours(build_encoder(p).eval(), ids, mask)
    assert _max_diff(ours, theirs, mask) < TOL
    # the comparison can fail: the wrong activation, epsilon, head activation or position offset moves the logits
    wrong = [{"activation": "gelu"}, {"ln_eps": 1e-12}]
    if p.family != "bert":
        wrong.append({"family": "bert", "position_offset": 0})      # BERT's head activation and positions
    for w in wrong:
        m = MLMEncoder(dataclasses.replace(p.arch, **w)).eval()
        m.load_state_dict({k: v for k, v in p.state.items() if k != "pos_emb.weight"} |
                          {"pos_emb.weight": p.state["pos_emb.weight"][:m.pos_emb.weight.shape[0]]})
        assert _max_diff(_ours(m, ids, mask), theirs, mask) > 10 * TOL, w


def test_electra_pair_logits_equal_transformers(folders):
    folder = folders["electra"]
    p = read_pretrained(folder)
    assert p.family == "electra" and p.disc_arch is not None and p.arch.hidden == 16 and p.disc_arch.hidden == 32
    model = build_electra(p).eval()
    ids, mask = _batch(folder)
    disc = tf.ElectraForPreTraining.from_pretrained(str(folder)).eval()
    gen = tf.ElectraForMaskedLM.from_pretrained(str(folder / "generator")).eval()
    with torch.no_grad():
        d_theirs = disc(input_ids=ids, attention_mask=mask).logits
        g_theirs = gen(input_ids=ids, attention_mask=mask).logits
        d_ours = model.disc.full_rtd_logits(ids, mask)
    assert _max_diff(d_ours, d_theirs, mask) < TOL
    assert _max_diff(_ours(model.gen, ids, mask), g_theirs, mask) < TOL
    # the generator alone (build_encoder) computes the same
    assert _max_diff(_ours(build_encoder(p).eval(), ids, mask), g_theirs, mask) < TOL


@pytest.mark.parametrize("case", [c for c in CASES if c != "electra"])
def test_export_same_family_reloads_with_equal_logits_and_fills_masks(folders, case, tmp_path):
    folder = folders[case]
    p = read_pretrained(folder)
    ours_model = build_encoder(p).eval()
    out = export_hf(ours_model, tmp_path / "hf", p.tokenizer_file, p.special_tokens)
    cfg = json.loads((out / "config.json").read_text())
    src = json.loads((folder / "config.json").read_text())
    for key in ("architectures", "model_type", "max_position_embeddings", "pad_token_id", "type_vocab_size",
                "layer_norm_eps", "hidden_act", "vocab_size", "tie_word_embeddings"):
        assert cfg[key] == src[key], key
    back = tf.AutoModelForMaskedLM.from_pretrained(str(out)).eval()
    assert type(back).__name__ == src["architectures"][0]
    ids, mask = _batch(out)
    assert torch.equal(ids, _batch(folder)[0])            # the tokenizer kept, with the same special tokens
    tok_in, tok_out = tf.AutoTokenizer.from_pretrained(str(folder)), tf.AutoTokenizer.from_pretrained(str(out))
    for role in ("pad", "unk", "cls", "sep", "mask", "bos", "eos"):
        assert getattr(tok_out, f"{role}_token") == getattr(tok_in, f"{role}_token"), role
    assert tok_out.model_max_length == p.max_positions
    with torch.no_grad():
        theirs = back(input_ids=ids, attention_mask=mask).logits
    ours = _ours(ours_model, ids, mask)
    assert _max_diff(ours, theirs, mask) < TOL
    assert _max_diff(_ours(load_export(out), ids, mask), ours, mask) < TOL
    # import -> export -> import is exact, every token-type / position row included
    again = read_pretrained(out)
    assert again.arch == p.arch and again.special_tokens == p.special_tokens
    assert all(torch.equal(again.state[k], v) for k, v in p.state.items())
    mask_tok = p.special_tokens["mask"]["token"]
    fill = tf.pipeline("fill-mask", model=str(out), top_k=3)(f"the cat sat on the {mask_tok}")
    assert len(fill) == 3 and all("token_str" in r and 0 <= r["score"] <= 1 for r in fill)
    # our fill-mask (load_model_dir -> load_export) on the export and on the original folder: transformers' ranking
    from mlm_core.fillmask import fill_mask
    for where in (out, folder):
        mine = fill_mask(where, f"the cat sat on the {mask_tok}", top_k=3)[0]
        assert [r["token_id"] for r in mine] == [r["token"] for r in fill]
        assert [r["score"] for r in mine] == pytest.approx([r["score"] for r in fill], abs=1e-4)


def test_electra_in_electra_out(folders, tmp_path):
    p = read_pretrained(folders["electra"])
    model = build_electra(p).eval()
    g_dir, d_dir = export_electra(model.gen, model.disc, tmp_path / "run", p.tokenizer_file, p.special_tokens)
    ids, mask = _batch(d_dir)
    disc = tf.ElectraForPreTraining.from_pretrained(str(d_dir)).eval()
    gen = tf.AutoModelForMaskedLM.from_pretrained(str(g_dir)).eval()
    assert type(gen).__name__ == "ElectraForMaskedLM"
    with torch.no_grad():
        assert _max_diff(model.disc.full_rtd_logits(ids, mask), disc(input_ids=ids, attention_mask=mask).logits,
                         mask) < TOL
        assert _max_diff(_ours(model.gen, ids, mask), gen(input_ids=ids, attention_mask=mask).logits, mask) < TOL
    assert tf.pipeline("fill-mask", model=str(g_dir), top_k=2)("the cat [MASK] on the mat")
    # our export layout is a pair too: from hf-discriminator/ (sibling hf/) and from hf/ (sibling hf-discriminator/)
    for start in (d_dir, g_dir):
        again = read_pretrained(start)
        assert again.family == "electra" and again.disc_arch == p.disc_arch and again.arch == p.arch
        assert all(torch.equal(again.disc_state[k], v) for k, v in p.disc_state.items())


def test_electra_generator_alone_is_an_mlm(folders, tmp_path):
    gen_dir = shutil.copytree(folders["electra"] / "generator", tmp_path / "gen")
    p = read_pretrained(gen_dir)
    assert p.family == "electra" and p.disc_arch is None
    out = export_hf(build_encoder(p), tmp_path / "out", p.tokenizer_file, p.special_tokens)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["ElectraForMaskedLM"]
    ids, mask = _batch(gen_dir)
    ref = tf.ElectraForMaskedLM.from_pretrained(str(gen_dir)).eval()
    back = tf.AutoModelForMaskedLM.from_pretrained(str(out)).eval()
    with torch.no_grad():
        assert _max_diff(back(input_ids=ids, attention_mask=mask).logits,
                         ref(input_ids=ids, attention_mask=mask).logits, mask) < TOL


def test_sharded_checkpoint(folders, tmp_path):
    m = tf.AutoModelForMaskedLM.from_pretrained(str(folders["roberta"]))
    m.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folders["roberta"] / f, tmp_path / "sharded" / f)
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    p, ref = read_pretrained(tmp_path / "sharded"), read_pretrained(folders["roberta"])
    assert all(torch.equal(p.state[k], v) for k, v in ref.state.items())


# ---- this pipeline's own folders ---------------------------------------------------------------------------
def _specials():
    return {r: {"token": t, "id": i} for i, (r, t) in enumerate(zip(("pad", "unk", "cls", "sep", "mask"),
                                                                   ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")))}


def test_pipeline_folder_and_its_hf_export(folders, tmp_path):
    tok_file = folders["bert"] / "tokenizer.json"
    V = json.loads((folders["bert"] / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    model = MLMEncoder(resolve_arch(ModelConfig(size="tiny", max_positions=32), V, 0)).eval()
    run = tmp_path / "run"                     # as mlm_core/train/stage.py writes it
    save_weights(model, run / "model.safetensors")
    (run / "model_config.json").write_text(json.dumps({**model.arch.to_dict(), "objective": "mlm"}))
    shutil.copy(tok_file, run / "tokenizer.json")
    export_hf(model, run / "hf", tok_file, _specials())
    ids = torch.tensor([[2, 30, 31, 4, 3]])
    for folder in (run, run / "hf"):           # the stage output, and the hf/ a registered model downloads as
        p = read_pretrained(folder)
        assert p.family == "bert" and p.special_tokens == _specials() and p.max_positions == 32
        assert torch.allclose(build_encoder(p).eval().full_logits(ids), model.full_logits(ids), atol=1e-6)


def test_pipeline_electra_folder(folders, tmp_path):
    p0 = read_pretrained(folders["electra"])
    model = build_electra(p0)
    run = tmp_path / "run"
    save_weights(model.gen, run / "model.safetensors")
    save_weights(model.disc, run / "discriminator.safetensors")
    (run / "model_config.json").write_text(json.dumps({**model.gen.arch.to_dict(), "objective": "electra"}))
    shutil.copy(p0.tokenizer_file, run / "tokenizer.json")
    p = read_pretrained(run)
    assert p.family == "electra" and p.disc_arch == p0.disc_arch
    assert all(torch.equal(p.disc_state[k], v) for k, v in p0.disc_state.items())


def test_pipeline_folder_continued_from_roberta_stays_roberta(folders, tmp_path):
    """A model continued from RoBERTa is stored with its family (Arch fields in the safetensors metadata) and
    exports back as RobertaForMaskedLM."""
    p0 = read_pretrained(folders["roberta"])
    model = build_encoder(p0).eval()
    run = tmp_path / "run"
    save_weights(model, run / "model.safetensors")
    (run / "model_config.json").write_text(json.dumps({**model.arch.to_dict(), "objective": "mlm"}))
    shutil.copy(p0.tokenizer_file, run / "tokenizer.json")
    p = read_pretrained(run)
    assert p.family == "roberta" and p.arch == p0.arch and p.special_tokens == p0.special_tokens
    out = export_hf(build_encoder(p), run / "hf", p.tokenizer_file, p.special_tokens)
    assert type(tf.AutoModelForMaskedLM.from_pretrained(str(out))).__name__ == "RobertaForMaskedLM"


def test_legacy_layernorm_names(folders, tmp_path):
    """Old checkpoints name LayerNorm parameters gamma / beta; transformers renames them on load, and so do we."""
    from safetensors.torch import load_file, save_file
    d = shutil.copytree(folders["bert"], tmp_path / "old")
    sd = load_file(str(d / "model.safetensors"))
    renamed = {(k[:-7] + ".gamma" if "LayerNorm.weight" in k else k[:-5] + ".beta" if "LayerNorm.bias" in k else k): v
               for k, v in sd.items()}
    assert any(k.endswith(".gamma") for k in renamed)
    save_file(renamed, str(d / "model.safetensors"), metadata={"format": "pt"})
    ref = read_pretrained(folders["bert"])
    assert all(torch.equal(read_pretrained(d).state[k], v) for k, v in ref.state.items())


# ---- refusals ----------------------------------------------------------------------------------------------
def _hf_folder_with(tmp_path, folders, config_edit=None, drop=(), add=()):
    d = shutil.copytree(folders["bert"], tmp_path / "m")
    if config_edit:
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(config_edit(cfg)))
    for f in drop:
        (d / f).unlink()
    for f, data in add:
        (d / f).write_bytes(data)
    return d


@pytest.mark.parametrize("arch", ["GPT2LMHeadModel", "DistilBertForMaskedLM"])
def test_unsupported_architecture_lists_the_supported(folders, tmp_path, arch):
    d = _hf_folder_with(tmp_path, folders, lambda c: c | {"architectures": [arch]})
    with pytest.raises(PretrainedError) as e:
        read_pretrained(d)
    msg = str(e.value)
    assert arch in msg and "pretrain.init_from" in msg and str(d / "config.json") in msg
    assert all(a in msg for a in SUPPORTED_ARCHITECTURES)


def test_pickle_only_is_refused_unopened(folders, tmp_path, monkeypatch):
    import pickle
    # a pickle that would fail loudly if anything unpickled it
    d = _hf_folder_with(tmp_path, folders, drop=["model.safetensors"], add=[("pytorch_model.bin", b"\x80\x04garbage")])
    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("unpickled"))
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("unpickled"))
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load"))
    with pytest.raises(PretrainedError) as e:
        read_pretrained(d)
    msg = str(e.value)
    assert "pytorch_model.bin" in msg and "safetensors" in msg and "save_pretrained" in msg
    assert "pretrain.init_from" in msg and str(d) in msg


def test_no_weights_is_refused(folders, tmp_path):
    d = _hf_folder_with(tmp_path, folders, drop=["model.safetensors"])
    with pytest.raises(PretrainedError, match="holds no weights") as e:
        read_pretrained(d)
    assert "pretrain.init_from" in str(e.value)
    with pytest.raises(PretrainedError, match="no config.json"):
        read_pretrained(_empty(tmp_path))


def _empty(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "model.safetensors").write_bytes(b"")
    return tmp_path / "empty"


def test_tokenizer_larger_than_the_embedding_table(folders, tmp_path):
    # the xlm-roberta tokenizer (200 ids + <mask>) in front of the smaller bert table: ids the model has no row for
    d = _hf_folder_with(tmp_path, folders)
    cfg = json.loads((d / "config.json").read_text())
    shutil.copy(folders["roberta"] / "tokenizer.json", d / "tokenizer.json")
    (d / "tokenizer_config.json").unlink()
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.add_tokens([f"extra{i}" for i in range(cfg["vocab_size"])])
    tok.save(str(d / "tokenizer.json"))
    with pytest.raises(PretrainedError) as e:
        read_pretrained(d)
    msg = str(e.value)
    assert str(d / "tokenizer.json") in msg and str(d / "config.json") in msg and "pretrain.init_from" in msg


def test_pad_id_disagreement(folders, tmp_path):
    d = _hf_folder_with(tmp_path, folders, lambda c: c | {"pad_token_id": 3})
    with pytest.raises(PretrainedError, match="pad_token_id 3"):
        read_pretrained(d)


def test_discriminator_without_generator_is_refused(folders, tmp_path):
    d = shutil.copytree(folders["electra"], tmp_path / "disc", ignore=shutil.ignore_patterns("generator"))
    with pytest.raises(PretrainedError, match="without its generator") as e:
        read_pretrained(d)
    assert str(d / "generator") in str(e.value)


def test_electra_pair_with_different_embeddings_is_refused(folders, tmp_path):
    d = shutil.copytree(folders["electra"], tmp_path / "pair")
    gen = tf.ElectraForMaskedLM.from_pretrained(str(d / "generator"))
    with torch.no_grad():
        gen.electra.embeddings.word_embeddings.weight.add_(1.0)
    gen.save_pretrained(d / "generator")
    with pytest.raises(PretrainedError, match="different embedding"):
        read_pretrained(d)


def test_check_model_config(folders):
    p = read_pretrained(folders["bert"])
    check_model_config(p, ModelConfig())                                  # nothing explicit: the checkpoint's shape
    check_model_config(p, ModelConfig(layers=2, hidden=32, heads=2, ffn=64, max_positions=64, dropout=0.3))
    with pytest.raises(PretrainedError) as e:
        check_model_config(p, ModelConfig(layers=5, max_positions=128, tie_embeddings=True))
    msg = str(e.value)
    assert "pretrain.model.layers = 5" in msg and "checkpoint has 2" in msg
    assert "pretrain.model.max_positions = 128" in msg and "64" in msg
    assert "tie_embeddings" not in msg                                    # agrees with the checkpoint
    assert str(folders["bert"] / "config.json") in msg and "pretrain.init_from" in msg
    with pytest.raises(PretrainedError, match="pretrain.model.size = 'tiny'"):
        check_model_config(p, ModelConfig(size="tiny"))
    with pytest.raises(PretrainedError, match="pretrain.model.position"):
        check_model_config(p, ModelConfig(position="rotary"))


# ---- defaults the reader assumes for absent config keys = transformers' config classes' ------------------------
def test_absent_config_keys_take_transformers_defaults():
    from mlm_core.model.hf_layout import arch_from_hf_config
    for family, Cfg in (("bert", tf.BertConfig), ("roberta", tf.RobertaConfig), ("xlm-roberta", tf.XLMRobertaConfig),
                        ("electra", tf.ElectraConfig)):
        full = Cfg().to_dict()
        sparse = {k: full[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                       "vocab_size")}
        assert arch_from_hf_config(sparse, family) == arch_from_hf_config(full, family), family


def test_unknown_tensors_are_refused_and_model_type_stands_in_for_architectures(folders, tmp_path):
    from safetensors.torch import load_file, save_file
    d = _hf_folder_with(tmp_path, folders, lambda c: {k: v for k, v in c.items() if k != "architectures"})
    assert read_pretrained(d).family == "bert"          # model_type "bert" -> BertForMaskedLM
    sd = load_file(str(d / "model.safetensors")) | {"bert.encoder.layer.0.attention.self.rel_bias": torch.zeros(2)}
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(PretrainedError, match="rel_bias") as e:
        read_pretrained(d)
    assert str(d / "model.safetensors") in str(e.value)
