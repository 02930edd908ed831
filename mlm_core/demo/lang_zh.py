"""Mandarin Chinese (simplified): time - subject - 在 place (localizer) - verb - object, no spaces.

Number is not marked (plural frames read like singular ones, as in natural Chinese). Monosyllabic
adjectives attach directly (红苹果, 小狗); disyllabic ones take 的 (PART): 新鲜的面包. Prepositional
在 and the localizers 里/上 are ADP, following UD Chinese-GSD. No measure words are used. "Old" is
老 for people and animals, 古老的 for buildings and 旧 for other things; "run" is 跑步 for people and
跑来跑去 ("run around") for animals.
"""
from __future__ import annotations

from .lexicon import ANIMALS, BUILDINGS, Frame, Token

NOUNS = {
    "woman": "女人", "boy": "男孩", "girl": "女孩", "cook": "厨师", "farmer": "农民", "tourist": "游客",
    "guide": "导游", "player": "运动员", "mother": "妈妈", "father": "爸爸", "grandmother": "奶奶",
    "grandfather": "爷爷", "brother": "哥哥", "sister": "姐姐", "aunt": "阿姨", "dog": "狗", "cat": "猫",
    "horse": "马", "cow": "牛", "rabbit": "兔子", "apple": "苹果", "bread": "面包", "soup": "汤",
    "fish": "鱼", "rice": "米饭", "cheese": "奶酪", "cake": "蛋糕", "banana": "香蕉", "pear": "梨",
    "museum": "博物馆", "castle": "城堡", "tower": "塔", "palace": "宫殿", "map": "地图", "milk": "牛奶",
    "letter": "信", "book": "书", "newspaper": "报纸", "poem": "诗", "story": "故事", "match": "比赛",
    "race": "赛跑",
}
VERBS = {
    "eat": "吃", "buy": "买", "sell": "卖", "cook": "做", "visit": "参观", "sleep": "睡觉", "run": "跑步",
    "play": "玩", "drink": "喝", "read": "读", "write": "写", "swim": "游泳", "win": "赢得",
}
_DE = ("的", "PART")
ADJ: dict[str, list[Token]] = {
    "young": [("年轻", "ADJ"), _DE], "little": [("小", "ADJ")], "small": [("小", "ADJ")],
    "hungry": [("饥饿", "ADJ"), _DE], "black": [("黑", "ADJ")], "white": [("白", "ADJ")],
    "big": [("大", "ADJ")], "large": [("大", "ADJ")], "red": [("红", "ADJ")], "green": [("青", "ADJ")],
    "fresh": [("新鲜", "ADJ"), _DE], "hot": [("热", "ADJ")], "famous": [("著名", "ADJ"), _DE],
    "beautiful": [("美丽", "ADJ"), _DE], "new": [("新", "ADJ")],
    "long": [("很", "ADV"), ("长", "ADJ"), _DE], "short": [("很", "ADV"), ("短", "ADJ"), _DE],
    "important": [("重要", "ADJ"), _DE], "difficult": [("艰难", "ADJ"), _DE],
}
_AT = ("在", "ADP")
_IN = ("里", "ADP")
CITY = {"paris": "巴黎", "berlin": "柏林", "rome": "罗马", "madrid": "马德里", "moscow": "莫斯科",
        "beijing": "北京", "delhi": "德里"}
PLACES: dict[str, list[Token]] = {
    "kitchen": [_AT, ("厨房", "NOUN"), _IN], "home": [_AT, ("家", "NOUN"), _IN],
    "market": [_AT, ("市场", "NOUN"), ("上", "ADP")], "garden": [_AT, ("花园", "NOUN"), _IN],
    "field": [_AT, ("田", "NOUN"), _IN], "forest": [_AT, ("森林", "NOUN"), _IN],
    "lake": [_AT, ("湖", "NOUN"), _IN], "park": [_AT, ("公园", "NOUN"), _IN],
    "stadium": [_AT, ("体育场", "NOUN")],
    **{c: [_AT, (n, "PROPN")] for c, n in CITY.items()},
}
TIMES: dict[str, list[Token]] = {
    "morning": [("早上", "NOUN")], "evening": [("晚上", "NOUN")],
    "every_day": [("每", "DET"), ("天", "NOUN")], "sunday": [("星期天", "NOUN")],
    "today": [("今天", "NOUN")], "now": [("现在", "NOUN")],
}
WEATHER: dict[str, list[Token]] = {
    "cold": [("很", "ADV"), ("冷", "ADJ")], "hot": [("很", "ADV"), ("热", "ADJ")],
    "sunny": [("天气", "NOUN"), ("晴朗", "ADJ")], "windy": [("刮风", "VERB")],
    "rain": [("下雨", "VERB")], "snow": [("下雪", "VERB")],
}


def _adj(adj: str, noun: str) -> list[Token]:
    if adj == "old":
        if noun in ANIMALS or noun in ("cook", "farmer", "guide"):  # people and animals
            return [("老", "ADJ")]
        return [("古老", "ADJ"), _DE] if noun in BUILDINGS else [("旧", "ADJ")]
    return ADJ[adj]


def _np(noun: str, adj: str | None) -> list[Token]:
    return (_adj(adj, noun) if adj else []) + [(NOUNS[noun], "NOUN")]


def realize(f: Frame) -> list[Token]:
    toks: list[Token] = list(TIMES[f.time]) if f.time else []
    if f.weather:  # 今天北京很冷。
        if f.place:
            toks.append(PLACES[f.place][-1])  # the bare city name, used as topic
        toks += WEATHER[f.weather]
        return toks + [("。", "PUNCT")]
    toks += _np(f.subj, f.subj_adj if not f.subj_pl else None)
    if f.place:
        toks += PLACES[f.place]
    verb = "跑来跑去" if f.verb == "run" and f.subj in ANIMALS else VERBS[f.verb]
    toks.append((verb, "VERB"))
    if f.obj:
        toks += _np(f.obj, f.obj_adj)
    return toks + [("。", "PUNCT")]
