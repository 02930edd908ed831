"""Per-language word-pair lists (``configs/bias/<lang>.yaml``), shared by CDA, the regularizer and the projection.

Format (docs/BIAS.md says it for users)::

    language: en
    groups: [male, female]        # names of the two columns
    pairs:                        # [first-group word, second-group word], lower case; an entry may be a phrase
      - [he, she]
      - [his, her]
    swap_to: {her: his}           # optional: a word on several rows -> its CDA target (default: its first row)
    one_way: [sie]                # optional: ambiguous words CDA writes but never rewrites (German sie = she/they)
    keep: [il y a, il faut]       # optional: phrases whose words CDA never rewrites (impersonal French il)
    case: preserve                # the swapped word takes the source word's case pattern (lower / Title / UPPER)

Every problem is a ``WordListError`` naming the file, the line (YAML node marks) and, when given, the config key
that pointed at the file, so a user extending a list sees where the bad row is.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mlm_core.errors import MlmError

KEYS = ("language", "groups", "pairs", "swap_to", "one_way", "keep", "case")
CASES = ("preserve",)


class WordListError(MlmError, ValueError):
    """A word-pair list that cannot be used; the message names the file, line and config key."""


@dataclass(frozen=True)
class WordList:
    language: str
    groups: tuple[str, str]
    pairs: tuple[tuple[str, str], ...]
    swap: dict[str, str] = field(hash=False, compare=True)   # lower-case word -> lower-case partner (CDA target)
    one_way: frozenset[str] = frozenset()                     # written by CDA, never rewritten, not a group word
    keep: tuple[str, ...] = ()                                # phrases whose words CDA leaves alone
    case: str = "preserve"
    path: str = ""

    def group_words(self) -> dict[str, frozenset[str]]:
        """Group name -> its words (lower case). ``one_way`` words are left out: their occurrences do not reliably
        mark the group (German sie is also they), so a group mean over them would be noise."""
        out = {}
        for i, g in enumerate(self.groups):
            out[g] = frozenset(p[i] for p in self.pairs if p[i] not in self.one_way)
        return out


def _norm(phrase: str) -> str:
    # single spaces between the words of a phrase; one apostrophe (CDA matches the typographic one too)
    return " ".join(phrase.replace("’", "'").split())


class _Ctx:
    def __init__(self, path: Path, key: str):
        self.path, self.key = path, key

    def error(self, node, msg: str) -> WordListError:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        where = f" (config key {self.key})" if self.key else ""
        return WordListError(f"{self.path}{line}: {msg}{where}")

    def scalar(self, node, what: str) -> str:
        if not isinstance(node, yaml.ScalarNode) or not str(node.value).strip():
            raise self.error(node, f"{what} must be a non-empty word")
        return _norm(str(node.value))

    def seq(self, node, what: str) -> list:
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(node, f"{what} must be a list")
        return node.value

    def word(self, node, what: str) -> str:
        w = self.scalar(node, what)
        if w != w.lower():
            raise self.error(node, f"{what} {w!r} must be lower case (the case of the text is kept by 'case')")
        return w


def load_wordlist(path: Path, *, key: str = "") -> WordList:
    """Read and check one list file. ``key``: the config key that named it (shown in errors)."""
    path = Path(path)
    ctx = _Ctx(path, key)
    if not path.is_file():
        raise ctx.error(None, "word-pair list file not found")
    try:
        root = yaml.compose(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise WordListError(f"{path}{line}: not valid YAML: {getattr(e, 'problem', e)}"
                            + (f" (config key {key})" if key else "")) from None
    if not isinstance(root, yaml.MappingNode):
        raise ctx.error(root, "a word-pair list is a mapping with keys " + ", ".join(KEYS))
    nodes: dict[str, tuple] = {}
    for k, v in root.value:
        name = str(k.value)
        if name not in KEYS:
            raise ctx.error(k, f"unknown key '{name}' (allowed: {', '.join(KEYS)})")
        if name in nodes:
            raise ctx.error(k, f"key '{name}' given twice")
        nodes[name] = (k, v)
    for req in ("language", "groups", "pairs"):
        if req not in nodes:
            raise ctx.error(root, f"missing key '{req}'")

    language = ctx.scalar(nodes["language"][1], "language")
    gnode = nodes["groups"][1]
    groups = tuple(ctx.scalar(n, "a group name") for n in ctx.seq(gnode, "groups"))
    if len(groups) != 2 or groups[0] == groups[1]:
        raise ctx.error(gnode, f"groups must name exactly two distinct groups, got {list(groups)}")

    pairs, rows, seen = [], {}, {}
    for item in ctx.seq(nodes["pairs"][1], "pairs"):
        cells = ctx.seq(item, "each pair")
        if len(cells) != 2:
            raise ctx.error(item, f"each pair is [{groups[0]} word, {groups[1]} word]; this row has {len(cells)} "
                            "entries")
        a, b = (ctx.word(c, "a pair entry") for c in cells)
        if a == b:
            raise ctx.error(item, f"pair [{a}, {b}]: the two words must differ")
        if (a, b) in seen:
            raise ctx.error(item, f"pair [{a}, {b}] repeats line {seen[(a, b)]}")
        seen[(a, b)] = item.start_mark.line + 1
        pairs.append((a, b))
        rows.setdefault(a, []).append((b, item))
        rows.setdefault(b, []).append((a, item))
    if not pairs:
        raise ctx.error(nodes["pairs"][1], "pairs is empty")
    first, second = {p[0] for p in pairs}, {p[1] for p in pairs}
    for item, (a, b) in zip(nodes["pairs"][1].value, pairs):
        for w in (a, b):
            if w in first and w in second:
                raise ctx.error(item, f"'{w}' is in both columns ({groups[0]} and {groups[1]}): a word belongs to "
                                "one group")

    swap = {w: partners[0][0] for w, partners in rows.items()}
    if "swap_to" in nodes:
        snode = nodes["swap_to"][1]
        if not isinstance(snode, yaml.MappingNode):
            raise ctx.error(snode, "swap_to must be a mapping word -> target")
        for kn, vn in snode.value:
            w, t = ctx.word(kn, "a swap_to word"), ctx.word(vn, "a swap_to target")
            if w not in rows:
                raise ctx.error(kn, f"swap_to: '{w}' is on no row of pairs")
            if t not in {p for p, _ in rows[w]}:
                raise ctx.error(vn, f"swap_to: '{t}' is not a partner of '{w}' on any row "
                                f"(partners: {sorted({p for p, _ in rows[w]})})")
            swap[w] = t
    one_way = set()
    if "one_way" in nodes:
        for n in ctx.seq(nodes["one_way"][1], "one_way"):
            w = ctx.word(n, "a one_way word")
            if w not in rows:
                raise ctx.error(n, f"one_way: '{w}' is on no row of pairs")
            one_way.add(w)
    for w in one_way:
        swap.pop(w, None)
    keep = []
    if "keep" in nodes:
        keep = [ctx.word(n, "a keep phrase") for n in ctx.seq(nodes["keep"][1], "keep")]
    case = "preserve"
    if "case" in nodes:
        case = ctx.scalar(nodes["case"][1], "case")
        if case not in CASES:
            raise ctx.error(nodes["case"][1], f"case must be one of {', '.join(CASES)}, got '{case}'")
    for w in rows:
        if not re.fullmatch(r"\w+(?:['’\-\s]\w+)*\.?", w):
            _, item = rows[w][0]
            raise ctx.error(item, f"'{w}': an entry is words (letters), optionally joined by ' - or spaces")
    return WordList(language=language, groups=groups, pairs=tuple(pairs), swap=swap, one_way=frozenset(one_way),
                    keep=tuple(keep), case=case, path=str(path))


def load_wordlists(lists: dict[str, str], base_dir: Path, key: str) -> dict[str, WordList]:
    """Language -> its list, paths relative to ``base_dir`` (the config file's folder); ``key`` the config path
    of the mapping (e.g. ``shards.cda.lists``): errors name ``<key>.<lang>``."""
    out = {}
    for lang, rel in lists.items():
        p = Path(rel)
        p = p if p.is_absolute() else Path(base_dir) / p
        wl = load_wordlist(p, key=f"{key}.{lang}")
        if wl.language != lang:
            raise WordListError(f"{p}: the list says language '{wl.language}', but {key}.{lang} names it for "
                                f"'{lang}'")
        out[lang] = wl
    return out


def list_paths(lists: dict[str, str] | None, base_dir: Path) -> dict[str, Path]:
    """The resolved file of each language's list (for fingerprints: the stage hashes their content)."""
    return {lang: (Path(rel) if Path(rel).is_absolute() else Path(base_dir) / rel)
            for lang, rel in (lists or {}).items()}
