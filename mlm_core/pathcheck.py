"""Do the files a config names exist? (``mlm config validate`` checks this unless ``--no-paths``.)

In: a ``LoadedConfig``. Out: one problem string per missing file or empty glob, naming the key path, the
pattern as written and the folder it is relative to, e.g.
``sources.fr.paths[0]: no file matches 'data/fr/*.txt' (relative to /abs/config/dir)``.

Why: a config whose source files do not exist used to validate, and failed only when normalize ran (or,
for an evaluation file, after pretraining). Globs expand as the normalize reader expands them
(``mlm_core.normalize.readers.expand_paths``: recursive ``**``, files only), relative to the config's folder.
Stdlib only; nothing is read, only listed.
"""
from __future__ import annotations

import glob
from pathlib import Path


def _check(key: str, pattern: str, base: Path) -> str | None:
    p = Path(pattern).expanduser()
    full = p if p.is_absolute() else base / p
    where = "" if p.is_absolute() else f" (relative to {base})"
    if glob.has_magic(str(full)):
        if not any(Path(h).is_file() for h in glob.iglob(str(full), recursive=True)):
            return f"{key}: no file matches {pattern!r}{where}"
        return None
    if full.is_dir():
        return f"{key}: {pattern!r} is a folder, not a file{where}"
    if not full.is_file():
        return f"{key}: file not found: {pattern!r}{where}"
    return None


def named_files(lc) -> list[tuple[str, str]]:
    """Every (key path, file or glob) the config names: sources, dataset data_files, evaluation and audit files."""
    cfg = lc.config
    out: list[tuple[str, str]] = []
    for lang, src in cfg.sources.items():
        out += [(f"sources.{lang}.paths[{i}]", p) for i, p in enumerate(src.paths)]
        if src.dataset is not None:
            # remote data files (hf://, https://) are the datasets library's business, not a local path
            out += [(f"sources.{lang}.dataset.data_files[{i}]", p)
                    for i, p in enumerate(src.dataset.data_files or []) if "://" not in p]
    ev = cfg.evaluate
    for task in ("upos", "classification"):
        t = getattr(ev, task)
        if t is None:
            continue
        out.append((f"evaluate.{task}.train", t.train))
        if t.dev:
            out.append((f"evaluate.{task}.dev", t.dev))
        out += [(f"evaluate.{task}.targets.{lang}", p) for lang, p in t.targets.items()]
    out += [(f"evaluate.retrieval.{lang}", p) for lang, p in (ev.retrieval or {}).items()]
    out += [(key, p) for key, _, p, _ in cfg.audit.files()]
    return out


def evaluate_files(lc) -> list[tuple[str, str]]:
    """(key path, file) of the evaluate stage's own data files (CoNLL-U, classification, retrieval text)."""
    return [(k, p) for k, p in named_files(lc) if k.startswith("evaluate.")]


def text_problems(lc) -> list[str]:
    """One line per existing audit or evaluate file that does not decode (audit files: in their ``encoding``;
    evaluate files: UTF-8), naming the file, line, byte offset and byte."""
    from mlm_core.textcheck import audit_hint, decode_message
    out = [decode_message(key, lc.resolve(p.split("#", 1)[0]), enc, audit_hint(key, p) if enc.replace("-", "").lower() == "utf8"
                          else f"is {enc} the right encoding?")
           for key, _, p, enc in lc.config.audit.files()]
    out += [decode_message(key, lc.resolve(p.split("#", 1)[0]), "utf-8", "evaluation files are read as UTF-8: re-save it as UTF-8")
            for key, p in evaluate_files(lc) if not glob.has_magic(p)]
    return [m for m in out if m]


def path_problems(lc) -> list[str]:
    """One line per named file that does not exist or glob that matches no file, then each audit or evaluate
    file that does not decode (empty: all present and readable)."""
    base = Path(lc.base_dir)
    return [msg for key, pat in named_files(lc) if (msg := _check(key, pat, base)) is not None] + text_problems(lc)


__all__ = ["named_files", "evaluate_files", "text_problems", "path_problems"]
