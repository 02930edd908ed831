"""Stage store and planning: fingerprints, atomic writes, reuse, --only/--from, status, leftovers."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, write_lines
from mlm_core import stages
from mlm_core.config.io import load_config
from mlm_core.errors import PlanError
from mlm_core.store import MANIFEST, StageStore

DATA_STAGES = ("normalize", "tokenizer", "shards")
EN = [f"The quick brown fox number {i} jumps over the lazy dog." for i in range(40)]
FR = [f"Le renard brun numéro {i} saute par-dessus le chien paresseux." for i in range(40)]


@pytest.fixture
def cfg_raw(tmp_path):
    en = write_lines(tmp_path / "en.txt", EN)
    fr = write_lines(tmp_path / "fr.txt", FR)
    return {"workdir": str(tmp_path / "work"), "sources": {"en": {"paths": [str(en)]}, "fr": {"paths": [str(fr)]}},
            "normalize": {"workers": 1}, "tokenizer": {"vocab_size": 300, "heldout_docs": 5, "min_vocab_fraction": 0.1},
            "shards": {"seq_len": 16, "workers": 1}}


def lc_of(tmp_path, raw, *overrides):
    return load_config(tmp_path / "cfg.yaml", overrides=list(overrides), raw=raw)


def test_fingerprints_isolate_stages(tmp_path, cfg_raw):
    base = stages.plan(lc_of(tmp_path, cfg_raw))
    tok = stages.plan(lc_of(tmp_path, cfg_raw, "tokenizer.vocab_size=400"))
    assert tok["normalize"].fingerprint == base["normalize"].fingerprint          # tokenizer option: normalize kept
    assert tok["tokenizer"].fingerprint != base["tokenizer"].fingerprint
    assert tok["shards"].fingerprint != base["shards"].fingerprint                 # ...downstream invalidated
    norm = stages.plan(lc_of(tmp_path, cfg_raw, "normalize.min_chars=7"))
    for name in stages.STAGES:                                                     # normalize option: all invalidated
        assert norm[name].fingerprint != base[name].fingerprint, name
    speed = stages.plan(lc_of(tmp_path, cfg_raw, "normalize.workers=2", "shards.workers=2"))
    assert {n: p.fingerprint for n, p in speed.items()} == {n: p.fingerprint for n, p in base.items()}


def test_run_reuse_status_and_stale(tmp_path, cfg_raw):
    lc = lc_of(tmp_path, cfg_raw)
    plans = stages.plan(lc)
    assert {p.status for p in plans.values()} == {"missing"}
    for name in DATA_STAGES:
        art, hit = stages.execute(lc, name, plans)
        assert not hit and (art.path / MANIFEST).is_file()
    plans = stages.plan(lc)
    assert [plans[n].status for n in DATA_STAGES] == ["done"] * 3
    for name in DATA_STAGES:
        _, hit = stages.execute(lc, name, plans)
        assert hit
    changed = stages.plan(lc_of(tmp_path, cfg_raw, "tokenizer.vocab_size=350"))
    assert [changed[n].status for n in DATA_STAGES] == ["done", "stale", "stale"]
    assert changed["pretrain"].status == "missing"


def test_only_needs_stored_upstream_and_names_it(tmp_path, cfg_raw):
    lc = lc_of(tmp_path, cfg_raw)
    plans = stages.plan(lc)
    with pytest.raises(PlanError, match=r"needs the output of 'normalize'.*--only normalize"):
        stages.select(plans, only="tokenizer")
    with pytest.raises(PlanError, match="unknown stage"):
        stages.select(plans, only="tokeniser")
    stages.execute(lc, "normalize", plans)
    plans = stages.plan(lc)
    assert stages.select(plans, only="tokenizer") == ["tokenizer"]
    assert stages.select(plans, from_="tokenizer") == [n for n in stages.STAGES if n != "normalize"]
    with pytest.raises(PlanError, match="stage 'evaluate' needs the output of 'shards'"):
        stages.select(plans, from_="evaluate")


def test_manifest_records_config_upstream_versions_and_checksums(tmp_path, cfg_raw):
    lc = lc_of(tmp_path, cfg_raw)
    plans = stages.plan(lc)
    stages.execute(lc, "normalize", plans)
    art, _ = stages.execute(lc, "tokenizer", plans)
    m = json.loads((art.path / MANIFEST).read_text())
    assert m["upstream"] == {"normalize": plans["normalize"].fingerprint}
    assert m["config"]["tokenizer"]["vocab_size"] == 300
    assert "tokenizers" in m["libraries"] and "pyarrow" in m["libraries"]
    assert len(m["files"]["tokenizer.json"]["sha256"]) == 64


def test_leftover_temporary_folder_is_ignored_and_cleaned(tmp_path, cfg_raw):
    lc = lc_of(tmp_path, cfg_raw)
    plans = stages.plan(lc)
    fp = plans["normalize"].fingerprint
    dead = tmp_path / "work" / "normalize" / f".tmp-{fp}-999999999-deadbeef"   # a killed run's half-written output
    dead.mkdir(parents=True)
    (dead / "docs").mkdir()
    (dead / MANIFEST).write_text("{}")
    assert stages.plan(lc)["normalize"].status == "missing"
    art, hit = stages.execute(lc, "normalize", plans)
    assert not hit and not dead.exists()
    store = StageStore(lc.workdir)
    assert [a.fingerprint for a in store.complete_outputs("normalize")] == [fp]


def test_failed_stage_leaves_no_complete_output(tmp_path, cfg_raw):
    lc = lc_of(tmp_path, cfg_raw, "normalize.min_chars=1000", "normalize.max_chars=2000")
    plans = stages.plan(lc)
    with pytest.raises(Exception, match="quarantine rate"):
        stages.execute(lc, "normalize", plans)
    assert stages.plan(lc)["normalize"].status == "missing"


def test_status_cli_tells_the_truth(tmp_path, cfg_raw):
    import yaml
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(cfg_raw))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = lambda *a: subprocess.run([sys.executable, "-m", "flows.cli", *a], capture_output=True, text=True,  # noqa: E731
                                    cwd=tmp_path, env=env)
    out = run("status", str(cfg), "--json")
    assert out.returncode == 0, out.stderr
    assert [r["status"] for r in json.loads(out.stdout)] == ["missing"] * len(stages.STAGES)
    stages.execute(lc_of(tmp_path, cfg_raw), "normalize", stages.plan(lc_of(tmp_path, cfg_raw)))
    rows = json.loads(run("status", str(cfg), "--json").stdout)
    assert rows[0]["status"] == "done" and rows[0]["bytes"] > 0
    text = run("status", str(cfg), "--set", "normalize.min_chars=9").stdout
    assert "normalize    stale" in text
    bad = run("run", str(cfg), "--only", "shards")
    assert bad.returncode == 2 and f"run `mlm run {cfg} --only tokenizer`" in bad.stderr   # the user's own command
