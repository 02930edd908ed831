"""The CLI's shared leaf: helpers every ``flows/cli/`` command module uses (environment defaults, loading the
config of ``args``, the user's own ``mlm run`` command, byte sizes, tables, adopting `mlm serve`'s servers, the
default config and the path check of ``config validate``). It imports no other ``flows.cli`` module.

Stdlib + ``mlm_core`` only (``mlm --help`` stays instant); errors are ``ConfigError`` (one ``error:`` line,
exit code 2, no traceback), so the CLI's usual error path prints them.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from mlm_core.commands import default_config
from mlm_core.config.io import ConfigError


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


def prepare_env(workdir: Path | None = None) -> None:
    """Quiet, offline-friendly defaults; with no Prefect server configured, Prefect's state lives in the workdir."""
    defaults = {
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_LOGGING_LEVEL": "WARNING", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "GX_ANALYTICS_ENABLED": "false", "TOKENIZERS_PARALLELISM": "true",
        "PREFECT_LOGGING_LEVEL": "INFO",
    }
    for k, v in defaults.items():
        os.environ.setdefault(k, v)
    if workdir is not None and "PREFECT_API_URL" not in os.environ and "PREFECT_HOME" not in os.environ:
        (workdir / "prefect").mkdir(parents=True, exist_ok=True)
        os.environ["PREFECT_HOME"] = str(workdir / "prefect")
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def load_args(args):
    from mlm_core.config.io import load_config
    return load_config(args.config, args.set or [])


def run_cmd(lc, *extra: str) -> str:
    from mlm_core.commands import run_command   # the user's config path and --set overrides, shell-quoted
    return run_command(lc, *extra)


def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def print_rows(rows: list[dict]) -> None:
    if not rows:
        print("  (none)")
        return
    cols = list(rows[0])
    # floats to 4 significant digits: a KL of 2e-06 prints as 2e-06, not 0.0000; nothing computed prints "-"
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else "-" if v is None else str(v)  # noqa: E731
    widths = [max(len(c), *(len(fmt(r.get(c))) for r in rows)) for c in cols]
    print("  " + "  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  " + "  ".join(fmt(r.get(c)).ljust(w) for c, w in zip(cols, widths)))


def adopt_servers_for(lc) -> None:
    from flows.serve.state import adopt_servers
    used = adopt_servers(lc.workdir, tracking_uri_set=bool(lc.config.tracking.uri) or not lc.config.tracking.enabled)
    if used:
        print(f"mlm: logging to the servers of `mlm serve` ({', '.join(used)})", file=sys.stderr)
