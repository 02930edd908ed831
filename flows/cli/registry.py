"""``mlm promote`` and ``mlm rollback``: move a registry alias by hand, the reason recorded on the version.

Stdlib only at import (``mlm --help`` stays instant); MLflow is imported inside the commands. The registry is
located like ``mlm fill-mask``'s: ``--config`` (its tracking settings), else $MLM_TRACKING_URI, else an existing
./.mlm/mlflow.db (the demo's workdir); a SQLite registry that does not exist is never created.
"""
from __future__ import annotations

import os
from pathlib import Path


def _uri(args) -> str:
    from mlm_core.errors import MlmError
    from tasks.tracking import resolve_tracking_uri, sqlite_path
    uri = os.environ.get("MLM_TRACKING_URI")
    if args.config:
        from mlm_core.config.io import load_config
        lc = load_config(args.config, args.set or [])
        uri = resolve_tracking_uri(lc.config.tracking, lc.workdir)
    if uri is None and Path(".mlm", "mlflow.db").is_file():
        uri = f"sqlite:///{Path('.mlm').resolve()}/mlflow.db"
    if not uri:
        raise MlmError(f"mlm {args.command}: no model registry: pass --config CONFIG or set $MLM_TRACKING_URI")
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        raise MlmError(f"mlm {args.command}: no model registry at {db} (the database does not exist)")
    return uri


def _client(args):
    from flows.cli.util import prepare_env
    prepare_env()
    from tasks.tracking import mlflow_client
    return mlflow_client(_uri(args))


def _version_tags(client, name: str, version: int) -> dict:
    from mlflow.exceptions import MlflowException

    from tasks.aliases import AliasError
    try:
        return dict(client.get_model_version(name, str(version)).tags or {})
    except MlflowException:
        raise AliasError(f"{name} has no version {version}") from None


def cmd_promote(args) -> int:
    from tasks import aliases
    client = _client(args)
    name, alias = args.model, args.alias
    aliases.require_model(client, name)     # not "no-such@candidate does not exist" for a model that is not there
    version = args.version
    if version is None:
        version = aliases.holder(client, name, "candidate")
        if version is None:
            raise aliases.AliasError(f"{name}@candidate does not exist: pass --version N")
    tags = _version_tags(client, name, version)
    key, want = aliases.QUALIFIES.get(alias, ("gates", "passed"))
    refused = [f"{k}={tags[k]}" for k in ("evaluation", key) if tags.get(k) == "failed"]
    if refused and not args.force:
        raise aliases.AliasError(f"{name} version {version} has {', '.join(sorted(set(refused)))}; "
                                 f"pass --force to promote it to @{alias} anyway")
    before = aliases.move(client, name, alias, version, "promote", args.reason)
    print(f"{name}@{alias}: version {before if before is not None else '-'} -> {version} ({args.reason})")
    return 0


def cmd_rollback(args) -> int:
    from tasks import aliases
    client = _client(args)
    aliases.require_model(client, args.model)
    cur, target = aliases.rollback(client, args.model, args.alias, args.reason)
    print(f"{args.model}@{args.alias}: version {cur} -> {target} ({args.reason})")
    return 0


def add_parsers(sub) -> None:
    def common(sp):
        sp.add_argument("model", help="registered model name, e.g. mlm-demo")
        sp.add_argument("--alias", default="champion", help="the alias to move (default: champion)")
        sp.add_argument("--reason", required=True, help="why (recorded as a version tag)")
        sp.add_argument("--config", help="pipeline YAML whose tracking settings locate the registry (default: "
                        "$MLM_TRACKING_URI, else an existing ./.mlm/mlflow.db)")
        sp.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="config override")
        return sp

    p = common(sub.add_parser("promote", help="point a registry alias at a version by hand (reason recorded)"))
    p.add_argument("--version", type=int, help="the version (default: the one holding @candidate)")
    p.add_argument("--force", action="store_true", help="also a version whose evaluation or gates failed")
    p.set_defaults(func=cmd_promote)
    r = common(sub.add_parser("rollback", help="move a registry alias back to the version that held it before"))
    r.set_defaults(func=cmd_rollback)
