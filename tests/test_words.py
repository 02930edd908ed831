"""Word starts of the shards in scripts written without spaces (issue 9, item 3).

Expectations come from outside the code under test: the mean length of Chinese words (about 1.5-1.7
characters in segmented corpora), the human word segmentation of the Chinese PUD treebank, and hand-written
segmentations of Thai, Lao, Japanese and mixed sentences. The flags are the ones the shards stage stores
(``encode_texts`` is what ``run_shards`` calls), turned back into words through the tokens' offsets.
"""
from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from mlm_core.config import TokenizerConfig
from mlm_core.shards.build import encode_texts, prepare_tokenizer
from mlm_core.tokenizer.build import train

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def zh_lines(n: int = 300) -> list[str]:
    lines = [ln.strip() for ln in (DATA / "text" / "zh.txt").read_text(encoding="utf-8").splitlines()]
    return [ln for ln in lines if ln][:n]


def pud_zh() -> list[tuple[str, list[str]]]:
    """(sentence, gold words) from the Chinese PUD treebank; sentences whose words spell the text exactly."""
    out, text, words = [], None, []
    for line in (DATA / "ud-pud" / "zh_pud-ud-test.conllu").read_text(encoding="utf-8").splitlines():
        if line.startswith("# text = "):
            text, words = line[len("# text = "):].strip(), []
        elif line and line[0].isdigit():
            cols = line.split("\t")
            if "-" not in cols[0] and "." not in cols[0]:
                words.append(cols[1])
        elif not line and text is not None:
            if "".join(words) == text:
                out.append((text, words))
            text = None
    return out


def word_spans(tok, texts: list[str]) -> list[list[tuple[int, int]]]:
    """Character spans of the words that the stored word-start flags define: a word runs from the start of
    its first token to the start of the next word's first token (or the end of the document)."""
    enc = encode_texts(tok, texts, np.dtype(np.uint32))
    encs = tok.encode_batch(texts, add_special_tokens=False)
    ends = np.cumsum(enc.lens)
    out = []
    for text, e, end, n in zip(texts, encs, ends, enc.lens):
        flags = enc.word_start[end - n: end]
        assert len(flags) == len(e.offsets)
        starts = sorted({e.offsets[i][0] for i in np.flatnonzero(flags)})
        bounds = starts + [len(text)]
        out.append([(a, b) for a, b in zip(bounds, bounds[1:])])
    return out


def words_of(tok, texts: list[str]) -> list[list[str]]:
    return [[t[a:b].strip() for a, b in spans if t[a:b].strip()] for t, spans in zip(texts, word_spans(tok, texts))]


def is_han(ch: str) -> bool:
    return unicodedata.name(ch, "").startswith("CJK UNIFIED IDEOGRAPH")


@pytest.fixture(scope="module", params=["bpe", "wordpiece", "unigram"])
def zh_tok(request):
    cfg = TokenizerConfig(algorithm=request.param, vocab_size=4000, min_frequency=2)
    return request.param, prepare_tokenizer(train(cfg, zh_lines(1000)))


