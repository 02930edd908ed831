"""pretrain.compile: the fixed-shape compiled training forward (mlm_core.train.compiled).

One graph per objective and budget: a compiled run compiles once at its first step and never again over
20 steps of a moving masking rate (dynamo's cache for the compiled function grows by at most one entry
per run, by none when a run's budget was seen before: runs, models and strategies with the same budget
share the graph); no graph break (fullgraph=True, and the break counter stays empty); the compiled
losses follow the eager loop's (same masks, same optimizer, dropout 0.1: on CPU the graph draws dropout
through aten, i.e. the eager masks) within a relative 2e-4 per logged step (float rounding: fused
kernels and another summation order, compounded over 20 AdamW steps); a compiled run stopped at step 10
and resumed logs exactly the losses of an uninterrupted compiled run.

Compiling costs ~20-60 s per graph on the loaded 2-core box, so the tests share graphs where they can: at
the tiny shape (batch 4 x 32, rate_max 0.4) token and whole_word masking share one MLM budget and graph,
span and pmi (masking is eager, so PMI-masking only changes the budget's unit size) share another; the resume
test reuses the span graph; the bare function is checked against the eager
model's gradients on a graph of its own; ELECTRA has one.
"""
from __future__ import annotations

import math

import pytest

from test_train import read_metrics, run, tiny_cfg, tiny_shards

pytestmark = pytest.mark.usefixtures("one_torch_thread")
REL = 2e-4


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("tinyc") / "w")


@pytest.fixture(scope="module")
def pmi_dir(shards, tmp_path_factory):
    """A tokenizer output folder holding PMI-masking's n-gram vocabulary for the tiny shard set, built by the
    tokenizer stage's own code (``build_vocabulary`` over the shards' normalized docs and tokenizer); training
    reads it through ``ShardDataset(tokenizer_dir=...)``, as the pretrain stage hands in its upstream tokenizer."""
    from tokenizers import Tokenizer

    from mlm_core.config.data import TokenizerConfig
    from mlm_core.masking.pmi import build_vocabulary
    shard_art, tok_art = shards
    out = tmp_path_factory.mktemp("pmi_tokenizer")
    stats = build_vocabulary(shard_art.path.parent / "norm", list(shard_art.manifest["languages"]),
                             Tokenizer.from_file(str(tok_art.path / "tokenizer.json")),
                             TokenizerConfig(pmi_vocab=40, pmi_min_count=3), out)
    assert all(v["kept"] > 0 for v in stats["languages"].values()), stats   # a table pmi can really mask from
    return out


@pytest.fixture(scope="module")
def pmi_vocab(pmi_dir):
    """{units: hashes} of ``pmi_dir``'s vocabulary."""
    from mlm_core.masking.pmi import load_collocations
    return load_collocations(pmi_dir)


