"""The shards stage and its reader: row layout, word starts, split, integrity checks, zero-copy, HF interop."""
from __future__ import annotations

import bisect
import hashlib
import logging
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from mlm_core.config.io import load_config
from mlm_core.errors import StageError
from mlm_core.shards import ShardDataset, ShardIntegrityError, as_hf_dataset, run_shards
from mlm_core.shards import reader as reader_mod
from mlm_core.shards.reader import gather_rows
from mlm_core.artifacts import StageArtifact, parse
from mlm_core.store import MANIFEST, file_table, write_json_atomic

SENTENCES = {
    "en": ["The quick brown fox jumps over the lazy dog.", "Unbelievably, the photographers disappeared yesterday.",
           "My grandmother bakes extraordinary strawberry cakes.", "Is the library open on Sundays?",
           "Internationalization requires careful engineering."],
    "fr": ["Le café était très chaud ce matin.", "Les enfants jouent dans le jardin après l'école.",
           "Où se trouve la bibliothèque municipale ?", "Nous avons mangé des crêpes délicieuses.",
           "L'anticonstitutionnalité de la loi fut débattue."],
    "ru": ["Москва — столица России.", "Сегодня очень холодная погода.", "Я читаю интересную книгу по вечерам.",
           "Достопримечательности города впечатляют туристов.", "Где находится ближайшая станция метро?"],
    "ar": ["القطة تنام على الكرسي.", "ذهبنا إلى السوق يوم الجمعة.", "المكتبة مفتوحة كل يوم.",
           "يحب الأطفال اللعب في الحديقة.", "هل تتكلم العربية؟"],
    "hi": ["मैं आज बाज़ार जा रहा हूँ।", "बच्चे पार्क में खेल रहे हैं।", "यह किताब बहुत दिलचस्प है।",
           "दिल्ली भारत की राजधानी है।", "क्या आप चाय पीना चाहेंगे?"],
    "zh": ["我们今天去公园散步。", "这本书非常有意思。", "北京是中国的首都。", "孩子们在花园里玩耍。", "你喜欢喝茶吗？"],
}
LANGS = sorted(SENTENCES)
BERT = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def make_docs(lang: str, n: int = 40) -> list[str]:
    rng = random.Random(lang)
    sep = "" if lang == "zh" else " "
    docs = []
    for i in range(n):
        k = 12 if i % 9 == 0 else rng.randint(1, 3)        # every 9th document is long (spans rows)
        docs.append(sep.join(rng.choice(SENTENCES[lang]) for _ in range(k)) + f"{sep}{i}")
    return docs


def all_docs() -> dict[str, list[str]]:
    return {lang: make_docs(lang) for lang in LANGS}


def train_tokenizer(kind: str) -> Tokenizer:
    texts = [d for docs in all_docs().values() for d in docs]
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\p{Han}"), behavior="isolated"), pre_tokenizers.BertPreTokenizer()])
        trainer = trainers.WordPieceTrainer(vocab_size=400, min_frequency=2, special_tokens=BERT,
                                            continuing_subword_prefix="##", show_progress=False)
    else:
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        trainer = trainers.BpeTrainer(vocab_size=400, min_frequency=2, special_tokens=ROBERTA,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.enable_truncation(max_length=16)        # a saved tokenizer.json may carry these: the stage must undo them
    return tok


def tokenizer_artifact(root: Path, kind: str) -> StageArtifact:
    tok = train_tokenizer(kind)
    d = root / f"tok-{kind}"
    d.mkdir(parents=True)
    tok.save(str(d / "tokenizer.json"))
    specials = BERT if kind == "wordpiece" else ROBERTA
    roles = (["pad", "unk", "cls", "sep", "mask"] if kind == "wordpiece" else ["cls", "pad", "sep", "unk", "mask"])
    manifest = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "algorithm": kind,
                "special_tokens": {r: {"token": t, "id": i} for i, (r, t) in enumerate(zip(roles, specials))}}
    return parse("tokenizer", d, manifest, f"tok{kind}", strict=False)


