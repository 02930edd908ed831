"""What invalidates what: every config field's declared effect, checked against the fingerprints it produces.

(a) For every leaf field of the config tree (walked from the pydantic models, on configs/demo.yaml), a changed
    valid value is generated from the field's type and bounds; the plan (no stage runs) must then agree with
    the field's marker: "none"/"threshold" keep every stage fingerprint; "output"/"report" change the owning
    stage's fingerprint and exactly those downstream of it. The owner of each field is written here by hand
    (the top-level section a field lives in), not read from mlm_core.stages.
(b) A pretraining run interrupted midway resumes from its checkpoint after checkpoint_every / eval_every /
    log_every change (checkpoints are keyed by the training trajectory, not by the stage fingerprint).
(c) Tightening tokenizer.max_fertility on a stored tokenizer fails the stage by re-validation, without
    retraining it; restoring the threshold passes again from the same stored output.
(d) `mlm run --only X` and the stage flow X agree: both reuse X's complete output unless forced.
"""
from __future__ import annotations

import copy
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from conftest import REPO, write_en_ru_config
from mlm_core import stages
from mlm_core.config import EFFECTS, PipelineConfig, Section, field_effect, section_type
from mlm_core.config.io import ConfigError, load_config

DEMO = REPO / "configs" / "demo.yaml"

# Which stage each top-level key belongs to (independent of mlm_core.stages, which derives it).
OWNER = {"sources": "normalize", "normalize": "normalize", "tokenizer": "tokenizer", "shards": "shards",
         "pretrain": "pretrain", "evaluate": "evaluate", "audit": "audit", "registry": "register",
         "debias": "debias"}
# Fields read by an earlier stage than their section's: the seed seeds the tokenizer's sample; the demo leaves
# tokenizer.sampling_alpha unset, so the tokenizer samples with shards.sampling_alpha.
# pretrain.init_from is also the tokenizer's source when tokenizer.from is unset (the model's own tokenizer).
OWNER_OVERRIDE = {"seed": "tokenizer", "shards.sampling_alpha": "tokenizer", "pretrain.init_from": "tokenizer"}
# Hand-written pipeline order and edges, to state "downstream" without asking the code under test.
DOWNSTREAM = {"normalize": ["normalize", "tokenizer", "shards", "pretrain", "evaluate", "audit", "register"],
              "tokenizer": ["tokenizer", "shards", "pretrain", "evaluate", "audit", "register"],
              "shards": ["shards", "pretrain", "evaluate", "audit", "register"],
              "pretrain": ["pretrain", "evaluate", "audit", "register"],
              "evaluate": ["evaluate", "register"], "audit": ["audit", "register"], "register": ["register"],
              # the post-hoc projection is applied by both scoring stages (the trained model is not touched)
              "debias": ["evaluate", "audit", "register"]}


# ------------------------------------------------------------------------------------------------ the walk
def _leaves(model: type[BaseModel], value, prefix: str):
    """(dotted path, model class, field name, current value | _UNSET) for every leaf field."""
    for name, f in model.model_fields.items():
        path = f"{prefix}{f.alias or name}"       # tokenizer.from is the field from_
        sub = section_type(f.annotation)
        cur = getattr(value, name) if value is not None else None
        if sub is None:
            yield path, model, name, cur if value is not None else _UNSET
        elif isinstance(cur, dict):        # dict of sections: walk the first key (sources.ar, ...)
            k = sorted(cur)[0]
            yield from _leaves(sub, cur[k], f"{path}.{k}.")
        else:
            yield from _leaves(sub, cur, f"{path}.")


class _Unset:
    def __repr__(self):
        return "<section not set in the demo>"


_UNSET = _Unset()
# Optional sections the demo leaves unset are set here (valid values) so that their fields are walked too.
# Paths are relative to configs/ (the demo's folder): the shipped word-pair lists.
_LISTS = {"en": "bias/en.yaml", "fr": "bias/fr.yaml"}
OPTIONAL = {"shards.cda": {"share": 0.5, "lists": _LISTS},
            "pretrain.bias_regularizer": {"weight": 0.1, "layer": -1, "lists": _LISTS},
            "debias.projection": {"lists": _LISTS, "components": 1, "max_sentences": 100}}


