"""The stage graph: which stages exist, what each depends on, and how a run is planned.

A stage is a plain function ``run(loaded_config, upstream_artifacts, out_dir) -> manifest fields``.
Its fingerprint hashes its config section, its upstream fingerprints, its code version and (for
stages reading raw files) a cheap description of the inputs. ``plan`` computes every stage's
fingerprint and status without running anything; ``execute`` runs one stage through the store.
Both the CLI and the Prefect flows go through these two functions.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from mlm_core.configio import LoadedConfig
from mlm_core.errors import PlanError
from mlm_core.store import Artifact, StageStore, fingerprint

log = logging.getLogger(__name__)
Status = Literal["done", "missing", "stale"]



@dataclass(frozen=True)
class StageSpec:
    name: str
    upstream: tuple[str, ...]
    version: str
    section: Callable[[LoadedConfig], dict]           # the config that determines the output
    run: Callable[..., dict]                          # (lc, upstream: dict[str, Artifact], out_dir) -> manifest fields
    inputs: Callable[[LoadedConfig], Any] | None = None
    summary: str = ""


def _normalize_section(lc: LoadedConfig) -> dict:
    cfg = lc.config
    norm = cfg.normalize.model_dump(exclude={"workers", "memory_limit_mb"})   # speed knobs don't change the output
    return {"sources": {k: v.model_dump() for k, v in sorted(cfg.sources.items())}, "normalize": norm,
            "scripts": {lang: cfg.scripts_for(lang) for lang in cfg.languages}}


def _run_normalize(lc, upstream, out_dir):
    from mlm_core.normalize import run_normalize
    return run_normalize(lc, out_dir)


def _normalize_inputs(lc):
    from mlm_core.normalize.stage import input_fingerprint
    return input_fingerprint(lc)


def _tokenizer_section(lc: LoadedConfig) -> dict:
    cfg = lc.config
    return {"tokenizer": cfg.tokenizer.model_dump(), "alpha": cfg.tokenizer_alpha, "seed": cfg.seed}


def _run_tokenizer(lc, upstream, out_dir):
    from mlm_core.tokenizer import run_tokenizer
    return run_tokenizer(lc, upstream, out_dir)


def _shards_section(lc: LoadedConfig) -> dict:
    # speed knobs and the readers' verification policy don't change what is written
    return {"shards": lc.config.shards.model_dump(exclude={"workers", "batch_docs", "verify"}),
            "languages": lc.config.languages}


def _run_shards(lc, upstream, out_dir):
    from mlm_core.shards import run_shards
    return run_shards(lc, upstream, out_dir)


def _pretrain_section(lc: LoadedConfig) -> dict:
    return {"pretrain": lc.config.pretrain.model_dump(mode="json", exclude={"log_every"}), "seed": lc.config.seed}


def _run_pretrain(lc, upstream, out_dir, metrics_cb=None):
    from mlm_core.train.stage import run_pretrain
    return run_pretrain(lc, upstream, out_dir, metrics_cb=metrics_cb)


def _file_stats(lc: LoadedConfig, paths) -> list:
    """Path, size and mtime of the files a stage reads besides upstream outputs (so edits rerun it)."""
    out = []
    for p in sorted(set(paths)):
        f = lc.resolve(str(p).split("#", 1)[0])
        st = f.stat() if f.exists() else None
        out.append([str(f), st.st_size if st else None, st.st_mtime_ns if st else None])
    return out


def _evaluate_section(lc: LoadedConfig) -> dict:
    return {"evaluate": lc.config.evaluate.model_dump(mode="json"), "seed": lc.config.seed}


def _evaluate_inputs(lc: LoadedConfig):
    ev = lc.config.evaluate
    files = [p for t in (ev.upos, ev.classification) if t for p in [t.train, t.dev, *t.targets.values()] if p]
    return _file_stats(lc, files + list((ev.retrieval or {}).values()))


def _run_evaluate(lc, upstream, out_dir):
    from mlm_core.evaluate.stage import run_evaluate
    return run_evaluate(lc, upstream, out_dir)


def _audit_section(lc: LoadedConfig) -> dict:
    return {"audit": lc.config.audit.model_dump(mode="json")}


def _audit_inputs(lc: LoadedConfig):
    return _file_stats(lc, [*lc.config.audit.crows_pairs.values(), *lc.config.audit.templates.values()])


def _run_audit(lc, upstream, out_dir):
    from mlm_core.audit.stage import run_audit_stage
    return run_audit_stage(lc, upstream, out_dir)


def _register_section(lc: LoadedConfig) -> dict:
    return {"registry": lc.config.registry.model_dump(mode="json")}


def _run_register(lc, upstream, out_dir):
    from mlm_core.register import run_register
    return run_register(lc, upstream, out_dir)


# Versions: bump a stage's version when its code changes what it writes for the same config.
STAGES: dict[str, StageSpec] = {
    "normalize": StageSpec("normalize", (), "1", _normalize_section, _run_normalize,
                           _normalize_inputs, "clean, filter and deduplicate the raw corpus per language"),
    "tokenizer": StageSpec("tokenizer", ("normalize",), "1", _tokenizer_section, _run_tokenizer,
                           summary="train a tokenizer on a language-balanced sample"),
    "shards": StageSpec("shards", ("normalize", "tokenizer"), "1", _shards_section, _run_shards,
                        summary="encode, pack and write Arrow shards with the language sampling table"),
    "pretrain": StageSpec("pretrain", ("normalize", "tokenizer", "shards"), "1", _pretrain_section, _run_pretrain,
                          summary="train the encoder (MLM or ELECTRA), checkpoint, export"),
    "evaluate": StageSpec("evaluate", ("normalize", "shards", "pretrain"), "1", _evaluate_section, _run_evaluate,
                          _evaluate_inputs, summary="per-language metrics and zero-shot transfer"),
    "audit": StageSpec("audit", ("pretrain",), "1", _audit_section, _run_audit, _audit_inputs,
                       summary="CrowS-Pairs and template bias audits"),
    "register": StageSpec("register", ("pretrain", "evaluate", "audit"), "1", _register_section, _run_register,
                          summary="promotion gates and the model card"),
}


def stage_names() -> list[str]:
    return list(STAGES)


def downstream_of(name: str) -> list[str]:
    """``name`` and every stage depending on it, in pipeline order."""
    out = [name]
    for s in STAGES.values():
        if any(u in out for u in s.upstream) and s.name not in out:
            out.append(s.name)
    return out


@dataclass(frozen=True)
class StagePlan:
    name: str
    fingerprint: str
    upstream: dict[str, str]
    path: Path
    status: Status
    config: dict

    def as_row(self, store: StageStore) -> dict:
        size = store.load(self.name, self.fingerprint).size_bytes() if self.status == "done" else None
        return {"stage": self.name, "status": self.status, "fingerprint": self.fingerprint,
                "path": str(self.path), "bytes": size}


def plan(lc: LoadedConfig, store: StageStore | None = None) -> dict[str, StagePlan]:
    """Fingerprint and status of every stage (done / missing / stale), without running anything."""
    store = store or StageStore(lc.workdir)
    out: dict[str, StagePlan] = {}
    for spec in STAGES.values():
        up = {u: out[u].fingerprint for u in spec.upstream}
        section = spec.section(lc)
        inputs = spec.inputs(lc) if spec.inputs else None
        fp = fingerprint(spec.name, spec.version, section, up, inputs)
        if store.is_complete(spec.name, fp):
            status: Status = "done"
        elif store.complete_outputs(spec.name):
            status = "stale"
        else:
            status = "missing"
        out[spec.name] = StagePlan(spec.name, fp, up, store.out_dir(spec.name, fp), status, section)
    return out


def select(plans: dict[str, StagePlan], only: str | None = None, from_: str | None = None) -> list[str]:
    """Stages to execute for ``--only`` / ``--from`` (all of them by default); checks upstream outputs exist."""
    for opt, name in (("--only", only), ("--from", from_)):
        if name is not None and name not in STAGES:
            raise PlanError(f"{opt} {name}: unknown stage (stages: {', '.join(STAGES)})")
    if only and from_:
        raise PlanError("give at most one of --only and --from")
    chosen = [only] if only else downstream_of(from_) if from_ else list(STAGES)
    for name in chosen:
        for u in STAGES[name].upstream:
            if u not in chosen and plans[u].status != "done":
                raise PlanError(f"stage {name!r} needs the output of {u!r} (fingerprint {plans[u].fingerprint}), "
                                f"which is {plans[u].status}: run `mlm run CONFIG --only {u}` (or without --only) first")
    return chosen


def execute(lc: LoadedConfig, name: str, plans: dict[str, StagePlan], force: bool = False,
            check: Callable[[Path, dict], None] | None = None,
            store: StageStore | None = None, hooks: dict | None = None) -> tuple[Artifact, bool]:
    """Run one stage unless its output is complete (and not forced). Returns (artifact, cache_hit).

    ``hooks``: optional callbacks passed to the stage function by name (e.g. ``metrics_cb`` for pretrain,
    called with each training metrics record so the caller can stream them to a tracker)."""
    store = store or StageStore(lc.workdir)
    spec, p = STAGES[name], plans[name]
    if not force and store.is_complete(name, p.fingerprint):
        log.info("%s: cached (%s)", name, p.fingerprint)
        return store.load(name, p.fingerprint, verify=lc.config.verify), True
    upstream = {}
    for u, ufp in p.upstream.items():
        if not store.is_complete(u, ufp):
            raise PlanError(f"stage {name!r} needs {u!r} output {ufp}, which is missing: run stage {u!r} first")
        upstream[u] = store.load(u, ufp, verify=lc.config.verify)   # corrupt: CorruptOutputError
    base = {"config": p.config, "upstream": p.upstream, "version": spec.version}
    log.info("%s: running (%s)", name, p.fingerprint)
    art = store.write(name, p.fingerprint, lambda out: spec.run(lc, upstream, out, **(hooks or {})), base,
                      check=check)
    return art, False
