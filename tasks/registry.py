"""Model registry side of the pipeline, and resolving ``models:/name@alias`` URIs.

After pretrain, the trained model is logged to its stage's MLflow run as an MLflow model (``python_function``
flavor, fill-mask; see ``tasks.mlflow_model``: safetensors + json + tokenizer + the code, never a pickle) and
registered as a new version of ``registry.model_name``, tagged with the data, tokenizer and config fingerprints
and ``evaluation=pending``, described by the model card's summary; it gets no alias yet. After evaluate, the
version is tagged ``evaluation=passed`` (alias ``candidate``: the latest version that passed) or
``evaluation=failed`` with the reasons (no alias). After register, the gates decide ``champion``.

Concurrency: every registry write of a run (register, evaluation tags, gate tags and aliases) happens under a
file lock per model name in the workdir (``registry_lock``), and registration is idempotent per pretrain
fingerprint (tag ``pretrain_fingerprint``): two runs on one workdir register one version, the second waits
for the first and reuses it. Without the lock both found no version and registered two (the first left at
``evaluation=pending`` for ever), or one died on SQLite's UNIQUE constraint on ``model_version_tags``.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Iterator

from mlm_core.errors import MlmError
from mlm_core.redact import redact
from mlm_core.artifacts import StageArtifact
from tasks import tracking

log = logging.getLogger(__name__)
_HEX = re.compile(r"[0-9a-f]{1,64}")


class RegistryError(MlmError):
    pass


def model_files(art: StageArtifact) -> tuple[list[Path], str, str]:
    """(paths to log, artifact_dir, artifact path to register) for a pretrain output, as plain files: the
    layout of versions registered before the pyfunc model (``resolve_model`` still reads them)."""
    if (art.path / "hf").is_dir():
        return [art.path / "hf"], "model", "model/hf"
    files = [art.path / n for n in ("model.safetensors", "tokenizer.json", "model_config.json")
             if (art.path / n).exists()]
    return files, "model/weights", "model/weights"


@contextlib.contextmanager
def registry_lock(lc, what: str) -> Iterator[bool]:
    """Hold the workdir's lock on the registry writes for ``registry.model_name`` (yields True when another run
    held it first); any failure inside becomes one RegistryError line naming the model, the step and the store."""
    from mlm_core.locks import file_lock, lock_path
    name = lc.config.registry.model_name
    key = hashlib.sha256(name.encode("utf-8")).hexdigest()[:16]     # a name is free text: never a file name
    with file_lock(lock_path(lc.workdir, f"registry-{key}"), f"registry ({name})",
                   on_wait=lambda h: log.warning("registry: another run is writing model %r (%s); waiting for it before %s, "
                                                 "then reusing what it registered", name, h, what)) as waited:
        try:
            yield waited
        except MlmError:
            raise
        except Exception as exc:
            first = (str(getattr(exc, "message", "") or exc).strip().splitlines() or [type(exc).__name__])[0]
            raise RegistryError(f"registry: {what} for model {name!r} failed: {type(exc).__name__}: "
                                f"{redact(first)[:300]} (store: {redact(str(_store_uri(lc)))}); rerun the same "
                                f"command: finished stages are reused and registration is idempotent") from exc


def _store_uri(lc) -> str | None:
    try:
        return tracking.resolve_tracking_uri(lc.config.tracking, lc.workdir)
    except Exception:  # noqa: BLE001 - only for the error message
        return None


def register_pretrained(art: StageArtifact, tracker: tracking.Tracker, run_id: str | None, lc) -> int | None:
    """Log the model to ``run_id`` as an MLflow model and register it; returns the new version (None if tracking
    is off). Idempotent per pretrain fingerprint, under ``registry_lock``: a model already registered for this
    fingerprint (a cached rerun, or a concurrent run that got there first) is reused, never registered twice.
    No alias: ``candidate`` waits for the evaluate stage (``after_evaluate``)."""
    if not tracker.enabled or run_id is None:
        return None
    with registry_lock(lc, f"registering pretrain output {art.fingerprint}"):
        return _register_pretrained(art, tracker, run_id, lc)


def _register_pretrained(art: StageArtifact, tracker: tracking.Tracker, run_id: str, lc) -> int | None:
    history = art.path / "metrics.jsonl"
    from tasks.metric_names import mlflow_name
    streamed = tracker.client.get_metric_history(run_id, mlflow_name("pretrain", "loss", "train"))
    if history.exists() and not streamed:   # a cached rerun: give its run the training curves too
        import json
        records = [json.loads(line) for line in history.read_text(encoding="utf-8").splitlines() if line.strip()]
        tracker.log_history(run_id, records)
    name = lc.config.registry.model_name
    existing = _version_for(tracker, name, art.fingerprint)
    if existing is not None:
        log.info("%s version %s is already registered for pretrain output %s; reusing it", name, existing,
                 art.fingerprint)
        return existing
    from mlm_core.register.modelcard import summary
    from tasks.mlflow_model import log_and_register
    up = art.upstream or {}
    # a handful of tags, so the version page shows them (and its aliases) at a glance: the fingerprints that
    # identify it (pretrain's is also its config's), then the verdicts; flavor and format are in its MLmodel
    tags = {"pretrain_fingerprint": art.fingerprint, "shards_fingerprint": up.get("shards", ""),
            "tokenizer_fingerprint": up.get("tokenizer", ""), "data_fingerprint": up.get("normalize", ""),
            "evaluation": "pending"}
    version = log_and_register(art.path, run_id, name, tags, summary(art.manifest), tracker.uri)
    log.info("registered %s version %s (no alias until it passes evaluation)", name, version)
    return version


def evaluation_verdict(evaluation: dict) -> list[str]:
    """Why a model fails evaluation ([] = it passes): a language evaluated on held-out data where masked-token
    top-1 is not above the unigram baseline (predicting the most frequent tokens does as well), or no language
    evaluated at all. The contract's critical checks are applied before: an output failing them never exists."""
    intr = {k: v for k, v in (evaluation.get("intrinsic") or {}).items() if isinstance(v, dict) and not v.get("missing")}
    if not intr:
        return ["no language evaluated"]
    return [f"{lang}: top-1 {v.get('top1')} <= unigram baseline {v.get('baseline_top1')}"
            for lang, v in sorted(intr.items())
            if not (isinstance(v.get("top1"), (int, float)) and isinstance(v.get("baseline_top1"), (int, float))
                    and v["top1"] > v["baseline_top1"])]