def _with_optional() -> dict:
    import yaml
    raw = yaml.safe_load(DEMO.read_text())
    for path, value in OPTIONAL.items():
        node = raw
        *head, last = path.split(".")
        for k in head:
            node = node.setdefault(k, {})
        node[last] = value
    return raw


BASE = load_config(DEMO, raw=_with_optional())
LEAVES = list(_leaves(PipelineConfig, BASE.config, ""))
# Fields whose section the demo leaves unset: no valid change exists without also rewriting the section.
SKIPPED = {p: "sources.<lang>.dataset is unset (the demo reads local files; paths and dataset exclude each other)"
           for p, _, _, v in LEAVES if v is _UNSET}


def _bounds(model, name):
    lo = hi = None
    for m in model.model_fields[name].metadata:
        lo = getattr(m, "ge", getattr(m, "gt", lo))
        hi = getattr(m, "le", getattr(m, "lt", hi))
    return lo, hi


def _candidates(model, name, v):
    """Changed values to try, most natural first (the first one the config accepts is used)."""
    ann = model.model_fields[name].annotation
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    lits = [a for a in ([ann] + args) if typing.get_origin(a) is typing.Literal]
    if lits:
        others = [c for c in typing.get_args(lits[0]) if c != v]
        if others or not ({int, float} & set(args)):
            return others
        return [16.0, 8, 1.0]           # a number or a keyword ("auto"), left at the keyword
    if isinstance(v, bool):
        return [not v]
    if isinstance(v, int):
        return [v + 1, v - 1]
    if isinstance(v, float):
        return [v * 0.9 if v else 0.5, v * 1.1, v + 0.01]
    if isinstance(v, str):
        return [v + "x"]
    if isinstance(v, tuple):
        return [(v[0] - 0.05, *v[1:])]
    if isinstance(v, list):
        return [v + v[:1]] if v else [["x"]]
    if isinstance(v, dict):
        return [dict(list(v.items())[:-1])] if v else [{BASE.config.languages[0]: 5.0}]
    assert v is None, (name, v)
    if ann is str or str in args:
        return ["x:1"]
    if list in [typing.get_origin(a) for a in args]:
        return [["x"]]
    if dict in [typing.get_origin(a) for a in args]:
        return [{BASE.config.languages[0]: "x"}]
    lo, _ = _bounds(model, name)
    if int in args:
        return [max(int(lo or 1), 1) * 2, 64, 3]
    return [0.5, 0.1]


def _set(raw: dict, path: str, value) -> None:
    node = raw
    *head, last = path.split(".")
    for k in head:
        node = node[k]
    node[last] = value


def _raw(tmp: Path, base: dict | None = None) -> dict:
    raw = BASE.config.model_dump(mode="json")
    raw["workdir"] = str(tmp / "work")
    for k, v in (base or {}).items():
        _set(raw, k, v)
    return raw


# Values no type-driven guess can produce (a script name must be a real Unicode script; an external reference
# must name a real tokenizer / checkpoint folder: built once per module by the ``external`` fixture).
SPECIAL = {"sources.ar.scripts": [["Arabic", "Latin"]], "pretrain.model.window": [64],   # even, <= max_positions
           # planning caches input-file digests in the workdir: keep the changed one out of the checkout
           "workdir": [str(Path(__import__("tempfile").gettempdir()) / "mlm-fingerprint-walk-workdir")]}
