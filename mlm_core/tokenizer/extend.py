"""``tokenizer.extend: N``: up to N new tokens learned from this corpus, appended after a base tokenizer's ids.

In: the base ``tokenizers.Tokenizer`` (its model type), the tokenizer stage's language-balanced training
sample, N. Out: the extended tokenizer (every base token keeps its id; the base's special tokens are
untouched) and the new tokens with their *pieces*: the base tokenizer's ids for the same text, from which
pretrain initializes each new embedding row (the mean of the piece rows).

New tokens go into the model's own vocabulary (not the added-token list), so they take part in ordinary
segmentation. The method follows the base's model type:
  bpe        continued BPE training (Sennrich et al. 2016) from the base's own segmentation: the sample's
             words are encoded by the base, then the most frequent adjacent pair is merged, N times (at
             least ``tokenizer.min_frequency`` occurrences; ties: lower ids first). Each merge is appended
             after the base merges, so at encoding time it fires once the base merges are exhausted: on
             exactly the segmentation it was counted on. A pair whose concatenation the base already has
             is skipped (the base reaches that token another way; no duplicate strings).
  wordpiece  a WordPiece vocabulary trained on the sample with the base's normalizer, pre-tokenizer and
             continuation prefix (``##``); its tokens missing from the base are added, the ones it uses most
             often on the sample first (a missing ``##c`` that turned whole words into UNK ranks high).
             WordPiece encodes by longest match, so they are used wherever they beat the base's match.
  unigram    a Unigram model (Kudo 2018) trained on the sample with the base's normalizer and
             pre-tokenizer; its pieces missing from the base, most used on the sample first, are added with
             their score shifted onto the base's log-probability scale: by the median difference (base - new)
             over the pieces both models have (the median of each model's scores when none are shared).
Every new token is used at least ``tokenizer.min_frequency`` times on the sample.
When the trained vocabulary yields fewer than N missing tokens, it is retrained larger (up to
``GROWTH_ROUNDS`` times); "up to N": fewer are added when the sample offers fewer.

Room: the ids must still fit the dtype the shards store for the base vocabulary (``shards.pack.id_capacity``,
the same rule the shards stage uses): a 50k vocabulary in uint16 has room for 15k more, not 20k.
"""
from __future__ import annotations

import heapq
import json
import logging
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

import pyarrow as pa
from tokenizers import Tokenizer, models, trainers

from mlm_core.tokenizer.build import TokenizerError, batches, canonical_unigram, continuation_chars, distinct_chars

log = logging.getLogger(__name__)
GROWTH_ROUNDS = 4   # aux vocabulary 2N, 8N, 32N, 128N (+ alphabet) until N tokens are missing from the base
EXTENSION_FILE = "extension.parquet"
EXTENSION_SCHEMA = pa.schema([("id", pa.int64()), ("token", pa.string()), ("pieces", pa.list_(pa.int64()))])


@dataclass(frozen=True)
class NewToken:
    id: int
    token: str            # the vocabulary string ("Ġword", "##ing", "▁word")
    pieces: list[int]     # the base tokenizer's ids for the same text


def check_room(base_size: int, n: int, where: str) -> None:
    """TokenizerError naming tokenizer.extend and ``where`` when base_size + n ids overflow the id dtype."""
    from mlm_core.shards.pack import id_capacity, token_dtype
    cap = id_capacity(base_size)
    if base_size + n > cap:
        raise TokenizerError(
            f"tokenizer.extend={n}: {where} has {base_size} ids, stored as {token_dtype(base_size).name} (at most "
            f"{cap} ids); {base_size + n} ids would not fit: set tokenizer.extend to at most {cap - base_size}")