def normalize_artifact(root: Path, docs: dict[str, list[str]]) -> StageArtifact:
    d = root / "normalize"
    (d / "docs").mkdir(parents=True)
    for lang, texts in docs.items():
        tbl = pa.table({"doc_id": pa.array(range(len(texts)), pa.int64()), "lang": pa.array([lang] * len(texts)),
                        "text": pa.array(texts, pa.string()), "n_chars": pa.array([len(t) for t in texts], pa.int32()),
                        "hash": pa.array([hashlib.md5(t.encode()).hexdigest() for t in texts], pa.string())})
        pq.write_table(tbl, d / "docs" / f"{lang}.parquet")
    return parse("normalize", d, {"languages": {k: {"docs": len(v)} for k, v in docs.items()}}, "normfp", strict=False)


def config(root: Path, langs, **shards):
    src = root / "unused.txt"
    src.write_text("x\n")
    return load_config(raw={"sources": {lang: {"paths": [str(src)]} for lang in langs},
                            "shards": {"seq_len": 32, "rows_per_shard": 7, "workers": 1, "validation_fraction": 0.2,
                                       **shards}})


def build(root: Path, kind: str = "wordpiece", docs=None, tok_art: StageArtifact | None = None,
          **shards) -> tuple[Path, dict, Artifact]:
    docs = docs if docs is not None else all_docs()
    root.mkdir(parents=True, exist_ok=True)
    tok_art = tok_art or tokenizer_artifact(root, kind)
    norm = normalize_artifact(root, docs)
    out = root / "shards"
    out.mkdir()
    manifest = run_shards(config(root, list(docs), **shards), {"normalize": norm, "tokenizer": tok_art}, out)
    # the file table as StageStore.write records it (readers verify every file against it)
    write_json_atomic(out / MANIFEST, {**manifest, "fingerprint": "shardfp", "files": file_table(out)})
    return out, manifest, tok_art


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return {kind: build(tmp_path_factory.mktemp(kind), kind) for kind in ("wordpiece", "bpe")}


def read_rows(out: Path, rel: str) -> dict[str, np.ndarray]:
    """The stored columns of one file, as they are on disk."""
    with pa.memory_map(str(out / rel)) as src:
        batch = ipc.open_stream(src).read_next_batch()
        return {c: batch.column(c).values.to_numpy().reshape(len(batch), -1).copy() for c in batch.schema.names}


