"""Masking strategies as objects (issue 22, item 3): one registry dispatches the strategy name; every strategy's
masks are those of the code before the refactor, bit for bit; each budget unit bounds the measured variance.

The expected masks (OLD_MASKS), the collocation table (COLLOCATIONS) and the compiled step's budgets (OLD_BUDGETS)
were captured by running the OLD code, ``mlm_core/masking.py`` + ``mlm_core/pmi_select.py`` +
``mlm_core/train/compiled.py`` at commit 424e75b (before the ``mlm_core/masking/`` package), on ``fixed_rows()``
below: the collocations are ``pmi_select.ngram_hashes`` of that input (m = 2: every 5th valid bigram, m = 3: every
9th trigram, first 12, sorted); each digest is sha256 over the int64 bytes of (corrupted ids, labels, selected),
first 32 hex digits.
"""
from __future__ import annotations

import ast
import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from mlm_core.config import MaskingConfig
from mlm_core.masking import STRATEGIES, Masker, strategy_class
from mlm_core.train.compiled import masked_budget

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[1]
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIALS = [PAD, UNK, CLS, SEP, MASK]
VOCAB = 600
STRATEGY_NAMES = ("whole_word", "span", "pmi")       # "token" is too common a word to scan for
REGISTRY = REPO / "mlm_core" / "masking" / "strategies.py"

COLLOCATIONS = {
    2: [-8119264286912726371, -7280430141595934465, -7197188560416204905, -7159930453982344754,
         -7022990897101187134, -5634396538759535873, -4865357508292623760, -907872342049312444, 5957930101909844506,
         7275495941027695754, 7611407783054516443, 8157667673799281785],
    3: [-6187833847471108195, -4935119537932015196, -4334671434971914202, -2269476431279040713,
         -1398049349938014281, -521853104275881607, 195767471442004029, 4869854709674482962, 6675116136316402179,
         6999364948434317177, 7164243735983105765, 8009490261854884392],
}
OLD_MASKS = {   # strategy/mode/schedule: (digest a, digest b, selected a, selected b)
    "token/static/constant": ("fc2da044c5e265e17bc7a4fabd2799fa", "e1febc190526cbcf8be4a8e408ab5cd3", 82, 62),
    "token/dynamic/constant": ("f306a9b59e93e4be547d8efe292ce394", "7e7c73cd6071241139246bbdb02cff91", 61, 74),
    "token/static/cyclical": ("91c105c30f4fb4c013fa3d54e0e55a9a", "1b113f5ceba341694403440a8a46e2dc", 247, 212),
    "token/dynamic/cyclical": ("9564017bf1f901b76b63b6f96e155476", "ec800baa0c71f446b249ebabde3e3e7b", 206, 237),
    "whole_word/static/constant": ("eebb280adf947f9d55e96f1ea874ed41", "b1c081ec39493e055363cbace2a444fa", 61, 55),
    "whole_word/dynamic/constant": ("0b363a7634c15bf96b6d5fffda53244d", "884393c58f6f552148bae7787e5c242c", 66, 81),
    "whole_word/static/cyclical": ("3d82670ec9fd158d7008e9b9ccb348fd", "4131c33c3e789d699ed9edae36e67f57", 230, 211),
    "whole_word/dynamic/cyclical": ("f799f5d2aab0d30b2f921932026b35ab", "62e0e18043f4c53c7a678da37289cb7e", 200, 231),
    "span/static/constant": ("a037b93db171c85106a95d2c21fcc3cf", "ddf77dfc639a93e7e165fa6a023efdb6", 105, 55),
    "span/dynamic/constant": ("96cf56ff7c9459c1d6ef58b156031f93", "5269070c294e83c575e403b7fb7ba5e3", 122, 51),
    "span/static/cyclical": ("a667a3ceee5a3d1a79ffa077df88e7bf", "6787f94ff0b55207a53bbe9f3440c2f8", 211, 164),
    "span/dynamic/cyclical": ("5f28ee8e1fd400a6c3610be79c55c6e8", "97084508326d5b0e161d44779a6f6068", 256, 223),
    "pmi/static/constant": ("0a9de503439ea7d5fb4e4d81cd9c8372", "a1d133b1c98e078cb4c42a84591ba163", 80, 48),
    "pmi/dynamic/constant": ("4d5c945a68527609df25ed9e964d3c4c", "00e3440d22cd92e8a54ea7674fcb7bf0", 63, 78),
    "pmi/static/cyclical": ("e9df44c5c845ee49f33dcd7fefc02564", "db1ec9d26abf6b0cfa8c98449209f2b8", 227, 227),
    "pmi/dynamic/cyclical": ("b281f485975209a1d6750204eb1bcc00", "32cd7f92c0607bbe225e5f327005396e", 213, 232),
}
OLD_BUDGETS = {
    "token/constant/32x128": 736, "token/constant/8x512": 736, "token/constant/256x512": 20320,
    "token/linear/32x128": 1824, "token/linear/8x512": 1824, "token/linear/256x512": 53344,
    "token/span_max6": 736, "whole_word/constant/32x128": 800, "whole_word/constant/8x512": 800,
    "whole_word/constant/256x512": 20576, "whole_word/linear/32x128": 1888, "whole_word/linear/8x512": 1888,
    "whole_word/linear/256x512": 53696, "whole_word/span_max6": 800, "span/constant/32x128": 992,
    "span/constant/8x512": 992, "span/constant/256x512": 21728, "span/linear/32x128": 2144,
    "span/linear/8x512": 2144, "span/linear/256x512": 55264, "span/span_max6": 896,
    "pmi/constant/32x128": 992, "pmi/constant/8x512": 992, "pmi/constant/256x512": 21728,
    "pmi/linear/32x128": 2144, "pmi/linear/8x512": 2144, "pmi/linear/256x512": 55264,
    "pmi/span_max6": 992,
}


