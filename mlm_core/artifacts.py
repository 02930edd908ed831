"""Typed stage outputs: one frozen dataclass per stage, parsed from its ``manifest.json`` in one place.

Each type's fields ARE the manifest's key names (a field's name is the key it is read from), so a key is named in
one place: here. ``from_manifest(path, manifest)`` checks that every required key is present (a missing one, e.g. a
key renamed by other code, raises ``ManifestError`` naming the manifest file and the key) and copies the values;
optional keys (written only under some configs, or added by a later code version) default to empty. The raw
manifest stays on the object (``manifest``) for the keys no reader has a type for yet.

The store writes what it always writes (``config``, ``upstream``, ``output_key``, ``code_version``, ``thresholds``,
``created_at``, ``files``...) around the stage's own fields (``mlm_core.store.StageStore.write``); every type has
those as ``config``/``upstream``/``created_at``. ``ARTIFACT_TYPES`` maps a stage name to its type;
``StageStore.load`` returns it, and ``mlm_core.stages.execute`` hands each stage its upstream (and declared
context) outputs as these types. A stage with no entry (a test stage) gets a generic ``StageArtifact``.

Writers: each manifest is built in one place, the stage's ``run``; the tokenizer's, which two code paths produce,
by ``tokenizer_manifest`` (``mlm_core.tokenizer.stage`` and ``mlm_core.tokenizer.from_stage`` both call it).

A leaf module: it imports only ``mlm_core.errors``, so the store can import it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mlm_core.errors import MlmError

MANIFEST_FILE = "manifest.json"     # == mlm_core.store.MANIFEST (kept here so this module stays a leaf)


class ManifestError(MlmError, ValueError):
    """A stage manifest lacks a key its type requires (or is not a JSON object)."""


def _opt(default: Any = None) -> Any:
    """An optional manifest key: absent -> ``default`` (a fresh copy for dict / list)."""
    if isinstance(default, (dict, list)):
        return field(default_factory=type(default))
    return field(default=default)


@dataclass(frozen=True, kw_only=True)
class StageArtifact:
    """What every stored output has: where it is, its fingerprint, and the store's own manifest keys."""

    stage: ClassVar[str] = ""
    # names of the fields that are not manifest keys
    _NOT_KEYS: ClassVar[frozenset[str]] = frozenset({"path", "fingerprint", "manifest"})

    path: Path
    fingerprint: str
    manifest: dict = field(repr=False, compare=False)
    config: dict = _opt({})
    upstream: dict = _opt({})
    created_at: float | None = _opt()

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The manifest keys this type reads (its field names)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in cls._NOT_KEYS)

    @classmethod
    def required_keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in cls._NOT_KEYS
                     and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)

    @classmethod
    def from_manifest(cls, path: Path | str, manifest: dict, fingerprint: str | None = None, strict: bool = True):
        """The typed output stored in ``path`` from its parsed ``manifest``; ManifestError names file and key.

        ``strict=False`` (listing every stored output, old code versions included): a missing required key
        reads as None instead of raising, so an old output can still be listed, sized and removed."""
        path = Path(path)
        where = path / MANIFEST_FILE
        if not isinstance(manifest, dict):
            raise ManifestError(f"{where}: not a JSON object (a {cls.stage} manifest is one)")
        missing = [k for k in cls.required_keys() if k not in manifest]
        if missing and strict:
            raise ManifestError(f"{where}: the {cls.stage} manifest has no key {missing[0]!r} (a {cls.__name__} "
                                f"needs {', '.join(cls.required_keys())}); rebuild the output with "
                                f"`mlm run CONFIG --only {cls.stage} --force`")
        values = {k: manifest[k] for k in cls.keys() if k in manifest} | dict.fromkeys(missing)
        fp = str(fingerprint or manifest.get("fingerprint") or path.name)
        return cls(path=path, fingerprint=fp, manifest=manifest, **values)

    @property
    def stats(self) -> dict:
        return self.manifest.get("stats", {})

    def size_bytes(self) -> int:
        """The stored files' total size, from the manifest's file table."""
        return sum(f["bytes"] for f in self.manifest.get("files", {}).values())


@dataclass(frozen=True, kw_only=True)
class NormalizedCorpus(StageArtifact):
    """normalize: ``docs/<lang>.parquet``; per-language counts (docs, chars, bytes, duplicates, quarantined...)."""

    stage: ClassVar[str] = "normalize"
    languages: dict
    counts: dict
    quarantine_rate: float | None = _opt()
    empty_files: list = _opt([])


@dataclass(frozen=True, kw_only=True)
class TokenizerArtifact(StageArtifact):
    """tokenizer: ``tokenizer.json`` (trained, or an existing one: ``source`` and, extended, ``extension``)."""

    stage: ClassVar[str] = "tokenizer"
    algorithm: str
    style: str
    vocab_size_requested: int
    vocab_size: int
    special_tokens: dict            # role -> {"token", "id"}
    lowercase: bool
    sample: dict
    languages: dict                 # lang -> held-out statistics (tokens_per_word, tokens_per_char, unk_rate...)
    vocab_scripts: dict
    counts: dict
    pmi: dict | None = _opt()       # tokenizer.pmi_vocab
    source: dict | None = _opt()    # tokenizer.from / pretrain.init_from: {ref, content_hash, files, family}
    extension: dict | None = _opt()  # tokenizer.extend > 0: {base_vocab_size, added}


