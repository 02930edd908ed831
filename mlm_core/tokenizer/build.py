"""Building and training one HF ``tokenizers`` tokenizer per algorithm, with fixed special-token ids.

In: a ``TokenizerConfig`` and an in-memory list of training texts. Out: a trained ``tokenizers.Tokenizer``.
  bpe        byte-level BPE (GPT-2 / RoBERTa, Radford et al. 2019): ByteLevel pre-tokenizer with a prefix
             space, the 256-byte initial alphabet, never emits UNK. Decoding strips the prefix space again,
             so ``decode(encode(x)) == x`` for normalized text.
  wordpiece  BERT style (Devlin et al. 2019): BertPreTokenizer (whitespace + punctuation), CJK ideographs
             split one per word first (what BertNormalizer's handle_chinese_chars does), ``##`` continuation.
  unigram    SentencePiece / XLM-R style (Kudo 2018): Metaspace "▁", prepend_scheme "always".
The normalizer is NFKC (+ Lowercase). Never StripAccents or BertNormalizer: both mangle Devanagari.
Special tokens take ids 0..4 in ``SPECIALS[style]`` order, and the post-processor frames one sequence
as CLS ... SEP (pairs as CLS A SEP B SEP for bert, <s> A </s></s> B </s> for roberta).
"""
from __future__ import annotations

import bisect
import json
import time
from typing import Iterable, Iterator

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from mlm_core.config import TokenizerConfig
from mlm_core.errors import StageError

ROLES = ("pad", "unk", "cls", "sep", "mask")
TOKENIZER_FILE = "tokenizer.json"     # the trained tokenizer in the stage's output folder

SPECIALS: dict[str, list[str]] = {
    "bert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    "roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
}
# role -> index into SPECIALS[style] (roberta lists <s> first, as fairseq does: <s>=0 <pad>=1 </s>=2 <unk>=3)
_ROLE_INDEX = {"bert": {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4},
               "roberta": {"cls": 0, "pad": 1, "sep": 2, "unk": 3, "mask": 4}}
BATCH = 1000          # texts per batch handed to train_from_iterator
BYTE_ALPHABET = 256   # byte-level BPE starts from all 256 bytes, whatever the text
_PENALTY = 1e-4       # the Unigram trainer's score step for characters kept only for coverage
_GRID_TOL = 1e-10     # scores this close to that grid are coverage characters (real pieces: ~1e-6 odds)


class TokenizerError(StageError):
    """The tokenizer cannot be trained or is unusable (vocabulary too small, specials misplaced...)."""


class TokenizerMismatch(TokenizerError):
    """A tokenizer file whose sha256 differs from the one recorded in its manifest."""


def special_ids(style: str) -> dict[str, tuple[str, int]]:
    """role -> (token, id) for ``style`` ('bert' or 'roberta'); ids are fixed: the token's index in SPECIALS."""
    if style not in SPECIALS:
        raise ValueError(f"unknown special-token style {style!r} (known: {', '.join(SPECIALS)})")
    toks = SPECIALS[style]
    return {role: (toks[_ROLE_INDEX[style][role]], _ROLE_INDEX[style][role]) for role in ROLES}


def _normalizer(cfg: TokenizerConfig, extra: list | None = None):
    steps = [normalizers.NFKC()] + ([normalizers.Lowercase()] if cfg.lowercase else []) + (extra or [])
    return normalizers.Sequence(steps)


def _post_processor(style: str, byte_level: bool):
    sp = special_ids(style)
    (cls, cls_id), (sep, sep_id) = sp["cls"], sp["sep"]
    pair = (f"{cls} $A {sep} $B:1 {sep}:1" if style == "bert" else f"{cls} $A {sep} {sep} $B:1 {sep}:1")
    template = processors.TemplateProcessing(single=f"{cls} $A {sep}", pair=pair,
                                             special_tokens=[(cls, cls_id), (sep, sep_id)])
    if byte_level:  # trim the leading space out of each token's offsets (whole-word masking reads them)
        return processors.Sequence([processors.ByteLevel(trim_offsets=True, add_prefix_space=True), template])
    return template


