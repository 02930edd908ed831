"""Reading a shard set: verify it against its manifest, then memory-map the rows zero-copy.

In: a shards stage folder (or its Artifact): ``manifest.json`` + ``train|validation/<lang>-NNNNN.arrow``.
Out: ``ShardDataset``: per (split, lang) the stored columns as zero-copy numpy views (``stored``; read-only,
backed by the page cache: opening allocates ~0 bytes) and, decoded from them at read time (``layout.py``:
word starts unfolded, segment ids rebuilt from [SEP]), input_ids / segment_ids / word_start (``columns``;
``Columns.take`` decodes the three for a batch of rows in one pass); ``get`` / ``get_batch`` return torch
tensors; ``as_hf_dataset`` returns the same files as a ``datasets.Dataset`` (memory-mapped, decoded by a
transform on access). Format v2 sets (three stored columns) are read as before.

Verification happens before the first row is read (``verify``), with the store's policy
(``mlm_core.store.verify_files``): every file of the manifest's file table (the shards, ``sampling.parquet``,
the reports) must exist with its recorded size, and no file may be present that the manifest does not
list. sha256: "always" on every open (alias "every_open"), "once" per file (recorded in the folder's
``.verified.json``, hashed again when the file's size or mtime changes), "size" never; "off" skips the
check (benchmarks, tests). Every problem found is reported at once, checksums included.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from mlm_core.errors import StageError
from mlm_core.shards.layout import Layout, ShardFormatError
from mlm_core.store import MANIFEST, verify_files

log = logging.getLogger(__name__)
Verify = Literal["once", "always", "size", "off", "every_open"]
COLUMNS = ("input_ids", "segment_ids", "word_start")      # what readers get, whatever is stored


class ShardIntegrityError(StageError):
    """A shard set that does not match its manifest (missing, truncated, altered or extra file; wrong tokenizer)."""


def _load_manifest(source) -> tuple[Path, dict]:
    path = Path(getattr(source, "path", source))
    manifest = getattr(source, "manifest", None)
    if manifest is None:
        mf = path / MANIFEST
        if not mf.is_file():
            raise ShardIntegrityError(f"{path}: no {MANIFEST} (not a complete shards output)")
        manifest = json.loads(mf.read_text(encoding="utf-8"))
    if "shards" not in manifest or "seq_len" not in manifest:
        raise ShardIntegrityError(f"{path}: the manifest has no 'shards'/'seq_len' (not a shards stage output)")
    return path, manifest


def shard_problems(path: Path | str, manifest: dict, policy: str = "always") -> list[str]:
    """Every problem of the folder against its manifest: file table (sizes, sha256 per policy, missing, extra
    files of any kind) and the shard list (each shard must be in the file table with the same size and hash)."""
    path = Path(path)
    files = manifest.get("files")
    if not isinstance(files, dict):                # a manifest without a file table: the shard list is all we have
        files = {s["file"]: {"bytes": s["bytes"], "sha256": s["sha256"]} for s in manifest["shards"]}
    rep = verify_files(path, {**manifest, "files": files}, policy,
                       manifest.get("stage", "shards"), manifest.get("fingerprint", "?"))
    problems = [str(p) for p in rep.problems]
    for s in manifest["shards"]:
        want = files.get(s["file"])
        if want is None or (want["bytes"], want["sha256"]) != (s["bytes"], s["sha256"]):
            problems.append(f"{s['file']}: the manifest's shard list and file table disagree (manifest edited)")
    return problems


def verify_shards(path: Path | str, manifest: dict, checksums: bool = True) -> None:
    """Raise ShardIntegrityError listing every problem; nothing is read beyond file metadata and bytes."""
    _raise(Path(path), shard_problems(path, manifest, "always" if checksums else "size"))


def _raise(path: Path, problems: list[str]) -> None:
    if problems:
        raise ShardIntegrityError(f"shard set {path} does not match its manifest ({len(problems)} problem(s)):\n  "
                                  + "\n  ".join(problems)
                                  + "\nrebuild it with `mlm run <config> --only shards --force`")


def check_shard_set(source, verify: Verify = "once", expect_tokenizer_fingerprint: str | None = None
                    ) -> tuple[Path, dict]:
    """Load the manifest, check the tokenizer fingerprint and the files per ``verify``; returns (path, manifest)."""
    path, manifest = _load_manifest(source)
    policy = {"every_open": "always"}.get(verify, verify)
    if policy not in ("always", "once", "size", "off"):
        raise ValueError(f"verify={verify!r}: expected one of always, once, size, off")
    try:
        Layout.from_manifest(manifest, str(path))
    except ShardFormatError as e:
        raise ShardIntegrityError(str(e)) from None
    problems = []
    if expect_tokenizer_fingerprint is not None:
        got = manifest.get("tokenizer_fingerprint")
        if got != expect_tokenizer_fingerprint:
            problems.append(f"shard set was built with tokenizer {got}, expected {expect_tokenizer_fingerprint}")
    if policy != "off":
        problems += shard_problems(path, manifest, policy)
    _raise(path, problems)
    return path, manifest


@dataclass(frozen=True)
class Rows:
    """One column of one (split, lang): a sequence of zero-copy (rows_i, seq_len) arrays, one per shard file."""

    parts: tuple[np.ndarray, ...]

    def __post_init__(self):
        object.__setattr__(self, "_starts", np.cumsum([0] + [len(p) for p in self.parts]))

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def shape(self) -> tuple[int, int]:
        return len(self), (self.parts[0].shape[1] if self.parts else 0)

    @property
    def dtype(self) -> np.dtype:
        return self.parts[0].dtype

    def __array__(self, dtype=None, copy=None):
        """The whole column: zero-copy when it is a single shard, else concatenated (a copy)."""
        arr = self.parts[0] if len(self.parts) == 1 else np.concatenate(self.parts)
        return arr if dtype is None else arr.astype(dtype)

    def take(self, indices) -> np.ndarray:
        """Rows at ``indices`` (any order, repeats allowed): one fancy-index per shard touched (a copy)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if len(idx) and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"row index out of range for {n} rows")
        idx = np.where(idx < 0, idx + n, idx)
        if len(self.parts) == 1:
            return self.parts[0][idx]
        shard = np.searchsorted(self._starts, idx, side="right") - 1
        out = np.empty((len(idx), self.shape[1]), dtype=self.dtype)
        for s in np.unique(shard):
            sel = shard == s
            out[sel] = self.parts[s][idx[sel] - self._starts[s]]
        return out

    def __getitem__(self, i):
        if isinstance(i, (int, np.integer)):
            n = len(self)
            if not -n <= i < n:
                raise IndexError(f"row {i} out of range for {n} rows")
            i = int(i) + n if i < 0 else int(i)
            s = int(np.searchsorted(self._starts, i, side="right") - 1)
            return self.parts[s][i - self._starts[s]]           # a zero-copy view of one row
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        return self.take(i)


