"""The two rotary families (issue 20, item 1): a rotary post-LN model exports as ``RoFormerForMaskedLM`` and
``family: modernbert`` as ``ModernBertForMaskedLM``; transformers loads both exports with logits equal to ours
(< 1e-4) on packed rows with padding; checkpoints that transformers itself built (random, tiny, safetensors:
tests/hf_tiny.py) are read by ``pretrain.init_from``'s reader with equal logits and written back to the same class;
ModernBERT's init has the statistics of transformers' own. Every expected value comes from transformers.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))

from hf_tiny import save_tiny  # noqa: E402
from test_export import wordpiece  # noqa: E402

from mlm_core.config import ModelConfig  # noqa: E402
from mlm_core.model import MLMEncoder, export_hf, load_export, resolve_arch, save_weights  # noqa: E402
from mlm_core.model.pretrained import PretrainedError, build_encoder, read_pretrained  # noqa: E402

TOL = 1e-4
# documents long enough for ModernBERT's sliding layers (window 8 below: |i - j| <= 4) to see less than the document
DOCS = ["the cat sat on the mat and the dog sat on the log near the river", "le chat dort sur le tapis",
        "der hund schläft im haus und die katze auf der matte", "el perro come en la casa",
        "the dog eats in the house", "le chien dort dans la maison et le chat sur le tapis"]
TEXTS = DOCS * 4
CLASSES = {"rotary": "RoFormerForMaskedLM", "modernbert": "ModernBertForMaskedLM"}
VARIANTS = {
    "rotary": dict(position="rotary"),
    "rotary-untied": dict(position="rotary", tie_embeddings=False),
    "modernbert": dict(family="modernbert", layers=3, window=8, global_every=2),
    "modernbert-untied-global": dict(family="modernbert", tie_embeddings=False, attention="global"),
}


@pytest.fixture(autouse=True)
def _quiet():
    tf.logging.set_verbosity_error()


def _spread(model) -> None:
    """Weights well beyond the 0.02 init (and non-trivial norms, biases): a wrong mapping, window, base or
    layer pattern then moves the logits far beyond the tolerance (the tests check that it does)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(p + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.3)


def _ours(variant: str, tok_file: Path, specials: dict) -> MLMEncoder:
    from tokenizers import Tokenizer
    vocab = Tokenizer.from_file(str(tok_file)).get_vocab_size()
    cfg = ModelConfig(**({"size": "tiny", "layers": 2, "hidden": 32, "heads": 4, "max_positions": 128}
                         | VARIANTS[variant]))
    torch.manual_seed(0)
    m = MLMEncoder(resolve_arch(cfg, vocab, specials["pad"]["id"]))
    _spread(m)
    return m.eval()


def packed(folder: Path):
    """(packed ids [2, T], segment ids, per-document ids [6, L], attention mask, where each document sits):
    three documents per row, then padding; transformers sees the same documents one per row."""
    tok = tf.AutoTokenizer.from_pretrained(str(folder))
    docs = tok(DOCS, padding=True, return_tensors="pt")
    lens = docs["attention_mask"].sum(1).tolist()
    T = max(sum(lens[:3]), sum(lens[3:])) + 3
    ids = torch.full((2, T), tok.pad_token_id)
    seg = torch.zeros((2, T), dtype=torch.long)
    where = []
    for d, n in enumerate(lens):
        row, off = divmod(d, 3)
        start = sum(lens[row * 3: d])
        ids[row, start:start + n] = docs["input_ids"][d, :n]
        seg[row, start:start + n] = off + 1
        where.append((row, start, n))
    assert (seg == 0).any(dim=1).all()          # every row ends in padding
    return ids, seg, docs["input_ids"], docs["attention_mask"], where


def packed_diff(ours_model, theirs_model, folder: Path) -> float:
    """Max |ours - theirs| over every real token: ours on the packed rows, transformers on each document alone
    (rotary scores depend on i - j only, so a document's place in the row does not change its logits)."""
    ids, seg, doc_ids, doc_mask, where = packed(folder)
    with torch.no_grad():
        theirs = theirs_model(input_ids=doc_ids, attention_mask=doc_mask).logits
    ours = ours_model.full_logits(ids, seg)
    return max((ours[row, s:s + n] - theirs[d, :n]).abs().max().item() for d, (row, s, n) in enumerate(where))


