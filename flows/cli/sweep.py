"""``mlm sweep SWEEP.yaml [--dry-run] [--concurrency N] [--set KEY.PATH=VALUE ...] [--variants A,B] [--seeds 0-2]``: every
variant x seed of a sweep (or the ones selected) through the pipeline.

Stdlib only at import (``mlm --help`` stays instant). The command calls ``flows.sweep.sweep_flow``, the
``mlm-sweep`` Prefect flow (which calls ``run_sweep``), the way ``mlm run`` calls the pipeline flow; ``--dry-run``
only plans (``run_sweep(dry_run=True)``, no Prefect, nothing written).
"""
from __future__ import annotations

import sys


def cmd_sweep(args) -> int:
    from mlm_core.sweep import load_sweep
    overrides = list(args.set or [])
    sweep = load_sweep(args.sweep, args.concurrency, overrides)   # a bad sweep file fails here, before Prefect
    variants, seeds = _names(args.variants), _seeds(args.seeds)
    sweep.select(variants, seeds)                                  # so does an unknown --variants / --seeds
    if args.dry_run:
        from flows.sweep import run_sweep
        run_sweep(args.sweep, dry_run=True, concurrency=args.concurrency, overrides=overrides)
        return 0
    from flows import ephemeral, guard
    from flows.cli.util import adopt_servers_for, prepare_env
    workdir = sweep.base.workdir
    guard.check_workdir(workdir)
    adopt_servers_for(sweep.base)        # `mlm serve` running for this workdir: log to its MLflow and Prefect
    prepare_env(workdir)
    from mlm_core.train import signals
    previous = signals.install()      # SIGTERM/SIGINT: training checkpoints, the sweep stops; a rerun resumes
    try:
        guard.quiet_expected_tracebacks()
        ephemeral.start(workdir)
        from flows.sweep import sweep_flow
        doc = sweep_flow(sweep_path=args.sweep, dry_run=False, concurrency=args.concurrency,
                         overrides=overrides, variants=variants, seeds=seeds)
    finally:
        signals.restore(previous)
    runs = doc["variants"]
    unrecorded = sum(r["status"] == "unrecorded" for r in runs)
    print(f"\nsweep {doc['name']}: {sum(r['status'] == 'done' for r in runs)}/{len(runs)} run(s) done"
          + (f", {unrecorded} stored but not recorded" if unrecorded else "")
          + f"; plan: {sweep.state_dir / 'plan.json'}", file=sys.stdout)
    return guard.EXIT_NOT_RECORDED if unrecorded else 0   # 4, as `mlm run`: work complete, not recorded


def _names(text: str | None) -> list[str]:
    return [w.strip() for w in (text or "").split(",") if w.strip()]


def _seeds(text: str | None) -> list[int]:
    """``0,1,2`` or ``0-2`` (or a mix: ``0-2,5``) -> [0, 1, 2, ...]; anything else is a clear error."""
    from mlm_core.sweep import SweepError
    out: list[int] = []
    for word in _names(text):
        lo, sep, hi = word.partition("-")
        try:
            out += list(range(int(lo), int(hi) + 1)) if sep else [int(word)]
        except ValueError:
            raise SweepError(f"--seeds {text}: {word!r} is not a seed or a range like 0-2") from None
    return list(dict.fromkeys(out))


def add_parser(sub) -> None:
    sp = sub.add_parser("sweep", help="run every variant x seed of a sweep file through the pipeline, sharing "
                        "stored stages (resumable)")
    sp.add_argument("sweep", help="sweep YAML (base: the pipeline config; variants and/or grid; seeds; ...)")
    sp.add_argument("--dry-run", action="store_true", help="only show which stage outputs are shared, stored and "
                    "to run")
    sp.add_argument("--concurrency", type=int, metavar="N", help="runs at once (default: the sweep file's)")
    sp.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override the base config of every "
                    "run (YAML syntax; before the variants' own), repeatable: --set pretrain.steps=20000")
    sp.add_argument("--variants", metavar="A,B", help="run only these variants (the plan, plan.json and the report "
                    "still cover every run), e.g. the primary contrasts first")
    sp.add_argument("--seeds", metavar="0,1,2 | 0-2", help="run only these seeds, e.g. 0-2 here and 3-5 in another "
                    "`mlm sweep` on the same workdir")
    sp.set_defaults(func=cmd_sweep)
