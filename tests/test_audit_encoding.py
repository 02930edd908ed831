"""Issue 24 item 6: audit and evaluate files that are not UTF-8 are caught when the config is validated and the
stage planned (not by a raw UnicodeDecodeError in the audit, after pretraining): the error names the file, the
line, the byte offset and the byte. An audit file may declare its encoding; plain paths keep their meaning and
the fingerprints they had."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, write_lines
from mlm_core import stages
from mlm_core.config.io import ConfigError, load_config
from mlm_core.errors import PlanError

HEADER = "sent_more,sent_less,stereo_antistereo,bias_type\n"
# "Zij is een verpleegster." with Mac-Roman bytes: 0x8e is é in Mac-Roman, invalid as a UTF-8 start byte
GOOD = "Hij is een ingenieur.,Zij is een ingenieur.,stereo,gender\n"
BAD_ROW = b"Het caf\x8e is vol mannen.,Het caf\x8e is vol vrouwen.,stereo,gender\n"


def _files(tmp_path):
    write_lines(tmp_path / "en.txt", [f"The quick brown fox number {i} jumps." for i in range(10)])
    write_lines(tmp_path / "nl.txt", [f"De snelle bruine vos nummer {i} springt." for i in range(10)])
    nl = tmp_path / "crows_nl.csv"
    nl.write_bytes((HEADER + GOOD + GOOD).encode() + BAD_ROW)
    en = tmp_path / "crows_en.csv"
    en.write_text(HEADER + GOOD * 3, encoding="utf-8")
    return en, nl


def _cfg(tmp_path, crows) -> "Path":  # noqa: F821
    raw = {"workdir": str(tmp_path / "work"), "sources": {"en": {"paths": ["en.txt"]}, "nl": {"paths": ["nl.txt"]}},
           "audit": {"crows_pairs": crows}}
    f = tmp_path / "cfg.yaml"
    f.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return f


def _cli(*args, cwd):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def test_config_validate_names_file_line_offset_and_byte(tmp_path):
    en, nl = _files(tmp_path)
    cfg = _cfg(tmp_path, {"en": "crows_en.csv", "nl": "crows_nl.csv"})
    offset = len((HEADER + GOOD + GOOD).encode()) + len(b"Het caf")      # computed from the bytes written here
    r = _cli("config", "validate", str(cfg), cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"audit.crows_pairs.nl: {nl} is not valid utf-8: line 4, byte offset {offset}: byte 0x8e" in r.stderr, \
        r.stderr
    assert "encoding: mac_roman" in r.stderr and "crows_en.csv" not in r.stderr
    # planning refuses it too (so `mlm run` stops before any stage, not in the audit after pretraining)
    with pytest.raises(PlanError, match=r"audit\.crows_pairs\.nl: .* line 4, byte offset \d+: byte 0x8e"):
        stages.plan(load_config(cfg))


def test_encoding_option_reads_the_file_and_plain_paths_keep_their_fingerprint(tmp_path):
    from mlm_core.audit import load_crows_csv
    en, nl = _files(tmp_path)
    plain = stages.plan(load_config(_cfg(tmp_path, {"en": "crows_en.csv"})))
    same = stages.plan(load_config(_cfg(tmp_path, {"en": {"path": "crows_en.csv"}})))
    fps = {n: p.fingerprint for n, p in plain.items()}
    # a plain path string is dumped as before (the fingerprint input is unchanged)
    assert load_config(_cfg(tmp_path, {"en": "crows_en.csv"})).config.audit.model_dump()["crows_pairs"] == \
        {"en": "crows_en.csv"}
    assert fps["pretrain"] == same["pretrain"].fingerprint
    cfg = _cfg(tmp_path, {"en": "crows_en.csv", "nl": {"path": "crows_nl.csv", "encoding": "mac_roman"}})
    lc = load_config(cfg)
    assert _cli("config", "validate", str(cfg), cwd=tmp_path).returncode == 0
    stages.plan(lc)
    pairs = load_crows_csv(nl, encoding="mac_roman")
    assert pairs[-1].sent_more == "Het café is vol mannen."
    with pytest.raises(Exception, match=r"line 4, byte offset \d+: byte 0x8e"):
        load_crows_csv(nl)                     # the reader itself names the byte too (e.g. `mlm audit`)


def test_unknown_encoding_is_a_config_error(tmp_path):
    _files(tmp_path)
    with pytest.raises(ConfigError, match=r"audit\.crows_pairs: nl\.encoding: unknown text encoding 'klingon'"):
        load_config(_cfg(tmp_path, {"nl": {"path": "crows_nl.csv", "encoding": "klingon"}}))


def test_evaluate_conllu_not_utf8_is_named(tmp_path):
    _files(tmp_path)
    conllu = tmp_path / "en.conllu"
    conllu.write_bytes(b"# sent_id = 1\n1\tCaf\xe9\tcaf\xe9\tNOUN\t_\t_\t0\troot\t_\t_\n\n")
    raw = {"workdir": str(tmp_path / "work"), "sources": {"en": {"paths": ["en.txt"]}, "nl": {"paths": ["nl.txt"]}},
           "evaluate": {"upos": {"source_lang": "en", "train": "en.conllu", "targets": {"nl": "en.conllu"}}}}
    f = tmp_path / "cfg.yaml"
    f.write_text(yaml.safe_dump(raw), encoding="utf-8")
    r = _cli("config", "validate", str(f), cwd=tmp_path)
    assert r.returncode == 2
    offset = len(b"# sent_id = 1\n1\tCaf")
    assert f"evaluate.upos.train: {conllu} is not valid utf-8: line 2, byte offset {offset}: byte 0xe9" in r.stderr, \
        r.stderr
    with pytest.raises(PlanError, match=f"evaluate.upos.train: .* line 2, byte offset {offset}: byte 0xe9"):
        stages.plan(load_config(f))
