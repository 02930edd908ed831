"""Modern Standard Arabic: SVO nominal-first order, definite nouns (the article ال is part of the word).

Agreement: a verb after its subject agrees fully: masculine/feminine singular, masculine plural
(human), feminine plural (human). Non-human plurals take feminine singular agreement (verb and
adjective); collective nouns (التفاح, الموز, ...) take masculine singular agreement. Each noun lists
its singular gender, its plural and that plural's agreement class. Adjectives are listed with the
article in masculine and feminine singular forms, so no broken adjective plurals are needed (no
adjective is attached to a plural subject). Only free-standing prepositions (في) are used, so no
clitic has to be split off. "Old" is عجوز for people and animals, قديم for things.
"""
from __future__ import annotations

from .lexicon import Frame, Token

# concept -> (singular, gender, plural, plural agreement: ms | fs | mp | fp)
NOUNS = {
    "woman": ("المرأة", "f", "النساء", "fp"), "boy": ("الولد", "m", "الأولاد", "mp"),
    "girl": ("البنت", "f", "البنات", "fp"), "cook": ("الطباخ", "m", "الطباخون", "mp"),
    "farmer": ("المزارع", "m", "المزارعون", "mp"), "tourist": ("السائح", "m", "السياح", "mp"),
    "guide": ("المرشد", "m", "المرشدون", "mp"), "player": ("اللاعب", "m", "اللاعبون", "mp"),
    "mother": ("الأم", "f", "الأمهات", "fp"), "father": ("الأب", "m", "الآباء", "mp"),
    "grandmother": ("الجدة", "f", "الجدات", "fp"), "grandfather": ("الجد", "m", "الأجداد", "mp"),
    "brother": ("الأخ", "m", "الإخوة", "mp"), "sister": ("الأخت", "f", "الأخوات", "fp"),
    "aunt": ("العمة", "f", "العمات", "fp"),
    "dog": ("الكلب", "m", "الكلاب", "fs"), "cat": ("القطة", "f", "القطط", "fs"),
    "horse": ("الحصان", "m", "الخيول", "fs"), "cow": ("البقرة", "f", "الأبقار", "fs"),
    "rabbit": ("الأرنب", "m", "الأرانب", "fs"),
    "apple": ("التفاحة", "f", "التفاح", "ms"), "bread": ("الخبز", "m", "الخبز", "ms"),
    "soup": ("الحساء", "m", "الحساء", "ms"), "fish": ("السمك", "m", "السمك", "ms"),
    "rice": ("الأرز", "m", "الأرز", "ms"), "cheese": ("الجبن", "m", "الجبن", "ms"),
    "cake": ("الكعكة", "f", "الكعك", "ms"), "banana": ("الموزة", "f", "الموز", "ms"),
    "pear": ("الإجاصة", "f", "الإجاص", "ms"),
    "museum": ("المتحف", "m", "المتاحف", "fs"), "castle": ("القلعة", "f", "القلاع", "fs"),
    "tower": ("البرج", "m", "الأبراج", "fs"), "palace": ("القصر", "m", "القصور", "fs"),
    "map": ("الخريطة", "f", "الخرائط", "fs"), "milk": ("الحليب", "m", "الحليب", "ms"),
    "letter": ("الرسالة", "f", "الرسائل", "fs"), "book": ("الكتاب", "m", "الكتب", "fs"),
    "newspaper": ("الجريدة", "f", "الجرائد", "fs"), "poem": ("القصيدة", "f", "القصائد", "fs"),
    "story": ("القصة", "f", "القصص", "fs"), "match": ("المباراة", "f", "المباريات", "fs"),
    "race": ("السباق", "m", "السباقات", "fs"),
}
# concept -> (3ms, 3fs, 3mp, 3fp) imperfective indicative
VERBS = {
    "eat": ("يأكل", "تأكل", "يأكلون", "يأكلن"), "buy": ("يشتري", "تشتري", "يشترون", "يشترين"),
    "sell": ("يبيع", "تبيع", "يبيعون", "يبعن"), "cook": ("يطبخ", "تطبخ", "يطبخون", "يطبخن"),
    "visit": ("يزور", "تزور", "يزورون", "يزرن"), "sleep": ("ينام", "تنام", "ينامون", "ينمن"),
    "run": ("يركض", "تركض", "يركضون", "يركضن"), "play": ("يلعب", "تلعب", "يلعبون", "يلعبن"),
    "drink": ("يشرب", "تشرب", "يشربون", "يشربن"), "read": ("يقرأ", "تقرأ", "يقرؤون", "يقرأن"),
    "write": ("يكتب", "تكتب", "يكتبون", "يكتبن"), "swim": ("يسبح", "تسبح", "يسبحون", "يسبحن"),
    "win": ("يربح", "تربح", "يربحون", "يربحن"),
}
_VSLOT = {"ms": 0, "fs": 1, "mp": 2, "fp": 3}
# concept -> (masculine, feminine), definite
ADJ = {
    "young": ("الشاب", "الشابة"), "little": ("الصغير", "الصغيرة"), "small": ("الصغير", "الصغيرة"),
    "hungry": ("الجائع", "الجائعة"), "black": ("الأسود", "السوداء"), "white": ("الأبيض", "البيضاء"),
    "big": ("الكبير", "الكبيرة"), "large": ("الكبير", "الكبيرة"), "red": ("الأحمر", "الحمراء"),
    "green": ("الأخضر", "الخضراء"), "fresh": ("الطازج", "الطازجة"), "hot": ("الساخن", "الساخنة"),
    "famous": ("الشهير", "الشهيرة"), "beautiful": ("الجميل", "الجميلة"), "new": ("الجديد", "الجديدة"),
    "long": ("الطويل", "الطويلة"), "short": ("القصير", "القصيرة"), "important": ("المهم", "المهمة"),
    "difficult": ("الصعب", "الصعبة"),
}
OLD_ANIMATE = ("العجوز", "العجوز")
OLD_THING = ("القديم", "القديمة")
CITY = {"paris": "باريس", "berlin": "برلين", "rome": "روما", "madrid": "مدريد", "moscow": "موسكو",
        "beijing": "بكين", "delhi": "دلهي"}
