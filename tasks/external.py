"""The ``models:/`` resolver for ``tokenizer.from`` / ``pretrain.init_from`` (``mlm_core.external``).

In: ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` and the LoadedConfig (its tracking settings locate
the registry: ``tracking.uri``, else ``$MLM_TRACKING_URI``, else ``<workdir>/mlflow.db``). Out: the model
folder of that version, downloaded ONCE into ``<workdir>/imports/models/<name>/v<version>/``.

The alias is looked up on every call (it may move: a moved alias resolves to another version folder, whose
content hash gives new fingerprints); a version is immutable, so its folder is reused (``NAME/VERSION`` with
an intact import does not even ask the registry: it works offline). The download goes to
a temporary folder renamed into place (a killed download never looks complete), and ``.mlm-import.json``
records the model folder inside it and its content hash (an ELECTRA version: also its sibling
``hf-discriminator/``'s), re-checked on every reuse (a file edited or
deleted since is downloaded again, with a warning).

``install()`` registers the resolver; ``flows/__init__.py`` calls it, so every ``mlm`` command and every
Prefect flow (both import the ``flows`` package first) resolves registry addresses the same way.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path

from mlm_core.errors import MlmError
from mlm_core.redact import redact

log = logging.getLogger(__name__)
PREFIX = "models:/"
RECORD = ".mlm-import.json"


class RegistryImportError(MlmError, ValueError):
    """A registry address that cannot be resolved (no registry, unknown model or alias, damaged download)."""


def install() -> None:
    from mlm_core.external import register_resolver
    register_resolver(PREFIX, resolve)


def _safe(name: str) -> str:
    """A folder name for a registered model name (free text in MLflow)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"


def _tracking_uri(ref: str, lc) -> str:
    from tasks.tracking import resolve_tracking_uri, sqlite_path
    tcfg = lc.config.tracking
    if not tcfg.enabled and not tcfg.uri and not os.environ.get("MLM_TRACKING_URI"):
        raise RegistryImportError(f"{ref} needs a model registry, but tracking is off (tracking.enabled: false) and no "
                           f"tracking.uri is set: set tracking.uri to the registry's store, or give a local folder")
    uri = resolve_tracking_uri(tcfg, lc.workdir)
    db = sqlite_path(uri)
    if db is not None and not db.is_file():     # never create an empty registry just to look something up
        raise RegistryImportError(f"{ref}: no model registry at {redact(uri)} (the database {db} does not exist): set "
                           f"tracking.uri to the store the model was registered in, or give a local folder")
    return uri


def _version(ref: str, uri: str) -> tuple[str, int]:
    from mlflow.exceptions import MlflowException

    from tasks import tracking
    from tasks.registry import RegistryError, parse_ref
    try:
        name, alias, version = parse_ref(ref)
    except RegistryError as e:
        raise RegistryImportError(str(e)) from None
    client = tracking.mlflow_client(uri)
    try:
        mv = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, version)
    except MlflowException as exc:
        known = tracking.list_registered_models(uri)
        raise RegistryImportError(f"{ref}: not found in the registry at {redact(uri)} "
                           f"({redact(exc.message.splitlines()[0])}); registered models: {', '.join(known) or 'none'}"
                           ) from None
    return name, int(mv.version)


def _reuse(dest: Path, cache: Path) -> Path | None:
    """The model folder of a complete earlier download whose files still hash as recorded, else None."""
    from mlm_core.external import ExternalRefError, content_hash, discriminator_sibling
    try:
        rec = json.loads((dest / RECORD).read_text(encoding="utf-8"))
        folder = dest / rec["model_dir"]
        # a discriminator edited or deleted since the import is downloaded again, like the generator
        if content_hash(folder, cache) == rec["content_hash"] and (
                "discriminator_content_hash" not in rec
                or ((disc := discriminator_sibling(folder)) is not None
                    and content_hash(disc, cache) == rec["discriminator_content_hash"])):
            return folder
    except (OSError, ValueError, KeyError, ExternalRefError):
        pass
    log.warning("%s: the downloaded model changed since it was imported; downloading it again", dest)
    return None


def resolve(ref: str, lc) -> Path:
    """The local model folder of ``ref`` (see the module docstring)."""
    from mlm_core.external import cache_dir, content_hash, discriminator_sibling
    from mlm_core.locks import file_lock
    from tasks.registry import RegistryError, parse_ref
    cache = cache_dir(lc)
    try:
        name, _, pinned = parse_ref(ref)
    except RegistryError as e:
        raise RegistryImportError(str(e)) from None
    imports = Path(lc.workdir) / "imports" / "models" / _safe(name)
    if pinned is not None and pinned.isdigit() and (imports / f"v{int(pinned)}").is_dir():
        # a version never changes: an intact import is used without asking the registry (works offline)
        if (got := _reuse(imports / f"v{int(pinned)}", cache)) is not None:
            return got
    uri = _tracking_uri(ref, lc)
    name, version = _version(ref, uri)
    dest = imports / f"v{version}"
    if dest.is_dir() and (got := _reuse(dest, cache)) is not None:
        return got
    with file_lock(dest.parent / f".v{version}.lock", f"import of {name} version {version}"):
        if dest.is_dir():              # another process finished it while we waited, or a damaged copy
            if (got := _reuse(dest, cache)) is not None:
                return got
            shutil.rmtree(dest)
        tmp = dest.parent / f".tmp-v{version}-{uuid.uuid4().hex[:8]}"
        try:
            folder = _download(name, version, uri, tmp)
            rel = folder.relative_to(tmp).as_posix()
            rec = {"ref": ref, "name": name, "version": version, "model_dir": rel, "content_hash": content_hash(folder)}
            if (disc := discriminator_sibling(folder)) is not None:
                rec["discriminator_content_hash"] = content_hash(disc)
            (tmp / RECORD).write_text(json.dumps(rec), encoding="utf-8")
            os.rename(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s: version %d imported into %s", ref, version, dest)
    return dest / rel


def _download(name: str, version: int, uri: str, tmp: Path) -> Path:
    """Download the version's artifacts into ``tmp``; the model folder in it (``tasks.mlflow_model.model_dir_in``)."""
    import mlflow

    from tasks import tracking
    from tasks.mlflow_model import model_dir_in
    client = tracking.mlflow_client(uri)
    tmp.mkdir(parents=True)
    # the version's storage location, with the URIs passed explicitly (not mv.source, models:/m-<id>, which
    # MLflow resolves through the process-wide tracking URI; see tasks.registry.resolve_model)
    where = client.get_model_version_download_uri(name, str(version))
    got = mlflow.artifacts.download_artifacts(artifact_uri=where, dst_path=str(tmp), tracking_uri=uri,
                                              registry_uri=uri)
    return model_dir_in(Path(got))


__all__ = ["install", "resolve", "RegistryImportError"]