def _load(folder: Path):
    model, info = tf.AutoModelForMaskedLM.from_pretrained(str(folder), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


# ---- our models out --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_export_loads_in_transformers_with_equal_logits_on_packed_rows(tmp_path, variant):
    tok_file = tmp_path / "tokenizer.json"
    specials = wordpiece(tok_file)
    m = _ours(variant, tok_file, specials)
    out = export_hf(m, tmp_path / "hf", tok_file, specials)
    hf = _load(out)
    assert type(hf).__name__ == CLASSES[variant.split("-")[0]]
    diff = packed_diff(m, hf, out)
    print(f"{variant}: max |ours - transformers| on packed rows = {diff:.3g}")
    assert diff < TOL
    # and back: the export reads into our class with the same function
    assert packed_diff(load_export(out), hf, out) < TOL
    mask = specials["mask"]["token"]
    fill = tf.pipeline("fill-mask", model=str(out), top_k=2)(f"le chat {mask} sur le tapis")
    assert len(fill) == 2


def test_roformer_comparison_can_fail(tmp_path):
    """Without the q / k row permutation (our half layout read as RoFormer's pairs) the logits move far."""
    from safetensors.torch import load_file, save_file
    tok_file = tmp_path / "tokenizer.json"
    specials = wordpiece(tok_file)
    m = _ours("rotary", tok_file, specials)
    out = export_hf(m, tmp_path / "hf", tok_file, specials)
    sd = load_file(str(out / "model.safetensors"))
    for i in range(m.arch.layers):
        for kind in ("weight", "bias"):
            q, k, _ = m.state_dict()[f"blocks.{i}.attn.qkv.{kind}"].chunk(3)
            sd[f"roformer.encoder.layer.{i}.attention.self.query.{kind}"] = q.contiguous()
            sd[f"roformer.encoder.layer.{i}.attention.self.key.{kind}"] = k.contiguous()
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    assert packed_diff(m, _load(out), out) > 100 * TOL


@pytest.mark.parametrize("edit", ["bert-layer-pattern", "wider-window", "one-theta"])
def test_modernbert_comparison_can_fail(tmp_path, edit):
    """ModernBERT's layer 0 is global (ours counts the k-th layer from 1 for family bert), its window is
    |i - j| <= local_attention // 2 and its two bases differ: changing any of them in config.json moves the logits."""
    tok_file = tmp_path / "tokenizer.json"
    specials = wordpiece(tok_file)
    m = _ours("modernbert", tok_file, specials)
    out = export_hf(m, tmp_path / "hf", tok_file, specials)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["layer_types"] == ["full_attention", "sliding_attention", "full_attention"]
    if edit == "bert-layer-pattern":
        cfg["layer_types"] = ["sliding_attention", "full_attention", "sliding_attention"]
    elif edit == "wider-window":
        cfg["local_attention"] = 16
    else:
        cfg["rope_parameters"]["full_attention"]["rope_theta"] = 10000.0
    (out / "config.json").write_text(json.dumps(cfg))
    assert packed_diff(m, _load(out), out) > 10 * TOL


def test_pre_ln_rotary_bert_refuses_naming_the_key(tmp_path):
    from mlm_core.model import ExportError
    tok_file = tmp_path / "tokenizer.json"
    specials = wordpiece(tok_file)
    cfg = ModelConfig(size="tiny", layers=2, hidden=32, heads=4, max_positions=64, position="rotary", norm="pre")
    m = MLMEncoder(resolve_arch(cfg, 200, 0))
    with pytest.raises(ExportError, match="pretrain.model.norm: pre") as e:
        export_hf(m, tmp_path / "hf", tok_file, specials)
    assert "family: modernbert" in str(e.value) and not (tmp_path / "hf" / "model.safetensors").exists()


# ---- transformers' checkpoints in, and back out ------------------------------------------------------------------
CHECKPOINTS = {
    "roformer": dict(config={"initializer_range": 0.4, "layer_norm_eps": 1e-3, "hidden_act": "gelu_new"}),
    "roformer-untied": dict(tie=False, config={"initializer_range": 0.4, "hidden_act": "relu", "embedding_size": 16}),
    # ModernBERT's tokenizer puts its special tokens last (pad id != 0); 3 layers: full, sliding, sliding
    "modernbert": dict(layers=3, vocab_size=400, config={"initializer_range": 0.4, "norm_eps": 1e-3,
                                                         "hidden_activation": "gelu_new"}),
    "modernbert-untied": dict(layers=4, vocab_size=400, tie=False,
                              config={"initializer_range": 0.4, "global_attn_every_n_layers": 2,
                                      "global_rope_theta": 50000.0, "local_attention": 6}),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {case: save_tiny(root / case, case.split("-")[0], TEXTS, max_positions=128, **kw)
            for case, kw in CHECKPOINTS.items()}


@pytest.mark.parametrize("case", list(CHECKPOINTS))
def test_transformers_checkpoint_round_trips_with_equal_logits(checkpoints, case, tmp_path):
    folder = checkpoints[case]
    family = case.split("-")[0]
    ref = _load(folder)
    p = read_pretrained(folder)
    assert p.family == family and p.arch.family == family
    tok = tf.AutoTokenizer.from_pretrained(str(folder))
    for role in ("pad", "unk", "cls", "sep", "mask"):
        want = {"token": getattr(tok, f"{role}_token"), "id": getattr(tok, f"{role}_token_id")}
        assert p.special_tokens[role] == want, role
    ours = build_encoder(p).eval()
    diff = packed_diff(ours, ref, folder)
    print(f"{case}: transformers' checkpoint read by ours: max diff {diff:.3g}")
    assert diff < TOL
    # export: the same class, equal logits; and read back exactly
    out = export_hf(ours, tmp_path / "hf", p.tokenizer_file, p.special_tokens)
    back = _load(out)
    assert type(back).__name__ == type(ref).__name__
    src, cfg = json.loads((folder / "config.json").read_text()), json.loads((out / "config.json").read_text())
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "pad_token_id", "tie_word_embeddings")
    keys += ("layer_types", "local_attention", "rope_parameters", "norm_eps", "hidden_activation") \
        if family == "modernbert" else ("embedding_size", "type_vocab_size", "layer_norm_eps", "hidden_act")
    assert {k: cfg[k] for k in keys} == {k: src[k] for k in keys}
    assert packed_diff(ours, back, out) < TOL
    again = read_pretrained(out)
    assert again.arch == p.arch and all(torch.equal(again.state[k], v) for k, v in p.state.items())


def test_pipeline_folders_of_both_families(tmp_path):
    """A model folder this pipeline wrote (model_config.json + model.safetensors) is read as what it is and
    exports to its class: a rotary BERT stays family bert (its stored Arch is unchanged) and exports as RoFormer."""
    tok_file = tmp_path / "tokenizer.json"
    specials = wordpiece(tok_file)
    for variant in ("rotary", "modernbert"):
        m = _ours(variant, tok_file, specials)
        run = tmp_path / variant
        save_weights(m, run / "model.safetensors")
        (run / "model_config.json").write_text(json.dumps({**m.arch.to_dict(), "objective": "mlm"}))
        shutil.copy(tok_file, run / "tokenizer.json")
        p = read_pretrained(run)
        assert p.arch == m.arch and p.family == ("bert" if variant == "rotary" else "modernbert")
        out = export_hf(build_encoder(p), run / "hf", p.tokenizer_file, specials)
        assert type(_load(out)).__name__ == CLASSES[variant]
        assert read_pretrained(out).family == ("roformer" if variant == "rotary" else "modernbert")


@pytest.mark.parametrize("case,edit,match", [
    ("roformer", {"rotary_value": True}, "rotary_value"),
    ("modernbert", {"attention_bias": True}, "attention_bias"),
    ("modernbert", {"classifier_activation": "silu"}, "classifier_activation"),
    ("modernbert", {"layer_types": ["sliding_attention", "full_attention", "full_attention"]}, "layer_types"),
    ("modernbert", {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}, "rope"),
])
def test_configs_this_encoder_cannot_compute_are_refused(checkpoints, tmp_path, case, edit, match):
    d = shutil.copytree(checkpoints[case], tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg | edit))
    with pytest.raises(PretrainedError, match=match) as e:
        read_pretrained(d)
    assert "pretrain.init_from" in str(e.value) and str(d / "config.json") in str(e.value)


