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
  * everywhere else the pre-tokenizer's word ids decide, as before: space-delimited text is unchanged.

Cost: documents without a character of those scripts are skipped by one regex search; for the others the
work is one ICU pass over the text and a few numpy operations per document.
"""
from __future__ import annotations

import itertools
import re
import threading

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
_RUN = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in NO_SPACE_RANGES) + "]")
# str.isspace() code points (Unicode White_Space plus the ASCII separators 0x1C-0x1F)
_SPACES = np.array([c for c in range(0x3001) if chr(c).isspace()], dtype=np.uint32)

IN_RUN, BOUNDARY, AFTER_RUN = 0, 1, 2     # per-character codes; -1 = the pre-tokenizer decides
_local = threading.local()


def has_no_space_script(text: str) -> bool:
    return _RUN.search(text) is not None


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


def char_codes(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Per character (plus one end slot): -1 / IN_RUN / BOUNDARY / AFTER_RUN (module docstring), and the
    index of the next non-space character at or after each position."""
    cps = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    n = len(cps)
    in_run = np.zeros(n, dtype=bool)
    for a, b in NO_SPACE_RANGES:
        in_run |= (cps >= a) & (cps <= b)
    code = np.full(n + 1, -1, dtype=np.int8)
    code[:n][in_run] = IN_RUN
    bounds = icu_boundaries(text)
    bounds = bounds[bounds < n]
    code[bounds[in_run[bounds]]] = BOUNDARY
    prev = np.r_[False, in_run]                      # prev[i]: character i-1 is in a run
    code[:n][in_run & ~prev[:n]] = BOUNDARY           # a run's first character starts a word
    code[:n][~in_run & prev[:n]] = AFTER_RUN
    space = np.isin(cps, _SPACES)
    idx = np.where(space, n, np.arange(n))
    nxt = np.r_[np.minimum.accumulate(idx[::-1])[::-1], n] if n else np.zeros(1, np.int64)
    return code, nxt


def refine_word_starts(texts: list[str], encs: list, lens: np.ndarray, ws: np.ndarray) -> None:
    """Overwrite, in place, the word starts ``ws`` (the flattened tokens of ``encs``, ``lens`` per document)
    inside no-space-script runs. The documents holding such a run are joined with newlines and handled in
    one pass (one ICU iteration, array operations over every token), not one document at a time."""
    sel = [i for i, t in enumerate(texts) if lens[i] and has_no_space_script(t)]
    if not sel:
        return
    sizes = np.array([len(texts[i]) for i in sel], dtype=np.int64)
    base = np.cumsum(sizes + 1) - (sizes + 1)                   # each document's offset in the joined text
    code, nxt = char_codes("\n".join(texts[i] for i in sel))
    code[base[1:] - 1] = -1                                     # the joining newlines belong to no document
    n_tok = lens[sel].astype(np.int64)
    off = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(encs[i].offsets for i in sel)),
                      dtype=np.int64, count=2 * int(n_tok.sum())).reshape(-1, 2)
    doc_base, doc_end = np.repeat(base, n_tok), np.repeat(base + sizes, n_tok)
    a = np.minimum(off[:, 0] + doc_base, doc_end)
    b = np.clip(off[:, 1] + doc_base, a, doc_end)
    p = np.minimum(nxt[a], b)          # first non-space character, or the end of an all-space token
    c = code[p]
    first = np.cumsum(n_tok) - n_tok   # each document's first token among the selected tokens
    new_pos = np.ones(len(p), dtype=bool)
    new_pos[1:] = p[1:] != p[:-1]
    new_pos[first] = True
    val = np.where(c == IN_RUN, False, new_pos)                 # BOUNDARY / AFTER_RUN: a start at a new position
    starts = np.cumsum(lens) - lens                             # each document's first token in ``ws``
    idx = np.repeat(starts[sel] - first, n_tok) + np.arange(len(p))
    override = c >= 0
    ws[idx[override]] = val[override]
    ws[starts[sel]] = 1
