"""Typed stage outputs (mlm_core.artifacts, issue 22 item 1): each type parses a real stored output of every stage,
a renamed key in a copied manifest fails naming the file and the key, the sweep report and the model card read
the types, every stage is handed its upstream and declared context outputs as types and no stage opens the store. The pipeline (normalize ... register on ~120 real lines per language) is test_register's module fixture."""
from __future__ import annotations

import json
import shutil

import pytest

from test_register import pipeline_out  # noqa: F401  (the module fixture: one tiny run of every stage)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
HEAVY_FIXTURES = {"pipeline_out"}   # a module fixture that runs every stage: its tests are heavy (tests/conftest.py)


def test_each_type_parses_a_real_stored_output(pipeline_out):  # noqa: F811
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    from mlm_core import artifacts, stages
    from mlm_core.store import StageStore
    lc, arts = pipeline_out
    store = StageStore(lc.workdir)
    assert set(artifacts.ARTIFACT_TYPES) == set(stages.STAGES)
    typed = {s: store.load(s, a.fingerprint) for s, a in arts.items()}
    for s, t in typed.items():
        assert type(t) is artifacts.ARTIFACT_TYPES[s] and t.fingerprint == arts[s].fingerprint and t.path == arts[s].path
    norm, tok, shards = typed["normalize"], typed["tokenizer"], typed["shards"]
    for lang in ("en", "ru"):   # the documents actually kept
        assert norm.languages[lang]["docs"] == pq.read_table(norm.path / "docs" / f"{lang}.parquet").num_rows
    real = Tokenizer.from_file(str(tok.path / "tokenizer.json"))
    assert tok.vocab_size == real.get_vocab_size(with_added_tokens=True) and tok.vocab_size_requested == 400
    assert tok.algorithm == "bpe" and tok.source is None
    assert tok.special_tokens["pad"]["id"] == real.token_to_id(tok.special_tokens["pad"]["token"])
    assert shards.seq_len == 32 and shards.vocab_size == tok.vocab_size
    assert shards.tokenizer_fingerprint == tok.fingerprint
    assert sum(shards.sampling_weights().values()) == pytest.approx(1.0)
    pre = typed["pretrain"]
    assert pre.steps == 4 and pre.upstream == {s: arts[s].fingerprint for s in ("normalize", "tokenizer", "shards")}
    assert pre.arch["max_positions"] == 32
    ev = json.loads((typed["evaluate"].path / "evaluation.json").read_text(encoding="utf-8"))
    assert typed["evaluate"].metrics["en.top1"] == pytest.approx(ev["intrinsic"]["en"]["top1"])
    reg = typed["register"]
    gates = json.loads((reg.path / "gates.json").read_text(encoding="utf-8"))
    assert reg.gates == gates and reg.passed == all(g["passed"] for g in gates)
    assert reg.pretrain_fingerprint == pre.fingerprint
    assert typed["audit"].counts["crows_languages"] == len(typed["audit"].crows)


@pytest.mark.parametrize("stage", ["normalize", "tokenizer", "shards", "pretrain", "evaluate", "audit", "register"])
def test_a_renamed_key_names_the_file_and_the_key(pipeline_out, tmp_path, stage):  # noqa: F811
    from mlm_core.artifacts import ARTIFACT_TYPES, ManifestError
    from mlm_core.store import StageStore
    _, arts = pipeline_out
    manifest = arts[stage].manifest
    required = ARTIFACT_TYPES[stage].required_keys()
    assert required
    for key in required:
        d = tmp_path / key / stage / arts[stage].fingerprint
        d.mkdir(parents=True)
        bad = {(k + "_renamed" if k == key else k): v for k, v in manifest.items()}
        (d / "manifest.json").write_text(json.dumps(bad), encoding="utf-8")
        with pytest.raises(ManifestError) as e:
            StageStore(tmp_path / key).load(stage, arts[stage].fingerprint)
        msg = str(e.value)
        assert str(d / "manifest.json") in msg and repr(key) in msg and "\n" not in msg


def _sweep(arts, workdir) -> dict:
    return {"name": "one", "baseline": "v", "workdir": str(workdir), "metrics": ["en.top1"],
            "variants": [{"name": "v", "seed": 0, "status": "done",
                          "config_fingerprints": {s: arts[s].fingerprint for s in ("shards", "pretrain", "evaluate",
                                                                                   "audit")}}]}


def test_the_report_reads_the_types(pipeline_out, tmp_path):  # noqa: F811
    from mlm_core.artifacts import ManifestError
    from mlm_core.report.collect import collect
    lc, arts = pipeline_out
    _, runs = collect(tmp_path, _sweep(arts, lc.workdir))
    ev = json.loads((arts["evaluate"].path / "evaluation.json").read_text(encoding="utf-8"))
    assert runs[0].metrics["en.top1"] == pytest.approx(ev["intrinsic"]["en"]["top1"])
    assert set(runs[0].languages) == {"en", "ru"} and not runs[0].missing_stages
    # a copy of the store whose evaluate manifest has 'metrics' renamed: the report names the file and the key
    wd = tmp_path / "wd"
    for s in ("shards", "pretrain", "evaluate", "audit"):
        shutil.copytree(arts[s].path, wd / s / arts[s].fingerprint)
    mf = wd / "evaluate" / arts["evaluate"].fingerprint / "manifest.json"
    m = json.loads(mf.read_text(encoding="utf-8"))
    m["metric"] = m.pop("metrics")
    mf.write_text(json.dumps(m), encoding="utf-8")
    with pytest.raises(ManifestError, match=rf"{mf}.*'metrics'"):
        collect(tmp_path, _sweep(arts, wd))


