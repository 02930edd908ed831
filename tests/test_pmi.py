"""PMI-masking (issue 13 part 2): the PMI measure against a hand computation, the tokenizer stage's n-gram
vocabulary, and the ``pmi`` masking strategy's statistics (rate, collocations whole, planted collocations masked)."""
from __future__ import annotations

import hashlib
import math
import random
import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mlm_core.config.io import load_config
from mlm_core.artifacts import StageArtifact, parse

DOC_SCHEMA = pa.schema([("doc_id", pa.int64()), ("lang", pa.string()), ("text", pa.string()),
                        ("n_chars", pa.int32()), ("hash", pa.string())])


def write_docs(root: Path, lang: str, texts: list[str]) -> StageArtifact:
    (root / "docs").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"doc_id": list(range(len(texts))), "lang": [lang] * len(texts), "text": texts,
                             "n_chars": [len(t) for t in texts],
                             "hash": [hashlib.md5(t.encode()).hexdigest() for t in texts]}, schema=DOC_SCHEMA),
                   root / "docs" / f"{lang}.parquet")
    return parse("normalize", root, {"languages": {lang: {
        "docs": len(texts), "chars": sum(map(len, texts)), "bytes": sum(len(t.encode()) for t in texts)}}},
        "f" * 16, strict=False)


# ---------------------------------------------------------------------------------------------- the measure
TINY = ["new york city is big. new york is old", "the city of new york", "york is small, new ideas",
        "new york city again", "a big city"]


def hand_pmi(texts: list[str]) -> dict[str, float]:
    """Levine et al. 2021 Eq. 3 computed directly: k-gram counts within punctuation-free runs, p = count /
    positions of that length, PMI_n = min over segmentations into >= 2 parts of log p(g) - sum log p(part)."""
    runs = []
    for t in texts:
        cur = []
        for tok in re.findall(r"\w+|[^\w\s]+", t):
            if re.fullmatch(r"\w+", tok):
                cur.append(tok)
            else:
                runs.append(cur)
                cur = []
        runs.append(cur)
    counts, totals = Counter(), Counter()
    for r in runs:
        for k in range(1, 6):
            for i in range(len(r) - k + 1):
                counts[tuple(r[i:i + k])] += 1
                totals[k] += 1
    logp = {g: math.log(c / totals[len(g)]) for g, c in counts.items()}

    def splits(g):       # every segmentation into >= 1 parts
        if not g:
            yield []
            return
        for i in range(1, len(g) + 1):
            for rest in splits(g[i:]):
                yield [g[:i]] + rest

    return {" ".join(g): logp[g] - max(sum(logp[s] for s in seg) for seg in splits(g) if len(seg) >= 2)
            for g in counts if len(g) >= 2}


def test_pmi_values_equal_a_hand_computation(tmp_path):
    from mlm_core.masking.pmi import count_ngrams, pmi_scores
    write_docs(tmp_path, "en", TINY)
    counts, totals = count_ngrams(tmp_path / "docs" / "en.parquet", min_count=1)
    got = {r.ngram: r.pmi for r in pmi_scores(counts, totals).itertuples()}
    want = hand_pmi(TINY)
    assert set(got) == set(want)
    for g, v in want.items():
        assert got[g] == pytest.approx(v, abs=1e-9), g
    # the bigram by the textbook formula: log p(new york) / (p(new) p(york)); 19 bigram and 26 word positions
    assert got["new york"] == pytest.approx(math.log((4 / 19) / ((5 / 26) * (5 / 26))))
    # "new york city" is explained by "new york" + "city": its PMI is below the bigram's
    assert got["new york city"] < got["new york"]


def test_min_count_prunes_only_rare_ngrams(tmp_path):
    from mlm_core.masking.pmi import count_ngrams
    write_docs(tmp_path, "en", TINY)
    counts, totals = count_ngrams(tmp_path / "docs" / "en.parquet", min_count=3)
    assert counts["new york"] == 4 and "york city" not in counts and totals[1] == 26


