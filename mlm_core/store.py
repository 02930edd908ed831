"""Content-addressed, atomic stage store: ``<workdir>/<stage>/<fingerprint>/``.

A stage writes into a temporary sibling folder (``.tmp-<fingerprint>-<pid>-<nonce>``), the store
writes ``manifest.json`` last (fsync'd), then renames the folder into place. An output is complete
iff its manifest exists; temporary folders are never read and are cleaned up once their writer is
gone. Reference: the completion-marker idea of datatrove and Cramming's hash-of-config data cache.

A stored output is verified, not trusted: ``load(..., verify=POLICY)`` checks it against its manifest's
file table before anyone reads it. Every file's size always; sha256 per the policy: "always" hashes
every file on every load, "once" hashes a file once and records it in the sidecar ``.verified.json``
(keyed by relative path: size, mtime_ns, sha256), so later loads only stat it unless it changed,
"size" never hashes. Missing files and files the manifest does not list are problems too. Every
problem is collected into one ``VerifyReport``; a bad one raises ``CorruptOutputError``.
The sidecar is the store's own bookkeeping: not in the manifest, not in any fingerprint.
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
from typing import Any, Callable, Literal

from mlm_core.artifacts import StageArtifact, parse
from mlm_core.errors import StageError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
VERIFIED = ".verified.json"          # sidecar: files already hashed and found equal to the manifest
VerifyPolicy = Literal["once", "always", "size"]
VERIFY_POLICIES = ("once", "always", "size")


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
    """Size and sha256 of every file under ``root`` except the store's own files, keyed by relative path."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not _is_store_file(p.relative_to(root).as_posix()):
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


def _is_store_file(rel: str) -> bool:
    """The manifest, the verification sidecar and a sidecar write left by a killed process."""
    return rel in (MANIFEST, VERIFIED) or rel.startswith(f".{VERIFIED}.")


@dataclass(frozen=True)
class FileProblem:
    """One file that does not match the manifest: kind is missing / size / sha256 / extra / manifest."""

    file: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.file}: {self.detail}"


@dataclass
class VerifyReport:
    """Every problem found in one stored output (not only the first), and how much was checked."""

    stage: str
    fingerprint: str
    path: Path
    policy: str
    problems: list[FileProblem] = field(default_factory=list)
    files: int = 0
    hashed: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        head = (f"stored output of stage '{self.stage}' (fingerprint {self.fingerprint}, {self.path}) "
                f"does not match its manifest: {len(self.problems)} problem(s)")
        return head + "".join(f"\n  {p}" for p in self.problems)


class CorruptOutputError(StageError):
    """A stored stage output whose files differ from its manifest (edited, truncated, missing or extra files)."""

    def __init__(self, report: VerifyReport, command: str | None = None):
        """``command``: the rebuild command as the user would type it (``commands.run_command``); without one
        (no config at hand) the hint names the stage's folder and its stage."""
        self.report = report
        hint = (f"rebuild it with `{command}`" if command else
                f"rebuild it with `mlm run` on the config that wrote it, adding `--only {report.stage} --force`")
        super().__init__(f"{report.describe()}\n{hint}")


def verify_files(path: Path, manifest: dict, policy: VerifyPolicy = "once", stage: str = "?",
                 fp: str = "?") -> VerifyReport:
    """Check the folder against ``manifest["files"]`` per ``policy``; reads no manifest-listed data unless hashing."""
    if policy not in VERIFY_POLICIES:
        raise ValueError(f"verify policy {policy!r}: expected one of {', '.join(VERIFY_POLICIES)}")
    path = Path(path)
    rep = VerifyReport(stage, fp, path, policy)
    files = manifest.get("files")
    if not isinstance(files, dict):
        rep.problems.append(FileProblem(MANIFEST, "manifest", "the manifest has no 'files' table to check against"))
        return rep
    rep.files = len(files)
    seen = _read_sidecar(path) if policy == "once" else {}
    record = dict(seen)
    for rel, want in sorted(files.items()):
        f = path / rel
        try:
            st = f.stat()
        except FileNotFoundError:
            rep.problems.append(FileProblem(rel, "missing", "missing (listed in the manifest, not on disk)"))
            continue
        if st.st_size != want["bytes"]:
            rep.problems.append(FileProblem(rel, "size", f"size mismatch: expected {want['bytes']} bytes, got "
                                            f"{st.st_size} (truncated, appended or replaced)"))
            continue
        if policy == "size":
            continue
        mark = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": want["sha256"]}
        if policy == "once" and seen.get(rel) == mark:
            continue                       # hashed before, unchanged since (same size and mtime)
        got = sha256_file(f)
        rep.hashed += 1
        if got != want["sha256"]:
            record.pop(rel, None)
            rep.problems.append(FileProblem(rel, "sha256", f"sha256 mismatch: expected {want['sha256'][:16]}..., "
                                            f"got {got[:16]}... (the file was altered)"))
        else:
            record[rel] = mark
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path).as_posix()
        if p.is_file() and rel not in files and not _is_store_file(rel):
            rep.problems.append(FileProblem(rel, "extra", "unexpected extra file (not in the manifest)"))
    record = {k: v for k, v in record.items() if k in files}
    if policy != "size" and record != seen:
        _write_sidecar(path, record)
    return rep


