"""Counterfactual data augmentation (CDA; issue 13 part 1): a document's text with every listed word swapped
for its partner (he <-> she, Mann <-> Frau ...), and the choice of the documents that get a swapped copy.

Swapping is one regex pass per document (the alternation of every listed entry, longest first, so a phrase
such as "le roi" wins over "roi"), so the cost is that of ``re.sub``: no Python work per token.
- Words, not substrings: an entry matches only between non-word characters (Unicode ``\\w``), so "he" does not
  touch "the" or "held", and "Mann" does not touch "Mannschaft".
- Both directions at once (each match is looked up in the list's ``swap``), so "he saw her" -> "she saw his".
- Case: the matched text's pattern is kept: lower -> lower, Title (first letter upper) -> first letter upper,
  UPPER (two or more letters, all upper) -> upper; a phrase word by word when source and target have as many
  words. A phrase's spacing becomes single spaces.
- ``one_way`` words are targets only (absent from ``swap``); ``keep`` phrases (impersonal "il y a") are
  matched first and left as they are.

Selection: a document is selected when blake2b(seed, doc id) / 2**64 < share: stable across runs, machines
and partitionings, independent of document order.
"""
from __future__ import annotations

import hashlib
import re
from functools import lru_cache

import numpy as np

from mlm_core.bias.wordlists import WordList


def _entry_pattern(entry: str) -> str:
    # the words of a phrase may be separated by any run of spaces in the text; an apostrophe may be typographic
    return r"\s+".join(re.escape(w) for w in entry.split(" ")).replace("'", "['’]")


class Swapper:
    """The compiled swap of one word list: ``swapper(text) -> (new_text, n_words_swapped)``."""

    def __init__(self, wl: WordList):
        self.swap = dict(wl.swap)
        keep = sorted(set(wl.keep), key=len, reverse=True)
        words = sorted(self.swap, key=len, reverse=True)
        # group 1: a keep phrase (left alone); group 2: a listed entry. Keep phrases come first in the
        # alternation so that at one position "il y a" wins over "il".
        alts = ([f"(?P<keep>{'|'.join(_entry_pattern(k) for k in keep)})"] if keep else []) + \
               [f"(?P<word>{'|'.join(_entry_pattern(w) for w in words)})"]
        self.regex = re.compile(r"(?<!\w)(?:" + "|".join(alts) + r")(?!\w)", re.IGNORECASE)

    def __call__(self, text: str) -> tuple[str, int]:
        n = 0

        def one(m: re.Match) -> str:
            nonlocal n
            if m.group("word") is None:          # a keep phrase
                return m.group(0)
            src = m.group(0)
            target = self.swap[" ".join(src.lower().replace("’", "'").split())]
            n += 1
            if "’" in src:
                target = target.replace("'", "’")
            return match_case(src, target)

        out = self.regex.sub(one, text)
        return out, n


def match_case(src: str, target: str) -> str:
    """``target`` (lower case) in ``src``'s case pattern: UPPER, Title or lower; word by word when both are
    phrases of as many words ("Der Mann" -> "Die Frau": German nouns keep their capital)."""
    sw, tw = src.split(), target.split(" ")
    if len(sw) > 1 and len(sw) == len(tw):
        return " ".join(_case_word(a, b) for a, b in zip(sw, tw))
    return _case_word(src, target)


def _case_word(src: str, target: str) -> str:
    letters = [c for c in src if c.isalpha()]
    if len(letters) >= 2 and all(c.isupper() for c in letters):
        return target.upper()
    if letters and letters[0].isupper():
        i = next(i for i, c in enumerate(target) if c.isalpha()) if any(c.isalpha() for c in target) else 0
        return target[:i] + target[i].upper() + target[i + 1:]
    return target


@lru_cache(maxsize=16)
def swapper(wl: WordList) -> Swapper:
    """The compiled swapper of ``wl`` (cached per process: a partition compiles its language's list once)."""
    return Swapper(wl)


def swap_text(text: str, wl: WordList) -> tuple[str, int]:
    """``text`` with every listed word swapped for its partner; and how many words were swapped."""
    return swapper(wl)(text)


def selection_u64(doc_ids, seed: int) -> np.ndarray:
    """A uniform 64-bit hash of (seed, doc id) per document: the selection key (vectorized enough: one blake2b
    call per document, ~1 µs)."""
    pre = f"cda:{int(seed)}:".encode()
    return np.fromiter((int.from_bytes(hashlib.blake2b(pre + str(int(d)).encode(), digest_size=8).digest(), "big")
                        for d in doc_ids), dtype=np.uint64, count=len(doc_ids))


def selected(doc_ids, seed: int, share: float) -> np.ndarray:
    """True for the documents that get a swapped copy: hash(seed, doc id) / 2**64 < share."""
    if share >= 1:
        return np.ones(len(doc_ids), dtype=bool)
    return selection_u64(doc_ids, seed) < np.uint64(int(share * 2**64))


# ------------------------------------------------------------------------------------------ shards stage
def shard_lists(lc) -> dict[str, WordList]:
    """The configured ``shards.cda`` lists by language (checked; {} when CDA is off)."""
    cda = lc.config.shards.cda
    if cda is None:
        return {}
    from mlm_core.bias.wordlists import load_wordlists
    return load_wordlists(cda.lists, lc.base_dir, "shards.cda.lists")


def augment(texts, doc_ids, train: np.ndarray, wl: WordList, seed: int, share: float) -> tuple[list[str], dict]:
    """The swapped copies of a batch's selected training documents that the swap changed, in batch order, and
    the counts: ``selected`` (training documents chosen by the hash), ``swapped`` (those with at least one listed
    word: a copy identical to its original would only duplicate it), ``words`` (words swapped)."""
    ids = doc_ids.to_numpy(zero_copy_only=False) if hasattr(doc_ids, "to_numpy") else np.asarray(doc_ids)
    idx = np.flatnonzero(selected(ids, seed, share) & train)
    sw, out, words = swapper(wl), [], 0
    for i in idx:
        new, n = sw(texts[int(i)].as_py())
        if n:
            out.append(new)
            words += n
    return out, {"selected": int(len(idx)), "swapped": len(out), "words": words}
