"""The declared time fields: all that may differ between two runs of a stage with the same config and inputs.

Every stage output is byte-identical across processes for the same config, inputs and library versions
(tests/test_reproducible.py checks it, stage by stage, in two separate processes), except these fields,
which hold wall-clock times or speeds measured while the stage ran:

  manifest.json (every stage)   created_at, duration_s; tokenizer: counts.train_seconds
  pretrain/metrics.jsonl        tokens_per_s, mfu, data_pct, masking_pct (speed and time shares of each
                                logged interval; loss, lr, grad_norm and the validation metrics are exact)

Nothing else may depend on the clock, the process (hash seeds, dict order of a Rust HashMap, ...) or the
machine's thread count. A new time field must be added here, or the reproducibility test fails.
``comparable_output`` gives a digest table of one stored output with these fields taken out, so two outputs
(or an output and a re-run) can be compared exactly.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

# dotted paths into manifest.json, per stage ("*": every stage)
MANIFEST_TIME_FIELDS: dict[str, tuple[str, ...]] = {
    "*": ("created_at", "duration_s"),
    "tokenizer": ("counts.train_seconds",),
}
# JSON-lines files of a stage output -> keys of each record that hold times or speeds
FILE_TIME_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "pretrain": {"metrics.jsonl": ("tokens_per_s", "mfu", "data_pct", "masking_pct")},
}


def _drop(obj: dict, dotted: str) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        obj = obj.get(key) if isinstance(obj, dict) else None
        if obj is None:
            return
    if isinstance(obj, dict):
        obj.pop(last, None)


def manifest_without_time(stage: str, manifest: dict) -> dict:
    """A copy of ``manifest`` without its declared time fields, and without the file-table digests of files
    that hold time fields (their time-free digests are in ``comparable_output``)."""
    out = json.loads(json.dumps(manifest))
    for dotted in MANIFEST_TIME_FIELDS["*"] + MANIFEST_TIME_FIELDS.get(stage, ()):
        _drop(out, dotted)
    for rel in FILE_TIME_FIELDS.get(stage, {}):
        if rel in out.get("files", {}):
            out["files"][rel] = {"time_fields": True}
    return out


def jsonl_without_time(data: bytes, keys: tuple[str, ...], where: str = "?") -> bytes:
    """JSON lines with ``keys`` removed from every record (re-serialized with sorted keys)."""
    lines = []
    for n, line in enumerate(data.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec: Any = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{where}:{n}: not JSON: {e}") from None
        if isinstance(rec, dict):
            rec = {k: v for k, v in rec.items() if k not in keys}
        lines.append(json.dumps(rec, sort_keys=True))
    return ("\n".join(lines) + "\n").encode("utf-8")


def comparable_output(stage: str, path: Path) -> dict[str, Any]:
    """{"manifest": manifest without time fields, "files": {relative path: sha256 with time fields removed}}
    for the stored output at ``path`` (a ``<workdir>/<stage>/<fingerprint>`` folder)."""
    path = Path(path)
    manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    timed = FILE_TIME_FIELDS.get(stage, {})
    files = {}
    for rel, entry in manifest["files"].items():
        if rel in timed:
            data = jsonl_without_time((path / rel).read_bytes(), timed[rel], f"{path / rel}")
            files[rel] = hashlib.sha256(data).hexdigest()
        else:
            files[rel] = entry["sha256"]
    return {"manifest": manifest_without_time(stage, manifest), "files": files}


__all__ = ["MANIFEST_TIME_FIELDS", "FILE_TIME_FIELDS", "comparable_output", "manifest_without_time",
           "jsonl_without_time"]
