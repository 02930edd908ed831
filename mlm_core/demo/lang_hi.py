"""Hindi: SOV with postpositions (ADP), habitual present = participle (-ता/-ती/-ते) + है/हैं.

Order: time - subject - place - object - verb - auxiliary. The participle agrees with the subject in
gender and number (the direct object carries no को since all objects are inanimate). Parents,
grandparents and aunts take the honorific plural agreement (पढ़ती हैं, पढ़ते हैं) also in the
singular. Inflecting adjectives list masculine singular / feminine / masculine plural forms;
invariable ones list the same form three times. "Old" is बूढ़ा for people and animals, पुराना for
things. Sentences end with the danda (।) attached to the last word.
"""
from __future__ import annotations

from .lexicon import Frame, Token

# concept -> (gender, singular, plural, honorific)
NOUNS = {
    "woman": ("f", "औरत", "औरतें", False), "boy": ("m", "लड़का", "लड़के", False),
    "girl": ("f", "लड़की", "लड़कियाँ", False), "cook": ("m", "रसोइया", "रसोइये", False),
    "farmer": ("m", "किसान", "किसान", False), "tourist": ("m", "पर्यटक", "पर्यटक", False),
    "guide": ("m", "गाइड", "गाइड", False), "player": ("m", "खिलाड़ी", "खिलाड़ी", False),
    "mother": ("f", "माँ", "माँएँ", True), "father": ("m", "पिता", "पिता", True),
    "grandmother": ("f", "दादी", "दादियाँ", True), "grandfather": ("m", "दादा", "दादा", True),
    "brother": ("m", "भाई", "भाई", False), "sister": ("f", "बहन", "बहनें", False),
    "aunt": ("f", "मौसी", "मौसियाँ", True),
    "dog": ("m", "कुत्ता", "कुत्ते", False), "cat": ("f", "बिल्ली", "बिल्लियाँ", False),
    "horse": ("m", "घोड़ा", "घोड़े", False), "cow": ("f", "गाय", "गायें", False),
    "rabbit": ("m", "खरगोश", "खरगोश", False),
    "apple": ("m", "सेब", "सेब", False), "bread": ("f", "रोटी", "रोटियाँ", False),
    "soup": ("m", "सूप", "सूप", False), "fish": ("f", "मछली", "मछलियाँ", False),
    "rice": ("m", "चावल", "चावल", False), "cheese": ("m", "पनीर", "पनीर", False),
    "cake": ("m", "केक", "केक", False), "banana": ("m", "केला", "केले", False),
    "pear": ("f", "नाशपाती", "नाशपातियाँ", False), "museum": ("m", "संग्रहालय", "संग्रहालय", False),
    "castle": ("m", "किला", "किले", False), "tower": ("f", "मीनार", "मीनारें", False),
    "palace": ("m", "महल", "महल", False), "map": ("m", "नक्शा", "नक्शे", False),
    "milk": ("m", "दूध", "दूध", False), "letter": ("f", "चिट्ठी", "चिट्ठियाँ", False),
    "book": ("f", "किताब", "किताबें", False), "newspaper": ("m", "अख़बार", "अख़बार", False),
    "poem": ("f", "कविता", "कविताएँ", False), "story": ("f", "कहानी", "कहानियाँ", False),
    "match": ("m", "मैच", "मैच", False), "race": ("f", "दौड़", "दौड़ें", False),
}
# concept -> verb stem; the participle is stem + ता/ती/ते
STEMS = {
    "eat": "खा", "buy": "खरीद", "sell": "बेच", "cook": "पका", "sleep": "सो", "run": "दौड़",
    "play": "खेल", "drink": "पी", "read": "पढ़", "write": "लिख", "swim": "तैर", "win": "जीत",
}
# "visit" = "goes to see": देखने जाता है
# concept -> (masc sg, fem, masc pl)
ADJ = {
    "young": ("जवान",) * 3, "little": ("छोटा", "छोटी", "छोटे"), "small": ("छोटा", "छोटी", "छोटे"),
    "hungry": ("भूखा", "भूखी", "भूखे"), "black": ("काला", "काली", "काले"), "white": ("सफ़ेद",) * 3,
    "big": ("बड़ा", "बड़ी", "बड़े"), "large": ("बड़ा", "बड़ी", "बड़े"), "red": ("लाल",) * 3,
    "green": ("हरा", "हरी", "हरे"), "fresh": ("ताज़ा", "ताज़ी", "ताज़े"), "hot": ("गरम",) * 3,
    "famous": ("प्रसिद्ध",) * 3, "beautiful": ("सुंदर",) * 3, "new": ("नया", "नई", "नए"),
    "long": ("लंबा", "लंबी", "लंबे"), "short": ("छोटा", "छोटी", "छोटे"),
    "important": ("महत्वपूर्ण",) * 3, "difficult": ("कठिन",) * 3,
}
OLD_ANIMATE = ("बूढ़ा", "बूढ़ी", "बूढ़े")
OLD_THING = ("पुराना", "पुरानी", "पुराने")
CITY = {"paris": "पेरिस", "berlin": "बर्लिन", "rome": "रोम", "madrid": "मैड्रिड", "moscow": "मॉस्को",
        "beijing": "बीजिंग", "delhi": "दिल्ली"}
