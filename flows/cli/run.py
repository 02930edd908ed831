"""``mlm run`` and ``mlm sync``: the pipeline through the same Prefect flows as the Prefect UI
(``flows/pipeline.py``), and the replay to MLflow of what a lost tracking server missed. Stdlib at import (``mlm
--help`` stays instant); Prefect and MLflow are imported inside the commands.
"""
from __future__ import annotations

from flows.cli.util import adopt_servers_for, load_args, prepare_env


def cmd_run(args) -> int:
    lc = load_args(args)  # fail fast on a bad config, before Prefect starts
    from mlm_core import stages
    from mlm_core.commands import run_command
    plans = stages.plan(lc)        # the run's one plan: the flow below reuses it (flows.pipeline.planned)
    chosen = stages.select(plans, only=args.only, from_=args.from_stage,   # fail fast on a missing upstream
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
        from flows.pipeline import STAGE_FLOWS, pipeline, planned
        guard.quiet_expected_tracebacks()
        orchestrator.quiet_api_log_errors()   # a lost Prefect API: one line, then a count (not 2 lines per batch)
        ephemeral.start(lc.workdir)   # generous start-up timeout, under a lock, never orphaned (flows/ephemeral.py)
        overrides = list(args.set or [])
        from mlm_core.errors import EXIT_GATES_FAILED, GatesFailed
        try:
            with planned(args.config, overrides, plans):
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
    from tasks.tracking.sync import sync
    rep = sync(lc)
    print(f"synced {lc.workdir} to {redact(rep['uri'])}: {len(rep['created'])} run(s) created "
          f"({', '.join(rep['created']) or '-'}), {len(rep['finished'])} left RUNNING given their end "
          f"({', '.join(rep['finished']) or '-'}), {rep['params']} parameter(s), {rep['tags']} tag(s), "
          f"{rep['artifacts']} artifact(s) and {rep['points']} metric point(s) sent, "
          f"{len(rep['closed'])} run(s) of killed processes closed as FAILED"
          + (f"; {rep['pending']} journal entr(ies) left (their runs are on another server)" if rep["pending"] else ""))
    return 0
