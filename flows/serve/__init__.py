"""``mlm serve`` and ``mlm deploy``: the real servers behind the pipeline, on one machine.

In: a workdir (``.mlm`` by default), ports, a host. Out, until Ctrl-C / SIGTERM:
- a Prefect server (API + UI; SQLite in ``<workdir>/prefect``, ``PREFECT_HOME`` there, analytics off),
- a Prefect worker (``--workers N``: N) for the ``mlm-process`` work pool (created first when missing),
- an MLflow tracking server over the workdir's own store, the one ``mlm run`` writes without a server
  (``sqlite:///<workdir>/mlflow.db``, artifacts in ``<workdir>/mlartifacts``), ``--workers 1`` and
  ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``: 10 s to start instead of ~38 s, and no orphaned huey
  consumers (STACK_NOTES section 2).

``--db postgresql://USER@HOST:PORT/NAME`` puts both stores on PostgreSQL instead (``flows.serve.db``: databases
NAME_prefect and NAME_mlflow, checked and created before anything starts); ``--workers N`` starts N workers,
each running one flow run at a time when N >= 2 (docs/SERVE.md).

While it serves, ``<workdir>/serve.json`` (written atomically, removed on exit) says where the servers are;
``mlm run`` with that workdir logs to them when they answer (``adopt_servers``), else to the local store and
a temporary Prefect server, as without ``mlm serve``. Explicit settings win: a config's ``tracking.uri``,
``$MLM_TRACKING_URI``, ``$PREFECT_API_URL``.

Every child runs in its own session (process group); stopping kills whole groups, SIGTERM then
SIGKILL after a grace period, so nothing a server forked survives it. Ports are checked (bind test)
before anything starts: a busy port is an error naming the port and the server that wanted it (exit 2).

Security: loopback by default. Any other ``--host`` requires credentials (``--auth-file`` or
``MLM_SERVE_AUTH``, ``user:password``): Prefect basic auth (``PREFECT_SERVER_API_AUTH_STRING``; clients
send ``PREFECT_API_AUTH_STRING``) and MLflow's ``basic-auth`` app (admin user bootstrapped from
``MLFLOW_AUTH_ADMIN_USERNAME``/``MLFLOW_AUTH_ADMIN_PASSWORD``, store and config in the workdir;
clients send ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``). ``--require-auth`` turns the same
on for loopback. Nothing heavy is imported at module level (``mlm --help`` stays instant).

The package: this module is the command (plan, start, watch, stop); ``auth`` reads the credentials (and keeps
MLflow's secret key), ``db`` checks and creates the ``--db`` databases, ``banner`` is what it prints once up,
``state`` is ``serve.json`` and ``adopt_servers`` (what ``mlm run`` reads); processes and HTTP in ``flows.procs``.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# the generic process/HTTP plumbing lives in flows.procs; re-exported here for existing importers
from flows.procs import (  # noqa: F401
    GRACE_S, LOOPBACK, REPO_ROOT, Child, ServeError, server_url, wait_until,
    free_port, http_get, http_post_json, port_free, stop_children,
)
from flows.serve.auth import AUTH_ENV, MIN_PASSWORD, read_credentials, secret_key  # noqa: F401
from flows.serve.state import STATE_FILE

POOL = "mlm-process"
WORKER_RESTART_S = 5.0                # a worker that exited is restarted after this delay, doubling each time ..
WORKER_RESTART_MAX_S = 60.0           # .. up to this

QUIET_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_LOGGING_LEVEL": "WARNING", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_OFFLINE": "1", "GX_ANALYTICS_ENABLED": "false",
}


class _Stop(Exception):
    """Raised from the SIGTERM/SIGHUP handler to unwind into the cleanup."""


# ------------------------------------------------------------------------------------- plan
@dataclass
class Plan:
    workdir: Path
    host: str
    prefect_port: int
    mlflow_port: int
    pool: str
    auth: str | None
    db: "PgDatabase | None" = None      # --db: both stores on PostgreSQL (flows.serve.db); None: SQLite
    workers: int = 1                    # --workers N: N Prefect workers (N >= 2: one flow run at a time each)

    @property
    def prefect_url(self) -> str:
        return server_url(self.host, self.prefect_port)

    @property
    def api_url(self) -> str:
        return self.prefect_url + "/api"

    @property
    def mlflow_url(self) -> str:
        return server_url(self.host, self.mlflow_port)

    @property
    def prefect_home(self) -> Path:
        return self.workdir / "prefect"

    def base_env(self) -> dict:
        env = dict(os.environ)
        for k, v in QUIET_ENV.items():
            env.setdefault(k, v)
        env["PREFECT_HOME"] = str(self.prefect_home)
        env["PREFECT_API_URL"] = self.api_url
        env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
        for k in ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_CONNECTION_URL",
                  "PREFECT_SERVER_API_AUTH_STRING", "PREFECT_API_AUTH_STRING", "MLFLOW_TRACKING_USERNAME",
                  "MLFLOW_TRACKING_PASSWORD", "MLFLOW_AUTH_ADMIN_USERNAME", "MLFLOW_AUTH_ADMIN_PASSWORD"):
            env.pop(k, None)   # only this command's credentials, never a stale one from the shell
        if self.auth:
            user, _, password = self.auth.partition(":")
            env["PREFECT_API_AUTH_STRING"] = self.auth
            env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"] = user, password
        return env

    def prefect_server(self) -> Child:
        env = self.base_env()
        if self.auth:
            env["PREFECT_SERVER_API_AUTH_STRING"] = self.auth
        if self.db is not None:     # default: SQLite in PREFECT_HOME
            env["PREFECT_API_DATABASE_CONNECTION_URL"] = self.db.prefect_url()
        cmd = [sys.executable, "-m", "prefect", "server", "start",
               "--host", self.host, "--port", str(self.prefect_port)]
        return Child("prefect server", cmd, env, self.workdir / "logs" / "prefect-server.log")

    def mlflow_server(self) -> Child:
        env = self.base_env()
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        artifacts = str(self.workdir / "mlartifacts")
        cmd = [sys.executable, "-m", "mlflow", "server",
               "--backend-store-uri", self.mlflow_store,
               "--artifacts-destination", artifacts,
               "--host", self.host, "--port", str(self.mlflow_port), "--workers", "1"]
        if not self.auth:
            # loopback: experiments the server creates keep their artifacts as plain paths in the workdir,
            # like the CLI's, so a later `mlm run` without the server can still log to them (an
            # `mlflow-artifacts:/` location needs the server). With auth (remote clients) they are proxied.
            cmd += ["--default-artifact-root", artifacts]
        if self.auth:
            user, _, password = self.auth.partition(":")
            ini = self.workdir / "mlflow-basic-auth.ini"
            ini.write_text("[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
                           f"database_uri = sqlite:///{self.workdir / 'mlflow-auth.db'}\n"
                           f"admin_username = {user}\n"
                           "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n",
                           encoding="utf-8")
            env["MLFLOW_AUTH_CONFIG_PATH"] = str(ini)
            env["MLFLOW_AUTH_ADMIN_USERNAME"], env["MLFLOW_AUTH_ADMIN_PASSWORD"] = user, password
            env.setdefault("MLFLOW_FLASK_SERVER_SECRET_KEY", secret_key(self.workdir / "mlflow-secret-key"))
            cmd += ["--app-name", "basic-auth"]
        return Child("mlflow server", cmd, env, self.workdir / "logs" / "mlflow-server.log")

    @property
    def mlflow_store(self) -> str:
        """The MLflow backend store: the CLI's own SQLite file (what `mlm run` writes without a server), or
        the PostgreSQL database of --db."""
        return self.db.mlflow_url() if self.db is not None else f"sqlite:///{self.workdir / 'mlflow.db'}"

    def worker(self, i: int = 0) -> Child:
        cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", self.pool, "--type", "process",
               "--name", self.worker_names[i]]
        if self.workers > 1:
            # N workers = N flow runs at once, spread over the workers (one unlimited worker would take them all)
            cmd += ["--limit", "1"]
        env = self.base_env()
        # flow runs started from the UI log to this MLflow server unless their config sets tracking.uri
        env["MLM_TRACKING_URI"] = self.mlflow_url
        log = "prefect-worker.log" if self.workers == 1 else f"prefect-worker-{i + 1}.log"
        return Child("prefect worker" if self.workers == 1 else f"prefect worker {i + 1}", cmd, env,
                     self.workdir / "logs" / log)

    @property
    def worker_names(self) -> list[str]:
        base = f"mlm-worker-{self.prefect_port}"
        return [base] if self.workers == 1 else [f"{base}-{i + 1}" for i in range(self.workers)]

    @property
    def worker_name(self) -> str:
        return self.worker_names[0]


# ------------------------------------------------------------------------------------- checks
def prefect_up(plan: Plan) -> bool:
    return http_get(plan.api_url + "/health")[0] == 200


def mlflow_up(plan: Plan) -> bool:
    return http_get(plan.mlflow_url + "/health")[0] == 200


def workers_online(plan: Plan, why: list | None = None) -> list[str]:
    """Names of the ONLINE workers of the pool (empty when none, or when the API refuses: see ``why``)."""
    status, body = http_post_json(f"{plan.api_url}/work_pools/{plan.pool}/workers/filter", {}, auth=plan.auth)
    if status != 200 or not isinstance(body, list):
        if why is not None:
            why.append(f"HTTP {status}" + (": pass --auth-file or $" + AUTH_ENV if status == 401 else ""))
        return []
    return [w.get("name", "?") for w in body if w.get("status") == "ONLINE"]


def _ensure_pool(plan: Plan) -> None:
    """Create the work pool through the API (the worker needs it; ``mlm deploy`` does the same)."""
    env = plan.base_env()
    keep = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_API_AUTH_STRING")}
    os.environ.update({k: env[k] for k in keep if k in env})
    try:
        from flows.deploy import ensure_work_pool
        ensure_work_pool(plan.pool)
    finally:
        for k, v in keep.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ------------------------------------------------------------------------------------- commands
def _plan_from_args(args) -> Plan:
    workdir = Path(args.workdir).resolve()
    auth = read_credentials(args.auth_file)
    loopback = args.host in LOOPBACK
    if not loopback and auth is None:
        raise ServeError(
            f"--host {args.host} exposes the servers beyond this machine; refusing to start without "
            f"credentials. Pass --auth-file FILE (one line 'user:password', password >= {MIN_PASSWORD} chars) "
            f"or export {AUTH_ENV}=user:password; or keep the default --host 127.0.0.1.", 2)
    if args.require_auth and auth is None:
        raise ServeError(f"--require-auth: pass --auth-file FILE or export {AUTH_ENV}=user:password", 2)
    if args.prefect_port == args.mlflow_port:
        raise ServeError(f"--prefect-port and --mlflow-port are both {args.prefect_port}", 2)
    use_auth = auth if (args.require_auth or not loopback) else None
    if use_auth:
        import importlib.util

        if importlib.util.find_spec("flask_wtf") is None:  # MLflow's basic-auth app imports it (CSRF)
            raise ServeError("MLflow's basic-auth app needs Flask-WTF: pip install 'mlflow[auth]'", 2)
    if args.workers < 1:
        raise ServeError(f"--workers {args.workers}: at least 1", 2)
    db = None
    if args.db:
        from flows.serve.db import parse_db
        db = parse_db(args.db)
    return Plan(workdir, args.host, args.prefect_port, args.mlflow_port, args.pool, use_auth, db, args.workers)


def cmd_check(args) -> int:
    plan = Plan(Path(args.workdir).resolve(), args.host, args.prefect_port, args.mlflow_port, args.pool,
                read_credentials(args.auth_file))
    p, m = prefect_up(plan), mlflow_up(plan)
    why: list[str] = []
    w = workers_online(plan, why) if p else []
    print(f"prefect server  {plan.api_url}/health  {'up' if p else 'DOWN'}")
    print(f"prefect worker  pool {plan.pool}  {('up: ' + ', '.join(w)) if w else 'DOWN'}"
          + (f" ({why[0]})" if why and not w else ""))
    print(f"mlflow server   {plan.mlflow_url}/health  {'up' if m else 'DOWN'}")
    return 0 if (p and m and w) else 1


def serve(plan: Plan, timeout: float = 180.0, grace: float = GRACE_S) -> int:
    """Start all three, wait until they answer, print where they are, block until stopped."""
    wanted = [(plan.prefect_port, "the Prefect server (--prefect-port)"),
              (plan.mlflow_port, "the MLflow server (--mlflow-port)")]
    for port, who in wanted:
        if not port_free(plan.host, port):
            raise ServeError(f"port {port} on {plan.host} is already in use; it was wanted by {who}. "
                             "Stop whatever holds it or pick another port. Nothing was started.", 2)
    if plan.db is not None:         # before anything starts: a wrong URL is one clear error, nothing to stop
        from flows.serve.db import ensure_databases
        created = ensure_databases(plan.db)
        if created:
            print(f"mlm serve: created database(s) {', '.join(created)} on {plan.db.host}:{plan.db.port}", flush=True)
    plan.workdir.mkdir(parents=True, exist_ok=True)
    plan.prefect_home.mkdir(parents=True, exist_ok=True)
    state = plan.workdir / STATE_FILE

    children: list[Child] = []

    def on_signal(signum, frame):
        raise _Stop(signal.Signals(signum).name)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    t0 = time.monotonic()
    try:
        servers = [plan.prefect_server(), plan.mlflow_server()]
        for c in servers:
            c.start()
            children.append(c)
        _write_state(state, plan, children)
        print(f"starting the Prefect server ({plan.prefect_url}) and the MLflow server ({plan.mlflow_url}) ...",
              flush=True)
        wait_until("the Prefect server answers", lambda: prefect_up(plan), servers, timeout)
        try:
            _ensure_pool(plan)
        except Exception as exc:  # noqa: BLE001 (any API failure: report it, stop the servers)
            raise ServeError(f"could not create work pool {plan.pool}: {exc}") from exc
        for i in range(plan.workers):
            worker = plan.worker(i)
            worker.start()
            children.append(worker)
        _write_state(state, plan, children)
        left = max(30.0, timeout - (time.monotonic() - t0))
        wait_until("the MLflow server answers", lambda: mlflow_up(plan), children, left)
        wait_until(f"the worker{'s' if plan.workers > 1 else ''} join pool {plan.pool}",
                    lambda: set(plan.worker_names) <= set(workers_online(plan)),
                    children, max(30.0, timeout - (time.monotonic() - t0)))
        from flows.serve.banner import banner
        print(banner(plan, time.monotonic() - t0), flush=True)
        restarts: dict[str, tuple[float, float]] = {}      # worker name -> (restart at, next delay)
        while True:
            for c in children:
                if c.alive():
                    continue
                if c.name.startswith("prefect worker") and all(s.alive() for s in servers):
                    # a worker gives up after repeated API errors (Prefect's "Service exceeded error threshold"),
                    # e.g. while the database of `--db` is down: restart it (backoff 5 s .. 60 s) rather than
                    # stopping the servers that runs in progress still report to (issue 24 item 3)
                    due, delay = restarts.get(c.name, (0.0, WORKER_RESTART_S))
                    now = time.monotonic()
                    if not due:
                        print(f"mlm serve: {c.name} exited (code {c.proc.returncode}; its API calls failing? with "
                              f"--db, is the database up?); restarting it in {delay:.0f} s. Log: {c.log}", flush=True)
                        restarts[c.name] = (now + delay, min(delay * 2, WORKER_RESTART_MAX_S))
                    elif now >= due:
                        c.start()
                        restarts[c.name] = (0.0, delay)
                        _write_state(state, plan, children)
                    continue
                raise ServeError(f"{c.name} exited unexpectedly (code {c.proc.returncode}); stopping the others."
                                 f" Last lines of {c.log}:\n{c.tail()}")
            time.sleep(1.0)
    except (KeyboardInterrupt, _Stop):
        print("\nmlm serve: stopping ...", flush=True)
        return 0
    finally:
        # a second Ctrl-C must not interrupt the cleanup half-way and orphan a server
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            old.setdefault(s, signal.getsignal(s))
            signal.signal(s, signal.SIG_IGN)
        # the worker first (it would only complain about a vanished API), then the servers
        stop_children(list(reversed(children)), grace)
        state.unlink(missing_ok=True)
        for s, h in old.items():
            signal.signal(s, h)
        if children:
            print("mlm serve: stopped", flush=True)


def _write_state(path: Path, plan: Plan, children: list[Child]) -> None:
    """Atomically (a reader never sees half a file): write a temporary file, then rename it over."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({
        "pid": os.getpid(), "workdir": str(plan.workdir), "prefect_url": plan.prefect_url, "api_url": plan.api_url,
        "mlflow_url": plan.mlflow_url,
        "mlflow_store": plan.db.url(plan.db.name + "_mlflow", "psycopg2", hide_password=True) if plan.db else plan.mlflow_store,
        "pool": plan.pool, "auth": bool(plan.auth),
        "children": {c.name: c.proc.pid for c in children if c.proc is not None},
    }, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def cmd_serve(args) -> int:
    try:
        if args.check:
            return cmd_check(args)
        return serve(_plan_from_args(args), timeout=args.timeout)
    except ServeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code