def extend_tokenizer(tok: Tokenizer, kind: str, texts: list[str], n: int, unk: str,
                     min_frequency: int = 2) -> tuple[Tokenizer, list[NewToken]]:
    """(extended tokenizer, new tokens in id order); ``kind``: the base's model type (wordpiece/bpe/unigram)."""
    data = json.loads(tok.to_str())
    model = data["model"]
    vocab = tok.get_vocab(with_added_tokens=True)
    base_size = max(vocab.values()) + 1
    if kind in ("bpe", "wordpiece"):
        _fill_gap(model, vocab, base_size)
    if kind == "bpe":
        added = _bpe_merges(tok, model, texts, n, min_frequency, base_size)
        fmt_str = bool(model["merges"]) and isinstance(model["merges"][0], str)
        for tid, token, a, b in added:
            model["vocab"][token] = tid
            model["merges"].append(f"{a} {b}" if fmt_str else [a, b])
        new = [(tid, token) for tid, token, _, _ in added]
    elif kind == "wordpiece":
        new = list(enumerate(_wordpiece_tokens(tok, model, texts, n, min_frequency, unk, set(vocab)), base_size))
        model["vocab"].update({token: tid for tid, token in new})
    elif kind == "unigram":
        pieces = _unigram_pieces(tok, model, texts, n, unk, set(vocab), min_frequency)
        _fill_gap(model, vocab, base_size)
        new = [(base_size + i, p) for i, (p, _) in enumerate(pieces)]
        model["vocab"].extend([p, s] for p, s in pieces)
    else:
        raise TokenizerError(f"tokenizer.extend: a {kind} tokenizer cannot be extended (supported: wordpiece, bpe, "
                             f"unigram)")
    out = Tokenizer.from_str(json.dumps(data, ensure_ascii=False))
    got = out.get_vocab(with_added_tokens=True)
    changed = [t for t, i in vocab.items() if got.get(t) != i]
    if changed or any(got.get(t) != i for i, t in new):   # pragma: no cover - a bug, never user input
        raise TokenizerError(f"tokenizer.extend: ids moved after extension: {changed[:5]}")
    return out, [NewToken(i, t, _pieces(tok, kind, model, t)) for i, t in new]


def extension_table(new: list[NewToken]) -> pa.Table:
    return pa.Table.from_pylist([{"id": t.id, "token": t.token, "pieces": t.pieces} for t in new],
                                schema=EXTENSION_SCHEMA)


# ------------------------------------------------------------------------------------------------ bpe
def _bpe_words(tok: Tokenizer, texts: list[str], model_ids: set[int]) -> Counter:
    """Distinct words (tuples of base ids, 2+ pieces) of ``texts`` as the base segments them, with counts."""
    t = Tokenizer.from_str(tok.to_str())
    t.encode_special_tokens = True   # "<s>" in the text is text, as in the shards
    counts: Counter = Counter()

    def flush(word: list[int]) -> None:
        if len(word) > 1 and all(i in model_ids for i in word):
            counts[tuple(word)] += 1
    for batch in batches(texts):
        for enc in t.encode_batch(batch, add_special_tokens=False):
            word: list[int] = []
            last = None
            for i, w in zip(enc.ids, enc.word_ids):
                if w != last:
                    flush(word)
                    word, last = [], w
                if w is not None:
                    word.append(i)
            flush(word)
    return counts