def byte_tokenizer() -> Tokenizer:
    """Byte-level BPE with only the 256 bytes: every character boundary is a token boundary."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.train_from_iterator([], trainers.BpeTrainer(vocab_size=256, show_progress=False,
                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return prepare_tokenizer(tok)


def test_chinese_mean_word_length(zh_tok):
    kind, tok = zh_tok
    lengths = [len(w) for ws in words_of(tok, zh_lines()) for w in ws if all(is_han(c) for c in w)]
    assert len(lengths) > 2000
    mean = sum(lengths) / len(lengths)
    # a whole clause per word (byte-level BPE, Metaspace) is > 5; one character per word (WordPiece) is 1.0
    assert 1.3 <= mean <= 2.5, f"{kind}: mean Chinese word length {mean:.2f} characters"


def test_chinese_boundaries_match_the_treebank(zh_tok):
    """Word boundaries (as end offsets) against the human segmentation of the Chinese PUD sentences."""
    kind, tok = zh_tok
    pud = pud_zh()[:300]
    assert len(pud) == 300
    tp = fp = fn = 0
    for (text, gold), spans in zip(pud, word_spans(tok, [t for t, _ in pud])):
        g = set(np.cumsum([len(w) for w in gold]).tolist())
        p = {b for _, b in spans}
        tp, fp, fn = tp + len(g & p), fp + len(p - g), fn + len(g - p)
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    # every character a word: precision ~0.6; every clause a word: recall ~0.15
    assert precision >= 0.8 and recall >= 0.7, f"{kind}: precision {precision:.2f} recall {recall:.2f}"


@pytest.mark.parametrize("text,expected", [
    ("ผมชอบกินข้าว", ["ผม", "ชอบ", "กิน", "ข้าว"]),                       # Thai: I | like | eat | rice
    ("ฉันรักเมืองไทย", ["ฉัน", "รัก", "เมือง", "ไทย"]),                  # Thai: I | love | country | Thai
    ("สวัสดีครับ ผม", ["สวัสดี", "ครับ", "ผม"]),                         # hello | (polite) | I
    ("私は東京に", ["私", "は", "東京", "に"]),                             # Japanese: I | (topic) | Tokyo | to
    ("我用iPhone手机", ["我", "用", "iPhone", "手机"]),                     # a Latin name inside Han
    ("我们今天去公园散步", ["我们", "今天", "去", "公园", "散步"]),          # the example
    ("The quick brown fox.", ["The", "quick", "brown", "fox", "."]),     # space-delimited: as before
])
def test_known_segmentations(text, expected):
    assert words_of(byte_tokenizer(), [text]) == [expected]


def test_one_start_per_word_with_multi_token_characters():
    """Byte-level tokens of one character share its offset: only the first of them may start the word."""
    tok = byte_tokenizer()
    text = "我们 公园"
    enc = encode_texts(tok, [text], np.dtype(np.uint32))
    e = tok.encode(text, add_special_tokens=False)
    starts = [e.offsets[i][0] for i in np.flatnonzero(enc.word_start)]
    assert len(starts) == len(set(starts)) == 2


def test_non_bmp_characters_keep_offsets_aligned():
    """ICU counts UTF-16 units; an emoji or an extension-B ideograph before the words must not shift them."""
    assert words_of(byte_tokenizer(), ["😀我们今天去公园"]) == [["😀", "我们", "今天", "去", "公园"]]


def letter_runs(text: str) -> list[str]:
    """Maximal runs of letters and combining marks (Unicode general categories L and M)."""
    out, cur = [], ""
    for ch in text:
        if unicodedata.category(ch)[0] in "LM":
            cur += ch
        elif cur:
            out, cur = out + [cur], ""
    return out + [cur] if cur else out


def test_hindi_words_keep_their_vowel_signs():
    """The byte-level pre-tokenizer splits at every combining mark ("बाज़ार" -> 5 pieces); the stored words
    must be the whole words, checked on real Hindi lines that hold only Devanagari letters and punctuation."""
    lines = [ln.strip() for ln in (DATA / "text" / "hi.txt").read_text(encoding="utf-8").splitlines()]
    lines = [ln for ln in lines if ln and all(unicodedata.category(c)[0] in "LMPZ" and not c.isascii()
                                              or c in " ,.?!" for c in ln)][:40]
    assert len(lines) >= 10
    cfg = TokenizerConfig(algorithm="bpe", vocab_size=1000, min_frequency=2)
    expected = [letter_runs(t) for t in lines]
    assert [[w for w in ws if letter_runs(w)] for ws in words_of(byte_tokenizer(), lines)] == expected
    # a trained BPE may merge a vowel sign with the punctuation after it ("ै," one token): compare letters only
    got = [[r for w in ws for r in letter_runs(w)] for ws in words_of(prepare_tokenizer(train(cfg, lines)), lines)]
    assert got == expected
    assert words_of(byte_tokenizer(), ["मैं आज बाज़ार जा रहा हूँ।"]) == [["मैं", "आज", "बाज़ार", "जा", "रहा", "हूँ", "।"]]