def add_parsers(sub) -> None:
    """Add ``serve`` and ``deploy`` to the ``mlm`` subparsers."""
    s = sub.add_parser("serve", help="start the Prefect server + worker and the MLflow server (Ctrl-C stops)",
                       description="Start a Prefect server, a Prefect worker (pool mlm-process) and an MLflow "
                                   "tracking server; loopback only unless --host and credentials are given.")
    s.add_argument("--workdir", default=".mlm", help="state, databases and logs go here (default .mlm)")
    s.add_argument("--prefect-port", type=int, default=4200, help="Prefect API + UI port (default 4200)")
    s.add_argument("--mlflow-port", type=int, default=5000, help="MLflow tracking server port (default 5000)")
    s.add_argument("--host", default="127.0.0.1",
                   help="bind address (default 127.0.0.1); anything else requires --auth-file or $" + AUTH_ENV)
    s.add_argument("--pool", default=POOL, help=f"Prefect work pool the worker serves (default {POOL})")
    s.add_argument("--auth-file", metavar="FILE",
                   help=f"file with one line 'user:password' (password >= {MIN_PASSWORD} chars): Prefect basic "
                        "auth + MLflow basic-auth app; alternatively export " + AUTH_ENV)
    s.add_argument("--require-auth", action="store_true", help="turn authentication on even on loopback")
    s.add_argument("--db", metavar="URL",
                   help="postgresql://USER[:PASSWORD]@HOST[:PORT]/NAME: the Prefect server and the MLflow backend "
                        "store on PostgreSQL (databases NAME_prefect and NAME_mlflow, created when missing); "
                        "default: SQLite in the workdir")
    s.add_argument("--workers", type=int, default=1, metavar="N",
                   help="Prefect workers to start (default 1); with N >= 2 each runs one flow run at a time, so "
                        "up to N deployments (e.g. the pipeline and a stage) run at once")
    s.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for everything to answer")
    s.add_argument("--check", action="store_true",
                   help="only report whether the servers and the worker answer (exit 0 if all up, 1 otherwise)")
    s.set_defaults(func=cmd_serve)

    d = sub.add_parser("deploy", help="create the work pool and apply deployments/prefect.yaml to a Prefect server")
    d.add_argument("--api-url", help="Prefect API URL (default: $PREFECT_API_URL), e.g. http://127.0.0.1:4200/api")
    d.add_argument("--pool", default=POOL, help=f"work pool for every deployment (default {POOL})")
    d.add_argument("--schedule", action="store_true",
                   help="deploy the nightly schedules ACTIVE (default: present but inactive)")
    d.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                   help="return only once a worker polls every deployment (all READY), waiting at most this "
                        "long (default 60; 0: do not wait); exit 1 naming the ones not ready")
    d.add_argument("--write-yaml", action="store_true",
                   help="regenerate deployments/prefect.yaml from flows/pipeline.py (pipeline + STAGE_FLOWS), "
                        "then exit")
    d.set_defaults(func=_cmd_deploy)


def _cmd_deploy(args) -> int:
    from flows.deploy import cmd_deploy
    return cmd_deploy(args)
