"""pretrain.model.position_init: sinusoidal (issue 20 item 1, the BERT-exportable third choice)."""
from __future__ import annotations

import math

import pytest
import torch

from mlm_core.config import PretrainConfig


def _cfg(**model):
    return PretrainConfig.model_validate({"model": {"size": "tiny", "max_positions": 64, **model}})


def test_sinusoidal_init_is_vaswani_table_at_bert_rms():
    from mlm_core.train.loop import build_model
    torch.manual_seed(0)
    model, _ = build_model(_cfg(position_init="sinusoidal"), 100, 0)
    w = model.pos_emb.weight.detach().double()
    d = w.shape[1]
    # the formula written out here, independently of the code: PE[p, 2i] = sin(p / 10000^(2i/d)), 2i+1: cos
    for p in (0, 1, 17, 63):
        for i in (0, 3, d // 2 - 1):
            ang = p / 10000 ** (2 * i / d)
            assert w[p, 2 * i].item() == pytest.approx(0.02 * math.sqrt(2) * math.sin(ang), abs=1e-7)
            assert w[p, 2 * i + 1].item() == pytest.approx(0.02 * math.sqrt(2) * math.cos(ang), abs=1e-7)
    assert w.pow(2).mean().sqrt().item() == pytest.approx(0.02, rel=0.02)


def test_other_weights_and_later_draws_unchanged():
    from mlm_core.train.loop import build_model
    torch.manual_seed(0)
    a, _ = build_model(_cfg(), 100, 0)
    after_a = torch.rand(3)
    torch.manual_seed(0)
    b, _ = build_model(_cfg(position_init="sinusoidal"), 100, 0)
    after_b = torch.rand(3)
    assert torch.equal(after_a, after_b)
    sa, sb = a.state_dict(), b.state_dict()
    assert [k for k in sa if not torch.equal(sa[k], sb[k])] == ["pos_emb.weight"]


def test_needs_learned_positions():
    with pytest.raises(ValueError, match="position_init 'sinusoidal' initialises a learned position table"):
        _cfg(position="rotary", position_init="sinusoidal")


def test_default_keeps_fingerprints():
    """omit_default: at its default the field is not in the view a fingerprint hashes; set, it is."""
    from mlm_core.config.effects import fingerprint_view
    assert "position_init" not in fingerprint_view(_cfg())["model"]
    assert fingerprint_view(_cfg(position_init="sinusoidal"))["model"]["position_init"] == "sinusoidal"
