"""Small CLI helpers kept out of ``flows/cli.py``: the default config and the path check of ``config validate``.

Stdlib + ``mlm_core`` only (``mlm --help`` stays instant); errors are ``ConfigError`` (one ``error:`` line,
exit code 2, no traceback), so the CLI's usual error path prints them.
"""
from __future__ import annotations

import sys

from mlm_core.commands import default_config
from mlm_core.configio import ConfigError


def config_or_default(config: str | None, command: str) -> str:
    """``config`` as given, else ``./mlm.yaml`` or the only ``configs/*.yaml`` (said on stderr, so a
    ``--json`` stdout stays clean); else a ConfigError listing the candidates."""
    if config:
        return config
    found = default_config(command=command)
    print(f"{command}: using {found}", file=sys.stderr)
    return found


def check_paths(label: str, lc) -> None:
    """Raise ConfigError listing every named file that is missing, every glob that matches nothing, and every
    audit or evaluate file that does not decode (file, line, byte offset, byte)."""
    from mlm_core.pathcheck import path_problems
    problems = path_problems(lc)
    if not problems:
        return
    hint = "(`--no-paths` skips this check)"
    if len(problems) == 1:
        raise ConfigError(f"{label}: {problems[0]} {hint}")
    raise ConfigError(f"{label}: {len(problems)} named files are missing or unreadable {hint}:\n"
                      + "\n".join(problems))
