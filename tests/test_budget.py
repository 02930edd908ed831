"""FLOP / token matching of sweep variants (issue 12): the steps ``mlm_core.budget`` plans agree with a FLOP count
written here by hand from the model's shape (6 x matmul weights per token + the attention term, the vocabulary
head on the masked share; ELECTRA: generator + discriminator + its RTD head)."""
from __future__ import annotations

import math

import pytest

from mlm_core import budget
from mlm_core.config.io import load_config


def cfg(*overrides: str, **pretrain):
    raw = {"sources": {"en": {"paths": ["en.txt"]}, "fr": {"paths": ["fr.txt"]}},
           "tokenizer": {"vocab_size": 3000}, "shards": {"seq_len": 64},
           "pretrain": {"model": {"size": "tiny", "max_positions": 64}, "steps": 1000, "batch_size": 16, **pretrain}}
    return load_config(raw=raw, overrides=list(overrides))


def hand_fpt(L, H, F, V, T, rate, *, E=None, mlm_head=True):
    """Training FLOPs per token of one encoder, by hand: every token passes through q,k,v,out (4 H^2) and the FFN
    (2 H F) of each layer: 2 FLOPs per weight forward, 4 backward = 6 per weight; attention scores and the
    weighted sum: 2 x 2 x T x H forward per layer, x3 with backward = 12 L H T; an E != H embedding projection;
    the head (dense H->E, vocabulary E->V) on the predicted share of tokens only."""
    E = E or H
    n_body = L * (4 * H * H + 2 * H * F)
    f = 6 * n_body + 12 * L * H * T + (6 * E * H if E != H else 0)
    if mlm_head:
        f += rate * 6 * (H * E + E * V)
    return f


def hand_electra_fpt(L, H, F, heads, V, T, rate, frac=0.25):
    h = max(heads, round(H * frac / heads) * heads)      # generator width: a multiple of the head count
    f = max(8, round(F * frac))
    disc = hand_fpt(L, H, F, V, T, rate, mlm_head=False) + 6 * (H * H + H)   # RTD head: dense H->H, out H->1
    gen = hand_fpt(L, h, f, V, T, rate, E=H)              # reads the shared H-wide embeddings, head maps back to H
    return disc + gen


TINY = dict(L=2, H=128, F=512)


def test_hand_count_describes_the_real_model():
    # the hand formula's N is the number of weights in the blocks' matmuls of the model the loop trains
    import torch

    from mlm_core.train.objectives import objective_for
    c = cfg().config
    torch.manual_seed(0)
    model = objective_for(c.pretrain).build(3000, 0, [])
    n = sum(m.weight.numel() for b in model.blocks for m in b.modules() if isinstance(m, torch.nn.Linear))
    assert n == TINY["L"] * (4 * TINY["H"] ** 2 + 2 * TINY["H"] * TINY["F"])


def test_flops_per_token_equals_hand_count():
    assert budget.flops_per_token(cfg()) == pytest.approx(hand_fpt(**TINY, V=3000, T=64, rate=0.15), rel=1e-12)
    assert budget.flops_per_token(cfg(objective="electra")) == pytest.approx(
        hand_electra_fpt(**TINY, heads=2, V=3000, T=64, rate=0.15), rel=1e-12)


def test_electra_matches_mlm_flops():
    ref, var = cfg(), cfg(objective="electra")
    steps = budget.steps_for_budget(var, ref, "flops")
    tok = 16 * 64
    want = 1000 * tok * hand_fpt(**TINY, V=3000, T=64, rate=0.15) / (
        tok * hand_electra_fpt(**TINY, heads=2, V=3000, T=64, rate=0.15))
    assert steps == round(want)
    assert steps < 1000              # the generator costs extra: fewer ELECTRA steps for the same FLOPs
    # equal budgets to within one step's cost
    per = tok * hand_electra_fpt(**TINY, heads=2, V=3000, T=64, rate=0.15)
    assert abs(steps * per - 1000 * tok * hand_fpt(**TINY, V=3000, T=64, rate=0.15)) <= per / 2
    # tokens: the same batch shape -> the same steps, whatever the model
    assert budget.steps_for_budget(var, ref, "tokens") == 1000


def test_tokens_per_step_counts_batch_accum_world_seq():
    ref = cfg()
    var = cfg("pretrain.grad_accum=3", "pretrain.distributed.nproc_per_node=2", batch_size=8)
    assert budget.tokens_per_step(var) == 8 * 3 * 2 * 64
    assert budget.steps_for_budget(var, ref, "tokens") == round(1000 * 16 * 64 / (8 * 3 * 2 * 64))
    # a longer sequence: fewer steps for the same tokens; for the same FLOPs fewer still (attention grows with T)
    long = cfg("shards.seq_len=128", "pretrain.model.max_positions=128")
    assert budget.steps_for_budget(long, ref, "tokens") == 500
    want = 1000 * 64 * hand_fpt(**TINY, V=3000, T=64, rate=0.15) / (128 * hand_fpt(**TINY, V=3000, T=128, rate=0.15))
    assert budget.steps_for_budget(long, ref, "flops") == round(want) < 500


def test_masking_rate_and_schedule_enter_the_head_term():
    ref = cfg()
    hi = cfg("pretrain.masking.rate=0.4")
    want = 1000 * hand_fpt(**TINY, V=3000, T=64, rate=0.15) / hand_fpt(**TINY, V=3000, T=64, rate=0.4)
    assert budget.steps_for_budget(hi, ref, "flops") == round(want)
    cyc = cfg("pretrain.masking.schedule=cyclical", "pretrain.masking.rate_min=0.1", "pretrain.masking.rate_max=0.3")
    mean = 0.1 + 0.2 * 2 / math.pi            # mean of |sin| over a period
    assert budget.flops_per_token(cyc) == pytest.approx(hand_fpt(**TINY, V=3000, T=64, rate=mean), rel=1e-12)


def test_bigger_model_gets_fewer_steps():
    small = cfg("pretrain.model.size=small")
    want = 1000 * hand_fpt(**TINY, V=3000, T=64, rate=0.15) / hand_fpt(L=4, H=256, F=1024, V=3000, T=64, rate=0.15)
    assert budget.steps_for_budget(small, cfg(), "flops") == round(want)


def test_bad_inputs_are_clear_errors():
    with pytest.raises(budget.BudgetError, match="match"):
        budget.steps_for_budget(cfg(), cfg(), "time")
    with pytest.raises(budget.BudgetError, match="init_from"):
        budget.steps_for_budget(cfg(init_from="some/folder"), cfg(), "flops")
    # a tiny reference budget never plans 0 steps
    assert budget.steps_for_budget(cfg("pretrain.model.size=base"), cfg(steps=1), "flops") == 1
