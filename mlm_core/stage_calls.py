"""How each stage is called and what it reads besides its upstream outputs: the ``run`` and ``inputs`` functions
that ``stages.STAGES`` names. ``run_<stage>(loaded_config, upstream_artifacts, out_dir)`` imports the stage's package
only when it runs (planning stays cheap); ``<stage>_inputs(loaded_config)`` describes the raw files it reads (path,
size, content sha256) for its fingerprint. A leaf of ``stages``: it imports no stage-graph code."""
from __future__ import annotations

from pathlib import Path

from mlm_core.config.io import LoadedConfig
from mlm_core.errors import PlanError


def normalize_scripts(lc: LoadedConfig) -> dict:
    cfg = lc.config
    return {"scripts": {lang: cfg.scripts_for(lang) for lang in cfg.languages}}


def run_normalize(lc, upstream, out_dir):
    from mlm_core.normalize import run_normalize
    return run_normalize(lc, out_dir)


def normalize_inputs(lc):
    from mlm_core.normalize.stage import input_fingerprint
    return input_fingerprint(lc)


def tokenizer_inputs(lc: LoadedConfig):
    """The existing tokenizer's content hash (tokenizer.from, else pretrain.init_from's); None: one is trained."""
    from mlm_core.external import TOKENIZER_FILES, external_input
    cfg = lc.config
    field = "tokenizer.from" if cfg.tokenizer.from_ is not None else "pretrain.init_from"
    got = external_input(lc, cfg.tokenizer_from, field, TOKENIZER_FILES)   # a model folder's weights: not read
    return None if got is None else {"from": got}


def run_tokenizer(lc, upstream, out_dir):
    from mlm_core.tokenizer import run_tokenizer
    manifest = run_tokenizer(lc, upstream, out_dir)
    if lc.config.tokenizer.pmi_vocab:       # PMI-masking's n-gram vocabulary (mlm_core.masking.pmi, issue 13)
        from mlm_core.masking.pmi import build_vocabulary
        from mlm_core.tokenizer.stage import load_tokenizer
        tok = load_tokenizer(Path(out_dir))
        manifest["pmi"] = build_vocabulary(upstream["normalize"].path, lc.config.languages, tok,
                                           lc.config.tokenizer, out_dir)
    return manifest


def run_shards(lc, upstream, out_dir):
    from mlm_core.shards import run_shards
    return run_shards(lc, upstream, out_dir)


def shards_inputs(lc: LoadedConfig):
    """shards.cda (issue 13): the content hash of each word-pair list and the global seed (document selection);
    None without CDA, so the fingerprint of a config without it is unchanged."""
    cda = lc.config.shards.cda
    if cda is None:
        return None
    import hashlib

    from mlm_core.bias.wordlists import list_paths
    hashes = {}
    for lang, p in sorted(list_paths(cda.lists, lc.base_dir).items()):
        hashes[lang] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None   # missing: shards says
    return {"cda": {"lists": hashes, "seed": lc.config.seed}}


def run_pretrain(lc, upstream, out_dir, metrics_cb=None):
    from mlm_core.train.stage import run_pretrain
    return run_pretrain(lc, upstream, out_dir, metrics_cb=metrics_cb)


def file_stats(lc: LoadedConfig, paths) -> list:
    """Path, size and content sha256 of the files a stage reads besides upstream outputs: an edit reruns the
    stage, a copy or a touched mtime does not (content-addressed; digests cached under ``<workdir>/.cache``)."""
    from mlm_core.external import cache_dir, file_hash
    out = []
    for p in sorted(set(paths)):
        f = lc.resolve(str(p).split("#", 1)[0])
        ok = f.is_file()
        out.append([str(f), f.stat().st_size if ok else None, file_hash(f, cache_dir(lc)) if ok else None])
    return out


def _with_debias_lists(lc: LoadedConfig, got):
    """``got`` plus the content hash of each debias.projection word list (read by evaluate and audit; checked at
    planning: a bad path or language fails here). Unset: ``got`` unchanged, so the fingerprints are too."""
    if lc.config.debias.projection is None:
        return got
    from mlm_core.bias.projection import projection_inputs
    return {"files": got, "debias.projection.lists": projection_inputs(lc)}


def _readable(lc: LoadedConfig, stage: str) -> None:
    """The stage's own text files decode (audit: in their ``encoding``; evaluate: UTF-8): checked at planning,
    so a bad byte fails before pretraining, naming the file, line and byte (``mlm_core.pathcheck``)."""
    from mlm_core.pathcheck import text_problems
    bad = [m for m in text_problems(lc) if m.startswith(f"{stage}.")]
    if bad:
        raise PlanError("\n".join(bad))


def evaluate_inputs(lc: LoadedConfig):
    ev = lc.config.evaluate
    _readable(lc, "evaluate")
    files = [p for t in (ev.upos, ev.classification) if t for p in [t.train, t.dev, *t.targets.values()] if p]
    return _with_debias_lists(lc, file_stats(lc, files + list((ev.retrieval or {}).values())))


def run_evaluate(lc, upstream, out_dir):
    from mlm_core.evaluate.stage import run_evaluate
    return run_evaluate(lc, upstream, out_dir)


def audit_inputs(lc: LoadedConfig):
    _readable(lc, "audit")
    return _with_debias_lists(lc, file_stats(lc, [p for _, _, p, _ in lc.config.audit.files()]))


def run_audit(lc, upstream, out_dir):
    from mlm_core.audit.stage import run_audit_stage
    return run_audit_stage(lc, upstream, out_dir)


def run_register(lc, upstream, out_dir):
    from mlm_core.register.stage import run_register
    return run_register(lc, upstream, out_dir)
