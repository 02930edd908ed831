"""``mlm config validate|schema|docs``: check a config file (and the files it names), print or write the config
JSON Schema and the configuration reference. Stdlib at import (``mlm --help`` stays instant).
"""
from __future__ import annotations

import sys
from pathlib import Path

from flows.cli.util import load_args

REPO_ROOT = Path(__file__).resolve().parents[2]


def cmd_config_validate(args) -> int:
    lc = load_args(args)
    cfg = lc.config
    if not args.no_paths:    # every named source/evaluation/audit file or glob must match a file
        from flows.cli.util import check_paths
        check_paths(args.config, lc)
    print(f"{args.config}: valid ({len(cfg.sources)} languages: {', '.join(cfg.languages)}; workdir {lc.workdir})")
    return 0


def cmd_config_schema(args) -> int:
    from mlm_core.config.io import schema_text
    text = schema_text()
    if args.write:
        out = REPO_ROOT / "schemas" / "config.schema.json"
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_config_docs(args) -> int:
    from mlm_core.config.io import config_reference_markdown
    text = config_reference_markdown()
    if args.write:
        out = REPO_ROOT / "docs" / "CONFIG.md"
        out.parent.mkdir(exist_ok=True)
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}")
    else:
        sys.stdout.write(text)
    return 0
