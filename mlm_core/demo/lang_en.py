"""English: definite noun phrases, adjective before the noun, -s agreement in the verb."""
from __future__ import annotations

from .lexicon import Frame, Token, realize_svo

# concept -> (singular, plural)
NOUNS = {
    "woman": ("woman", "women"), "boy": ("boy", "boys"), "girl": ("girl", "girls"),
    "cook": ("cook", "cooks"), "farmer": ("farmer", "farmers"), "tourist": ("tourist", "tourists"),
    "guide": ("guide", "guides"), "player": ("player", "players"),
    "mother": ("mother", "mothers"), "father": ("father", "fathers"),
    "grandmother": ("grandmother", "grandmothers"), "grandfather": ("grandfather", "grandfathers"),
    "brother": ("brother", "brothers"), "sister": ("sister", "sisters"), "aunt": ("aunt", "aunts"),
    "dog": ("dog", "dogs"), "cat": ("cat", "cats"), "horse": ("horse", "horses"), "cow": ("cow", "cows"),
    "rabbit": ("rabbit", "rabbits"),
    "apple": ("apple", "apples"), "bread": ("bread", "bread"), "soup": ("soup", "soup"),
    "fish": ("fish", "fish"), "rice": ("rice", "rice"), "cheese": ("cheese", "cheese"),
    "cake": ("cake", "cakes"), "banana": ("banana", "bananas"), "pear": ("pear", "pears"),
    "museum": ("museum", "museums"), "castle": ("castle", "castles"), "tower": ("tower", "towers"),
    "palace": ("palace", "palaces"), "map": ("map", "maps"), "milk": ("milk", "milk"),
    "letter": ("letter", "letters"), "book": ("book", "books"), "newspaper": ("newspaper", "newspapers"),
    "poem": ("poem", "poems"), "story": ("story", "stories"), "match": ("match", "matches"),
    "race": ("race", "races"),
}
# concept -> (3rd person singular, 3rd person plural)
VERBS = {
    "eat": ("eats", "eat"), "buy": ("buys", "buy"), "sell": ("sells", "sell"), "cook": ("cooks", "cook"),
    "visit": ("visits", "visit"), "sleep": ("sleeps", "sleep"), "run": ("runs", "run"),
    "play": ("plays", "play"), "drink": ("drinks", "drink"), "read": ("reads", "read"),
    "write": ("writes", "write"), "swim": ("swims", "swim"), "win": ("wins", "win"),
}
ADJ = {
    "old": "old", "young": "young", "little": "little", "hungry": "hungry", "black": "black",
    "white": "white", "big": "big", "red": "red", "green": "green", "small": "small", "fresh": "fresh",
    "hot": "hot", "famous": "famous", "beautiful": "beautiful", "new": "new", "long": "long",
    "short": "short", "important": "important", "difficult": "difficult", "large": "big",
}
CITY = {"paris": "Paris", "berlin": "Berlin", "rome": "Rome", "madrid": "Madrid", "moscow": "Moscow",
        "beijing": "Beijing", "delhi": "Delhi"}
PLACES: dict[str, list[Token]] = {
    "kitchen": [("in", "ADP"), ("the", "DET"), ("kitchen", "NOUN")],
    "home": [("at", "ADP"), ("home", "NOUN")],
    "market": [("at", "ADP"), ("the", "DET"), ("market", "NOUN")],
    "garden": [("in", "ADP"), ("the", "DET"), ("garden", "NOUN")],
    "field": [("in", "ADP"), ("the", "DET"), ("field", "NOUN")],
    "forest": [("in", "ADP"), ("the", "DET"), ("forest", "NOUN")],
    "lake": [("in", "ADP"), ("the", "DET"), ("lake", "NOUN")],
    "park": [("in", "ADP"), ("the", "DET"), ("park", "NOUN")],
    "stadium": [("at", "ADP"), ("the", "DET"), ("stadium", "NOUN")],
    **{c: [("in", "ADP"), (n, "PROPN")] for c, n in CITY.items()},
}
TIMES: dict[str, list[Token]] = {
    "morning": [("in", "ADP"), ("the", "DET"), ("morning", "NOUN")],
    "evening": [("in", "ADP"), ("the", "DET"), ("evening", "NOUN")],
    "every_day": [("every", "DET"), ("day", "NOUN")],
    "sunday": [("on", "ADP"), ("Sundays", "PROPN")],
    "today": [("today", "NOUN")],
    "now": [("now", "ADV")],
}
WEATHER: dict[str, list[Token]] = {
    "cold": [("it", "PRON"), ("is", "AUX"), ("cold", "ADJ")],
    "hot": [("it", "PRON"), ("is", "AUX"), ("hot", "ADJ")],
    "sunny": [("it", "PRON"), ("is", "AUX"), ("sunny", "ADJ")],
    "windy": [("it", "PRON"), ("is", "AUX"), ("windy", "ADJ")],
    "rain": [("it", "PRON"), ("is", "AUX"), ("raining", "VERB")],
    "snow": [("it", "PRON"), ("is", "AUX"), ("snowing", "VERB")],
}


def _np(noun: str, pl: bool, adj: str | None) -> list[Token]:
    out: list[Token] = [("the", "DET")]
    if adj:
        out.append((ADJ[adj], "ADJ"))
    out.append((NOUNS[noun][1 if pl else 0], "NOUN"))
    return out


def realize(f: Frame) -> list[Token]:
    return realize_svo(f, _np, VERBS, WEATHER, PLACES, TIMES)