def _bpe_merges(tok: Tokenizer, model: dict, texts: list[str], n: int, min_frequency: int,
                base_size: int) -> list[tuple[int, str, str, str]]:
    """Continued BPE merges: [(new id, token, left, right)] (see the module docstring)."""
    strings = {i: t for t, i in tok.get_vocab(with_added_tokens=True).items()}
    known = set(strings.values())
    prefix = model.get("continuing_subword_prefix") or ""
    unk_id = tok.token_to_id(model["unk_token"]) if model.get("unk_token") else None
    model_ids = {i for i in model["vocab"].values() if i != unk_id}
    counts = _bpe_words(tok, texts, model_ids)
    words, freqs = [list(w) for w in counts], list(counts.values())
    pair_count: Counter = Counter()
    where: dict[tuple[int, int], set[int]] = defaultdict(set)
    for wi, w in enumerate(words):
        for p in zip(w, w[1:]):
            pair_count[p] += freqs[wi]
            where[p].add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    out: list[tuple[int, str, str, str]] = []
    while len(out) < n and heap:
        negc, p = heapq.heappop(heap)
        if pair_count.get(p, 0) != -negc:
            continue                      # stale entry: the pair's current count was pushed again
        if -negc < min_frequency:
            break
        a, b = strings[p[0]], strings[p[1]]
        token = a + (b[len(prefix):] if prefix and b.startswith(prefix) else b)
        if token in known:
            continue
        nid = base_size + len(out)
        strings[nid] = token
        known.add(token)
        out.append((nid, token, a, b))
        delta: Counter = Counter()
        for wi in where.pop(p, ()):
            w, f = words[wi], freqs[wi]
            merged, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == p:
                    merged.append(nid)
                    i += 2
                else:
                    merged.append(w[i])
                    i += 1
            for q in zip(w, w[1:]):
                delta[q] -= f
            for q in zip(merged, merged[1:]):
                delta[q] += f
                where[q].add(wi)
            words[wi] = merged
        for q, d in delta.items():
            if d:
                pair_count[q] += d
                if pair_count[q] > 0:
                    heapq.heappush(heap, (-pair_count[q], q))
        pair_count.pop(p, None)
    return out


def _same_pipeline(aux: Tokenizer, base: Tokenizer) -> None:
    """The base's normalizer and pre-tokenizer on the auxiliary tokenizer, so its token strings are the base's."""
    if base.normalizer is not None:
        aux.normalizer = base.normalizer
    if base.pre_tokenizer is not None:
        aux.pre_tokenizer = base.pre_tokenizer


def _most_used(aux: Tokenizer, texts: list[str], skip: set[str], min_frequency: int) -> list[str]:
    """The auxiliary tokenizer's tokens outside ``skip``, by how often it uses them on ``texts`` (most first;
    ties: lower id), used at least ``min_frequency`` times: the most useful ones, whatever the trainer's order."""
    counts: Counter = Counter()
    for batch in batches(texts):
        for enc in aux.encode_batch(batch, add_special_tokens=False):
            counts.update(enc.ids)
    vocab = aux.get_vocab(with_added_tokens=False)
    used = [(-counts[i], i, t) for t, i in vocab.items() if t not in skip and counts[i] >= min_frequency]
    return [t for _, _, t in sorted(used)]


# ------------------------------------------------------------------------------------------ wordpiece
def _wordpiece_tokens(tok: Tokenizer, model: dict, texts: list[str], n: int, min_frequency: int, unk: str,
                      known: set[str]) -> list[str]:
    prefix = model.get("continuing_subword_prefix") or "##"
    chars = distinct_chars(texts)
    cands: list[str] = []
    for r in range(GROWTH_ROUNDS):
        aux = Tokenizer(models.WordPiece(unk_token=unk, continuing_subword_prefix=prefix,
                                         max_input_chars_per_word=model.get("max_input_chars_per_word", 100)))
        _same_pipeline(aux, tok)
        # continuation characters registered up front in code-point order: the trainer would number them
        # in hash-map order, and merge ties follow ids (as in build.train)
        head = [unk] + [prefix + c for c in continuation_chars(aux, chars)]
        size = len(head) + len(chars) + 2 * n * 4 ** r
        aux.train_from_iterator(batches(texts), trainers.WordPieceTrainer(
            vocab_size=size, min_frequency=min_frequency, special_tokens=head, continuing_subword_prefix=prefix,
            show_progress=False), length=len(texts))
        cands = _most_used(aux, texts, known | {unk}, min_frequency)
        if len(cands) >= n or aux.get_vocab_size(with_added_tokens=False) < size:
            break
    return cands[:n]


