"""The stage graph: which stages exist, what each depends on, and how a run is planned.

A stage is a plain function ``run(loaded_config, upstream_artifacts, out_dir) -> manifest fields``.
Its fingerprint hashes its config section, its upstream fingerprints, its ``code_version`` and (for
stages reading raw files) a cheap description of the inputs; for an existing tokenizer or checkpoint
(``tokenizer.from`` / ``pretrain.init_from``) the content hash of its files, not its path. Which config
fields are in the section is decided by each field's declared effect (``mlm_core.config``): ``output``
and ``report`` fields are; ``threshold`` fields are not (they are re-checked against the stored output on
every run, see ``tasks/stage.py``), nor are ``none`` fields (speed, operations). ``output_key`` hashes the
``output`` fields only, chained through the upstream output keys: pretrain keys its checkpoints by it, so a
report-only change upstream or in pretrain resumes training instead of restarting it.

``plan`` computes every stage's fingerprint and status without running anything; ``execute`` runs one
stage through the store. Both the CLI and the Prefect flows go through these two functions.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from mlm_core.config import (
    FINGERPRINTED, TRAJECTORY, PipelineConfig, effect_view, field_effect, omitted_at_default,
)
from mlm_core.config.io import LoadedConfig
from mlm_core.errors import PlanError
from mlm_core import stage_calls as calls
from mlm_core.artifacts import StageArtifact
from mlm_core.store import StageStore, fingerprint
from mlm_core.train.stage import CODE_VERSION as PRETRAIN_CODE_VERSION
from mlm_core.train.stage import pretrain_inputs

log = logging.getLogger(__name__)
Status = Literal["done", "missing", "stale"]


@dataclass(frozen=True)
class StageSpec:
    name: str
    upstream: tuple[str, ...]
    # Bump code_version when the stage's code changes what it writes for the same config and inputs: the
    # fingerprint changes, so stored outputs of the old code are recomputed instead of silently reused.
    code_version: str
    reads: tuple[str, ...]                            # top-level config keys the stage reads (sections or values)
    run: Callable[..., dict]                          # (lc, upstream: {stage: typed output}, out_dir) -> manifest
    inputs: Callable[[LoadedConfig], Any] | None = None
    # Outputs the stage also reads that lie behind its upstream (their fingerprints are already in an upstream's,
    # so they do not enter this stage's): ``execute`` loads them as typed outputs into ``upstream`` beside the
    # upstream ones, None when not in the store (the stage says what it then cannot do). A stage never opens the
    # store itself.
    context: tuple[str, ...] = ()
    derived: Callable[[LoadedConfig], dict] | None = None   # values computed from output fields (scripts, alpha)
    summary: str = ""
    # What the other layers do with the stage, declared here by name: a reference is "module:attribute", imported
    # where it is used (``resolve``), so this module imports no Prefect, MLflow or Great Expectations.
    # map -> reduce (mlm_core.partitions): its ``PartitionedStage`` object; ``run`` is then unused: execute plans,
    # maps "process one partition" through hooks["mapper"] (default: the stage's local pool) and merges
    partitions: str | None = None
    suite: str | None = None               # its data contract: schemas/<suite>.suite.json (``plan`` checks it exists)
    contract_tables: str | None = None     # fn(out_dir, options) -> {table: DataFrame}: what the suite runs on
    contract_parameters: str | None = None  # fn(manifest) -> {name: value}: the suite's {"$PARAMETER": name} values
    table: str | None = None               # fn(artifact) -> rows: its statistics table (MLflow stats.json, Prefect)
    table_title: str = "Per-language statistics"
    plots: str | None = None               # fn(artifact, dest) -> figure files logged with its MLflow run

    @property
    def partitioned(self) -> bool:
        return self.partitions is not None


SCHEMAS_DIR = Path(__file__).resolve().parents[1] / "schemas"


def resolve(ref: str) -> Any:
    """The object a spec names: "module:attribute" imported now (a missing one: PlanError naming the reference)."""
    import importlib
    mod, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise PlanError(f"stage reference {ref!r} does not resolve: {exc}") from None


def suite_path(name: str) -> Path | None:
    """Where stage ``name``'s declared data contract lives (None: it declares none)."""
    suite = STAGES[name].suite
    return None if suite is None else SCHEMAS_DIR / f"{suite}.suite.json"


