"""The language-balanced training sample of the tokenizer, streamed from the normalize output.

In: ``docs/<lang>.parquet`` (doc_id, lang, text, n_chars, hash) and per-language sizes. Out: a list of
training texts (repeats included) and held-out documents per language.

Rules (XLM-R style temperature sampling, Conneau et al. 2020 §3.1):
  * p(l) = c_l^α / Σ c_k^α over characters per language (``mlm_core.sampling.language_weights``).
  * Held out: the first ``heldout_docs`` documents of each language in a seeded hash order (at most half
    of the language); they are never trained on and serve the fertility / UNK statistics.
  * Total size S = min(sample_mb MB, max_l train_bytes_l / p(l)): a sample larger than the point where the
    most abundant language (relative to its weight) is used once would repeat every language and add nothing.
  * Language l gets p(l) * S bytes: a random subset of its documents when it has more, or its documents
    repeated (upsampling), at most ``MAX_REPEATS`` times, when it has fewer.
  * Deterministic: every decision is a function of (seed, document md5), not of file order or threads.
Two streaming passes per language (hash column only, then hash + text); memory holds one Parquet batch
plus the sample itself (bounded by sample_mb).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mlm_core.sampling import language_weights
from mlm_core.artifacts import StageArtifact
from mlm_core.tokenizer.build import TokenizerError

log = logging.getLogger(__name__)
MAX_REPEATS = 10.0
READ_BATCH = 8192
MB = 10**6   # sample_mb counts decimal megabytes of UTF-8 text
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass
class TrainSample:
    """The training texts (repeats included, by reference) and the held-out docs; unpacks as (texts, heldout)."""

    texts: list[str]
    heldout: dict[str, list[str]]
    alpha: float
    weights: dict[str, float] = field(default_factory=dict)          # p(l)
    budget_bytes: dict[str, int] = field(default_factory=dict)       # p(l) * S
    per_lang_bytes: dict[str, int] = field(default_factory=dict)     # bytes drawn, repeats included
    per_lang_docs: dict[str, int] = field(default_factory=dict)      # docs drawn, repeats included
    repeats: dict[str, float] = field(default_factory=dict)          # drawn bytes / distinct training bytes

    def __iter__(self):
        return iter((self.texts, self.heldout))

    @property
    def bytes(self) -> int:
        return sum(self.per_lang_bytes.values())

    @property
    def docs(self) -> int:
        return len(self.texts)

    def summary(self) -> dict:
        return {"bytes": self.bytes, "docs": self.docs, "per_lang_bytes": dict(self.per_lang_bytes),
                "per_lang_docs": dict(self.per_lang_docs), "alpha": self.alpha,
                "weights": {k: round(v, 6) for k, v in self.weights.items()},
                "repeats": {k: round(v, 3) for k, v in self.repeats.items()}}


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A bijective 64-bit mixer (Steele et al. 2014); uint64 arithmetic wraps around, as intended."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _M64
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _M64
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _M64
        return x ^ (x >> np.uint64(31))


_HEX = np.full(256, 255, dtype=np.uint8)                 # ASCII hex digit -> its value; 255: not a hex digit
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10, dtype=np.uint8)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = _HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint8)


def hash_prefix64(hashes: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The first 64 bits of each document's md5 hex (``int(h[:16], 16)``), as uint64, without a Python loop over
    documents: the 16 leading characters are gathered from the Arrow string buffer and decoded in numpy. That
    loop was ~0.6 us per document, 3 per document per sample: ~4.5 s per GB of corpus, most of the tokenizer
    stage's per-GB cost (docs/SCALING.md). A column that is not all 16+-character hex strings (never from
    normalize) takes the per-document path, which raises on a bad value as before."""
    if isinstance(hashes, pa.ChunkedArray):
        hashes = hashes.combine_chunks() if hashes.num_chunks else pa.array([], pa.string())
    n = len(hashes)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    if hashes.null_count == 0 and hashes.type in (pa.string(), pa.large_string()):
        odt = np.int64 if hashes.type == pa.large_string() else np.int32
        off = np.frombuffer(hashes.buffers()[1], dtype=odt)[hashes.offset: hashes.offset + n + 1].astype(np.int64)
        if int(np.diff(off).min()) >= 16:
            digits = _HEX[np.frombuffer(hashes.buffers()[2], dtype=np.uint8)[off[:-1, None] + np.arange(16)]]
            if int(digits.max()) < 16:
                pairs = (digits[:, 0::2] << 4) | digits[:, 1::2]            # (n, 8) bytes, big-endian
                return np.ascontiguousarray(pairs).view(">u8").ravel().astype(np.uint64)
    return np.array([int(s[:16], 16) for s in hashes.to_pylist()], dtype=np.uint64)


