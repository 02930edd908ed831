"""German: definite article + weak adjective declension, nominative subject, accusative object.

Word order: subject - verb - object - time - place (verb second). Weather sentences front the time
or the place phrase and invert (``Heute ist es in Berlin kalt.``). Weak adjective endings after the
definite article: nominative singular ``-e``; accusative singular ``-en`` (masculine) or ``-e``;
plural ``-en``. No object noun is a weak masculine, so accusative nouns equal nominative ones.
``im``/``am`` (in/an + dem) are single ADP tokens, as in UD German-HDT.
"""
from __future__ import annotations

from .lexicon import Frame, Token, cap

# concept -> (gender, singular, plural)
NOUNS = {
    "woman": ("f", "Frau", "Frauen"), "boy": ("m", "Junge", "Jungen"), "girl": ("n", "Mädchen", "Mädchen"),
    "cook": ("m", "Koch", "Köche"), "farmer": ("m", "Bauer", "Bauern"), "tourist": ("m", "Tourist", "Touristen"),
    "guide": ("m", "Reiseleiter", "Reiseleiter"), "player": ("m", "Spieler", "Spieler"),
    "mother": ("f", "Mutter", "Mütter"), "father": ("m", "Vater", "Väter"),
    "grandmother": ("f", "Großmutter", "Großmütter"), "grandfather": ("m", "Großvater", "Großväter"),
    "brother": ("m", "Bruder", "Brüder"), "sister": ("f", "Schwester", "Schwestern"),
    "aunt": ("f", "Tante", "Tanten"), "dog": ("m", "Hund", "Hunde"), "cat": ("f", "Katze", "Katzen"),
    "horse": ("n", "Pferd", "Pferde"), "cow": ("f", "Kuh", "Kühe"), "rabbit": ("n", "Kaninchen", "Kaninchen"),
    "apple": ("m", "Apfel", "Äpfel"), "bread": ("n", "Brot", "Brote"), "soup": ("f", "Suppe", "Suppen"),
    "fish": ("m", "Fisch", "Fische"), "rice": ("m", "Reis", "Reis"), "cheese": ("m", "Käse", "Käse"),
    "cake": ("m", "Kuchen", "Kuchen"), "banana": ("f", "Banane", "Bananen"), "pear": ("f", "Birne", "Birnen"),
    "museum": ("n", "Museum", "Museen"), "castle": ("n", "Schloss", "Schlösser"), "tower": ("m", "Turm", "Türme"),
    "palace": ("m", "Palast", "Paläste"), "map": ("f", "Landkarte", "Landkarten"), "milk": ("f", "Milch", "Milch"),
    "letter": ("m", "Brief", "Briefe"), "book": ("n", "Buch", "Bücher"), "newspaper": ("f", "Zeitung", "Zeitungen"),
    "poem": ("n", "Gedicht", "Gedichte"), "story": ("f", "Geschichte", "Geschichten"),
    "match": ("n", "Spiel", "Spiele"), "race": ("n", "Rennen", "Rennen"),
}
VERBS = {
    "eat": ("isst", "essen"), "buy": ("kauft", "kaufen"), "sell": ("verkauft", "verkaufen"),
    "cook": ("kocht", "kochen"), "visit": ("besucht", "besuchen"), "sleep": ("schläft", "schlafen"),
    "run": ("läuft", "laufen"), "play": ("spielt", "spielen"), "drink": ("trinkt", "trinken"),
    "read": ("liest", "lesen"), "write": ("schreibt", "schreiben"), "swim": ("schwimmt", "schwimmen"),
    "win": ("gewinnt", "gewinnen"),
}
# concept -> adjective stem (stem + "e" / stem + "en")
ADJ = {
    "old": "alt", "young": "jung", "little": "klein", "small": "klein", "hungry": "hungrig",
    "black": "schwarz", "white": "weiß", "big": "groß", "large": "groß", "red": "rot", "green": "grün",
    "fresh": "frisch", "hot": "heiß", "famous": "berühmt", "beautiful": "schön", "new": "neu",
    "long": "lang", "short": "kurz", "important": "wichtig", "difficult": "schwierig",
}
ART = {"nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
       "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"}}
CITY = {"paris": "Paris", "berlin": "Berlin", "rome": "Rom", "madrid": "Madrid", "moscow": "Moskau",
        "beijing": "Peking", "delhi": "Delhi"}
PLACES: dict[str, list[Token]] = {
    "kitchen": [("in", "ADP"), ("der", "DET"), ("Küche", "NOUN")],
    "home": [("zu", "ADP"), ("Hause", "NOUN")],
    "market": [("auf", "ADP"), ("dem", "DET"), ("Markt", "NOUN")],
    "garden": [("im", "ADP"), ("Garten", "NOUN")],
    "field": [("auf", "ADP"), ("dem", "DET"), ("Feld", "NOUN")],
    "forest": [("im", "ADP"), ("Wald", "NOUN")],
    "lake": [("im", "ADP"), ("See", "NOUN")],
    "park": [("im", "ADP"), ("Park", "NOUN")],
    "stadium": [("im", "ADP"), ("Stadion", "NOUN")],
    **{c: [("in", "ADP"), (n, "PROPN")] for c, n in CITY.items()},
}
TIMES: dict[str, list[Token]] = {
    "morning": [("am", "ADP"), ("Morgen", "NOUN")],
    "evening": [("am", "ADP"), ("Abend", "NOUN")],
    "every_day": [("jeden", "DET"), ("Tag", "NOUN")],
    "sunday": [("am", "ADP"), ("Sonntag", "NOUN")],
    "today": [("heute", "ADV")],
    "now": [("jetzt", "ADV")],
}
# weather: (finite verb, predicate after the place or None)
WEATHER: dict[str, tuple[Token, Token | None]] = {
    "cold": (("ist", "AUX"), ("kalt", "ADJ")),
    "hot": (("ist", "AUX"), ("heiß", "ADJ")),
    "sunny": (("ist", "AUX"), ("sonnig", "ADJ")),
    "windy": (("ist", "AUX"), ("windig", "ADJ")),
    "rain": (("regnet", "VERB"), None),
    "snow": (("schneit", "VERB"), None),
}


def _np(noun: str, pl: bool, adj: str | None, case: str) -> list[Token]:
    gender, sg, plural = NOUNS[noun]
    key = "pl" if pl else gender
    out: list[Token] = [(ART[case][key], "DET")]
    if adj:
        weak_en = pl or (case == "acc" and gender == "m")
        out.append((ADJ[adj] + ("en" if weak_en else "e"), "ADJ"))
    out.append((plural if pl else sg, "NOUN"))
    return out


def realize(f: Frame) -> list[Token]:
    if f.weather:
        verb, pred = WEATHER[f.weather]
        place = PLACES[f.place] if f.place else []
        if f.time:  # Heute ist es in Berlin kalt.
            toks = TIMES[f.time] + [verb, ("es", "PRON")] + place
        elif place:  # In Berlin ist es kalt.
            toks = place + [verb, ("es", "PRON")]
        else:  # Es ist kalt.
            toks = [("es", "PRON"), verb]
        if pred:
            toks.append(pred)
        return cap(toks) + [(".", "PUNCT")]
    toks = _np(f.subj, f.subj_pl, f.subj_adj, "nom")
    toks.append((VERBS[f.verb][1 if f.subj_pl else 0], "VERB"))
    if f.obj:
        toks += _np(f.obj, f.obj_pl, f.obj_adj, "acc")
    if f.time:
        toks += TIMES[f.time]
    if f.place:
        toks += PLACES[f.place]
    return cap(toks) + [(".", "PUNCT")]
