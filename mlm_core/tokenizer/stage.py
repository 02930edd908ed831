"""The tokenizer stage: normalized corpus -> trained tokenizer + quality statistics.

In: the normalize artifact (``docs/<lang>.parquet``, manifest ``languages[lang].chars|bytes``) and the
``tokenizer`` config section (with ``PipelineConfig.tokenizer_alpha`` and ``seed``). With ``tokenizer.from``
(else ``pretrain.init_from``) an existing tokenizer is used instead of training one (``from_stage.py``:
same files and manifest keys, plus ``source`` and, with ``tokenizer.extend``, ``extension``). Out (stage folder):
  tokenizer.json         HF ``tokenizers`` file; loads in transformers (PreTrainedTokenizerFast / AutoTokenizer)
  stats.parquet          per language: heldout_docs, words, chars, tokens, tokens_per_word, tokens_per_char,
                         unk_rate, no_spaces (the fertility and UNK limits are thresholds, applied by the contract)
  vocab_scripts.parquet  script, tokens, share
The stage fails when the vocabulary cannot hold the alphabet, or comes out smaller than
``min_vocab_fraction * vocab_size``. Fertility and UNK-rate limits are not enforced here: the
tokenizer data contract (Great Expectations suite) checks them.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from tokenizers import Tokenizer

from mlm_core.artifacts import tokenizer_manifest
from mlm_core.artifacts import NormalizedCorpus, StageArtifact
from mlm_core.store import MANIFEST, sha256_file
from mlm_core.tokenizer.build import SPECIALS, TOKENIZER_FILE, TokenizerError, TokenizerMismatch, special_ids, train
from mlm_core.tokenizer.sample import corpus_counts, train_sample
from mlm_core.tokenizer.stats import heldout_stats, vocab_scripts, write_tables

log = logging.getLogger(__name__)


def run_tokenizer(lc, upstream: dict, out_dir: Path) -> dict:
    """Train the tokenizer into ``out_dir`` (or take an existing one: ``tokenizer.from`` / ``pretrain.init_from``);
    returns the manifest fields (the store adds files and checksums)."""
    cfg, pcfg = lc.config.tokenizer, lc.config
    norm: NormalizedCorpus = upstream["normalize"]
    if pcfg.tokenizer_from is not None:
        from mlm_core.tokenizer.from_stage import run_from
        return run_from(lc, norm, Path(out_dir))
    chars, nbytes = corpus_counts(norm, pcfg.languages)
    alpha = pcfg.tokenizer_alpha
    sample = train_sample(Path(norm.path), chars, alpha, cfg.sample_mb, cfg.heldout_docs, pcfg.seed, nbytes)
    log.info("tokenizer: %s sample of %.2f MB (%d docs), per language %s", cfg.algorithm, sample.bytes / 1e6,
             sample.docs, sample.per_lang_bytes)

    t0 = time.perf_counter()
    tok = train(cfg, sample.texts)
    train_seconds = time.perf_counter() - t0
    actual = tok.get_vocab_size(with_added_tokens=True)
    if actual < cfg.min_vocab_fraction * cfg.vocab_size:
        raise TokenizerError(
            f"the trained vocabulary has {actual} tokens, fewer than tokenizer.min_vocab_fraction="
            f"{cfg.min_vocab_fraction} x vocab_size={cfg.vocab_size}: the sample ({sample.bytes / 1e6:.2f} MB) is "
            f"too small or repetitive for this vocabulary; lower tokenizer.vocab_size or add text")
    out_dir = Path(out_dir)
    tok.save(str(out_dir / TOKENIZER_FILE), pretty=True)

    specials = special_ids(cfg.special_tokens)
    langs = heldout_stats(tok, sample.heldout, specials["unk"][1])
    scripts = vocab_scripts(tok, cfg.algorithm, SPECIALS[cfg.special_tokens])
    write_tables(out_dir, langs, scripts, sum(scripts.values()) or 1)
    log.info("tokenizer: vocab %d/%d in %.1f s; held-out %s", actual, cfg.vocab_size, train_seconds,
             {lang: round(s["tokens_per_char"] or 0, 3) for lang, s in langs.items()})
    if actual < cfg.vocab_size:   # not a warning: the corpus has no more pieces (a small corpus, like the demo's)
        log.info("tokenizer: %d tokens, fewer than the %d asked: the sample has no more pieces to merge; expected "
                 "for a small corpus (tokenizer.min_vocab_fraction=%g is the limit that fails the stage)",
                 actual, cfg.vocab_size, cfg.min_vocab_fraction)
    return tokenizer_manifest(algorithm=cfg.algorithm, style=cfg.special_tokens, vocab_size_requested=cfg.vocab_size,
                              vocab_size=actual, specials=specials, lowercase=cfg.lowercase, sample=sample,
                              languages=langs, scripts=scripts, train_seconds=train_seconds)


def load_tokenizer(artifact_or_dir: StageArtifact | Path | str) -> Tokenizer:
    """Load ``tokenizer.json`` from a tokenizer artifact or folder (or the file itself).

    When a manifest exists (the artifact's, or ``manifest.json`` next to the file), the file's sha256 must
    match its entry in the manifest's files table; otherwise ``TokenizerMismatch`` names the file.
    """
    if isinstance(artifact_or_dir, StageArtifact):
        folder, manifest = Path(artifact_or_dir.path), artifact_or_dir.manifest
        path = folder / TOKENIZER_FILE
    else:
        p = Path(artifact_or_dir)
        folder, path = (p.parent, p) if p.is_file() else (p, p / TOKENIZER_FILE)
        mf = folder / MANIFEST
        manifest = json.loads(mf.read_text(encoding="utf-8")) if mf.is_file() else None
    if not path.is_file():
        raise TokenizerError(f"{path}: tokenizer file not found")
    if manifest is not None:
        entry = manifest.get("files", {}).get(path.relative_to(folder).as_posix())
        if entry is None:
            raise TokenizerMismatch(f"{path}: not listed in the files table of {folder / MANIFEST}")
        actual = sha256_file(path)
        if actual != entry.get("sha256"):
            raise TokenizerMismatch(f"{path}: sha256 {actual[:12]}… does not match the manifest "
                                    f"({str(entry.get('sha256'))[:12]}…): the file was modified after the stage "
                                    f"wrote it")
    return Tokenizer.from_file(str(path))
