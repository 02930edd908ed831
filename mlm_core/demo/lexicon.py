"""The language-independent side of the demo grammar: concepts, topics, frames and the sampler.

A :class:`Frame` is a tiny meaning representation (who does what to what, where, when; or a
weather report). Every language module (``lang_en`` ... ``lang_zh``) turns the same frame into a
list of ``(token, UPOS)`` pairs, so a frame rendered in all seven languages is a parallel sentence.

The grammar fragment is deliberately small: present tense, third person, definite noun phrases,
at most one adjective per noun phrase, and no adjective on plural subjects (which keeps Arabic
broken plurals out of agreement). Each language lists its agreeing forms explicitly instead of
deriving them with morphology rules.

Detokenization rule (shared by the corpus and ``parallel.jsonl``): for ``zh`` the text is the
tokens concatenated with no separator; for every other language the tokens are joined with a
single space, except that a token tagged ``PUNCT`` attaches to the previous token (no space
before it). Sentences of one document are joined the same way (a space, or nothing for ``zh``).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

LANGS: tuple[str, ...] = ("en", "fr", "de", "ru", "ar", "hi", "zh")

# Universal Dependencies v2 UPOS tags.
UPOS = frozenset({
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN",
    "PUNCT", "SCONJ", "SYM", "VERB", "X",
})

TOPICS: tuple[str, ...] = ("food", "animals", "family", "travel", "sport", "weather")

# How often each topic is drawn for the raw corpus (the parallel subset is balanced instead).
TOPIC_WEIGHTS: dict[str, int] = {
    "food": 22, "animals": 20, "family": 18, "travel": 15, "sport": 15, "weather": 10,
}

Token = tuple[str, str]


@dataclass(frozen=True)
class Frame:
    """One sentence meaning. ``weather`` frames use only ``weather``, ``place`` and ``time``."""
    topic: str
    subj: str | None = None
    subj_pl: bool = False
    subj_adj: str | None = None
    verb: str | None = None
    obj: str | None = None
    obj_pl: bool = False
    obj_adj: str | None = None
    place: str | None = None
    time: str | None = None
    weather: str | None = None


# Concepts that are animate (subjects) vs. things (objects): the ar/hi/zh modules pick a
# different word for "old" depending on the role (Arabic عجوز/قديم, Hindi बूढ़ा/पुराना, zh 老/旧).
ANIMALS = ("dog", "cat", "horse", "cow", "rabbit")
BUILDINGS = ("museum", "castle", "tower", "palace")
CITIES = ("paris", "berlin", "rome", "madrid", "moscow", "beijing", "delhi")

# --- per-topic selectional restrictions -------------------------------------------------------
# subject -> adjectives it may take (only used when the subject is singular)
SUBJ_ADJ: dict[str, tuple[str, ...]] = {
    "woman": ("young", "hungry"), "boy": ("little", "hungry"), "girl": ("little", "hungry"),
    "cook": ("old", "young"), "farmer": ("old", "young"),
    "tourist": ("young",), "guide": ("old", "young"), "player": ("young",),
    "dog": ("little", "big", "black", "white", "hungry"), "cat": ("little", "black", "white", "hungry"),
    "horse": ("big", "black", "white", "old"), "cow": ("big", "black", "white"),
    "rabbit": ("little", "white", "black"),
}
# object -> adjectives it may take
OBJ_ADJ: dict[str, tuple[str, ...]] = {
    "apple": ("red", "green", "big", "small", "fresh"), "bread": ("fresh",), "soup": ("hot",),
    "fish": ("fresh", "big", "small"), "rice": ("hot",), "cheese": ("fresh",), "cake": ("big", "small"),
    "banana": ("big", "small"), "pear": ("green", "big", "small"),
    "museum": ("famous", "large", "old"), "castle": ("old", "famous", "beautiful", "large"),
    "tower": ("old", "famous", "large"), "palace": ("old", "famous", "beautiful", "large"),
    "map": ("new", "large"), "milk": ("fresh",),
    "letter": ("long", "short", "old"), "book": ("new", "old"), "newspaper": ("old",),
    "poem": ("long", "short", "new"), "story": ("long", "short", "new"),
    "match": ("important", "difficult"), "race": ("important", "difficult"),
}
# objects that may be plural (mass nouns and single items stay singular)
PLURAL_OBJ = frozenset({
    "apple", "cake", "banana", "pear", "museum", "castle", "tower", "palace",
    "letter", "book", "newspaper", "poem", "story",
})
# subjects that may be plural (parents and grandparents stay singular)
SINGULAR_ONLY_SUBJ = frozenset({"mother", "father", "grandmother", "grandfather"})

_FOOD_ALL = ("apple", "bread", "soup", "fish", "rice", "cheese", "cake", "banana", "pear")
_FOOD_SHOP = ("apple", "bread", "fish", "rice", "cheese", "cake", "banana", "pear")
_ANIMAL_PLACES = {"dog": ("garden", "field", "forest"), "cat": ("garden",), "horse": ("field", "forest"),
                  "cow": ("field",), "rabbit": ("garden", "field", "forest")}

# topic -> (subjects, {verb: (objects or None, places)}, times)
SCHEMAS: dict[str, tuple[tuple[str, ...], dict[str, tuple[tuple[str, ...] | None, tuple[str, ...]]], tuple]] = {
    "food": (
        ("woman", "boy", "girl", "cook", "farmer"),
        {"eat": (_FOOD_ALL, ("kitchen", "home")), "buy": (_FOOD_SHOP, ("market",)),
         "sell": (_FOOD_SHOP, ("market",)), "cook": (("soup", "fish", "rice"), ("kitchen", "home"))},
        ("morning", "evening", "every_day", "sunday"),
    ),
    "animals": (
        ANIMALS,
        {"sleep": (None, ()), "run": (None, ()), "play": (None, ("garden",)), "drink": (("milk",), ("kitchen", "garden"))},
        ("morning", "evening", "every_day"),
    ),
    "family": (
        ("mother", "father", "grandmother", "grandfather", "brother", "sister", "aunt"),
        {"read": (("letter", "book", "newspaper", "poem", "story"), ("home", "garden")),
         "write": (("letter", "poem", "story"), ("home", "garden"))},
        ("morning", "evening", "every_day", "sunday"),
    ),
    "travel": (
        ("tourist", "guide", "woman", "boy"),
        {"visit": (BUILDINGS, CITIES), "buy": (("map",), CITIES)},
        ("today", "sunday", "morning"),
    ),
    "sport": (
        ("player", "boy", "girl", "woman"),
        {"swim": (None, ("lake",)), "run": (None, ("park", "stadium")), "win": (("match", "race"), ("stadium",))},
        ("morning", "evening", "every_day", "sunday", "today"),
    ),
}
WEATHER_STATES = ("cold", "hot", "sunny", "windy", "rain", "snow")
WEATHER_CITIES = {
    "cold": CITIES, "sunny": CITIES, "windy": CITIES, "rain": CITIES,
    "hot": ("paris", "berlin", "rome", "madrid", "beijing", "delhi"),
    "snow": ("paris", "berlin", "moscow", "beijing"),
}
# Verbs limited to some subjects.
VERB_SUBJECTS = {"play": ("dog", "cat", "rabbit"), "drink": ("dog", "cat")}
# Adjectives that would make an odd sentence with a verb ("writes the old letter", "buys the hot rice")
# or in a topic ("the hungry tourist visits ...").
VERB_OBJ_ADJ_EXCLUDE = {"write": ("old",), "buy": ("hot",), "sell": ("hot",)}
TOPIC_SUBJ_ADJ_EXCLUDE = {"travel": ("hungry",), "sport": ("hungry",)}


def sample_frame(rng: random.Random, topic: str) -> Frame:
    """Draw one grammatical, semantically plausible frame of ``topic``."""
    if topic == "weather":
        state = rng.choice(WEATHER_STATES)
        return Frame(topic, weather=state, place=rng.choice(WEATHER_CITIES[state]),
                     time=rng.choice(("today", "now", None)))
    subjects, verbs, times = SCHEMAS[topic]
    verb = rng.choice(sorted(verbs))
    objs, places = verbs[verb]
    allowed = VERB_SUBJECTS.get(verb)
    subj = rng.choice([s for s in subjects if allowed is None or s in allowed])
    subj_pl = subj not in SINGULAR_ONLY_SUBJ and rng.random() < 0.3
    subj_adj = None
    subj_adjs = [a for a in SUBJ_ADJ.get(subj, ()) if a not in TOPIC_SUBJ_ADJ_EXCLUDE.get(topic, ())]
    if not subj_pl and subj_adjs and rng.random() < 0.4:
        subj_adj = rng.choice(subj_adjs)
    obj = obj_adj = None
    obj_pl = False
    if objs:
        obj = rng.choice(objs)
        obj_pl = obj in PLURAL_OBJ and rng.random() < 0.3
        obj_adjs = [a for a in OBJ_ADJ[obj] if a not in VERB_OBJ_ADJ_EXCLUDE.get(verb, ())]
        if obj_adjs and rng.random() < 0.5:
            obj_adj = rng.choice(obj_adjs)
    if topic == "animals" and verb in ("sleep", "run"):
        places = _ANIMAL_PLACES[subj]
    place = rng.choice(places) if places and rng.random() < 0.75 else None
    time = rng.choice(times) if rng.random() < 0.5 else None
    return Frame(topic, subj, subj_pl, subj_adj, verb, obj, obj_pl, obj_adj, place, time)


def detokenize(tokens: list[Token] | list[str], lang: str, upos: list[str] | None = None) -> str:
    """Join tokens into text by the module's rule (see the module docstring)."""
    if upos is None:
        pairs = list(tokens)  # type: ignore[arg-type]
    else:
        pairs = list(zip(tokens, upos))
    if lang == "zh":
        return "".join(t for t, _ in pairs)
    out = ""
    for tok, tag in pairs:
        if out and tag != "PUNCT":
            out += " "
        out += tok
    return out


def cap(tokens: list[Token]) -> list[Token]:
    """Capitalize the first letter of the first token (for cased scripts)."""
    if not tokens:
        return tokens
    tok, tag = tokens[0]
    return [(tok[:1].upper() + tok[1:], tag)] + tokens[1:]


def realize_svo(f: Frame, np_fn, verbs: dict, weather: dict, places: dict, times: dict) -> list[Token]:
    """Subject-verb-object order with place and time phrases after it (English and French frames):
    the language supplies its noun-phrase builder (agreement) and word tables."""
    if f.weather:
        toks = list(weather[f.weather])
    else:
        toks = np_fn(f.subj, f.subj_pl, f.subj_adj)
        toks.append((verbs[f.verb][1 if f.subj_pl else 0], "VERB"))
        if f.obj:
            toks += np_fn(f.obj, f.obj_pl, f.obj_adj)
    if f.place:
        toks += places[f.place]
    if f.time:
        toks += times[f.time]
    return cap(toks) + [(".", "PUNCT")]