EXTERNAL = {"tokenizer.from": "tokenizer", "pretrain.init_from": "checkpoint"}
# Fields valid only together with another one, set in both the base and the changed config.
# A value naming an `external` fixture folder is replaced by its path; anything else is used as is.
BASE_WITH = {"tokenizer.extend": {"tokenizer.from": "tokenizer"},
             "pretrain.distributed.nnodes": {"pretrain.distributed.rdzv_endpoint": "127.0.0.1:29400"},
             # the projection is refused with ELECTRA (transfer fine-tunes the discriminator)
             "pretrain.objective": {"debias.projection": None},
             # read only by local attention (used_when): with the default global attention they change nothing
             "pretrain.model.window": {"pretrain.model.attention": "local_global"},
             "pretrain.model.global_every": {"pretrain.model.attention": "local_global"},
             # read only by static masking (used_when): the demo masks dynamically
             "pretrain.masking.static_copies": {"pretrain.masking.mode": "static"},
             # ModernBERT is pre-LN and rotary: a dumped BERT config states post / learned, which family modernbert refuses
             "pretrain.model.family": {"pretrain.model.norm": "pre", "pretrain.model.position": "rotary"}}


@pytest.fixture(scope="module")
def external(tmp_path_factory) -> dict[str, str]:
    """A tiny WordPiece tokenizer folder and a tiny random BertForMaskedLM folder (tests/hf_tiny.py)."""
    from conftest import FOX_EN, FOX_RU
    from hf_tiny import save_tiny, train_tokenizer
    root = tmp_path_factory.mktemp("external")
    texts = [FOX_EN.format(i=i) for i in range(20)] + [FOX_RU.format(i=i) for i in range(20)]
    (root / "tokenizer").mkdir()
    train_tokenizer("bert", texts, 120).save(str(root / "tokenizer" / "tokenizer.json"))
    save_tiny(root / "checkpoint", "bert", texts, vocab_size=120)
    return {"tokenizer": str(root / "tokenizer"), "checkpoint": str(root / "checkpoint")}


def _base_with(path: str, external: dict) -> dict:
    return {k: external.get(v, v) for k, v in BASE_WITH.get(path, {}).items()}


def _changed(tmp: Path, path: str, model, name, v, external: dict | None = None):
    base = _base_with(path, external or {})
    cands = [external[EXTERNAL[path]]] if path in EXTERNAL else SPECIAL.get(path) or _candidates(model, name, v)
    for cand in cands:
        raw = _raw(tmp, base)
        _set(raw, path, copy.deepcopy(cand))
        try:
            return load_config(DEMO, raw=raw), cand
        except ConfigError:
            continue
    pytest.fail(f"{path}: no valid changed value among {_candidates(model, name, v)}; teach _candidates this type")


def test_every_field_declares_its_effect():
    """A new field without a marker (or with an unknown one) fails here, whatever section it is in."""
    seen, todo = set(), [PipelineConfig]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, f in model.model_fields.items():
            effect = field_effect(model, name)            # raises ValueError when the marker is missing
            sub = section_type(f.annotation)
            assert effect in EFFECTS or (effect == "section" and sub is not None), (model.__name__, name, effect)
            if sub is not None:
                todo.append(sub)
    assert len(seen) >= 15 and all(issubclass(m, Section) for m in seen)


def test_a_field_without_marker_is_refused():
    from pydantic import Field

    class Bad(Section):
        x: int = Field(default=1, description="no marker")
    with pytest.raises(ValueError, match="Bad.x: json_schema_extra must declare an effect"):
        field_effect(Bad, "x")


def test_skip_list_is_small():
    assert len(LEAVES) > 100
    assert len(SKIPPED) <= 8, SKIPPED
    assert all(p.startswith("sources.") and ".dataset." in p for p in SKIPPED)