def test_edited_roformer_position_table_is_refused(checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file
    d = shutil.copytree(checkpoints["roformer"], tmp_path / "m")
    sd = load_file(str(d / "model.safetensors"))
    sd["roformer.encoder.embed_positions.weight"] = sd["roformer.encoder.embed_positions.weight"] * 1.5
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(PretrainedError, match="embed_positions"):
        read_pretrained(d)


def test_absent_config_keys_take_transformers_defaults():
    from mlm_core.model.hf_layout import arch_from_hf_config
    from mlm_core.model.hf_modernbert import arch_from_modernbert_config
    shape = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    full = tf.RoFormerConfig().to_dict()
    assert arch_from_hf_config({k: full[k] for k in shape}, "roformer") == arch_from_hf_config(full, "roformer")
    full = tf.ModernBertConfig().to_dict()
    assert arch_from_modernbert_config({k: full[k] for k in shape}) == arch_from_modernbert_config(full)


# ---- ModernBERT's init -------------------------------------------------------------------------------------------
def _kind(name: str) -> str:
    """Parameter kind of either naming (ours / transformers'), for comparing init statistics."""
    for kind, keys in (("embedding", ("tok_emb", "tok_embeddings")), ("qkv", ("qkv", "Wqkv")),
                       ("attn_out", ("attn.out", "attn.Wo")), ("ffn_in", ("ffn_in", "mlp.Wi")),
                       ("ffn_out", ("ffn_out", "mlp.Wo")), ("head_dense", ("head_dense", "head.dense")),
                       ("norm", ("norm",)), ("output_bias", ("head_bias", "decoder.bias")),
                       ("decoder", ("decoder.weight",))):
        if any(k in name for k in keys):
            return kind
    raise AssertionError(name)


def _stats(named) -> dict[str, dict]:
    out: dict[str, list] = {}
    for name, p in named:
        out.setdefault(_kind(name), []).append(p.detach().flatten())
    return {k: {"std": torch.cat(v).std().item(), "mean": torch.cat(v).mean().item(),
                "max": torch.cat(v).abs().max().item()} for k, v in out.items()}


@pytest.mark.parametrize("tie", [True, False])
def test_modernbert_init_statistics_equal_transformers(tie):
    """Per parameter kind, the std, mean and largest magnitude of our fresh ModernBERT equal those of a
    ModernBertForMaskedLM that transformers initialises with the same shape (truncated normals; 2-4% sampling
    noise at these sizes)."""
    V, H, L, F, heads = 2000, 256, 4, 384, 4
    torch.manual_seed(0)
    ours = MLMEncoder(resolve_arch(ModelConfig(family="modernbert", layers=L, hidden=H, heads=heads, ffn=F,
                                               tie_embeddings=tie), V, 3))
    torch.manual_seed(1)
    theirs = tf.ModernBertForMaskedLM(tf.ModernBertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=L,
                                                          num_attention_heads=heads, intermediate_size=F,
                                                          pad_token_id=3, tie_word_embeddings=tie))
    a, b = _stats(ours.named_parameters()), _stats(theirs.named_parameters())
    assert set(a) == set(b), (set(a) ^ set(b))
    for kind in a:
        print(kind, {k: round(v, 5) for k, v in a[kind].items()}, {k: round(v, 5) for k, v in b[kind].items()})
        if b[kind]["std"] == 0:                       # constant: the norms' 1, the output bias 0
            assert a[kind] == pytest.approx(b[kind], abs=1e-7), kind
            continue
        assert a[kind]["std"] == pytest.approx(b[kind]["std"], rel=0.04), kind
        assert abs(a[kind]["mean"]) < 0.1 * b[kind]["std"], kind
        assert a[kind]["max"] == pytest.approx(b[kind]["max"], rel=0.03), kind       # the same truncation
    # and the pad row is drawn like the rest, as transformers leaves it
    assert ours.tok_emb.weight[3].abs().max() > 0 and theirs.model.embeddings.tok_embeddings.weight[3].abs().max() > 0


