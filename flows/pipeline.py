"""Prefect flows: the full pipeline and one flow per stage, all through ``run_pipeline``.

Parameters are typed (and described) so the Prefect UI renders a usable form. A stage flow does
exactly what ``mlm run CONFIG --only STAGE`` does, its ``force`` being ``--force``: it reuses the stored
upstream outputs (failing, naming the stage to run first, when one is missing) and reuses the stage's own
complete output unless forced. Both default to not forcing, like the pipeline flow: the deployments'
schedules and a UI rerun then recompute only what a config change invalidated.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Annotated, Literal, Optional

from prefect import flow, get_run_logger
from pydantic import Field

from mlm_core import stages
from mlm_core.commands import run_command
from mlm_core.config.io import load_config
from tasks import summary, sweep_link
from tasks import engine
from tasks.stage import run_stage
from tasks.tracking import Tracker, check_tracking_server, pipeline_run_name, resolve_tracking_uri

StageName = Literal[tuple(stages.stage_names())]  # type: ignore[valid-type]

ConfigPath = Annotated[str, Field(description="Pipeline YAML file (relative to the working directory).")]
Overrides = Annotated[list[str], Field(description="Overrides KEY.PATH=VALUE, e.g. normalize.min_chars=10.")]
Force = Annotated[bool, Field(description="Recompute even when a complete stored output exists.")]


# `mlm run` plans before Prefect starts (to fail fast on a missing upstream) and hands that plan to the flow it
# calls in the same process: (config path, overrides) -> plans, taken once (``planned``)
_PLANNED: dict[tuple, dict] = {}


@contextlib.contextmanager
def planned(config_path: str, overrides: list[str] | None, plans: dict):
    """Within the block, ``run_pipeline`` for this config and overrides uses ``plans`` instead of planning again."""
    key = (str(config_path), tuple(overrides or []))
    _PLANNED[key] = plans
    try:
        yield
    finally:
        _PLANNED.pop(key, None)


def run_pipeline(config_path: str, overrides: list[str] | None = None, only: str | None = None,
                 from_stage: str | None = None, force: bool = False) -> list[dict]:
    """Plan once, then run the selected stages in order, each task with its own plan (as JSON); a failed stage
    stops the stages after it."""
    overrides = list(overrides or [])
    lc = load_config(config_path, overrides)
    if lc.config.tracking.enabled:
        check_tracking_server(resolve_tracking_uri(lc.config.tracking, lc.workdir))
    plans = _PLANNED.pop((str(config_path), tuple(overrides)), None) or stages.plan(lc)
    chosen = stages.select(plans, only=only, from_=from_stage, command=run_command(lc))
    forced = set(chosen) if force or from_stage else set()
    tracker = Tracker(lc.config.tracking, lc.workdir)
    what = f"only {only}" if only else f"from {from_stage}" if from_stage else "all stages"
    link = sweep_link.current()     # started by `mlm sweep`: nest under the sweep's run, tagged variant and seed
    parent = tracker.start_pipeline(link.get("run_name") or pipeline_run_name(lc.config.name, only, from_stage,
                                                                               overrides=overrides),
                                    params={"config_path": config_path, "overrides": overrides,  # "lr=0.001 · only shards · demo · 12-01 16:40"
                                            "selection": what, "force": force},
                                    tags={"stages": ",".join(chosen), **(link.get("tags") or {})},
                                    parent=link.get("parent_run_id"))
    results = []
    # the parent flow run's summary artifact: the `mlm run` command this run equals, its stages, the model version
    summarize = functools.partial(summary.publish, f"{lc.config.name} ({what})", chosen, results,
                                  tracker=tracker, model_name=lc.config.registry.model_name,
                                  config_line=f"`{run_command(lc, *_selection_args(only, from_stage, force))}`",
                                  parent_run_id=parent)
    name = None
    try:
        with engine.session():          # execution.engine dask without address: one LocalCluster for the run
            for name in chosen:
                results.append(run_stage(config_path, overrides, name, force=name in forced, parent_run_id=parent,
                                         plan=plans[name].to_json()))
    except Exception:
        tracker.end_pipeline("FAILED")
        summarize(failed=name)
        raise
    except BaseException:   # interrupted (SIGTERM/SIGINT): close the run, publish nothing, exit fast
        tracker.end_pipeline("FAILED")
        raise
    tracker.end_pipeline("FINISHED")
    summarize(failed=None)
    try:
        get_run_logger().info("pipeline done: %s", ", ".join(f"{r['stage']}={'cached' if r['cache_hit'] else 'ran'}"
                                                              for r in results))
    except Exception:
        pass
    return results


def register_outcome(results: list[dict]) -> tuple[str, bool] | None:
    """(line, gates failed?) for the register stage among ``results`` (None when it did not run): "registered
    version N, gates FAILED (k of n): a, b" or "registered version N, gates passed (n of n)"."""
    reg = next((r for r in results if r.get("stage") == "register" and r.get("gates")), None)
    if reg is None:
        return None
    g, v = reg["gates"], reg.get("model_version")
    head = f"registered version {v}" if v is not None else "not registered (tracking off)"
    if g["failed"]:
        return f"{head}, gates FAILED ({len(g['failed'])} of {g['n']}): {', '.join(g['failed'])}", True
    return f"{head}, gates passed ({g['n']} of {g['n']})" + (" -> champion" if v is not None else ""), False