@pytest.mark.parametrize("path,model,name,value", LEAVES, ids=[p for p, *_ in LEAVES])
def test_field_effect_matches_the_fingerprints(tmp_path, path, model, name, value, request):
    if path in SKIPPED:
        pytest.skip(SKIPPED[path])
    from mlm_core.train.loop import train_fingerprint
    ext = request.getfixturevalue("external") if path in EXTERNAL or path in BASE_WITH else {}
    base_lc = load_config(DEMO, raw=_raw(tmp_path, _base_with(path, ext)))
    lc, new = _changed(tmp_path, path, model, name, value, ext)
    before, after = stages.plan(base_lc), stages.plan(lc)
    effect = field_effect(model, name)
    changed = {n for n in stages.STAGES if before[n].fingerprint != after[n].fingerprint}
    changed_keys = {n for n in stages.STAGES if before[n].output_key != after[n].output_key}
    if effect in ("none", "threshold"):
        assert changed == set(), f"{path}: {value!r} -> {new!r} is declared {effect!r} but changed {changed}"
        assert changed_keys == set()
    else:
        owner = OWNER_OVERRIDE.get(path) or OWNER[path.split(".")[0]]
        assert changed == set(DOWNSTREAM[owner]), f"{path} ({effect}): {value!r} -> {new!r} changed {changed}"
        # output keys (what pretrain's checkpoints are keyed by) move only with output fields
        assert changed_keys == (set(DOWNSTREAM[owner]) if effect == "output" else set()), (path, changed_keys)
    if path.startswith("pretrain."):
        same = train_fingerprint(base_lc.config.pretrain, 0) == train_fingerprint(lc.config.pretrain, 0)
        assert same == (effect != "output"), f"{path} ({effect}): trajectory {'kept' if same else 'changed'}"
    if effect == "threshold":
        assert before[OWNER[path.split('.')[0]]].thresholds != after[OWNER[path.split('.')[0]]].thresholds


def test_external_folders_enter_by_content_not_path(tmp_path, external):
    """tokenizer.from / pretrain.init_from: the same files under another path give the same fingerprints (and
    training trajectory); one changed byte gives new ones, from the stage reading that folder on."""
    import shutil
    from types import SimpleNamespace

    from mlm_core.train.stage import trajectory_key
    a, b = tmp_path / "a" / "ckpt", tmp_path / "elsewhere" / "copy"
    shutil.copytree(external["checkpoint"], a)
    shutil.copytree(external["checkpoint"], b)

    def lc_of(ckpt, tok=None):
        return load_config(DEMO, raw=_raw(tmp_path, {"pretrain.init_from": str(ckpt)} |
                                          ({"tokenizer.from": str(tok)} if tok else {})))

    def fps(lc):
        return {n: (p.fingerprint, p.output_key) for n, p in stages.plan(lc).items()}

    up = {u: SimpleNamespace(manifest={"output_key": u * 3}, fingerprint=u) for u in ("shards", "tokenizer")}
    la, lb = lc_of(a), lc_of(b)
    assert fps(la) == fps(lb)
    assert trajectory_key(la, up) == trajectory_key(lb, up)
    # the manifest still records the reference as written
    assert stages.plan(lb)["pretrain"].config["pretrain"]["init_from"] == str(b)

    def flip_last_byte(f: Path) -> None:
        data = bytearray(f.read_bytes())
        data[-1] ^= 1
        f.write_bytes(bytes(data))

    flip_last_byte(b / "model.safetensors")          # a weight changes, the tokenizer does not
    after = fps(lc_of(b))
    assert {n for n in after if after[n] != fps(la)[n]} == set(DOWNSTREAM["pretrain"])
    assert trajectory_key(lc_of(b), up) != trajectory_key(la, up)
    flip_last_byte(b / "tokenizer.json")             # init_from is also the tokenizer's source
    after = fps(lc_of(b))
    assert {n for n in after if after[n] != fps(la)[n]} == set(DOWNSTREAM["tokenizer"])
    # an explicit tokenizer.from decides the tokenizer: a changed byte there, the checkpoint's tokenizer unused
    tok = tmp_path / "tok"
    shutil.copytree(external["tokenizer"], tok)
    base = fps(lc_of(a, tok))
    flip_last_byte(tok / "tokenizer.json")
    after = fps(lc_of(a, tok))
    assert {n for n in after if after[n] != base[n]} == set(DOWNSTREAM["tokenizer"])


