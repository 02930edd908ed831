"""Registry aliases that mean something, and their history.

``candidate``: the latest version that passed evaluation (version tag ``evaluation=passed``); ``champion``: a
version that passed every promotion gate (``gates=passed``), or one promoted by hand with a reason. Every move
is recorded on the version that receives the alias, in one version tag per alias (MLflow keeps no alias
history itself; one tag, so a version's page stays short): ``alias.<a>`` = JSON ``{"previous": the version that
held it before, or "none" (after a rollback, the version it was rolled back from), "by": pipeline / promote /
rollback, "reason", "at" (UTC)}``. ``rollback`` walks that chain back: the alias goes to the version that held
it before (else to the newest older version that qualifies) and the version it leaves gets
``alias.<a>.rolled_back`` = the reason. A rollback keeps the chain: the receiving version's earlier ``previous``
moves to ``"previous_before"`` (the next rollback follows it, never back to a rolled-back version).
Versions recorded before the single tag (``alias.<a>.previous``, ``.by``, ``.reason``, ``.at``) are read too.
"""
from __future__ import annotations

import datetime as dt
import json

from mlm_core.errors import MlmError

# the version tag (and value) that makes a version eligible for an alias when no history says otherwise
QUALIFIES = {"candidate": ("evaluation", "passed"), "champion": ("gates", "passed")}


class AliasError(MlmError):
    pass


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def require_model(client, name: str) -> None:
    """AliasError unless ``name`` is a registered model (listing the names there are)."""
    from mlflow.exceptions import MlflowException
    try:
        client.get_registered_model(name)
        return
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND", "INVALID_PARAMETER_VALUE"):
            raise
    names = sorted(m.name for m in client.search_registered_models(max_results=100))
    raise AliasError(f"model {name!r} does not exist in the registry (registered models: "
                     f"{', '.join(names) if names else 'none'})")


def holder(client, name: str, alias: str) -> int | None:
    """The version ``name@alias`` points at (None: no such alias)."""
    from mlflow.exceptions import MlflowException
    try:
        return int(client.get_model_version_by_alias(name, alias).version)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


def versions(client, name: str) -> dict[int, dict]:
    """{version: tags} of every version of ``name`` (the name compared in Python, never put into a filter)."""
    out, token = {}, None
    while True:
        page = client.search_model_versions(max_results=1000, page_token=token) if token else \
            client.search_model_versions(max_results=1000)
        out.update({int(v.version): dict(v.tags or {}) for v in page if v.name == name})
        token = page.token
        if not token:
            return out


FIELDS = ("previous", "by", "reason", "at", "previous_before")


def history(tags: dict, alias: str) -> dict:
    """The version's record of its last ``alias`` move: ``{previous, by, reason, at[, previous_before]}``
    ({} when it never held the alias); the older one-tag-per-field form is read too."""
    raw = tags.get(f"alias.{alias}")
    if raw:
        try:
            got = json.loads(raw)
            if isinstance(got, dict):
                return got
        except ValueError:
            pass
    return {f: tags[f"alias.{alias}.{f}"] for f in FIELDS if f"alias.{alias}.{f}" in tags}


def move(client, name: str, alias: str, version: int, by: str, reason: str, keep_previous: bool = False) -> int | None:
    """Point ``name@alias`` at ``version``, recording the move on that version; returns the previous holder.
    A no-op (nothing recorded) when the alias already points there."""
    before = holder(client, name, alias)
    if before == int(version):
        return before
    client.set_registered_model_alias(name, alias, str(version))
    current = client.get_model_version(name, str(version)).tags or {}
    record = {"previous": str(before) if before is not None else "none", "by": by, "reason": reason or "-",
              "at": _now()}
    if keep_previous:    # a rollback: where the chain went on from this version (the next rollback follows it)
        record["previous_before"] = _chain(current, alias)
    client.set_model_version_tag(name, str(version), f"alias.{alias}", json.dumps(record))
    for f in FIELDS:     # an older record's per-field tags: superseded by the one tag
        if f"alias.{alias}.{f}" in current:
            client.delete_model_version_tag(name, str(version), f"alias.{alias}.{f}")
    if by != "rollback" and f"alias.{alias}.rolled_back" in current:   # given the alias again: in the chain again
        client.delete_model_version_tag(name, str(version), f"alias.{alias}.rolled_back")
    return before


def _chain(tags: dict, alias: str) -> str:
    """The version that held ``alias`` before this one in the history: ``previous``, except after a rollback
    (then ``previous`` is the version rolled back from, and the history goes on at ``previous_before``)."""
    h = history(tags, alias)
    if h.get("by") == "rollback":
        return h.get("previous_before", "none")
    return h.get("previous", "none")


def remove(client, name: str, alias: str, reason: str) -> None:
    """Delete ``name@alias``, noting why on the version it leaves."""
    v = holder(client, name, alias)
    if v is None:
        return
    client.delete_registered_model_alias(name, alias)
    client.set_model_version_tag(name, str(v), f"alias.{alias}.removed", reason)


def rollback_target(client, name: str, alias: str) -> tuple[int, int]:
    """(current holder, version to move ``alias`` back to); AliasError when there is none."""
    cur = holder(client, name, alias)
    if cur is None:
        raise AliasError(f"{name}@{alias} does not exist: nothing to roll back")
    vs = versions(client, name)
    prev = _chain(vs.get(cur, {}), alias)
    if prev.isdigit() and int(prev) in vs and int(prev) != cur and \
            f"alias.{alias}.rolled_back" not in vs[int(prev)]:
        return cur, int(prev)
    key, value = QUALIFIES.get(alias, ("gates", "passed"))
    older = [v for v, tags in vs.items() if v < cur and tags.get(key) == value
             and f"alias.{alias}.rolled_back" not in tags]
    if not older:
        raise AliasError(f"{name}@{alias} is version {cur}: no version held it before it and no older version has "
                         f"{key}={value}; move it by hand with `mlm promote {name} --alias {alias} --version N`")
    return cur, max(older)


def rollback(client, name: str, alias: str, reason: str) -> tuple[int, int]:
    cur, target = rollback_target(client, name, alias)
    move(client, name, alias, target, "rollback", reason, keep_previous=True)
    client.set_model_version_tag(name, str(cur), f"alias.{alias}.rolled_back", reason)
    return cur, target
