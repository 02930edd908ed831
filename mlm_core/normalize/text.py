"""Vectorized text cleaning over Arrow string arrays (no Python loop per document).

Steps, in order: drop control / zero-width / NUL / soft-hyphen characters (ZWJ and ZWNJ are kept:
they carry meaning in Devanagari, Arabic and Persian), Unicode normalization (NFC or NFKC),
collapse every run of whitespace (including Unicode spaces) into one space and trim, optional
lowercasing. Accents are never stripped. Then the filters: empty, too short, too long, and the
script check (the share of letters written in the language's scripts must reach a threshold).
All of it runs in Arrow's C++ kernels (RE2 regexes with Unicode script classes).
"""
from __future__ import annotations

import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# C0/C1 controls except the whitespace ones (handled below), NUL, zero-width space, word joiner, BOM, soft hyphen.
DROP_RE = r"[\x00-\x08\x0E-\x1F\x7F-\x84\x86-\x9F\x{200B}\x{2060}\x{FEFF}\x{00AD}\x{180E}]"
# Whitespace to rewrite as one space: runs of 2+, or any single whitespace that is not U+0020 (the Z
# category enumerated, since RE2 has no class subtraction). A lone ASCII space is not a match, which
# makes this ~5x faster than matching every space run, with the same result.
SPACE_RE = (r"[ \t\n\x0B\f\r\x{85}\p{Z}]{2,}"
            r"|[\t\n\x0B\f\r\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}]")
NON_LETTER_NON_SPACE_RE = r"[^\pL\pM ]"


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


def script_ratio(texts: pa.Array, scripts: list[str]) -> np.ndarray:
    """Share of letters (and combining marks) that belong to ``scripts``; 1.0 for text without letters.

    Counted through the rare characters only (a regex count costs per match): letters = length minus
    non-letters (spaces, digits, punctuation); foreign = letters of any other script."""
    foreign_re = "[^" + "".join(f"\\p{{{s}}}" for s in scripts) + r"\p{Inherited}\PL]"
    length = pc.utf8_length(texts).to_numpy(zero_copy_only=False).astype(np.float64)
    # spaces counted literally (fast), the rarer other non-letters by regex (cleaned text has single spaces)
    other = (pc.count_substring(texts, " ").to_numpy(zero_copy_only=False).astype(np.float64)
             + pc.count_substring_regex(texts, NON_LETTER_NON_SPACE_RE).to_numpy(zero_copy_only=False))
    foreign = pc.count_substring_regex(texts, foreign_re).to_numpy(zero_copy_only=False).astype(np.float64)
    letters = length - other
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(letters > 0, 1.0 - foreign / np.maximum(letters, 1), 1.0)


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
