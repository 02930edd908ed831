"""mlm_core.tokenizer: training on a hand-made normalize output (6 languages, short real sentences)."""
from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mlm_core.config.io import load_config
from mlm_core.artifacts import StageArtifact, parse
from mlm_core.store import StageStore
from mlm_core.tokenizer import (
    TokenizerError, TokenizerMismatch, load_tokenizer, run_tokenizer, special_ids, train_sample,
)
from mlm_core.tokenizer.stats import char_script, dominant_script, token_text

SENTENCES = {
    "en": ["The quick brown fox jumps over the lazy dog.", "She sells sea shells by the sea shore.",
           "A journey of a thousand miles begins with a single step.", "The weather was cold and wet all week.",
           "Reading books in the library is a quiet pleasure.", "Our train arrived two hours late yesterday.",
           "Children were playing football in the park.", "He cooked a simple dinner of rice and beans.",
           "The museum opens at nine on Sundays.", "Farmers harvested wheat before the storm.",
           "My neighbour repairs old bicycles for fun.", "The river flooded several villages last spring."],
    "fr": ["Le cœur a ses raisons que la raison ignore.", "Où est la bibliothèque, s'il vous plaît ?",
           "Le café était très chaud ce matin.", "Nous avons marché le long de la rivière.",
           "Les élèves préparent leur examen de géographie.", "Il pleut depuis trois jours à Paris.",
           "Ma grand-mère cultive des tomates dans son jardin.", "Le musée ferme ses portes à dix-huit heures.",
           "Ils ont acheté une voiture d'occasion.", "La boulangerie du quartier vend un pain délicieux.",
           "Le médecin conseille de boire beaucoup d'eau.", "Nous partirons en vacances au mois d'août."],
    "ru": ["Москва — столица России.", "Я люблю читать книги по вечерам.", "Погода сегодня очень хорошая.",
           "Мы поехали на дачу в субботу.", "Дети играли во дворе до темноты.", "Этот поезд идёт в Санкт-Петербург.",
           "Бабушка испекла вкусный пирог с яблоками.", "Студенты сдают экзамены в январе.",
           "На реке замёрз лёд, и мы катались на коньках.", "Врач посоветовал больше гулять.",
           "Новый музей открылся в центре города.", "Вечером начался сильный дождь."],
    "hi": ["यह एक छोटा सा हिंदी दस्तावेज़ है।", "भारत की राजधानी नई दिल्ली है।", "मुझे किताबें पढ़ना पसंद है।",
           "आज मौसम बहुत अच्छा है।", "बच्चे पार्क में खेल रहे थे।", "हम कल सुबह बाज़ार जाएंगे।",
           "किसानों ने बारिश से पहले फसल काट ली।", "मेरी दादी बहुत स्वादिष्ट खाना बनाती हैं।",
           "रेलगाड़ी दो घंटे देर से पहुँची।", "विद्यार्थी परीक्षा की तैयारी कर रहे हैं।",
           "नदी के किनारे एक पुराना मंदिर है।", "डॉक्टर ने ज़्यादा पानी पीने की सलाह दी।"],
    "ar": ["القاهرة هي عاصمة مصر.", "أحب قراءة الكتب في المساء.", "الطقس جميل جدا اليوم.",
           "ذهب الأطفال إلى المدرسة صباحا.", "تقع المكتبة بجانب النهر.", "سافرنا إلى الإسكندرية في الصيف.",
           "يزرع جدي الزيتون في قريته.", "افتتح متحف جديد في وسط المدينة.",
           "وصل القطار متأخرا ساعتين.", "يستعد الطلاب للامتحانات النهائية.",
           "نصح الطبيب بشرب الكثير من الماء.", "هطل مطر غزير طوال الليل."],
    "zh": ["我们今天去公园散步。", "北京是中国的首都。", "我喜欢在晚上看书。", "今天的天气非常好。",
           "孩子们在院子里玩耍。", "这列火车开往上海。",
           "奶奶做的饺子特别好吃。", "学生们正在准备期末考试。", "新的博物馆在市中心开放了。",
           "医生建议多喝水。", "昨天晚上下了一场大雨。", "农民在暴风雨之前收割了小麦。"],
}
DOC_SCHEMA = pa.schema([("doc_id", pa.int64()), ("lang", pa.string()), ("text", pa.string()),
                        ("n_chars", pa.int32()), ("hash", pa.string())])