def tokenizer_manifest(*, algorithm: str, style: str, vocab_size_requested: int, vocab_size: int, specials: dict,
                       lowercase: bool, sample, languages: dict, scripts: dict, train_seconds: float,
                       source: dict | None = None, extension: dict | None = None) -> dict:
    """The tokenizer stage's manifest fields (TokenizerArtifact's keys), for a trained or an existing tokenizer.

    ``specials``: role -> (token, id); ``sample``: the training sample (``summary()``, ``bytes``, ``docs``);
    ``scripts``: script -> number of vocabulary tokens (stored as shares)."""
    n_scripts = sum(scripts.values()) or 1
    out = {
        "algorithm": algorithm, "style": style,
        "vocab_size_requested": vocab_size_requested, "vocab_size": vocab_size,
        "special_tokens": {role: {"token": t, "id": i} for role, (t, i) in specials.items()},
        "lowercase": lowercase,
        "sample": sample.summary(),
        "languages": languages,
        "vocab_scripts": {s: n / n_scripts for s, n in scripts.items()},
        "counts": {"vocab_size": vocab_size, "sample_bytes": sample.bytes, "sample_docs": sample.docs,
                   "train_seconds": round(train_seconds, 3)},
    }
    if source is not None:
        out["source"] = source
    if extension is not None:
        out["extension"] = extension
    return out


@dataclass(frozen=True, kw_only=True)
class ShardSet(StageArtifact):
    """shards: Arrow shards (``shards`` lists them), the language sampling table and per-language token counts."""

    stage: ClassVar[str] = "shards"
    seq_len: int
    vocab_size: int
    special_tokens: dict
    languages: dict                 # lang -> {tokens_train, ...}
    sampling: dict                  # {"alpha", "table": [{"lang", "p", ...}]}
    shards: list
    tokenizer_fingerprint: str | None = _opt()
    validation_docs: dict = _opt({})
    dropped_languages: list = _opt([])
    cda: dict | None = _opt()       # shards.cda

    def sampling_weights(self) -> dict[str, float]:
        """p(l) per language from the sampling table."""
        return {r["lang"]: r["p"] for r in self.sampling.get("table") or []
                if isinstance(r, dict) and "lang" in r and "p" in r}


@dataclass(frozen=True, kw_only=True)
class PretrainedModel(StageArtifact):
    """pretrain: the exported encoder, ``metrics.jsonl``. Written by ``mlm_core.train.stage.run_pretrain`` (its
    one writer); these fields are its keys."""

    stage: ClassVar[str] = "pretrain"
    objective: str
    arch: dict
    steps: int
    tokens: int
    metrics: dict
    final_loss: float | None = _opt()
    eval: dict = _opt({})           # lang -> {loss, acc, baseline_acc} at the end of training
    counts: dict = _opt({})
    plateau: dict | None = _opt()

    def seq_len(self) -> int | None:
        """The shards' seq_len recorded in the config (None when the config does not hold it)."""
        v = (self.config.get("shards") or {}).get("seq_len")
        return int(v) if v else None


@dataclass(frozen=True, kw_only=True)
class Evaluation(StageArtifact):
    """evaluate: ``evaluation.json`` and tables; ``metrics`` flat (``<lang>.top1``, ``<task>.<lang>.score``...)."""

    stage: ClassVar[str] = "evaluate"
    languages: dict
    metrics: dict
    transfer: list = _opt([])
    missing_languages: list = _opt([])
    efficiency: dict | None = _opt()
    counts: dict = _opt({})
    debias: dict | None = _opt()

    def task_config(self) -> dict:
        """The evaluate section of the config (task -> its settings, e.g. source_lang)."""
        return (self.config.get("evaluate") or {}) if isinstance(self.config, dict) else {}


@dataclass(frozen=True, kw_only=True)
class Audit(StageArtifact):
    """audit: ``audit.json``; CrowS-Pairs per language, template scores, flat ``metrics``."""

    stage: ClassVar[str] = "audit"
    crows: list
    metrics: dict
    templates: dict = _opt({})
    limits: str | None = _opt()
    counts: dict = _opt({})
    debias: dict | None = _opt()


@dataclass(frozen=True, kw_only=True)
class Registration(StageArtifact):
    """register: ``gates.json``, ``model_card.md``; the gate decision."""

    stage: ClassVar[str] = "register"
    gates: list
    passed: bool
    failed_gates: list
    pretrain_fingerprint: str
    model_name: str | None = _opt()
    counts: dict = _opt({})


ARTIFACT_TYPES: dict[str, type[StageArtifact]] = {
    t.stage: t for t in (NormalizedCorpus, TokenizerArtifact, ShardSet, PretrainedModel, Evaluation, Audit,
                         Registration)}


_GENERIC: dict[str, type[StageArtifact]] = {}


def artifact_type(stage: str) -> type[StageArtifact]:
    """The output type of ``stage``: ARTIFACT_TYPES's, else (a stage that declares no type of its own, such as a
    stage added by a plugin or a test) a ``StageArtifact`` named for it, with only the store's keys."""
    if stage in ARTIFACT_TYPES:
        return ARTIFACT_TYPES[stage]
    if stage not in _GENERIC:
        _GENERIC[stage] = type(f"{stage.title().replace('_', '')}Output", (StageArtifact,), {"stage": stage})
    return _GENERIC[stage]


def parse(stage: str, path: Path | str, manifest: dict, fingerprint: str | None = None,
          strict: bool = True) -> StageArtifact:
    """The typed output of ``stage`` (``artifact_type``) stored in ``path``."""
    return artifact_type(stage).from_manifest(path, manifest, fingerprint, strict)


__all__ = ["ARTIFACT_TYPES", "Audit", "Evaluation", "ManifestError", "NormalizedCorpus", "PretrainedModel",
           "Registration", "ShardSet", "StageArtifact", "TokenizerArtifact", "artifact_type", "parse",
           "tokenizer_manifest"]
