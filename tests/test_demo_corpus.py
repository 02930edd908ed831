"""The bundled demo corpus (configs/demo/): reproducible, multilingual, imbalanced, well-formed."""
from __future__ import annotations

import collections
import csv
import json
import pathlib
import sys
import unicodedata

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mlm_core.demo.generate import write_demo_corpus  # noqa: E402

LANGS = ("en", "fr", "de", "ru", "ar", "hi", "zh")
UD_UPOS = {"ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN",
           "PUNCT", "SCONJ", "SYM", "VERB", "X"}
# unicodedata.name prefixes -> script
SCRIPT_PREFIXES = {"LATIN": "Latin", "CYRILLIC": "Cyrillic", "ARABIC": "Arabic", "DEVANAGARI": "Devanagari",
                   "CJK UNIFIED IDEOGRAPH": "Han"}
EXPECTED_SCRIPT = {"en": "Latin", "fr": "Latin", "de": "Latin", "ru": "Cyrillic", "ar": "Arabic",
                   "hi": "Devanagari", "zh": "Han"}


def _files(root: pathlib.Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> tuple[pathlib.Path, dict]:
    out = tmp_path_factory.mktemp("demo")
    summary = write_demo_corpus(out)
    return out, summary


@pytest.fixture(scope="module")
def parallel() -> list[dict]:
    with open(DEMO / "parallel.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_regeneration_is_byte_identical(regenerated):
    out, summary = regenerated
    fresh, committed = _files(out), _files(DEMO)
    assert sorted(summary["files"]) == sorted(fresh)
    assert set(fresh) <= set(committed), "generator writes files that are not committed"
    changed = [name for name in fresh if fresh[name] != committed[name]]
    assert not changed, f"configs/demo is stale, rerun `python -m mlm_core.demo.generate`: {changed}"


def _dominant_script(text: str) -> str:
    counts: collections.Counter[str] = collections.Counter()
    for ch in text:
        if not ch.isalpha():
            continue
        name = unicodedata.name(ch, "")
        for prefix, script in SCRIPT_PREFIXES.items():
            if name.startswith(prefix):
                counts[script] += 1
                break
        else:
            counts["other"] += 1
    return counts.most_common(1)[0][0]


def test_languages_scripts_and_imbalance():
    sizes = {}
    scripts = set()
    for lang in LANGS:
        path = DEMO / "corpus" / f"{lang}.txt"
        data = path.read_bytes()
        sizes[lang] = len(data)
        assert len(data) < 1_500_000
        text = data.decode("utf-8")
        assert "\r" not in text and text.endswith("\n")
        script = _dominant_script(text)
        assert script == EXPECTED_SCRIPT[lang], (lang, script)
        scripts.add(script)
    assert len(sizes) >= 6 and len(scripts) >= 3
    assert max(sizes.values()) / min(sizes.values()) >= 20
    assert sum(sizes.values()) < 2_500_000


def test_corpus_documents_and_noise():
    for lang in LANGS:
        lines = (DEMO / "corpus" / f"{lang}.txt").read_text(encoding="utf-8").split("\n")[:-1]
        n = len(lines)
        empty = sum(1 for line in lines if not line.strip())
        assert empty <= 0.002 * n
        docs = [line for line in lines if line.strip()]
        dup_rate = 1 - len(set(docs)) / len(docs)
        assert 0.003 <= dup_rate <= 0.03, (lang, dup_rate)
        assert any(line != line.rstrip(" ") for line in lines), lang
        assert any("\u200b" in line for line in lines), lang
        doubled = [line for line in docs if "  " in line.strip()]
        assert 0 < len(doubled) <= 0.01 * n, lang
        end = "。" if lang == "zh" else ("।" if lang == "hi" else ".")
        for doc in docs:
            assert 5 <= len(doc) <= 2000
            assert doc.rstrip(" ")[-1] in ".!?。।", (lang, doc)
        assert sum(doc.rstrip(" ").endswith(end) for doc in docs) > 0.9 * len(docs)


def test_parallel_subset(parallel):
    by_id: dict[str, dict[str, dict]] = collections.defaultdict(dict)
    for rec in parallel:
        assert set(rec) == {"id", "topic", "lang", "text", "tokens", "upos"}
        assert rec["lang"] not in by_id[rec["id"]], "duplicate (id, lang)"
        by_id[rec["id"]][rec["lang"]] = rec
        assert len(rec["tokens"]) == len(rec["upos"]) > 0
        assert set(rec["upos"]) <= UD_UPOS, rec
        assert all(tok and " " not in tok for tok in rec["tokens"]), rec
        if rec["lang"] == "zh":
            expected = "".join(rec["tokens"])
        else:
            expected = ""
            for tok, tag in zip(rec["tokens"], rec["upos"]):
                expected += ("" if not expected or tag == "PUNCT" else " ") + tok
        assert rec["text"] == expected
        assert rec["upos"][-1] == "PUNCT"
    assert len(by_id) >= 200
    for sid, recs in by_id.items():
        assert set(recs) == set(LANGS), sid
        assert len({r["topic"] for r in recs.values()}) == 1, sid
    topics = collections.Counter(recs["en"]["topic"] for recs in by_id.values())
    assert len(topics) >= 4
    assert max(topics.values()) <= 2 * min(topics.values())
    for lang in LANGS:
        assert {r["topic"] for r in parallel if r["lang"] == lang} == set(topics)


def test_parallel_language_specifics(parallel):
    for rec in parallel:
        tags, toks = rec["upos"], rec["tokens"]
        if rec["lang"] == "ru":
            assert all(t.lower() == "каждый" for t, u in zip(toks, tags) if u == "DET")  # no articles
        if rec["lang"] == "zh":
            assert " " not in rec["text"]
        if rec["lang"] == "hi" and "VERB" in tags:
            # SOV: the verb group closes the sentence
            assert tags[-2] in ("AUX", "VERB")


def test_crows_pairs():
    files = sorted((DEMO / "bias").glob("crows_pairs_*.csv"))
    assert {p.stem.split("_")[-1] for p in files} >= {"en", "fr"}
    for path in files:
        with open(path, encoding="utf-8", newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader)
            rows = list(reader)
        assert header == ["sent_more", "sent_less", "stereo_antistereo", "bias_type"]
        assert len(rows) >= 40
        for more, less, label, bias_type in rows:
            assert more.strip() and less.strip() and more != less
            assert label in ("stereo", "antistereo")
            assert bias_type
            # minimal pair: same ending after the group words
            assert more.split()[-2:] == less.split()[-2:]


def test_templates_yaml():
    import yaml
    files = sorted((DEMO / "bias").glob("templates_*.yaml"))
    assert {p.stem.split("_")[-1] for p in files} >= {"en", "fr"}
    for path in files:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert data["templates"] and all("{group}" in t and "[MASK]" in t for t in data["templates"])
        assert len(data["groups"]) >= 2
        assert all(isinstance(words, list) and words for words in data["groups"].values())
        assert data["neutral"]
        assert data["attributes"] and all(" " not in a for a in data["attributes"])