_IN = ("में", "ADP")
PLACES: dict[str, list[Token]] = {
    "kitchen": [("रसोई", "NOUN"), _IN], "home": [("घर", "NOUN"), ("पर", "ADP")],
    "market": [("बाज़ार", "NOUN"), _IN], "garden": [("बगीचे", "NOUN"), _IN],
    "field": [("खेत", "NOUN"), _IN], "forest": [("जंगल", "NOUN"), _IN], "lake": [("झील", "NOUN"), _IN],
    "park": [("पार्क", "NOUN"), _IN], "stadium": [("स्टेडियम", "NOUN"), _IN],
    **{c: [(n, "PROPN"), _IN] for c, n in CITY.items()},
}
TIMES: dict[str, list[Token]] = {
    "morning": [("सुबह", "NOUN")], "evening": [("शाम", "NOUN"), ("को", "ADP")],
    "every_day": [("हर", "DET"), ("दिन", "NOUN")], "sunday": [("रविवार", "PROPN"), ("को", "ADP")],
    "today": [("आज", "ADV")], "now": [("अभी", "ADV")],
}
WEATHER: dict[str, list[Token]] = {
    "cold": [("ठंड", "NOUN"), ("है", "AUX")], "hot": [("गर्मी", "NOUN"), ("है", "AUX")],
    "sunny": [("धूप", "NOUN"), ("है", "AUX")],
    "windy": [("तेज़", "ADJ"), ("हवा", "NOUN"), ("चल", "VERB"), ("रही", "AUX"), ("है", "AUX")],
    "rain": [("बारिश", "NOUN"), ("हो", "VERB"), ("रही", "AUX"), ("है", "AUX")],
    "snow": [("बर्फ़", "NOUN"), ("गिर", "VERB"), ("रही", "AUX"), ("है", "AUX")],
}


def _np(noun: str, pl: bool, adj: str | None, animate: bool) -> list[Token]:
    gender, sg, plural, _hon = NOUNS[noun]
    out: list[Token] = []
    if adj:
        forms = (OLD_ANIMATE if animate else OLD_THING) if adj == "old" else ADJ[adj]
        out.append((forms[1] if gender == "f" else (forms[2] if pl else forms[0]), "ADJ"))
    return out + [(plural if pl else sg, "NOUN")]


def _verb(f: Frame) -> list[Token]:
    gender, _sg, _pl, hon = NOUNS[f.subj]
    plural = f.subj_pl or hon
    suffix = "ती" if gender == "f" else ("ते" if plural else "ता")
    aux = ("हैं" if plural else "है", "AUX")
    if f.verb == "visit":
        return [("देखने", "VERB"), ("जा" + suffix, "VERB"), aux]
    return [(STEMS[f.verb] + suffix, "VERB"), aux]


def realize(f: Frame) -> list[Token]:
    toks: list[Token] = list(TIMES[f.time]) if f.time else []
    if f.weather:  # आज दिल्ली में ठंड है।
        if f.place:
            toks += PLACES[f.place]
        toks += WEATHER[f.weather]
        return toks + [("।", "PUNCT")]
    toks += _np(f.subj, f.subj_pl, f.subj_adj, animate=True)
    if f.place:
        toks += PLACES[f.place]
    if f.obj:
        toks += _np(f.obj, f.obj_pl, f.obj_adj, animate=False)
    return toks + _verb(f) + [("।", "PUNCT")]
