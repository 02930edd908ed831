"""tokenizer.from / tokenizer.extend: an existing tokenizer instead of a trained one (issue 11, item 1).

Base tokenizers are built here with the ``tokenizers`` library and saved with transformers'
``PreTrainedTokenizerFast.save_pretrained`` (no network), in the three layouts of real checkpoints:
BERT (WordPiece, [PAD]=0..[MASK]=4), RoBERTa (byte-level BPE, <s>=0 <pad>=1 </s>=2 <unk>=3, <mask> the LAST
id) and XLM-R (Unigram + Metaspace, <mask> the last id of the model's own list). Expected ids come from
transformers' AutoTokenizer on the same folder; expected fertility from the base, computed here.
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from mlm_core.config.io import load_config
from mlm_core.config.io import ConfigError
from mlm_core.external import TOKENIZER_FILES, ExternalRefError, content_hash
from mlm_core.tokenizer import TokenizerError, run_tokenizer
from mlm_core.tokenizer.stats import _byte_decoder
from test_tokenizer import SENTENCES, make_docs, write_normalize

LANGS = ["en", "fr", "ru", "hi"]
ROLES = ("pad", "unk", "cls", "sep", "mask")
# the bases know English well and see one sentence of each other language (their alphabet, not their words)
BASE_TEXTS = SENTENCES["en"] * 20 + [SENTENCES[lang][0] for lang in ("fr", "ru", "hi")]
ROBERTA_KW = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>", cls_token="<s>",
                  sep_token="</s>", mask_token="<mask>")


def _save(tok: Tokenizer, d: Path, **specials) -> Path:
    from transformers import PreTrainedTokenizerFast
    d.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, **specials).save_pretrained(str(d))
    return d


def bert_tokenizer(vocab_size: int = 300) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(BASE_TEXTS, trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tok


def save_bert(d: Path) -> Path:
    return _save(bert_tokenizer(), d, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                 mask_token="[MASK]")


def save_roberta(d: Path) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(BASE_TEXTS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.add_special_tokens(["<mask>"])                      # RoBERTa: <mask> is the last id
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), add_prefix_space=False)
    return _save(tok, d, **ROBERTA_KW)


def save_xlmr(d: Path) -> Path:
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator(BASE_TEXTS, trainers.UnigramTrainer(
        vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False))
    data = json.loads(tok.to_str())
    data["model"]["vocab"].append(["<mask>", 0.0])          # XLM-R: <mask> last, inside the model's list
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                       special_tokens=[("<s>", 0), ("</s>", 2)])
    _save(tok, d, **ROBERTA_KW)
    (d / "config.json").write_text(json.dumps({"model_type": "xlm-roberta"}), encoding="utf-8")
    return d


def save_bert_vocab_txt(d: Path) -> Path:
    """Only vocab.txt, as old BERT releases ship it (transformers' BertTokenizer: lowercasing by default)."""
    tok = bert_tokenizer()
    d.mkdir(parents=True)
    vocab = tok.get_vocab()
    (d / "vocab.txt").write_text("\n".join(sorted(vocab, key=vocab.get)) + "\n", encoding="utf-8")
    return d


def save_bert_vocab_cased(d: Path) -> Path:
    """vocab.txt + a tokenizer_config.json naming the class and do_lower_case: false (a cased BERT)."""
    save_bert_vocab_txt(d)
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": False}),
                                             encoding="utf-8")
    return d


def save_roberta_files(d: Path) -> Path:
    """vocab.json + merges.txt only, as older RoBERTa releases ship them."""
    tmp = save_roberta(d.with_name(d.name + "_src"))
    d.mkdir()
    Tokenizer.from_file(str(tmp / "tokenizer.json")).model.save(str(d))
    return d


def save_checkpoint(family: str):
    """A RoFormer / ModernBERT checkpoint folder as transformers saves it (tests/hf_tiny.py): config.json names the
    family; ModernBERT's byte-level BPE has its special tokens last ([UNK] [CLS] [SEP] [PAD] [MASK])."""
    def save(d: Path) -> Path:
        from hf_tiny import save_tiny
        return save_tiny(d, family, BASE_TEXTS, vocab_size=400)
    return save


