"""The pre-training bias regularizer (``pretrain.bias_regularizer``): L = L_MLM + λ Σ_g ‖E[h(x_g)] − E[h(x)]‖².

h is the hidden state at ``layer``; E[h(x_g)] the mean over the micro-batch's positions whose word is a word of
group g (every piece of it), E[h(x)] the mean over all its non-pad, non-special positions. A group with no
position in the micro-batch contributes 0. Group g = column g of the word-pair lists (``mlm_core.bias.wordlists``),
merged over the listed languages (English "male" with French "masculin"); a row's language decides which list
applies to it, so German "die" is never an English group word.

Which words, and which input (choices):
  * membership is decided on the ORIGINAL text (the row before masking) with the shards' word starts, so a group
    word that masking replaced by [MASK] or a random token is still in the group: its label is the group word,
    and the state that must predict it is the one to pull to the mean (for a [MASK] position that is exactly
    the prediction the template audit measures). E[h(x)] also counts masked positions (of non-special original
    tokens).
  * h comes from the forward pass the model trains on (the corrupted input; for ELECTRA the discriminator's
    pass over the generator's sample), so the term costs no second forward pass.
  * a word's token sequences: how the run's tokenizer writes it in running text, at the start of a document
    (no leading space: byte-level BPE "he") and after a space ("Ġhe", "▁he", WordPiece "he"), each in lower,
    Title and UPPER case (a lower-casing tokenizer folds them into one). A word of several pieces ("grand",
    "##father") or several pre-tokens ("man's", "l'homme") matches only where the row holds the same ids with
    the same word-start pattern, followed by a word boundary (a word start, a special token or the row's end):
    "he" never matches inside "hers". A sequence holding a special id (an [UNK] piece) is dropped: it would
    match any unknown word. A word cut by a row boundary is missed (its tail is flagged a word start).
  * the match is vectorized (no Python loop over tokens): per sequence length, every window of the batch is
    hashed, looked up among the listed sequences' hashes, and its one candidate compared exactly.

Where it runs: ``GroupFinder`` on the CPU micro-batch next to the masker (``train.feed.Feed``); the term in
``objectives`` (eager) or, with ``pretrain.compile``, on the layer output the compiled graph returns.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mlm_core.errors import MlmError

log = logging.getLogger(__name__)
KEY = "pretrain.bias_regularizer"


# ------------------------------------------------------------------------------------------------ the table
@dataclass(frozen=True)
class GroupTable:
    """Group names and, per language, every (token ids, word-start pattern, groups) a group word is written as.

    JSON-serialisable (``to_json``) so the parent builds it once and torchrun workers receive it in their args."""
    groups: tuple[str, ...]
    entries: dict[str, tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...]]

    def to_json(self) -> dict:
        return {"groups": list(self.groups),
                "entries": {lg: [[list(i), list(s), list(g)] for i, s, g in es] for lg, es in self.entries.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "GroupTable":
        return cls(tuple(d["groups"]), {lg: tuple((tuple(i), tuple(s), tuple(g)) for i, s, g in es)
                                        for lg, es in d["entries"].items()})

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:16]


def case_variants(word: str) -> list[str]:
    """lower, Title (first letter), UPPER: the case patterns running text writes a listed word in."""
    return list(dict.fromkeys([word, word[:1].upper() + word[1:], word.upper()]))


def word_sequences(tokenizer, word: str) -> set[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(ids, word-start pattern) of ``word`` as a document's first word and after a space, in every case variant.

    The word's tokens are those of the pre-token words its characters fall in (``char_to_word``), so a byte-level
    "Ġ" or a Metaspace "▁" glued to the word is part of it, exactly as the shards encode the text."""
    out = set()
    for v in case_variants(word):
        for prefix in ("", "a "):
            enc = tokenizer.encode(prefix + v, add_special_tokens=False)
            a, b = len(prefix), len(prefix) + len(v) - 1
            wa, wb = enc.char_to_word(a), enc.char_to_word(b)
            if wa is None or wb is None:          # characters the normalizer dropped: fall back to the offsets
                idx = [i for i, (s, e) in enumerate(enc.offsets) if s <= b and e > a]
            else:
                idx = [i for i, w in enumerate(enc.word_ids) if w is not None and wa <= w <= wb]
            if not idx:
                continue
            ids = tuple(enc.ids[i] for i in idx)
            wid = [enc.word_ids[i] for i in idx]
            starts = tuple(int(k == 0 or wid[k] != wid[k - 1]) for k in range(len(idx)))
            out.add((ids, starts))
    return out


