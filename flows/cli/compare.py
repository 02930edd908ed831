"""``mlm compare MODEL_A MODEL_B --config CONFIG``: before vs after on the same held-out data.

Stdlib only at import (``mlm --help`` stays instant). The command calls ``tasks.compare.run_compare``, the function
the ``mlm-compare`` Prefect flow calls: one code path for both.
"""
from __future__ import annotations

import json
from pathlib import Path


def cmd_compare(args) -> int:
    """Model A (before) vs model B (after) on the config's held-out data: the same function as the mlm-compare flow."""
    from flows.cli.util import load_args, print_rows, prepare_env
    load_args(args)          # a bad config fails here, before any model is resolved
    prepare_env()
    from tasks.compare import run_compare
    out = run_compare(args.config, args.model_a, args.model_b, args.set or [], args.out)
    if args.json:
        print(json.dumps({k: out[k] for k in ("paths", "run_id", "experiment", "fingerprint")}
                         | {"rows": out["result"]["rows"], "languages": out["result"]["languages"],
                            "notes": out["result"]["notes"], "models": out["result"]["models"]}, indent=2, default=str))
        return 0
    from mlm_core.compare import summary_lines
    res = out["result"]
    print(f"A: {args.model_a}\nB: {args.model_b}\nboth on the held-out data of {args.config}")
    for line in summary_lines(res):
        print(line)
    for note in res["notes"]:
        print(f"note: {note}")
    print_rows([{"metric": r["metric"], "lang": r["lang"], "status": r["status"] or "-", "A": r["a"], "B": r["b"],
                  "B-A": r["delta"]} for r in res["rows"]])
    print(f"wrote {out['paths']['md']}, {Path(out['paths']['png']).name}, {Path(out['paths']['json']).name}")
    if out["run_id"]:
        print(f"MLflow run {out['run_id']} in experiment {out['experiment']}")
    return 0


def add_parser(sub, with_config) -> None:
    """The ``compare`` subcommand; ``with_config`` adds --config and --set the way every command has them."""
    cp = sub.add_parser("compare", help="two models (before, after) on the same held-out data: one table, one plot, "
                        "one MLflow run")
    cp.add_argument("model_a", help="model A (before): a model folder, models:/name@alias, models:/name/VERSION or "
                    "models:/name/latest")
    cp.add_argument("model_b", help="model B (after), the same forms")
    with_config(cp, "--config")
    cp.add_argument("--out", metavar="DIR", help="output folder (default: WORKDIR/compare/<fingerprint of the pair>)")
    cp.add_argument("--json", action="store_true", help="machine-readable output")
    cp.set_defaults(func=cmd_compare)
