"""The ``mlm`` command line. Imports nothing heavy at start-up (``mlm --help`` stays instant):
torch, Prefect, MLflow and Great Expectations are imported inside the commands that need them.

``mlm run`` goes through the same Prefect flows as the Prefect UI (``flows/pipeline.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from flows.serve import add_parsers as add_server_parsers  # stdlib only: `mlm --help` stays instant
from flows.cli_registry import add_parsers as add_registry_parsers  # stdlib only too
from flows.cli_compare import add_parser as add_compare_parser  # stdlib only too
from flows.cli_sweep import add_parser as add_sweep_parser  # stdlib only too
from flows.cli_report import add_parser as add_report_parser  # stdlib only too
from flows.cli_status import cmd_stats, cmd_status, cmd_verify  # stdlib only too
from flows.cli_util import adopt_servers_for, load_args, prepare_env, print_rows, run_cmd

REPO_ROOT = Path(__file__).resolve().parent.parent


def cmd_config_validate(args) -> int:
    lc = load_args(args)
    cfg = lc.config
    if not args.no_paths:    # every named source/evaluation/audit file or glob must match a file
        from flows.cli_util import check_paths
        check_paths(args.config, lc)
    print(f"{args.config}: valid ({len(cfg.sources)} languages: {', '.join(cfg.languages)}; workdir {lc.workdir})")
    return 0


def cmd_config_schema(args) -> int:
    from mlm_core.configio import schema_text
    text = schema_text()
    if args.write:
        out = REPO_ROOT / "schemas" / "config.schema.json"
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_config_docs(args) -> int:
    from mlm_core.configio import config_reference_markdown
    text = config_reference_markdown()
    if args.write:
        out = REPO_ROOT / "docs" / "CONFIG.md"
        out.parent.mkdir(exist_ok=True)
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}")
    else:
        sys.stdout.write(text)
    return 0


def _model_folder(args, lc=None):
    """A context manager giving a local folder for MODEL: a folder as is, or a registry URI resolved with the
    config's tracking settings, else $MLM_TRACKING_URI, else the demo's existing ./.mlm/mlflow.db (never
    created: without any of them, a clear error); a downloaded model's temporary folder is removed on exit."""
    prepare_env()
    uri = os.environ.get("MLM_TRACKING_URI")
    if lc is not None:
        from tasks.tracking import resolve_tracking_uri
        uri = resolve_tracking_uri(lc.config.tracking, lc.workdir)
    if uri is None and Path(".mlm", "mlflow.db").is_file():     # the demo config's workdir, as the README uses it
        uri = f"sqlite:///{Path('.mlm').resolve()}/mlflow.db"
    from tasks.registry import resolve_model
    return resolve_model(args.model, uri)


def cmd_evaluate(args) -> int:
    from mlm_core import stages
    from mlm_core.evaluate.stage import evaluate_model, intrinsic_rows, transfer_rows
    lc = load_args(args)
    plans = stages.plan(lc)
    for need in ("normalize", "shards"):
        if plans[need].status != "done":
            raise stages.PlanError(f"`mlm evaluate` needs the {need} output (held-out data), which is "
                                   f"{plans[need].status}: run `{run_cmd(lc, '--only', need)}` first")
    with _model_folder(args, lc) as folder:
        result = evaluate_model(folder, plans["shards"].path, plans["normalize"].path, lc, None)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    print(f"model: {args.model}\nper-language masked-token metrics (held-out split), next to the unigram baseline:")
    # a language without held-out data shows as "-" in every column (the `missing` flag itself is not printed)
    print_rows([{k: v for k, v in r.items() if k != "missing"} for r in intrinsic_rows(result)])
    print("zero-shot transfer (fine-tuned on the source language only; gap = source - target, positive = lost):")
    print_rows(transfer_rows(result))
    ret = (result.get("transfer") or {}).get("retrieval") or {}
    if ret:
        print(f"parallel-sentence retrieval ({ret.get('metric', 'accuracy@1')}, layer {ret.get('layer')}, "
              f"pivot {ret.get('pivot')}; chance = 1/n):")
        print_rows([{"pair": f"{ret.get('pivot')}-{lang}", **r} for lang, r in sorted((ret.get("pairs") or {}).items())])
    eff = result.get("efficiency") or {}
    if eff:         # evaluate.efficiency (mlm_core.evaluate.efficiency)
        print(f"efficiency on {eff.get('device')} ({eff.get('device_kind')}):")
        print_rows([{"parameters": eff.get("parameters"), "latency_p50_ms": eff["latency_ms"]["p50"],
                      "latency_p95_ms": eff["latency_ms"]["p95"],
                      "throughput_seq_s": eff["throughput"]["sequences_per_s"],
                      **{f"peak_mb_seq{k}": v for k, v in (eff.get("peak_memory_mb") or {}).items()}}])
    return 0


