"""Inputs that come from outside the pipeline: an existing tokenizer (``tokenizer.from``) or model
(``pretrain.init_from``), given as a local folder or a registry address.

In: a reference string from the config, the config's folder (relative paths are relative to it) and the
workdir. Out: a local folder, and that folder's *content hash*, which is what enters a stage fingerprint
(not the path: the same files under another path give the same fingerprint; an alias that moves to another
version gives a new one).

``mlm_core`` imports no MLflow: registry addresses (``models:/NAME@ALIAS``, ``models:/NAME/VERSION``) are
resolved by a resolver that the tasks layer registers (``tasks.external.install``); without one, such an
address is a clear error. A resolver materializes the version once under ``<workdir>/imports/`` and returns
that folder, so planning, fingerprinting and the stages all read the same local files.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

from mlm_core.errors import MlmError

# prefix -> fn(ref, lc) -> local folder (lc: the LoadedConfig: its workdir, base_dir and tracking settings)
_RESOLVERS: dict[str, Callable[[str, object], Path]] = {}
# the files whose bytes define a model or tokenizer folder; anything else (README, .gitattributes, caches) is ignored
CONTENT_SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".parquet")
HASH_CACHE = ".mlm-content-hash.json"
# the files of a model folder that define its tokenizer (+ the model config, which names the family): the
# tokenizer stage taking the tokenizer of pretrain.init_from hashes only these, so continued weights, or a
# changed weight file, leave the tokenizer (and the shards) as they are
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "sentencepiece.bpe.model", "spiece.model",
                   "tokenizer.model", "config.json", "model_config.json")


class ExternalRefError(MlmError, ValueError):
    """A tokenizer.from / pretrain.init_from reference that does not resolve to a readable folder."""


def register_resolver(prefix: str, fn: Callable[[str, object], Path]) -> None:
    """Install ``fn`` for references starting with ``prefix`` (e.g. ``"models:/"``); replaces an earlier one."""
    _RESOLVERS[prefix] = fn


def is_registry_ref(ref: str) -> bool:
    return ref.startswith("models:/")


def resolve_ref(ref: str, lc, field: str) -> Path:
    """A local folder for ``ref``; ``lc`` is the LoadedConfig (relative paths are relative to its base_dir).
    ``field`` (e.g. ``pretrain.init_from``) names the key in every error."""
    for prefix, fn in _RESOLVERS.items():
        if ref.startswith(prefix):
            try:
                return Path(fn(ref, lc))
            except MlmError as e:       # the resolver knows the address, not the config key: name it here
                raise ExternalRefError(f"{field}: {e}") from None
    if is_registry_ref(ref):
        raise ExternalRefError(f"{field}: {ref!r} is a registry address, and no registry resolver is installed "
                               f"(run through `mlm` or the Prefect flows, which install it), or give a local folder")
    p = Path(ref).expanduser()
    if not p.is_absolute():
        p = Path(lc.base_dir) / p
    if not p.exists():
        raise ExternalRefError(f"{field}: {p} does not exist")
    if not p.is_dir():
        raise ExternalRefError(f"{field}: {p} is a file; give the folder that holds it")
    return p.resolve()


def _content_files(folder: Path, names: tuple[str, ...] | None = None) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in CONTENT_SUFFIXES
                  and (names is None or p.name in names)
                  and p.name != HASH_CACHE and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_hash(path: Path | str, cache_dir: Path | str | None = None) -> str:
    """sha256 of one input file's bytes. A large corpus file is hashed once: the digest is cached in
    ``cache_dir`` keyed by the file's real path and reused while its size, mtime and inode are unchanged (a copy
    of the same bytes elsewhere, or a fresh mtime, only costs one more hash, never a different fingerprint).
    The cache is written only when ``cache_dir``'s parent (the workdir) already exists."""
    path = Path(path)
    st = path.stat()
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    cache = None
    if cache_dir is not None:
        real = os.path.realpath(path)
        cache = Path(cache_dir) / "file-hash" / f"{hashlib.sha256(real.encode()).hexdigest()[:24]}.json"
        try:
            got = json.loads(cache.read_text(encoding="utf-8"))
            if got.get("path") == real and got.get("stamp") == stamp:
                return got["sha256"]
        except (OSError, ValueError):
            pass
    digest = _sha256(path)
    # only into a workdir that exists: planning (mlm status, a plan that fails) never creates the workdir
    if cache is not None and Path(cache_dir).parent.is_dir():
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"path": real, "stamp": stamp, "sha256": digest}),
                           encoding="utf-8")
            os.replace(tmp, cache)
        except OSError:         # a read-only workdir (mlm status on a shared store): hash again next time
            pass
    return digest


