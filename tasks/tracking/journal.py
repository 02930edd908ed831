"""What a run could not tell MLflow, kept in its workdir, so that ``mlm sync`` finishes it by the run's identity.

In: from the ``Tracker``, when the server is unreachable as a run ends: the end it meant to record, ``{"kind":
"stage" | "pipeline", "run_id" (None when the run was never created), "stage", "fingerprint", "status",
"ended" (epoch seconds), "uri" (redacted)}``.
Out: ``<workdir>/tracking-pending.jsonl``, one JSON line per entry, appended under the workdir's lock.
``pending(workdir)`` reads them back (a line cut short by a kill is skipped); ``settle(workdir, keys)`` drops the
entries ``mlm sync`` has recorded. The journal names runs by their MLflow run id and their stage output by
(stage, fingerprint), never by the config: a sync finds them whatever ``--set`` overrides the run had.
Never raises: a journal that cannot be written costs the sync its hint (a warning), never the run.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

FILE = "tracking-pending.jsonl"


def entry_key(e: dict) -> tuple:
    return (e.get("kind"), e.get("run_id"), e.get("stage"), e.get("fingerprint"))


def record(workdir: Path, **entry) -> None:
    """Append one entry (see the module doc)."""
    from mlm_core.locks import workdir_lock
    entry.setdefault("written", time.time())
    line = json.dumps(entry, sort_keys=True, default=str) + "\n"
    try:
        workdir = Path(workdir)
        with workdir_lock(workdir, "tracking-pending", timeout=30):
            with open(workdir / FILE, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
    except Exception as exc:  # noqa: BLE001 - the run's outputs matter more than this note
        log.warning("could not note the undelivered %s run in %s (%s): `mlm sync` will still find it by its "
                    "stored output", entry.get("stage") or entry.get("kind"), Path(workdir) / FILE, exc)


def pending(workdir: Path) -> list[dict]:
    path = Path(workdir) / FILE
    out = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                e = json.loads(line)
            except ValueError:       # a line cut short by a killed process
                continue
            if isinstance(e, dict):
                out.append(e)
    return out


def settle(workdir: Path, keys: set[tuple]) -> int:
    """Drop the entries whose ``entry_key`` is in ``keys`` (recorded by a sync); returns how many are left."""
    from mlm_core.locks import workdir_lock
    path = Path(workdir) / FILE
    with workdir_lock(Path(workdir), "tracking-pending", timeout=30):
        left = [e for e in pending(workdir) if entry_key(e) not in keys]
        if not left:
            path.unlink(missing_ok=True)
            return 0
        tmp = path.with_name(f".{FILE}.{os.getpid()}")
        tmp.write_text("".join(json.dumps(e, sort_keys=True, default=str) + "\n" for e in left), encoding="utf-8")
        os.replace(tmp, path)
        return len(left)


__all__ = ["FILE", "record", "pending", "settle", "entry_key"]
