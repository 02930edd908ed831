"""``mlm compare`` and the ``mlm-compare`` flow: two models on the same held-out data, logged as one MLflow run.

In: a config path + overrides (its normalize/shards outputs are the held-out data, its tracking settings the
registry and experiment), two model references (a local folder, ``models:/NAME@ALIAS``, ``models:/NAME/VERSION``
or ``models:/NAME/latest``) and an output folder. Out: compare.json / compare.md / compare.png there
(``mlm_core.compare``), one MLflow run in the config's experiment whose tags name both references, the
registry versions they resolved to (and the runs that produced them), with the table as metrics
(``a.<lang>.<metric>``, ``b.<lang>.<metric>``, ``delta.<lang>.<metric>``) and the three files as artifacts;
inside a Prefect flow run also a markdown artifact ``model-compare`` with the table. Tracking disabled: the
files only.

The CLI calls ``run_compare`` directly and the flow calls the same function: one code path.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from pathlib import Path

from mlm_core.errors import MlmError
from mlm_core.redact import redact

log = logging.getLogger(__name__)
ARTIFACT_KEY = "model-compare"


class CompareRefError(MlmError, ValueError):
    pass


def _registry_info(ref: str, uri: str) -> dict:
    """name, version (the number an alias or ``latest`` resolves to now), alias, the producing run and its
    training languages (its ``val/<lang>/acc`` metrics), and the version's UI link on an http server."""
    from mlflow.exceptions import MlflowException

    from tasks import tracking
    from tasks.metric_names import val_acc_languages
    from tasks.registry import parse_ref
    from tasks.tracking import is_http
    name, alias, version = parse_ref(ref)
    client = tracking.mlflow_client(uri)
    try:
        if alias:
            mv = client.get_model_version_by_alias(name, alias)
        elif version == "latest":
            found = [int(v.version) for v in client.search_model_versions() if v.name == name]
            if not found:
                raise MlflowException(f"no version of {name!r}")
            mv = client.get_model_version(name, str(max(found)))
        else:
            mv = client.get_model_version(name, version)
    except MlflowException as exc:
        known = tracking.list_registered_models(uri)
        raise CompareRefError(f"{ref}: not found in the registry at {redact(uri)} "
                              f"({redact(str(exc.message if hasattr(exc, 'message') else exc).splitlines()[0])}); "
                              f"registered models: {', '.join(known) or 'none'}") from None
    info = {"ref": ref, "name": name, "alias": alias, "version": int(mv.version), "run_id": mv.run_id,
            "model_id": _model_id(mv), "pinned": f"models:/{name}/{mv.version}", "url": None,
            "training_languages": None}
    if is_http(uri):
        info["url"] = f"{redact(uri).rstrip('/')}/#/models/{name}/versions/{mv.version}"
    if mv.run_id:
        try:
            metrics = client.get_run(mv.run_id).data.metrics
            info["training_languages"] = val_acc_languages(metrics) or None
        except MlflowException:     # the producing run was deleted: the version still resolves
            pass
    return info


def _model_id(mv) -> str | None:
    """The version's MLflow model id: ``mv.model_id``, which a SQLite registry returns empty, else its
    ``models:/m-<id>`` source (versions registered from plain files have none)."""
    if getattr(mv, "model_id", None):
        return mv.model_id
    src = mv.source or ""
    return src[len("models:/"):] if src.startswith("models:/m-") else None


@contextlib.contextmanager
def resolved(ref: str, uri: str | None, lc):
    """(local folder, info) for a model reference, like ``mlm evaluate``: a folder (relative to the current
    directory) or a registry address looked up with the config's tracking settings."""
    from mlm_core.compare import training_languages
    from tasks.registry import resolve_model
    if not ref.startswith("models:/"):
        p = Path(ref)
        if not p.is_dir():
            raise CompareRefError(f"{ref}: no such model folder (give a model folder, models:/NAME@ALIAS or "
                                  f"models:/NAME/VERSION)")
        yield p, {"ref": ref, "folder": str(p.resolve()), "training_languages": training_languages(p)}
        return
    from tasks import tracking
    db = tracking.sqlite_path(uri) if uri else None
    if not uri or (db is not None and not db.is_file()):
        with resolve_model(ref, uri):      # raises its clear "no registry here" error, creating nothing
            pass
    info = _registry_info(ref, uri)
    with resolve_model(info["pinned"], uri) as folder:    # the version the alias pointed at just now
        yield folder, info


def fingerprint(hashes: list[str]) -> str:
    return hashlib.sha256("\n".join(hashes).encode()).hexdigest()[:16]


def flat_metrics(result: dict) -> dict[str, float]:
    out = {}
    for r in result["rows"]:
        for side in ("a", "b", "delta"):
            if isinstance(r[side], float):
                out[f"{side}.{r['lang']}.{r['metric']}"] = r[side]
    return out


def ref_tags(side: str, info: dict) -> dict[str, str]:
    tags = {f"model_{side}": info["ref"]}
    for k in ("name", "alias", "version", "pinned", "run_id", "model_id", "url", "folder", "content_hash"):
        if info.get(k) not in (None, ""):
            tags[f"model_{side}.{k}"] = str(info[k])
    if info.get("training_languages"):
        tags[f"model_{side}.training_languages"] = ",".join(info["training_languages"])
    return tags