def make_docs(sentences: list[str], n: int, k: int = 3) -> list[str]:
    """``n`` distinct documents: ordered ``k``-tuples of the sentences joined by a space."""
    docs = [" ".join(p) for p in itertools.permutations(sentences, k)]
    assert len(docs) >= n, (len(docs), n)
    return docs[:n]


def write_normalize(root: Path, docs: dict[str, list[str]]) -> StageArtifact:
    """A normalize output folder as the stage writes it, and its Artifact."""
    (root / "docs").mkdir(parents=True)
    langs = {}
    for p, (lang, texts) in enumerate(sorted(docs.items())):
        pq.write_table(pa.table({"doc_id": [(p << 32) | i for i in range(len(texts))], "lang": [lang] * len(texts),
                                 "text": texts, "n_chars": [len(t) for t in texts],
                                 "hash": [hashlib.md5(t.encode()).hexdigest() for t in texts]}, schema=DOC_SCHEMA),
                       root / "docs" / f"{lang}.parquet")
        langs[lang] = {"docs": len(texts), "chars": sum(map(len, texts)), "bytes": sum(len(t.encode()) for t in texts)}
    return parse("normalize", root, {"languages": langs}, "f" * 16, strict=False)


def config(langs, **tok):
    tok = {"vocab_size": 1000, "heldout_docs": 20, "sample_mb": 1.0, **tok}
    return load_config(raw={"seed": 7, "sources": {lang: {"paths": [__file__]} for lang in langs}, "tokenizer": tok,
                            "shards": {"sampling_alpha": 0.3}})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> StageArtifact:
    sizes = {"en": 300, "fr": 120, "ru": 120, "hi": 100, "ar": 100, "zh": 60}
    return write_normalize(tmp_path_factory.mktemp("normalize"),
                           {lang: make_docs(SENTENCES[lang], n) for lang, n in sizes.items()})


STYLES = {"bpe": "roberta", "wordpiece": "bert", "unigram": "roberta"}


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """One trained tokenizer per algorithm: (output folder, manifest fields)."""
    out = {}
    for algo, style in STYLES.items():
        d = tmp_path_factory.mktemp(algo)
        lc = config(SENTENCES, algorithm=algo, special_tokens=style)
        out[algo] = (d, run_tokenizer(lc, {"normalize": corpus}, d))
    return out


@pytest.mark.parametrize("algo", list(STYLES))
def test_trains_with_fixed_special_ids(trained, algo):
    d, m = trained[algo]
    tok = load_tokenizer(d)
    assert m["algorithm"] == algo and m["style"] == STYLES[algo] and m["vocab_size_requested"] == 1000
    assert m["vocab_size"] == tok.get_vocab_size() == m["counts"]["vocab_size"]
    assert 500 <= m["vocab_size"] <= 1000
    for role, (token, tid) in special_ids(STYLES[algo]).items():
        assert tok.token_to_id(token) == tid == m["special_tokens"][role]["id"]
        assert m["special_tokens"][role]["token"] == token
    assert sorted(t for t, _ in special_ids(STYLES[algo]).values()) == sorted(
        tok.id_to_token(i) for i in range(5))
    assert sorted(tok.get_added_tokens_decoder()) == [0, 1, 2, 3, 4]   # (WordPiece's ##c helpers are not added)
    enc = tok.encode("Le café était très chaud.")
    assert enc.ids[0] == special_ids(STYLES[algo])["cls"][1] and enc.ids[-1] == special_ids(STYLES[algo])["sep"][1]
    assert m["counts"]["train_seconds"] >= 0 and m["sample"]["bytes"] == m["counts"]["sample_bytes"] > 0


def test_special_ids_table():
    assert special_ids("bert") == {"pad": ("[PAD]", 0), "unk": ("[UNK]", 1), "cls": ("[CLS]", 2),
                                   "sep": ("[SEP]", 3), "mask": ("[MASK]", 4)}
    assert special_ids("roberta") == {"cls": ("<s>", 0), "pad": ("<pad>", 1), "sep": ("</s>", 2),
                                      "unk": ("<unk>", 3), "mask": ("<mask>", 4)}


