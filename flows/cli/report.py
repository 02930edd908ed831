"""``mlm report SWEEP.yaml [--no-log] [--set KEY.PATH=VALUE ...]``: rebuild a sweep's report from its stored outputs (nothing trains).

Stdlib only at import (``mlm --help`` stays instant). The sweep is planned again (``mlm_core.sweep.plan``: the
fingerprints its runs have now, the statuses and MLflow run recorded in plan.json), the report is written to
``<workdir>/sweeps/<name>/report/`` and, unless --no-log, logged to the sweep's MLflow run
(``tasks.sweep_report.publish_report``, the function the ``mlm-sweep`` flow calls at its end).
"""
from __future__ import annotations



def report_plan(sweep) -> dict:
    """The plan document for the sweep as it is now, with plan.json's statuses and MLflow run id kept."""
    from mlm_core.sweep.plan import plan_document, plan_sweep, read_plan
    try:
        from tasks import external
        external.install()       # a models:/ reference in the base config is resolved like `mlm run` does
    except Exception:  # noqa: BLE001 - planning without registry references still works
        pass
    stored = read_plan(sweep) or {}
    status = {f"{v['name']}@seed{v['seed']}": v.get("status") for v in stored.get("variants", [])
              if v.get("status")}
    return plan_document(plan_sweep(sweep), status, stored.get("mlflow_run_id"))


def cmd_report(args) -> int:
    from mlm_core.sweep import load_sweep
    from tasks.sweep_report import publish_report
    sweep = load_sweep(args.sweep, overrides=list(args.set or []))   # the same --set as `mlm sweep`: same runs
    doc = report_plan(sweep)
    tracking = None if args.no_log else sweep.base.config.tracking
    res = publish_report(sweep.state_dir, plan=doc, tracking=tracking, workdir=sweep.base.workdir)
    n = len(doc["variants"])
    print(f"sweep {doc['name']}: report from {n - len(res['missing'])} of {n} run(s) with every output stored"
          f" -> {res['md']}")
    for m in res["missing"]:
        print(f"  missing: {m['variant']} seed {m['seed']} ({', '.join(m['stages'])})")
    prim = res.get("primary")
    if prim is None:
        print("  no primary metric declared (`primary:` in the sweep file): every table is exploratory, no verdict")
    else:
        metric = (doc.get("primary") or {}).get("metric")
        for c in prim:
            ci = f"[{c['ci_low']:+.4g}, {c['ci_high']:+.4g}]" if c.get("n") else "—"
            mean = f"{c['mean']:+.4g}" if c.get("n") else "—"
            p = "—" if c.get("p_holm") is None else f"{c['p_holm']:.3g}"
            print(f"  {c['verdict'].upper()}: {metric} {c['variant']} - {c['baseline']} = {mean} {ci} "
                  f"(n={c.get('n', 0)}, Holm p={p}, expected {c['expect']})")
    if res["logged"]:
        print(f"  logged to MLflow run {res['run_id']} (artifacts report/)")
    return 0


def add_parser(sub) -> None:
    sp = sub.add_parser("report", help="rebuild a sweep's report (verdicts on the primary contrasts, controls, "
                        "tables over seeds, paired differences, plots) from stored outputs, without training")
    sp.add_argument("sweep", help="sweep YAML (as given to `mlm sweep`)")
    sp.add_argument("--no-log", action="store_true", help="write the report files only (no MLflow logging)")
    sp.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="base config override, as given "
                    "to `mlm sweep` (the report then finds the same runs), repeatable")
    sp.set_defaults(func=cmd_report)
    return None


__all__ = ["cmd_report", "add_parser", "report_plan"]