def build_tokenizer(cfg: TokenizerConfig) -> Tokenizer:
    """An untrained tokenizer for ``cfg.algorithm``: model, normalizer, pre-tokenizer, decoder, post-processor."""
    unk = special_ids(cfg.special_tokens)["unk"][0]
    if cfg.algorithm == "bpe":
        tok = Tokenizer(models.BPE())   # no unk_token: every byte is in the vocabulary
        tok.normalizer = _normalizer(cfg)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        # ByteLevel decodes to one string; Strip then removes the prefix space encode added.
        tok.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])
    elif cfg.algorithm == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=unk, continuing_subword_prefix="##"))
        tok.normalizer = _normalizer(cfg)
        # Without this, a Chinese clause is one "word" (> 100 chars -> UNK); BERT isolates CJK ideographs too.
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\p{Han}"), behavior="isolated"), pre_tokenizers.BertPreTokenizer()])
        tok.decoder = decoders.WordPiece(prefix="##")
    elif cfg.algorithm == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = _normalizer(cfg, [normalizers.Replace(Regex(" {2,}"), " ")])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    else:  # pragma: no cover - the config's Literal forbids it
        raise ValueError(f"unknown algorithm {cfg.algorithm!r}")
    tok.post_processor = _post_processor(cfg.special_tokens, cfg.algorithm == "bpe")
    return tok


def make_trainer(cfg: TokenizerConfig, specials: list[str] | None = None):
    """The trainer for ``cfg.algorithm``; ``specials`` defaults to the style's 5 special tokens."""
    specials = specials or SPECIALS[cfg.special_tokens]
    if cfg.algorithm == "bpe":
        return trainers.BpeTrainer(vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
                                   special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                   show_progress=False)
    if cfg.algorithm == "wordpiece":
        return trainers.WordPieceTrainer(vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
                                         special_tokens=specials, continuing_subword_prefix="##",
                                         show_progress=False)
    return trainers.UnigramTrainer(vocab_size=cfg.vocab_size, special_tokens=specials,
                                   unk_token=special_ids(cfg.special_tokens)["unk"][0], show_progress=False)


def distinct_chars(texts: Iterable[str]) -> set[str]:
    chars: set[str] = set()
    for t in texts:
        chars.update(t)
    return chars


def alphabet_size(tok: Tokenizer, cfg: TokenizerConfig, chars: set[str]) -> tuple[int, int]:
    """(alphabet characters, extra ``##c`` continuation tokens) the vocabulary must hold before any merge.

    Characters are the distinct non-space ones after the tokenizer's normalizer. Byte-level BPE always
    starts from the 256 bytes; WordPiece also needs a ``##c`` per word-internal character.
    """
    if cfg.algorithm == "bpe":
        return BYTE_ALPHABET, 0
    normalized = {n for c in chars for n in tok.normalizer.normalize_str(c) if not n.isspace()}
    if cfg.algorithm == "unigram":
        normalized.add("▁")   # Metaspace's word-boundary symbol is a character of the alphabet too
    return len(normalized), (len(continuation_chars(tok, chars)) if cfg.algorithm == "wordpiece" else 0)


def check_vocab_fits(tok: Tokenizer, cfg: TokenizerConfig, chars: set[str]) -> int:
    """TokenizerError when ``vocab_size`` cannot hold the sample's alphabet plus the 5 special tokens."""
    n, n_cont = alphabet_size(tok, cfg, chars)
    n_special = len(SPECIALS[cfg.special_tokens])
    need = n + n_cont + n_special
    if cfg.vocab_size < need:
        cont = f" and {n_cont} ##-continuation tokens" if n_cont else ""
        raise TokenizerError(f"tokenizer.vocab_size={cfg.vocab_size} is smaller than the alphabet ({n} characters)"
                             f"{cont} plus {n_special} special tokens: raise tokenizer.vocab_size to at least {need}"
                             + (" (or use algorithm: bpe, whose alphabet is 256 bytes)" if cfg.algorithm != "bpe"
                                else ""))
    return need


def batches(texts: list[str], size: int = BATCH) -> Iterator[list[str]]:
    for i in range(0, len(texts), size):
        yield texts[i:i + size]


def continuation_chars(tok: Tokenizer, chars: set[str]) -> list[str]:
    """Characters that can continue a word for WordPiece (``##c``), sorted by code point.

    Those are the normalized ``chars`` that the pre-tokenizer keeps inside a word (not spaces,
    punctuation or CJK ideographs): a superset of the ones actually seen after a first character.
    """
    norm = tok.normalizer.normalize_str if tok.normalizer is not None else str   # (a base tokenizer may have none)
    normalized = {n for c in chars for n in norm(c) if not n.isspace()}
    pre = tok.pre_tokenizer
    if pre is None:
        return sorted(normalized)
    return sorted(c for c in normalized if len(pre.pre_tokenize_str("a" + c)) == 1)


