"""Language facts: ISO 639-1 codes and the Unicode scripts each language is written in.

The script names are RE2/Unicode script property names (usable as ``\\p{Name}`` in
``pyarrow.compute`` regexes), so the normalize stage's script check is vectorized.
"""
from __future__ import annotations

# ISO 639-1 (all 183 two-letter codes).
ISO639_1 = frozenset("""
aa ab ae af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca ce ch co cr cs cu cv cy da de dv dz ee el
en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi ho hr ht hu hy hz ia id ie ig ii ik io is it iu ja
jv ka kg ki kj kk kl km kn ko kr ks ku kv kw ky la lb lg li ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd
ne ng nl nn no nr nv ny oc oj om or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd se sg si sk sl sm sn so sq sr ss
st su sv sw ta te tg th ti tk tl tn to tr ts tt tw ty ug uk ur uz ve vi vo wa wo xh yi yo za zh zu
""".split())

SCRIPTS = frozenset({
    "Latin", "Cyrillic", "Greek", "Arabic", "Hebrew", "Devanagari", "Bengali", "Gurmukhi", "Gujarati", "Tamil",
    "Telugu", "Kannada", "Malayalam", "Sinhala", "Thai", "Lao", "Tibetan", "Myanmar", "Khmer", "Georgian",
    "Armenian", "Ethiopic", "Han", "Hiragana", "Katakana", "Hangul", "Thaana", "Oriya",
})

_L, _C, _A = ("Latin",), ("Cyrillic",), ("Arabic",)
SCRIPTS_BY_LANG: dict[str, tuple[str, ...]] = {
    **{c: _L for c in "af az br bs ca co cs cy da de en eo es et eu fi fo fr fy ga gd gl ha hr ht hu id ig is it jv "
       "ku la lb lt lv mg mi ms mt nb nl nn no oc om pl pt qu rm ro rw sk sl sm sn so sq st su sv sw tk tl tn to "
       "tr vi wa wo xh yo zu uz".split()},
    **{c: _C for c in "ba be bg ce cv kk ky mk mn ru sr tg tt uk".split()},
    **{c: _A for c in "ar fa ps sd ug ur".split()},
    "el": ("Greek",), "he": ("Hebrew",), "yi": ("Hebrew",),
    "hi": ("Devanagari",), "mr": ("Devanagari",), "ne": ("Devanagari",), "sa": ("Devanagari",),
    "bn": ("Bengali",), "as": ("Bengali",), "pa": ("Gurmukhi",), "gu": ("Gujarati",), "or": ("Oriya",),
    "ta": ("Tamil",), "te": ("Telugu",), "kn": ("Kannada",), "ml": ("Malayalam",), "si": ("Sinhala",),
    "th": ("Thai",), "lo": ("Lao",), "bo": ("Tibetan",), "dz": ("Tibetan",), "my": ("Myanmar",), "km": ("Khmer",),
    "ka": ("Georgian",), "hy": ("Armenian",), "am": ("Ethiopic",), "ti": ("Ethiopic",), "dv": ("Thaana",),
    "zh": ("Han",), "ja": ("Han", "Hiragana", "Katakana"), "ko": ("Hangul", "Han"),
}