# ---- the config surface ------------------------------------------------------------------------------------------
def test_family_modernbert_config_is_modernbert_with_transformers_defaults():
    from pydantic import ValidationError

    from mlm_core.config.io import ConfigError, load_config
    c = ModelConfig(family="modernbert")
    assert (c.norm, c.position, c.attention) == ("pre", "rotary", "local_global")
    arch = resolve_arch(c, 1000, 0)
    ref = tf.ModernBertConfig()                  # its defaults, read from transformers
    assert arch.window == ref.local_attention and arch.ln_eps == ref.norm_eps
    assert (arch.rope_theta, arch.local_rope_theta) == (ref.rope_parameters["full_attention"]["rope_theta"],
                                                        ref.rope_parameters["sliding_attention"]["rope_theta"])
    assert arch.activation == ref.hidden_activation and arch.head_activation == ref.classifier_activation
    with torch.device("meta"):
        layers = MLMEncoder(resolve_arch(ModelConfig(family="modernbert", size="base"), 50368, 50283))._global
    assert ["full_attention" if g else "sliding_attention" for g in layers] == tf.ModernBertConfig(
        num_hidden_layers=22).layer_types
    assert ModelConfig(family="modernbert", attention="global").attention == "global"
    for bad in ({"norm": "post"}, {"position": "learned"}):
        with pytest.raises(ValidationError, match=f"pretrain.model.{next(iter(bad))}"):
            ModelConfig(family="modernbert", **bad)
    # a BERT model's stored Arch is what it was before the new fields existed
    assert set(resolve_arch(ModelConfig(position="rotary"), 100, 0).to_dict()) == {
        "layers", "hidden", "heads", "ffn", "dropout", "max_positions", "position", "norm", "tie_embeddings",
        "vocab_size", "pad_id"}
    with pytest.raises(ConfigError, match="objective electra"):
        load_config(raw={"workdir": "/tmp/x", "sources": {"en": {"paths": [__file__]}},
                         "pretrain": {"objective": "electra", "model": {"family": "modernbert"}}})