def _read_sidecar(path: Path) -> dict:
    try:
        data = json.loads((path / VERIFIED).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}                          # absent or unreadable: everything gets hashed again


def _write_sidecar(path: Path, record: dict) -> None:
    try:
        write_json_atomic(path / VERIFIED, record)
    except OSError as exc:                 # a read-only store still verifies, it just cannot remember
        log.debug("cannot record verification in %s: %s", path / VERIFIED, exc)


class StageStore:
    def __init__(self, workdir: Path):
        self.root = Path(workdir)

    def out_dir(self, stage: str, fp: str) -> Path:
        return self.root / stage / fp

    def failed_dir(self, stage: str, fp: str) -> Path:
        """Where a failed run of this stage and fingerprint left its partial output (``write``)."""
        return self.root / stage / f".failed-{fp}"

    def is_complete(self, stage: str, fp: str) -> bool:
        return (self.out_dir(stage, fp) / MANIFEST).is_file()

    def load(self, stage: str, fp: str, verify: VerifyPolicy | None = None, strict: bool = True) -> StageArtifact:
        """The output as its stage's type (``mlm_core.artifacts``: a missing key is a ManifestError naming the
        file; ``strict=False`` reads it as None); with ``verify``, checked against its manifest first
        (CorruptOutputError if not)."""
        d = self.out_dir(stage, fp)
        manifest = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
        if verify is not None:
            rep = verify_files(d, manifest, verify, stage, fp)
            if not rep.ok:
                raise CorruptOutputError(rep)
        return parse(stage, d, manifest, fp, strict)

    def verify(self, stage: str, fp: str, policy: VerifyPolicy = "always") -> VerifyReport:
        """Report (never raise) on a complete output: every file that does not match its manifest."""
        d = self.out_dir(stage, fp)
        try:
            manifest = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            rep = VerifyReport(stage, fp, d, policy)
            rep.problems.append(FileProblem(MANIFEST, "manifest", f"unreadable manifest: {exc}"))
            return rep
        return verify_files(d, manifest, policy, stage, fp)

    def load_optional(self, stage: str, fp: str | None) -> StageArtifact | None:
        """``load`` (manifest only, no file verification) for an output a reader can do without, such as the data
        behind a model card: None when ``fp`` is None, the output is not in the store, or its manifest is
        unreadable or lacks a key (logged as a warning naming the output)."""
        if not fp:
            return None
        try:
            return self.load(stage, fp)
        except (OSError, ValueError) as exc:     # not there (FileNotFoundError), bad JSON, ManifestError
            log.warning("%s output %s is not readable from %s (%s); going on without it", stage, fp, self.root, exc)
            return None

    def complete_outputs(self, stage: str) -> list[StageArtifact]:
        """Every complete output of a stage, newest first (temporary folders are skipped; an old code version's
        manifest lacking a key its type now requires still lists, the key read as None)."""
        d = self.root / stage
        if not d.is_dir():
            return []
        arts = [self.load(stage, p.name, strict=False) for p in d.iterdir()
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
              check: Callable[[Path, dict], None] | None = None) -> StageArtifact:
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
                parse(stage, tmp, manifest, fp)     # the stage's type: a missing key fails here, never complete
                if check is not None:
                    check(tmp, manifest)
            except Exception as exc:
                # keep what was written for inspection (e.g. the quarantine); never as a complete output
                failed = self.failed_dir(stage, fp)
                shutil.rmtree(failed, ignore_errors=True)
                tmp.rename(failed)
                exc.add_note(f"{stage}: the unfinished output is kept for inspection in {failed}")
                raise
            # file_table just hashed every file: record that, so the first "once" load only stats them
            _write_sidecar(tmp, {rel: {"bytes": f["bytes"], "mtime_ns": (tmp / rel).stat().st_mtime_ns,
                                       "sha256": f["sha256"]} for rel, f in manifest["files"].items()})
            write_json_atomic(tmp / MANIFEST, manifest)
            fsync_dir(tmp)
            if final.exists():  # an identical output finished first, a corrupt one, or an incomplete folder
                if (final / MANIFEST).is_file() and self.verify(stage, fp, "always").ok:
                    shutil.rmtree(tmp, ignore_errors=True)
                    shutil.rmtree(self.failed_dir(stage, fp), ignore_errors=True)
                    return self.load(stage, fp)
                # a forced rebuild of a corrupt output replaces it (moved aside first: a rename is atomic)
                old = final.parent / f".old-{fp}-{uuid.uuid4().hex[:8]}"
                os.rename(final, old)
                shutil.rmtree(old, ignore_errors=True)
            os.rename(tmp, final)
            fsync_dir(final.parent)
            # an earlier failed attempt's partial output is superseded by this complete one
            shutil.rmtree(self.failed_dir(stage, fp), ignore_errors=True)
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