def check_declared(spec: StageSpec) -> None:
    """What a stage declares exists: its suite file (else a PlanError naming the file); a suite also needs the
    tables it runs on."""
    if spec.suite is None:
        return
    path = SCHEMAS_DIR / f"{spec.suite}.suite.json"
    if not path.is_file():
        raise PlanError(f"stage {spec.name!r} declares the data contract {spec.suite!r}, but {path} does not exist")
    if spec.contract_tables is None:
        raise PlanError(f"stage {spec.name!r} declares the data contract {path.name} but no contract_tables")


def _view(lc: LoadedConfig, name: str, effects: frozenset[str], sparse: bool = False) -> dict:
    """The stage's config restricted to fields whose declared effect is in ``effects`` (mlm_core.config markers)."""
    cfg, spec = lc.config, STAGES[name]
    out: dict = {}
    for key in spec.reads:
        if omitted_at_default(PipelineConfig, key, getattr(cfg, key)):     # e.g. debias left unset
            continue
        effect = field_effect(PipelineConfig, key)
        if effect == "section":
            sub = effect_view(getattr(cfg, key), effects, sparse)
            if not (sparse and not sub):
                out[key] = sub
        elif effect in effects:
            out[key] = getattr(cfg, key)
    if spec.derived and effects & TRAJECTORY:      # derived values come from output fields
        out |= spec.derived(lc)
    return out


def stage_config(lc: LoadedConfig, name: str) -> dict:
    """What a stage's fingerprint hashes: its fields declared ``output`` or ``report`` (+ derived values)."""
    return _view(lc, name, FINGERPRINTED)


def stage_output_config(lc: LoadedConfig, name: str) -> dict:
    """Its fields declared ``output`` only: what the stage's ``output_key`` (and pretrain's trajectory) hashes."""
    return _view(lc, name, TRAJECTORY)


def stage_thresholds(lc: LoadedConfig, name: str) -> dict:
    """Its data-contract thresholds: in no fingerprint; checked against the stored output on every run."""
    return _view(lc, name, frozenset({"threshold"}), sparse=True)


def with_thresholds(manifest: dict, thresholds: dict) -> dict:
    """``manifest`` with the current thresholds merged into its ``config`` (what the data contracts read)."""
    def merge(a: dict, b: dict) -> dict:
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out
    return {**manifest, "config": merge(manifest.get("config") or {}, thresholds)}


# Config fields naming a folder outside the pipeline (mlm_core.external): their content hash enters the
# fingerprint through the stage's ``inputs``; the path or registry address itself does not (the same files
# under another path give the same fingerprint). The manifest's config still records the reference as written.
EXTERNAL_REFS = (("tokenizer", "from"), ("pretrain", "init_from"))


def _without_refs(view: dict) -> dict:
    """``view`` with every set external reference replaced by a marker (its content hash is in ``inputs``)."""
    out = dict(view)
    for section, key in EXTERNAL_REFS:
        if isinstance(out.get(section), dict) and out[section].get(key) is not None:
            out[section] = {**out[section], key: "<content hash in inputs>"}
    return out


