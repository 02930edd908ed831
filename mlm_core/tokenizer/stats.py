"""Quality statistics of a trained tokenizer: held-out fertility and UNK rate, vocabulary share per script.

In: a trained ``tokenizers.Tokenizer`` and held-out documents per language. Out: plain dicts.
  tokens_per_word  tokens per whitespace-separated word (fertility, Rust et al. 2021 "How Good is Your
                   Tokenizer?"); meaningless for languages written without spaces (``no_spaces`` flags them).
  tokens_per_char  tokens per non-space character: comparable across all languages.
  unk_rate         share of tokens that are the UNK id (always 0 for byte-level BPE).
  vocab scripts    each vocabulary token's dominant Unicode script (byte-level tokens are first mapped back
                   from the GPT-2 byte alphabet; a token holding only part of a UTF-8 character is 'Bytes').
``write_tables``: both tables as the stage's stats.parquet and vocab_scripts.parquet.
"""
from __future__ import annotations

import unicodedata
from collections import Counter
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer


STATS_SCHEMA = pa.schema([
    ("lang", pa.string()), ("heldout_docs", pa.int64()), ("words", pa.int64()), ("chars", pa.int64()),
    ("tokens", pa.int64()), ("tokens_per_word", pa.float64()), ("tokens_per_char", pa.float64()),
    ("unk_rate", pa.float64()), ("no_spaces", pa.bool_())])
SCRIPTS_SCHEMA = pa.schema([("script", pa.string()), ("tokens", pa.int64()), ("share", pa.float64())])

# Languages written without spaces between words (whitespace "words" are clauses or sentences).
NO_SPACE_LANGS = frozenset({"zh", "ja", "th", "lo", "km", "my", "bo", "dz"})
NO_SPACE_CHARS_PER_WORD = 15.0   # or detected: a mean "word" this long means the text has no word spaces

# First word(s) of a Unicode character name -> script (names as in mlm_core.languages.SCRIPTS).
_NAME_PREFIX = {
    "LATIN": "Latin", "CYRILLIC": "Cyrillic", "GREEK": "Greek", "ARABIC": "Arabic", "HEBREW": "Hebrew",
    "DEVANAGARI": "Devanagari", "BENGALI": "Bengali", "GURMUKHI": "Gurmukhi", "GUJARATI": "Gujarati",
    "TAMIL": "Tamil", "TELUGU": "Telugu", "KANNADA": "Kannada", "MALAYALAM": "Malayalam", "SINHALA": "Sinhala",
    "THAI": "Thai", "LAO": "Lao", "TIBETAN": "Tibetan", "MYANMAR": "Myanmar", "KHMER": "Khmer",
    "GEORGIAN": "Georgian", "ARMENIAN": "Armenian", "ETHIOPIC": "Ethiopic", "CJK": "Han", "HIRAGANA": "Hiragana",
    "KATAKANA": "Katakana", "HANGUL": "Hangul", "THAANA": "Thaana", "ORIYA": "Oriya",
}


@lru_cache(maxsize=65536)
def char_script(c: str) -> str:
    """Script of one character: 'Common' for digits, punctuation, symbols and spaces; 'Other' if unknown."""
    if not unicodedata.category(c).startswith(("L", "M")):
        return "Common"
    name = unicodedata.name(c, "")
    if not name:
        return "Other"
    return _NAME_PREFIX.get(name.split(" ", 1)[0], "Other")


def dominant_script(text: str) -> str:
    """The most frequent non-Common script among the characters of ``text`` (ties: first seen); 'Common' if none."""
    counts = Counter(s for s in map(char_script, text) if s != "Common")
    return counts.most_common(1)[0][0] if counts else "Common"


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable stand-in character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_text(token: str, algorithm: str) -> str | None:
    """The surface text of a vocabulary token (markers removed); None for an incomplete UTF-8 byte sequence."""
    if algorithm == "bpe":
        dec = _byte_decoder()
        raw = bytes(dec[c] for c in token if c in dec)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:   # a merge ending (or starting) inside a multi-byte character
            text = raw.decode("utf-8", errors="ignore")
            return text if text.strip() else None
    if algorithm == "wordpiece":
        return token[2:] if token.startswith("##") else token
    return token.replace("▁", " ")


