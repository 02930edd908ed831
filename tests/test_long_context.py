"""Longer contexts (issue 13 part 5): blockwise sliding-window attention against a dense reference written
here (values and gradients, padding, packed documents), the local/global layer pattern, global attention
unchanged, the export refusal, the config checks, and a tiny pipeline at seq_len 1024 with local_global."""
from __future__ import annotations

import json
import math

import pytest
import torch

from mlm_core.config import ModelConfig
from mlm_core.model import Arch, ExportError, MLMEncoder, resolve_arch
from mlm_core.model.attention import LocalMask, global_layers, local_attention

pytestmark = pytest.mark.usefixtures("one_torch_thread")
V = 97


def reference(q, k, v, window: int, seg=None):
    """Dense attention in float64 under a mask built position by position: key j is visible to query i when
    |i - j| <= window/2 and (no segments, or same document and j not padding, or j == i)."""
    B, nh, T, d = q.shape
    allowed = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(T):
                ok = abs(i - j) <= window // 2
                if seg is not None:
                    ok = ok and ((seg[b, i] == seg[b, j] and seg[b, j] > 0) or i == j)
                allowed[b, i, j] = ok
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d)
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    return (s.softmax(-1) @ v.double()).float()


def segments(B: int, T: int, seed: int) -> torch.Tensor:
    """Packed rows: 1-3 documents of random lengths, then padding (segment 0) at the end of some rows."""
    g = torch.Generator().manual_seed(seed)
    seg = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        end = T - int(torch.randint(0, T // 3, (1,), generator=g)) * (b % 2)    # odd rows end in padding
        cuts = sorted(torch.randint(1, end, (2,), generator=g).tolist())
        for s, (a, z) in enumerate(zip([0, *cuts], [*cuts, end]), start=1):
            seg[b, a:z] = s
    return seg


@pytest.mark.parametrize("T,window,with_seg", [(37, 8, True), (37, 2, False), (50, 16, True), (70, 128, True),
                                               (64, 32, False), (45, 40, True)])
def test_blockwise_local_equals_dense_banded_values_and_gradients(T, window, with_seg):
    torch.manual_seed(T + window)
    B, nh, d = 3, 2, 8
    q, k, v = (torch.randn(B, nh, T, d, dtype=torch.float32, requires_grad=True) for _ in range(3))
    seg = segments(B, T, seed=T) if with_seg else None
    got = local_attention(q, k, v, LocalMask(T, window, seg, q.device))
    want = reference(q, k, v, window, seg)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    # gradients: the same upstream gradient through both
    w = torch.randn_like(want)
    gq, gk, gv = torch.autograd.grad((got * w).sum(), (q, k, v))
    rq, rk, rv = torch.autograd.grad((want * w).sum(), (q, k, v))
    for a, b in ((gq, rq), (gk, rk), (gv, rv)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_local_memory_is_linear_in_the_window_not_the_sequence():
    """The mask (and so the score tensor) per query is 3 blocks wide, independent of T."""
    m1, m2 = LocalMask(512, 64, None, torch.device("cpu")), LocalMask(2048, 64, None, torch.device("cpu"))
    assert m2.allowed.numel() == 4 * m1.allowed.numel() == 2048 * 3 * 32


def test_layer_pattern():
    # counted from 1: layers k, 2k, ... are global (hand-written lists)
    assert global_layers(7, "local_global", 3) == [False, False, True, False, False, True, False]
    assert global_layers(4, "local_global", 2) == [False, True, False, True]
    assert global_layers(3, "local_global", 1) == [True, True, True]
    assert global_layers(2, "local_global", 5) == [False, False]
    assert global_layers(3, "global", 2) == [True, True, True]
    m = MLMEncoder(resolve_arch(ModelConfig(size="tiny", layers=5, hidden=32, heads=2, attention="local_global",
                                            window=8, global_every=2, max_positions=64), V, 0))
    assert [b.attn.local for b in m.blocks] == [True, False, True, False, True]


def _pair(**local):
    """A global and a local_global model with the same weights (their parameters are the same tensors)."""
    cfg = dict(size="tiny", layers=3, hidden=32, heads=4, ffn=64, max_positions=64, dropout=0.0)
    torch.manual_seed(0)
    g = MLMEncoder(resolve_arch(ModelConfig(**cfg), V, 0)).eval()
    loc = MLMEncoder(resolve_arch(ModelConfig(**cfg, attention="local_global", **local), V, 0)).eval()
    loc.load_state_dict(g.state_dict())
    return g, loc


def test_global_arch_unchanged_and_a_whole_sequence_window_equals_global():
    # global: window / global_every never reach the Arch, whose stored JSON has none of the new keys
    a = resolve_arch(ModelConfig(size="tiny", window=16, global_every=2), V, 0)
    assert a == resolve_arch(ModelConfig(size="tiny"), V, 0)
    assert not {"attention", "window", "global_every"} & set(a.to_dict())
    loc = resolve_arch(ModelConfig(size="tiny", attention="local_global", window=16, global_every=2), V, 0)
    assert Arch.from_dict(json.loads(json.dumps(loc.to_dict()))) == loc
    # a window covering the whole sequence (window/2 >= T - 1): local layers compute global attention
    g, loc = _pair(window=64, global_every=3)
    T = 30
    ids = torch.randint(5, V, (2, T))
    seg = segments(2, T, seed=3)
    ids[seg == 0] = 0
    for s in (None, seg):
        torch.testing.assert_close(loc.encode(ids, s), g.encode(ids, s), atol=2e-5, rtol=0)
    # a narrow window does change the output (the option is not a no-op)
    _, narrow = _pair(window=4, global_every=3)
    assert (narrow.encode(ids) - g.encode(ids)).abs().max() > 1e-3


def test_local_model_trains_with_dropout_and_rotary():
    torch.manual_seed(0)
    m = MLMEncoder(resolve_arch(ModelConfig(size="tiny", layers=2, hidden=32, heads=2, ffn=64, max_positions=128,
                                            position="rotary", attention="local_global", window=8), V, 0))
    ids = torch.randint(5, V, (2, 100))
    seg = torch.ones_like(ids)
    seg[1, 60:] = 2
    seg[1, 90:] = 0
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        out = m(ids, seg, labels=torch.where(seg > 0, ids, -100))
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(out["loss"].item())
    assert all(math.isfinite(x) for x in losses) and losses[-1] < 0.5 * losses[0]


def test_flops_count_local_layers_at_the_window():
    g, loc = _pair(window=16, global_every=3)
    a = g.arch
    # 3 layers, the third global: attention term 12 H (17 + 17 + T) instead of 12 H 3 T
    assert g.flops_per_token(64, 0.0) - loc.flops_per_token(64, 0.0) == 12 * a.hidden * (2 * 64 - 2 * 17)


def test_local_global_refuses_to_export_with_the_reason(tmp_path):
    from mlm_core.model.export import check_exportable
    arch = resolve_arch(ModelConfig(size="tiny", attention="local_global", window=32, global_every=2), V, 0)
    with pytest.raises(ExportError) as e:
        check_exportable(arch)
    msg = str(e.value)
    assert "local_global attention, window 32, global_every 2" in msg and "sliding-window" in msg
    assert "safetensors only" in msg


@pytest.mark.parametrize("raw,keys", [
    ({"pretrain": {"model": {"attention": "local_global", "window": 1024}}}, ["pretrain.model", "window", "max_positions"]),
    ({"pretrain": {"model": {"attention": "local_global", "window": 63}}}, ["pretrain.model", "window", "even"]),
    ({"shards": {"seq_len": 2048}, "pretrain": {"model": {"max_positions": 1024}}},
     ["shards.seq_len", "pretrain.model.max_positions"]),
])
def test_config_errors_name_the_keys(raw, keys):
    from mlm_core.config.io import ConfigError, load_config
    with pytest.raises(ConfigError) as e:
        load_config(raw={"sources": {"en": {"paths": [__file__]}}, **raw})
    for k in keys:
        assert k in str(e.value)
    # seq_len 2048 with max_positions 2048 is accepted, window = max_positions too
    lc = load_config(raw={"sources": {"en": {"paths": [__file__]}}, "shards": {"seq_len": 2048}, "pretrain": {
        "model": {"max_positions": 2048, "attention": "local_global", "window": 2048}}})
    assert lc.config.shards.seq_len == 2048


@pytest.mark.heavy
def test_pipeline_at_seq_len_1024_with_local_global(tmp_path):
    """normalize -> tokenizer -> shards (seq_len 1024) -> pretrain (local_global) -> evaluate (with efficiency):
    trains, evaluates, stores safetensors without a Hugging Face export (the reason in the manifest), and the
    folder the register stage logs instead (``weights``) loads back as the same local/global model."""
    from conftest import run_demo_pipeline
    from mlm_core.fillmask import load_model_dir
    from tasks.mlflow_model import model_artifacts
    arts = run_demo_pipeline(
        tmp_path, 1200, shards={"seq_len": 1024, "validation_fraction": 0.2},
        pretrain={"batch_size": 2, "compile": "off",
                  "model": {"size": "tiny", "max_positions": 1024, "attention": "local_global", "window": 64,
                            "global_every": 2}},
        evaluate={"max_sequences": 2})
    assert arts["shards"].manifest["seq_len"] == 1024
    pre = arts["pretrain"].manifest
    assert pre["arch"]["attention"] == "local_global" and pre["arch"]["window"] == 64
    assert pre["export"] is None and "local_global attention" in pre["export_note"]
    assert all(math.isfinite(r["loss"]) for r in pre["eval"].values())
    out = arts["pretrain"].path
    assert (out / "model.safetensors").is_file() and not (out / "hf").exists()
    assert list(model_artifacts(out, tmp_path / "scratch")) == ["weights"]
    model, _tok, mask = load_model_dir(out)
    assert model.arch.attention == "local_global" and [b.attn.local for b in model.blocks] == [True, False]
    ev = json.loads((arts["evaluate"].path / "evaluation.json").read_text(encoding="utf-8"))
    assert ev["intrinsic"] and all(math.isfinite(v["top1"]) for v in ev["intrinsic"].values() if "top1" in v)
    assert ev["efficiency"]["peak_memory_mb"]["512"] is not None
    # the model card's architecture line says how the model attends
    from mlm_core.register.modelcard import model_card
    card = model_card(name="lc", version=1, fingerprints={}, data={}, tokenizer={}, training=pre, evaluation=ev,
                      audit={}, gates=[], promoted=False)
    assert "attention local_global, window 64, global_every 2" in card


def test_init_from_refuses_local_global_rather_than_ignoring_it(tmp_path):
    """pretrain.init_from takes the checkpoint's shape; an explicit attention: local_global would be dropped
    silently, so it is an error naming the key (every importable checkpoint attends globally)."""
    from types import SimpleNamespace

    from mlm_core.model.pretrained import PretrainedError, check_model_config
    p = SimpleNamespace(arch=resolve_arch(ModelConfig(size="tiny"), V, 0), disc_arch=None, config_file=None,
                        folder=tmp_path)
    check_model_config(p, ModelConfig(attention="global"))
    with pytest.raises(PretrainedError, match="pretrain.model.attention = 'local_global' but the checkpoint has "
                                              "'global'"):
        check_model_config(p, ModelConfig(attention="local_global"))


def test_compiled_step_traces_local_attention_in_one_graph():
    """pretrain.compile's loss function over a local_global model: fullgraph (a graph break is an error), the
    eager loss and gradients. Backend aot_eager = dynamo + AOT autograd, the trace inductor compiles, in ~3 s
    (inductor itself took ~3 min on the loaded 2-core box, checked by hand with the same comparison)."""
    from compile_helpers import assert_compiled_matches_eager
    from mlm_core.config import MaskingConfig
    from mlm_core.masking import Masker
    from mlm_core.train.compiled import masked_budget, mlm_loss
    B, T = 4, 96
    mcfg = MaskingConfig(rate=0.15)
    budget = masked_budget(mcfg, B, T)
    torch.manual_seed(0)
    enc = MLMEncoder(resolve_arch(ModelConfig(size="tiny", layers=2, hidden=32, heads=2, ffn=64, max_positions=128,
                                              dropout=0.0, attention="local_global", window=16, global_every=2),
                                  V, 0)).train()

    def own(*a):        # its own code object: not the loop's cache entry for mlm_loss
        return mlm_loss(*a)
    fn = torch.compile(own, fullgraph=True, dynamic=False, backend="aot_eager")
    masker = Masker(mcfg, V, [0, 1, 2, 3, 4], 4, 0, 1)
    seg = torch.ones(B, T, dtype=torch.int32)
    seg[:, 50:] = 2
    seg[3, 80:] = 0
    ids = torch.randint(5, V, (B, T), generator=torch.Generator().manual_seed(0))
    m = masker(ids, torch.ones(B, T, dtype=torch.bool), 0, generator=torch.Generator().manual_seed(0))
    assert_compiled_matches_eager(enc, fn, m.input_ids, seg, m.labels, 0.1, budget)
