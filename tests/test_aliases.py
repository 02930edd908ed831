"""Issue 24 item 12 (registry): after `mlm rollback` the version's alias.<a>.previous names the version it came
from (not `none`), the history still walks back; `mlm promote` / `mlm rollback` of a model that does not exist
say so. A plain SQLite registry, versions created by hand; the CLI as a real process."""
from __future__ import annotations

import json

import os
import subprocess
import sys

import pytest

from conftest import REPO

NAME = "alias-test"


@pytest.fixture
def registry(tmp_path):
    from flows.cli.util import prepare_env
    prepare_env()
    from tasks.tracking import mlflow_client
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow_client(uri)
    client.create_registered_model(NAME)
    vs = []
    for _ in range(3):
        vs.append(int(client.create_model_version(NAME, source=str(tmp_path)).version))
    for v in vs:
        client.set_model_version_tag(NAME, str(v), "gates", "passed")
    return client, uri, vs


def test_rollback_records_where_it_came_from_and_walks_back(registry, monkeypatch, capsys):
    from flows.cli import main
    from tasks import aliases
    client, uri, (v1, v2, v3) = registry
    monkeypatch.setenv("MLM_TRACKING_URI", uri)
    for v in (v1, v2, v3):
        assert main(["promote", NAME, "--version", str(v), "--reason", f"release {v}"]) == 0
    assert main(["rollback", NAME, "--reason", "v3 regressed"]) == 0
    tags = client.get_model_version(NAME, str(v2)).tags
    assert aliases.holder(client, NAME, "champion") == v2
    assert json.loads(tags["alias.champion"])["previous"] == str(v3)             # was "none"
    assert json.loads(tags["alias.champion"])["by"] == "rollback"
    # the history is kept: the next rollback goes on to v1, never back to v3
    assert main(["rollback", NAME, "--reason", "v2 too"]) == 0
    assert aliases.holder(client, NAME, "champion") == v1
    assert json.loads(client.get_model_version(NAME, str(v1)).tags["alias.champion"])["previous"] == str(v2)
    capsys.readouterr()
    assert main(["rollback", NAME, "--reason", "once more"]) != 0      # nothing held it before v1
    assert aliases.holder(client, NAME, "champion") == v1


@pytest.mark.heavy
def test_promote_of_a_model_that_does_not_exist_says_so(registry, tmp_path):
    _, uri, _ = registry
    env = {**os.environ, "MLM_TRACKING_URI": uri, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    for cmd in (["promote", "no-such", "--reason", "x"], ["rollback", "no-such", "--reason", "x"]):
        r = subprocess.run([sys.executable, "-m", "flows.cli", *cmd], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=300)
        assert r.returncode != 0
        assert "model 'no-such' does not exist in the registry (registered models: alias-test)" in r.stderr, r.stderr
        assert "@candidate does not exist" not in r.stderr and "pass --version" not in r.stderr