# ---------------------------------------------------------------------------------------------- planted corpus
PLANTED = ["zorbex quilnat", "frambo gleektu", "snarvi plotokin"]


def planted_corpus(n_docs: int = 1500, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    syl = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "pe", "du"]
    filler = sorted({rng.choice(syl) + rng.choice(syl) + rng.choice(syl) for _ in range(400)})
    docs = []
    for _ in range(n_docs):
        words = [rng.choice(filler) for _ in range(rng.randint(8, 16))]
        if rng.random() < 0.4:
            words.insert(rng.randrange(len(words) + 1), rng.choice(PLANTED))
        docs.append(" ".join(words))
    return docs


@pytest.fixture(scope="module")
def pmi_stage(tmp_path_factory):
    """The tokenizer stage (as the pipeline runs it) with tokenizer.pmi_vocab on the planted corpus."""
    from mlm_core.stage_calls import run_tokenizer
    root = tmp_path_factory.mktemp("pmi")
    docs = planted_corpus()
    norm = write_docs(root / "normalize", "en", docs)
    lc = load_config(raw={"seed": 3, "sources": {"en": {"paths": [__file__]}},
                          "tokenizer": {"algorithm": "bpe", "vocab_size": 600, "heldout_docs": 20, "sample_mb": 1.0,
                                        "pmi_vocab": len(PLANTED), "pmi_min_count": 10},
                          "pretrain": {"masking": {"strategy": "pmi"}}})
    out = root / "tokenizer"
    out.mkdir()
    manifest = run_tokenizer(lc, {"normalize": norm}, out)
    return out, manifest, docs


def test_planted_collocations_top_the_vocabulary(pmi_stage):
    out, manifest, _ = pmi_stage
    table = pq.read_table(out / "pmi_ngrams.parquet").to_pandas()
    assert sorted(table["ngram"]) == sorted(PLANTED)
    assert table["hash"].notna().all() and (table["units"] == 2).all()
    stats = pq.read_table(out / "pmi_stats.parquet").to_pylist()
    assert [s["lang"] for s in stats] == ["en"] and stats[0]["kept"] == 3 and stats[0]["kept_n2"] == 3
    assert manifest["pmi"]["languages"]["en"]["kept"] == 3


def _rows(tok_dir: Path, docs: list[str], sp: dict, T: int = 64):
    """Packed rows [CLS] doc [SEP] doc [SEP] ... [PAD] with word starts, encoded as the shards encode."""
    import numpy as np
    import torch
    from tokenizers import Tokenizer

    from mlm_core.shards.encode import encode_texts, prepare_tokenizer
    tok = prepare_tokenizer(Tokenizer.from_file(str(tok_dir / "tokenizer.json")))
    enc = encode_texts(tok, docs, np.dtype(np.int64))
    cls, sep, pad = sp["cls"], sp["sep"], sp["pad"]
    rows, wss, cur, cws = [], [], [cls], [0]
    offs = np.concatenate([[0], np.cumsum(enc.lens)])
    for a, b in zip(offs[:-1], offs[1:]):
        ids, ws = enc.ids[a:b].tolist() + [sep], enc.word_start[a:b].tolist() + [0]
        if len(cur) + len(ids) > T:
            rows.append(cur + [pad] * (T - len(cur)))
            wss.append(cws + [0] * (T - len(cws)))
            cur, cws = [cls], [0]
        if len(ids) < T:
            cur, cws = cur + ids, cws + ws
    return torch.tensor(rows), torch.tensor(wss, dtype=torch.uint8), tok


def _occurrences(ids, pattern: list[int]) -> list[tuple[int, int]]:
    """(row, start) of every occurrence of the token sequence ``pattern`` (a plain scan, independent of hashing)."""
    out, k = [], len(pattern)
    for r, row in enumerate(ids.tolist()):
        for i in range(len(row) - k + 1):
            if row[i:i + k] == pattern:
                out.append((r, i))
    return out


