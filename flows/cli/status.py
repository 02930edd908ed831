"""``mlm status``, ``mlm verify`` and ``mlm stats``: what is stored for a config, whether it is intact, corpus
statistics. Stdlib at import (``mlm --help`` stays instant); helpers from the shared leaf ``flows.cli.util``.
"""
from __future__ import annotations

import json
import sys

from flows.cli.util import fmt_bytes, load_args, prepare_env, run_cmd

EXIT_CORRUPT = 1     # `mlm status` / `mlm verify`: a stored output does not match its manifest (README)


def cmd_status(args) -> int:
    from mlm_core import stages
    from mlm_core.store import StageStore
    from flows.cli.util import config_or_default
    args.config = config_or_default(args.config, "mlm status")   # none given: ./mlm.yaml or the one configs/*.yaml
    lc = load_args(args)
    store = StageStore(lc.workdir)
    rows = [p.as_row(store) for p in stages.plan(lc, store).values()]
    for r in rows:      # a stored output is checked, not trusted: sizes, sha256 per the config's verify policy
        if r["status"] == "done":
            rep = store.verify(r["stage"], r["fingerprint"], lc.config.verify)
            if not rep.ok:
                r["status"], r["problems"] = "corrupt", [str(x) for x in rep.problems]
    corrupt = [r["stage"] for r in rows if r["status"] == "corrupt"]
    once = lc.config.verify == "once" and any(r["status"] == "done" for r in rows)
    registry = _registry_status(lc, rows)      # the registered version of the planned model, and its aliases
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_CORRUPT if corrupt else 0
    print(f"{'stage':<12} {'status':<8} {'fingerprint':<17} {'size':>9}  path")
    for r in rows:
        shown = "done*" if once and r["status"] == "done" else r["status"]
        print(f"{r['stage']:<12} {shown:<8} {r['fingerprint']:<17} {fmt_bytes(r['bytes']):>9}  {r['path']}")
        for prob in r.get("problems", []):
            print(f"{'':<12} {prob}")
    if registry is not None:
        from tasks.registry import registry_status_line
        print(registry_status_line(registry))
    _status_notes(lc, rows, once, corrupt)
    return EXIT_CORRUPT if corrupt else 0


def _status_notes(lc, rows: list[dict], once: bool, corrupt: list[str]) -> None:
    """Under the table: what `done*` does not cover, each failed attempt's folder, and the real rebuild commands."""
    from mlm_core.commands import mlm_command
    verify = mlm_command("verify", lc.path, lc.overrides)
    if once:
        print(f"* done: sizes checked, each file hashed once (verify: once): an edit that keeps a file's size and "
              f"mtime is not detected; `{verify}` re-hashes every file")
    for r in rows:
        if r["status"] == "failed":
            print(f"{r['stage']}: the last attempt failed; its partial output is kept in {r['path']} (removed "
                  f"after a successful run); rerun with `{run_cmd(lc, '--only', r['stage'])}`")
    if corrupt:
        print(f"corrupt outputs: `{verify}` lists every problem; rebuild with "
              + "; ".join(f"`{run_cmd(lc, '--only', st, '--force')}`" for st in corrupt))


def _registry_status(lc, rows: list[dict]) -> dict | None:
    """The registry's view of the planned pretrain output (tasks.registry.registry_status), also put on the
    register row for --json; None when pretrain is not done or nothing is registered anywhere yet."""
    pre = next((r for r in rows if r["stage"] == "pretrain"), None)
    if pre is None or pre["status"] != "done":
        return None
    prepare_env()
    from tasks.registry import registry_status
    info = registry_status(lc, pre["fingerprint"])
    reg = next((r for r in rows if r["stage"] == "register"), None)
    if info is not None and reg is not None:
        reg["registry"] = info
    return info


def cmd_verify(args) -> int:
    """Full sha256 check of every stored output of the config's plan (or one stage); non-zero exit if any is bad."""
    from mlm_core import stages
    from mlm_core.errors import PlanError
    from mlm_core.store import StageStore
    lc = load_args(args)
    store = StageStore(lc.workdir)
    plans = stages.plan(lc, store)
    if args.stage is not None and args.stage not in plans:
        raise PlanError(f"mlm verify {args.stage}: unknown stage (stages: {', '.join(plans)})")
    rows, bad = [], []
    for name in [args.stage] if args.stage else list(plans):
        p = plans[name]
        if p.status != "done":   # nothing stored for this fingerprint: nothing to check
            rows.append({"stage": name, "status": f"not stored ({p.status})", "fingerprint": p.fingerprint,
                         "files": 0, "problems": []})
            continue
        rep = store.verify(name, p.fingerprint, "always")
        rows.append({"stage": name, "status": "ok" if rep.ok else "corrupt", "fingerprint": p.fingerprint,
                     "files": rep.files, "problems": [str(x) for x in rep.problems]})
        if not rep.ok:
            bad.append(name)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'stage':<12} {'result':<22} {'fingerprint':<17} {'files':>5}")
        for r in rows:
            print(f"{r['stage']:<12} {r['status']:<22} {r['fingerprint']:<17} {r['files']:>5}")
            for prob in r["problems"]:
                print(f"{'':<12} {prob}")
    if bad:
        print(f"error: {sum(len(r['problems']) for r in rows)} problem(s) in the stored output of "
              f"{', '.join(bad)}; rebuild with "
              + "; ".join(f"`{run_cmd(lc, '--only', st, '--force')}`" for st in bad), file=sys.stderr)
        return EXIT_CORRUPT
    return 0


def cmd_stats(args) -> int:
    from mlm_core.stats import language_table
    lc = load_args(args)
    rows = language_table(lc)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"sampling α = {lc.config.shards.sampling_alpha}   (p(l) ∝ n_l^α over training tokens)")
    print(f"{'lang':<5} {'docs':>9} {'tokens':>11} {'sequences':>9} {'natural':>8} {'p(l)':>7} {'upsampling':>10} "
          f"{'epochs':>7}")
    for r in rows:
        ep = "-" if r["expected_epochs"] is None else f"{r['expected_epochs']:.2f}"
        print(f"{r['lang']:<5} {r['docs']:>9,} {r['tokens']:>11,} {r['sequences']:>9,} {r['natural']:>8.4f} "
              f"{r['p']:>7.4f} {r['upsampling']:>10.2f} {ep:>7}")
    return 0