def after_evaluate(art: StageArtifact, tracker: tracking.Tracker, run_id: str | None, lc) -> int | None:
    """Tag the evaluated version ``evaluation=passed`` and move ``candidate`` to it (unless a newer version
    holds it), or ``evaluation=failed`` with the reasons and no alias."""
    import json
    pre_fp = (art.upstream or {}).get("pretrain")
    p = art.path / "evaluation.json"
    reasons = evaluation_verdict(json.loads(p.read_text(encoding="utf-8")) if p.exists() else {})
    if not tracker.enabled or tracker.offline or not pre_fp:
        return None
    with registry_lock(lc, "tagging the evaluation result"):
        return _set_evaluation(tracker, lc, pre_fp, reasons)


def evaluation_failed(tracker: tracking.Tracker, lc, pretrain_fingerprint: str, report) -> int | None:
    """The evaluate output failed its contract's critical checks: tag the version failed, no alias."""
    reasons = [f"[{r['table']}] {r['type']} {r['kwargs'].get('column', '')}".strip() for r in report.failed_critical]
    if not tracker.enabled or tracker.offline or not pretrain_fingerprint:
        return None
    with registry_lock(lc, "tagging the evaluation result"):
        return _set_evaluation(tracker, lc, pretrain_fingerprint, reasons or ["evaluate contract failed"])