class Column:
    """One decoded column (input_ids, segment_ids or word_start) of one (split, lang), read like ``Rows``:
    ``take``, indexing, ``len``, ``parts`` (decoded one shard file at a time). Every read is a decoded copy."""

    def __init__(self, cols: "Columns", name: str):
        self.cols, self.name = cols, name

    def __len__(self) -> int:
        return len(self.cols)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self), self.cols.layout.seq_len

    @property
    def dtype(self) -> np.dtype:
        lay = self.cols.layout
        return {"input_ids": lay.ids, "segment_ids": lay.seg_dtype, "word_start": np.dtype(np.uint8)}[self.name]

    def _decode(self, stored: dict[str, np.ndarray]) -> np.ndarray:
        return self.cols.layout.decode_field(stored, self.name)

    def take(self, indices) -> np.ndarray:
        return self._decode({c: r.take(indices) for c, r in self.cols.stored.items()})

    @property
    def parts(self) -> "_Parts":
        return _Parts(self)

    def __array__(self, dtype=None, copy=None):
        arr = self.take(np.arange(len(self)))
        return arr if dtype is None else arr.astype(dtype)

    def __getitem__(self, i):
        if isinstance(i, (int, np.integer)):
            n = len(self)
            if not -n <= i < n:
                raise IndexError(f"row {i} out of range for {n} rows")
            return self.take([int(i)])[0]
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        return self.take(i)


class _Parts:
    """A column's shard files, decoded lazily one at a time (so a pass over a language holds one file's rows)."""

    def __init__(self, col: Column):
        self.col = col
        self.n = len(next(iter(col.cols.stored.values())).parts)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> np.ndarray:
        if not -self.n <= k < self.n:
            raise IndexError(k)
        return self.col._decode({c: r.parts[k] for c, r in self.col.cols.stored.items()})

    def __iter__(self):
        return (self[k] for k in range(self.n))