@pytest.mark.parametrize("algo", list(STYLES))
def test_byte_identical_reruns(trained, corpus, tmp_path, algo):
    d, _ = trained[algo]
    run_tokenizer(config(SENTENCES, algorithm=algo, special_tokens=STYLES[algo]), {"normalize": corpus}, tmp_path)
    assert (tmp_path / "tokenizer.json").read_bytes() == (d / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("algo", ["wordpiece", "bpe"])
def test_transformers_loads_with_special_tokens(trained, tmp_path, algo):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    d, m = trained[algo]
    sp = {role: v["token"] for role, v in m["special_tokens"].items()}
    hf = PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"), unk_token=sp["unk"], pad_token=sp["pad"],
                                 cls_token=sp["cls"], sep_token=sp["sep"], mask_token=sp["mask"])
    hf.save_pretrained(tmp_path)
    at = AutoTokenizer.from_pretrained(tmp_path)
    for t in (hf, at):
        assert (t.pad_token, t.unk_token, t.cls_token, t.sep_token, t.mask_token) == (
            sp["pad"], sp["unk"], sp["cls"], sp["sep"], sp["mask"])
        assert t.mask_token_id == m["special_tokens"]["mask"]["id"]
        assert t.pad_token_id == m["special_tokens"]["pad"]["id"]
        enc = t(["Москва — столица России.", "我们今天去公园散步。"], padding=True)
        for ids in enc["input_ids"]:
            assert ids[0] == t.cls_token_id
            assert t.sep_token_id in ids
        assert enc["input_ids"][0][-1] == t.sep_token_id or enc["input_ids"][1][-1] == t.sep_token_id
        ru = "Москва — столица России."
        assert t.decode(t(ru)["input_ids"], skip_special_tokens=True) == ru


@pytest.mark.parametrize("text", ["The quick brown fox jumps over the lazy dog.", "Я люблю читать книги по вечерам.",
                                  "मुझे किताबें पढ़ना पसंद है।", "أحب قراءة الكتب في المساء.", "我们今天去公园散步。",
                                  "Unseen: ǅemal, ﬁne → fine? 1½ ≠ 2; emoji 🦄!"])
def test_byte_level_bpe_roundtrip(trained, text):
    import unicodedata
    tok = load_tokenizer(trained["bpe"][0])
    x = " ".join(unicodedata.normalize("NFKC", text).split())
    enc = tok.encode(x)
    assert tok.token_to_id("<unk>") not in enc.ids
    assert tok.decode(enc.ids) == x


def test_vocab_too_small_for_the_alphabet(corpus, tmp_path):
    with pytest.raises(TokenizerError, match=r"tokenizer.vocab_size=200 is smaller than the alphabet \(\d+ characters\)"
                                             r".* plus 5 special tokens"):
        run_tokenizer(config(SENTENCES, algorithm="wordpiece", vocab_size=200), {"normalize": corpus}, tmp_path)
    with pytest.raises(TokenizerError, match=r"vocab_size=256 is smaller than the alphabet \(256 characters\)"):
        run_tokenizer(config(SENTENCES, algorithm="bpe", vocab_size=256), {"normalize": corpus}, tmp_path)


def test_vocab_much_smaller_than_requested_fails(corpus, tmp_path):
    with pytest.raises(TokenizerError, match=r"fewer than tokenizer.min_vocab_fraction=0.9 x vocab_size=20000"):
        run_tokenizer(config(SENTENCES, algorithm="wordpiece", vocab_size=20000, min_vocab_fraction=0.9),
                      {"normalize": corpus}, tmp_path)


@pytest.mark.parametrize("algo", list(STYLES))
def test_per_language_stats(trained, algo):
    d, m = trained[algo]
    langs = m["languages"]
    assert set(langs) == set(SENTENCES)
    for lang, s in langs.items():
        assert s["heldout_docs"] == 20 and s["words"] > 0 and s["chars"] > s["words"] and s["tokens"] > 0
        assert 0.05 < s["tokens_per_char"] < 2
        assert s["tokens_per_word"] == pytest.approx(s["tokens"] / s["words"])
        assert 0 <= s["unk_rate"] <= 1
        assert s["no_spaces"] == (lang == "zh")
        if algo == "bpe":
            assert s["unk_rate"] == 0
    if algo != "unigram":  # (HF's Unigram trainer keeps few pieces on tiny repetitive corpora: no bound for it)
        assert 1 <= langs["en"]["tokens_per_word"] < 2.5  # seen sentences, recombined: mostly whole words
    table = pq.read_table(d / "stats.parquet").to_pylist()
    assert {r["lang"] for r in table} == set(SENTENCES)
    for r in table:
        assert r["tokens"] == langs[r["lang"]]["tokens"]
        # limits are thresholds: applied by the contract from the config in force, never stored with the output
        assert "max_fertility" not in r and "max_unk_rate" not in r
    assert "limits" not in m
    scripts = m["vocab_scripts"]
    assert sum(scripts.values()) == pytest.approx(1.0)
    for s in ("Latin", "Cyrillic", "Devanagari", "Arabic", "Han"):
        assert scripts.get(s, 0) > 0, (s, scripts)
    vs = pq.read_table(d / "vocab_scripts.parquet").to_pylist()
    assert sum(r["tokens"] for r in vs) == m["vocab_size"] - 5