def _set_evaluation(tracker: tracking.Tracker, lc, pretrain_fingerprint: str | None, reasons: list[str]) -> int | None:
    if not tracker.enabled or tracker.offline or not pretrain_fingerprint:
        return None
    from tasks import aliases
    name = lc.config.registry.model_name
    version = _version_for(tracker, name, pretrain_fingerprint)
    if version is None:
        log.info("evaluate: no version of %s is registered for pretrain output %s (pretrained without tracking); "
                 "nothing to tag", name, pretrain_fingerprint)
        return None
    client = tracker.client
    passed = not reasons
    tracking.tag_version(tracker, name, version, {"evaluation": "passed" if passed else "failed"})
    _set_or_drop(tracker, name, version, "evaluation_failed", "; ".join(reasons)[:4000])
    current = aliases.holder(client, name, "candidate")
    if passed and (current is None or current <= version):
        aliases.move(client, name, "candidate", version, "pipeline", "passed evaluation")
    elif not passed and current == version:     # re-evaluated under stricter thresholds: it no longer qualifies
        aliases.remove(client, name, "candidate", "failed evaluation")
    log.info("%s version %s: evaluation %s%s", name, version, "passed" if passed else "failed: ", "; ".join(reasons))
    return version


def _version_for(tracker: tracking.Tracker, name: str, fingerprint: str) -> int | None:
    """The newest version of ``name`` registered for pretrain output ``fingerprint`` (None if none).

    The registry filter holds only the fingerprint, checked to be lowercase hex first; the model name is
    compared in Python. A name is free text (MLflow accepts ``it's`` or ``say "hi"``), and no quoting in
    MLflow's filter grammar can hold both quote characters, so it never goes into a filter string."""
    from mlflow.exceptions import MlflowException
    if not _HEX.fullmatch(fingerprint or ""):
        raise RegistryError(f"pretrain fingerprint {fingerprint!r} is not a hex digest; the stage store is damaged")
    hits, token = [], None
    try:
        while True:
            page = tracker.client.search_model_versions(f"tags.pretrain_fingerprint = '{fingerprint}'",
                                                        page_token=token)
            hits += [int(v.version) for v in page
                     if v.name == name and (v.tags or {}).get("pretrain_fingerprint") == fingerprint]
            token = page.token
            if not token:
                break
    except MlflowException as exc:
        log.warning("registry: searching the versions of %r failed (%s); treating it as not registered",
                    name, redact(exc.message.splitlines()[0] if exc.message else exc))
        return None
    return max(hits) if hits else None


def parse_ref(ref: str) -> tuple[str, str | None, str | None]:
    body = ref[len("models:/"):]
    if "@" in body:
        name, alias = body.split("@", 1)
        return name, alias, None
    if "/" in body:
        name, version = body.rsplit("/", 1)
        return name, None, version
    raise RegistryError(f"{ref}: expected models:/NAME@ALIAS or models:/NAME/VERSION")


@contextlib.contextmanager
def resolve_model(ref: str, tracking_uri: str | None) -> Iterator[Path]:
    """A local folder for ``ref``, as a context manager: an existing folder as is, or ``models:/name@alias`` /
    ``models:/name/3`` downloaded from the registry into a temporary folder that is removed on exit (it
    used to be left behind on every call). Unknown models fail listing the registered ones.

    ``tracking_uri`` None (no config and no $MLM_TRACKING_URI) fails clearly for a registry address, and a
    SQLite registry that does not exist is not created: resolving an address must leave no file behind
    (MLflow would otherwise create an empty database, e.g. ./.mlm/mlflow.db in the current directory)."""
    p = Path(ref)
    if not ref.startswith("models:/"):
        if not p.is_dir():
            raise RegistryError(f"{ref}: not a folder and not a models:/name@alias URI")
        yield p
        return
    if not tracking_uri:
        raise RegistryError(f"{ref}: no model registry to look it up in: pass --config CONFIG (its tracking "
                            f"settings locate the registry) or set $MLM_TRACKING_URI")
    db = tracking.sqlite_path(tracking_uri)
    if db is not None and not db.is_file():
        raise RegistryError(f"{ref}: no model registry at {redact(tracking_uri)} (the database {db} does not exist; "
                            f"run the pipeline with tracking first, or point --config / $MLM_TRACKING_URI at it)")
    import mlflow
    from mlflow.exceptions import MlflowException
    name, alias, version = parse_ref(ref)
    client = tracking.mlflow_client(tracking_uri)
    try:
        mv = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, version)
    except MlflowException as exc:
        known = tracking.list_registered_models(tracking_uri)
        raise RegistryError(f"{ref}: not found in the registry at {redact(tracking_uri)} "
                            f"({redact(exc.message.splitlines()[0])}); "
                            f"registered models: {', '.join(known) or 'none'}") from None
    from tasks.mlflow_model import model_dir_in
    with tempfile.TemporaryDirectory(prefix="mlm-model-") as dest:
        # tracking_uri/registry_uri passed explicitly: no process-wide mlflow.set_tracking_uri side effect. Not
        # mv.source (models:/m-<id>): MLflow resolves that through the process-wide tracking URI (./mlflow.db)
        where = client.get_model_version_download_uri(name, mv.version)
        got = mlflow.artifacts.download_artifacts(artifact_uri=where, dst_path=dest,
                                                  tracking_uri=tracking_uri, registry_uri=tracking_uri)
        yield model_dir_in(Path(got))     # an MLflow model: its hf/ (or weights/) artifact; old versions: as is


