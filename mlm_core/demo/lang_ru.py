"""Russian: no articles; nominative subject, accusative object; adjectives agree in gender/number/case.

Word order: time - subject - verb - object - place. All objects are inanimate, so the accusative
equals the nominative except for feminine singulars (-у/-ю nouns, -ую/-юю adjectives), which are
listed explicitly. Adjectives are only attached to singular subjects (nominative) and to objects.
"""
from __future__ import annotations

from .lexicon import Frame, Token, cap

# subjects: concept -> (gender, nom sg, nom pl)
SUBJECTS = {
    "woman": ("f", "женщина", "женщины"), "boy": ("m", "мальчик", "мальчики"), "girl": ("f", "девочка", "девочки"),
    "cook": ("m", "повар", "повара"), "farmer": ("m", "фермер", "фермеры"), "tourist": ("m", "турист", "туристы"),
    "guide": ("m", "гид", "гиды"), "player": ("m", "игрок", "игроки"), "mother": ("f", "мама", "мамы"),
    "father": ("m", "папа", "папы"), "grandmother": ("f", "бабушка", "бабушки"),
    "grandfather": ("m", "дедушка", "дедушки"), "brother": ("m", "брат", "братья"),
    "sister": ("f", "сестра", "сёстры"), "aunt": ("f", "тётя", "тёти"), "dog": ("f", "собака", "собаки"),
    "cat": ("f", "кошка", "кошки"), "horse": ("f", "лошадь", "лошади"), "cow": ("f", "корова", "коровы"),
    "rabbit": ("m", "кролик", "кролики"),
}
# objects (inanimate): concept -> (gender, nom sg, acc sg, nom/acc pl)
OBJECTS = {
    "apple": ("n", "яблоко", "яблоко", "яблоки"), "bread": ("m", "хлеб", "хлеб", "хлеба"),
    "soup": ("m", "суп", "суп", "супы"), "fish": ("f", "рыба", "рыбу", "рыбы"), "rice": ("m", "рис", "рис", "рис"),
    "cheese": ("m", "сыр", "сыр", "сыры"), "cake": ("m", "торт", "торт", "торты"),
    "banana": ("m", "банан", "банан", "бананы"), "pear": ("f", "груша", "грушу", "груши"),
    "museum": ("m", "музей", "музей", "музеи"), "castle": ("m", "замок", "замок", "замки"),
    "tower": ("f", "башня", "башню", "башни"), "palace": ("m", "дворец", "дворец", "дворцы"),
    "map": ("f", "карта", "карту", "карты"), "milk": ("n", "молоко", "молоко", "молоко"),
    "letter": ("n", "письмо", "письмо", "письма"), "book": ("f", "книга", "книгу", "книги"),
    "newspaper": ("f", "газета", "газету", "газеты"),
    "poem": ("n", "стихотворение", "стихотворение", "стихотворения"),
    "story": ("m", "рассказ", "рассказ", "рассказы"), "match": ("m", "матч", "матч", "матчи"),
    "race": ("f", "гонка", "гонку", "гонки"),
}
VERBS = {
    "eat": ("ест", "едят"), "buy": ("покупает", "покупают"), "sell": ("продаёт", "продают"),
    "cook": ("готовит", "готовят"), "visit": ("посещает", "посещают"), "sleep": ("спит", "спят"),
    "run": ("бегает", "бегают"), "play": ("играет", "играют"), "drink": ("пьёт", "пьют"),
    "read": ("читает", "читают"), "write": ("пишет", "пишут"), "swim": ("плавает", "плавают"),
    "win": ("выигрывает", "выигрывают"),
}
# concept -> (m nom, f nom, n nom, pl nom, f acc)
ADJ = {
    "old": ("старый", "старая", "старое", "старые", "старую"),
    "young": ("молодой", "молодая", "молодое", "молодые", "молодую"),
    "little": ("маленький", "маленькая", "маленькое", "маленькие", "маленькую"),
    "small": ("маленький", "маленькая", "маленькое", "маленькие", "маленькую"),
    "hungry": ("голодный", "голодная", "голодное", "голодные", "голодную"),
    "black": ("чёрный", "чёрная", "чёрное", "чёрные", "чёрную"),
    "white": ("белый", "белая", "белое", "белые", "белую"),
    "big": ("большой", "большая", "большое", "большие", "большую"),
    "large": ("большой", "большая", "большое", "большие", "большую"),
    "red": ("красный", "красная", "красное", "красные", "красную"),
    "green": ("зелёный", "зелёная", "зелёное", "зелёные", "зелёную"),
    "fresh": ("свежий", "свежая", "свежее", "свежие", "свежую"),
    "hot": ("горячий", "горячая", "горячее", "горячие", "горячую"),
    "famous": ("знаменитый", "знаменитая", "знаменитое", "знаменитые", "знаменитую"),
    "beautiful": ("красивый", "красивая", "красивое", "красивые", "красивую"),
    "new": ("новый", "новая", "новое", "новые", "новую"),
    "long": ("длинный", "длинная", "длинное", "длинные", "длинную"),
    "short": ("короткий", "короткая", "короткое", "короткие", "короткую"),
    "important": ("важный", "важная", "важное", "важные", "важную"),
    "difficult": ("трудный", "трудная", "трудное", "трудные", "трудную"),
}
_ADJ_SLOT = {"m": 0, "f": 1, "n": 2}
# prepositional (locative) forms of the cities
CITY = {"paris": "Париже", "berlin": "Берлине", "rome": "Риме", "madrid": "Мадриде", "moscow": "Москве",
        "beijing": "Пекине", "delhi": "Дели"}
