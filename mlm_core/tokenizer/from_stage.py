"""The tokenizer stage with an existing tokenizer (``tokenizer.from``, else ``pretrain.init_from``).

In: the reference (a folder, a pipeline output, or ``models:/NAME@ALIAS`` through the registry resolver the
tasks layer installs), the normalize artifact and the ``tokenizer`` section. Nothing is trained unless
``tokenizer.extend`` > 0 (``extend.py``). Out: the same files and manifest keys as a trained tokenizer
(``stage.py``), so shards / pretrain / evaluate read it unchanged:
  tokenizer.json, stats.parquet, vocab_scripts.parquet   as ``stage.py`` writes them; tokenizer.json is the
                         base's (converted when it came as vocab.txt / vocab.json+merges.txt / sentencepiece),
                         its role tokens marked special, truncation and padding off; ids unchanged
  extension.parquet      (extend > 0) id, token, pieces: the new ids and the base's ids for their text
  manifest               special_tokens = the base's own (role -> token, id); vocab_size = ids in use;
                         vocab_size_requested = base ids + tokenizer.extend; algorithm = the model type;
                         "source": {ref, content_hash, files, family (when known)};
                         "extension": {base_vocab_size, added} (extend > 0)
Fertility and UNK rate are measured on this corpus' held-out documents exactly as for a trained tokenizer
and checked by the same contract; the per-language table is logged (a warning when a language is over its
limit), so a base that fragments a new language shows next to the corpus' other languages.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import pyarrow.parquet as pq

from mlm_core.artifacts import tokenizer_manifest
from mlm_core.artifacts import StageArtifact
from mlm_core.tokenizer.build import TOKENIZER_FILE
from mlm_core.tokenizer.sample import corpus_counts, train_sample
from mlm_core.tokenizer.stats import fertility, fertility_table, heldout_stats, vocab_scripts, write_tables

log = logging.getLogger(__name__)


def _limits(cfg, langs: list[str]) -> dict[str, float]:
    return {lang: float(cfg.max_fertility_per_lang.get(lang, cfg.max_fertility)) for lang in langs}


def run_from(lc, norm: StageArtifact, out_dir: Path) -> dict:
    from mlm_core.external import TOKENIZER_FILES, cache_dir, content_hash, resolve_ref
    from mlm_core.tokenizer.existing import load_existing
    from mlm_core.tokenizer.extend import EXTENSION_FILE, check_room, extend_tokenizer, extension_table

    cfg, pcfg = lc.config.tokenizer, lc.config
    field = "tokenizer.from" if cfg.from_ is not None else "pretrain.init_from"
    ref = pcfg.tokenizer_from
    folder = resolve_ref(ref, lc, field)
    base = load_existing(folder, field)
    base_size = base.size
    if cfg.extend:   # before reading the corpus: a config that cannot work fails at once
        check_room(base_size, cfg.extend, f"the {field} tokenizer {base.folder / base.files.split(' ')[0]}")
    chars, nbytes = corpus_counts(norm, pcfg.languages)
    sample = train_sample(Path(norm.path), chars, pcfg.tokenizer_alpha, cfg.sample_mb, cfg.heldout_docs, pcfg.seed,
                          nbytes)

    tok, extension, t0 = base.tokenizer, None, time.perf_counter()
    if cfg.extend:
        log.info("tokenizer: extending %s (%s, %d ids) by up to %d tokens from a %.2f MB sample", folder, base.kind,
                 base_size, cfg.extend, sample.bytes / 1e6)
        tok, new = extend_tokenizer(base.tokenizer, base.kind, sample.texts, cfg.extend, base.specials["unk"][0],
                                    cfg.min_frequency)
        pq.write_table(extension_table(new), out_dir / EXTENSION_FILE)
        extension = {"base_vocab_size": base_size, "added": len(new)}
        log.info("tokenizer: added %d tokens (ids %d..%d), e.g. %s", len(new), base_size, base_size + len(new) - 1,
                 [t.token for t in new[:8]])
    seconds = time.perf_counter() - t0
    tok.save(str(out_dir / TOKENIZER_FILE), pretty=True)
    actual = max(tok.get_vocab(with_added_tokens=True).values()) + 1

    langs = heldout_stats(tok, sample.heldout, base.specials["unk"][1])
    scripts = vocab_scripts(tok, base.surface, [t for t, _ in base.specials.values()])
    write_tables(out_dir, langs, scripts, sum(scripts.values()) or 1)
    limits = _limits(cfg, list(langs))
    table = fertility_table(langs, limits)
    over = [lang for lang, s in langs.items() if (fertility(s) or 0) > limits[lang]]
    if over:
        log.warning("tokenizer: %s fragments %s beyond tokenizer.max_fertility (the data contract will fail it); "
                    "per language:\n%s", folder, ", ".join(over), table)
    else:
        log.info("tokenizer: %s on this corpus' held-out text:\n%s", folder, table)

    # the hash the stage fingerprint holds (mlm_core.stages: the tokenizer files of the folder only)
    source = {"ref": ref, "content_hash": content_hash(folder, cache_dir(lc), TOKENIZER_FILES), "files": base.files}
    if base.family:
        source["family"] = base.family
    return tokenizer_manifest(algorithm=base.kind, style=base.style, vocab_size_requested=base_size + cfg.extend,
                              vocab_size=actual, specials=base.specials, lowercase=base.lowercase, sample=sample,
                              languages=langs, scripts=scripts, train_seconds=seconds, source=source,
                              extension=extension)
