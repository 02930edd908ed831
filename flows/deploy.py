"""Prefect deployments: one for the full pipeline, one per stage flow, on a ``process`` work pool.

In: ``deployments/prefect.yaml`` (the source of truth for what gets deployed) and a Prefect API URL.
Out: the work pool (created when missing) and the deployments, applied with
``prefect --no-prompt deploy --all`` from the project root, exactly as a user would.

The YAML is *generated* from ``flows.pipeline.STAGE_FLOWS`` (``render_prefect_yaml``; write it with
``mlm deploy --write-yaml``) and a test keeps the checked-in file in sync, so adding a stage flow is
one entry in ``STAGE_FLOWS`` plus one regeneration.

Why a patched temporary copy of the YAML is deployed instead of the file itself: with ``--all``,
``prefect deploy`` ignores ``--pool`` (multi-deploy ignores CLI options, prefect 3.9.1
``cli/deploy/_commands.py``), and a schedule's ``active`` flag has no CLI switch. ``deploy`` copies
the file, sets the pool name, the schedules' ``active`` flag and the absolute project root in the pull
step, and deploys the copy from the project root.

Prefect is imported inside functions only (``mlm --help`` stays instant).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PREFECT_FILE = REPO_ROOT / "deployments" / "prefect.yaml"
POOL = "mlm-process"
DEPLOYMENT = "default"            # every deployment is named <flow name>/default
DEFAULT_CONFIG = "configs/demo.yaml"
COMPARE_CONFIG = "configs/adapt.yaml"
SWEEP_FILE = "configs/sweeps/demo.yaml"     # mlm-sweep: a sweep file, not a pipeline config
CRON = "0 2 * * *"                # nightly, 02:00 UTC
TIMEZONE = "UTC"

_HEADER = """\
# Prefect deployments of mlm-pipeline. GENERATED from flows/pipeline.py (pipeline + STAGE_FLOWS), flows/compare.py and flows/sweep.py by
#   mlm deploy --write-yaml
# and kept in sync by tests/test_servers.py; edit flows/deploy.py (render_prefect_yaml), not this file,
# for anything that must survive a regeneration.
#
# Apply (creates the work pool if missing, then runs `prefect --no-prompt deploy --all` on this file):
#   mlm deploy [--api-url http://127.0.0.1:4200/api] [--pool mlm-process] [--schedule]
# or by hand, FROM THE PROJECT ROOT (entrypoints are relative to it; `{{ $PWD }}` is resolved at
# deploy time and becomes the directory the worker runs every flow in):
#   PREFECT_API_URL=http://127.0.0.1:4200/api prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml
# Schedules are inactive (`active: false`); `mlm deploy --schedule` deploys them active.
"""


def flow_specs() -> list[tuple[str, str, str]]:
    """``(flow name, entrypoint, description)`` for the full pipeline, every stage flow in order, mlm-compare, mlm-sweep."""
    from flows.compare import compare_flow
    from flows.pipeline import STAGE_FLOWS, pipeline

    flows = [pipeline, *STAGE_FLOWS.values()]
    from flows.sweep import sweep_flow

    return [(f.name, f"flows/pipeline.py:{f.fn.__name__}", f.description or "") for f in flows] + \
        [(compare_flow.name, f"flows/compare.py:{compare_flow.fn.__name__}", compare_flow.description or "")] + \
        [(sweep_flow.name, f"flows/sweep.py:{sweep_flow.fn.__name__}", sweep_flow.description or "")]


def render_config() -> dict:
    """The prefect.yaml content as a dict (what ``render_prefect_yaml`` writes)."""
    from prefect import __version__ as prefect_version

    deployments = []
    for flow_name, entrypoint, description in flow_specs():
        deployments.append({
            "name": DEPLOYMENT,
            "entrypoint": entrypoint,
            "description": description,
            "tags": ["mlm"],
            # mlm-compare: before vs after of the adapt demo (its other parameters have defaults too)
            "parameters": ({"sweep_path": SWEEP_FILE} if entrypoint.startswith("flows/sweep.py") else
                           {"config_path": COMPARE_CONFIG if entrypoint.startswith("flows/compare.py")
                            else DEFAULT_CONFIG}),
            "work_pool": {"name": POOL},
            "schedules": [{"cron": CRON, "timezone": TIMEZONE, "active": False}],
        })
    return {
        "name": "mlm-pipeline",
        "prefect-version": prefect_version,
        "build": None,
        "push": None,
        "pull": [{"prefect.deployments.steps.set_working_directory": {"directory": "{{ $PWD }}"}}],
        "deployments": deployments,
    }


def render_prefect_yaml() -> str:
    import yaml

    body = yaml.safe_dump(render_config(), sort_keys=False, allow_unicode=True, width=110)
    return _HEADER + "\n" + body


def load_prefect_yaml(path: Path = PREFECT_FILE) -> dict:
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8"))


def out_of_sync(path: Path = PREFECT_FILE) -> list[str]:
    """Entrypoints that the code defines but the YAML lacks, or the reverse (empty = in sync)."""
    have = {d["entrypoint"] for d in load_prefect_yaml(path).get("deployments") or []}
    want = {e for _, e, _ in flow_specs()}
    return [f"missing in {path.name}: {e}" for e in sorted(want - have)] + \
           [f"stale in {path.name}: {e}" for e in sorted(have - want)]


def patched_config(pool: str = POOL, schedule: bool = False, root: Path = REPO_ROOT,
                   path: Path = PREFECT_FILE) -> dict:
    """The checked-in YAML with the pool, the schedules' active flag and the absolute project root set."""
    cfg = load_prefect_yaml(path)
    cfg["pull"] = [{"prefect.deployments.steps.set_working_directory": {"directory": str(root)}}]
    for d in cfg.get("deployments") or []:
        d.setdefault("work_pool", {})["name"] = pool
        for s in d.get("schedules") or []:
            s["active"] = bool(schedule)
    return cfg


