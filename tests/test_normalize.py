"""The normalize stage, framework-free: cleaning, filters, dedup, quarantine, invariant, bad input."""
from __future__ import annotations

import gzip
import json
import unicodedata

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import write_lines
from mlm_core import stages
from mlm_core.config.io import load_config
from mlm_core.errors import SourceError, StageError

EN = ["The cat sleeps on the warm mat.", "A dog runs in the green park.", "We eat bread with butter every day.",
      "She reads a long book at night.", "They travel by train to the sea."]
RU = ["Кошка спит на тёплом коврике.", "Собака бежит по зелёному парку.", "Мы едим хлеб с маслом каждый день."]
HI = ["बिल्ली गर्म चटाई पर सोती है।", "कुत्ता हरे पार्क में दौड़ता है।", "हम हर दिन मक्खन के साथ रोटी खाते हैं।"]


def run(tmp_path, sources: dict, execution: dict | None = None, **normalize):
    raw = {"workdir": str(tmp_path / "work"), "sources": sources, "normalize": {"workers": 1, **normalize},
           "execution": execution or {}}
    lc = load_config(tmp_path / "cfg.yaml", raw=raw)
    art, _ = stages.execute(lc, "normalize", stages.plan(lc))
    return art


def docs(art, lang):
    return pq.read_table(art.path / "docs" / f"{lang}.parquet").to_pylist()


def quarantine(art):
    return pq.read_table(art.path / "quarantine.parquet").to_pylist()


def check_invariant(art):
    for lang, s in art.manifest["languages"].items():
        assert s["records"] == s["docs"] + s["quarantined"] + s["duplicates"], lang
        n_docs = duckdb.sql(f"SELECT count(*) FROM '{art.path}/docs/{lang}.parquet'").fetchall()[0][0]
        n_quar = duckdb.sql(f"SELECT count(*) FROM '{art.path}/quarantine.parquet' WHERE lang='{lang}'").fetchall()[0][0]
        assert (n_docs, n_quar) == (s["docs"], s["quarantined"])


def test_clean_multilingual_and_invariant(tmp_path):
    en = write_lines(tmp_path / "en.txt", EN + [EN[0], "  spaced\t\tout   words here  ", "ok"])
    ru = write_lines(tmp_path / "ru.txt", RU)
    hi = write_lines(tmp_path / "hi.txt", HI)
    art = run(tmp_path, {"en": {"paths": [str(en)]}, "ru": {"paths": [str(ru)]}, "hi": {"paths": [str(hi)]}},
              max_quarantine_rate=0.5)
    check_invariant(art)
    en_docs = docs(art, "en")
    texts = [d["text"] for d in en_docs]
    assert "spaced out words here" in texts
    assert texts.count(EN[0]) == 1                    # exact duplicate dropped, first kept
    assert art.manifest["languages"]["en"]["duplicates"] == 1
    assert [q["reason"] for q in quarantine(art)] == ["too_short"]      # "ok" (2 chars)
    assert quarantine(art)[0]["line"] == 8
    assert [d["text"] for d in docs(art, "hi")] == HI                   # Devanagari untouched (no accent stripping)
    assert all(len(d["hash"]) == 32 for d in en_docs)
    ids = [d["doc_id"] for d in en_docs]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_dedup_across_files_and_languages_keeps_first(tmp_path):
    a = write_lines(tmp_path / "a.txt", EN[:3])
    b = write_lines(tmp_path / "b.txt", [EN[2], EN[3]])
    art = run(tmp_path, {"en": {"paths": [str(tmp_path / "*.txt")]}})
    assert [d["text"] for d in docs(art, "en")] == EN[:4]
    check_invariant(art)
    assert a.exists() and b.exists()


def test_partitions_of_a_large_file_keep_line_numbers(tmp_path):
    lines = [f"Line number {i} of the corpus is here." for i in range(60_000)]
    lines[45_000] = "x"
    f = write_lines(tmp_path / "big.txt", lines)
    assert f.stat().st_size > 2 * 2**20
    art = run(tmp_path, {"en": {"paths": [str(f)]}}, execution={"partition_mb": 1}, workers=2)
    assert art.manifest["partitions"] >= 2
    q = quarantine(art)
    assert [(r["line"], r["reason"]) for r in q] == [(45_001, "too_short")]
    assert art.manifest["languages"]["en"]["docs"] == 59_999
    check_invariant(art)
    # the contract's sample: bounded, made of kept documents, spread over the whole corpus
    sample = pq.read_table(art.path / "docs_sample.parquet").to_pylist()
    assert len(sample) == 10_000 and len({d["doc_id"] for d in sample}) == 10_000
    kept = {d["doc_id"]: d["text"] for d in docs(art, "en")}
    assert all(kept[d["doc_id"]] == d["text"] for d in sample)
    late = sum(int(d["text"].split()[2]) >= 30_000 for d in sample)
    assert 4_500 < late < 5_500


