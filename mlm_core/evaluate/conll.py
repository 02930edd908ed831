"""Readers for the zero-shot transfer data: CoNLL-U treebanks, the demo parallel JSONL, labeled text.

In: file paths. Out: plain values — ``Sentence`` (id, words, UPOS tags, text, topic) or ``(text, label)`` pairs.

CoNLL-U (https://universaldependencies.org/format.html): 10 tab-separated columns per word line;
``#`` comment lines (``# sent_id = ...``, ``# text = ...``); a blank line ends a sentence. A
multiword-token line (id ``1-2``) spans syntactic words listed after it: the range line is skipped and
the syntactic words kept, as the format defines tokenization for tagging (``au`` -> ``à`` ``le``).
Empty nodes (id ``5.1``, enhanced dependencies only) are skipped. Anything else malformed (wrong
column count, non-numeric id) raises ``ConllError`` naming the file and line number.

Paths may carry a language selector, ``parallel.jsonl#lang=fr`` (see ``split_spec``): a JSONL file
with a ``lang`` field is then filtered to that language. The transfer stage passes the configured
language (source_lang, or the target key) as the default, so ``targets: {fr: parallel.jsonl}`` works
without the fragment; the fragment wins when both are given.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mlm_core.errors import MlmError

N_COLUMNS = 10  # ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC


class ConllError(MlmError, ValueError):
    """A transfer data file that cannot be read (malformed line, missing field); names file and line."""


@dataclass(frozen=True)
class Sentence:
    """One tagged sentence: the syntactic words, their UPOS tags, and the raw text."""

    id: str
    tokens: list[str]
    upos: list[str]
    text: str
    topic: str | None = None  # demo parallel file only (its sentence-classification label)


def split_spec(spec: str | Path) -> tuple[Path, str | None]:
    """``'data/x.jsonl#lang=fr'`` -> (Path('data/x.jsonl'), 'fr'); without a fragment, (path, None)."""
    s = str(spec)
    if "#" not in s:
        return Path(s), None
    path, frag = s.rsplit("#", 1)
    key, _, value = frag.partition("=")
    if key != "lang" or not value:
        raise ConllError(f"{spec}: unknown path fragment {frag!r} (expected '#lang=<code>')")
    return Path(path), value


# ---- CoNLL-U -------------------------------------------------------------------------------------
def read_conllu(path: str | Path) -> list[Sentence]:
    """Every sentence of a CoNLL-U file (syntactic words and UPOS; multiword ranges and empty nodes skipped)."""
    path = Path(path)
    if not path.is_file():
        raise ConllError(f"{path}: no such file")
    sentences: list[Sentence] = []
    words: list[str] = []
    tags: list[str] = []
    meta: dict[str, str] = {}
    start = 0

    def flush() -> None:
        if words:
            sid = meta.get("sent_id") or f"{path.stem}:{start}"
            sentences.append(Sentence(sid, list(words), list(tags), meta.get("text") or " ".join(words)))
        words.clear(), tags.clear(), meta.clear()

    with path.open(encoding="utf-8-sig") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                flush()
                continue
            if not words and not meta:
                start = lineno
            if line.startswith("#"):
                key, sep, value = line[1:].partition("=")
                if sep:
                    meta.setdefault(key.strip(), value.strip())
                continue
            cols = line.split("\t")
            if len(cols) != N_COLUMNS:
                raise ConllError(f"{path}:{lineno}: expected {N_COLUMNS} tab-separated columns, "
                                 f"got {len(cols)}: {line[:80]!r}")
            wid = cols[0]
            if "-" in wid:  # multiword token: the syntactic words follow on their own lines
                lo, _, hi = wid.partition("-")
                if not (lo.isdigit() and hi.isdigit()):
                    raise ConllError(f"{path}:{lineno}: malformed multiword-token id {wid!r}")
                continue
            if "." in wid:  # empty node (enhanced graph only)
                main, _, sub = wid.partition(".")
                if not (main.isdigit() and sub.isdigit()):
                    raise ConllError(f"{path}:{lineno}: malformed empty-node id {wid!r}")
                continue
            if not wid.isdigit():
                raise ConllError(f"{path}:{lineno}: word id {wid!r} is not a number")
            if not cols[3] or cols[3] == "_":
                raise ConllError(f"{path}:{lineno}: word {cols[1]!r} has no UPOS tag")
            words.append(cols[1])
            tags.append(cols[3])
    flush()
    return sentences


# ---- JSONL helpers -------------------------------------------------------------------------------
def _jsonl_records(path: Path):
    """(line number, dict) for each non-blank line; ConllError naming file and line otherwise."""
    if not path.is_file():
        raise ConllError(f"{path}: no such file")
    with path.open(encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConllError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ConllError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
            yield lineno, rec


def _need(path: Path, lineno: int, rec: dict, *fields: str) -> None:
    missing = [k for k in fields if k not in rec]
    if missing:
        raise ConllError(f"{path}:{lineno}: missing field(s) {missing}")


def read_demo_parallel(path: str | Path, lang: str) -> list[Sentence]:
    """The ``lang`` sentences of a demo parallel JSONL (id, topic, lang, text, tokens, upos), file order."""
    path = Path(path)
    out = []
    for lineno, rec in _jsonl_records(path):
        _need(path, lineno, rec, "id", "lang", "text", "tokens", "upos")
        if rec["lang"] != lang:
            continue
        if len(rec["tokens"]) != len(rec["upos"]):
            raise ConllError(f"{path}:{lineno}: {len(rec['tokens'])} tokens but {len(rec['upos'])} upos tags")
        out.append(Sentence(str(rec["id"]), list(rec["tokens"]), list(rec["upos"]), rec["text"], rec.get("topic")))
    if not out:
        raise ConllError(f"{path}: no sentences with lang={lang!r}")
    return out


def read_tagged(spec: str | Path, lang: str | None = None) -> list[Sentence]:
    """UPOS data from CoNLL-U, or from a JSONL with tokens/upos fields (filtered by ``#lang=`` or ``lang``)."""
    path, frag_lang = split_spec(spec)
    if path.suffix.lower() in (".jsonl", ".json"):
        chosen = frag_lang or lang
        if chosen is None:
            raise ConllError(f"{spec}: a JSONL tagging file needs a language (add '#lang=<code>')")
        return read_demo_parallel(path, chosen)
    return read_conllu(path)


# ---- labeled text (classification) ---------------------------------------------------------------
def read_labeled(spec: str | Path, lang: str | None = None) -> list[tuple[str, str]]:
    """(text, label) pairs from a TSV (text<TAB>label, optional ``text<TAB>label`` header) or a JSONL.

    JSONL records need ``text`` and ``label``; a record without ``label`` but with ``topic`` (the demo
    parallel file) uses the topic. When records carry ``lang`` and a language is given (``#lang=`` or
    ``lang``), only that language is kept.
    """
    path, frag_lang = split_spec(spec)
    chosen = frag_lang or lang
    out: list[tuple[str, str]] = []
    if path.suffix.lower() in (".jsonl", ".json"):
        for lineno, rec in _jsonl_records(path):
            label_key = "label" if "label" in rec else "topic" if "topic" in rec else "label"
            _need(path, lineno, rec, "text", label_key)
            if chosen is not None and "lang" in rec and rec["lang"] != chosen:
                continue
            out.append((str(rec["text"]), str(rec[label_key])))
    else:
        if not path.is_file():
            raise ConllError(f"{path}: no such file")
        with path.open(encoding="utf-8-sig") as f:
            for lineno, line in enumerate(f, 1):
                row = line.rstrip("\r\n").split("\t")
                if not line.strip():
                    continue
                if len(row) != 2:
                    raise ConllError(f"{path}:{lineno}: expected 2 tab-separated columns (text, label), got {len(row)}")
                if lineno == 1 and [c.strip().lower() for c in row] == ["text", "label"]:
                    continue  # header
                text, label = row[0].strip(), row[1].strip()
                if not text or not label:
                    raise ConllError(f"{path}:{lineno}: empty text or label")
                out.append((text, label))
    if not out:
        raise ConllError(f"{spec}: no labeled examples" + (f" for lang={chosen!r}" if chosen else ""))
    return out


# ---- aligned sentences (retrieval) ---------------------------------------------------------------
def read_aligned(spec: str | Path, lang: str) -> dict[str, str]:
    """id -> text for ``lang``: a JSONL with id, lang, text fields, or a plain text file (id = line number)."""
    path, frag_lang = split_spec(spec)
    chosen = frag_lang or lang
    out: dict[str, str] = {}
    if path.suffix.lower() in (".jsonl", ".json"):
        for lineno, rec in _jsonl_records(path):
            _need(path, lineno, rec, "id", "text")
            if rec.get("lang", chosen) == chosen:
                out[str(rec["id"])] = str(rec["text"])
    else:
        if not path.is_file():
            raise ConllError(f"{path}: no such file")
        with path.open(encoding="utf-8-sig") as f:
            for lineno, line in enumerate(f, 1):
                out[str(lineno)] = line.rstrip("\r\n")
    if not any(t.strip() for t in out.values()):
        raise ConllError(f"{spec}: no sentences for lang={chosen!r}")
    return out


__all__ = ["ConllError", "Sentence", "read_aligned", "read_conllu", "read_demo_parallel", "read_labeled",
           "read_tagged", "split_spec"]