# ------------------------------------------------------------------------------------------ unigram
def _unigram_pieces(tok: Tokenizer, model: dict, texts: list[str], n: int, unk: str, known: set[str],
                    min_frequency: int) -> list[tuple[str, float]]:
    """[(piece, score on the base's scale)], most used first."""
    base_scores = {p: s for p, s in model["vocab"]}
    chars = distinct_chars(texts)
    pieces: list = []
    cands: list = []
    for r in range(GROWTH_ROUNDS):
        aux = Tokenizer(models.Unigram())
        _same_pipeline(aux, tok)
        size = 1 + len(chars) + 2 * n * 4 ** r
        aux.train_from_iterator(batches(texts), trainers.UnigramTrainer(
            vocab_size=size, special_tokens=[unk], unk_token=unk, show_progress=False), length=len(texts))
        aux = canonical_unigram(aux, 1)   # scores free of the trainer's hash-order noise: reruns rank alike
        pieces = json.loads(aux.to_str())["model"]["vocab"][1:]
        score = dict(map(tuple, pieces))
        cands = [(p, score[p]) for p in _most_used(aux, texts, known | {unk}, min_frequency)]
        if len(cands) >= n or len(pieces) + 1 < size:
            break
    shared = [base_scores[p] - s for p, s in pieces if p in base_scores]
    if shared:
        offset = statistics.median(shared)
    else:   # nothing in common (a new script): align the two models' typical piece
        offset = statistics.median(base_scores.values()) - statistics.median(s for _, s in pieces) if pieces else 0.0
    return [(p, round(s + offset, 6)) for p, s in cands[:n]]


def _fill_gap(model: dict, vocab: dict[str, int], base_size: int) -> None:
    """Put the added tokens that are not in the model's vocabulary (RoBERTa-style ``<mask>`` after the BPE
    vocabulary) into it at their ids. Why: on loading, tokenizers renumbers such tokens after the model's
    vocabulary, which now ends later, so they would move. They stay unreachable by the model itself (added
    tokens are matched before it, and the pre-tokenizers split their punctuation). Unigram ids are list
    positions: those tokens are appended in id order, with the lowest score."""
    if isinstance(model["vocab"], dict):
        have = set(model["vocab"].values())
        model["vocab"].update({t: i for t, i in vocab.items() if i not in have})
        return
    pieces = model["vocab"]
    if len(pieces) >= base_size:
        return
    by_id = {i: t for t, i in vocab.items()}
    low = min((s for _, s in pieces), default=0.0) - 10.0
    for i in range(len(pieces), base_size):
        if i not in by_id:
            raise TokenizerError(f"tokenizer.extend: the base tokenizer has no token with id {i} (ids must be "
                                 f"contiguous to append after them)")
        pieces.append([by_id[i], low])


# ------------------------------------------------------------------------------------------ pieces
def _pieces(base: Tokenizer, kind: str, model: dict, token: str) -> list[int]:
    """The base's ids for ``token`` where it occurs: the base model's segmentation of the same string (the
    string is already normalized and pre-tokenized: "Ġword", "▁word"). A WordPiece continuation "##xyz" is
    the base's continuation segmentation of "xyz" (longest match first, as WordPiece encodes a word's rest)."""
    prefix = model.get("continuing_subword_prefix") or "##"
    if kind == "wordpiece" and token.startswith(prefix) and len(token) > len(prefix):
        vocab = base.get_vocab(with_added_tokens=False)
        rest, out, i = token[len(prefix):], [], 0
        while i < len(rest):
            for j in range(len(rest), i, -1):
                tid = vocab.get(prefix + rest[i:j])
                if tid is not None:
                    out.append(tid)
                    i = j
                    break
            else:   # as WordPiece does: a word it cannot cover is one UNK
                return [base.token_to_id(model["unk_token"])]
        return out
    return [t.id for t in base.model.tokenize(token)]


__all__ = ["EXTENSION_FILE", "EXTENSION_SCHEMA", "GROWTH_ROUNDS", "NewToken", "check_room", "extend_tokenizer",
           "extension_table"]
