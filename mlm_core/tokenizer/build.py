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

import time
from typing import Iterable, Iterator

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from mlm_core.config import TokenizerConfig
from mlm_core.errors import StageError

ROLES = ("pad", "unk", "cls", "sep", "mask")
SPECIALS: dict[str, list[str]] = {
    "bert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    "roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
}
# role -> index into SPECIALS[style] (roberta lists <s> first, as fairseq does: <s>=0 <pad>=1 </s>=2 <unk>=3)
_ROLE_INDEX = {"bert": {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4},
               "roberta": {"cls": 0, "pad": 1, "sep": 2, "unk": 3, "mask": 4}}
BATCH = 1000          # texts per batch handed to train_from_iterator
BYTE_ALPHABET = 256   # byte-level BPE starts from all 256 bytes, whatever the text


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


def make_trainer(cfg: TokenizerConfig):
    specials = SPECIALS[cfg.special_tokens]
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


def alphabet_size(tok: Tokenizer, cfg: TokenizerConfig, texts: Iterable[str]) -> int:
    """Distinct non-space characters of ``texts`` after the tokenizer's normalizer (256 for byte-level BPE)."""
    if cfg.algorithm == "bpe":
        return BYTE_ALPHABET
    chars: set[str] = set()
    for t in texts:
        chars.update(t)
    normalized = tok.normalizer.normalize_str("".join(sorted(chars)))
    return len({c for c in normalized if not c.isspace()})


def check_vocab_fits(tok: Tokenizer, cfg: TokenizerConfig, texts: Iterable[str]) -> int:
    """TokenizerError when ``vocab_size`` cannot hold the sample's alphabet plus the 5 special tokens."""
    n = alphabet_size(tok, cfg, texts)
    n_special = len(SPECIALS[cfg.special_tokens])
    if cfg.vocab_size < n + n_special:
        raise TokenizerError(f"tokenizer.vocab_size={cfg.vocab_size} is smaller than the alphabet ({n} characters) "
                             f"plus {n_special} special tokens: raise tokenizer.vocab_size to at least {n + n_special}"
                             + (" (or use algorithm: bpe, whose alphabet is 256 bytes)" if cfg.algorithm != "bpe"
                                else ""))
    return n


def batches(texts: list[str], size: int = BATCH) -> Iterator[list[str]]:
    for i in range(0, len(texts), size):
        yield texts[i:i + size]


def train(cfg: TokenizerConfig, texts: list[str]) -> Tokenizer:
    """Build, check and train a tokenizer on ``texts``; specials are verified at ids 0..4."""
    tok = build_tokenizer(cfg)
    check_vocab_fits(tok, cfg, texts)
    tok.train_from_iterator(batches(texts), make_trainer(cfg), length=len(texts))
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
