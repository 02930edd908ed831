"""Register stage and registry: the model card from a real pipeline output, resolving registry addresses
without leaking folders or creating databases, and model names that hold quotes."""
from __future__ import annotations

import re
import types

import pytest

from conftest import write_lines

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LANGS = ("en", "ru")


@pytest.fixture(scope="module")
def pipeline_out(tmp_path_factory, shared_data):
    """Every stage (normalize ... register) run through the stage engine on ~120 real lines per language."""
    from mlm_core import stages
    from mlm_core.config.io import load_config
    root = tmp_path_factory.mktemp("register")
    sources = {}
    for lang in LANGS:
        lines = [ln for ln in (shared_data / "text" / f"{lang}.txt").read_text(encoding="utf-8").splitlines()
                 if len(ln) > 40][:120]
        sources[lang] = {"paths": [str(write_lines(root / f"{lang}.txt", lines))]}
    lc = load_config(root / "cfg.yaml", raw={
        "name": "regtest", "workdir": str(root / "work"), "sources": sources, "normalize": {"workers": 1},
        "tokenizer": {"vocab_size": 400, "heldout_docs": 5, "min_vocab_fraction": 0.1, "max_fertility": 20},
        "shards": {"seq_len": 32, "workers": 1},
        "pretrain": {"model": {"size": "tiny", "max_positions": 32}, "steps": 4, "batch_size": 4,
                     "eval_every": 4, "checkpoint_every": 4, "warmup_steps": 1},
        "registry": {"model_name": "regtest-model", "gates": {"min_top1_over_baseline": -1.0}}})
    plans = stages.plan(lc)
    arts = {name: stages.execute(lc, name, plans)[0] for name in stages.STAGES}
    return lc, arts


def _row(card: str, lang: str) -> list[str]:
    """The cells of the first table row of ``card`` starting with ``| lang |``."""
    line = next(ln for ln in card.splitlines() if ln.startswith(f"| {lang} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_model_card_data_and_tokenizer_sections_come_from_the_upstream_outputs(pipeline_out):
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer
    lc, arts = pipeline_out
    card = (arts["register"].path / "model_card.md").read_text(encoding="utf-8")
    data = card.split("## Training data", 1)[1].split("## Tokenizer", 1)[0]
    tok_section = card.split("## Tokenizer", 1)[1].split("## Training", 1)[0]
    assert "Languages: en, ru." in data and "_(none)_" not in data
    assert "_(none)_" not in tok_section
    norm = arts["normalize"].path
    for lang in LANGS:
        docs = pq.read_table(norm / "docs" / f"{lang}.parquet")           # the documents actually kept
        cells = _row(data, lang)
        assert cells[1] == f"{docs.num_rows:,}"
        assert cells[2] == f"{sum(len(t) for t in docs.column('text').to_pylist()):,}"   # characters
        p = float(cells[7])
        assert 0 < p < 1                                                   # p(l) from the sampling table
    # the two sampling weights are a distribution
    assert sum(float(_row(data, lang)[7]) for lang in LANGS) == pytest.approx(1.0, abs=2e-4)
    tok = Tokenizer.from_file(str(arts["tokenizer"].path / "tokenizer.json"))
    assert re.search(rf"Algorithm: bpe, vocabulary {tok.get_vocab_size():,} \(requested 400\)", tok_section)
    for lang in LANGS:
        fertility = float(_row(tok_section, lang)[1])
        assert 1.0 <= fertility < 20                                       # tokens per word, a real measurement


# ---- registry -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def registry(tmp_path_factory, pipeline_out):
    """A SQLite registry holding the pipeline's exported model as version 1 of ``m`` (alias candidate)."""
    from tasks import tracking
    lc, arts = pipeline_out
    db = tmp_path_factory.mktemp("registry") / "mlflow.db"
    uri = f"sqlite:///{db}"
    client = tracking.mlflow_client(uri)
    exp = client.create_experiment("regtest", artifact_location=str(db.parent / "artifacts"))
    run = client.create_run(exp)
    client.log_artifacts(run.info.run_id, str(arts["pretrain"].path / "hf"), "model/hf")
    client.set_terminated(run.info.run_id)
    version = tracking.register_version(uri, "m", run.info.run_id, "model/hf")
    tracking.set_alias(uri, "m", "candidate", version)
    return uri, client, run.info.run_id


def test_resolve_model_removes_its_download_folder(registry, tmp_path, monkeypatch):
    import tempfile
    from tasks.registry import resolve_model
    uri, _, _ = registry
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))      # count only this test's temporary folders
    before = sorted(p.name for p in tmp_path.iterdir())
    for _ in range(3):
        with resolve_model("models:/m@candidate", uri) as folder:
            assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
            assert str(folder).startswith(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_version_lookup_with_quotes_in_the_model_name(registry):
    from tasks import tracking
    from tasks.registry import _version_for
    uri, client, run_id = registry
    fp = "0123456789abcdef"
    for name in ("it's", 'say "hi"', "a'b\"c", "its"):
        tracking.register_version(uri, name, run_id, "model/hf", tags={"pretrain_fingerprint": fp})
    tracking.register_version(uri, "its", run_id, "model/hf", tags={"pretrain_fingerprint": fp})
    tracker = types.SimpleNamespace(client=client)
    assert _version_for(tracker, "it's", fp) == 1
    assert _version_for(tracker, 'say "hi"', fp) == 1
    assert _version_for(tracker, "a'b\"c", fp) == 1
    assert _version_for(tracker, "its", fp) == 2                   # another model's versions do not count
    assert _version_for(tracker, "it's", "fedcba9876543210") is None
    from tasks.registry import RegistryError
    with pytest.raises(RegistryError, match="not a hex digest"):
        _version_for(tracker, "it's", "x' OR name = 'y")


def test_registry_address_without_a_config_creates_nothing_in_the_cwd(tmp_path, monkeypatch, capsys, registry):
    import json
    import shutil
    import sqlite3
    from flows.cli import main
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLM_TRACKING_URI", raising=False)
    assert main(["fill-mask", "models:/m@champion", "a [MASK] b"]) == 2
    err = capsys.readouterr().err
    assert "no model registry" in err and "--config" in err and "MLM_TRACKING_URI" in err
    assert list(tmp_path.iterdir()) == []
    # a $MLM_TRACKING_URI naming a database that does not exist is not created either
    monkeypatch.setenv("MLM_TRACKING_URI", f"sqlite:///{tmp_path}/nowhere/mlflow.db")
    assert main(["fill-mask", "models:/m@champion", "a [MASK] b"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    # the demo's registry (workdir .mlm in the current directory), when it exists, is used as is
    monkeypatch.delenv("MLM_TRACKING_URI")
    (tmp_path / ".mlm").mkdir()
    src = registry[0][len("sqlite:///"):]
    with sqlite3.connect(src) as a, sqlite3.connect(tmp_path / ".mlm" / "mlflow.db") as b:
        a.backup(b)
    assert main(["fill-mask", "models:/m@candidate", "a [MASK] b", "--top-k", "2", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)[0]) == 2
    assert [p.name for p in tmp_path.iterdir()] == [".mlm"] and [p.name for p in (tmp_path / ".mlm").iterdir()] == ["mlflow.db"]
    shutil.rmtree(tmp_path / ".mlm")