def _entries(fn) -> int:
    """Compiled variants dynamo holds for ``fn`` (1 = compiled once, never recompiled)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    return len(_debug_get_cache_entry_list(fn.__code__))


def _losses(d, key="loss"):
    return [r[key] for r in read_metrics(d)]


def _close(a, b, rel=REL):
    assert len(a) == len(b)
    bad = [(i, x, y) for i, (x, y) in enumerate(zip(a, b)) if not math.isclose(x, y, rel_tol=rel)]
    assert not bad, f"compiled vs eager differ beyond {rel}: {bad[:5]}"


def test_mlm_one_graph_across_schedule_and_strategies_matches_eager(shards, pmi_dir, tmp_path):
    from torch._dynamo.utils import counters

    from mlm_core.train import compiled
    breaks, shapes = sum(counters["graph_break"].values()), set()
    for strategy in ("token", "whole_word", "span", "pmi"):
        before = _entries(compiled.mlm_loss)
        kw = dict(steps=20, masking={"strategy": strategy, "schedule": "cosine", "rate_max": 0.4},
                  model={"dropout": 0.1}, log_every=1)
        tok = pmi_dir if strategy == "pmi" else None
        r = run(tiny_cfg(compile="on", **kw), shards[0], tmp_path / f"c-{strategy}", tokenizer_dir=tok)
        run(tiny_cfg(compile="off", **kw), shards[0], tmp_path / f"e-{strategy}", tokenizer_dir=tok)
        rates = [x["masking_rate"] for x in read_metrics(tmp_path / f"c-{strategy}")]
        assert max(rates) > 0.35 and min(rates) < 0.12       # the schedule really moved the rate
        _close(_losses(tmp_path / f"c-{strategy}"), _losses(tmp_path / f"e-{strategy}"))
        assert r["completed"]
        # one graph per budget: the run compiled at most once (its first step, when its budget was new) and
        # never recompiled in 20 steps of a moving rate; a run with a budget seen before reuses that graph
        budget = compiled.masked_budget(tiny_cfg(**kw).masking, 4, 32)
        assert _entries(compiled.mlm_loss) - before == (0 if budget in shapes else 1)
        shapes.add(budget)
    # token and whole_word share a budget here, span and pmi (units of span_max = 10 tokens) another: B x T
    assert len(shapes) == 2
    assert sum(counters["graph_break"].values()) == breaks


def test_compiled_resume_is_exact_with_dropout(shards, tmp_path):
    """20 compiled steps straight == 10, stop, resume to 20 (span masking, cosine schedule, dropout 0.1)."""
    cfg = tiny_cfg(compile="on", steps=20, checkpoint_every=5, log_every=1, model={"dropout": 0.1},
                   masking={"strategy": "span", "schedule": "cosine", "rate_max": 0.4})
    run(cfg, shards[0], tmp_path / "a")
    first = run(cfg, shards[0], tmp_path / "b", stop_after=10)
    assert first["step"] == 10
    second = run(cfg, shards[0], tmp_path / "b")
    assert second["resumed_from"] == 10 and second["completed"]
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [(r["step"], r["loss"], r["masking_rate"]) for r in a] == [(r["step"], r["loss"], r["masking_rate"])
                                                                      for r in b]


def test_electra_compiles_once_matches_eager_and_resumes(shards, tmp_path):
    from mlm_core.train import compiled
    kw = dict(objective="electra", steps=16, checkpoint_every=4, log_every=1, model={"dropout": 0.1},
              masking={"schedule": "linear"})
    run(tiny_cfg(compile="off", **kw), shards[0], tmp_path / "e")
    run(tiny_cfg(compile="on", **kw), shards[0], tmp_path / "c")
    entries = _entries(compiled.electra_loss)
    assert entries >= 1
    for part in ("loss", "mlm_loss", "disc_loss"):
        _close(_losses(tmp_path / "c", part), _losses(tmp_path / "e", part))
    run(tiny_cfg(compile="on", **kw), shards[0], tmp_path / "r", stop_after=8)
    run(tiny_cfg(compile="on", **kw), shards[0], tmp_path / "r")
    assert _losses(tmp_path / "r") == _losses(tmp_path / "c")
    assert _entries(compiled.electra_loss) == entries             # the resumed runs reused the graph


def test_budget_below_the_cap_gives_the_eager_loss_and_gradients():
    """The bare graph at a budget < B x T (padding rows present) against MLMEncoder.forward: loss and every
    gradient; a second micro-batch with another selected count reuses the graph."""
    import torch

    from compile_helpers import assert_compiled_matches_eager
    from mlm_core.config import MaskingConfig, ModelConfig
    from mlm_core.masking import Masker
    from mlm_core.model import MLMEncoder, resolve_arch
    from mlm_core.train.compiled import masked_budget, mlm_loss
    B, T, V = 16, 32, 300
    mcfg = MaskingConfig(rate=0.15)
    budget = masked_budget(mcfg, B, T)
    assert budget < B * T
    torch.manual_seed(0)
    enc = MLMEncoder(resolve_arch(ModelConfig(size="tiny", layers=1, hidden=32, heads=2, ffn=64, max_positions=64,
                                              dropout=0.0), V, 0)).train()
    def own(*a):        # its own code object: this graph does not sit in the loop's cache for mlm_loss
        return mlm_loss(*a)
    fn = torch.compile(own, fullgraph=True, dynamic=False)
    masker = Masker(mcfg, V, [0, 1, 2, 3, 4], 4, 0, 1)
    seg = torch.ones(B, T, dtype=torch.int32)
    seg[:, 20:] = 2
    seg[3, 25:] = 0
    for k in range(2):
        ids = torch.randint(5, V, (B, T), generator=torch.Generator().manual_seed(k))
        m = masker(ids, torch.ones(B, T, dtype=torch.bool), 0, generator=torch.Generator().manual_seed(k))
        assert 0 < int(m.selected.sum()) < budget
        assert_compiled_matches_eager(enc, fn, m.input_ids, seg, m.labels, 0.1, budget)
    assert _entries(own) == 1


# ------------------------------------------------------------------------------------------------ budget
def test_budget_covers_real_masks_at_the_highest_rate(shards, pmi_vocab):
    """On the real tiny shards, 200 micro-batches of 64 x 32 per strategy at rate 0.4: no selected count
    reaches the budget (independent check of the 5-sigma margin, unit sizes included)."""
    import numpy as np
    import torch

    from mlm_core.config import MaskingConfig
    from mlm_core.masking import Masker
    from mlm_core.shards import ShardDataset
    from mlm_core.train.compiled import masked_budget
    ds = ShardDataset(shards[0])
    sp = sorted(int(e["id"]) for e in ds.manifest["special_tokens"].values())
    B = 64
    for strategy in ("token", "whole_word", "span", "pmi"):
        mcfg = MaskingConfig(strategy=strategy, schedule="linear", rate_max=0.4, rate_min=0.1)
        budget = masked_budget(mcfg, B, ds.seq_len)
        masker = Masker(mcfg, int(ds.manifest["vocab_size"]), sp, 4, 0, 100, unk_id=1,
                        collocations=pmi_vocab if strategy == "pmi" else None)
        g, rng, worst = torch.Generator().manual_seed(1), np.random.default_rng(0), 0
        n_rows = ds.rows_per_lang("train")["en"]
        for _ in range(200):
            b = ds.get_batch("train", "en", rng.integers(0, n_rows, B))
            worst = max(worst, int(masker(b["input_ids"], b["word_start"], 0, generator=g).selected.sum()))
        assert worst < budget, (strategy, worst, budget)


def test_budget_formula_and_ladder():
    from mlm_core.config import MaskingConfig
    from mlm_core.train.compiled import budget_for, masked_budget
    # 0.15 x 4096 + 5 sqrt(0.15 x 0.85 x 4096) = 614.4 + 114.3 = 728.7 -> 736 (multiple of 32)
    assert masked_budget(MaskingConfig(rate=0.15), 32, 128) == 736
    # a schedule budgets its highest rate: 0.3 x 4096 + 5 sqrt(0.21 x 4096) = 1228.8 + 146.6 -> 1376
    assert masked_budget(MaskingConfig(schedule="cosine", rate_max=0.3), 32, 128) == 1376
    # span units: u = span_max = 10: 614.4 + 5 sqrt(0.1275 x 4096 x 10) = 614.4 + 361.4 -> 992
    assert masked_budget(MaskingConfig(strategy="span"), 32, 128) == 992
    assert masked_budget(MaskingConfig(rate=0.5), 2, 8) == 16                       # never above B x T
    assert budget_for(700, 736, 4096) == 736
    assert budget_for(737, 736, 4096) == 1120 and budget_for(4096, 736, 4096) == 4096   # 736 x 1.5 = 1104 -> 1120


def test_auto_on_off_and_unsupported(monkeypatch):
    import torch

    from mlm_core.config import PretrainConfig
    from mlm_core.train import compiled
    cpu = torch.device("cpu")
    cfg = lambda **kw: PretrainConfig.model_validate(kw)                        # noqa: E731
    assert compiled.use_compile(cfg(compile="off", steps=10 ** 6), cpu, 1)[0] is False
    assert compiled.use_compile(cfg(compile="auto", steps=100), cpu, 1)[0] is False      # too short to pay off
    assert compiled.use_compile(cfg(compile="on", steps=10 ** 6), cpu, 2)[0] is False    # torchrun
    monkeypatch.setattr(compiled, "compile_support", lambda device: None)
    assert compiled.use_compile(cfg(compile="auto", steps=1000, grad_accum=2), cpu, 1)[0] is True
    monkeypatch.setattr(compiled, "compile_support", lambda device: "no C++ compiler")
    assert compiled.use_compile(cfg(compile="auto", steps=10 ** 6), cpu, 1) == (False, "no C++ compiler")
    with pytest.raises(RuntimeError, match="pretrain.compile: on.*no C\\+\\+ compiler"):
        compiled.use_compile(cfg(compile="on"), cpu, 1)
    # YAML 1.1 reads a bare on / off as booleans
    assert cfg(compile=True).compile == "on" and cfg(compile=False).compile == "off"


def test_compile_is_not_in_the_fingerprint():
    from mlm_core.config import PretrainConfig
    from mlm_core.train.loop import train_fingerprint
    fps = {train_fingerprint(PretrainConfig(compile=c), 0) for c in ("auto", "on", "off")}
    assert len(fps) == 1


# ------------------------------------------------------------------------------------------------ PLL
def test_compiled_pll_equals_the_naive_loop_with_one_graph():
    """Compiled batched PLL (fixed 8 rows per pass, the last pass topped up with padding rows, lengths 1..19
    so T changes every pass) == score_loop (one unpadded copy per forward, eager) to < 1e-4, and one graph
    serves every padded length (dynamo's cache for the scoring function holds one entry)."""
    import torch

    from mlm_core.config import ModelConfig
    from mlm_core.evaluate import pll
    from mlm_core.model import MLMEncoder, resolve_arch
    torch.manual_seed(0)
    enc = MLMEncoder(resolve_arch(ModelConfig(size="tiny", layers=2, hidden=32, heads=2, ffn=64, max_positions=32),
                                  120, 0)).eval()
    g = torch.Generator().manual_seed(3)
    lists = [torch.randint(5, 120, (n,), generator=g).tolist() for n in (1, 3, 7, 19, 12, 5, 9, 2, 16, 11)]
    ref = pll.score_loop(enc, lists, 4, 2, 3)
    got = pll.score_batched(enc, lists, 4, 2, 3, batch=8, compile=True)
    assert sum(len(x) for x in lists) % 8 != 0                           # the last pass really is topped up
    assert max(abs(a - b) for a, b in zip(got, ref)) < 1e-4
    assert _entries(pll._row_log_probs) == 1
    again = pll.score_batched(enc, lists[::-1], 4, 2, 3, batch=8, compile=True)   # other lengths per pass
    assert max(abs(a - b) for a, b in zip(again, ref[::-1])) < 1e-4
    assert _entries(pll._row_log_probs) == 1