def run_compare(config_path: str, model_a: str, model_b: str, overrides: list[str] | None = None,
                out_dir: str | None = None) -> dict:
    """Compare ``model_a`` (before) with ``model_b`` (after) on the config's held-out data; write the files,
    log the MLflow run, publish the Prefect artifact. Returns {"result", "paths", "run_id", "markdown", ...}."""
    from mlm_core.compare import compare_models, markdown, write_outputs
    from mlm_core.config.io import load_config
    from mlm_core.external import content_hash
    from tasks.tracking import Tracker, resolve_tracking_uri
    from tasks import external
    external.install()     # planning the held-out data may hash a models:/ tokenizer.from / init_from
    lc = load_config(config_path, list(overrides or []))
    uri = resolve_tracking_uri(lc.config.tracking, lc.workdir)
    t0 = time.time()
    with resolved(model_a, uri, lc) as (fa, ia), resolved(model_b, uri, lc) as (fb, ib):
        ia["content_hash"], ib["content_hash"] = content_hash(fa), content_hash(fb)
        result = compare_models(fa, fb, lc, labels=(model_a, model_b),
                                train_langs=(ia.get("training_languages"), ib.get("training_languages")))
    # the pair of models on this held-out data: comparing the same pair on another config writes elsewhere
    fp = fingerprint([ia["content_hash"], ib["content_hash"], result["heldout"]["shards"],
                      result["heldout"]["normalize"]])
    out = Path(out_dir) if out_dir else Path(lc.workdir) / "compare" / fp
    result["models"] = {"a": ia, "b": ib}
    extra = [f"- {side.upper()} resolved: {info['pinned']} (registry version {info['version']})"
             for side, info in (("a", ia), ("b", ib)) if info.get("pinned")]
    extra.append(f"- held-out data: `{lc.path}` (config {lc.config.name}: shards `{result['heldout']['shards']}`); "
                 f"fingerprint of the comparison `{fp}`")
    tracker = Tracker(lc.config.tracking, lc.workdir)
    run_id = None
    if tracker.enabled:
        extra.append(f"- MLflow experiment: {lc.config.tracking.experiment}")
    paths = write_outputs(result, out, extra)
    if tracker.enabled:
        run_id = tracker.log_stage(
            "compare", fingerprint=fp, cache_hit=False,
            params={"config_path": str(config_path), "overrides": list(overrides or []), "model_a": model_a,
                    "model_b": model_b, "heldout_config": lc.config.name},
            metrics=flat_metrics(result), artifacts=[paths["md"], paths["png"], paths["json"]],
            tags={**ref_tags("a", ia), **ref_tags("b", ib), "kind": "compare"}, started=t0, ended=time.time())
        if run_id is not None:
            link_models(tracker, run_id, [ia, ib])
            with contextlib.suppress(Exception):    # only the display name; the run is complete without it
                tracker.client.update_run(run_id, name=f"compare · {_short(model_a)} vs {_short(model_b)}")
    md = markdown(result, extra + ([f"- MLflow run: `{run_id}`" + (f" ({tracker.run_url(run_id)})"
                                                                    if tracker.run_url(run_id) else "")]
                                   if run_id else []))
    paths["md"].write_text(md, encoding="utf-8")
    published = publish_artifact(md)
    return {"result": result, "paths": {k: str(v) for k, v in paths.items()}, "run_id": run_id,
            "experiment": lc.config.tracking.experiment if tracker.enabled else None, "markdown": md,
            "published": published, "fingerprint": fp}


def link_models(tracker, run_id: str, infos: list[dict]) -> None:
    """The registered versions' MLflow models as the run's model inputs: the run page links to both (MLflow 3
    LoggedModelInput); versions registered from plain files have no model id and keep only their tags."""
    ids = list(dict.fromkeys(i["model_id"] for i in infos if i.get("model_id")))
    if not ids:
        return
    from mlflow.entities import LoggedModelInput
    try:
        tracker.client.log_inputs(run_id, models=[LoggedModelInput(model_id=m) for m in ids])
    except Exception as exc:  # noqa: BLE001 - the tags already name both versions; this is the UI link
        log.warning("compare: linking the model versions to run %s failed: %s", run_id, exc)


def _short(ref: str) -> str:
    return ref[len("models:/"):] if ref.startswith("models:/") else Path(ref).name or ref


def publish_artifact(md: str) -> bool:
    """A Prefect markdown artifact with the comparison on the current flow run (no-op outside one)."""
    import sys
    if "prefect" not in sys.modules:    # `mlm compare`: no flow run can be active, and importing Prefect costs ~2 s
        return False
    try:
        from prefect.context import FlowRunContext
        if FlowRunContext.get() is None:
            return False
        from prefect.artifacts import create_markdown_artifact
        create_markdown_artifact(key=ARTIFACT_KEY, markdown=md, description="Model comparison: A vs B")
        return True
    except Exception as exc:  # noqa: BLE001 - the comparison is written and logged; the artifact is a view
        log.warning("compare: Prefect artifact not written: %s", exc)
        return False
