"""The encoder: shapes, the gathered MLM head, block-diagonal attention over packed documents, padding,
a one-batch overfit, position encodings, the variants and the size/FLOP accounting."""
from __future__ import annotations

import math

import pytest

import torch  # a required dependency: missing must fail loudly, not skip the module

from mlm_core.config import ModelConfig  # noqa: E402
from mlm_core.model import SIZES, Arch, ArchError, MLMEncoder, resolve_arch  # noqa: E402
from mlm_core.model.encoder import segment_mask, sinusoidal_table  # noqa: E402

V = 97


def tiny(**kw) -> MLMEncoder:
    cfg = ModelConfig(size="tiny", layers=2, hidden=32, heads=4, ffn=64, max_positions=64, dropout=0.0, **kw)
    torch.manual_seed(0)
    return MLMEncoder(resolve_arch(cfg, vocab_size=V, pad_id=0)).eval()


def batch(B=3, T=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    labels = torch.full((B, T), -100)
    pick = torch.rand(B, T, generator=g) < 0.3
    pick[0, 0] = True
    labels[pick] = ids[pick]
    return ids, labels


def test_shapes_and_gathered_head_equals_full_logits():
    m = tiny()
    ids, labels = batch()
    out = m(ids, labels=labels)
    n = int((labels != -100).sum())
    assert out["hidden"].shape == (3, 12, 32)
    assert out["logits"].shape == (n, V) and out["n_predictions"] == n
    assert out["loss"].ndim == 0 and torch.isfinite(out["loss"])
    full = m.full_logits(ids)
    assert full.shape == (3, 12, V)
    torch.testing.assert_close(out["logits"], full[labels != -100], atol=1e-5, rtol=1e-5)
    # label smoothing changes the loss; no labels -> no loss; no selected position -> zero loss with a graph
    assert not torch.isclose(m(ids, labels=labels, label_smoothing=0.1)["loss"], out["loss"])
    assert m(ids)["loss"] is None
    empty = m(ids, labels=torch.full_like(ids, -100))
    assert empty["loss"].item() == 0.0 and empty["n_predictions"] == 0
    empty["loss"].backward()


def test_segment_mask_isolates_packed_documents():
    m = tiny()
    seg = torch.tensor([[1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0]])
    ids = torch.randint(5, V, (1, 12))
    other = ids.clone()
    other[0, 5:9] = torch.randint(5, V, (4,))  # rewrite document 2
    h1, h2 = m.encode(ids, seg), m.encode(other, seg)
    torch.testing.assert_close(h1[0, :5], h2[0, :5], atol=1e-6, rtol=0)
    assert not torch.allclose(h1[0, 5:9], h2[0, 5:9])
    assert torch.isfinite(h1).all()  # padded query rows attend to themselves: no NaN


def test_mask_is_block_diagonal_and_never_sees_padding():
    mask = segment_mask(torch.tensor([[1, 1, 2, 0]]))[0, 0]
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(mask, expected)


def test_padding_does_not_affect_real_tokens():
    m = tiny()
    ids = torch.randint(5, V, (1, 8))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    seg = torch.tensor([[1] * 8 + [0] * 4])
    torch.testing.assert_close(m.encode(ids)[0], m.encode(padded, seg)[0, :8], atol=1e-5, rtol=0)
    padded[0, 8:] = torch.randint(5, V, (4,))  # whatever sits in the padding
    torch.testing.assert_close(m.encode(ids)[0], m.encode(padded, seg)[0, :8], atol=1e-5, rtol=0)


def test_overfits_one_batch():
    m = tiny().train()
    ids, labels = batch(B=4, T=16)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = m(ids, labels=labels)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_sinusoidal_table_matches_formula():
    table = sinusoidal_table(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    m = tiny(position="sinusoidal")
    assert "pos_table" not in m.state_dict()  # fixed: rebuilt, never saved
    assert sinusoidal_table(5, 7).shape == (5, 7)  # odd width


@pytest.mark.parametrize("kw", [{"norm": "pre"}, {"position": "rotary"}, {"norm": "pre", "position": "rotary"},
                                {"tie_embeddings": False}, {"family": "modernbert", "window": 4, "global_every": 2}])
def test_variants_run_and_learn(kw):
    m = tiny(**kw).train()
    ids, labels = batch()
    seg = torch.tensor([[1] * 6 + [2] * 6, [1] * 12, [1] * 9 + [0] * 3])
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    first = None
    for _ in range(5):
        loss = m(ids, seg, labels=labels)["loss"]
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss) and loss.item() < first
    if kw.get("tie_embeddings") is False:
        assert m.decoder.weight is not m.tok_emb.weight


def test_rotary_is_relative():
    """With RoPE the packed document's hidden states don't depend on where in the row it starts...
    only relative positions enter attention, so doc 2 equals the same tokens encoded alone."""
    m = tiny(position="rotary")
    doc = torch.randint(5, V, (1, 5))
    row = torch.cat([torch.randint(5, V, (1, 4)), doc], dim=1)
    seg = torch.tensor([[1] * 4 + [2] * 5])
    torch.testing.assert_close(m.encode(row, seg)[0, 4:], m.encode(doc)[0], atol=1e-5, rtol=0)


def test_tied_decoder_shares_the_embedding():
    m = tiny()
    assert m.decoder.weight is m.tok_emb.weight
    assert m.tok_emb.weight[0].abs().sum() == 0  # pad row starts at zero (BERT init)


def test_resolve_arch_sizes_and_scale():
    assert SIZES["base"] == {"layers": 12, "hidden": 768, "heads": 12, "ffn": 3072}
    a = resolve_arch(ModelConfig(size="small"), vocab_size=8000, pad_id=0)
    assert (a.layers, a.hidden, a.heads, a.ffn) == (4, 256, 4, 1024)
    assert resolve_arch(ModelConfig(size="tiny", hidden=192), 100, 0).ffn == 768  # explicit hidden -> 4 x hidden
    g = resolve_arch(ModelConfig(size="base"), 30522, 0, scale=0.25)
    assert (g.hidden, g.heads, g.ffn, g.layers) == (192, 12, 768, 12) and g.hidden % g.heads == 0
    g = resolve_arch(ModelConfig(size="tiny", position="rotary"), 100, 0, scale=0.3)
    assert g.hidden % (2 * g.heads) == 0
    assert Arch.from_dict(a.to_dict()) == a
    with pytest.raises(ArchError):
        Arch.from_dict({**a.to_dict(), "bogus": 1})
    with pytest.raises(ArchError):
        resolve_arch(ModelConfig(size="tiny", hidden=30, heads=2, position="rotary"), 100, 0)  # head size 15


def test_base_is_bert_base_sized():
    arch = resolve_arch(ModelConfig(size="base"), vocab_size=30522, pad_id=0)
    with torch.device("meta"):  # shapes only: no memory, no init cost
        m = MLMEncoder(arch)
    total = m.num_params(non_embedding=False)
    assert 105e6 < total < 115e6, total  # BERT-base: ~110M
    assert 84e6 < m.num_params() < 87e6  # 12 x 7.08M blocks + head transform


def test_flops_per_token_is_6n_plus_attention():
    m = tiny()
    a, T = m.arch, 32
    n_body = a.layers * (4 * a.hidden ** 2 + 2 * a.hidden * a.ffn)
    assert m.flops_per_token(T, mask_rate=0.0) == 6 * n_body + 12 * a.layers * a.hidden * T
    head = m.flops_per_token(T, 1.0) - m.flops_per_token(T, 0.0)
    assert head == pytest.approx(6 * (a.hidden ** 2 + a.hidden * V))
    assert m.flops_per_token(T) > 6 * n_body > 0
    # close to 6 x the non-embedding parameter count (biases and LayerNorms are the difference)
    base = resolve_arch(ModelConfig(size="base"), 30522, 0)
    with torch.device("meta"):
        mb = MLMEncoder(base)
    ratio = mb.flops_per_token(128, 0.0) / (6 * mb.num_params())
    assert 1.0 < ratio < 1.1, ratio


def test_modernbert_accounting():
    """GeGLU: the FFN has three ffn x hidden matrices (Wi is two of them); no token-type table, no biases."""
    m = tiny(family="modernbert")
    a, T = m.arch, 32
    assert a.modern and "type_emb.weight" not in m.state_dict()
    assert not [k for k in m.state_dict() if k.endswith(".bias")]                # the decoder's is head_bias
    n_body = a.layers * (4 * a.hidden ** 2 + 3 * a.hidden * a.ffn)
    span = sum(T if g else min(T, a.window + 1) for g in m._global)
    assert m.flops_per_token(T, mask_rate=0.0) == 6 * n_body + 12 * a.hidden * span
    with torch.device("meta"):
        mb = MLMEncoder(resolve_arch(ModelConfig(family="modernbert", size="base"), 50368, 50283))
    assert (mb.arch.layers, mb.arch.hidden, mb.arch.heads, mb.arch.ffn) == (22, 768, 12, 1152)   # ModernBERT-base
    ratio = mb.flops_per_token(128, 0.0) / (6 * mb.num_params())
    assert 1.0 < ratio < 1.1, ratio


def test_activations_equal_transformers_act2fn():
    """Every hidden_act name the encoder implements computes what transformers' ACT2FN does (the reference)."""
    act2fn = pytest.importorskip("transformers.activations").ACT2FN
    from mlm_core.model.encoder import activation_fn
    from mlm_core.model.sizes import ACTIVATIONS
    x = torch.linspace(-12, 12, 2001)
    for name in ACTIVATIONS:
        assert torch.allclose(activation_fn(name)(x), act2fn[name](x), atol=1e-6, rtol=1e-6), name


def test_arch_new_fields_are_omitted_at_their_defaults():
    """A stored BERT Arch (model_config.json, safetensors metadata) keeps its exact keys; an imported RoBERTa
    Arch carries its fields and reads back equal."""
    bert = tiny().arch
    assert set(bert.to_dict()) == {"layers", "hidden", "heads", "ffn", "dropout", "max_positions", "position", "norm",
                                   "tie_embeddings", "vocab_size", "pad_id"}
    rob = Arch(**{**bert.to_dict(), "pad_id": 1, "ln_eps": 1e-5, "activation": "gelu_new", "position_offset": 2,
                  "type_vocab_size": 2, "family": "roberta"})
    d = rob.to_dict()
    assert {k: d[k] for k in ("ln_eps", "activation", "position_offset", "type_vocab_size", "family")} == {
        "ln_eps": 1e-5, "activation": "gelu_new", "position_offset": 2, "type_vocab_size": 2, "family": "roberta"}
    assert Arch.from_dict(d) == rob
    m = MLMEncoder(rob)
    assert m.pos_emb.weight.shape[0] == rob.max_positions + 2 and m.type_emb.weight.shape[0] == 2
    with pytest.raises(ArchError, match="pad_id"):
        Arch(**{**d, "position_offset": 0})            # RoBERTa positions start at pad_id + 1
    with pytest.raises(ArchError, match="activation"):
        Arch(**{**d, "activation": "swiglu"})
