"""Word starts for the shards' ``word_start`` column, with real word boundaries in scripts written without spaces.

Why: the tokenizer's pre-tokenizer (``Encoding.word_ids``) splits at spaces and punctuation only. Byte-level
BPE and Metaspace keep "我们今天去公园散步" as one "word", so whole-word and span masking hid whole clauses in
zh/ja/th; the WordPiece pre-tokenizer isolates every Han character, so whole-word masking silently became
token masking there. Here the words of those scripts come from ICU's Unicode word-break iterator (UAX #29
with ICU's dictionaries: Han, Hiragana/Katakana, Thai, Lao, Khmer, Myanmar), through PyICU.

Rule, per document (character offsets, as ``Encoding.offsets`` gives them on the original text):
  * a token's position ``p`` is its first non-space character; a token made only of spaces (a lone byte-level
    "Ġ" or Metaspace "▁") takes the position of the character after it, so it joins the next word;
  * inside a run of no-space-script characters a token starts a word iff ``p`` is an ICU word boundary (the
    run's first character always is) and no earlier token of the document already sits at ``p`` (byte-level
    tokens of one character all share its offset);
  * the first character after such a run starts a word (a script change, "手机abc" -> 手机 | abc, where the
    GPT-2 pre-tokenizer keeps both in one pre-token);
  * a combining mark, or a letter right after one, continues the word, and punctuation right after a mark
    starts one: the byte-level (GPT-2) pre-tokenizer splits at every mark (its letters are ``\\p{L}+``), so
    "बाज़ार" was five words and whole-word masking hid pieces of Hindi (Devanagari, Bengali, Tamil... vowel
    signs, Arabic and Hebrew diacritics), and it glued "है," into one;
  * everywhere else the pre-tokenizer's word ids decide, as before.

Cost: each encode batch is joined and classified per character with one table lookup; only the documents
holding a mark or a no-space letter go on, in one pass (one ICU iteration over those with a run, array
operations over their tokens). Measured (byte-level BPE, 8k vocab, real text of ../shared/data, on top
of ``encode_batch``'s 0.3-0.7 s/MB): zh +0.22 s/MB (ICU's dictionary segmentation is most of it), hi +0.10,
ru +0.02 (a few documents with an accent or an emoji variation selector).
"""
from __future__ import annotations

import itertools
import threading
import unicodedata
from functools import lru_cache

import numpy as np

# Scripts written without spaces between words, whose words ICU finds with a dictionary. Inclusive code point
# ranges (Unicode blocks, with the Han extensions and the CJK iteration marks 々〆〇).
NO_SPACE_RANGES: tuple[tuple[int, int], ...] = (
    (0x0E00, 0x0E7F),     # Thai
    (0x0E80, 0x0EFF),     # Lao
    (0x1000, 0x109F),     # Myanmar
    (0x1780, 0x17FF),     # Khmer
    (0x19E0, 0x19FF),     # Khmer symbols
    (0x3005, 0x3007),     # 々 〆 〇
    (0x3040, 0x309F),     # Hiragana
    (0x30A0, 0x30FF),     # Katakana (ー included)
    (0x31F0, 0x31FF),     # Katakana phonetic extensions
    (0x3400, 0x4DBF),     # CJK extension A
    (0x4E00, 0x9FFF),     # CJK unified ideographs
    (0xA9E0, 0xA9FF),     # Myanmar extended-B
    (0xAA60, 0xAA7F),     # Myanmar extended-A
    (0xF900, 0xFAFF),     # CJK compatibility ideographs
    (0xFF66, 0xFF9F),     # half-width Katakana
    (0x20000, 0x3FFFF),   # CJK extensions B..H
)
# str.isspace() code points (Unicode White_Space plus the ASCII separators 0x1C-0x1F)
_SPACES = np.array([c for c in range(0x3001) if chr(c).isspace()], dtype=np.uint32)

IN_RUN, BOUNDARY, AFTER_RUN = 0, 1, 2     # per-character codes; -1 = the pre-tokenizer decides
OTHER, LETTER, MARK, RUN = 0, 1, 2, 3     # character classes (RUN: a letter of a no-space script)
_TABLE_SIZE = 0x20000                     # the BMP and plane 1: every combining mark in common use
_local = threading.local()


@lru_cache(maxsize=1)
def _class_table() -> np.ndarray:
    """Class of every code point below ``_TABLE_SIZE`` (Unicode general category). Built once (~50 ms)."""
    cls = np.zeros(_TABLE_SIZE, dtype=np.uint8)
    for c in range(_TABLE_SIZE):
        cat = unicodedata.category(chr(c))[0]
        cls[c] = LETTER if cat == "L" else MARK if cat == "M" else OTHER
    for lo, hi in NO_SPACE_RANGES:
        if lo < _TABLE_SIZE:
            cls[lo: min(hi, _TABLE_SIZE - 1) + 1] = RUN
    return cls


def char_classes(cps: np.ndarray) -> np.ndarray:
    cls = _class_table()[np.minimum(cps, _TABLE_SIZE - 1)]
    big = cps >= _TABLE_SIZE
    if big.any():   # CJK extensions B..H are runs; anything else up there counts as "other"
        cls[big] = np.where(cps[big] <= 0x3FFFF, RUN, OTHER)
    return cls


def _break_iterator():
    bi = getattr(_local, "bi", None)
    if bi is None:
        try:
            import icu
        except ImportError as e:   # a required dependency (pyproject.toml: pyicu-wheels)
            raise ImportError("word boundaries for zh/ja/th/lo/km/my need PyICU: pip install pyicu-wheels") from e
        bi = _local.bi = icu.BreakIterator.createWordInstance(icu.Locale.getRoot())
    return bi