def finish(results: list[dict], config_path: str, overrides: list[str] | None):
    """The flow run's end: the results, in a Completed state whose message says the registered version and
    its gates; on failed gates with ``registry.fail_on_gates``, GatesFailed (the flow run ends Failed)."""
    outcome = register_outcome(results)
    if outcome is None:
        return results
    from prefect.states import Completed

    from mlm_core.errors import GatesFailed
    line, failed = outcome
    if failed and load_config(config_path, overrides or []).config.registry.fail_on_gates:
        raise GatesFailed(line + " (registry.fail_on_gates: the flow run ends Failed)", results)
    return Completed(message=line, data=results)


def _selection_args(only: str | None, from_stage: str | None, force: bool) -> list[str]:
    return (["--only", only] if only else ["--from", from_stage] if from_stage else []) + (["--force"] if force else [])


@flow(name="mlm-pipeline", description="Run the whole pipeline, reusing every complete stored output.")
def pipeline(config_path: ConfigPath = "configs/demo.yaml", overrides: Overrides = [],  # noqa: B006
             from_stage: Annotated[Optional[StageName], Field(description="Rerun this stage and everything "
                                                                          "downstream of it.")] = None,
             force: Force = False) -> list[dict]:
    """Run the whole pipeline, reusing every complete stored output.

    Args:
        config_path: Pipeline YAML file, relative to the project root (the worker's working directory).
        overrides: Config overrides KEY.PATH=VALUE in YAML syntax, e.g. pretrain.steps=3000.
        from_stage: Rerun this stage and everything downstream of it (empty: run what is missing).
        force: Recompute every stage even when a complete stored output exists.
    """
    return finish(run_pipeline(config_path, overrides, from_stage=from_stage, force=force), config_path, overrides)


def _stage_flow(stage: str):
    """One flow per stage, for reruns from the UI: exactly `mlm run CONFIG --only STAGE` (force: `--force`)."""
    spec = stages.STAGES[stage]

    def run_one(config_path: ConfigPath = "configs/demo.yaml", overrides: Overrides = [],  # noqa: B006
                force: Force = False) -> list[dict]:
        return finish(run_pipeline(config_path, overrides, only=stage, force=force), config_path, overrides)

    run_one.__name__ = f"{stage}_flow"
    run_one.__doc__ = f"""{spec.summary[:1].upper()}{spec.summary[1:]}, from the stored upstream outputs.

    Args:
        config_path: Pipeline YAML file, relative to the project root (the worker's working directory).
        overrides: Config overrides KEY.PATH=VALUE in YAML syntax, e.g. normalize.min_chars=10.
        force: Recompute the stage even when its complete output is stored (off: reuse it).
    """
    return flow(name=f"mlm-{stage}", description=f"{spec.summary[:1].upper()}{spec.summary[1:]}, "
                f"from the stored upstream outputs.")(run_one)


# One flow per stage, derived from the stage graph: ``<stage>_flow`` is each one's module-level name (the
# deployments' entrypoint, flows/pipeline.py:<stage>_flow; deployments/prefect.yaml is regenerated from these).
STAGE_FLOWS = {name: _stage_flow(name) for name in stages.stage_names()}
globals().update({f"{name}_flow": f for name, f in STAGE_FLOWS.items()})