def test_external_reference_errors_name_the_field(tmp_path, monkeypatch):
    from mlm_core import external
    monkeypatch.setattr(external, "_RESOLVERS", {})     # mlm_core alone: no registry resolver (flows installs one)
    with pytest.raises(Exception, match=r"pretrain\.init_from: .*missing.* does not exist"):
        stages.plan(load_config(DEMO, raw=_raw(tmp_path, {"pretrain.init_from": str(tmp_path / "missing")})))
    with pytest.raises(Exception, match=r"tokenizer\.from: 'models:/m@champion' is a registry address"):
        stages.plan(load_config(DEMO, raw=_raw(tmp_path, {"tokenizer.from": "models:/m@champion"})))


def test_issue_examples(tmp_path):
    """The knobs named in the issue: none of them invalidates pretrain or anything after it."""
    base = stages.plan(load_config(DEMO, raw=_raw(tmp_path)))
    for ov in ["pretrain.device=cpu", "pretrain.checkpoint_every=7", "pretrain.keep_checkpoints=5",
               "pretrain.distributed.timeout_s=99", "pretrain.peak_flops=1.0e12", "pretrain.log_every=3",
               "normalize.max_quarantine_rate=0.2", "tokenizer.max_fertility=9", "tokenizer.max_unk_rate=0.1",
               "tokenizer.min_vocab_fraction=0.2", "shards.token_budget=123"]:
        lc = load_config(DEMO, [ov], raw=_raw(tmp_path))
        after = stages.plan(lc)
        assert {n: p.fingerprint for n, p in after.items()} == {n: p.fingerprint for n, p in base.items()}, ov
    # a report-only field changes its stage, but not the training trajectory (pretrain resumes)
    lc = load_config(DEMO, ["pretrain.eval_batches=9"], raw=_raw(tmp_path))
    after = stages.plan(lc)
    assert after["pretrain"].fingerprint != base["pretrain"].fingerprint
    assert after["pretrain"].output_key == base["pretrain"].output_key


def test_token_budget_is_applied_on_display(small_cfg):
    """shards.token_budget only feeds the expected-epochs column: `mlm stats` computes it from the stored
    sampling table and the current budget, so a new budget recomputes nothing and still shows."""
    import pyarrow.parquet as pq

    from mlm_core.stats import language_table
    lc = load_config(small_cfg)
    plans = stages.plan(lc)
    for name in ("normalize", "tokenizer", "shards"):
        stages.execute(lc, name, plans)
    tokens = {r["lang"]: r["tokens_train"] for r in pq.read_table(plans["shards"].path / "stats.parquet").to_pylist()}
    weights = {lg: n ** 0.3 for lg, n in tokens.items()}                 # p(l) = n_l^0.3 / sum (XLM-R alpha)
    for budget in (1000, 5000):
        lc_b = load_config(small_cfg, [f"shards.token_budget={budget}"])
        assert stages.plan(lc_b)["shards"].status == "done"
        rows = {r["lang"]: r for r in language_table(lc_b)}
        for lg, n in tokens.items():
            p = weights[lg] / sum(weights.values())
            assert rows[lg]["expected_epochs"] == pytest.approx(budget * p / n), (budget, lg)


# ------------------------------------------------------------------------------------------------ (b) resume
class _Stop(Exception):
    pass