def unfold(stored: dict[str, np.ndarray], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, word starts) from format v3's stored columns, decoded here independently of the reader: the flag is
    the top bit of the id type when there is no ``word_start_bits`` column, else those bits, LSB first."""
    tokens = stored["tokens"]
    top = 8 * tokens.dtype.itemsize - 1
    if "word_start_bits" not in stored:
        return tokens & ((1 << top) - 1), (tokens >> top).astype(np.uint8)
    bits = stored["word_start_bits"]
    ws = np.array([[(bits[r, j // 8] >> (j % 8)) & 1 for j in range(seq_len)] for r in range(len(bits))], np.uint8)
    return tokens, ws


def doc_segments(enc, n_rows: int, width: int) -> np.ndarray:
    """Expected segment ids of the content positions (rows x width), from the documents' lengths: the j-th
    document of a row (counting the one it continues) is segment j, its [SEP] included; padding 0."""
    doc = np.full(n_rows * width, -1)
    stream = np.concatenate([np.full(len(e.ids) + 1, i) for i, e in enumerate(enc)])
    doc[:len(stream)] = stream
    doc = doc.reshape(n_rows, width)
    return np.where(doc >= 0, doc - doc[:, :1] + 1, 0)


def split_of(text: str, fraction: float = 0.2) -> str:
    return "validation" if int(hashlib.md5(text.encode()).hexdigest()[:8], 16) / 2**32 < fraction else "train"


# ------------------------------------------------------------------------------------------------ layout
@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_rows_are_packed_documents(built, kind):
    out, m, tok_art = built[kind]
    sp = {r: e["id"] for r, e in tok_art.manifest["special_tokens"].items()}
    tok = Tokenizer.from_file(str(tok_art.path / "tokenizer.json"))
    tok.no_truncation()
    docs = all_docs()
    assert m["seq_len"] == 32 and m["dtype"] == "uint16" and m["vocab_size"] == tok.get_vocab_size()
    assert m["tokenizer_fingerprint"] == tok_art.fingerprint
    for split in ("train", "validation"):
        for lang in LANGS:
            files = sorted(s["file"] for s in m["shards"] if s["split"] == split and s["lang"] == lang)
            assert files and all(f.startswith(f"{split}/{lang}-") for f in files)
            rows = [read_rows(out, f) for f in files]
            assert all(set(r) == {"tokens"} for r in rows)       # a small vocabulary: flags folded into the ids
            assert all(len(r["tokens"]) <= 7 for r in rows) and all(len(r["tokens"]) == 7 for r in rows[:-1])
            assert all(r["tokens"].dtype == np.uint16 for r in rows)
            ids, ws = unfold({"tokens": np.concatenate([r["tokens"] for r in rows])}, 32)
            with ShardDataset(out) as ds:                      # the reader decodes the same, and rebuilds segments
                assert (np.asarray(ds.input_ids(split, lang)) == ids).all()
                assert (np.asarray(ds.word_start(split, lang)) == ws).all()
                seg = np.asarray(ds.segment_ids(split, lang))
                # the running [SEP] count: torch (used when imported) and numpy give the same
                assert all((ds.layout._segments(ids, use_torch=t) == seg).all() for t in (True, False))
            assert seg.dtype == np.uint8
            assert ids.shape[1] == 32 and (ids < m["vocab_size"]).all()
            assert (ids[:, 0] == sp["cls"]).all() and (seg[:, 0] == 1).all() and (ws[:, 0] == 0).all()
            # padding only at the end of the last row, with segment 0
            pad = ids == sp["pad"]
            assert not pad[:-1].any() and ((seg == 0) == pad).all()
            # the content of the rows is exactly this language's documents of this split, each ending in [SEP]
            expected = [d for d in docs[lang] if split_of(d) == split]
            enc = tok.encode_batch(expected, add_special_tokens=False)
            stream = np.concatenate([np.r_[e.ids, sp["sep"]] for e in enc])
            content = ids[:, 1:].reshape(-1)
            assert (content[:len(stream)] == stream).all() and (content[len(stream):] == sp["pad"]).all()
            assert sum(s["tokens"] for s in m["shards"] if s["file"] in files) == len(stream) + len(ids)
            # segment ids: one per document, counted from 1 in each row (format v2 stored these)
            assert (doc_segments(enc, len(ids), 31) == seg[:, 1:]).all() and seg[:, 1:].max() >= 2
            check_word_starts(tok, kind, expected, enc, ids, ws, sp, lang)


def check_word_starts(tok, kind, texts, enc, ids, ws, sp, lang):
    """Space-delimited text: a token belongs to the pre-token whose span holds its start offset; WordPiece
    checks this against the "##" prefix, independent of the pre-tokenizer. Chinese word starts come from ICU,
    and Hindi words keep their vowel signs (the byte-level pre-tokenizer splits at them), not from the
    pre-tokenizer: tests/test_words.py checks both against segmentations made outside the code."""
    if lang == "zh" or (lang == "hi" and kind == "bpe"):
        return
    exp = []
    for text, e in zip(texts, enc):
        starts = [a for _, (a, _) in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text))]
        word_of = [bisect.bisect_right(starts, a) - 1 for a, _ in e.offsets]
        exp.append(np.r_[1, np.diff(word_of) != 0].astype(np.uint8))
        if kind == "wordpiece":
            assert exp[-1].tolist() == [0 if t.startswith("##") else 1 for t in e.tokens]
    exp_stream = np.concatenate([np.r_[x, 0] for x in exp])          # 0 for each document's [SEP]
    width = ids.shape[1] - 1
    got = ws[:, 1:].reshape(-1)[:len(exp_stream)]
    not_row_first = np.arange(len(exp_stream)) % width != 0
    assert (got[not_row_first] == exp_stream[not_row_first]).all()
    # the first token of every row is a start (a continued word gets its own group), unless it is a [SEP]
    assert (ws[:, 1] == ((ids[:, 1] != sp["sep"]) & (ids[:, 1] != sp["pad"]))).all()
    # words really are split into several tokens here, and each such word has exactly one start
    multi = sum(int((np.diff(np.flatnonzero(np.r_[x, 1])) >= 2).sum()) for x in exp)
    assert multi >= 3


# ------------------------------------------------------------------------------------------------ split
def test_split_is_deterministic_and_every_language_has_both(built, tmp_path):
    out, m, tok_art = built["wordpiece"]       # (tokenizer training itself is not deterministic: reuse it)
    out2, m2, _ = build(tmp_path / "again", "wordpiece", tok_art=tok_art)
    assert [(s["file"], s["sha256"]) for s in m["shards"]] == [(s["file"], s["sha256"]) for s in m2["shards"]]
    docs = all_docs()
    for lang in LANGS:
        n_val = sum(split_of(d) == "validation" for d in docs[lang])
        assert m["languages"][lang]["docs_validation"] == n_val > 0
        assert m["languages"][lang]["docs_train"] == len(docs[lang]) - n_val
        assert m["languages"][lang]["rows_train"] > 0 and m["languages"][lang]["rows_validation"] > 0


def test_at_least_one_validation_doc_is_the_smallest_hash(tmp_path):
    docs = {lang: make_docs(lang, 6) for lang in ("en", "zh")}
    out, m, _ = build(tmp_path, "wordpiece", docs=docs, validation_fraction=0.001)
    for lang, texts in docs.items():
        assert m["languages"][lang]["docs_validation"] == 1
        smallest = min(texts, key=lambda t: hashlib.md5(t.encode()).hexdigest())
        ds = ShardDataset(out)
        row = ds.input_ids("validation", lang)[0]
        tok = Tokenizer.from_file(str(tmp_path / "tok-wordpiece" / "tokenizer.json"))
        tok.no_truncation()
        ids = tok.encode(smallest, add_special_tokens=False).ids
        assert row[1:1 + min(len(ids), 31)].tolist() == ids[:31]


def test_min_validation_tokens_tops_up_a_small_language_in_hash_order(built, tmp_path):
    """Documents join validation in md5 order (the fraction's first) until it holds min_validation_tokens
    content tokens, counted here by encoding the documents independently; at most half the documents."""
    _, _, tok_art = built["wordpiece"]
    docs = {"en": make_docs("en", 40), "zh": make_docs("zh", 40)}
    tok = Tokenizer.from_file(str(tok_art.path / "tokenizer.json"))
    tok.no_truncation()
    need = 150
    out, m, _ = build(tmp_path / "a", "wordpiece", docs=docs, tok_art=tok_art, validation_fraction=0.05,
                      min_validation_tokens=need)
    for lang, texts in docs.items():
        by_hash = sorted(texts, key=lambda t: hashlib.md5(t.encode()).hexdigest())
        lens = [len(tok.encode(t, add_special_tokens=False).ids) for t in by_hash]
        k = next(i + 1 for i in range(len(lens)) if sum(lens[:i + 1]) >= need)     # smallest hash-order prefix
        k = max(k, sum(split_of(t, 0.05) == "validation" for t in texts), 1)
        assert m["validation_docs"][lang] == m["languages"][lang]["docs_validation"] == k > 1
        assert m["languages"][lang]["content_tokens_validation"] == sum(lens[:k]) >= need
        with ShardDataset(out) as ds:     # the rows hold exactly those documents' tokens
            ids = np.asarray(ds.input_ids("validation", lang))
            sp = [e["id"] for e in tok_art.manifest["special_tokens"].values()]
            assert int((~np.isin(ids, sp)).sum()) == sum(lens[:k])
    # more than half of a language's tokens: capped at half its documents, with a warning
    _, capped, _ = build(tmp_path / "b", "wordpiece", docs=docs, tok_art=tok_art, min_validation_tokens=10**6)
    assert capped["validation_docs"] == {"en": 20, "zh": 20}
    # off (the default): the fraction rule alone
    _, off, _ = build(tmp_path / "c", "wordpiece", docs=docs, tok_art=tok_art, validation_fraction=0.05)
    assert off["validation_docs"]["zh"] == max(1, sum(split_of(t, 0.05) == "validation" for t in docs["zh"]))


def test_worker_processes_write_the_same_shards(built, tmp_path):
    _, m, tok_art = built["bpe"]
    _, m2, _ = build(tmp_path, "bpe", tok_art=tok_art, workers=3, batch_docs=7)     # 3 worker processes
    assert [(s["file"], s["sha256"]) for s in m["shards"]] == [(s["file"], s["sha256"]) for s in m2["shards"]]


# ------------------------------------------------------------------------------------------------ manifest
def test_manifest_and_tables(built):
    import duckdb
    out, m, _ = built["bpe"]
    assert m["dropped_languages"] == [] and m["special_tokens"]["cls"]["id"] == 0 and m["dtype"] == "uint16"
    assert m["counts"]["docs"] == sum(len(v) for v in all_docs().values())
    assert m["counts"]["rows"] == sum(s["rows"] for s in m["shards"])
    for s in m["shards"]:
        assert (out / s["file"]).stat().st_size == s["bytes"]
    table = {r["lang"]: r for r in m["sampling"]["table"]}
    assert set(table) == set(LANGS) and abs(sum(r["p"] for r in table.values()) - 1) < 1e-9
    assert all(table[lang]["n"] == m["languages"][lang]["tokens_train"] for lang in LANGS)
    con = duckdb.connect()
    got = con.sql(f"SELECT lang, p FROM read_parquet('{out / 'sampling.parquet'}') ORDER BY lang").fetchall()
    assert [g[0] for g in got] == LANGS and abs(sum(g[1] for g in got) - 1) < 1e-9
    rows = con.sql(f"SELECT sum(rows_train + rows_validation) FROM read_parquet('{out / 'stats.parquet'}')").fetchall()
    assert rows[0][0] == m["counts"]["rows"]


# ------------------------------------------------------------------------------------------------ empty language
def test_empty_language_errors_by_default(tmp_path):
    docs = {"en": make_docs("en", 8), "fr": []}
    with pytest.raises(StageError, match="'fr'.*no documents"):
        build(tmp_path, "wordpiece", docs=docs)


def test_empty_language_dropped_with_a_warning(tmp_path, caplog):
    docs = {"en": make_docs("en", 8), "fr": []}
    with caplog.at_level(logging.WARNING, logger="mlm_core.shards.build"):
        out, m, _ = build(tmp_path, "wordpiece", docs=docs, empty_language="drop")
    assert "'fr'" in caplog.text and "dropped" in caplog.text
    assert m["dropped_languages"] == ["fr"] and "fr" not in m["languages"]
    assert [r["lang"] for r in m["sampling"]["table"]] == ["en"]
    assert not any(s["lang"] == "fr" for s in m["shards"])


# ------------------------------------------------------------------------------------------------ integrity
@pytest.fixture
def shard_copy(built, tmp_path, monkeypatch):
    """A private copy of the BPE shard set; reading any data (memory-mapping a shard) fails the test."""
    src, m, tok_art = built["bpe"]
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)

    def no_read(self, file):
        raise AssertionError(f"data read before verification: {file}")
    monkeypatch.setattr(reader_mod.ShardDataset, "_map", no_read)
    return dst, m


def _corrupt_check(path: Path, *patterns: str):
    with pytest.raises(ShardIntegrityError) as exc:
        ShardDataset(path, verify="every_open")
    for p in patterns:
        assert p in str(exc.value), str(exc.value)


def test_flipped_byte_is_a_checksum_mismatch(shard_copy):
    path, m = shard_copy
    f = m["shards"][3]["file"]
    data = bytearray((path / f).read_bytes())
    data[len(data) // 2] ^= 0x01
    (path / f).write_bytes(bytes(data))
    _corrupt_check(path, f, "sha256 mismatch")


def test_truncated_shard_is_a_size_mismatch(shard_copy):
    path, m = shard_copy
    f = m["shards"][-1]["file"]
    data = (path / f).read_bytes()
    (path / f).write_bytes(data[:-100])
    _corrupt_check(path, f, "size mismatch")


def test_missing_shard(shard_copy):
    path, m = shard_copy
    f = m["shards"][0]["file"]
    (path / f).unlink()
    _corrupt_check(path, f, "missing")


def test_extra_shard_not_in_manifest(shard_copy):
    path, m = shard_copy
    shutil.copy(path / m["shards"][0]["file"], path / "train" / "xx-00000.arrow")
    _corrupt_check(path, "train/xx-00000.arrow", "extra file")


def test_tokenizer_fingerprint_mismatch(shard_copy):
    path, m = shard_copy
    with pytest.raises(ShardIntegrityError, match="built with tokenizer tokbpe, expected other"):
        ShardDataset(path, verify="off", expect_tokenizer_fingerprint="other")


def test_verify_once_per_process(built, tmp_path):
    src, m, tok_art = built["bpe"]
    path = tmp_path / "once"
    shutil.copytree(src, path)
    ShardDataset(path, verify="once", expect_tokenizer_fingerprint=tok_art.fingerprint).close()
    f = path / m["shards"][0]["file"]
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))   # same size and mtime: "once" trusts its recorded hash
    ShardDataset(path, verify="once").close()          # already verified (.verified.json): not re-read
    with pytest.raises(ShardIntegrityError, match="sha256 mismatch"):
        ShardDataset(path, verify="every_open")


# ------------------------------------------------------------------------------------------------ reading
def test_open_and_view_is_zero_copy(built):
    out, m, _ = built["wordpiece"]
    ShardDataset(out, verify="every_open").close()      # verification reads files (not Arrow allocations) anyway
    before = pa.total_allocated_bytes()
    ds = ShardDataset(out, verify="once")
    views = [ds.stored(s, lang)["tokens"] for s in ("train", "validation") for lang in LANGS]
    total = sum(v.parts[0].sum(dtype=np.int64) for v in views)     # touch the data
    assert total > 0
    ds.get_batch("train", "fr", np.arange(5))                        # decoding copies into numpy, not Arrow
    assert pa.total_allocated_bytes() - before < 4096
    v = views[0].parts[0]
    assert not v.flags.writeable and not v.flags.owndata and v.shape[1] == 32
    ds.close()


# ------------------------------------------------------------------------------------------------ format v3
@pytest.mark.parametrize("vocab_size,stored,per_position", [
    (None, {"tokens": "uint16"}, 2.0),                                  # our 400-token vocabulary: folded
    (50265, {"tokens": "uint16", "word_start_bits": "uint8"}, 2.125),   # RoBERTa-sized: no spare bit, packed
    (250002, {"tokens": "uint32"}, 4.0),                                # XLM-R-sized: uint32, folded
])
def test_compact_layouts_read_back_the_same_rows(built, tmp_path, vocab_size, stored, per_position):
    """Whatever the vocabulary size, the reader returns the same input_ids / segment_ids / word_start
    (compared with the 400-token build and, for segments, with the documents), and the stored bytes per
    position are 2, 2 + 1/8 (seq_len 32 -> 4 bytes of flags per row) or 4."""
    ref_out, _, tok_art = built["bpe"]
    if vocab_size:     # the manifest's vocab_size picks the layout (the tokenizer itself stays small)
        tok_art = parse("tokenizer", tok_art.path, {**tok_art.manifest, "vocab_size": vocab_size}, tok_art.fingerprint,
                        strict=False)
    out, m, _ = build(tmp_path, "bpe", tok_art=tok_art)
    assert m["format_version"] == 3 and m["dtype"] == stored["tokens"]
    raw = read_rows(out, m["shards"][0]["file"])
    assert {c: a.dtype.name for c, a in raw.items()} == stored
    assert sum(a.nbytes for a in raw.values()) / raw["tokens"].size == per_position
    with ShardDataset(out) as ds, ShardDataset(ref_out) as ref:
        for split in ("train", "validation"):
            for lang in LANGS:
                n = len(ref.input_ids(split, lang))
                idx = np.r_[np.arange(n), n - 1, 0]
                a, b = ds.get_batch(split, lang, idx), ref.get_batch(split, lang, idx)
                assert all(a[k].dtype == b[k].dtype and (a[k] == b[k]).all() for k in a)
        first = m["shards"][0]
        ids, ws = unfold(raw, 32)           # decoded independently of the reader
        assert (ids == ds.input_ids(first["split"], first["lang"])[:len(ids)]).all()
        assert (ws == ds.word_start(first["split"], first["lang"])[:len(ids)]).all() and ws.any()


def test_old_format_is_read_and_a_newer_one_refused(built, tmp_path):
    """Format v2 (three stored columns, no format_version) reads as before; an unknown version is refused with
    the folder and the rebuild command."""
    import torch
    from mlm_core.shards.layout import Layout
    from mlm_core.shards.pack import write_rows
    src, m, _ = built["wordpiece"]
    old = tmp_path / "v2"
    old.mkdir()
    shards = []
    with ShardDataset(src) as ds:
        v2 = Layout(32, np.dtype(np.uint16), ds.layout.sep, ds.layout.pad, folded=False, version=2)
        for s in m["shards"]:
            sel = sorted(x["file"] for x in m["shards"] if (x["split"], x["lang"]) == (s["split"], s["lang"]))
            k = sel.index(s["file"])
            idx = np.arange(7 * k, 7 * k + s["rows"])
            ids, seg, ws = ds.columns(s["split"], s["lang"]).take(idx, np.uint16)
            write_rows(old / s["file"], v2, ids, ws.view(np.uint8))
            shards.append({**s, "bytes": (old / s["file"]).stat().st_size})
            assert set(read_rows(old, s["file"])) == {"input_ids", "segment_ids", "word_start"}
            assert (read_rows(old, s["file"])["segment_ids"] == seg).all()     # v2 stored what v3 rebuilds
    legacy = {k: v for k, v in m.items() if k not in ("format_version", "layout")}
    legacy["shards"] = shards
    write_json_atomic(old / MANIFEST, legacy)
    with ShardDataset(old, verify="off") as a, ShardDataset(src) as b:
        assert a.layout.version == 2
        for lang in LANGS:
            idx = np.arange(len(b.input_ids("train", lang)))
            x, y = a.get_batch("train", lang, idx), b.get_batch("train", lang, idx)
            assert all(torch.equal(x[k], y[k]) for k in x)
        # a batch mixing languages (what pretrain draws), gathered and decoded at once: row by row the same
        rng = np.random.default_rng(0)
        li = rng.integers(0, len(LANGS), 40)
        rows = np.array([rng.integers(len(b.input_ids("train", LANGS[i]))) for i in li])
        for ds in (a, b):
            ids, seg, ws = gather_rows([ds.columns("train", lg) for lg in LANGS], li, rows)
            for k, (i, r) in enumerate(zip(li, rows)):
                one = b.get("train", LANGS[i], int(r))
                assert (ids[k] == one["input_ids"].numpy()).all() and (seg[k] == one["segment_ids"].numpy()).all()
                assert (ws[k] == one["word_start"].numpy()).all()
    write_json_atomic(old / MANIFEST, {**legacy, "format_version": 9})
    with pytest.raises(ShardIntegrityError, match=rf"{old}.*format version 9.*--only shards --force"):
        ShardDataset(old, verify="off")


def test_a_special_id_inside_a_document_is_refused(tmp_path):
    """Segments are rebuilt from [SEP] ids: a tokenizer that encodes text to the [SEP] id must fail the stage."""
    root = tmp_path / "r"
    root.mkdir()
    tok_art = tokenizer_artifact(root, "wordpiece")
    sep = next(i for i, t in enumerate(BERT) if t == "[SEP]")
    some = Tokenizer.from_file(str(tok_art.path / "tokenizer.json")).token_to_id("the")
    sp = {**tok_art.manifest["special_tokens"], "sep": {"token": "the", "id": some}}   # "the" declared as [SEP]
    bad = parse("tokenizer", tok_art.path, {**tok_art.manifest, "special_tokens": sp}, "bad", strict=False)
    assert sep != some
    with pytest.raises(StageError, match=r"\[SEP\] or \[PAD\] id"):
        build(tmp_path / "b", "wordpiece", tok_art=bad)


def test_get_and_get_batch(built):
    import torch
    out, m, _ = built["wordpiece"]
    with ShardDataset(out) as ds:
        assert ds.rows_per_lang("train") == {lang: m["languages"][lang]["rows_train"] for lang in LANGS}
        n = len(ds.input_ids("train", "fr"))
        assert n > 7                                   # spans more than one shard file
        idx = np.array([n - 1, 0, 8, 3, 8])
        b = ds.get_batch("train", "fr", idx)
        assert b["input_ids"].dtype == torch.int64 and b["input_ids"].shape == (5, 32)
        assert b["segment_ids"].dtype == torch.uint8 and b["word_start"].dtype == torch.bool
        rows = ds.input_ids("train", "fr")
        for k, i in enumerate(idx):
            assert b["input_ids"][k].tolist() == rows[int(i)].tolist()
        one = ds.get("train", "fr", 8)
        assert one["input_ids"].shape == (32,) and torch.equal(one["input_ids"], b["input_ids"][2])
        assert abs(sum(ds.sampling_probs().values()) - 1) < 1e-9


def test_as_hf_dataset_is_memory_mapped(built):
    from datasets import Value
    out, m, _ = built["wordpiece"]
    before = pa.total_allocated_bytes()
    hf = as_hf_dataset(out, split="train")
    assert pa.total_allocated_bytes() - before < 4096
    assert hf.num_rows == sum(m["languages"][lang]["rows_train"] for lang in LANGS)
    assert hf.features["tokens"].feature == Value("uint16") and hf.features["tokens"].length == 32   # stored
    fr = as_hf_dataset(out, split="validation", lang="fr")
    with ShardDataset(out) as ds:                         # rows come out decoded
        assert fr[0]["input_ids"].tolist() == ds.input_ids("validation", "fr")[0].tolist()
        assert fr.num_rows == len(ds.input_ids("validation", "fr"))
        t = fr[0:2]
        assert t["input_ids"].shape == (2, 32)
        assert (t["segment_ids"] == ds.segment_ids("validation", "fr")[0:2]).all()
        assert (t["word_start"] == ds.word_start("validation", "fr")[0:2]).all()
