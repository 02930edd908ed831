"""Counterfactual data augmentation (issue 13 part 1): the word-pair lists (format checks: every error names the
file, line and config key), the swap (hand-written expected strings: case, word boundaries, ambiguous "her",
French and German morphology), the document selection (share within a binomial tolerance), and the shards
stage hook: the training split gets the swapped copies, validation is untouched, the manifest counts equal an
independent count, the output does not depend on the partitioning, and without shards.cda nothing changes.

The stage test's expected streams come from the tokenizers library and a word-by-word swap written here
(``re.split`` on ``\\w+``, not the stage's regex alternation), never from the stage's helpers.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from conftest import REPO, SHARED_DATA
from mlm_core.bias.cda import selected, swap_text
from mlm_core.bias.wordlists import WordListError, load_wordlist, load_wordlists

LISTS = REPO / "configs" / "bias"


@pytest.fixture(scope="module")
def en():
    return load_wordlist(LISTS / "en.yaml")


# ------------------------------------------------------------------------------------------ the swap
@pytest.mark.parametrize("text, want, n", [
    ("he said she would", "she said he would", 2),                       # both directions in one pass
    ("He told HER that his MAN was hers.", "She told HIS that her WOMAN was his.", 5),
    ("the theme: hero, shell, heaven, mankind, chairman, sheer", "the theme: hero, shell, heaven, mankind, "
     "chairman, sheer", 0),                                                # words, not substrings
    ("he's here; she'd go (him) -his- man.", "she's here; he'd go (her) -her- woman.", 5),
    ("Men and women, fathers and mothers", "Women and men, mothers and fathers", 4),
    ("Mr Smith and his wife", "Mrs Smith and her husband", 3),
    ("her book; I saw her", "his book; I saw his", 2),                     # ambiguous her: swap_to his
    ("Himself HIMSELF himself", "Herself HERSELF herself", 3),
    ("", "", 0),
])
def test_swap_english(en, text, want, n):
    assert swap_text(text, en) == (want, n)


def test_swap_unicode_word_boundaries(en):
    # \w is Unicode: a listed word glued to a non-ASCII letter or digit is part of another word
    assert swap_text("heé éhe he2 _he he", en) == ("heé éhe he2 _he she", 1)


def test_swap_french_phrases_keep_and_case():
    fr = load_wordlist(LISTS / "fr.yaml")
    # the article agrees through the phrase rows; "à la reine" -> "à le roi" (no contraction: word-level CDA)
    assert swap_text("Le roi parle à la reine.", fr) == ("La reine parle à le roi.", 2)
    assert swap_text("Il y a un homme. Il dit qu'elle est là.", fr) == ("Il y a une femme. Elle dit qu'il est là.", 3)
    assert swap_text("L'homme et LA FEMME; l’homme", fr) == ("La femme et L'HOMME; la femme", 3)
    assert swap_text("Mes frères et mes sœurs, ELLES", fr) == ("Mes sœurs et mes frères, ILS", 3)
    assert swap_text("fille", fr) == ("fils", 1)                          # first row: daughter -> son
    assert swap_text("il faut partir, il   y   a", fr) == ("il faut partir, il   y   a", 0)


def test_swap_german_one_way_pronouns_and_nouns():
    de = load_wordlist(LISTS / "de.yaml")
    assert swap_text("Der Mann sagt, er sehe seinen Bruder.", de) == ("Die Frau sagt, sie sehe ihren Schwester.", 4)
    # sie / ihr(e) are never rewritten (they / your); nouns go both ways, capitals and umlauts kept
    assert swap_text("Sie gehen mit ihrer Mutter und den Töchtern.", de) == \
        ("Sie gehen mit ihrer Vater und den Söhnen.", 2)
    assert swap_text("MÄNNER, Mannschaft, Königin", de) == ("FRAUEN, Mannschaft, König", 2)
    assert "sie" not in de.group_words()["weiblich"] and "frau" in de.group_words()["weiblich"]


def test_group_words(en):
    g = en.group_words()
    assert set(g) == {"male", "female"}
    assert {"he", "him", "his", "man"} <= g["male"] and {"she", "her", "hers", "woman"} <= g["female"]
    assert not g["male"] & g["female"]


# ------------------------------------------------------------------------------------------ selection
def test_selection_share_and_stability():
    ids = np.arange(200_000, dtype=np.int64) * 7919 + (3 << 32)
    for share in (0.1, 0.5, 0.9):
        got = selected(ids, seed=0, share=share).mean()
        # binomial sd = sqrt(p(1-p)/n) <= 0.0012 at n = 200k: 5 sd
        assert abs(got - share) < 0.006, (share, got)
    a = selected(ids, 0, 0.5)
    assert (selected(ids[::-1], 0, 0.5) == a[::-1]).all()                 # per document, not per position
    assert (selected(ids, 0, 0.5) == a).all()
    assert 0.4 < (selected(ids, 1, 0.5) != a).mean() < 0.6                 # another seed: another draw
    assert (a <= selected(ids, 0, 0.7)).all()                               # a larger share keeps the smaller's
    assert selected(ids, 0, 1.0).all()
    # the documented rule: blake2b("cda:<seed>:<doc id>", 8 bytes) / 2**64 < share
    want = [int.from_bytes(hashlib.blake2b(f"cda:0:{int(d)}".encode(), digest_size=8).digest(), "big") < 2**63
            for d in ids[:2000]]
    assert a[:2000].tolist() == want


# ------------------------------------------------------------------------------------------ bad lists
GOOD = "language: en\ngroups: [male, female]\npairs:\n  - [he, she]\n  - [him, her]\n"


@pytest.mark.parametrize("text, line, message", [
    (GOOD + "colour: red\n", 6, "unknown key 'colour'"),
    (GOOD + "  - [man, woman, person]\n", 6, "this row has 3 entries"),
    (GOOD + "  - [man, man]\n", 6, "must differ"),
    (GOOD + "  - [she, girl]\n", 4, "'she' is in both columns"),
    (GOOD + "  - [Man, woman]\n", 6, "'Man' must be lower case"),
    (GOOD + "  - [man, '']\n", 6, "non-empty"),
    (GOOD.replace("[male, female]", "[male, female, other]"), 2, "exactly two distinct groups"),
    (GOOD + "swap_to: {her: she}\n", 6, "'she' is not a partner of 'her'"),
    (GOOD + "one_way: [they]\n", 6, "one_way: 'they' is on no row"),
    (GOOD + "case: upper\n", 6, "case must be one of preserve"),
    (GOOD + "  - [he, she]\n", 6, "repeats line 4"),
    (GOOD + "  - [man\n", 7, "not valid YAML"),
    ("language: en\npairs:\n  - [he, she]\n", 1, "missing key 'groups'"),
])
def test_bad_list_names_file_line_and_key(tmp_path, text, line, message):
    p = tmp_path / "en.yaml"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(WordListError) as e:
        load_wordlist(p, key="shards.cda.lists.en")
    msg = str(e.value)
    assert msg.startswith(f"{p}:{line}: "), msg
    assert message in msg and msg.endswith("(config key shards.cda.lists.en)"), msg


def test_missing_or_mislabelled_list(tmp_path):
    with pytest.raises(WordListError, match=r"nope\.yaml: word-pair list file not found \(config key "
                       r"shards\.cda\.lists\.en\)"):
        load_wordlists({"en": "nope.yaml"}, tmp_path, "shards.cda.lists")
    (tmp_path / "fr.yaml").write_text(GOOD)
    with pytest.raises(WordListError, match=r"fr\.yaml: the list says language 'en', but shards\.cda\.lists\.fr"):
        load_wordlists({"fr": "fr.yaml"}, tmp_path, "shards.cda.lists")


def test_shipped_lists_load():
    got = load_wordlists({lang: f"{lang}.yaml" for lang in ("en", "fr", "de")}, LISTS, "shards.cda.lists")
    for lang, wl in got.items():
        assert len(wl.pairs) >= 30, lang
        for w, t in wl.swap.items():       # every target is the word's partner on some row
            assert any((w, t) in (p, p[::-1]) for p in wl.pairs), (lang, w, t)


def test_config_language_not_in_sources(tmp_path):
    from conftest import write_en_ru_config

    from mlm_core.config.io import ConfigError, load_config
    cfg = write_en_ru_config(tmp_path, "x", 5, shards={"cda": {"lists": {"en": str(LISTS / "en.yaml"),
                                                                       "de": str(LISTS / "de.yaml")}}})
    with pytest.raises(ConfigError, match=r"shards\.cda\.lists\.de: language 'de' is not in sources \(en, ru\)"):
        load_config(cfg)


# ------------------------------------------------------------------------------------------ the shards stage
LANGS = ("en", "ru")
TEST_LIST = ("language: en\ngroups: [m, f]\npairs:\n  - [he, she]\n  - [him, her]\n  - [his, her]\n"
             "  - [man, woman]\n  - [men, women]\nswap_to: {her: his}\n")
SW = {"he": "she", "she": "he", "him": "her", "her": "his", "his": "her", "man": "woman", "woman": "man",
      "men": "women", "women": "men"}


def hand_swap(text: str) -> tuple[str, int]:
    """Word by word: split on \\w+ runs, swap each listed word, keep its case pattern."""
    parts, n = re.split(r"(\w+)", text), 0
    for i in range(1, len(parts), 2):
        w = parts[i]
        t = SW.get(w.lower())
        if t:
            n += 1
            parts[i] = t.upper() if len(w) > 1 and w.isupper() else t.capitalize() if w[0].isupper() else t
    return "".join(parts), n


def write_config(root: Path) -> Path:
    srcs = {}
    for lang in LANGS:
        with open(SHARED_DATA / "text" / f"{lang}.txt", encoding="utf-8") as f:
            every = f.readlines()
        lines = every[:50]
        if lang == "en":     # plus real lines with listed words, so that there is something to swap
            lines += [x for x in every[50:] if re.search(r"\b(he|she|his|her|him|man|men|women|woman)\b", x, re.I)][:50]
        p = root / "raw" / f"{lang}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(lines), encoding="utf-8")
        srcs[lang] = {"paths": [str(p)]}
    (root / "lists").mkdir()
    (root / "lists" / "en.yaml").write_text(TEST_LIST)
    (root / "lists" / "nothing.yaml").write_text("language: en\ngroups: [m, f]\npairs:\n  - [zzqx, qxzz]\n")
    raw = {"name": "cda", "workdir": str(root / "work"), "sources": srcs, "seed": 3,
           "normalize": {"workers": 1, "min_chars": 5, "max_quarantine_rate": 0.5},
           "tokenizer": {"algorithm": "bpe", "vocab_size": 600, "heldout_docs": 5},
           "shards": {"seq_len": 48, "rows_per_shard": 4, "validation_fraction": 0.15}}
    f = root / "cfg.yaml"
    f.write_text(yaml.safe_dump(raw, allow_unicode=True))
    return f


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    from mlm_core import stages
    from mlm_core.config.io import load_config
    cfg = write_config(tmp_path_factory.mktemp("cda"))
    lc = load_config(cfg)
    plans = stages.plan(lc)
    for name in ("normalize", "tokenizer"):
        stages.execute(lc, name, plans)
    return cfg


def run_shards(cfg: Path, *overrides: str):
    from mlm_core import stages
    from mlm_core.config.io import load_config
    lc = load_config(cfg, list(overrides))
    plans = stages.plan(lc)
    art, _ = stages.execute(lc, "shards", plans, force=True)
    return lc, plans, art


def files_of(art) -> dict:
    """Every output file's sha256, except the manifest and the store's own metadata (dot files)."""
    return {str(p.relative_to(art.path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(art.path.rglob("*"))
            if p.is_file() and p.name != "manifest.json" and not p.name.startswith(".")}


def stream_docs(rows: np.ndarray, sep: int, pad: int) -> list[list[int]]:
    flat = rows[:, 1:].reshape(-1)
    out, cur = [], []
    for t in flat[flat != pad].tolist():
        if t == sep:
            out.append(cur)
            cur = []
        else:
            cur.append(t)
    return out


CDA = ["shards.cda.share=0.6", "shards.cda.lists={en: lists/en.yaml}"]


def test_training_split_gets_the_swapped_copies(upstream):
    from tokenizers import Tokenizer

    from mlm_core.shards.reader import read_shard_file
    from mlm_core.store import StageStore
    lc, plans, art = run_shards(upstream, *CDA, "execution.partition_mb=0.0005")
    m = art.manifest
    store = StageStore(lc.workdir)
    norm = store.load("normalize", plans["normalize"].fingerprint)
    tok = Tokenizer.from_file(str(store.load("tokenizer", plans["tokenizer"].fingerprint).path / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = True
    sp = {r: v["id"] for r, v in m["special_tokens"].items()}
    for lang in LANGS:
        t = pq.read_table(norm.path / "docs" / f"{lang}.parquet", columns=["doc_id", "text", "hash"])
        ids, texts, hashes = (t.column(c).to_pylist() for c in ("doc_id", "text", "hash"))
        k = m["validation_docs"][lang]
        val = set(sorted(range(len(texts)), key=lambda i: (int(hashes[i][:8], 16), i))[:k])
        train = [i for i in range(len(texts)) if i not in val]
        copies, want_counts = [], {"selected": 0, "swapped": 0, "words": 0}
        if lang == "en":
            for i in train:
                h = int.from_bytes(hashlib.blake2b(f"cda:3:{ids[i]}".encode(), digest_size=8).digest(), "big")
                if h < int(0.6 * 2**64):
                    new, n = hand_swap(texts[i])
                    want_counts["selected"] += 1
                    if n:
                        copies.append(new)
                        want_counts["swapped"] += 1
                        want_counts["words"] += n
            assert m["cda"]["languages"]["en"] == want_counts
            assert want_counts["swapped"] >= 10 and want_counts["words"] >= 30          # the test means something
            assert 0.45 < want_counts["selected"] / len(train) < 0.75
        enc = lambda xs: [e for e in (tok.encode(x, add_special_tokens=False).ids for x in xs) if e]  # noqa: E731
        want = {"train": enc([texts[i] for i in train] + copies), "validation": enc([texts[i] for i in sorted(val)])}
        for split in ("train", "validation"):
            files = sorted(s["file"] for s in m["shards"] if s["lang"] == lang and s["split"] == split)
            rows = np.concatenate([read_shard_file(art.path, f, m)["input_ids"] for f in files]).astype(np.int64)
            assert stream_docs(rows, sp["sep"], sp["pad"]) == want[split], (lang, split)
        assert m["languages"][lang]["docs_train"] == len(train) + len(copies)
    assert set(m["cda"]["languages"]) == {"en"}                 # ru has no list: untouched


def test_partitioning_changes_nothing_with_cda(upstream):
    _, _, big = run_shards(upstream, *CDA, "execution.partition_mb=64")
    _, _, small = run_shards(upstream, *CDA, "execution.partition_mb=0.0003")
    # worker processes (workers >= 3) carry the copies' batches through the same ordered stream
    _, _, procs = run_shards(upstream, *CDA, "shards.workers=3")
    keep = ("shards", "languages", "counts", "validation_docs", "cda")
    for other in (small, procs):
        assert files_of(big) == files_of(other)
        assert {k: big.manifest[k] for k in keep} == {k: other.manifest[k] for k in keep}
    assert big.manifest["cda"]["languages"]["en"]["swapped"] > 0


def test_without_cda_nothing_changes(upstream):
    """No shards.cda: no "cda" in the manifest, the fingerprint has no inputs, and the files equal those of a run
    whose list matches no word (the hook adds nothing else). The streams without CDA are checked against the
    tokenizers library by tests/test_shards_partitions.py."""
    from mlm_core import stage_calls, stages
    lc, plans, off = run_shards(upstream)
    assert "cda" not in off.manifest and stage_calls.shards_inputs(lc) is None
    lc2, plans2, none = run_shards(upstream, "shards.cda.lists={en: lists/nothing.yaml}")
    assert none.manifest["cda"]["languages"]["en"]["swapped"] == 0
    assert files_of(off) == files_of(none)
    assert plans2["shards"].fingerprint != plans["shards"].fingerprint


def test_list_content_and_seed_enter_the_fingerprint(upstream):
    from mlm_core import stages
    from mlm_core.config.io import load_config
    lists = upstream.parent / "lists"
    fp = lambda: stages.plan(load_config(upstream, CDA))["shards"].fingerprint    # noqa: E731
    before = fp()
    (lists / "en.yaml").write_text(TEST_LIST.replace("[men, women]", "[men, women]\n  - [boy, girl]"))
    try:
        assert fp() != before
    finally:
        (lists / "en.yaml").write_text(TEST_LIST)
    assert fp() == before
    seeded = stages.plan(load_config(upstream, CDA + ["seed=4"]))["shards"].fingerprint
    assert seeded != before


def test_missing_list_fails_the_stage_naming_file_and_key(upstream):
    with pytest.raises(Exception, match=r"missing\.yaml: word-pair list file not found \(config key "
                       r"shards\.cda\.lists\.en\)"):
        run_shards(upstream, "shards.cda.lists={en: lists/missing.yaml}")
