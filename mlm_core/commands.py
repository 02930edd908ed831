"""The commands a message tells the user to run, spelled as they would type them, and the default config.

In: a loaded config (its path as the user gave it, and its ``--set`` overrides) or a path + overrides.
Out: a shell-ready command line (every word quoted with ``shlex.quote``) such as
``mlm run 'my configs/a.yaml' --set normalize.min_chars=10 --only tokenizer``.

Why: hints used to print ``mlm run CONFIG --only shards``; copying that does nothing, and dropping the
user's ``--set`` overrides gives another fingerprint, so the hinted stage would not be the missing one.

``default_config`` is what ``mlm status`` uses without an argument: ``./mlm.yaml`` when it exists, else the
only ``configs/*.yaml``; otherwise a clear error listing the candidates. Stdlib only.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

from mlm_core.config.io import ConfigError

PLACEHOLDER = "CONFIG"          # a config given as a dict (no file): nothing better to print
DEFAULT_NAMES = ("mlm.yaml",)   # looked for in the current directory first
CONFIG_DIR = "configs"


def mlm_command(sub: str, config: str | Path | None, overrides: Sequence[str] = (), *extra: str) -> str:
    """``mlm SUB CONFIG --set K=V ... EXTRA...``, each word shell-quoted."""
    words = ["mlm", *sub.split(), str(config) if config is not None else PLACEHOLDER]
    for ov in overrides:
        words += ["--set", ov]
    words += list(extra)
    return " ".join(w if w == PLACEHOLDER else shlex.quote(w) for w in words)


def run_command(lc, *extra: str) -> str:
    """``mlm run`` for a ``LoadedConfig``: its path as the user typed it and its overrides, then ``extra``."""
    return mlm_command("run", lc.path, lc.overrides, *extra)


def default_config(cwd: str | Path | None = None, command: str = "mlm status") -> str:
    """The config to use when none is given: ``./mlm.yaml``, else the single ``configs/*.yaml``.

    Returned relative to ``cwd`` (as the user would type it). Raises ConfigError naming what was looked for
    and, when several configs qualify, listing them."""
    root = Path(cwd) if cwd is not None else Path.cwd()
    for name in DEFAULT_NAMES:
        if (root / name).is_file():
            return name
    found = sorted(p for pat in ("*.yaml", "*.yml") for p in (root / CONFIG_DIR).glob(pat) if p.is_file())
    rel = [str(p.relative_to(root)) for p in found]
    if len(rel) == 1:
        return rel[0]
    looked = f"no config given, no ./{DEFAULT_NAMES[0]} in {root.resolve()}"
    if not rel:
        raise ConfigError(f"{command}: {looked}, and no {CONFIG_DIR}/*.yaml: name one, e.g. `{command} CONFIG`")
    # none of them is singled out (the first in alphabetical order is no better a guess than the others)
    raise ConfigError(f"{command}: {looked}, and {len(rel)} configs in {CONFIG_DIR}/ ({', '.join(rel)}): "
                      f"name the one you mean, or put it at ./{DEFAULT_NAMES[0]}:\n"
                      + "\n".join(f"  {command} {shlex.quote(r)}" for r in rel))


__all__ = ["mlm_command", "run_command", "default_config"]