class Columns:
    """One (split, lang): ``cols["input_ids"|"segment_ids"|"word_start"]`` -> ``Column``; ``take(rows)`` decodes
    the three at once (input_ids ``ids_dtype``, segment_ids, word_start bool), which is what batch readers use."""

    def __init__(self, layout: Layout, stored: dict[str, Rows]):
        self.layout, self.stored = layout, stored
        self._n = len(next(iter(stored.values())))

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, name: str) -> Column:
        if name not in COLUMNS:
            raise KeyError(f"{name!r}: expected one of {COLUMNS}")
        return Column(self, name)

    def keys(self):
        return COLUMNS

    def take(self, indices, ids_dtype=np.int64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.layout.decode({c: r.take(indices) for c, r in self.stored.items()}, ids_dtype)


def gather_rows(cols: Sequence[Columns], li: np.ndarray, rows: np.ndarray, ids_dtype=np.int64
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``rows[k]`` of language ``cols[li[k]]`` (one fancy-index per language and stored column), decoded in
    one call for the whole batch: (input_ids ``ids_dtype``, segment_ids, word_start bool), each (B, seq_len)."""
    layout = cols[0].layout
    B = len(rows)
    first = cols[0].stored
    stored = {c: np.empty((B, r.shape[1]), r.dtype) for c, r in first.items()}
    for lang_i in np.unique(li):
        sel = li == lang_i
        for c, r in cols[lang_i].stored.items():
            stored[c][sel] = r.take(rows[sel])
    return layout.decode(stored, ids_dtype)


class ShardDataset:
    """A verified, memory-mapped shard set. ``ds.input_ids("train", "fr")`` -> Column of shape (N, seq_len).

    ``tokenizer_dir``: the tokenizer output the shards were encoded with, for what training reads from it (PMI
    masking's n-gram vocabulary); the pretrain stage passes its upstream tokenizer's folder."""

    def __init__(self, source, verify: Verify = "once", expect_tokenizer_fingerprint: str | None = None,
                 tokenizer_dir: str | Path | None = None):
        self.path, self.manifest = check_shard_set(source, verify, expect_tokenizer_fingerprint)
        self.tokenizer_dir = None if tokenizer_dir is None else Path(tokenizer_dir)
        self.layout = Layout.from_manifest(self.manifest, str(self.path))
        self.seq_len = int(self.manifest["seq_len"])
        self._maps: list = []
        self._stored: dict[tuple[str, str], dict[str, Rows]] = {}
        self._cols: dict[tuple[str, str], Columns] = {}
        groups: dict[tuple[str, str], list[str]] = {}
        for s in self.manifest["shards"]:
            groups.setdefault((s["split"], s["lang"]), []).append(s["file"])
        for key, files in groups.items():
            parts: dict[str, list[np.ndarray]] = {c: [] for c in self.layout.columns}
            for rel in sorted(files):
                for c, arr in self._map(self.path / rel).items():
                    parts[c].append(arr)
            self._stored[key] = {c: Rows(tuple(parts[c])) for c in self.layout.columns}
            self._cols[key] = Columns(self.layout, self._stored[key])

    def _map(self, file: Path) -> dict[str, np.ndarray]:
        src = pa.memory_map(str(file), "r")
        self._maps.append(src)
        return _columns_of(ipc.open_stream(src).read_next_batch(), self.layout, file)

    # --- what is in it
    @property
    def splits(self) -> list[str]:
        return sorted({k[0] for k in self._cols})

    def languages(self, split: str = "train") -> list[str]:
        return sorted(lang for s, lang in self._cols if s == split)

    def rows_per_lang(self, split: str = "train") -> dict[str, int]:
        return {lang: len(self._cols[(split, lang)]["input_ids"]) for lang in self.languages(split)}

    def sampling_probs(self) -> dict[str, float]:
        """p(l) of the manifest's sampling table (what LanguageSampler takes)."""
        return {r["lang"]: float(r["p"]) for r in self.manifest["sampling"]["table"]}

    def columns(self, split: str, lang: str) -> Columns:
        try:
            return self._cols[(split, lang)]
        except KeyError:
            raise KeyError(f"no {split!r} rows for language {lang!r} in {self.path} "
                           f"(have: {sorted(self._cols)})") from None

    def stored(self, split: str, lang: str) -> dict[str, Rows]:
        """The stored columns (``layout.columns``) as zero-copy memory-mapped views, undecoded."""
        self.columns(split, lang)
        return self._stored[(split, lang)]

    def input_ids(self, split: str, lang: str) -> Column:
        return self.columns(split, lang)["input_ids"]

    def segment_ids(self, split: str, lang: str) -> Column:
        return self.columns(split, lang)["segment_ids"]

    def word_start(self, split: str, lang: str) -> Column:
        return self.columns(split, lang)["word_start"]

    def __len__(self) -> int:
        return sum(len(c) for c in self._cols.values())

    # --- torch access (torch imported here only)
    def get(self, split: str, lang: str, index: int) -> dict:
        return self.get_batch(split, lang, [index], squeeze=True)

    def get_batch(self, split: str, lang: str, indices: Sequence[int] | np.ndarray, squeeze: bool = False) -> dict:
        """input_ids int64, segment_ids uint8 (int32 when stored as uint16), word_start bool; shape (B, seq_len)."""
        import torch
        ids, seg, ws = self.columns(split, lang).take(indices)
        if seg.dtype != np.uint8:
            seg = seg.astype(np.int32)
        out = {"input_ids": torch.from_numpy(ids), "segment_ids": torch.from_numpy(seg),
               "word_start": torch.from_numpy(ws)}
        return {k: v[0] for k, v in out.items()} if squeeze else out

    def close(self) -> None:
        self._cols.clear()
        self._stored.clear()
        for m in self._maps:
            m.close()
        self._maps.clear()

    def __enter__(self) -> "ShardDataset":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _columns_of(batch: pa.RecordBatch, layout: Layout, file) -> dict[str, np.ndarray]:
    out = {}
    for c, width in layout.widths().items():
        if batch.schema.get_field_index(c) < 0:
            raise ShardIntegrityError(f"{file}: no column {c!r} (format v{layout.version} expected); rebuild it "
                                      "with `mlm run <config> --only shards --force`")
        # .values ignores slice offsets (STACK_NOTES §6), but a freshly read batch has none.
        out[c] = batch.column(c).values.to_numpy(zero_copy_only=True).reshape(-1, width)
    return out


def read_shard_file(folder, rel: str, manifest: dict) -> dict[str, np.ndarray]:
    """One shard file of a set, decoded: {"input_ids" (stored dtype), "segment_ids", "word_start" (uint8)}."""
    layout = Layout.from_manifest(manifest, str(folder))
    with pa.memory_map(str(Path(folder) / rel), "r") as src:
        stored = _columns_of(ipc.open_stream(src).read_next_batch(), layout, Path(folder) / rel)
        ids, seg, ws = layout.decode(stored, layout.ids)
    return {"input_ids": ids, "segment_ids": seg, "word_start": ws.view(np.uint8)}


def as_hf_dataset(source, split: str | None = None, lang: str | None = None, verify: Verify = "once",
                  expect_tokenizer_fingerprint: str | None = None):
    """The shard files as one ``datasets.Dataset``: memory-mapped by ``Dataset.from_file`` (the shards are Arrow IPC
    *stream* files, the format it reads), concatenated without copying. Filter by ``split`` and/or ``lang``.
    Rows come out decoded (input_ids, segment_ids, word_start; numpy) through a transform (``with_transform``;
    setting another format on the result shows the stored columns instead)."""
    from datasets import Dataset, concatenate_datasets
    path, manifest = check_shard_set(source, verify, expect_tokenizer_fingerprint)
    layout = Layout.from_manifest(manifest, str(path))
    files = [s["file"] for s in manifest["shards"]
             if (split is None or s["split"] == split) and (lang is None or s["lang"] == lang)]
    if not files:
        raise KeyError(f"no shards in {path} for split={split!r} lang={lang!r}")
    parts = [Dataset.from_file(str(path / f)) for f in files]
    ds = parts[0] if len(parts) == 1 else concatenate_datasets(parts)

    def decode(batch: dict) -> dict:
        stored = {c: np.asarray(batch[c], dtype=np.uint8 if c == "word_start_bits" else None) for c in layout.columns}
        ids, seg, ws = layout.decode(stored, layout.ids)
        return {"input_ids": ids, "segment_ids": seg, "word_start": ws.view(np.uint8)}
    return ds.with_transform(decode)