def test_bom_crlf_nul_zero_width_and_nfc(tmp_path):
    decomposed = unicodedata.normalize("NFD", "Le café est très chaud.")
    raw = ("\ufeffThe first line has a BOM.\r\n" + "Nul\x00byte inside a line.\r\n" + "Zero\u200bwidth space here.\r\n"
           + decomposed + "\r\n").encode("utf-8")
    f = write_lines(tmp_path / "x.txt", raw)
    art = run(tmp_path, {"en": {"paths": [str(f)]}}, script_check=False)
    texts = [d["text"] for d in docs(art, "en")]
    assert texts == ["The first line has a BOM.", "Nulbyte inside a line.", "Zerowidth space here.",
                     "Le café est très chaud."]
    assert all(unicodedata.is_normalized("NFC", t) for t in texts)
    check_invariant(art)


def test_invalid_utf8_is_quarantined_with_line(tmp_path):
    raw = "Good line number one.\n".encode() + b"bad \xff\xfe bytes here\n" + "Good line number three.\n".encode()
    f = write_lines(tmp_path / "x.txt", raw)
    art = run(tmp_path, {"en": {"paths": [str(f)]}}, max_quarantine_rate=0.5)
    q = quarantine(art)
    assert [(r["source"], r["line"], r["reason"]) for r in q] == [(str(f), 2, "invalid_utf8")]
    check_invariant(art)