# code_version: bump a stage's when its code changes what it writes for the same config and inputs.
# 2 (issue 9): normalize drops bidi controls, quarantines lone surrogates, weighs the script check;
# tokenizer stores no thresholds; shards take word starts from ICU word break and drop token_budget;
# pretrain: SpanBERT span lengths, canonical safetensors, pickle-free checkpoints, paper ELECTRA,
# interval-mean loss, one unigram baseline; evaluate: transfer windows, held-out source score,
# intervals, RTD metrics; audit: CrowS-Pairs as the reference; register: model card from the manifests.
# 3 (issues 10, 13, 15): normalize doc ids by file and row, documents rebatched per file (partitions);
# shards format v3 (word starts in the ids' spare bit or bit-packed, segment ids rebuilt from [SEP]) merged from
# language x document-run partitions; evaluate: efficiency, per-class F1, macro-F1, CV; register: efficiency gates.
# 4 (issue 20): evaluate: the untrained-encoder control and the gain over it, predictions.parquet, the fine-tune on
# finetune.threads torch threads (byte-reproducible across processes), finetuned_sha256.
# 5 (issue 21): evaluate writes intrinsic_documents.parquet (per-document [MASK] top-1 counts for the report).
_C, _P = "tasks.validation.contracts:", "tasks.publish:"    # where the existing stages' contracts and tables live
STAGES: dict[str, StageSpec] = {
    "normalize": StageSpec("normalize", (), code_version="3", reads=("sources", "normalize"), run=calls.run_normalize,
                           inputs=calls.normalize_inputs, derived=calls.normalize_scripts,
                           partitions="mlm_core.normalize.partitioned:STAGE",
                           suite="normalize", contract_tables=_C + "normalize_tables",
                           contract_parameters=_C + "normalize_parameters", table=_P + "normalize_rows",
                           summary="clean, filter and deduplicate the raw corpus per language"),
    "tokenizer": StageSpec("tokenizer", ("normalize",), code_version="2", reads=("tokenizer", "seed"),
                           run=calls.run_tokenizer, inputs=calls.tokenizer_inputs,
                           derived=lambda lc: {"alpha": lc.config.tokenizer_alpha},
                           suite="tokenizer", contract_tables=_C + "tokenizer_tables",
                           contract_parameters=_C + "tokenizer_parameters", table=_P + "tokenizer_rows",
                           summary="train a tokenizer on a language-balanced sample"),
    "shards": StageSpec("shards", ("normalize", "tokenizer"), code_version="3", reads=("shards",), run=calls.run_shards,
                        inputs=calls.shards_inputs, derived=lambda lc: {"languages": lc.config.languages},
                        partitions="mlm_core.shards.partitioned:STAGE",
                        suite="shards", contract_tables=_C + "shards_tables",
                        contract_parameters=_C + "shards_parameters", table=_P + "shards_rows",
                        plots=_P + "shares_plot",
                        summary="encode, pack and write Arrow shards with the language sampling table"),
    "pretrain": StageSpec("pretrain", ("normalize", "tokenizer", "shards"), code_version=PRETRAIN_CODE_VERSION,
                          reads=("pretrain", "seed"), run=calls.run_pretrain, inputs=pretrain_inputs,
                          suite="pretrain", contract_tables=_C + "pretrain_tables",
                          contract_parameters=_C + "pretrain_parameters", table=_P + "pretrain_rows",
                          summary="train the encoder (MLM or ELECTRA), checkpoint, export"),
    "evaluate": StageSpec("evaluate", ("normalize", "shards", "pretrain"), code_version="5",
                          reads=("evaluate", "seed", "debias"), run=calls.run_evaluate, inputs=calls.evaluate_inputs,
                          suite="evaluate", contract_tables=_C + "evaluate_tables",
                          contract_parameters=_C + "evaluate_parameters", table=_P + "evaluate_rows",
                          plots=_P + "reliability_plot",
                          summary="per-language metrics and zero-shot transfer"),
    "audit": StageSpec("audit", ("pretrain",), code_version="2", reads=("audit", "debias"), run=calls.run_audit,
                       inputs=calls.audit_inputs, context=("normalize",), suite="audit", contract_tables=_C + "audit_tables",
                       table=_P + "audit_rows", table_title="CrowS-Pairs per language",
                       summary="CrowS-Pairs and template bias audits"),
    # registry.gates are declared "output" of this stage, not thresholds: the stage's output *is* the gate
    # decision (gates.json, the model card), promotion follows it, and the stage is cheap and last, so
    # recomputing it is how a gate change is re-evaluated.
    "register": StageSpec("register", ("pretrain", "evaluate", "audit"), code_version="3", reads=("registry",),
                          context=("normalize", "tokenizer", "shards"), run=calls.run_register, suite="register", contract_tables=_C + "register_tables",
                          table=_P + "register_rows",
                          table_title="Promotion gates (gate, threshold, value, pass): `champion` needs every "
                                      "gate to pass",
                          summary="promotion gates and the model card"),
}


def stage_names() -> list[str]:
    return list(STAGES)


def downstream_of(name: str) -> list[str]:
    """``name`` and every stage depending on it, in pipeline order."""
    out = [name]
    for s in STAGES.values():
        if any(u in out for u in s.upstream) and s.name not in out:
            out.append(s.name)
    return out