def discriminator_sibling(folder: Path) -> Path | None:
    """This pipeline's ELECTRA export given by its generator folder ``<run>/hf``: the sibling
    ``<run>/hf-discriminator`` (read, fingerprinted and import-checked with it), else None."""
    sib = Path(folder).parent / "hf-discriminator"
    return sib if Path(folder).name == "hf" and sib.is_dir() else None


def content_hash(folder: Path | str, cache_dir: Path | str | None = None,
                 names: tuple[str, ...] | None = None) -> str:
    """sha256 over (relative path, sha256) of the folder's content files (``CONTENT_SUFFIXES``), in path order;
    ``names``: only files with these names (e.g. ``TOKENIZER_FILES``).

    A multi-GB checkpoint is hashed once: the per-file hashes are cached in ``cache_dir`` (default: none) keyed
    by the folder, each file's size and mtime, and reused while none of them changes.
    """
    folder = Path(folder).resolve()
    files = _content_files(folder, names)
    if not files:
        raise ExternalRefError(f"{folder}: no model or tokenizer files (none of "
                               f"{', '.join(names) if names else ', '.join('*' + x for x in CONTENT_SUFFIXES)})")
    stamp = [[p.relative_to(folder).as_posix(), p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    cache = None
    if cache_dir is not None:
        key = hashlib.sha256(f"{folder}\0{names}".encode()).hexdigest()[:16]
        cache = Path(cache_dir) / f"content-hash-{key}.json"
        try:
            got = json.loads(cache.read_text(encoding="utf-8"))
            if got.get("stamp") == stamp:
                return got["hash"]
        except (OSError, ValueError):
            pass
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(folder).as_posix().encode() + b"\0" + _sha256(p).encode() + b"\n")
    digest = h.hexdigest()
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"folder": str(folder), "stamp": stamp, "hash": digest}), encoding="utf-8")
        os.replace(tmp, cache)
    return digest


def cache_dir(lc) -> Path:
    """Where content hashes of external folders are cached: ``<workdir>/.cache``."""
    return Path(lc.workdir) / ".cache"


def external_input(lc, ref: str | None, field: str, names: tuple[str, ...] | None = None) -> dict | None:
    """What a stage fingerprint records for an external reference: {"content_hash": ...} of the folder it
    resolves to (None when unset), over the files named ``names`` only when given. Not the path or the
    address: the same files under another path give the same fingerprint, a changed byte (or an alias moved
    to another version) a new one."""
    if ref is None:
        return None
    return {"content_hash": folder_hash(resolve_ref(ref, lc, field), lc, field, names)}


def folder_hash(folder: Path, lc, field: str, names: tuple[str, ...] | None = None) -> str:
    """``content_hash`` of a resolved folder (cached under the workdir); errors name ``field``."""
    try:
        return content_hash(folder, cache_dir(lc), names)
    except ExternalRefError as e:
        raise ExternalRefError(str(e) if str(e).startswith(field) else f"{field}: {e}") from None


__all__ = ["ExternalRefError", "TOKENIZER_FILES", "register_resolver", "resolve_ref", "content_hash", "is_registry_ref",
           "cache_dir", "external_input", "folder_hash"]