def fixed_rows(n=12, t=48, seed=11):
    """Packed rows [CLS] words ... [SEP] ... [PAD]: 40 words of 1-3 tokens (so n-grams repeat), ~6 % [SEP], 2 % UNK,
    every third row padded."""
    rng = np.random.default_rng(seed)
    words = [list(rng.integers(5, VOCAB, size=rng.integers(1, 4))) for _ in range(40)]
    ids = np.full((n, t), PAD, dtype=np.int64)
    ws = np.zeros((n, t), dtype=np.uint8)
    for r in range(n):
        length = t if r % 3 else int(rng.integers(t // 3, t))
        pos = 1
        ids[r, 0] = CLS
        while pos < length - 1:
            if rng.random() < 0.06:
                ids[r, pos] = SEP
                pos += 1
                continue
            w = words[int(rng.integers(0, len(words)))]
            for j, tok in enumerate(w):
                if pos >= length - 1:
                    break
                ids[r, pos] = UNK if rng.random() < 0.02 else tok
                ws[r, pos] = 1 if j == 0 else 0
                pos += 1
        ids[r, length - 1] = SEP
    return torch.from_numpy(ids), torch.from_numpy(ws)


def _digest(out) -> str:
    h = hashlib.sha256()
    for t in (out.input_ids, out.labels, out.selected):
        h.update(t.to(torch.int64).numpy().tobytes())
    return h.hexdigest()[:32]


def _masker(strategy, **kw) -> Masker:
    colloc = {m: torch.tensor(v, dtype=torch.int64) for m, v in COLLOCATIONS.items()} if strategy == "pmi" else None
    return Masker(MaskingConfig(strategy=strategy, **kw), VOCAB, SPECIALS, MASK, seed=5, total_steps=100,
                  unk_id=UNK, collocations=colloc)


SCHEDULES = {"constant": {"rate": 0.15},
             "cyclical": {"schedule": "cyclical", "rate_min": 0.1, "rate_max": 0.5, "period": 40}}


@pytest.mark.parametrize("case", sorted(OLD_MASKS))
def test_masks_equal_the_old_code(case):
    strategy, mode, schedule = case.split("/")
    ids, ws = fixed_rows()
    m = _masker(strategy, mode=mode, **SCHEDULES[schedule])
    if mode == "static":
        seq = torch.arange(len(ids)) * 13 + 100
        a = m(ids, ws, 7, seq_ids=seq)
        b = m(ids, ws, 7, seq_ids=seq, passes=torch.arange(len(ids)) % 4 + 1)     # static copies 1..4
    else:
        gen = torch.Generator().manual_seed(99)
        a, b = m(ids, ws, 7, generator=gen), m(ids, ws, 8, generator=gen)          # two consecutive draws
    assert (_digest(a), _digest(b), int(a.selected.sum()), int(b.selected.sum())) == OLD_MASKS[case]


def test_the_pmi_case_takes_collocations():
    """The PMI cases above exercise the collocation path (the fixed input holds occurrences of the table)."""
    from mlm_core.masking.pmi_select import ngram_hashes
    ids, ws = fixed_rows()
    cand = ~torch.isin(ids, torch.tensor([PAD, CLS, SEP, MASK]))
    grams = ngram_hashes(ids, cand, ws.bool(), 3)
    for m, table in COLLOCATIONS.items():
        h, valid = grams[m]
        assert int((torch.isin(h, torch.tensor(table)) & valid).sum()) >= len(table)


def test_registry_is_the_config_literal_and_classes_follow_the_protocol():
    names = MaskingConfig.model_fields["strategy"].annotation.__args__
    assert tuple(STRATEGIES) == tuple(names)
    for name, cls in STRATEGIES.items():
        assert strategy_class(name) is cls
        assert callable(cls.budget_unit) and callable(cls.select) and isinstance(cls.needs_collocations, bool)
    assert [n for n, c in STRATEGIES.items() if c.needs_collocations] == ["pmi"]
    with pytest.raises(ValueError, match="unknown masking strategy 'blocks'"):
        strategy_class("blocks")
    with pytest.raises(ValueError, match="needs the collocation vocabulary"):
        Masker(MaskingConfig(strategy="pmi"), VOCAB, SPECIALS, MASK)


# ------------------------------------------------------------------------------------------- budget units
def _budget(p: float, n: int, u: float) -> int:
    """The compiled step's budget from its docstring: p n + 5 sigma, sigma^2 = p (1 - p) n u, up to 32, <= n."""
    return min(n, int(math.ceil((p * n + 5.0 * math.sqrt(p * (1.0 - p) * n * u)) / 32)) * 32)


# u from the compiled step's docstring (1 token, 2 for whole words, span_max for spans, 10 for PMI)
DOC_UNIT = {"token": lambda cfg: 1.0, "whole_word": lambda cfg: 2.0, "span": lambda cfg: float(cfg.span_max),
            "pmi": lambda cfg: 10.0}


@pytest.mark.parametrize("key", sorted(OLD_BUDGETS))
def test_masked_budget_equals_the_old_code_and_the_formula(key):
    strategy, sched, *shape = key.split("/")
    if sched == "span_max6":
        cfg, (b, t) = MaskingConfig(strategy=strategy, span_max=6), (32, 128)
    else:
        extra = {"rate": 0.15} if sched == "constant" else {"schedule": "linear", "rate_min": 0.1, "rate_max": 0.4}
        cfg, (b, t) = MaskingConfig(strategy=strategy, **extra), map(int, shape[0].split("x"))
    assert masked_budget(cfg, b, t) == OLD_BUDGETS[key]
    p = 0.15 if sched in ("constant", "span_max6") else 0.4
    assert masked_budget(cfg, b, t) == _budget(p, b * t, DOC_UNIT[strategy](cfg))
    assert strategy_class(strategy).budget_unit(cfg) == DOC_UNIT[strategy](cfg)
    assert OLD_BUDGETS["token/constant/32x128"] == 736        # the docstring's worked figure


def _subword_rows(n=48, t=128, seed=4):
    """Rows of words of 1 token (70 %) or 2 tokens, a [SEP] every ~40 tokens, a vocabulary of 60 words (so PMI
    finds collocations): subword-like text, on which the budget units must bound the variance."""
    rng = np.random.default_rng(seed)
    words = [list(rng.integers(5, VOCAB, size=1 if rng.random() < 0.7 else 2)) for _ in range(60)]
    ids = np.full((n, t), PAD, dtype=np.int64)
    ws = np.zeros((n, t), dtype=np.uint8)
    for r in range(n):
        ids[r, 0], pos = CLS, 1
        while pos < t - 1:
            if rng.random() < 0.025:
                ids[r, pos], pos = SEP, pos + 1
                continue
            for j, tok in enumerate(words[int(rng.integers(0, len(words)))][: t - 1 - pos]):
                ids[r, pos], ws[r, pos], pos = tok, j == 0, pos + 1
        ids[r, t - 1] = SEP
    return torch.from_numpy(ids), torch.from_numpy(ws), words


def _word_lengths(ids, ws) -> list[int]:
    """Token lengths of the words, counted with a plain loop (a word: a start token and the non-start,
    non-special tokens after it)."""
    out = []
    for row_ids, row_ws in zip(ids.tolist(), ws.tolist()):
        cur = 0
        for tok, start in zip(row_ids, row_ws):
            if tok in (PAD, CLS, SEP, MASK) or start:
                if cur:
                    out.append(cur)
                cur = 0 if tok in (PAD, CLS, SEP, MASK) else 1
            else:
                cur += 1
        if cur:
            out.append(cur)
    return out


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_budget_unit_bounds_the_measured_variance(strategy):
    """The budget assumes Var(selected count) <= p (1 - p) n u. Measured over 120 dynamic draws of the same rows
    (so row lengths do not vary): the variance ratio is 1 for tokens, sum(L^2) / sum(L) over the words (counted
    independently) for whole words, and at most u for every strategy."""
    ids, ws, words = _subword_rows()
    cfg = MaskingConfig(strategy=strategy, rate=0.15)
    colloc = None
    if strategy == "pmi":      # the 2- and 3-word sequences of the vocabulary that occur: hashed like the shards
        from mlm_core.masking.pmi_select import ngram_hashes
        cand = ~torch.isin(ids, torch.tensor([PAD, CLS, SEP, MASK]))
        grams = ngram_hashes(ids, cand, ws.bool(), 3)
        colloc = {m: torch.unique(grams[m][0][grams[m][1]])[::7].contiguous() for m in (2, 3)}
    m = Masker(cfg, VOCAB, SPECIALS, MASK, unk_id=UNK, collocations=colloc)
    gen = torch.Generator().manual_seed(1)
    counts = torch.stack([m(ids, ws, 0, generator=gen).selected.sum(1) for _ in range(120)]).double()
    n_cand = int((~torch.isin(ids, torch.tensor([PAD, CLS, SEP, MASK]))).sum())
    ratio = float(counts.var(0).sum()) / (0.15 * 0.85 * n_cand)
    u = strategy_class(strategy).budget_unit(cfg)
    assert ratio <= u * 1.1, (ratio, u)
    if strategy == "token":
        assert ratio == pytest.approx(1.0, rel=0.1)
    if strategy == "whole_word":
        lengths = np.asarray(_word_lengths(ids, ws), dtype=np.float64)
        assert lengths.sum() == n_cand
        assert ratio == pytest.approx((lengths ** 2).sum() / lengths.sum(), rel=0.1)


# ------------------------------------------------------------------------------- no string dispatch (AST)
# the places outside the registry allowed to compare a strategy name, and why
ALLOWED = {
    ("mlm_core/report/collect.py", "span"): "the report's cache key of span-fill documents, not a masking strategy",
    ("mlm_core/config/__init__.py", "pmi"): "config modules are leaves (test_layering.test_config_modules_are_leaves): the "
                                   "cross-field check 'pmi needs tokenizer.pmi_vocab' cannot import the registry",
}


def _names_in(node) -> set[str]:
    if isinstance(node, ast.Constant) and node.value in STRATEGY_NAMES:
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names_in(e) for e in node.elts)) if node.elts else set()
    return set()