def doc_keys(hashes: pa.Array | np.ndarray, seed: int, salt: int) -> np.ndarray:
    """A seeded uint64 key per document, from its md5 hex (first 64 bits; or those bits, from hash_prefix64)."""
    h = hashes if isinstance(hashes, np.ndarray) else hash_prefix64(hashes)
    mix = _splitmix64(np.array([(seed * 1_000_003 + salt) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
    return _splitmix64(h ^ mix)


def _uniform(keys: np.ndarray) -> np.ndarray:
    return (keys >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _heldout_threshold(path: Path, k: int, seed: int) -> tuple[int | None, int]:
    """The k-th smallest held-out key of a language (None when k == 0) and the chars of those k docs."""
    if k == 0:
        return None, 0
    best_k = np.empty(0, np.uint64)
    best_c = np.empty(0, np.int64)
    for b in pq.ParquetFile(path).iter_batches(batch_size=READ_BATCH, columns=["hash", "n_chars"]):
        keys = np.concatenate([best_k, doc_keys(b.column("hash"), seed, 1)])
        chars = np.concatenate([best_c, b.column("n_chars").to_numpy(zero_copy_only=False).astype(np.int64)])
        if len(keys) > k:
            idx = np.argpartition(keys, k - 1)[:k]
            keys, chars = keys[idx], chars[idx]
        best_k, best_c = keys, chars
    return int(best_k.max()), int(best_c.sum())


def _read_language(path: Path, thr: int | None, frac: float, seed: int):
    """Stream one language: held-out texts, and training texts with their uniform draws and byte lengths."""
    held: list[str] = []
    texts: list[str] = []
    draws: list[np.ndarray] = []
    nbytes: list[np.ndarray] = []
    for b in pq.ParquetFile(path).iter_batches(batch_size=READ_BATCH, columns=["hash", "text"]):
        h = hash_prefix64(b.column("hash"))
        k1 = doc_keys(h, seed, 1)
        u2 = _uniform(doc_keys(h, seed, 2))
        is_held = (k1 <= np.uint64(thr)) if thr is not None else np.zeros(len(k1), bool)
        if is_held.any():
            held += b.column("text").filter(pa.array(is_held)).to_pylist()
        take = ~is_held & (u2 < frac)
        if take.any():
            col = b.column("text").filter(pa.array(take))
            texts += col.to_pylist()
            draws.append(u2[take])
            nbytes.append(pc.binary_length(col).to_numpy(zero_copy_only=False).astype(np.int64))
    cat = (lambda xs, dt: np.concatenate(xs) if xs else np.empty(0, dt))
    return held, texts, cat(draws, np.float64), cat(nbytes, np.int64)


def _byte_counts(normalize_dir: Path, langs: list[str]) -> dict[str, int]:
    out = {}
    for lang in langs:
        n = 0
        for b in pq.ParquetFile(normalize_dir / "docs" / f"{lang}.parquet").iter_batches(columns=["text"]):
            n += int(pc.sum(pc.binary_length(b.column("text"))).as_py() or 0)
        out[lang] = n
    return out


def train_sample(normalize_dir: Path, counts: dict[str, int], alpha: float, sample_mb: float,
                 heldout_docs: int, seed: int, byte_counts: dict[str, int] | None = None) -> TrainSample:
    """Draw the language-balanced training sample (see the module docstring). ``counts``: chars per language
    (they set the weights); ``byte_counts``: UTF-8 bytes per language (read from the Parquet files if None)."""
    normalize_dir = Path(normalize_dir)
    langs = sorted(counts)
    weights = language_weights({lang: counts[lang] for lang in langs}, alpha)
    nbytes = byte_counts if byte_counts is not None else _byte_counts(normalize_dir, langs)
    paths = {lang: normalize_dir / "docs" / f"{lang}.parquet" for lang in langs}

    heldout_k, thresholds, train_est = {}, {}, {}
    for lang in langs:
        n_docs = pq.ParquetFile(paths[lang]).metadata.num_rows
        k = min(heldout_docs, n_docs // 2)
        if k < heldout_docs:
            log.warning("tokenizer: %s has %d documents; holding out %d instead of %d", lang, n_docs, k, heldout_docs)
        thresholds[lang], held_chars = _heldout_threshold(paths[lang], k, seed)
        heldout_k[lang] = k
        ratio = nbytes[lang] / max(counts[lang], 1)        # bytes per char, to estimate the held-out bytes
        train_est[lang] = max(nbytes[lang] - held_chars * ratio, 1.0)

    total = min(sample_mb * MB, max(train_est[lang] / weights[lang] for lang in langs))
    sample = TrainSample([], {}, alpha, weights)
    for lang in langs:
        budget = weights[lang] * total
        frac = budget / train_est[lang]
        held, texts, u, b = _read_language(paths[lang], thresholds[lang], frac, seed)
        sample.heldout[lang] = held
        if frac >= 1 and len(texts):        # upsampling: now that the exact bytes are known, pick the repeats
            reps = min(budget / max(int(b.sum()), 1), MAX_REPEATS)
            mult = np.floor(reps).astype(np.int64) + (u < reps - math.floor(reps))
        else:
            mult = np.ones(len(texts), np.int64)
        for t, m in zip(texts, mult.tolist()):
            sample.texts.extend([t] * m)
        sample.budget_bytes[lang] = int(budget)
        sample.per_lang_bytes[lang] = int((b * mult).sum())
        sample.per_lang_docs[lang] = int(mult.sum())
        sample.repeats[lang] = sample.per_lang_bytes[lang] / max(int(b[mult > 0].sum()), 1)
        if not sample.per_lang_docs[lang]:
            log.warning("tokenizer: no training documents drawn for %s", lang)
    return sample


def corpus_counts(norm: StageArtifact, langs: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    per_lang = norm.languages or {}
    missing = [lang for lang in langs if lang not in per_lang]
    if missing:
        raise TokenizerError(f"the normalize output {norm.path} has no language(s) {', '.join(missing)}: "
                             f"rerun normalize")
    empty = [lang for lang in langs if not per_lang[lang].get("chars")]
    if empty:
        raise TokenizerError(f"no normalized text for language(s) {', '.join(empty)} in {norm.path}")
    return ({lang: int(per_lang[lang]["chars"]) for lang in langs},
            {lang: int(per_lang[lang]["bytes"]) for lang in langs})
