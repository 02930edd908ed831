"""Vectorized text cleaning over Arrow string arrays (no Python loop per document).

Steps, in order: drop control / zero-width / NUL / soft-hyphen characters and the bidirectional embedding,
override and isolate controls (they can reorder how text displays; ZWJ and ZWNJ are kept: they carry
meaning in Devanagari, Arabic and Persian), Unicode normalization (NFC or NFKC),
collapse every run of whitespace (including Unicode spaces) into one space and trim, optional
lowercasing. Accents are never stripped. Then the filters: empty, too short, too long, and the
script check (the share of words written in the language's scripts must reach a threshold: see
``script_ratio``).
All of it runs in Arrow's C++ kernels (RE2 regexes with Unicode script classes).
"""
from __future__ import annotations

import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# C0/C1 controls except the whitespace ones (handled below), NUL, zero-width space, word joiner, BOM, soft hyphen,
# and the bidi embeddings/overrides U+202A-U+202E and isolates U+2066-U+2069 (they reorder the displayed text,
# a known way to hide content; the implicit marks LRM/RLM stay, like ZWJ/ZWNJ).
DROP_RE = (r"[\x00-\x08\x0E-\x1F\x7F-\x84\x86-\x9F\x{200B}\x{2060}\x{FEFF}\x{00AD}\x{180E}"
           r"\x{202A}-\x{202E}\x{2066}-\x{2069}]")
# Whitespace to rewrite as one space: runs of 2+, or any single whitespace that is not U+0020 (the Z
# category enumerated, since RE2 has no class subtraction). A lone ASCII space is not a match, which
# makes this ~5x faster than matching every space run, with the same result.
SPACE_RE = (r"[ \t\n\x0B\f\r\x{85}\p{Z}]{2,}"
            r"|[\t\n\x0B\f\r\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}]")


def unicode_normalize(texts: pa.Array, form: str) -> pa.Array:
    """NFC/NFKC of every string. Arrow 25's ``utf8_normalize`` decomposes but does not recompose
    (its "NFC" returns NFD), so non-ASCII strings go through ``unicodedata.normalize`` one by one: its
    quick check returns already-normalized strings (most of a clean corpus) without rebuilding them.
    (Normalizing one joined string instead is up to 40x slower: one non-normalized line sends the whole
    batch down the slow path.) ASCII strings are always normalized and are never touched."""
    if len(texts) == 0:
        return texts
    non_ascii = pc.invert(pc.string_is_ascii(texts))
    if not pc.any(non_ascii).as_py():
        return texts
    norm = unicodedata.normalize
    vals = [norm(form, v) for v in texts.filter(non_ascii).to_pylist()]
    return pc.replace_with_mask(texts, non_ascii, pa.array(vals, pa.string()))


def clean(texts: pa.Array, unicode_form: str, lowercase: bool) -> pa.Array:
    t = pc.utf8_rtrim(texts, "\r\n")   # line ends: cheap here, and the regexes below then rarely match
    t = pc.replace_substring_regex(t, DROP_RE, "")
    t = unicode_normalize(t, unicode_form)
    t = pc.replace_substring_regex(t, SPACE_RE, " ")
    t = pc.utf8_trim(t, " ")
    if lowercase:
        t = pc.utf8_lower(t)
    return t


# What one character of a script is worth, in Latin letters. Han: measured on the 1,000 parallel PUD sentences
# (the English translations hold 2.98 Latin letters per Han character of the Chinese; the Russian ones 1.08
# Cyrillic letters per Latin letter, so alphabets weigh 1). Kana and Hangul characters are syllables
# (a consonant and a vowel or more): 2.
LETTER_WEIGHT = {"Han": 3.0, "Hiragana": 2.0, "Katakana": 2.0, "Hangul": 2.0}
# A foreign word written with a capital (a name, a brand: "César Mendoza", "Sony PlayStation") counts half:
# names keep their own script in every language, and a Russian or Chinese sentence holding one is still
# Russian or Chinese. An all-foreign text still scores 0.
NAME_WEIGHT = 0.5
# Not language text: @handles, #hashtags and URLs (a Russian chat line "@screened-83 ещё." is Russian).
NOT_TEXT_RE = r"(?:https?://|www\.)\S+|[@#][\pL\pN_.\-]+"