def build_group_table(wordlists: dict, tokenizer, special_ids: list[int]) -> GroupTable:
    """The table for ``wordlists`` (language -> ``WordList``) under ``tokenizer``; group g = column g of every list."""
    names: list[list[str]] = [[], []]
    entries: dict[str, tuple] = {}
    specials = set(int(i) for i in special_ids)
    for lang in sorted(wordlists):
        wl = wordlists[lang]
        by_seq: dict[tuple, set[int]] = {}
        dropped = []
        for gi, g in enumerate(wl.groups):
            if g not in names[gi]:
                names[gi].append(g)
            for w in sorted(wl.group_words()[g]):
                for seq in word_sequences(tokenizer, w):
                    if specials & set(seq[0]):
                        dropped.append(w)
                        continue
                    by_seq.setdefault(seq, set()).add(gi)
        if dropped:
            log.warning("%s.lists.%s: %d variant(s) of %s hold a special token ([UNK]) under this tokenizer and "
                        "are not matched", KEY, lang, len(dropped), sorted(set(dropped))[:5])
        entries[lang] = tuple((ids, st, tuple(sorted(gs))) for (ids, st), gs in sorted(by_seq.items()))
    return GroupTable(tuple("|".join(n) for n in names), entries)


def load_group_table(cfg, base_dir: Path, tokenizer_path: Path, special_ids: list[int]) -> GroupTable:
    """Read the lists of ``cfg`` (a BiasRegularizerConfig; paths relative to ``base_dir``) and tokenize them."""
    from tokenizers import Tokenizer

    from mlm_core.bias.wordlists import load_wordlists
    wls = load_wordlists(cfg.lists, Path(base_dir), f"{KEY}.lists")
    return build_group_table(wls, Tokenizer.from_file(str(tokenizer_path)), special_ids)


# ------------------------------------------------------------------------------------------------ positions
_MULT = (0x9E3779B97F4A7C15 - 2**64, 0xC2B2AE3D27D4EB4F - 2**64, 0x165667B19E3779F9)   # odd 64-bit multipliers


def _window_hash(x: torch.Tensor, mult: int) -> torch.Tensor:
    """Polynomial hash over the last dim (wrapping int64 arithmetic, as masking.py's counter hash)."""
    k = x.shape[-1]
    powers = torch.empty(k, dtype=torch.long)
    v = 1
    for j in range(k):
        v = (v * mult) % 2**64
        powers[j] = v - 2**64 if v >= 2**63 else v
    return (x * powers).sum(-1)


def compile_sequences(entries, n_groups: int) -> dict[int, tuple]:
    """Length k -> (codes [M, k] long = id x 2 + word start, sorted hashes [M], their rows [M], membership [M, G],
    multiplier). Codes fold each piece's word-start flag into its id, so one comparison checks both."""
    by_len: dict[int, list] = {}
    for ids, st, gs in entries:
        by_len.setdefault(len(ids), []).append((ids, st, gs))
    out = {}
    for k, rows in sorted(by_len.items()):
        member = torch.zeros(len(rows), n_groups, dtype=torch.bool)
        for m, (_, _, gs) in enumerate(rows):
            member[m, list(gs)] = True
        codes = torch.tensor([[2 * i + w for i, w in zip(r[0], r[1])] for r in rows], dtype=torch.long)
        for mult in _MULT:                      # distinct hashes, so a hash names one candidate sequence
            h = _window_hash(codes, mult)
            if len(torch.unique(h)) == len(h):
                break
        else:
            raise RuntimeError(f"{KEY}: token-sequence hashes collide for length {k}")
        hs, order = torch.sort(h)
        out[k] = (codes, hs, order, member, mult)
    return out


