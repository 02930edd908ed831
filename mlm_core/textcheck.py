"""Can a text file the config names be decoded? (audit and evaluate files, at planning and `mlm config validate`.)

In: a file path and a codec name. Out: None, or one line naming the file, the line, the byte offset in the
file, the bad byte(s) and what to do, e.g.
``audit.crows_pairs.nl: /data/crows_nl.csv is not valid utf-8: line 12, byte offset 1843: byte 0x8e (...)``.

Why: a CrowS-Pairs file with Mac-Roman bytes (the published Dutch one) killed the audit with a raw
``UnicodeDecodeError`` naming no file, after pretraining, and the other languages' scores were lost with it.
Stdlib only; the file is read whole (audit and evaluation files are small).
"""
from __future__ import annotations

import codecs
from pathlib import Path


def decode_problem(path: Path, encoding: str = "utf-8") -> tuple[int, int, bytes, str] | None:
    """(line, byte offset, bad bytes, reason) of the first undecodable bytes of ``path``, or None."""
    data = Path(path).read_bytes()
    try:
        codecs.decode(data, encoding)
    except UnicodeDecodeError as exc:
        return data.count(b"\n", 0, exc.start) + 1, exc.start, data[exc.start:exc.end], exc.reason
    return None


def decode_message(key: str, path: Path, encoding: str = "utf-8", hint: str = "") -> str | None:
    """One line for a file that does not decode with ``encoding`` (None when it does, or does not exist)."""
    path = Path(path)
    if not path.is_file():
        return None
    found = decode_problem(path, encoding)
    if found is None:
        return None
    line, offset, bad, reason = found
    shown = " ".join(f"0x{b:02x}" for b in bad[:4])
    return (f"{key}: {path} is not valid {encoding}: line {line}, byte offset {offset}: byte {shown} ({reason})"
            + (f"; {hint}" if hint else ""))


def audit_hint(key: str, path: str) -> str:
    return (f"if the file is in another encoding, say which: `{key}: {{path: {path}, encoding: mac_roman}}` "
            f"(or cp1252, latin-1...), or re-save it as UTF-8")


__all__ = ["decode_problem", "decode_message", "audit_hint"]