PLACES: dict[str, list[Token]] = {
    "kitchen": [("на", "ADP"), ("кухне", "NOUN")],
    "home": [("дома", "ADV")],
    "market": [("на", "ADP"), ("рынке", "NOUN")],
    "garden": [("в", "ADP"), ("саду", "NOUN")],
    "field": [("в", "ADP"), ("поле", "NOUN")],
    "forest": [("в", "ADP"), ("лесу", "NOUN")],
    "lake": [("в", "ADP"), ("озере", "NOUN")],
    "park": [("в", "ADP"), ("парке", "NOUN")],
    "stadium": [("на", "ADP"), ("стадионе", "NOUN")],
    **{c: [("в", "ADP"), (n, "PROPN")] for c, n in CITY.items()},
}
TIMES: dict[str, list[Token]] = {
    "morning": [("утром", "NOUN")],
    "evening": [("вечером", "NOUN")],
    "every_day": [("каждый", "DET"), ("день", "NOUN")],
    "sunday": [("по", "ADP"), ("воскресеньям", "NOUN")],
    "today": [("сегодня", "ADV")],
    "now": [("сейчас", "ADV")],
}
WEATHER: dict[str, list[Token]] = {
    "cold": [("холодно", "ADV")], "hot": [("жарко", "ADV")], "sunny": [("солнечно", "ADV")],
    "windy": [("ветрено", "ADV")], "rain": [("идёт", "VERB"), ("дождь", "NOUN")],
    "snow": [("идёт", "VERB"), ("снег", "NOUN")],
}


def _subject(f: Frame) -> list[Token]:
    gender, sg, pl = SUBJECTS[f.subj]
    out: list[Token] = []
    if f.subj_adj and not f.subj_pl:
        out.append((ADJ[f.subj_adj][_ADJ_SLOT[gender]], "ADJ"))
    return out + [(pl if f.subj_pl else sg, "NOUN")]


def _object(f: Frame) -> list[Token]:
    gender, _nom, acc, pl = OBJECTS[f.obj]
    out: list[Token] = []
    if f.obj_adj:
        forms = ADJ[f.obj_adj]
        form = forms[3] if f.obj_pl else (forms[4] if gender == "f" else forms[_ADJ_SLOT[gender]])
        out.append((form, "ADJ"))
    return out + [(pl if f.obj_pl else acc, "NOUN")]


def realize(f: Frame) -> list[Token]:
    toks: list[Token] = list(TIMES[f.time]) if f.time else []
    if f.weather:  # Сегодня в Москве холодно.
        if f.place:
            toks += PLACES[f.place]
        toks += WEATHER[f.weather]
        return cap(toks) + [(".", "PUNCT")]
    toks += _subject(f)
    toks.append((VERBS[f.verb][1 if f.subj_pl else 0], "VERB"))
    if f.obj:
        toks += _object(f)
    if f.place:
        toks += PLACES[f.place]
    return cap(toks) + [(".", "PUNCT")]