_IN = ("في", "ADP")
PLACES: dict[str, list[Token]] = {
    "kitchen": [_IN, ("المطبخ", "NOUN")], "home": [_IN, ("البيت", "NOUN")],
    "market": [_IN, ("السوق", "NOUN")], "garden": [_IN, ("الحديقة", "NOUN")],
    "field": [_IN, ("الحقل", "NOUN")], "forest": [_IN, ("الغابة", "NOUN")],
    "lake": [_IN, ("البحيرة", "NOUN")], "park": [_IN, ("المنتزه", "NOUN")],
    "stadium": [_IN, ("الملعب", "NOUN")],
    **{c: [_IN, (n, "PROPN")] for c, n in CITY.items()},
}
TIMES: dict[str, list[Token]] = {
    "morning": [_IN, ("الصباح", "NOUN")], "evening": [_IN, ("المساء", "NOUN")],
    "every_day": [("كل", "DET"), ("يوم", "NOUN")], "sunday": [("يوم", "NOUN"), ("الأحد", "NOUN")],
    "today": [("اليوم", "NOUN")], "now": [("الآن", "ADV")],
}
WEATHER: dict[str, list[Token]] = {
    "cold": [("الجو", "NOUN"), ("بارد", "ADJ")], "hot": [("الجو", "NOUN"), ("حار", "ADJ")],
    "sunny": [("الجو", "NOUN"), ("مشمس", "ADJ")], "windy": [("الرياح", "NOUN"), ("قوية", "ADJ")],
    "rain": [("السماء", "NOUN"), ("تمطر", "VERB")], "snow": [("الثلج", "NOUN"), ("يتساقط", "VERB")],
}


def _agr(noun: str, pl: bool) -> str:
    sg, gender, _plural, pl_agr = NOUNS[noun]
    return pl_agr if pl else gender + "s"


def _np(noun: str, pl: bool, adj: str | None, animate: bool) -> list[Token]:
    sg, _gender, plural, _ = NOUNS[noun]
    out: list[Token] = [(plural if pl else sg, "NOUN")]
    if adj:
        agr = _agr(noun, pl)
        if agr not in ("ms", "fs"):  # never generated: no adjectives on human plurals
            raise ValueError(f"no adjective form for {noun} plural")
        forms = (OLD_ANIMATE if animate else OLD_THING) if adj == "old" else ADJ[adj]
        out.append((forms[0 if agr == "ms" else 1], "ADJ"))
    return out


def realize(f: Frame) -> list[Token]:
    if f.weather:  # الجو بارد في موسكو اليوم.
        toks = list(WEATHER[f.weather])
    else:
        toks = _np(f.subj, f.subj_pl, f.subj_adj, animate=True)
        toks.append((VERBS[f.verb][_VSLOT[_agr(f.subj, f.subj_pl)]], "VERB"))
        if f.obj:
            toks += _np(f.obj, f.obj_pl, f.obj_adj, animate=False)
    if f.place:
        toks += PLACES[f.place]
    if f.time:
        toks += TIMES[f.time]
    return toks + [(".", "PUNCT")]