def _count(texts: pa.Array, regex: str) -> np.ndarray:
    return pc.count_substring_regex(texts, regex).to_numpy(zero_copy_only=False).astype(np.float64)


def _length(texts: pa.Array) -> np.ndarray:
    return pc.utf8_length(texts).to_numpy(zero_copy_only=False).astype(np.float64)


def _classes(scripts) -> str:
    return "".join(f"\\p{{{s}}}" for s in scripts)


def script_ratio(texts: pa.Array, scripts: list[str]) -> np.ndarray:
    """Weighted share of the letters (and combining marks) of a text that are written in ``scripts``;
    1.0 for text without letters.

    Rule: each letter weighs its script's ``LETTER_WEIGHT`` (1 for alphabets), letters of a capitalized
    foreign word weigh ``NAME_WEIGHT`` as much, @handles, #hashtags and URLs do not count. Counting raw letters
    (the rule before) made one Han character weigh as much as one Latin letter, and quarantined real Chinese
    and Russian sentences holding a few Latin names.

    Fast path: the plain foreign-letter count first; only texts holding any foreign letter (a few percent of
    a clean corpus) go through the weighted counts."""
    own_cls = _classes(scripts) + r"\p{Inherited}"
    foreign_re = f"[^{own_cls}\\PL]"
    ratio = np.ones(len(texts), dtype=np.float64)
    mixed = np.flatnonzero(pc.count_substring_regex(texts, foreign_re).to_numpy(zero_copy_only=False) > 0)
    if not len(mixed):
        return ratio
    sub = pc.replace_substring_regex(texts.take(pa.array(mixed)), NOT_TEXT_RE, " ")
    foreign = _count(sub, foreign_re)
    own = _count(sub, r"[\pL\pM]") - foreign     # letters and marks, as before: not digits nor punctuation
    for script, w in LETTER_WEIGHT.items():
        n = _count(sub, f"[{_classes([script])}]")
        if script in scripts:
            own += (w - 1) * n
        else:
            foreign += (w - 1) * n
    # a foreign capital letter (not own, not lower/title/modifier/other-case), then foreign letters or marks
    name_re = f"[^{own_cls}\\PL\\p{{Ll}}\\p{{Lm}}\\p{{Lo}}\\p{{Lt}}](?:[^{own_cls}\\PL]|\\pM)*"
    in_names = _length(sub) - _length(pc.replace_substring_regex(sub, name_re, ""))
    foreign -= (1 - NAME_WEIGHT) * in_names
    total = own + foreign
    with np.errstate(divide="ignore", invalid="ignore"):
        # no letter left once handles and URLs are out: the text had foreign letters and nothing else
        ratio[mixed] = np.where(total > 0, own / np.maximum(total, 1e-9), 0.0)
    return ratio


def is_blank(raw: pa.Array) -> np.ndarray:
    """Raw lines holding only ASCII whitespace: separators, not records."""
    # anchored: the regex stops at the first non-whitespace byte, so long lines cost almost nothing
    return pc.match_substring_regex(raw, r"^[ \t\r\n\x0b\x0c]*$").to_numpy(zero_copy_only=False)


def filter_reasons(cleaned: pa.Array, n_chars: np.ndarray, cfg, scripts: list[str]) -> np.ndarray:
    """Per document: '' to keep, or the reason code it is quarantined for."""
    reasons = np.full(len(cleaned), "", dtype=object)
    reasons[n_chars > cfg.max_chars] = "too_long"
    reasons[n_chars < cfg.min_chars] = "too_short"
    reasons[n_chars == 0] = "empty_after_cleaning"
    if cfg.script_check and len(cleaned):
        ok = script_ratio(cleaned, scripts) >= cfg.min_script_ratio
        reasons[(reasons == "") & ~ok] = "script_mismatch"
    return reasons