def find_group_positions(ids: torch.Tensor, word_start: torch.Tensor, special_ids: torch.Tensor,
                         sequences: dict, n_groups: int) -> torch.Tensor:
    """Bool [G, B, T]: position (b, t) is a piece of a word of group g (see the module docstring).

    ids, word_start: [B, T] (the original text); special_ids: long [S]; sequences: ``compile_sequences``.
    Per length k: every window's hash looked up among the sequences' (searchsorted), then the one candidate
    compared exactly, so the cost is O(B x T x k), whatever the number of listed words."""
    B, T = ids.shape
    ids = ids.long()
    ws = word_start.bool()
    special = torch.isin(ids, special_ids)
    code = ids * 2 + ws.long()
    # a word ends before a word start, a special token ([SEP], [PAD]) or the row's end
    boundary = torch.cat([ws | special, torch.ones(B, 1, dtype=torch.bool)], dim=1)
    out = torch.zeros(n_groups, B, T, dtype=torch.bool)
    for k, (codes, hs, order, member, mult) in sequences.items():
        if k > T:
            continue
        W = T - k + 1
        win = code.unfold(1, k, 1)                                    # [B, W, k]
        h = _window_hash(win, mult)
        pos = torch.searchsorted(hs, h).clamp(max=len(hs) - 1)
        m = order[pos]                                                # the one candidate sequence per window
        hit = (hs[pos] == h) & (win == codes[m]).all(-1) & boundary[:, k:k + W]
        start = (member[m] & hit[..., None]).permute(2, 0, 1)         # [G, B, W]: an occurrence starts here
        for j in range(k):                                            # mark its k pieces
            out[:, :, j:j + W] |= start
    return out


class GroupFinder:
    """Per micro-batch: bool [1 + G, B, T] = (content positions, then each group's positions)."""

    def __init__(self, table: GroupTable, langs: list[str], special_ids: list[int]):
        self.n_groups = len(table.groups)
        self.special = torch.tensor(sorted(set(int(i) for i in special_ids)), dtype=torch.long)
        self.seqs = {i: compile_sequences(table.entries[lg], self.n_groups)
                     for i, lg in enumerate(langs) if table.entries.get(lg)}

    def __call__(self, ids: torch.Tensor, word_start: torch.Tensor, lang_index) -> torch.Tensor:
        B, T = ids.shape
        out = torch.zeros(1 + self.n_groups, B, T, dtype=torch.bool)
        out[0] = ~torch.isin(ids.long(), self.special)
        li = torch.as_tensor(np.asarray(lang_index))
        for i, seqs in self.seqs.items():
            rows = (li == i).nonzero().squeeze(1)
            if len(rows):
                out[1:, rows] = find_group_positions(ids[rows], word_start[rows], self.special, seqs, self.n_groups)
        return out


# ------------------------------------------------------------------------------------------------ the term
def bias_term(h: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Σ_g ‖mean of h over group g's positions − mean of h over the content positions‖² (fp32).

    h [B, T, H]; masks [1 + G, B, T] (``GroupFinder``). Static shapes (no boolean indexing), so the same code runs
    eagerly and on a compiled graph's output; an absent group (no position) gives exactly 0."""
    w = masks.to(torch.float32)
    cnt = w.sum((1, 2))                                                   # [1 + G]
    means = torch.einsum("gbt,bth->gh", w, h.float()) / cnt.clamp(min=1.0)[:, None]
    diff = means[1:] - means[:1]
    return ((diff * diff).sum(-1) * (cnt[1:] > 0)).sum()


def resolve_layer(layer: int, n_layers: int) -> int:
    """``pretrain.bias_regularizer.layer`` (negative: from the end) as a 0-based block index."""
    if not -n_layers <= layer < n_layers:
        raise MlmError(f"{KEY}.layer = {layer} is out of range: the encoder has {n_layers} layers "
                       f"(valid: {-n_layers}..{n_layers - 1}; -1 = the last)")
    return layer % n_layers


def lists_input(cfg, base_dir: Path) -> dict[str, str]:
    """Language -> sha256 of its list file's content (the pretrain fingerprint's ``inputs``)."""
    from mlm_core.bias.wordlists import WordListError, list_paths
    out = {}
    for lang, p in sorted(list_paths(cfg.lists, Path(base_dir)).items()):
        if not p.is_file():
            raise WordListError(f"{p}: word-pair list file not found (config key {KEY}.lists.{lang})")
        out[lang] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


__all__ = ["GroupTable", "GroupFinder", "build_group_table", "load_group_table", "word_sequences", "case_variants",
           "compile_sequences", "find_group_positions", "bias_term", "resolve_layer", "lists_input", "KEY"]
