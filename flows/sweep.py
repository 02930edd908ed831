"""The ``mlm-sweep`` Prefect flow and ``run_sweep``, the one function ``mlm sweep SWEEP.yaml`` and the flow call.

1. Load and validate the sweep (``mlm_core.sweep``: every run's config checked before any work).
2. Plan every run (``mlm_core.sweep.plan``) and print the table of shared / stored / to-run stage outputs;
   ``dry_run`` stops here (nothing is written).
3. Open the sweep's MLflow run, write ``<workdir>/sweeps/<name>/plan.json``, and run every run that is not
   complete through the pipeline: with concurrency 1 the ``mlm-pipeline`` flow in this process (a subflow of
   ``mlm-sweep``: exactly what ``mlm run BASE --set ...`` calls); with concurrency N, N ``mlm run`` processes at
   a time (``tasks.sweep.run_child`` says why processes). Outputs shared by several runs are computed once: the
   store's per-output lock (``mlm_core.locks``) makes a second run wait for the first and reuse its output.
4. Resumable: a run whose every stage output is stored is skipped; a rerun finishes what is missing (stages
   reuse complete outputs, training resumes from its checkpoints). A failed run does not stop the others; the
   sweep then fails naming each failed run and its log. A child whose work is stored but not recorded (exit 4,
   an MLflow or Prefect outage; SQLite answers 503 under load) is ``unrecorded`` in plan.json: it runs once
   more at the end of the sweep and, if still unrecorded, on the next ``mlm sweep`` (every stage reused), so
   each run ends with its MLflow run; ``mlm sweep`` exits 4 while any is left. So does a stored run that
   plan.json left "running" (a sweep killed between its child storing register and ending its MLflow run).
5. The report (``tasks.sweep_report.publish_report``, what ``mlm report SWEEP.yaml`` rebuilds): written under
   ``<workdir>/sweeps/<name>/report/``, logged to the sweep's MLflow run, published as a Prefect artifact.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Callable, Optional

from prefect import flow
from pydantic import Field

from mlm_core.errors import MlmError
from mlm_core.sweep import load_sweep
from mlm_core.sweep.plan import plan_document, plan_sweep, table_lines, write_plan

log = logging.getLogger(__name__)
UNRECORDED = "unrecorded"     # plan.json status: the run's work is stored, its record (MLflow/Prefect) is not

SweepPath = Annotated[str, Field(description="Sweep YAML file (relative to the working directory); its `base` "
                                             "names the pipeline config.")]
DryRun = Annotated[bool, Field(description="Only plan: show which stage outputs are shared, stored and to run.")]
Overrides = Annotated[list[str], Field(description="Base config overrides KEY.PATH=VALUE applied to every run "
                                       "before the variant's own, e.g. pretrain.steps=20000 (scale-up).")]
Concurrency = Annotated[Optional[int], Field(default=None, ge=1, description="Runs at once (empty: the sweep "
                                                                                "file's `concurrency`).")]
Variants = Annotated[list[str], Field(description="Run only these variants (empty: all), e.g. the primary "
                                                  "contrasts first; the report still covers every run.")]
Seeds = Annotated[list[int], Field(description="Run only these seeds (empty: all), e.g. 0-2 here and 3-5 on "
                                               "another machine sharing the workdir.")]


class SweepFailed(MlmError):
    """Some runs of the sweep failed; the others finished. The message names each, with its log."""


def run_sweep(sweep_path: str, dry_run: bool = False, concurrency: int | None = None,
              echo: Callable[[str], None] = print, after_run: Callable | None = None,
              overrides: list[str] | None = None, variants: list[str] | None = None,
              seeds: list[int] | None = None) -> dict:
    """Plan, show, then run the sweep (module docstring). Returns the plan document (plan.json's content).

    ``overrides``: ``--set`` words applied to every run's base config (``mlm_core.sweep.load_sweep``).
    ``variants`` / ``seeds``: run only these (``Sweep.select``; e.g. the primary contrasts first, or one seed
    range per machine); the plan, plan.json and the report still cover every run.
    ``after_run(run, status)`` is called after each run finishes (tests stop a sweep midway with it)."""
    overrides = list(overrides or [])
    sweep = load_sweep(sweep_path, concurrency, overrides)
    chosen = sweep.select(variants, seeds)
    sp = plan_sweep(sweep)
    lines = table_lines(sp)
    for line in lines:
        echo(line)
    from tasks.sweep import publish_plan
    publish_plan(lines, sweep.config.name)
    if dry_run:
        return plan_document(sp)
    from mlm_core.sweep.plan import read_plan
    previous = read_plan(sweep) or {}
    from tasks.sweep import SweepTracker
    cfg = sweep.config
    tracker = SweepTracker(sweep, params={"sweep_file": sweep_path, "base": str(sweep.base_path), "runs": len(sp.runs),
                                          "variants": ",".join(sweep.variant_names),
                                          "seeds": sorted({r.seed for r in sweep.runs}),
                                          "baseline": cfg.baseline, "match": cfg.match, "metrics": cfg.metrics,
                                          "concurrency": cfg.concurrency, "overrides": overrides},
                           previous_run_id=previous.get("mlflow_run_id"))
    # a run whose every stage is stored is complete only if its pipeline run ended too. It did not when plan.json
    # says "unrecorded" (exit 4: an MLflow or Prefect outage), "running" (the sweep was killed while its child
    # was between storing register and ending its MLflow run) or "failed": such a run runs again, every stage
    # reused, so that MLflow and Prefect get its finished run
    before = {f"{v['name']}@seed{v['seed']}": v.get("status") for v in previous.get("variants", [])}
    record = {rp.run.key for rp in sp.runs if rp.done and before.get(rp.run.key) in (UNRECORDED, "running", "failed")}
    status = {rp.run.key: "done" if rp.done and rp.run.key not in record else "pending" for rp in sp.runs}
    for rp in sp.runs:     # a run not selected keeps what plan.json said (another `mlm sweep --seeds` may run it)
        if rp.run.key not in chosen and before.get(rp.run.key) in ("running", "failed", UNRECORDED):
            status[rp.run.key] = before[rp.run.key]
    logs: dict[str, str] = {}
    lock = threading.Lock()

    def save() -> dict:
        with lock:
            doc = plan_document(sp, dict(status), tracker.run_id)
            write_plan(sweep, doc)
            return doc

    def one(rp) -> None:
        run = rp.run
        if cfg.concurrency > 1:
            from tasks.sweep import stopping
            if stopping():        # the sweep is being stopped: leave the run pending
                return
        with lock:
            status[run.key] = "running"
        save()
        link = tracker.link(sweep, run)
        ok = recorded = False
        try:
            if cfg.concurrency == 1:
                ok = recorded = _run_here(sweep, run, link)
            else:
                from tasks.sweep import run_child, tail
                code, out = run_child(sweep, run, link, api_url)
                from flows.guard import EXIT_NOT_RECORDED
                from mlm_core.errors import EXIT_GATES_FAILED
                # failed gates are the run's result, not a failed run; work complete but not recorded (an MLflow
                # or Prefect outage, `mlm sync` records it) is done work too
                ok = code in (0, EXIT_GATES_FAILED, EXIT_NOT_RECORDED)
                recorded = code != EXIT_NOT_RECORDED
                if code == EXIT_NOT_RECORDED:
                    logs[run.key] = f"{tail(out)} (log: {out})"
                elif not ok:
                    logs[run.key] = f"exit {code}: {tail(out)} (log: {out})"
        except Exception as exc:  # noqa: BLE001 - one failed run does not stop the sweep
            from mlm_core.train.signals import Interrupted
            if isinstance(exc, Interrupted):     # SIGTERM/SIGINT: training checkpointed; stop the sweep
                raise
            logs[run.key] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        finally:
            with lock:
                status[run.key] = ("failed" if not ok else "done" if recorded else UNRECORDED)
                state = status[run.key]
            save()
        echo(f"{run.variant} seed {run.seed}: " + {"done": "done", "failed": "FAILED " + logs.get(run.key, ""),
                                                   UNRECORDED: "work stored, NOT RECORDED " + logs.get(run.key, "")
                                                   }[state])
        if after_run is not None:
            after_run(run, status[run.key])

    pending = [rp for rp in sp.runs if (not rp.done or rp.run.key in record) and rp.run.key in chosen]
    left = sum(1 for rp in sp.runs if (not rp.done or rp.run.key in record) and rp.run.key not in chosen)
    doc = save()
    echo(f"\n{len(sp.runs) - len(pending) - left} run(s) stored, {len(pending)} to run"
         + (f", {left} not selected (--variants/--seeds)" if left else "")
         + (f" ({len(record)} stored but not recorded as finished: they run again, every stage reused)"
            if record else "")
         + (f", {cfg.concurrency} at a time" if cfg.concurrency > 1 and pending else ""))
    api_url = None
    if cfg.concurrency > 1 and pending:
        from tasks.sweep import allow_children, prefect_api_url
        api_url = prefect_api_url()
        allow_children()
    try:
        if cfg.concurrency == 1:
            for rp in pending:
                one(rp)
        elif pending:
            _run_pool(cfg.concurrency, one, pending)
        again_now = [rp for rp in pending if status[rp.run.key] == UNRECORDED]
        if again_now:        # an outage under load is often over by now: record them once more, one at a time
            echo(f"recording again {len(again_now)} run(s) whose work is stored but not recorded")
            for rp in again_now:
                one(rp)
    except BaseException:
        tracker.finish(save(), "FAILED")
        raise
    sp = plan_sweep(sweep)     # plan.json's stage table as stored now, not as it was before the runs
    doc = save()
    failed = [k for k, s in status.items() if s == "failed"]
    again = " ".join([sweep_path] + [f"--set {w}" for w in overrides]
                     + ([f"--variants {','.join(variants)}"] if variants else [])
                     + ([f"--seeds {','.join(map(str, seeds))}"] if seeds else []))
    unrecorded = [k for k, s in status.items() if s == UNRECORDED]
    if unrecorded:
        echo(f"{len(unrecorded)} run(s) complete but NOT RECORDED in MLflow/Prefect ({', '.join(unrecorded)}); "
             f"once the servers answer, rerun `mlm sweep {again}` to record them (every stage is reused)")
    report_error = _report(sweep, doc, tracker, echo)
    tracker.finish(doc, "FAILED" if failed or report_error else "FINISHED")
    if failed:
        raise SweepFailed(f"sweep {cfg.name}: {len(failed)} of {len(sp.runs)} run(s) failed (the others are stored; "
                          f"rerun `mlm sweep {again}` to retry them):\n  "
                          + "\n  ".join(f"{k}: {logs.get(k, '')}" for k in failed))
    if report_error:
        raise SweepFailed(f"sweep {cfg.name}: every run is stored, but the report failed: {report_error}; "
                          f"rebuild it with `mlm report {again}`")
    return doc


def _report(sweep, doc: dict, tracker, echo) -> str | None:
    """The sweep's report (``tasks.sweep_report``: files, the sweep's MLflow run, a Prefect artifact), built from
    what is stored (runs that failed are listed as missing). Returns the error, if it failed."""
    try:
        from tasks.sweep_report import publish_report
        res = publish_report(sweep.state_dir, plan=doc, run_id=tracker.run_id, tracker=tracker.tracker)
    except Exception as exc:  # noqa: BLE001 - the runs are stored; the report can be rebuilt alone
        log.exception("sweep report failed")
        return f"{type(exc).__name__}: {exc}"
    echo(f"report: {res['md']}" + (f" (logged to MLflow run {res['run_id']})" if res.get("logged") else ""))
    return None


def _run_pool(n: int, one: Callable, pending: list) -> None:
    """``one`` for every pending run, ``n`` at a time; interrupted (SIGTERM/SIGINT to the sweep, an ``after_run``
    error): the live child runs are stopped (they checkpoint) and no new one starts, before the error goes on."""
    from tasks.sweep import stop_children

    def guarded(rp) -> None:
        try:
            one(rp)
        except BaseException:
            stop_children()       # now, in this thread: a free worker must not start the next run meanwhile
            raise
    pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="sweep")
    try:
        for f in [pool.submit(guarded, rp) for rp in pending]:
            f.result()
    except BaseException:
        stop_children()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _run_here(sweep, run, link: dict) -> bool:
    """One run in this process: the ``mlm-pipeline`` flow, as ``mlm run BASE --set ...`` calls it."""
    from flows.pipeline import pipeline
    from tasks import sweep_link
    from mlm_core.errors import GatesFailed
    with sweep_link.linked(link):
        try:
            pipeline(config_path=str(sweep.base_path), overrides=list(run.overrides))
        except GatesFailed:      # registry.fail_on_gates: the run completed; its gates failing is its result
            pass
    return True


@flow(name="mlm-sweep", description="Run every variant x seed of a sweep through the pipeline, sharing stored "
                                    "stages; resumable.")
def sweep_flow(sweep_path: SweepPath = "configs/sweeps/demo.yaml", dry_run: DryRun = False,
               concurrency: Concurrency = None, overrides: Overrides = [],  # noqa: B006
               variants: Variants = [], seeds: Seeds = []) -> dict:  # noqa: B006
    """Plan a sweep, show which stages are shared, then run what is missing.

    Args:
        sweep_path: Sweep YAML file, relative to the project root (the worker's working directory).
        dry_run: Only plan and show the table (nothing runs, nothing is written).
        concurrency: Runs at once; empty: the sweep file's `concurrency`.
        overrides: Base config overrides KEY.PATH=VALUE (YAML syntax) applied to every run, e.g. pretrain.steps=20000.
        variants: Run only these variants (empty: all).
        seeds: Run only these seeds (empty: all).
    """
    return run_sweep(sweep_path, dry_run=dry_run, concurrency=concurrency, overrides=overrides,
                     variants=list(variants or []), seeds=list(seeds or []))


__all__ = ["run_sweep", "sweep_flow", "SweepFailed", "UNRECORDED"]