@dataclass(frozen=True)
class StagePlan:
    name: str
    fingerprint: str
    upstream: dict[str, str]
    path: Path
    status: Status
    config: dict             # the fingerprinted config (output + report fields); the manifest records it
    output_key: str          # hash of the output fields and the upstream output keys
    thresholds: dict         # the data-contract thresholds in force (not fingerprinted)

    def to_json(self) -> dict:
        """This plan as plain JSON: what the pipeline flow hands each stage task (``tasks.stage.run_stage``)."""
        import json
        return json.loads(json.dumps({"name": self.name, "fingerprint": self.fingerprint, "upstream": self.upstream,
                                      "path": str(self.path), "status": self.status, "config": self.config,
                                      "output_key": self.output_key, "thresholds": self.thresholds}, default=str))

    @classmethod
    def from_json(cls, d: dict) -> "StagePlan":
        return cls(d["name"], d["fingerprint"], dict(d["upstream"]), Path(d["path"]), d["status"], d["config"],
                   d["output_key"], d["thresholds"])

    def params(self) -> dict:
        """Config + thresholds: what a stage run logs as its parameters."""
        return with_thresholds({"config": self.config}, self.thresholds)["config"]

    def as_row(self, store: StageStore) -> dict:
        """``mlm status``'s row; not done but a failed attempt's partial output kept: ``failed``, at that path."""
        size = store.load(self.name, self.fingerprint).size_bytes() if self.status == "done" else None
        failed = store.failed_dir(self.name, self.fingerprint) if self.status != "done" else None
        if failed is not None and failed.is_dir():
            return {"stage": self.name, "status": "failed", "fingerprint": self.fingerprint,
                    "path": str(failed), "bytes": None}
        return {"stage": self.name, "status": self.status, "fingerprint": self.fingerprint,
                "path": str(self.path), "bytes": size}


def plan(lc: LoadedConfig, store: StageStore | None = None) -> dict[str, StagePlan]:
    """Fingerprint and status of every stage (done / missing / stale), without running anything."""
    store = store or StageStore(lc.workdir)
    out: dict[str, StagePlan] = {}
    for spec in STAGES.values():
        check_declared(spec)                # a declared suite file that is missing: fail before any work
        up = {u: out[u].fingerprint for u in spec.upstream}
        section = stage_config(lc, spec.name)
        inputs = spec.inputs(lc) if spec.inputs else None
        fp = fingerprint(spec.name, spec.code_version, _without_refs(section), up, inputs)
        key = fingerprint(spec.name, spec.code_version, _without_refs(stage_output_config(lc, spec.name)),
                          {u: out[u].output_key for u in spec.upstream}, inputs)
        if store.is_complete(spec.name, fp):
            status: Status = "done"
        elif store.complete_outputs(spec.name):
            status = "stale"
        else:
            status = "missing"
        out[spec.name] = StagePlan(spec.name, fp, up, store.out_dir(spec.name, fp), status, section, key,
                                   stage_thresholds(lc, spec.name))
    return out


def select(plans: dict[str, StagePlan], only: str | None = None, from_: str | None = None,
           command: str = "mlm run CONFIG") -> list[str]:
    """Stages to execute for ``--only`` / ``--from`` (all of them by default); checks upstream outputs exist.
    ``command``: the user's own ``mlm run`` command line (``commands.run_command``), for the "run first" hint."""
    for opt, name in (("--only", only), ("--from", from_)):
        if name is not None and name not in STAGES:
            raise PlanError(f"{opt} {name}: unknown stage (stages: {', '.join(STAGES)})")
    if only and from_:
        raise PlanError("give at most one of --only and --from")
    chosen = [only] if only else downstream_of(from_) if from_ else list(STAGES)
    for name in chosen:
        for u in STAGES[name].upstream:
            if u not in chosen and plans[u].status != "done":
                raise PlanError(f"stage {name!r} needs the output of {u!r} (fingerprint {plans[u].fingerprint}), "
                                f"which is {plans[u].status}: run `{command} --only {u}` "
                                f"(or `{command}` for every missing stage) first")
    return chosen