def test_changing_checkpoint_cadence_midway_resumes(tmp_path, one_torch_thread, caplog):
    import json
    import logging

    from test_train import LANGS, tiny_cfg, tiny_shards

    from mlm_core.train.stage import run_pretrain, trajectory_key
    shards, tok = tiny_shards(tmp_path / "tiny")
    up = {"shards": shards, "tokenizer": tok}
    (tmp_path / "unused.txt").write_text("x\n")

    def lc_of(**pre):
        return load_config(raw={"workdir": str(tmp_path / "work"), "seed": 3, "shards": {"seq_len": 32},
                                "sources": {lg: {"paths": [str(tmp_path / "unused.txt")]} for lg in LANGS},
                                "pretrain": tiny_cfg(steps=12, **pre).model_dump(mode="json")})

    def out_dir(lc, attempt):       # the store's temporary folder for this stage fingerprint
        d = lc.workdir / "pretrain" / f".tmp-{stages.plan(lc)['pretrain'].fingerprint}-{attempt}-aaaa"
        d.mkdir(parents=True)
        return d

    first = lc_of(checkpoint_every=4, eval_every=12, log_every=1)

    def stop_at_6(rec):
        if rec["type"] == "train" and rec["step"] == 6:
            raise _Stop                                     # killed after the step-4 checkpoint
    with pytest.raises(_Stop):
        run_pretrain(first, up, out_dir(first, 1), metrics_cb=stop_at_6)

    # new cadence (checkpoint_every, log_every: none; eval_every: report, so a new stage fingerprint)
    second = lc_of(checkpoint_every=5, eval_every=6, log_every=2, keep_checkpoints=3)
    assert stages.plan(second)["pretrain"].fingerprint != stages.plan(first)["pretrain"].fingerprint
    assert trajectory_key(second, up) == trajectory_key(first, up)
    with caplog.at_level(logging.WARNING, logger="mlm_core.train.loop"):
        m = run_pretrain(second, up, out_dir(second, 2))
    assert m["resumed_from"] == 4 and m["steps"] == 12
    # the checkpoint's recorded training fingerprint matches: resumed as the same run, not with a warning
    assert not [r for r in caplog.records if "different training config" in r.getMessage()]
    steps = [r["step"] for r in map(json.loads, (Path(m["checkpoint_dir"]) / "metrics.jsonl").read_text().splitlines())
             if r["type"] == "train"]
    assert steps == [1, 2, 3, 4] + [6, 8, 10, 12]           # old cadence up to the checkpoint, then the new one
    # a field that changes the weights starts a new trajectory
    assert trajectory_key(lc_of(checkpoint_every=4, lr=2e-3), up) != trajectory_key(first, up)


# ------------------------------------------------------------------------------------------------ (c) thresholds
@pytest.fixture
def small_cfg(tmp_path):
    return write_en_ru_config(tmp_path, "fptest", 40, tracking={"enabled": False},
                              tokenizer={"vocab_size": 300, "heldout_docs": 5, "min_vocab_fraction": 0.1,
                                         "max_fertility": 20})


def test_threshold_change_revalidates_without_recomputing(small_cfg, prefect_harness, monkeypatch):
    from dataclasses import replace

    from flows.pipeline import normalize_flow, tokenizer_flow
    from tasks.validation import ValidationFailed
    cfg = str(small_cfg)
    first = normalize_flow(config_path=cfg) + tokenizer_flow(config_path=cfg)
    assert [(r["stage"], r["cache_hit"], r["validation"]) for r in first] == \
        [("normalize", False, "passed"), ("tokenizer", False, "passed")]

    calls = []
    spec = stages.STAGES["tokenizer"]
    monkeypatch.setitem(stages.STAGES, "tokenizer",
                        replace(spec, run=lambda *a, **k: calls.append(a) or spec.run(*a, **k)))
    with pytest.raises(ValidationFailed, match="fertility"):
        tokenizer_flow(config_path=cfg, overrides=["tokenizer.max_fertility=0.5"])
    assert calls == [], "a threshold change must not retrain the tokenizer"
    assert stages.plan(load_config(small_cfg, ["tokenizer.max_fertility=0.5"]))["tokenizer"].status == "done"
    again = tokenizer_flow(config_path=cfg, overrides=["tokenizer.max_fertility=30"])
    assert [(r["cache_hit"], r["validation"]) for r in again] == [(True, "passed")] and calls == []
    same = tokenizer_flow(config_path=cfg)          # the thresholds it was written with: nothing to re-check
    assert [(r["cache_hit"], r["validation"]) for r in same] == [(True, "cached")]
    # the same for normalize: 40 documents per language no longer meet a 41-document minimum
    with pytest.raises(ValidationFailed, match="docs"):
        normalize_flow(config_path=cfg, overrides=["normalize.min_docs_per_language=41"])
    ok = normalize_flow(config_path=cfg, overrides=["normalize.min_docs_per_language=40"])
    assert [(r["cache_hit"], r["validation"]) for r in ok] == [(True, "passed")]