def _masker(strategy: str, tok, sp: dict, collocations=None, rate: float = 0.15):
    from mlm_core.config import MaskingConfig
    from mlm_core.masking import Masker
    return Masker(MaskingConfig(strategy=strategy, rate=rate), tok.get_vocab_size(), sorted(sp.values()), sp["mask"],
                  seed=1, unk_id=sp["unk"], collocations=collocations)


def test_planted_collocations_are_what_gets_masked(pmi_stage, one_torch_thread):
    import torch

    from mlm_core.masking.pmi import load_collocations
    out, manifest, docs = pmi_stage
    sp = {r: e["id"] for r, e in manifest["special_tokens"].items()}
    ids, ws, tok = _rows(out, docs, sp)
    patterns = [tok.encode(p, add_special_tokens=False).ids for p in PLANTED]
    occ = [(r, i, len(p)) for p in patterns for r, i in _occurrences(ids, p)]
    assert len(occ) > 400
    g = torch.Generator().manual_seed(0)
    pmi = _masker("pmi", tok, sp, load_collocations(out))(ids, ws, 0, generator=g).selected
    whole = _masker("whole_word", tok, sp)(ids, ws, 0, generator=torch.Generator().manual_seed(0)).selected
    full = lambda sel: sum(bool(sel[r, i:i + k].all()) for r, i, k in occ) / len(occ)   # noqa: E731
    # the planted pairs cover ~5% of the tokens, under the 15% budget: PMI-masking takes every one of them,
    # whole-word masking takes both words of a pair about p^2 of the time
    assert full(pmi) > 0.97
    assert full(whole) < 0.1
    # never split: each occurrence is selected as a whole or not at all
    assert all(bool(pmi[r, i:i + k].all()) or not bool(pmi[r, i:i + k].any()) for r, i, k in occ)
    # and the rest of the budget goes to single words: the overall rate is still p
    cand = ids > 4
    assert float(pmi[cand].float().mean()) == pytest.approx(0.15, abs=0.005)


# ---------------------------------------------------------------------------------------------- rate on synthetic rows
def _synthetic(b: int = 1024, t: int = 128, seed: int = 0):
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 60, (b, t), generator=g)
    ws = (torch.rand(b, t, generator=g) < 0.6).to(torch.uint8)
    ids[:, 0], ids[:, -3:] = 2, 0          # [CLS] ... padding
    ids[:, 60] = 3                         # a [SEP] mid-row
    return ids, ws


@pytest.mark.parametrize("density", ["none", "sparse", "dense"])
def test_selection_rate_within_half_a_point(density, one_torch_thread):
    import torch

    from mlm_core.config import MaskingConfig
    from mlm_core.masking import Masker
    from mlm_core.masking.pmi_select import ngram_hashes
    ids, ws = _synthetic()
    cand = ids > 4
    grams = ngram_hashes(ids, cand, ws.bool(), 5)
    if density == "none":
        table = {2: torch.zeros(0, dtype=torch.int64)}
    else:   # the batch's own n-grams: every 50th (sparse, C < budget) or every one (dense, C > budget)
        step = 50 if density == "sparse" else 1
        table = {m: torch.unique(grams[m][0][grams[m][1]][::step]) for m in (2, 3, 5)}
    m = Masker(MaskingConfig(strategy="pmi", rate=0.15), 64, [0, 1, 2, 3, 4], 4, seed=0, unk_id=1, collocations=table)
    rates = [float(m(ids, ws, 0, generator=torch.Generator().manual_seed(s)).selected[cand].float().mean())
             for s in range(3)]
    assert sum(rates) / 3 == pytest.approx(0.15, abs=0.005), rates


