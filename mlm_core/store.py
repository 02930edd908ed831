"""Content-addressed, atomic stage store: ``<workdir>/<stage>/<fingerprint>/``.

A stage writes into a temporary sibling folder (``.tmp-<fingerprint>-<pid>-<nonce>``), the store
writes ``manifest.json`` last (fsync'd), then renames the folder into place. An output is complete
iff its manifest exists; temporary folders are never read and are cleaned up once their writer is
gone. Reference: the completion-marker idea of datatrove and Cramming's hash-of-config data cache.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def fingerprint(stage: str, version: str, config: Any, upstream: dict[str, str], inputs: Any = None) -> str:
    """Hash of what determines a stage's output: its config section, upstream fingerprints, code version, inputs."""
    payload = canonical_json({"stage": stage, "version": version, "config": config,
                              "upstream": upstream, "inputs": inputs})
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def sha256_file(path: Path, bufsize: int = 8 * 2**20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


def file_table(root: Path) -> dict[str, dict]:
    """Size and sha256 of every file under ``root`` except the manifest, keyed by relative path."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            out[p.relative_to(root).as_posix()] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
    return out


def library_versions() -> dict[str, str]:
    from importlib import metadata
    vers = {}
    for dist in ("mlm-pipeline", "pyarrow", "duckdb", "tokenizers", "torch", "datasets", "pydantic"):
        try:
            vers[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return vers


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it is durable (best effort where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass(frozen=True)
class Artifact:
    """A complete stage output: where it is, what produced it, and its manifest (counts, files, versions)."""

    stage: str
    fingerprint: str
    path: Path
    manifest: dict = field(repr=False, compare=False)

    @property
    def stats(self) -> dict:
        return self.manifest.get("stats", {})

    def size_bytes(self) -> int:
        return sum(f["bytes"] for f in self.manifest.get("files", {}).values())


class StageStore:
    def __init__(self, workdir: Path):
        self.root = Path(workdir)

    def out_dir(self, stage: str, fp: str) -> Path:
        return self.root / stage / fp

    def is_complete(self, stage: str, fp: str) -> bool:
        return (self.out_dir(stage, fp) / MANIFEST).is_file()

    def load(self, stage: str, fp: str) -> Artifact:
        d = self.out_dir(stage, fp)
        manifest = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
        return Artifact(stage, fp, d, manifest)

    def complete_outputs(self, stage: str) -> list[Artifact]:
        """Every complete output of a stage, newest first (temporary folders are skipped)."""
        d = self.root / stage
        if not d.is_dir():
            return []
        arts = [self.load(stage, p.name) for p in d.iterdir()
                if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).is_file()]
        return sorted(arts, key=lambda a: a.manifest.get("created_at", 0), reverse=True)

    def cleanup_temporaries(self, stage: str) -> list[Path]:
        """Remove temporary folders whose writing process is gone (left by a killed run)."""
        removed = []
        d = self.root / stage
        if not d.is_dir():
            return removed
        for p in d.glob(".tmp-*"):
            try:
                pid = int(p.name.split("-")[2])
            except (IndexError, ValueError):
                pid = -1
            if pid > 0 and pid_alive(pid) and pid != os.getpid():
                continue
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
        if removed:
            log.info("removed %d leftover temporary folder(s) under %s", len(removed), d)
        return removed

    def write(self, stage: str, fp: str, produce: Callable[[Path], dict], manifest_base: dict,
              check: Callable[[Path, dict], None] | None = None) -> Artifact:
        """Run ``produce(tmp_dir) -> manifest fields`` into a temp folder, write the manifest last, rename into place.

        ``check(tmp_dir, manifest)`` runs before the rename (data contracts): if it raises, the output is
        moved to ``<stage>/.failed-<fingerprint>`` for inspection and never becomes complete.
        """
        self.cleanup_temporaries(stage)
        final = self.out_dir(stage, fp)
        tmp = final.parent / f".tmp-{fp}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        t0 = time.time()
        try:
            try:
                extra = produce(tmp) or {}
                manifest = {**manifest_base, **extra, "stage": stage, "fingerprint": fp,
                            "created_at": time.time(), "duration_s": round(time.time() - t0, 3),
                            "libraries": library_versions(), "files": file_table(tmp)}
                if check is not None:
                    check(tmp, manifest)
            except Exception as exc:
                # keep what was written for inspection (e.g. the quarantine); never as a complete output
                failed = final.parent / f".failed-{fp}"
                shutil.rmtree(failed, ignore_errors=True)
                tmp.rename(failed)
                exc.add_note(f"{stage}: the unfinished output is kept for inspection in {failed}")
                raise
            write_json_atomic(tmp / MANIFEST, manifest)
            fsync_dir(tmp)
            if final.exists():  # an identical output finished first, or an incomplete folder from tampering
                if (final / MANIFEST).is_file():
                    shutil.rmtree(tmp, ignore_errors=True)
                    return self.load(stage, fp)
                shutil.rmtree(final)
            os.rename(tmp, final)
            fsync_dir(final.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self.load(stage, fp)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (a temporary folder's writer may still be working)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