def promote(art: StageArtifact, tracker: tracking.Tracker, run_id: str | None, lc) -> int | None:
    """After the register stage: tag the model version with its gate results, move alias ``champion`` to it
    only when every declared gate passed, log its model card (on the register run and the version's run) and
    make the card's summary the version's description."""
    if not tracker.enabled or run_id is None:
        return None
    with registry_lock(lc, "tagging the gate results"):
        return _promote(art, tracker, run_id, lc)


def _promote(art: StageArtifact, tracker: tracking.Tracker, run_id: str, lc) -> int | None:
    from mlm_core.register.gates import GateResult
    from mlm_core.register.stage import card
    from mlm_core.store import StageStore
    name = lc.config.registry.model_name
    reg = art                               # mlm_core.artifacts.Registration
    version = _version_for(tracker, name, reg.pretrain_fingerprint)
    if version is None:
        raise RegistryError(f"no version of {name!r} is registered for pretrain output "
                            f"{reg.pretrain_fingerprint}: rerun `mlm run CONFIG --only pretrain` with "
                            f"tracking enabled")
    passed, failed = reg.passed, reg.failed_gates
    tracking.tag_version(tracker, name, version, {"gates": "passed" if passed else "failed"})
    _set_or_drop(tracker, name, version, "failed_gates", ",".join(failed))
    source_run = tracker.client.get_model_version(name, str(version)).run_id
    table = gate_table(tracker, art, version, [source_run, run_id])
    if passed:
        from tasks import aliases
        aliases.move(tracker.client, name, "champion", version, "pipeline", "passed every promotion gate")
    store = StageStore(lc.workdir)
    upstream = {s: store.load(s, fp) for s, fp in reg.upstream.items()}
    # the data-stage outputs behind the model, for the card (a missing one leaves its section empty)
    upstream |= {s: store.load_optional(s, fp) for s, fp in sorted((upstream["pretrain"].upstream or {}).items())}
    gates = [GateResult(**g) for g in reg.gates]
    text = card(lc, upstream, gates, version, passed)
    tracker.log_text(run_id, text, "model_card.md")
    tracker.log_text(source_run, text, f"model_card/v{version}.md")
    # the version's description: the card's first paragraph (after the title), now with evaluation and gates,
    # then where the per-gate table is (value, threshold, pass of every declared gate)
    para = next((b.strip() for b in text.split("\n\n")[1:] if b.strip() and not b.startswith("#")), "")
    where = _gate_table_link(tracker, source_run, table)
    tracker.client.update_model_version(name, str(version), description="\n\n".join(p for p in (para, where) if p))
    log.info("%s version %s: gates %s%s", name, version, "passed -> champion" if passed else "failed: ",
             "" if passed else ", ".join(failed))
    return version


GATE_TABLE = "gates/v{version}.json"