def test_fertility_limits_per_language(corpus, tmp_path):
    m = run_tokenizer(config(SENTENCES, algorithm="bpe", vocab_size=300, max_fertility_per_lang={"zh": 8.0},
                             max_unk_rate=0.0), {"normalize": corpus}, tmp_path)
    from tasks.validation.contracts import tokenizer_tables
    manifest = {**m, "config": {"tokenizer": {"max_fertility": 4.0, "max_fertility_per_lang": {"zh": 8.0},
                                              "max_unk_rate": 0.0, "min_vocab_fraction": 0.5, "vocab_size": 300}}}
    stats = tokenizer_tables(tmp_path, {"manifest": manifest})["stats"]
    rows = {r["lang"]: r for r in stats.to_dict("records")}
    assert rows["zh"]["max_fertility"] == 8.0 and rows["en"]["max_fertility"] == 4.0
    assert rows["hi"]["max_unk_rate"] == 0.0
    # a 300-token byte-level vocabulary fragments Devanagari: reported, not failed (the data contract decides)
    assert m["languages"]["hi"]["tokens_per_word"] > 4.0


def test_script_helpers():
    assert [char_script(c) for c in "aЖक我あア한ب1,"] == [
        "Latin", "Cyrillic", "Devanagari", "Han", "Hiragana", "Katakana", "Hangul", "Arabic", "Common", "Common"]
    assert dominant_script("##ing") == "Latin" and dominant_script("▁मुझे") == "Devanagari"
    assert dominant_script("12") == "Common"
    assert token_text("ĠÐŁ", "bpe") == " П" and token_text("à¤", "bpe") is None
    assert token_text("##ab", "wordpiece") == "ab" and token_text("▁ab", "unigram") == " ab"


def test_balanced_sample(tmp_path):
    big = make_docs(SENTENCES["en"], 1000, 4)
    small = make_docs(SENTENCES["fr"], 100, 3)
    art = write_normalize(tmp_path, {"en": big, "fr": small})
    chars = {lang: v["chars"] for lang, v in art.manifest["languages"].items()}
    nbytes = {lang: v["bytes"] for lang, v in art.manifest["languages"].items()}
    assert 8 < nbytes["en"] / nbytes["fr"] < 14
    natural_fr = nbytes["fr"] / sum(nbytes.values())

    s = train_sample(tmp_path, chars, 0.3, 0.05, 10, seed=3, byte_counts=nbytes)
    texts, heldout = s                                           # unpacks as (texts, heldout)
    share_fr = s.per_lang_bytes["fr"] / s.bytes
    assert share_fr > 3 * natural_fr and share_fr == pytest.approx(s.weights["fr"], abs=0.06)
    assert s.repeats["fr"] > 1.1 and s.repeats["en"] == pytest.approx(1.0)
    assert s.bytes <= 0.05e6 * 1.1
    assert {lang: len(h) for lang, h in heldout.items()} == {"en": 10, "fr": 10}
    assert not (set(heldout["fr"]) | set(heldout["en"])) & set(texts)   # held-out docs never trained on

    again = train_sample(tmp_path, chars, 0.3, 0.05, 10, seed=3)           # byte counts read from the files
    assert again.texts == texts and again.heldout == heldout
    other = train_sample(tmp_path, chars, 0.3, 0.05, 10, seed=4, byte_counts=nbytes)
    assert other.heldout != heldout

    natural = train_sample(tmp_path, chars, 1.0, 0.05, 10, seed=3, byte_counts=nbytes)
    assert natural.per_lang_bytes["fr"] / natural.bytes < share_fr / 2


def _slow_prefix(hashes):
    """The per-document parse the vectorized one replaced, written out here: int(h[:16], 16)."""
    return np.array([int(h[:16], 16) for h in hashes.to_pylist()], dtype=np.uint64)