# ------------------------------------------------------------------------------------------------ (d) --only
@pytest.mark.heavy
def test_only_and_the_stage_flow_agree_on_force(small_cfg, monkeypatch):
    import inspect

    import flows.pipeline as fp
    from flows.cli import main
    for name, flow in fp.STAGE_FLOWS.items():
        assert inspect.signature(flow.fn).parameters["force"].default is False, name
    import importlib
    # only the flow call is under test: no Prefect server, no process-wide signal handlers
    for mod, attr in (("flows.ephemeral", "start"), ("mlm_core.train.signals", "install")):
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        if hasattr(m, attr):
            monkeypatch.setattr(m, attr, lambda *a, **k: None)
    seen = []
    monkeypatch.setenv("PREFECT_HOME", str(small_cfg.parent / "prefect"))
    monkeypatch.setitem(fp.STAGE_FLOWS, "normalize", lambda **kw: seen.append(kw) or [])
    assert main(["run", str(small_cfg), "--only", "normalize"]) == 0
    assert main(["run", str(small_cfg), "--only", "normalize", "--force"]) == 0
    assert [kw["force"] for kw in seen] == [False, True]


def _omit_default_fields():
    """(dotted path, model, name) of every field marked omit_default, found by walking the models."""
    out, todo = [], [(PipelineConfig, "")]
    while todo:
        model, prefix = todo.pop()
        for name, f in model.model_fields.items():
            extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
            path = prefix + (f.alias or name)
            if extra.get("omit_default"):
                out.append((path, model, name))
            sub = section_type(f.annotation)
            if sub is not None and not typing.get_origin(f.annotation) is dict:
                todo.append((sub, path + "."))
    return out


def test_features_added_later_keep_old_fingerprints_when_unused(tmp_path):
    """A field added to an existing stage whose default keeps the old output (an optional feature left off) is
    marked omit_default: left at its default it is in no fingerprint, so stored outputs of a config that does
    not use it are reused after an upgrade; spelled out at its default it changes nothing; set, it counts."""
    import json

    import yaml

    from mlm_core.stages import stage_config
    assert {p for p, *_ in _omit_default_fields()} >= {
        "shards.cda", "pretrain.bias_regularizer", "debias", "debias.projection", "pretrain.model.attention",
        "pretrain.model.window", "pretrain.model.global_every"}
    raw = yaml.safe_load(DEMO.read_text()) | {"workdir": str(tmp_path / "work")}   # the demo does not use them
    bare_lc = load_config(DEMO, raw=copy.deepcopy(raw))
    flat = json.dumps({n: stage_config(bare_lc, n) for n in stages.STAGES})
    for key in ('"cda"', '"bias_regularizer"', '"debias"', '"projection"', '"attention"', '"window"',
                '"global_every"'):
        assert key not in flat, key
    bare = {n: p.fingerprint for n, p in stages.plan(bare_lc).items()}
    # spelled out at their defaults: the same fingerprints
    raw["pretrain"].setdefault("model", {}).update({"attention": "global", "window": 128, "global_every": 3})
    raw["pretrain"]["bias_regularizer"] = None
    raw["shards"]["cda"] = None
    raw["debias"] = {"projection": None}
    assert {n: p.fingerprint for n, p in stages.plan(load_config(DEMO, raw=copy.deepcopy(raw))).items()} == bare
    # used: it counts, in its own stage and downstream only
    raw["pretrain"]["model"]["attention"] = "local_global"
    used = {n: p.fingerprint for n, p in stages.plan(load_config(DEMO, raw=raw)).items()}
    assert {n for n in bare if used[n] != bare[n]} == set(DOWNSTREAM["pretrain"])