def test_single_huge_line_is_quarantined_while_streaming(tmp_path):
    f = tmp_path / "huge.txt"
    with open(f, "wb") as out:
        out.write(b"A normal first line of text.\n")
        chunk = b"word " * (2**20 // 5)
        for _ in range(64):
            out.write(chunk)
        out.write(b"\nA normal last line of text.\n")
    assert f.stat().st_size > 64 * 2**20 - 100
    art = run(tmp_path, {"en": {"paths": [str(f)]}}, max_quarantine_rate=0.5)
    q = quarantine(art)
    assert [(r["line"], r["reason"]) for r in q] == [(2, "line_too_long")]
    assert [d["text"] for d in docs(art, "en")] == ["A normal first line of text.", "A normal last line of text."]
    check_invariant(art)


def test_jsonl_malformed_line_and_missing_field(tmp_path):
    lines = [json.dumps({"text": EN[0]}), "{not json", json.dumps({"body": "no text field"}),
             json.dumps({"text": 3}), "", json.dumps({"text": EN[1]})]
    f = write_lines(tmp_path / "x.jsonl", lines)
    art = run(tmp_path, {"en": {"paths": [str(f)]}}, max_quarantine_rate=0.9)
    q = {(r["line"], r["reason"]) for r in quarantine(art)}
    assert q == {(2, "malformed_json"), (3, "missing_field"), (4, "not_a_string")}
    assert [d["text"] for d in docs(art, "en")] == EN[:2]
    assert art.manifest["languages"]["en"]["blank_lines"] == 1
    check_invariant(art)


def test_jsonl_lone_surrogate_and_null_text_are_quarantined(tmp_path):
    """JSON's "\\ud800" escape decodes to a lone surrogate, which UTF-8 cannot hold (it crashed the stage)."""
    lines = [json.dumps({"text": EN[0]}), '{"text": "abc \\ud800 def"}', '{"text": null}',
             '{"body": "x \\udfff"}', json.dumps({"text": EN[1]})]
    f = write_lines(tmp_path / "x.jsonl", lines)
    art = run(tmp_path, {"en": {"paths": [str(f)]}}, max_quarantine_rate=0.9)
    q = [(r["line"], r["reason"]) for r in quarantine(art)]
    assert q == [(2, "invalid_unicode"), (3, "null_text"), (4, "missing_field")]
    assert "U+D800" in quarantine(art)[0]["detail"]
    assert [d["text"] for d in docs(art, "en")] == EN[:2]
    assert art.manifest["languages"]["en"]["quarantine_reasons"] == {"invalid_unicode": 1, "missing_field": 1,
                                                                      "null_text": 1}
    check_invariant(art)


def test_jsonl_custom_text_field_and_gzip(tmp_path):
    f = tmp_path / "x.jsonl.gz"
    with gzip.open(f, "wt", encoding="utf-8") as out:
        for t in EN:
            out.write(json.dumps({"content": t}) + "\n")
    art = run(tmp_path, {"en": {"paths": [str(f)], "text_field": "content"}})
    assert [d["text"] for d in docs(art, "en")] == EN


def test_parquet_source_and_missing_column(tmp_path):
    f = tmp_path / "x.parquet"
    pq.write_table(pa.table({"body": EN + [None]}), f, row_group_size=2)
    art = run(tmp_path, {"en": {"paths": [str(f)], "text_field": "body"}}, max_quarantine_rate=0.5)
    assert [d["text"] for d in docs(art, "en")] == EN
    assert [(r["line"], r["reason"]) for r in quarantine(art)] == [(5, "null_text")]  # 0-based row
    with pytest.raises(SourceError, match=r"x\.parquet: no column 'text' \(columns: body\)"):
        run(tmp_path, {"en": {"paths": [str(f)]}})


def test_truncated_gzip_keeps_what_was_read_and_quarantines_the_rest(tmp_path):
    f = tmp_path / "x.txt.gz"
    payload = "\n".join(f"Sentence number {i} is fine." for i in range(5000)).encode()
    data = gzip.compress(payload)
    f.write_bytes(data[: len(data) // 2])
    art = run(tmp_path, {"en": {"paths": [str(f)]}}, max_quarantine_rate=0.5)
    q = quarantine(art)
    assert [r["reason"] for r in q] == ["truncated_gzip"]
    n = art.manifest["languages"]["en"]["docs"]
    assert 0 < n < 5000
    assert q[0]["source"] == str(f)
    check_invariant(art)


def test_script_mismatch_is_quarantined(tmp_path):
    f = write_lines(tmp_path / "ru.txt", RU + ["This line is English, not Russian."])
    art = run(tmp_path, {"ru": {"paths": [str(f)]}}, max_quarantine_rate=0.5)
    assert [(r["line"], r["reason"]) for r in quarantine(art)] == [(4, "script_mismatch")]


def test_missing_file_and_unmatched_glob_name_the_key(tmp_path):
    with pytest.raises(SourceError, match=r"sources\.en\.paths\[0\]: file not found: .*nope\.txt"):
        run(tmp_path, {"en": {"paths": [str(tmp_path / "nope.txt")]}})
    with pytest.raises(SourceError, match=r"sources\.en\.paths\[0\]: no file matches"):
        run(tmp_path, {"en": {"paths": [str(tmp_path / "*.none")]}})


def test_empty_file_is_reported_and_an_empty_language_fails(tmp_path, caplog):
    empty = write_lines(tmp_path / "empty.txt", b"")
    good = write_lines(tmp_path / "good.txt", EN)
    art = run(tmp_path, {"en": {"paths": [str(empty), str(good)]}})
    assert art.manifest["empty_files"] == [str(empty)]
    assert "empty.txt is empty" in caplog.text
    with pytest.raises(StageError, match="no documents left .* en"):
        run(tmp_path, {"en": {"paths": [str(empty)]}})


def test_quarantine_rate_above_threshold_fails_naming_worst_file(tmp_path):
    bad = write_lines(tmp_path / "bad.txt", ["x", "y", "z", EN[0]])
    good = write_lines(tmp_path / "good.txt", EN[1:])
    with pytest.raises(StageError, match=r"(?s)quarantine rate .* exceeds .*bad\.txt: 3/4 quarantined"):
        run(tmp_path, {"en": {"paths": [str(good), str(bad)]}}, max_quarantine_rate=0.1)
    # the failed output is kept for inspection, never as a complete output
    failed = list((tmp_path / "work" / "normalize").glob(".failed-*"))
    assert failed and (failed[0] / "quarantine.parquet").exists()
    assert not [p for p in (tmp_path / "work" / "normalize").iterdir() if not p.name.startswith(".")]


def test_lowercase_and_nfkc_options(tmp_path):
    f = write_lines(tmp_path / "x.txt", ["Ｆｕｌｌ Width AND Upper Case."])
    art = run(tmp_path, {"en": {"paths": [str(f)]}}, lowercase=True)
    assert docs(art, "en")[0]["text"] == "full width and upper case."
    art = run(tmp_path, {"en": {"paths": [str(f)]}}, unicode_form="NFC")
    assert docs(art, "en")[0]["text"] == "Ｆｕｌｌ Width AND Upper Case."


def test_datasets_source_on_local_files(tmp_path):
    f = write_lines(tmp_path / "x.jsonl", [json.dumps({"text": t}) for t in EN])
    art = run(tmp_path, {"en": {"dataset": {"name": "json", "data_files": [str(f)], "split": "train"}}})
    assert [d["text"] for d in docs(art, "en")] == EN
    with pytest.raises(SourceError, match="no field 'body'"):
        run(tmp_path, {"en": {"dataset": {"name": "json", "data_files": [str(f)]}, "text_field": "body"}})


def test_real_shared_text(tmp_path, shared_data):
    srcs = {lang: {"paths": [str(shared_data / "text" / f"{lang}.txt")]} for lang in ("en", "ru", "hi", "ar", "zh")}
    art = run(tmp_path, srcs, workers=2)
    check_invariant(art)
    assert all(s["docs"] > 100 for s in art.manifest["languages"].values())


def test_clean_whitespace_and_script_ratio_units():
    from mlm_core.normalize.text import clean, script_ratio
    raw = ["a\u00a0b", "a \u3000 b", "a\tb\r\n", "a  b", "a b", " \u2028lead and trail\u2029 ", "x\u200by", "Ｆｕｌｌ"]
    out = clean(pa.array(raw), "NFC", False).to_pylist()
    assert out == ["a b", "a b", "a b", "a b", "a b", "lead and trail", "xy", "Ｆｕｌｌ"]
    r = script_ratio(pa.array(["Привет мир", "Привет world", "hello, 123!", "123 !?"]), ["Cyrillic"])
    assert list(r) == [1.0, 6 / 11, 0.0, 1.0]     # letters only: 6 Cyrillic of 11
    # weights, computed by hand: Han 3 letters each, a capitalized foreign word half, @handles and URLs out
    r = script_ratio(pa.array(["我爱巴黎", "我爱Paris", "Привет World", "@someone привет https://x.org/abc"]),
                     ["Han"])
    assert r[0] == 1.0 and r[1] == pytest.approx(6 / (6 + 2.5)) and r[2] == 0.0 and r[3] == 0.0
    r = script_ratio(pa.array(["Привет World", "@someone привет https://x.org/abc", "Hello Мир"]), ["Cyrillic"])
    assert r[0] == pytest.approx(6 / (6 + 2.5)) and r[1] == 1.0 and r[2] == pytest.approx(3 / (3 + 2.5))


def test_bidi_controls_are_dropped_zwj_zwnj_kept():
    from mlm_core.normalize.text import clean
    raw = ["a\u202ab\u202bc\u202cd\u202de\u202ef", "x\u2066y\u2067z\u2068w\u2069v", "क्\u200dष", "می\u200cخواهم"]
    assert clean(pa.array(raw), "NFC", False).to_pylist() == ["abcdef", "xyzwv", "क्\u200dष", "می\u200cخواهم"]


# Real lines of ../shared/data holding Latin names, quarantined as script_mismatch by raw letter counts
REAL_MIXED = {
    "zh": ["Lucy在月光石上施咒，交給Katherine。", "國家足球博物館（The National Football Museum）是英國的一座博物館。",
           "華山松（學名：Pinus armandii），是一種松科植物。", "他也參與了Courtney Love新專輯的製作。"],
    "ru": ["1. Игровая приставка Sony PlayStation 4 500GB.",
           "Инновационные пуховики STRETCH DOWN от Mountain Hardwear.",
           "Чехлы для iPhone 5 Luxury Aluminum едут в Уфу ;-)", "@Zhirinovskiy сам проверил.",
           "@screened-83 ещё."],
}
REAL_FOREIGN = {"ru": ["Nice🤗", "Fantastic 💯 keep it up ✌️", "Cool!..."]}   # not Russian: still quarantined


def test_script_check_keeps_real_sentences_with_latin_names(tmp_path, shared_data):
    srcs = {}
    for lang in ("zh", "ru"):
        real = set((shared_data / "text" / f"{lang}.txt").read_text(encoding="utf-8").splitlines())
        lines = REAL_MIXED[lang] + REAL_FOREIGN.get(lang, [])
        assert all(ln in real for ln in lines), "the test's lines must be real lines of the shared data"
        srcs[lang] = {"paths": [str(write_lines(tmp_path / f"{lang}.txt", lines))]}
    art = run(tmp_path, srcs, max_quarantine_rate=0.9, min_chars=1)
    for lang in ("zh", "ru"):   # kept, as NFKC (the default) writes them
        assert sorted(d["text"] for d in docs(art, lang)) == sorted(unicodedata.normalize("NFKC", t)
                                                                    for t in REAL_MIXED[lang])
    assert sorted((r["lang"], r["reason"]) for r in quarantine(art)) == [("ru", "script_mismatch")] * 3