def test_modernbert_config_in_transformers_4_keys(checkpoints, tmp_path):
    """ModernBERT's published configs (transformers 4.x) carry global_attn_every_n_layers and the two *_rope_theta
    keys instead of layer_types / rope_parameters: read as transformers 5 reads them, with equal logits."""
    d = shutil.copytree(checkpoints["modernbert-untied"], tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["layer_types"] == ["full_attention", "sliding_attention"] * 2
    legacy = {k: v for k, v in cfg.items() if k not in ("layer_types", "rope_parameters")} | {
        "global_attn_every_n_layers": 2, "global_rope_theta": cfg["rope_parameters"]["full_attention"]["rope_theta"],
        "local_rope_theta": cfg["rope_parameters"]["sliding_attention"]["rope_theta"]}
    (d / "config.json").write_text(json.dumps(legacy))
    p, ref = read_pretrained(d), _load(d)
    assert ref.config.layer_types == cfg["layer_types"]
    assert p.arch == read_pretrained(checkpoints["modernbert-untied"]).arch
    assert packed_diff(build_encoder(p).eval(), ref, d) < TOL


def test_objective_electra_from_a_modernbert_checkpoint_is_refused(checkpoints):
    from types import SimpleNamespace

    from mlm_core.errors import StageError
    from mlm_core.train.init_from import _check_objective
    with pytest.raises(StageError, match="no ModernBERT ELECTRA"):
        _check_objective(SimpleNamespace(objective="electra"), read_pretrained(checkpoints["modernbert"]), "x")
