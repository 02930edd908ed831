"""CLI details a user meets first (issue 14 item 7): `config validate` checks the files a config names, the
"run first" hint is the user's own command, and `mlm status` finds the config when none is given.
No Prefect server: every command here stops before Prefect starts."""
from __future__ import annotations

import shlex

import pytest
import yaml

from conftest import write_lines
from flows.cli import main

EN = [f"The quick brown fox number {i} jumps over the lazy dog." for i in range(20)]


def _config(folder, name="cfg.yaml", **extra) -> tuple:
    """A config whose paths are relative to its own folder, as a user writes them."""
    write_lines(folder / "data" / "en" / "a.txt", EN)
    write_lines(folder / "data" / "fr.txt", EN)
    raw = {"name": "hints", "workdir": str(folder / "work"),
           "sources": {"en": {"paths": ["data/en/*.txt"]}, "fr": {"paths": ["data/fr.txt"]}},
           "normalize": {"workers": 1}, **extra}
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path, raw


# ------------------------------------------------------------------------------------ config validate
def test_validate_checks_source_globs_and_files(tmp_path, capsys):
    cfg, _ = _config(tmp_path)
    assert main(["config", "validate", str(cfg)]) == 0
    assert "valid" in capsys.readouterr().out

    # a glob matching nothing: the key path, the pattern as written and the folder it is relative to
    assert main(["config", "validate", str(cfg), "--set", 'sources.fr.paths=["data/fr/*.txt"]']) == 2
    err = capsys.readouterr().err
    assert f"sources.fr.paths[0]: no file matches 'data/fr/*.txt' (relative to {tmp_path})" in err, err
    assert "--no-paths" in err and "Traceback" not in err
    # --no-paths: only the schema is checked
    assert main(["config", "validate", str(cfg), "--no-paths", "--set", 'sources.fr.paths=["data/fr/*.txt"]']) == 0
    assert "valid" in capsys.readouterr().out


def test_validate_lists_every_missing_file(tmp_path, capsys):
    cfg, _ = _config(tmp_path, audit={"templates": {"en": "bias/en.yaml"}},
                     evaluate={"retrieval": {"en": "data/fr.txt", "fr": "/nonexistent/aligned.txt"}})
    (tmp_path / "data" / "empty").mkdir()
    assert main(["config", "validate", str(cfg), "--set", 'sources.en.paths=["data/en/*.txt", "data/empty/*"]',
                 "--set", 'sources.fr.paths=["data/en"]']) == 2
    err = capsys.readouterr().err
    assert "4 named files are missing" in err, err
    assert "sources.en.paths[1]: no file matches 'data/empty/*'" in err      # a glob that matches only nothing
    assert "sources.fr.paths[0]: 'data/en' is a folder, not a file" in err
    assert f"audit.templates.en: file not found: 'bias/en.yaml' (relative to {tmp_path})" in err
    assert "evaluate.retrieval.fr: file not found: '/nonexistent/aligned.txt'\n" in err + "\n"  # absolute: no base
    assert "sources.en.paths[0]" not in err and "evaluate.retrieval.en" not in err   # present ones not listed


def test_shipped_demo_config_validates_with_its_files(capsys):
    from conftest import REPO
    assert main(["config", "validate", str(REPO / "configs" / "demo.yaml")]) == 0
    assert "valid" in capsys.readouterr().out


# ------------------------------------------------------------------------------------ the "run first" hint
def test_run_first_hint_is_the_users_command(tmp_path, capsys):
    """`mlm run CFG --set X --only shards` with nothing stored names `mlm run CFG --set X --only normalize`,
    quoted so that pasting it into a shell gives back the same words."""
    cfg, _ = _config(tmp_path / "my configs", name="a b.yaml")
    override = "normalize.min_chars=9"
    assert main(["run", str(cfg), "--set", override, "--only", "shards"]) == 2
    err = capsys.readouterr().err
    hinted = err.split("run `", 1)[1].split("`", 1)[0]
    assert shlex.split(hinted) == ["mlm", "run", str(cfg), "--set", override, "--only", "normalize"], err
    assert "CONFIG" not in err


def test_run_first_hint_from_the_flow(tmp_path):
    """The stage flows (Prefect UI reruns) raise the same hint, with the flow's config path and overrides."""
    from flows.pipeline import run_pipeline
    from mlm_core.errors import PlanError
    cfg, _ = _config(tmp_path, tracking={"enabled": False})
    with pytest.raises(PlanError) as e:
        run_pipeline(str(cfg), ["shards.seq_len=32"], only="shards")
    hinted = str(e.value).split("run `", 1)[1].split("`", 1)[0]
    assert shlex.split(hinted) == ["mlm", "run", str(cfg), "--set", "shards.seq_len=32", "--only", "normalize"]


# ------------------------------------------------------------------------------------ mlm status, no argument
def test_status_without_argument_finds_the_config(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["status"]) == 2                                   # nothing to find: say what was looked for
    err = capsys.readouterr().err
    assert "no config given" in err and "mlm.yaml" in err and "configs/*.yaml" in err

    _config(tmp_path / "configs", name="only.yaml")                # exactly one configs/*.yaml: used
    assert main(["status", "--json"]) == 0
    out = capsys.readouterr()
    assert "using configs/only.yaml" in out.err
    import json
    rows = json.loads(out.out)                                     # stdout stays pure JSON
    assert [r["status"] for r in rows][0] == "missing"
    assert str(tmp_path / "configs" / "work") in rows[0]["path"]

    _config(tmp_path / "configs", name="other.yaml")               # two: ambiguous, both listed
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert "2 configs in configs/ (configs/only.yaml, configs/other.yaml)" in err, err

    _config(tmp_path, name="mlm.yaml")                             # ./mlm.yaml wins over configs/
    assert main(["status"]) == 0
    assert "using mlm.yaml" in capsys.readouterr().err


def test_status_without_argument_with_the_shipped_configs(tmp_path):
    """Issue 24 item 12: the repository's own configs/ (demo, adapt, real...): `mlm status` with no argument
    fails (a real process) with every config as a command, none of them offered as "the" one."""
    import os
    import shutil
    import subprocess
    import sys

    from conftest import REPO
    shipped = sorted(p.name for p in (REPO / "configs").glob("*.yaml"))
    assert {"adapt.yaml", "demo.yaml", "real.yaml"} <= set(shipped)
    (tmp_path / "configs").mkdir()
    for name in shipped:
        shutil.copy(REPO / "configs" / name, tmp_path / "configs" / name)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "flows.cli", "status"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 2
    assert f"{len(shipped)} configs in configs/" in r.stderr
    lines = [line.strip() for line in r.stderr.splitlines()[1:]]
    assert lines == [f"mlm status configs/{name}" for name in shipped], r.stderr
    assert "e.g." not in r.stderr
    assert "./mlm.yaml" in r.stderr