def strategy_dispatch(source: str) -> list[tuple[int, str, str]]:
    """(line, kind, name) of each place ``source`` dispatches on a strategy name: a comparison with a name
    (==, !=, in, match), a table keyed by two or more names, or a lookup keyed by a ``.strategy``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                out += [(node.lineno, "compare", n) for n in sorted(_names_in(operand))]
        elif isinstance(node, ast.MatchValue):
            out += [(node.lineno, "match", n) for n in sorted(_names_in(node.value))]
        elif isinstance(node, ast.Dict):
            keys = set().union(*(_names_in(k) for k in node.keys if k is not None)) if node.keys else set()
            if len(keys) >= 2:
                out.append((node.lineno, "table", ",".join(sorted(keys))))
        elif isinstance(node, ast.Subscript) and "strategy" in ast.unparse(node.slice):
            out.append((node.lineno, "lookup", ast.unparse(node.slice)))
    return out


def test_scanner_finds_string_dispatch():
    """The scan can fail: it flags the forms the old code used (masking.py, compiled.py, pmi.py)."""
    old = ('if strategy == "span":\n    pass\nelif cfg.strategy in ("whole_word",):\n    pass\n'
           '_UNIT = {"token": 1.0, "whole_word": 2.0, "pmi": 10.0}\nu = _UNIT[mcfg.strategy]\n'
           'match s:\n    case "pmi":\n        pass\n')
    kinds = {(k, n) for _, k, n in strategy_dispatch(old)}
    assert kinds == {("compare", "span"), ("compare", "whole_word"), ("table", "pmi,whole_word"),
                     ("lookup", "mcfg.strategy"), ("match", "pmi")}
    assert strategy_dispatch('if scores["pmi"] > 0:\n    pass\nx = run.docs["span"]\n') == []


def test_no_strategy_name_is_dispatched_outside_the_registry():
    found, allowed_seen = [], set()
    for path in sorted((REPO / "mlm_core").rglob("*.py")):
        if path == REGISTRY:
            continue
        rel = str(path.relative_to(REPO))
        for line, kind, name in strategy_dispatch(path.read_text(encoding="utf-8")):
            if (rel, name) in ALLOWED:
                allowed_seen.add((rel, name))
            else:
                found.append(f"{rel}:{line} {kind} {name}")
    assert not found, "strategy names dispatched outside mlm_core/masking/strategies.py:\n" + "\n".join(found)
    assert allowed_seen == set(ALLOWED), "a stale ALLOWED entry: remove it"
    assert {n for _, k, n in strategy_dispatch(REGISTRY.read_text(encoding="utf-8")) if k == "table"} \
        == {"pmi,span,whole_word"}       # the registry itself is found by the same scan
