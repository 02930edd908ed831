"""The text ``mlm serve`` prints once everything answers: where the servers, the workers and the stores are,
and what to run next. Stdlib only."""
from __future__ import annotations

from flows.procs import LOOPBACK, client_host
from flows.serve.state import STATE_FILE


def banner(plan, seconds: float) -> str:
    lines = [
        f"mlm serve: up in {seconds:.0f}s (workdir {plan.workdir}, logs in {plan.workdir / 'logs'})",
        f"  Prefect UI   {plan.prefect_url}",
        f"  Prefect API  {plan.api_url}   (worker{'s' if plan.workers > 1 else ''} "
        f"{', '.join(repr(n) for n in plan.worker_names)} on pool {plan.pool})",
        f"  MLflow UI    {plan.mlflow_url}/#/?workflowType=machine_learning   (the model-training view)",
        "  Stores       " + (f"PostgreSQL {plan.db.shown}: databases {plan.db.name}_prefect, {plan.db.name}_mlflow"
                              if plan.db else f"SQLite ({plan.prefect_home}, {plan.workdir / 'mlflow.db'})"),
        "",
        "In another shell:",
        f"  export PREFECT_API_URL={plan.api_url}",
    ]
    if plan.auth:
        user = plan.auth.partition(":")[0]
        lines += [f"  export PREFECT_API_AUTH_STRING='{user}:<password>'",
                  f"  export MLFLOW_TRACKING_USERNAME={user} MLFLOW_TRACKING_PASSWORD='<password>'"]
    lines += [
        f"  mlm deploy                      # deployments on pool {plan.pool}",
        "  mlm run configs/demo.yaml",
        f"`mlm run` with workdir {plan.workdir} logs to these servers while they run ({STATE_FILE} there says",
        f"where); flow runs started from the Prefect UI log to {plan.mlflow_url} (the worker sets MLM_TRACKING_URI).",
        "A config's tracking.uri, $MLM_TRACKING_URI or $PREFECT_API_URL, when set, take precedence.",
    ]
    if (plan.workdir / "mlflow-server.db").exists():   # what `mlm serve` served before it used the CLI's store
        lines.append(f"Runs logged to an earlier `mlm serve` stay in {plan.workdir / 'mlflow-server.db'} (not served): "
                     f"`mlflow ui --backend-store-uri sqlite:///{plan.workdir / 'mlflow-server.db'}` shows them.")
    if plan.host not in LOOPBACK:
        lines.append(f"Bound to {plan.host}: other machines use this host's address instead of "
                     f"{client_host(plan.host)} (MLflow may need --allowed-hosts, Prefect PREFECT_UI_API_URL).")
    lines.append("Ctrl-C stops everything.")
    return "\n".join(lines)
