"""French: le/la/les + noun, adjectives agree in gender and number and sit before or after the noun.

Every noun and pre-nominal adjective used in generated sentences starts with a consonant, so no
elision (l') or contraction (au, du) is ever needed; place phrases use non-contracting
prepositions (dans, sur, à la, à + city).
"""
from __future__ import annotations

from .lexicon import Frame, Token, realize_svo

# concept -> (gender, singular, plural)
NOUNS = {
    "woman": ("f", "femme", "femmes"), "boy": ("m", "garçon", "garçons"), "girl": ("f", "fille", "filles"),
    "cook": ("m", "cuisinier", "cuisiniers"), "farmer": ("m", "fermier", "fermiers"),
    "tourist": ("m", "touriste", "touristes"), "guide": ("m", "guide", "guides"),
    "player": ("m", "joueur", "joueurs"), "mother": ("f", "mère", "mères"), "father": ("m", "père", "pères"),
    "grandmother": ("f", "grand-mère", "grands-mères"), "grandfather": ("m", "grand-père", "grands-pères"),
    "brother": ("m", "frère", "frères"), "sister": ("f", "sœur", "sœurs"), "aunt": ("f", "tante", "tantes"),
    "dog": ("m", "chien", "chiens"), "cat": ("m", "chat", "chats"), "horse": ("m", "cheval", "chevaux"),
    "cow": ("f", "vache", "vaches"), "rabbit": ("m", "lapin", "lapins"),
    "apple": ("f", "pomme", "pommes"), "bread": ("m", "pain", "pains"), "soup": ("f", "soupe", "soupes"),
    "fish": ("m", "poisson", "poissons"), "rice": ("m", "riz", "riz"), "cheese": ("m", "fromage", "fromages"),
    "cake": ("m", "gâteau", "gâteaux"), "banana": ("f", "banane", "bananes"), "pear": ("f", "poire", "poires"),
    "museum": ("m", "musée", "musées"), "castle": ("m", "château", "châteaux"), "tower": ("f", "tour", "tours"),
    "palace": ("m", "palais", "palais"), "map": ("f", "carte", "cartes"), "milk": ("m", "lait", "laits"),
    "letter": ("f", "lettre", "lettres"), "book": ("m", "livre", "livres"),
    "newspaper": ("m", "journal", "journaux"), "poem": ("m", "poème", "poèmes"), "story": ("m", "récit", "récits"),
    "match": ("m", "match", "matchs"), "race": ("f", "course", "courses"),
}
VERBS = {
    "eat": ("mange", "mangent"), "buy": ("achète", "achètent"), "sell": ("vend", "vendent"),
    "cook": ("prépare", "préparent"), "visit": ("visite", "visitent"), "sleep": ("dort", "dorment"),
    "run": ("court", "courent"), "play": ("joue", "jouent"), "drink": ("boit", "boivent"),
    "read": ("lit", "lisent"), "write": ("écrit", "écrivent"), "swim": ("nage", "nagent"),
    "win": ("gagne", "gagnent"),
}
# concept -> (masc sg, fem sg, masc pl, fem pl, position)
ADJ = {
    "old": ("vieux", "vieille", "vieux", "vieilles", "pre"),
    "young": ("jeune", "jeune", "jeunes", "jeunes", "pre"),
    "little": ("petit", "petite", "petits", "petites", "pre"),
    "small": ("petit", "petite", "petits", "petites", "pre"),
    "hungry": ("affamé", "affamée", "affamés", "affamées", "post"),
    "black": ("noir", "noire", "noirs", "noires", "post"),
    "white": ("blanc", "blanche", "blancs", "blanches", "post"),
    "big": ("gros", "grosse", "gros", "grosses", "pre"),
    "large": ("grand", "grande", "grands", "grandes", "pre"),
    "red": ("rouge", "rouge", "rouges", "rouges", "post"),
    "green": ("vert", "verte", "verts", "vertes", "post"),
    "fresh": ("frais", "fraîche", "frais", "fraîches", "post"),
    "hot": ("chaud", "chaude", "chauds", "chaudes", "post"),
    "famous": ("célèbre", "célèbre", "célèbres", "célèbres", "post"),
    "beautiful": ("beau", "belle", "beaux", "belles", "pre"),
    "new": ("nouveau", "nouvelle", "nouveaux", "nouvelles", "pre"),
    "long": ("long", "longue", "longs", "longues", "pre"),
    "short": ("court", "courte", "courts", "courtes", "post"),
    "important": ("important", "importante", "importants", "importantes", "post"),
    "difficult": ("difficile", "difficile", "difficiles", "difficiles", "post"),
}
CITY = {"paris": "Paris", "berlin": "Berlin", "rome": "Rome", "madrid": "Madrid", "moscow": "Moscou",
        "beijing": "Pékin", "delhi": "Delhi"}
PLACES: dict[str, list[Token]] = {
    "kitchen": [("dans", "ADP"), ("la", "DET"), ("cuisine", "NOUN")],
    "home": [("à", "ADP"), ("la", "DET"), ("maison", "NOUN")],
    "market": [("sur", "ADP"), ("le", "DET"), ("marché", "NOUN")],
    "garden": [("dans", "ADP"), ("le", "DET"), ("jardin", "NOUN")],
    "field": [("dans", "ADP"), ("le", "DET"), ("champ", "NOUN")],
    "forest": [("dans", "ADP"), ("la", "DET"), ("forêt", "NOUN")],
    "lake": [("dans", "ADP"), ("le", "DET"), ("lac", "NOUN")],
    "park": [("dans", "ADP"), ("le", "DET"), ("parc", "NOUN")],
    "stadium": [("dans", "ADP"), ("le", "DET"), ("stade", "NOUN")],
    **{c: [("à", "ADP"), (n, "PROPN")] for c, n in CITY.items()},
}
TIMES: dict[str, list[Token]] = {
    "morning": [("le", "DET"), ("matin", "NOUN")],
    "evening": [("le", "DET"), ("soir", "NOUN")],
    "every_day": [("chaque", "DET"), ("jour", "NOUN")],
    "sunday": [("le", "DET"), ("dimanche", "NOUN")],
    "today": [("aujourd'hui", "ADV")],
    "now": [("maintenant", "ADV")],
}
WEATHER: dict[str, list[Token]] = {
    "cold": [("il", "PRON"), ("fait", "VERB"), ("froid", "ADJ")],
    "hot": [("il", "PRON"), ("fait", "VERB"), ("chaud", "ADJ")],
    "sunny": [("il", "PRON"), ("fait", "VERB"), ("beau", "ADJ")],
    "windy": [("le", "DET"), ("vent", "NOUN"), ("souffle", "VERB")],
    "rain": [("il", "PRON"), ("pleut", "VERB")],
    "snow": [("il", "PRON"), ("neige", "VERB")],
}


def _np(noun: str, pl: bool, adj: str | None) -> list[Token]:
    gender, sg, plural = NOUNS[noun]
    out: list[Token] = [("les" if pl else ("le" if gender == "m" else "la"), "DET")]
    word = (plural if pl else sg, "NOUN")
    if not adj:
        return out + [word]
    ms, fs, mp, fp, pos = ADJ[adj]
    form = ((mp if pl else ms) if gender == "m" else (fp if pl else fs), "ADJ")
    return out + ([form, word] if pos == "pre" else [word, form])


def realize(f: Frame) -> list[Token]:
    return realize_svo(f, _np, VERBS, WEATHER, PLACES, TIMES)