def execute(lc: LoadedConfig, name: str, plans: dict[str, StagePlan], force: bool = False,
            check: Callable[[Path, dict], None] | None = None,
            store: StageStore | None = None, hooks: dict | None = None) -> tuple[StageArtifact, bool]:
    """``_execute`` under a per-output lock (``mlm_core.locks``): a second run of the same stage and fingerprint
    waits for the first, then reuses its output (even when forced: it is fresh). Errors name the stage."""
    from mlm_core.locks import stage_lock, tag_stage
    store = store or StageStore(lc.workdir)
    fp = plans[name].fingerprint
    was_complete = store.is_complete(name, fp)
    with tag_stage(name, store.root), stage_lock(store.root, name, fp) as waited:
        if waited and not was_complete and store.is_complete(name, fp):
            force = False
        return _execute(lc, name, plans, force, check, store, hooks)


def _load_verified(lc: LoadedConfig, store: StageStore, name: str, fp: str) -> StageArtifact:
    """``store.load`` under the config's verify policy; a corrupt output's error gives the user's own rebuild
    command (config path, overrides, the stage)."""
    from mlm_core.commands import run_command
    from mlm_core.store import CorruptOutputError
    try:
        return store.load(name, fp, verify=lc.config.verify)
    except CorruptOutputError as exc:
        raise CorruptOutputError(exc.report, run_command(lc, "--only", name, "--force")) from None


def _context(store: StageStore, spec: StageSpec, plans: dict[str, StagePlan]) -> dict:
    """The stage's declared context outputs ({stage: typed output, or None}, ``StageStore.load_optional``) at the
    fingerprints this run's plan gives them: the same ones its upstream outputs were built from."""
    return {c: store.load_optional(c, plans[c].fingerprint if c in plans else None) for c in spec.context}


def _execute(lc: LoadedConfig, name: str, plans: dict[str, StagePlan], force: bool = False,
             check: Callable[[Path, dict], None] | None = None,
             store: StageStore | None = None, hooks: dict | None = None) -> tuple[StageArtifact, bool]:
    """Run one stage unless its output is complete (and not forced). Returns (artifact, cache_hit).

    ``check(out_dir, manifest)`` (the data contract) sees the manifest with the current thresholds merged into
    its ``config`` (``with_thresholds``); a cache hit is not checked here: the caller re-validates it
    (``revalidate``), so a threshold change never recomputes an output but always re-checks it.
    ``hooks``: optional callbacks passed to the stage function by name (e.g. ``metrics_cb`` for pretrain,
    called with each training metrics record so the caller can stream them to a tracker)."""
    store = store or StageStore(lc.workdir)
    spec, p = STAGES[name], plans[name]
    if not force and store.is_complete(name, p.fingerprint):
        log.info("%s: cached (%s)", name, p.fingerprint)
        return _load_verified(lc, store, name, p.fingerprint), True
    upstream = {}
    for u, ufp in p.upstream.items():
        if not store.is_complete(u, ufp):
            raise PlanError(f"stage {name!r} needs {u!r} output {ufp}, which is missing: run stage {u!r} first")
        upstream[u] = _load_verified(lc, store, u, ufp)   # corrupt: CorruptOutputError
    upstream |= _context(store, spec, plans)
    # thresholds: those the output was validated against when written (a cache hit under others re-validates)
    base = {"config": p.config, "upstream": p.upstream, "code_version": spec.code_version,
            "output_key": p.output_key, "thresholds": p.thresholds}
    log.info("%s: running (%s)", name, p.fingerprint)
    checked = None if check is None else (lambda out, manifest: check(out, with_thresholds(manifest, p.thresholds)))
    hooks = dict(hooks or {})
    if spec.partitioned:
        from mlm_core import partitions
        folders: list[Path] = []
        mapper = hooks.pop("mapper", None)
        art = store.write(name, p.fingerprint, lambda out: partitions.run_partitioned(
            name, lc, upstream, out, p.fingerprint, mapper, on_keys=folders.extend, target=spec.partitions), base,
            check=checked)
        partitions.cleanup(folders)        # stored: the partitions are merged into it (kept after a failure)
        return art, False
    hooks.pop("mapper", None)
    art = store.write(name, p.fingerprint, lambda out: spec.run(lc, upstream, out, **hooks), base,
                      check=checked)
    return art, False