BASES = {"bert": save_bert, "roberta": save_roberta, "xlmr": save_xlmr, "bert_vocab_txt": save_bert_vocab_txt,
         "bert_vocab_cased": save_bert_vocab_cased, "roberta_files": save_roberta_files,
         "roformer": save_checkpoint("roformer"), "modernbert": save_checkpoint("modernbert")}


def hf_tokenizer(folder: Path):
    """transformers' own reading of the folder (vocab.txt alone names no class: BertTokenizer, as
    AutoTokenizer picks for a BERT tokenizer_config)."""
    import transformers
    if (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file():
        return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    cls = transformers.RobertaTokenizer if (folder / "merges.txt").is_file() else transformers.BertTokenizer
    return cls.from_pretrained(str(folder), local_files_only=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_normalize(tmp_path_factory.mktemp("normalize"), {lang: make_docs(SENTENCES[lang], 100) for lang in LANGS})


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bases")
    return {name: fn(root / name) for name, fn in BASES.items()}


def config(tmp_path: Path, langs=LANGS, **tok):
    tok = {"heldout_docs": 20, "sample_mb": 1.0, "max_fertility": 50.0, **tok}
    return load_config(raw={"seed": 7, "workdir": str(tmp_path / "work"), "tokenizer": tok,
                            "sources": {lang: {"paths": [__file__]} for lang in langs}})


def run_from(tmp_path: Path, corpus, folder: Path, name: str = "out", **tok) -> tuple[Path, dict]:
    out = tmp_path / name
    out.mkdir()
    return out, run_tokenizer(config(tmp_path, **{"from": str(folder), **tok}), {"normalize": corpus}, out)


TEXTS = ["The quick brown fox jumps over the lazy dog.", "Le café était très chaud ce matin.",
         "Я люблю читать книги по вечерам.", "मुझे किताबें पढ़ना पसंद है।", "Unseen words: zebra, quixotic!"]


@pytest.mark.parametrize("name", list(BASES))
def test_from_folder_keeps_the_base_ids_and_specials(bases, corpus, tmp_path, name):
    folder = bases[name]
    out, m = run_from(tmp_path, corpus, folder)
    hf = hf_tokenizer(folder)
    assert m["source"]["files"] == "tokenizer.json" if (folder / "tokenizer.json").is_file() else "converted" in m["source"]["files"]
    for role in ROLES:
        token = getattr(hf, f"{role}_token")
        assert m["special_tokens"][role] == {"token": token, "id": hf.convert_tokens_to_ids(token)}, role
    ours = Tokenizer.from_file(str(out / "tokenizer.json"))
    for text in TEXTS:   # the same ids, framing included, as transformers' tokenizer of the same folder
        assert ours.encode(text).ids == hf(text)["input_ids"], text
    assert m["vocab_size"] == m["vocab_size_requested"] == len(hf) == ours.get_vocab_size()
    assert {t: i for t, i in ours.get_vocab().items()} == hf.get_vocab()
    assert m["source"]["ref"] == str(folder)
    assert m["source"]["content_hash"] == content_hash(folder, None, TOKENIZER_FILES)
    assert "extension" not in m and not (out / "extension.parquet").exists()
    stats = pq.read_table(out / "stats.parquet").to_pylist()
    assert {r["lang"] for r in stats} == set(LANGS) and all(r["tokens"] > 0 for r in stats)
    # the manifest keys a trained tokenizer has (shards / pretrain / evaluate / model card read them)
    assert {"algorithm", "style", "lowercase", "sample", "languages", "vocab_scripts", "counts"} <= set(m)
    if name in ("roberta", "xlmr", "roberta_files"):
        assert m["special_tokens"]["mask"]["id"] == m["vocab_size"] - 1 and m["style"] == "roberta"
    if name == "xlmr":
        assert m["source"]["family"] == "xlm-roberta" and m["algorithm"] == "unigram"
    if name.startswith("bert_vocab"):        # transformers' default for a bare vocab.txt lowercases; the config says not to
        assert m["lowercase"] == (name == "bert_vocab_txt") and "vocab.txt" in m["source"]["files"]
    if name == "roberta_files":
        assert m["algorithm"] == "bpe" and "merges.txt" in m["source"]["files"]
    if name in ("roformer", "modernbert"):
        assert m["source"]["family"] == name
    if name == "modernbert":                 # the special tokens kept at the end of the vocabulary, [PAD] included
        assert m["special_tokens"]["mask"]["id"] == m["vocab_size"] - 1 and m["special_tokens"]["pad"]["id"] > 0


def _whole_text(token: str, kind: str) -> str | None:
    """The text a word-initial token stands for (None: inside a word, or part of a UTF-8 character)."""
    if kind == "bpe":
        if not token.startswith("Ġ"):
            return None
        try:
            return bytes(_byte_decoder()[c] for c in token).decode("utf-8")
        except UnicodeDecodeError:
            return None
    if kind == "unigram":
        return token[1:] if token.startswith("▁") and len(token) > 1 else None
    return None if token.startswith("##") else token


def _fertility(encode, docs: list[str]) -> float:
    return sum(len(encode(d)) for d in docs) / sum(len(d.split()) for d in docs)


@pytest.mark.parametrize("name,kind", [("roberta", "bpe"), ("bert", "wordpiece"), ("xlmr", "unigram")])
def test_extend(bases, corpus, tmp_path, name, kind):
    folder, n = bases[name], 60
    base_out, base_m = run_from(tmp_path, corpus, folder, "base")
    out, m = run_from(tmp_path, corpus, folder, "ext", extend=n)
    hf = hf_tokenizer(folder)
    size = len(hf)
    assert m["algorithm"] == kind and m["extension"]["base_vocab_size"] == size
    added = m["extension"]["added"]
    assert 0 < added <= n and m["vocab_size"] == size + added and m["vocab_size_requested"] == size + n
    ext = Tokenizer.from_file(str(out / "tokenizer.json"))
    # every old id keeps its meaning (specials included); the new ids follow them
    vocab = ext.get_vocab()
    assert all(vocab[t] == i for t, i in hf.get_vocab().items())
    assert m["special_tokens"] == base_m["special_tokens"]
    table = pq.read_table(out / "extension.parquet")
    assert table.schema.field("id").type == pa.int64() and table.schema.field("pieces").type.value_type == pa.int64()
    rows = table.to_pylist()
    assert [r["id"] for r in rows] == list(range(size, size + added))
    assert all(ext.id_to_token(r["id"]) == r["token"] and r["token"] not in hf.get_vocab() for r in rows)

    # pieces = what the base tokenizer makes of the same text (transformers' tokenizer of the base folder)
    for r in rows:
        tok = r["token"]
        assert r["pieces"] and all(0 <= p < size for p in r["pieces"]), r
        text = _whole_text(tok, kind)
        if text is not None:                  # a word-initial token: its text encoded on its own
            assert hf(text, add_special_tokens=False)["input_ids"] == r["pieces"], r
        elif kind == "wordpiece":             # "##xyz": the base's continuation pieces, spelling it out
            pieces = hf.convert_ids_to_tokens(r["pieces"])
            if pieces == [hf.unk_token]:      # WordPiece: a word part it cannot spell is one UNK
                assert any("##" + c not in hf.get_vocab() for c in tok[2:]), r
                continue
            assert all(p.startswith("##") for p in pieces) and "".join(p[2:] for p in pieces) == tok[2:], (r, pieces)
        else:                                 # inside a word: the base model's segmentation of that string
            assert [t.id for t in hf.backend_tokenizer.model.tokenize(tok)] == r["pieces"], r

    # the new tokens are used on the corpus' text, and fragment it less than the base does
    held = [d for lang in ("ru", "hi", "fr") for d in make_docs(SENTENCES[lang], 100)[-20:]]
    used = {i for d in held for i in ext.encode(d, add_special_tokens=False).ids}
    assert any(i >= size for i in used)
    before = _fertility(lambda d: hf(d, add_special_tokens=False)["input_ids"], held)
    after = _fertility(lambda d: ext.encode(d, add_special_tokens=False).ids, held)
    assert after < before, (before, after)
    unk = m["special_tokens"]["unk"]["id"]
    assert sum(ext.encode(d).ids.count(unk) for d in held) <= sum(hf(d)["input_ids"].count(unk) for d in held)
    # reruns are byte-identical (the stage output is cached by fingerprint)
    _, again = run_from(tmp_path, corpus, folder, "again", extend=n)
    assert (tmp_path / "again" / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()
    assert pq.read_table(tmp_path / "again" / "extension.parquet").equals(table)


def test_pipeline_folders_and_hf_subfolder(bases, corpus, tmp_path):
    """A folder this pipeline wrote: tokenizer.json + model_config.json (specials by their names), and the
    hf/ folder of a pretrain output or registry download."""
    own, m0 = run_from(tmp_path, corpus, bases["xlmr"], "tok")
    pre = tmp_path / "pretrain"
    pre.mkdir()
    shutil.copy(own / "tokenizer.json", pre / "tokenizer.json")
    (pre / "model_config.json").write_text(json.dumps({"layers": 2}), encoding="utf-8")
    _, m = run_from(tmp_path, corpus, pre, "from_pretrain")
    assert m["special_tokens"] == m0["special_tokens"] and m["source"]["family"] == "bert"
    reg = tmp_path / "registry"
    shutil.copytree(bases["roberta"], reg / "hf")
    _, m2 = run_from(tmp_path, corpus, reg, "from_hf")
    assert m2["special_tokens"]["mask"] == {"token": "<mask>", "id": hf_tokenizer(bases["roberta"]).mask_token_id}


def test_bad_inputs(bases, corpus, tmp_path):
    with pytest.raises(ExternalRefError, match=r"tokenizer.from: .*nowhere does not exist"):
        run_from(tmp_path, corpus, tmp_path / "nowhere", "a")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("no tokenizer here")
    with pytest.raises(TokenizerError, match=r"tokenizer.from: .*empty holds no tokenizer files"):
        run_from(tmp_path, corpus, empty, "b")
    half = tmp_path / "half"
    half.mkdir()
    shutil.copy(bases["roberta"] / "tokenizer.json", tmp_path / "t.json")
    (half / "vocab.json").write_text("{}")
    with pytest.raises(TokenizerError, match=r"vocab.json without merges.txt"):
        run_from(tmp_path, corpus, half, "c")
    with pytest.raises(ConfigError, match="tokenizer.extend needs tokenizer.from"):
        config(tmp_path, extend=10)


def test_sentencepiece_only_folder_names_what_to_install(tmp_path, corpus):
    import importlib.util
    if importlib.util.find_spec("sentencepiece") is not None:
        pytest.skip("sentencepiece is installed: the conversion itself runs")
    d = tmp_path / "xlmr_spm"
    d.mkdir()
    (d / "sentencepiece.bpe.model").write_bytes(b"\x0a\x00")
    with pytest.raises(TokenizerError, match=r"sentencepiece.bpe.model .*pip install 'sentencepiece>=0.2,<0.3'"):
        run_from(tmp_path, corpus, d, "spm")


def test_extend_without_room_in_the_id_dtype(tmp_path, corpus):
    """65530 ids are stored as uint16 (at most 65536): extending by 10 must be refused, naming the file."""
    vocab = {f"t{i}": i for i in range(65525)} | {t: 65525 + i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    d = tmp_path / "big"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    with pytest.raises(TokenizerError, match=r"tokenizer.extend=10: the tokenizer.from tokenizer .*big/tokenizer.json "
                                             r"has 65530 ids, stored as uint16 \(at most 65536 ids\).*at most 6"):
        run_from(tmp_path, corpus, d, "x", extend=10)
    _, m = run_from(tmp_path, corpus, d, "y", extend=6)      # exactly fits (fewer when the corpus offers fewer)
    assert m["vocab_size"] <= 65536


def test_contract_reports_fertility_next_to_the_other_languages(bases, corpus, tmp_path, caplog):
    """A base that fragments Hindi fails the fertility limit; the log shows every language's fertility."""
    from mlm_core.stages import with_thresholds
    from tasks.validation import ValidationFailed, validate_stage
    out, m = run_from(tmp_path, corpus, bases["roberta"], "fr", max_fertility=6.0)
    manifest = {**m, "config": {"tokenizer": {"vocab_size": 8000, "min_vocab_fraction": 0.5}}}
    ok = with_thresholds(manifest, {"tokenizer": {"max_fertility": 50.0, "max_unk_rate": 0.02}})
    assert validate_stage("tokenizer", out, ok).success       # its own size is the requested one, not 8000
    bad = with_thresholds(manifest, {"tokenizer": {"max_fertility": 6.0, "max_unk_rate": 0.02}})
    with caplog.at_level(logging.WARNING), pytest.raises(ValidationFailed, match=r"fertility_to_limit.*offending: lang='(hi|ru)' heldout_docs=20: 1\.\d+, lang='(hi|ru)'"):
        validate_stage("tokenizer", out, bad)
    table = "\n".join(r.getMessage() for r in caplog.records if "fertility per language" in r.getMessage())
    assert all(f"\n{lang} " in table for lang in LANGS) and " !" in table, table


@pytest.mark.parametrize("name,extend", [("roberta", 0), ("xlmr", 20)])
def test_stages_and_shards_with_a_foreign_tokenizer(bases, tmp_path, name, extend):
    """plan/execute normalize -> tokenizer (from) -> shards: the rows hold the base's ids as transformers
    encodes each document, framed by the base's own <s> / </s> / <pad>; word starts follow transformers'
    word ids; masking never draws a special id (XLM-R's <mask> is the last one)."""
    import numpy as np
    import torch

    from conftest import write_en_ru_config
    from mlm_core import stages
    from mlm_core.config import MaskingConfig
    from mlm_core.masking import Masker
    from mlm_core.shards.reader import read_shard_file
    cfg = write_en_ru_config(tmp_path, "from", 40, tokenizer={"from": str(bases[name]), "extend": extend,
                                                              "heldout_docs": 5, "max_fertility": 50.0},
                             shards={"seq_len": 128, "validation_fraction": 0.1})
    lc = load_config(cfg)
    plans = stages.plan(lc)
    for stage in ("normalize", "tokenizer", "shards"):
        art, hit = stages.execute(lc, stage, plans)
        assert not hit
    tok_m = stages.plan(lc)["tokenizer"]
    assert tok_m.status == "done"
    sm = art.manifest
    hf = hf_tokenizer(bases[name])
    sp = {r: v["id"] for r, v in sm["special_tokens"].items()}
    assert sp == {r: hf.convert_tokens_to_ids(getattr(hf, f"{r}_token")) for r in ROLES}
    assert sm["vocab_size"] == len(hf) + (extend and stages.StageStore(lc.workdir).load(
        "tokenizer", tok_m.fingerprint).manifest["extension"]["added"])
    docs = {t for lang in ("en", "ru") for t in pq.read_table(Path(lc.workdir) / next(
        (Path(lc.workdir)).glob("normalize/*/docs")).relative_to(lc.workdir) / f"{lang}.parquet").column("text").to_pylist()}
    segments = 0
    new_ids = False
    for shard in sm["shards"]:
        rows = read_shard_file(art.path, shard["file"], sm)      # decoded (format v3 folds word starts into ids)
        ids, ws = rows["input_ids"].astype(np.int64), rows["word_start"]
        assert (ids[:, 0] == sp["cls"]).all() and ids.max() < sm["vocab_size"]
        new_ids |= bool((ids >= len(hf)).any())
        for row, starts in zip(ids, ws):
            seps = np.flatnonzero(row == sp["sep"])
            for a, b in zip(seps, seps[1:]):          # a whole document between two </s>
                seg = row[a + 1:b].tolist()
                if sp["unk"] in seg:                   # (a character the base lacks: no text to compare)
                    continue
                text = Tokenizer.from_file(str(Path(tok_m.path) / "tokenizer.json")).decode(seg)
                assert text in docs, text
                if not extend:                         # the base's own encoding, and its word boundaries
                    enc = hf(text, add_special_tokens=False)
                    assert enc["input_ids"] == seg
                    wid = enc.word_ids()
                    assert starts[a + 1:b].tolist() == [int(i == 0 or wid[i] != wid[i - 1]) for i in range(len(wid))]
                segments += 1
            assert not set(row[1:].tolist()) & {sp["cls"], sp["mask"]}   # (UNK is content: a character the base lacks)
    assert segments >= 3
    assert new_ids == bool(extend)
    # masking with the manifest's specials: random replacements never produce one (the mask id included)
    rows = torch.tensor(ids)
    specials = sorted(sp.values())
    masker = Masker(MaskingConfig(rate=0.5, mask_token_prob=0.0, random_token_prob=1.0), sm["vocab_size"], specials,
                    sp["mask"], seed=1)
    out = masker(rows, torch.ones_like(rows, dtype=torch.uint8), step=0)
    drawn = out.input_ids[out.selected]
    assert len(drawn) and not set(drawn.tolist()) & set(specials) and int(drawn.max()) < sm["vocab_size"]
    assert not (out.selected & torch.isin(rows, torch.tensor(specials))).any()