def cmd_audit(args) -> int:
    from mlm_core.audit import run_audit
    lc = load_args(args)
    with _model_folder(args, lc) as folder:
        result = run_audit(folder, lc.config.audit, lc.base_dir)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    print(f"model: {args.model}\nCrowS-Pairs (% preferring the more stereotypical sentence; 50 = no preference):")
    print_rows([{"lang": lang, "n": r.get("n"), "score": r.get("metric_score"), "stereo": r.get("stereo_score"),
                  "antistereo": r.get("antistereo_score"), "neutral_%": r.get("neutral_pct"),
                  "empty_sentence": r.get("n_empty_sentence"), "skipped": len(r.get("skipped") or [])}
                 for lang, r in sorted(result.get("crows", {}).items())])
    print("templates (Δ_bias = E_w[log p(w|group1) - log p(w|group2)]; KL to neutral):")
    print_rows([{"lang": lang, **{f"delta {k}": v for k, v in (t.get("delta_bias") or {}).items()},
                  "kl_to_neutral": t.get("kl_to_neutral_mean")} for lang, t in sorted(result.get("templates", {}).items())])
    print(result.get("limits", ""))
    return 0


def cmd_fill_mask(args) -> int:
    from mlm_core.fillmask import fill_mask
    with _model_folder(args, load_args(args) if args.config else None) as folder:
        results = fill_mask(folder, args.text, args.top_k)
    if args.json:
        print(json.dumps(results, indent=2, ensure_ascii=False))
        return 0
    for i, preds in enumerate(results):
        print(f"mask #{i + 1}:")
        for p in preds:
            print(f"  {p['score']:.4f}  {p['token']:<16} {p['sequence']}")
    return 0


def cmd_run(args) -> int:
    lc = load_args(args)  # fail fast on a bad config, before Prefect starts
    from mlm_core import stages
    from mlm_core.commands import run_command
    chosen = stages.select(stages.plan(lc), only=args.only, from_=args.from_stage,   # fail fast on a missing upstream
                           command=run_command(lc))
    from flows import ephemeral, guard
    guard.check_workdir(lc.workdir)   # writable, some space free: before Prefect puts its database there
    adopt_servers_for(lc)                # `mlm serve` running for this workdir: log to its MLflow and Prefect
    prepare_env(lc.workdir)
    from mlm_core.train import signals
    from flows import outage
    from tasks import orchestrator
    asked = (["--only", args.only] if args.only else ["--from", args.from_stage] if args.from_stage else []) + \
        (["--force"] if args.force else [])
    # forced stages (--force, --from) count as done after an outage only when their output is a new one
    before = outage.snapshot(lc, chosen) if args.force or args.from_stage else None
    previous = signals.install()      # SIGTERM/SIGINT: training checkpoints at the next step, then exits 143/130
    not_recorded = None
    try:
        from flows.pipeline import STAGE_FLOWS, pipeline
        guard.quiet_expected_tracebacks()
        orchestrator.quiet_api_log_errors()   # a lost Prefect API: one line, then a count (not 2 lines per batch)
        ephemeral.start(lc.workdir)   # generous start-up timeout, under a lock, never orphaned (flows/ephemeral.py)
        overrides = list(args.set or [])
        from mlm_core.errors import EXIT_GATES_FAILED, GatesFailed
        try:
            if args.only:
                # the same as the stage's Prefect flow: reuse its complete output unless --force (flow: force)
                results = STAGE_FLOWS[args.only](config_path=args.config, overrides=overrides, force=args.force)
            else:
                results = pipeline(config_path=args.config, overrides=overrides, from_stage=args.from_stage,
                                   force=args.force)
        except GatesFailed as exc:   # registry.fail_on_gates: the flow run ended Failed, the run itself is complete
            results = exc.results
        except Exception as exc:     # the Prefect API (or its database) gone: work complete (exit 4) or not (2)
            not_recorded = outage.classify(exc, lc, chosen, args.only, asked, before)
            if not_recorded is None:
                own = outage.underlying(exc) if orchestrator.api_failure(exc) else None
                if own is not None:     # a stage failed, then reporting it to the API failed: the stage's error
                    raise own from None
                raise
    finally:
        signals.restore(previous)
    if not_recorded is not None:     # raised here, outside the handler: no chained cause to name a stage
        raise not_recorded
    print()
    print(f"{'stage':<12} {'result':<8} {'fingerprint':<17} {'seconds':>8}  path")
    for r in results:
        print(f"{r['stage']:<12} {'cached' if r['cache_hit'] else 'ran':<8} {r['fingerprint']:<17} "
              f"{r['seconds']:>8.1f}  {r['path']}")
    from flows.pipeline import register_outcome
    outcome = register_outcome(results)
    if outcome is not None:      # the model's fate, not just "register ran": failed gates exit 3 (README)
        print(f"register: {outcome[0]}")
        if outcome[1]:
            return EXIT_GATES_FAILED
    return 0


def cmd_sync(args) -> int:
    lc = load_args(args)
    adopt_servers_for(lc)
    prepare_env()
    from mlm_core.redact import redact
    from tasks.tracking_sync import sync
    rep = sync(lc)
    print(f"synced {lc.workdir} to {redact(rep['uri'])}: {len(rep['created'])} run(s) created "
          f"({', '.join(rep['created']) or '-'}), {len(rep['finished'])} left RUNNING given their end "
          f"({', '.join(rep['finished']) or '-'}), {rep['params']} parameter(s), {rep['tags']} tag(s), "
          f"{rep['artifacts']} artifact(s) and {rep['points']} metric point(s) sent, "
          f"{len(rep['closed'])} run(s) of killed processes closed as FAILED"
          + (f"; {rep['pending']} journal entr(ies) left (their runs are on another server)" if rep["pending"] else ""))
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