def icu_boundaries(text: str) -> np.ndarray:
    """ICU word-break boundaries of ``text`` as code point offsets (0 and len(text) included)."""
    bi = _break_iterator()
    bi.setText(text)
    b = np.fromiter(bi, dtype=np.int64)
    b = np.r_[0, b] if not len(b) or b[0] != 0 else b
    cps = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    if (cps > 0xFFFF).any():   # ICU counts UTF-16 code units: map them back to code points
        units = np.cumsum(np.r_[0, 1 + (cps > 0xFFFF)])          # code point i starts at UTF-16 unit units[i]
        b = np.searchsorted(units, b)
    return b


def _run_boundaries(texts: list[str], docs: np.ndarray, base: np.ndarray) -> np.ndarray:
    """ICU word boundaries of the documents ``docs`` (one ICU pass over them joined by newlines), as offsets
    into the joined text of all ``texts`` (whose document starts are ``base``)."""
    parts = [texts[i] for i in docs]
    sizes = np.array([len(t) for t in parts], dtype=np.int64)
    run_base = np.cumsum(sizes + 1) - (sizes + 1)
    local = icu_boundaries("\n".join(parts))
    d = np.searchsorted(run_base, local, side="right") - 1
    return local - run_base[d] + base[docs][d]


def char_codes(cps: np.ndarray, cls: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per character (plus one end slot): -1 / IN_RUN / BOUNDARY / AFTER_RUN (module docstring), and the
    index of the next non-space character at or after each position. ``bounds``: ICU's word boundaries."""
    n = len(cps)
    in_run = cls == RUN
    code = np.full(n + 1, -1, dtype=np.int8)
    mark = cls == MARK
    after_mark = np.r_[False, mark[:-1]]
    space = np.isin(cps, _SPACES)
    cont = mark | ((cls == LETTER) & after_mark)    # a mark, or a letter right after one
    code[:n][cont] = IN_RUN
    # punctuation or a digit right after a mark starts a word, as after any other letter ("है," -> है | ,);
    # the GPT-2 pre-tokenizer glues it to the mark, both being "not a letter"
    code[:n][(cls == OTHER) & after_mark & ~space] = AFTER_RUN
    if len(bounds):
        code[:n][in_run] = IN_RUN
        bounds = bounds[bounds < n]
        code[bounds[in_run[bounds]]] = BOUNDARY
        prev = np.r_[False, in_run]                      # prev[i]: character i-1 is in a run
        code[:n][in_run & ~prev[:n]] = BOUNDARY           # a run's first character starts a word
        code[:n][~in_run & prev[:n] & ~cont] = AFTER_RUN
    idx = np.where(space, n, np.arange(n))
    nxt = np.r_[np.minimum.accumulate(idx[::-1])[::-1], n] if n else np.zeros(1, np.int64)
    return code, nxt


def refine_word_starts(texts: list[str], encs: list, lens: np.ndarray, ws: np.ndarray) -> None:
    """Overwrite, in place, the word starts ``ws`` (the flattened tokens of ``encs``, ``lens`` per document)
    inside no-space-script runs and at combining marks. The batch is joined with newlines and handled in
    one pass (array operations over every character and token), not one document at a time."""
    if not len(texts):
        return
    sizes = np.array([len(t) for t in texts], dtype=np.int64)
    base = np.cumsum(sizes + 1) - (sizes + 1)                   # each document's offset in the joined text
    cps = np.frombuffer("\n".join(texts).encode("utf-32-le"), dtype="<u4")
    cls = char_classes(cps)
    per_doc = np.r_[0, np.cumsum(cls >= MARK)]
    n_special = per_doc[base + sizes] - per_doc[base]           # marks and no-space letters per document
    sel = np.flatnonzero((n_special > 0) & (lens > 0))
    if not len(sel):
        return
    per_doc = np.r_[0, np.cumsum(cls == RUN)]
    run_docs = np.flatnonzero(per_doc[base + sizes] - per_doc[base] > 0)
    bounds = _run_boundaries(texts, run_docs, base) if len(run_docs) else np.zeros(0, np.int64)
    code, nxt = char_codes(cps, cls, bounds)
    code[base[1:] - 1] = -1                                     # the joining newlines belong to no document
    base, sizes = base[sel], sizes[sel]
    n_tok = lens[sel].astype(np.int64)
    off = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(encs[i].offsets for i in sel)),
                      dtype=np.int64, count=2 * int(n_tok.sum())).reshape(-1, 2)
    doc_base, doc_end = np.repeat(base, n_tok), np.repeat(base + sizes, n_tok)
    a = np.minimum(off[:, 0] + doc_base, doc_end)
    b = np.clip(off[:, 1] + doc_base, a, doc_end)
    p = np.minimum(nxt[a], b)          # first non-space character, or the end of an all-space token
    c = code[p]
    first = np.cumsum(n_tok) - n_tok   # each document's first token among the selected tokens
    # a token that starts inside the previous one (byte-level pieces of one character share its offsets; a
    # character that the normalizer expanded, "ड़" U+095C -> ड + nukta, spans two tokens) continues it
    new_pos = np.ones(len(p), dtype=bool)
    new_pos[1:] = (p[1:] != p[:-1]) & (a[1:] >= b[:-1])
    new_pos[first] = True
    val = np.where(c == IN_RUN, False, new_pos)                 # BOUNDARY / AFTER_RUN: a start at a new position
    starts = np.cumsum(lens) - lens                             # each document's first token in ``ws``
    idx = np.repeat(starts[sel] - first, n_tok) + np.arange(len(p))
    override = (c >= 0) | ~new_pos     # the pre-tokenizer decides the rest
    ws[idx[override]] = val[override]
    ws[starts[sel]] = 1
