"""The ``mlm`` command line: the parser and ``main``. Imports nothing heavy at start-up (``mlm --help`` stays
instant): torch, Prefect, MLflow and Great Expectations are imported inside the commands that need them.

One module per command group, each on the shared leaf ``flows.cli.util`` and none importing this one back:
``run`` (run, sync), ``status`` (status, verify, stats), ``model`` (evaluate, audit, fill-mask), ``config``,
``compare``, ``sweep``, ``report``, ``registry`` (promote, rollback); ``mlm serve``/``deploy`` from ``flows.serve``.
"""
from __future__ import annotations

import argparse
import sys

from flows.serve import add_parsers as add_server_parsers  # stdlib only: `mlm --help` stays instant
from flows.cli.registry import add_parsers as add_registry_parsers  # stdlib only too
from flows.cli.compare import add_parser as add_compare_parser  # stdlib only too
from flows.cli.sweep import add_parser as add_sweep_parser  # stdlib only too
from flows.cli.report import add_parser as add_report_parser  # stdlib only too
from flows.cli.status import cmd_stats, cmd_status, cmd_verify  # stdlib only too
from flows.cli.config import cmd_config_docs, cmd_config_schema, cmd_config_validate  # stdlib only too
from flows.cli.model import cmd_audit, cmd_evaluate, cmd_fill_mask  # stdlib only too
from flows.cli.run import cmd_run, cmd_sync  # stdlib only too


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mlm", description="Declarative multilingual masked-LM pipeline "
                                "(normalize -> tokenizer -> shards -> pretrain -> evaluate -> audit -> register).")
    sub = p.add_subparsers(dest="command", required=True)

    def with_config(sp, name="config", optional=False):
        sp.add_argument(name, help="pipeline YAML file" + (" (default: ./mlm.yaml, or the only configs/*.yaml)"
                                                           if optional else ""),
                        **({"required": True} if name.startswith("--") else {"nargs": "?"} if optional else {}))
        sp.add_argument("--set", action="append", metavar="KEY.PATH=VALUE",
                        help="override a config value (YAML syntax), repeatable: --set normalize.min_chars=10")
        return sp

    r = with_config(sub.add_parser("run", help="run the pipeline (reusing every complete stored output)"))
    g = r.add_mutually_exclusive_group()
    g.add_argument("--only", metavar="STAGE", help="run exactly this stage from the stored upstream outputs "
                   "(its own complete output is reused unless --force)")
    g.add_argument("--from", dest="from_stage", metavar="STAGE", help="rerun this stage and everything downstream")
    r.add_argument("--force", action="store_true", help="recompute even when complete outputs exist")
    r.set_defaults(func=cmd_run)

    s = with_config(sub.add_parser("status", help="show each stage as done / missing / stale / failed / corrupt "
                                   "(exit 1 when a stored output is corrupt)"), optional=True)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_status)

    v = with_config(sub.add_parser("verify", help="check every stored output against its manifest (full sha256)"))
    v.add_argument("stage", nargs="?", help="check only this stage's output")
    v.add_argument("--json", action="store_true", help="machine-readable output")
    v.set_defaults(func=cmd_verify)

    st = with_config(sub.add_parser("stats", help="per-language documents, tokens, p(l) and upsampling"))
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(func=cmd_stats)

    fm = sub.add_parser("fill-mask", help="top-k predictions for the mask token(s) in a text")
    fm.add_argument("model", help="models:/name@alias (registry), models:/name/VERSION, or a local model folder")
    fm.add_argument("text", help="text containing the mask token, e.g. 'The cat [MASK] on the mat.'")
    fm.add_argument("--top-k", type=int, default=5)
    fm.add_argument("--config", help="pipeline YAML whose tracking settings locate the registry (default: "
                    "$MLM_TRACKING_URI, else an existing ./.mlm/mlflow.db)")
    fm.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="config override")
    fm.add_argument("--json", action="store_true")
    fm.set_defaults(func=cmd_fill_mask)

    for name, func, what in (("evaluate", cmd_evaluate, "per-language metrics and zero-shot transfer of a model"),
                             ("audit", cmd_audit, "bias audits (CrowS-Pairs, templates) of a model")):
        sp = sub.add_parser(name, help=what)
        sp.add_argument("model", help="models:/name@alias, models:/name/VERSION, or a local model folder")
        with_config(sp, "--config").set_defaults(func=func)
        sp.add_argument("--json", action="store_true")

    add_compare_parser(sub, with_config)
    add_sweep_parser(sub)
    add_report_parser(sub)
    c = sub.add_parser("config", help="validate a config or print its JSON Schema")
    csub = c.add_subparsers(dest="config_command", required=True)
    cv = with_config(csub.add_parser("validate", help="parse and check a config file (and that its files exist)"))
    cv.add_argument("--no-paths", action="store_true", help="do not check that the source, evaluation and audit "
                    "files (and globs) the config names exist")
    cv.set_defaults(func=cmd_config_validate)
    sc = csub.add_parser("schema", help="print the config JSON Schema")
    sc.add_argument("--write", action="store_true", help="write it to schemas/config.schema.json")
    sc.set_defaults(func=cmd_config_schema)
    sd = csub.add_parser("docs", help="print the configuration reference (Markdown)")
    sd.add_argument("--write", action="store_true", help="write it to docs/CONFIG.md")
    sd.set_defaults(func=cmd_config_docs)
    with_config(sub.add_parser("sync", help="send to MLflow what a lost tracking server missed (runs, metrics.jsonl)"
                               )).set_defaults(func=cmd_sync)
    add_registry_parsers(sub)
    add_server_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from flows import logs
    logs.configure()        # WARNING (INFO with MLM_VERBOSE=1); HTTP client request logs stay quiet
    from flows import guard
    if "tasks.tracking" in sys.modules:   # called in-process again (tests, a notebook): warn of this command's
        from tasks.tracking import reset_delivery_report   # undelivered records only, not an earlier one's
        reset_delivery_report()
    if "tasks.orchestrator" in sys.modules:
        from tasks import orchestrator
        orchestrator.reset()
    folded = False
    try:
        code = args.func(args) or 0
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        code = 130
    except Exception as exc:  # noqa: BLE001 - every error ends as one `error:` line (MLM_VERBOSE=1: traceback)
        guard.report(exc)
        code = guard.exit_code(exc)
        from flows.outage import NotRecorded
        folded = isinstance(exc, NotRecorded)
    # an outage's line already names a lost MLflow server and the commands: one closing line, not two
    warning = None if folded else guard.tracking_warning(getattr(args, "config", None) or "CONFIG",
                                                         getattr(args, "set", None) or [])
    if warning:
        print(warning, file=sys.stderr)
        if code == 0:           # the work is complete, MLflow did not record it: exit 4 (README)
            code = guard.EXIT_NOT_RECORDED
    lost_logs = None if folded else guard.prefect_log_warning()
    if lost_logs:
        print(lost_logs, file=sys.stderr)
    if argv is None and args.command == "run":
        guard.fast_exit(code)   # skip the interpreter's final garbage collection (10+ s after a run, measured)
    return code