def gate_table(tracker: tracking.Tracker, art: StageArtifact, version: int, run_ids: list[str | None]) -> str:
    """Log the register output's gates (gate, threshold, value, pass, detail: one row per declared gate) as
    one MLflow table, ``gates/v<version>.json``, on each of ``run_ids`` (the version's own run, which its page
    links to, and the register run); returns the artifact file name. The version keeps only ``gates`` and
    ``failed_gates`` as tags (a tag per gate put ~40 truncated tags above its aliases)."""
    import pandas as pd

    from tasks.publish import table_rows
    df = pd.DataFrame(table_rows("register", art), columns=["gate", "threshold", "value", "pass", "detail"])
    path = GATE_TABLE.format(version=version)
    for rid in dict.fromkeys(r for r in run_ids if r):
        tracker.client.log_table(rid, df, path)
    return path


def _gate_table_link(tracker: tracking.Tracker, source_run: str | None, table: str) -> str:
    url = tracker.run_url(source_run)
    return (f"Per-gate values, thresholds and results: the table `{table}` of its source run"
            + (f" ({url.split('?')[0]}/artifacts/{table})" if url else f" (run {source_run})" if source_run else ""))


def _set_or_drop(tracker: tracking.Tracker, name: str, version: int, key: str, value: str) -> None:
    """Tag ``key=value`` on the version, or remove the tag when ``value`` is empty (a passing re-run leaves no
    stale reasons behind)."""
    from mlflow.exceptions import MlflowException
    if value:
        tracking.tag_version(tracker, name, version, {key: value})
        return
    try:
        tracker.client.delete_model_version_tag(name, str(version), key)
    except MlflowException:     # not there: nothing to remove
        pass


def registry_status(lc, pretrain_fingerprint: str) -> dict | None:
    """What ``mlm status`` shows of the registry for the planned pretrain output: {model, version (None: not
    registered), aliases (of that version), evaluation, gates, failed_gates, champion (the version holding it)}.
    None when tracking is off or the registry does not exist yet (a SQLite file is never created here);
    {model, error} when it cannot be read. An HTTP server that is down answers at once (no retries)."""
    if not lc.config.tracking.enabled or not _HEX.fullmatch(pretrain_fingerprint or ""):
        return None
    uri = tracking.resolve_tracking_uri(lc.config.tracking, lc.workdir)
    db = tracking.sqlite_path(uri)
    if db is not None and not db.is_file():
        return None
    if uri.startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    name = lc.config.registry.model_name
    try:
        client = tracking.mlflow_client(uri)
        hits = [v for v in client.search_model_versions(f"tags.pretrain_fingerprint = '{pretrain_fingerprint}'")
                if v.name == name]
        if not hits:
            return {"model": name, "version": None}
        mv = max(hits, key=lambda v: int(v.version))
        held = dict(getattr(client.get_registered_model(name), "aliases", None) or {})
    except Exception as exc:  # noqa: BLE001 - status reports, it never fails on the registry
        first = (str(getattr(exc, "message", "") or exc).strip().splitlines() or [type(exc).__name__])[0]
        return {"model": name, "error": f"registry at {redact(uri)} unreadable: {redact(first)[:200]}"}
    tags = dict(mv.tags or {})
    return {"model": name, "version": int(mv.version),
            "aliases": sorted(a for a, v in held.items() if str(v) == str(mv.version)),
            "evaluation": tags.get("evaluation"), "gates": tags.get("gates"),
            "failed_gates": [g for g in (tags.get("failed_gates") or "").split(",") if g and g != "none"],
            "champion": int(held["champion"]) if str(held.get("champion", "")).isdigit() else None}


def registry_status_line(info: dict) -> str:
    """``registry: NAME version N (aliases: candidate, champion); evaluation passed; gates FAILED: a, b``."""
    if "error" in info:
        return f"registry: {info['model']}: {info['error']}"
    if info.get("version") is None:
        return f"registry: {info['model']}: no version registered for this pretrain output yet"
    parts = [f"registry: {info['model']} version {info['version']} "
             f"(aliases: {', '.join(info['aliases']) or 'none'})"]
    if info.get("evaluation"):
        parts.append(f"evaluation {info['evaluation']}")
    if info.get("gates"):
        parts.append("gates passed" if info["gates"] == "passed" else
                     f"gates FAILED: {', '.join(info['failed_gates']) or '?'}")
    if info.get("champion") is not None and info["champion"] != info["version"]:
        parts.append(f"champion is version {info['champion']}")
    return "; ".join(parts)