def test_the_model_card_reads_the_types(pipeline_out):  # noqa: F811
    from mlm_core.register.gates import GateResult
    from mlm_core.register.stage import card
    lc, arts = pipeline_out
    reg = arts["register"]
    gates = [GateResult(**g) for g in reg.manifest["gates"]]
    upstream = {s: arts[s] for s in ("normalize", "tokenizer", "shards", "pretrain", "evaluate", "audit")}
    again = card(lc, upstream, gates, "pending", reg.manifest["passed"])
    assert again == (reg.path / "model_card.md").read_text(encoding="utf-8")
    # the data and tokenizer sections come from the register stage's declared context outputs, handed in
    bare = card(lc, {s: arts[s] for s in ("pretrain", "evaluate", "audit")}, gates, "pending", reg.manifest["passed"])
    assert bare != again and f"vocabulary {arts['tokenizer'].manifest['vocab_size']:,}" not in bare
    # the typed artifacts and their raw manifests give the same card (the types' fields are the manifest keys)
    from mlm_core.register.modelcard import model_card
    kw = dict(name="m", version=1, fingerprints={}, data={}, evaluation={}, audit={}, gates=gates, promoted=False)
    typed = model_card(tokenizer=arts["tokenizer"], training=arts["pretrain"], **kw)
    raw = model_card(tokenizer=arts["tokenizer"].manifest, training=arts["pretrain"].manifest, **kw)
    assert typed == raw and f"vocabulary {arts['tokenizer'].manifest['vocab_size']:,}" in typed


def test_every_stage_is_handed_typed_upstream_and_context_outputs(pipeline_out, tmp_path, monkeypatch):  # noqa: F811
    """``stages.execute`` loads each upstream output (and each output the spec declares as ``context``) as its
    type and hands it to the stage's ``run``: recorded here by wrapping every stage's run, on a copy of the store,
    each stage forced. register's context is the data behind its model card; audit's the normalized corpus."""
    import dataclasses

    from mlm_core import artifacts, stages
    lc, arts = pipeline_out
    shutil.copytree(lc.workdir, tmp_path / "work")
    lc2 = dataclasses.replace(lc, config=lc.config.model_copy(update={"workdir": str(tmp_path / "work")}))
    seen = {}

    def recording(spec):
        def run(lc_, upstream, out_dir, **kw):
            seen[spec.name] = {k: type(v) for k, v in upstream.items()}
            return spec.run(lc_, upstream, out_dir, **kw)
        return dataclasses.replace(spec, run=run)
    for name in ("tokenizer", "pretrain", "evaluate", "audit", "register"):
        monkeypatch.setitem(stages.STAGES, name, recording(stages.STAGES[name]))
    plans = stages.plan(lc2)
    for name in ("tokenizer", "pretrain", "evaluate", "audit", "register"):
        stages.execute(lc2, name, plans, force=True)
    T = artifacts.ARTIFACT_TYPES
    assert seen["tokenizer"] == {"normalize": T["normalize"]}
    assert seen["pretrain"] == {s: T[s] for s in ("normalize", "tokenizer", "shards")}
    assert seen["evaluate"] == {s: T[s] for s in ("normalize", "shards", "pretrain")}
    assert seen["audit"] == {"pretrain": T["pretrain"], "normalize": T["normalize"]}
    assert seen["register"] == {s: T[s] for s in ("pretrain", "evaluate", "audit", "normalize", "tokenizer", "shards")}


def test_a_manifest_missing_a_key_of_its_type_is_never_complete(tmp_path):
    """The store parses what a stage returns before the output becomes complete: a missing required key fails
    the write (kept under .failed-<fp> for inspection) instead of leaving an output no reader can parse."""
    from mlm_core.artifacts import ManifestError
    from mlm_core.store import StageStore
    store = StageStore(tmp_path)
    with pytest.raises(ManifestError, match="'counts'"):
        store.write("normalize", "f" * 16, lambda out: {"languages": {}}, {"config": {}})
    assert not store.is_complete("normalize", "f" * 16) and store.failed_dir("normalize", "f" * 16).is_dir()
    ok = store.write("normalize", "e" * 16, lambda out: {"languages": {}, "counts": {}}, {"config": {}})
    assert type(ok).__name__ == "NormalizedCorpus" and store.load("normalize", "e" * 16) == ok
    # an output a reader can do without (context): None when absent, unreadable or short of a key, else the type
    assert store.load_optional("normalize", "e" * 16) == ok
    assert store.load_optional("normalize", None) is None and store.load_optional("normalize", "d" * 16) is None
    bad = tmp_path / "normalize" / ("c" * 16)
    bad.mkdir()
    (bad / "manifest.json").write_text('{"languages": {}}', encoding="utf-8")
    assert store.load_optional("normalize", "c" * 16) is None


STAGE_PACKAGES = ("normalize", "tokenizer", "shards", "train", "evaluate", "audit", "register", "masking", "bias",
                  "model")


def test_no_stage_code_opens_the_store():
    """Stages take typed inputs, never a store handle (issue 22 item 1): nothing under a stage package names
    StageStore or walks from an output folder up to the store (``.parent.parent``). Fails on the code before this
    change (audit's projection, the register stage's model card, PMI's tokenizer lookup)."""
    import ast

    from conftest import REPO
    bad = []
    for pkg in STAGE_PACKAGES:
        for path in sorted((REPO / "mlm_core" / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Name) and node.id == "StageStore" or \
                        isinstance(node, ast.alias) and node.name == "StageStore":
                    bad.append(f"{path.relative_to(REPO)}: StageStore")
                if isinstance(node, ast.Attribute) and node.attr == "parent" and \
                        isinstance(node.value, ast.Attribute) and node.value.attr == "parent":
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert bad == []
