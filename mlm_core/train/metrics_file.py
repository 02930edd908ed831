"""``metrics.jsonl``, the pretrain stage's record of its run: one JSON object per train log / eval, appended as
training goes, read back tolerantly (a line cut short by a killed process is dropped) and cut back to the resumed
step, so a resume re-logs and never duplicates."""
from __future__ import annotations

import json
from pathlib import Path


def append_record(path: Path, rec: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, sort_keys=True) + "\n")


def read_records(path: Path) -> list[dict]:
    """Records of a metrics file; a line cut short by a killed process is dropped."""
    out = []
    for ln in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            out.append(json.loads(ln))
        except ValueError:
            continue
    return out


def truncate_records(path: Path, upto: int | None) -> None:
    """Keep only records of steps <= upto (they are re-logged after a resume); all gone for a fresh start."""
    if path.exists():
        keep = [] if upto is None else [r for r in read_records(path) if r.get("step", 0) <= upto]
        path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in keep), encoding="utf-8")


def last_train_loss(path: Path) -> float | None:
    losses = [r["loss"] for r in read_records(path) if r.get("type") == "train"]
    return losses[-1] if losses else None