def _keep_added(tok: Tokenizer, keep: list[str]) -> Tokenizer:
    """Drop every added token except ``keep`` from the added vocabulary (the model's vocabulary is untouched)."""
    data = json.loads(tok.to_str())
    data["added_tokens"] = [a for a in data["added_tokens"] if a["content"] in set(keep)]
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def canonical_unigram(tok: Tokenizer, n_special: int) -> Tokenizer:
    """Make a trained Unigram model independent of hash-map iteration order (byte-identical reruns).

    The trainer's scores carry ~1e-13 summation noise (its sentences come out of a hash map in random
    order), and characters it keeps only for coverage get scores ``min_score - k * 1e-4`` in random order.
    Here the coverage characters are reassigned those same scores in code-point order, every score is
    rounded to 1e-5 and pieces are sorted by (score desc, piece): ids no longer depend on the run.
    """
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    head, rest = vocab[:n_special], vocab[n_special:]
    single = sorted({sc for t, sc in rest if len(t) == 1})

    def on_grid(x: float) -> bool:
        i = bisect.bisect_left(single, x - _GRID_TOL)
        return i < len(single) and single[i] <= x + _GRID_TOL

    run, base = 1, None       # the longest run b, b - d, b - 2d, ... among single-character scores
    for v in reversed(single):
        n = 1
        while on_grid(v - n * _PENALTY):
            n += 1
        if n > run:
            run, base = n, v
    pieces = [(t, sc) for t, sc in rest]
    if base is not None:
        def k_of(sc: float) -> int | None:
            k = (base - sc) / _PENALTY
            return round(k) if k > -0.5 and abs(k - round(k)) * _PENALTY <= _GRID_TOL else None
        members = [(t, k_of(sc)) for t, sc in rest if len(t) == 1 and k_of(sc) is not None]
        tokens, ks = sorted(t for t, _ in members), sorted(k for _, k in members)
        reassigned = {t: base - k * _PENALTY for t, k in zip(tokens, ks)}
        pieces = [(t, reassigned.get(t, sc)) for t, sc in rest]
    pieces = sorted(((t, round(sc, 5)) for t, sc in pieces), key=lambda p: (-p[1], p[0]))
    data["model"]["vocab"] = head + [[t, sc] for t, sc in pieces]
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def train(cfg: TokenizerConfig, texts: list[str]) -> Tokenizer:
    """Build, check and train a tokenizer on ``texts``; deterministic; specials verified at ids 0..4.

    Reproducibility: byte-level BPE is deterministic as is (sorted alphabet, ties broken by pair ids).
    WordPiece is not: the trainer numbers ``##c`` tokens in hash-map order, and merge ties follow those
    ids. So every ``##c`` is registered up front, in code-point order, as a trainer special token (and
    removed from the added vocabulary afterwards). Unigram goes through ``canonical_unigram``.
    """
    tok = build_tokenizer(cfg)
    chars = distinct_chars(texts)
    check_vocab_fits(tok, cfg, chars)
    specials = SPECIALS[cfg.special_tokens]
    if cfg.algorithm == "wordpiece":
        trainer = make_trainer(cfg, specials + ["##" + c for c in continuation_chars(tok, chars)])
    else:
        trainer = make_trainer(cfg)
    tok.train_from_iterator(batches(texts), trainer, length=len(texts))
    if cfg.algorithm == "wordpiece":
        tok = _keep_added(tok, specials)
    elif cfg.algorithm == "unigram":
        tok = canonical_unigram(tok, len(specials))
    for role, (token, tid) in special_ids(cfg.special_tokens).items():
        if tok.token_to_id(token) != tid:
            raise TokenizerError(f"special token {token} ({role}) got id {tok.token_to_id(token)}, expected {tid}")
    return tok


def train_seconds_per_mb(algorithm: str, texts: list[str], vocab_size: int, **overrides) -> float:
    """Wall-clock training seconds per MB (10^6 bytes) of UTF-8 text, for benchmarks."""
    cfg = TokenizerConfig(algorithm=algorithm, vocab_size=vocab_size, **overrides)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    t0 = time.perf_counter()
    train(cfg, texts)
    return (time.perf_counter() - t0) / max(mb, 1e-9)