def test_overlapping_occurrences_are_never_split(one_torch_thread):
    """Dense table: occurrences overlap everywhere; every taken one is selected as a whole (checked on the
    occurrence list the selection used, reconstructed from its outputs)."""
    import torch

    from mlm_core.masking.pmi_select import chain, take_occurrences, unit_hashes
    from mlm_core.masking.primitives import units
    ids, ws = _synthetic(b=64)
    cand = ids > 4
    uidx, start = units(cand, ws.bool())
    w, valid, tok = unit_hashes(ids, cand, uidx, start)
    grams = chain(w, valid, 3)
    table = {m: torch.unique(grams[m][0][grams[m][1]]) for m in (2, 3)}
    pr = torch.randint(0, 1 << 40, ids.shape, generator=torch.Generator().manual_seed(0))
    covered, occ = take_occurrences(table, grams, pr)
    # taken occurrences: runs of units sharing a start; each has 2 or 3 units and no unit is in two
    for r in range(ids.shape[0]):
        starts = Counter(occ[r][covered[r]].tolist())
        assert all(n in (2, 3) for n in starts.values())
        for u, n in starts.items():
            assert bool((occ[r, u:u + n] == u).all())
            h, v = grams[n]     # each taken occurrence is an n-gram of the table, over valid units
            assert bool(v[r, u]) and int(h[r, u]) in set(table[n].tolist())
        # the table holds every 2- and 3-gram: the tiling leaves few units out (bounded rounds)
    assert covered[valid].float().mean() > 0.8


def test_pmi_without_vocabulary_is_a_clear_error(tmp_path):
    from mlm_core.config import MaskingConfig
    from mlm_core.masking import Masker
    from mlm_core.masking.pmi import load_collocations
    with pytest.raises(ValueError, match="collocation vocabulary"):
        Masker(MaskingConfig(strategy="pmi"), 64, [0, 1, 2, 3, 4], 4)
    with pytest.raises(FileNotFoundError, match="tokenizer.pmi_vocab"):
        load_collocations(tmp_path)
    with pytest.raises(Exception, match="tokenizer.pmi_vocab"):
        load_config(raw={"sources": {"en": {"paths": [__file__]}}, "pretrain": {"masking": {"strategy": "pmi"}}})


# ---------------------------------------------------------------------------------------------- through the pipeline
@pytest.mark.heavy
def test_pipeline_pretrains_and_evaluates_with_pmi_masking(tmp_path, one_torch_thread):
    """normalize -> tokenizer (with the PMI vocabulary) -> shards -> pretrain (strategy pmi) -> evaluate: the
    pretrain stage finds the vocabulary of the tokenizer that encoded its shards; evaluate reports efficiency."""
    import json

    from conftest import run_demo_pipeline
    arts = run_demo_pipeline(
        tmp_path, 300, tokenizer={"pmi_vocab": 40, "pmi_min_count": 3},
        shards={"seq_len": 32, "validation_fraction": 0.15},
        pretrain={"batch_size": 4, "model": {"size": "tiny", "max_positions": 64}, "masking": {"strategy": "pmi"}},
        evaluate={"max_sequences": 4})
    pmi = arts["tokenizer"].manifest["pmi"]
    assert set(pmi["languages"]) == {"en", "fr"} and all(v["kept"] > 0 for v in pmi["languages"].values())
    assert (arts["tokenizer"].path / "pmi_ngrams.parquet").is_file()
    assert arts["pretrain"].manifest.get("steps", 3) == 3
    ev = json.loads((arts["evaluate"].path / "evaluation.json").read_text(encoding="utf-8"))
    eff = ev["efficiency"]
    assert eff["parameters"] > 0 and eff["latency_ms"]["p50"] <= eff["latency_ms"]["p95"]
    assert arts["evaluate"].manifest["metrics"]["efficiency.latency_p95_ms"] == eff["latency_ms"]["p95"]


def test_counts_do_not_depend_on_the_memory_limit(tmp_path):
    from mlm_core.masking.pmi import count_ngrams
    write_docs(tmp_path, "en", planted_corpus(3000, seed=1))
    path = tmp_path / "docs" / "en.parquet"
    assert count_ngrams(path, 5, memory_mb=128) == count_ngrams(path, 5, memory_mb=2048)