def vocab_scripts(tok: Tokenizer, algorithm: str, specials: list[str]) -> dict[str, int]:
    """Number of vocabulary tokens per dominant script (special tokens excluded), sorted by count."""
    skip = set(specials)
    counts: Counter = Counter()
    for token in tok.get_vocab(with_added_tokens=True):
        if token in skip:
            continue
        text = token_text(token, algorithm)
        counts["Bytes" if text is None else dominant_script(text)] += 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def heldout_stats(tok: Tokenizer, heldout: dict[str, list[str]], unk_id: int | None) -> dict[str, dict]:
    """Per language: heldout_docs, words, chars, tokens, tokens_per_word, tokens_per_char, unk_rate, no_spaces."""
    out = {}
    for lang, docs in sorted(heldout.items()):
        words = sum(len(d.split()) for d in docs)
        chars = sum(len(d) - sum(map(str.isspace, d)) for d in docs)
        tokens = unk = 0
        for i in range(0, len(docs), 1000):
            for enc in tok.encode_batch(docs[i:i + 1000], add_special_tokens=False):
                tokens += len(enc.ids)
                if unk_id is not None:
                    unk += enc.ids.count(unk_id)
        out[lang] = {
            "heldout_docs": len(docs), "words": words, "chars": chars, "tokens": tokens,
            "tokens_per_word": tokens / words if words else None,
            "tokens_per_char": tokens / chars if chars else None,
            "unk_rate": unk / tokens if tokens else None,
            "no_spaces": lang in NO_SPACE_LANGS or (words > 0 and chars / words > NO_SPACE_CHARS_PER_WORD),
        }
    return out


def fertility(s: dict) -> float | None:
    """The contract's fertility of one language's stats: tokens per word, per character without spaces."""
    return s.get("tokens_per_char") if s.get("no_spaces") else s.get("tokens_per_word")


def fertility_table(langs: dict[str, dict], limits: dict[str, float] | None = None) -> str:
    """Per-language fertility and UNK rate as aligned text lines (one language per line, worst first), with
    each language's limit when ``limits`` is given and "!" where it is over: a tokenizer that fragments one
    language shows next to the corpus' others."""
    rows = sorted(langs.items(), key=lambda kv: -(fertility(kv[1]) or 0.0))
    lines = ["lang  fertility   unit  tokens/char  unk_rate" + ("  limit" if limits else "")]
    for lang, s in rows:
        f = fertility(s)
        lim = (limits or {}).get(lang)
        over = " !" if f is not None and lim is not None and f > lim else ""
        lines.append(f"{lang:<5} {_num(f):>9}  {'char' if s.get('no_spaces') else 'word':>5}  "
                     f"{_num(s.get('tokens_per_char')):>11}  {_num(s.get('unk_rate')):>8}"
                     + (f"  {_num(lim)}{over}" if limits else ""))
    return "\n".join(lines)


def _num(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def write_tables(out_dir: Path, langs: dict, scripts: dict, n_scripts: int) -> None:
    # the fertility / UNK limits are thresholds: the data contract takes them from the config in force, so
    # they are not written here (a stored tokenizer's bytes never depend on them)
    rows = [{"lang": lang, **{k: s[k] for k in STATS_SCHEMA.names if k in s}} for lang, s in langs.items()]
    pq.write_table(pa.Table.from_pylist(rows, schema=STATS_SCHEMA), out_dir / "stats.parquet")
    srows = [{"script": s, "tokens": n, "share": n / n_scripts} for s, n in scripts.items()]
    pq.write_table(pa.Table.from_pylist(srows, schema=SCRIPTS_SCHEMA), out_dir / "vocab_scripts.parquet")