def test_input_files_enter_by_content_not_mtime(tmp_path, monkeypatch):
    """Raw corpus files and the evaluate / audit data files are fingerprinted by their bytes: a re-synced copy
    (new mtime, new inode, same bytes) keeps every stored output valid; one changed byte (same size) reruns
    the stage that reads it and everything after. Digests are cached: a second plan reads no file again."""
    import os
    import shutil

    from mlm_core import external
    corpus, pairs = tmp_path / "en.txt", tmp_path / "crows_en.csv"
    shutil.copy(REPO / "configs" / "demo" / "bias" / "crows_pairs_en.csv", pairs)
    lc = load_config(DEMO, raw=_raw(tmp_path, {"audit.crows_pairs.en": str(pairs)}))
    corpus.write_text("".join(f"The quick brown fox {i} jumps over the lazy dog.\n" for i in range(50)))
    raw = lc.config.model_dump(mode="json")
    raw["sources"]["en"] = {"paths": [str(corpus)]}
    lc = load_config(DEMO, raw=raw)
    fps = lambda: {n: p.fingerprint for n, p in stages.plan(load_config(DEMO, raw=raw)).items()}   # noqa: E731
    base = fps()
    assert not lc.workdir.exists()          # planning does not create the workdir (nor its digest cache) ...
    lc.workdir.mkdir(parents=True)          # ... a workdir in use keeps the digests
    assert fps() == base

    reads = []
    real_sha = external._sha256
    monkeypatch.setattr(external, "_sha256", lambda p: reads.append(Path(p).name) or real_sha(p))
    assert fps() == base and reads == [], f"cached digests re-read {reads}"

    for f in (corpus, pairs):       # same bytes, rewritten: new inode and an mtime a day later
        data = f.read_bytes()
        f.unlink()
        f.write_bytes(data)
        st = f.stat()
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 86_400 * 10**9))
    assert fps() == base
    assert sorted(reads) == sorted([corpus.name, pairs.name])     # hashed once more each, then cached again

    def flip(f: Path, at: int):
        b = bytearray(f.read_bytes())
        b[at] = ord("X") if b[at] != ord("X") else ord("Y")
        f.write_bytes(bytes(b))

    flip(pairs, 40)
    after = fps()
    assert [n for n in base if after[n] != base[n]] == ["audit", "register"]
    flip(corpus, 5)
    after2 = fps()
    assert all(after2[n] != base[n] for n in DOWNSTREAM["normalize"])


def test_local_attention_knobs_change_nothing_under_global_attention(tmp_path):
    """pretrain.model.window / global_every are read only by local attention: with attention global (the
    demo's) a new value keeps every fingerprint; with local_global it changes pretrain and what follows."""
    fps = lambda ov: {n: p.fingerprint for n, p in stages.plan(load_config(DEMO, ov, raw=_raw(tmp_path))).items()}  # noqa: E731
    base = fps([])
    assert fps(["pretrain.model.window=32"]) == base
    assert fps(["pretrain.model.global_every=2"]) == base
    local = fps(["pretrain.model.attention=local_global"])
    moved = fps(["pretrain.model.attention=local_global", "pretrain.model.window=32"])
    assert [n for n in base if moved[n] != local[n]] == DOWNSTREAM["pretrain"]


def test_static_copies_change_nothing_under_dynamic_masking(tmp_path):
    """pretrain.masking.static_copies (issue 21) is read only by static masking: the demo (dynamic) neither holds
    it in its pretrain config nor moves any fingerprint when it is set; with mode static it changes pretrain and
    what follows."""
    import json

    from mlm_core.stages import stage_config
    fps = lambda ov: {n: p.fingerprint for n, p in stages.plan(load_config(DEMO, ov, raw=_raw(tmp_path))).items()}  # noqa: E731
    assert "static_copies" not in json.dumps(stage_config(load_config(DEMO, raw=_raw(tmp_path)), "pretrain"))
    base = fps([])
    assert fps(["pretrain.masking.static_copies=3"]) == base
    static = fps(["pretrain.masking.mode=static"])
    moved = fps(["pretrain.masking.mode=static", "pretrain.masking.static_copies=1"])
    assert [n for n in base if moved[n] != static[n]] == DOWNSTREAM["pretrain"]