def test_hash_prefix_equals_the_per_document_parse():
    """hash_prefix64 decodes the leading 16 hex digits of each md5 from the Arrow buffer; on the md5s of the real
    text of ../shared/data/text (and slices, chunks, large_string, upper case) it equals int(h[:16], 16)."""
    from mlm_core.tokenizer.sample import hash_prefix64
    data = Path(__file__).resolve().parents[2] / "shared" / "data" / "text"
    lines = [ln for f in sorted(data.glob("??.txt")) for ln in f.read_text(encoding="utf-8").splitlines() if ln]
    assert len(lines) > 10_000, f"the real text in {data} is missing"
    col = pa.array([hashlib.md5(t.encode()).hexdigest() for t in lines])
    assert np.array_equal(hash_prefix64(col), _slow_prefix(col))
    for arr in (col.slice(1234, 777), pa.chunked_array([col.slice(0, 5), col.slice(5, 90)]),
                col.cast(pa.large_string()), pa.array([h.upper() for h in col.to_pylist()[:50]]),
                pa.array(["0" * 16, "f" * 32, "ffffffffffffffff0"])):
        flat = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
        assert np.array_equal(hash_prefix64(arr), _slow_prefix(flat))
    assert hash_prefix64(pa.array([], pa.string())).shape == (0,)
    with pytest.raises(ValueError):                    # not hex: the per-document path raises, as it always did
        hash_prefix64(pa.array(["z" * 32]))


def test_sample_is_unchanged_by_the_vectorized_hash_parse(tmp_path, monkeypatch):
    """The sample drawn with the vectorized parse is the one the per-document parse draws (same texts, in the
    same order, same held-out documents): the tokenizer, and so every fingerprint downstream, is unchanged."""
    from mlm_core.tokenizer import sample as sample_mod
    art = write_normalize(tmp_path, {"en": make_docs(SENTENCES["en"], 1000, 4),
                                     "fr": make_docs(SENTENCES["fr"], 100, 3)})
    chars = {lang: v["chars"] for lang, v in art.manifest["languages"].items()}
    fast = train_sample(tmp_path, chars, 0.3, 0.05, 10, seed=3)
    monkeypatch.setattr(sample_mod, "hash_prefix64", _slow_prefix)
    slow = train_sample(tmp_path, chars, 0.3, 0.05, 10, seed=3)
    assert fast.texts == slow.texts and fast.heldout == slow.heldout and fast.summary() == slow.summary()


def test_repeats_are_capped(tmp_path):
    art = write_normalize(tmp_path, {"en": make_docs(SENTENCES["en"], 1600, 4), "zh": make_docs(SENTENCES["zh"], 6, 1)})
    chars = {lang: v["chars"] for lang, v in art.manifest["languages"].items()}
    s = train_sample(tmp_path, chars, 0.1, 1.0, 2, seed=0)
    assert s.heldout["zh"] and len(s.heldout["zh"]) == 2
    assert s.repeats["zh"] <= 10.0 and s.per_lang_docs["zh"] <= 4 * 10


def test_load_tokenizer_verifies_the_checksum(corpus, tmp_path):
    lc = config(SENTENCES, algorithm="bpe", vocab_size=400)
    art = StageStore(tmp_path).write("tokenizer", "abc", lambda out: run_tokenizer(lc, {"normalize": corpus}, out), {})
    assert art.manifest["vocab_size"] <= 400 and "tokenizer.json" in art.manifest["files"]
    assert load_tokenizer(art).get_vocab_size() == art.manifest["vocab_size"]
    assert load_tokenizer(art.path).get_vocab_size() == art.manifest["vocab_size"]
    f = art.path / "tokenizer.json"
    data = json.loads(f.read_text(encoding="utf-8"))
    data["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    f.write_text(json.dumps(data), encoding="utf-8")
    for arg in (art, art.path, f):
        with pytest.raises(TokenizerMismatch, match="tokenizer.json: sha256 .* does not match the manifest"):
            load_tokenizer(arg)
    with pytest.raises(TokenizerError, match="not found"):
        load_tokenizer(tmp_path / "nowhere")


def test_missing_language_in_upstream(corpus, tmp_path):
    with pytest.raises(TokenizerError, match="no language.* de"):
        run_tokenizer(config([*SENTENCES, "de"]), {"normalize": corpus}, tmp_path)