# ------------------------------------------------------------------------------------- API side
def ensure_work_pool(name: str = POOL) -> bool:
    """Create the ``process`` work pool when missing (uses PREFECT_API_URL). True when created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
            return False
        except ObjectNotFound:
            pass
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))
        except ObjectAlreadyExists:  # another process won the race
            return False
        return True


def deployment_status(names: list[str]) -> dict[str, str]:
    """``{deployment name: status}`` (READY, NOT_READY, DISABLED, or MISSING) as the Prefect UI shows it."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    out = {}
    with get_client(sync_client=True) as client:
        for name in names:
            try:
                status = client.read_deployment_by_name(name).status
            except ObjectNotFound:
                out[name] = "MISSING"
                continue
            out[name] = getattr(status, "value", None) or str(status or "NOT_READY")
    return out


def online_workers(pool: str) -> list[str]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return sorted(w.name for w in client.read_workers_for_work_pool(pool)
                      if str(getattr(w.status, "value", w.status)) == "ONLINE")


def wait_until_ready(names: list[str], timeout: float, interval: float = 1.0,
                     status_fn=deployment_status) -> dict[str, str]:
    """Poll until every deployment is READY (a worker polled its pool since it was created); returns the
    ones still not ready after ``timeout`` seconds (empty: all ready).

    Why: Prefect marks a new deployment READY only at a worker's next poll of its pool (every
    PREFECT_WORKER_QUERY_SECONDS, 10 s by default), so right after ``prefect deploy`` the UI shows
    "Not Ready" although ``mlm serve``'s worker is running."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        pending = {n: s for n, s in status_fn(names).items() if s != "READY"}
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(interval)


def not_ready_message(pending: dict[str, str], pool: str, timeout: float, workers: list[str]) -> str:
    listed = ", ".join(f"{n} ({s})" for n, s in sorted(pending.items()))
    why = (f"worker(s) {', '.join(workers)} are online in pool {pool} but have not polled these yet"
           if workers else f"no worker is polling pool {pool}: start one with `mlm serve`, or "
                           f"`prefect worker start --pool {pool}`")
    return (f"error: {len(pending)} deployment(s) not ready after {timeout:.0f}s: {listed}; {why} "
            f"(`mlm deploy --wait 0` returns without waiting)")


def deployment_env(api_url: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if api_url:
        env["PREFECT_API_URL"] = api_url
    env["PWD"] = str(REPO_ROOT)
    return env


def deploy(api_url: str | None = None, pool: str = POOL, schedule: bool = False,
           timeout: float = 300, quiet: bool = False, wait: float = 60) -> int:
    """Create the pool if missing and apply every deployment of the YAML; then (``wait`` > 0) return only
    once a worker polls every deployment (all READY), or exit 1 naming those that are not. Returns the
    exit code."""
    env = deployment_env(api_url)
    if api_url:
        os.environ["PREFECT_API_URL"] = api_url   # for ensure_work_pool in this process
    if not os.environ.get("PREFECT_API_URL"):
        print("error: no Prefect server: pass --api-url or export PREFECT_API_URL "
              "(e.g. http://127.0.0.1:4200/api, as printed by `mlm serve`)", file=sys.stderr)
        return 2
    for problem in out_of_sync():
        print(f"warning: {problem} (regenerate with `mlm deploy --write-yaml`)", file=sys.stderr)
    created = ensure_work_pool(pool)
    if not quiet:
        print(f"work pool {pool}: {'created' if created else 'exists'}")
    import yaml

    with tempfile.TemporaryDirectory(prefix="mlm-deploy-") as tmp:
        patched = Path(tmp) / "prefect.yaml"
        patched.write_text(yaml.safe_dump(patched_config(pool, schedule), sort_keys=False), encoding="utf-8")
        cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all", "--prefect-file", str(patched)]
        try:
            proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"error: `prefect deploy` did not finish in {timeout:.0f}s", file=sys.stderr)
            return 1
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        print(f"error: `prefect deploy --all` failed (exit {proc.returncode})", file=sys.stderr)
        return 1
    names = [f"{name}/{DEPLOYMENT}" for name, _, _ in flow_specs()]
    if not quiet:
        state = "ACTIVE" if schedule else "inactive (enable with `mlm deploy --schedule`)"
        print(f"deployed {len(names)} deployment(s) to pool {pool}: {', '.join(names)}")
        print(f"schedules ({CRON} {TIMEZONE}): {state}")
    if wait <= 0:
        if not quiet:
            print(f"not waiting for a worker (--wait 0); `mlm serve` starts one, or: prefect worker start --pool {pool}")
        return 0
    if not quiet:
        print(f"waiting up to {wait:.0f}s for a worker of pool {pool} to poll every deployment ...", flush=True)
    pending = wait_until_ready(names, wait)
    if pending:
        print(not_ready_message(pending, pool, wait, online_workers(pool)), file=sys.stderr)
        return 1
    if not quiet:
        print(f"ready: a worker polls all {len(names)} deployment(s); runs started now are picked up")
    return 0


def cmd_deploy(args) -> int:
    if args.write_yaml:
        PREFECT_FILE.parent.mkdir(parents=True, exist_ok=True)
        PREFECT_FILE.write_text(render_prefect_yaml(), encoding="utf-8")
        print(f"wrote {PREFECT_FILE}")
        return 0
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    return deploy(api_url=args.api_url, pool=args.pool, schedule=args.schedule, wait=getattr(args, "wait", 60))
