"""Config: parsing, unknown keys with suggestions, wrong types, overrides, cross-field checks, schema in sync."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlm_core.config.io import ConfigError, load_config, schema_text

REPO = Path(__file__).resolve().parent.parent
SRC = {"en": {"paths": ["x.txt"]}, "fr": {"paths": ["y.txt"]}}


SHIPPED_CONFIG_DIRS = ("configs", "configs/experiments", "configs/sweeps")


@pytest.mark.parametrize("folder", SHIPPED_CONFIG_DIRS)
def test_every_shipped_config_parses(folder):
    """Every YAML in the folder parses with its own loader: a sweep file (it names a ``base:`` pipeline config)
    with ``mlm_core.sweep.load_sweep``, which also validates the config of every variant; any other file with
    ``load_config``. A file that is neither fails here with its loader's one-line error naming it."""
    import yaml

    from mlm_core.sweep import load_sweep
    files = sorted((REPO / folder).glob("*.yaml"))
    assert files, f"no configs shipped in {folder}/"
    kinds = {}
    for f in files:
        raw = yaml.safe_load(f.read_text(encoding="utf-8"))
        assert isinstance(raw, dict), f"{f}: the top level is not a mapping"
        if "base" in raw:
            sweep = load_sweep(f)
            assert sweep.runs, f"{f}: a sweep with no runs"
            kinds[f.name] = "sweep"
        else:
            load_config(f)
            kinds[f.name] = "pipeline"
    if folder == "configs/sweeps":
        assert set(kinds.values()) == {"sweep"}, kinds
    if folder == "configs":
        assert set(kinds.values()) == {"pipeline"}, kinds


def test_typo_names_full_path_and_closest_key():
    with pytest.raises(ConfigError) as e:
        load_config(raw={"sources": SRC, "tokenizer": {"vocab_sise": 100}})
    assert "tokenizer.vocab_sise: unknown key (did you mean vocab_size?)" in str(e.value)
    with pytest.raises(ConfigError, match=r"sources\.en\.text_fild: unknown key \(did you mean text_field\?\)"):
        load_config(raw={"sources": {"en": {"paths": ["a"], "text_fild": "t"}}})
    with pytest.raises(ConfigError, match=r"normalise: unknown key \(did you mean normalize\?\)"):
        load_config(raw={"sources": SRC, "normalise": {}})


def test_wrong_type_names_key_and_value():
    with pytest.raises(ConfigError, match=r"normalize\.min_chars: .*integer.*\(got 'many'\)"):
        load_config(raw={"sources": SRC, "normalize": {"min_chars": "many"}})


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml: config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("sources:\n  en: {paths: [a.txt]}\nworkdri: x\n")
    with pytest.raises(ConfigError, match=r"typo\.yaml: invalid config\n  workdri: unknown key \(did you mean workdir\?\)"):
        load_config(typo)


def test_cross_field_checks():
    with pytest.raises(ConfigError, match="'xx' is not an ISO 639-1 language code"):
        load_config(raw={"sources": {"xx": {"paths": ["a"]}}})
    with pytest.raises(ConfigError, match=r"shards\.sampling_alpha: Input should be greater than 0"):
        load_config(raw={"sources": SRC, "shards": {"sampling_alpha": 0}})
    with pytest.raises(ConfigError, match=r"shards\.sampling_alpha: Input should be less than or equal to 1"):
        load_config(raw={"sources": SRC, "shards": {"sampling_alpha": 1.5}})
    with pytest.raises(ConfigError, match=r"language\(s\) \['de'\] not in sources"):
        load_config(raw={"sources": SRC, "tokenizer": {"max_fertility_per_lang": {"de": 3.0}}})
    with pytest.raises(ConfigError, match="exactly one of 'paths' or 'dataset'"):
        load_config(raw={"sources": {"en": {}}})
    with pytest.raises(ConfigError, match=r"shards\.seq_len: Input should be greater than or equal to 8"):
        load_config(raw={"sources": SRC, "shards": {"seq_len": 4}})
    with pytest.raises(ConfigError, match=r"shards\.seq_len \(256\) exceeds pretrain\.model\.max_positions \(128\)"):
        load_config(raw={"sources": SRC, "shards": {"seq_len": 256}, "pretrain": {"model": {"max_positions": 128}}})
    with pytest.raises(ConfigError, match=r"pretrain\.masking\.rate: Input should be less than 1"):
        load_config(raw={"sources": SRC, "pretrain": {"masking": {"rate": 1.2}}})
    with pytest.raises(ConfigError, match="min_chars .* must be <= max_chars"):
        load_config(raw={"sources": SRC, "normalize": {"min_chars": 10, "max_chars": 5}})


def test_overrides_parse_yaml_values_and_paths():
    lc = load_config(raw={"sources": SRC}, overrides=["normalize.min_chars=12", "normalize.lowercase=true",
                                                      "tokenizer.algorithm=unigram", "sources.de.paths=[z.txt]"])
    cfg = lc.config
    assert cfg.normalize.min_chars == 12 and cfg.normalize.lowercase is True
    assert cfg.tokenizer.algorithm == "unigram" and cfg.languages == ["de", "en", "fr"]
    with pytest.raises(ConfigError, match=r"normalize\.min_chr: unknown key \(did you mean min_chars\?\)"):
        load_config(raw={"sources": SRC}, overrides=["normalize.min_chr=3"])
    with pytest.raises(ConfigError, match="expected KEY.PATH=VALUE"):
        load_config(raw={"sources": SRC}, overrides=["normalize.min_chars"])


def test_config_is_frozen():
    cfg = load_config(raw={"sources": SRC}).config
    with pytest.raises(Exception):
        cfg.normalize.min_chars = 3


def test_json_schema_in_sync_with_models():
    on_disk = (REPO / "schemas" / "config.schema.json").read_text(encoding="utf-8")
    assert on_disk == schema_text(), "schemas/config.schema.json is stale: run `mlm config schema --write`"
    schema = json.loads(on_disk)
    assert schema["additionalProperties"] is False
    assert "description" in schema["$defs"]["NormalizeConfig"]["properties"]["min_chars"]


def test_config_reference_in_sync():
    from mlm_core.config.io import config_reference_markdown
    on_disk = (REPO / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    assert on_disk == config_reference_markdown(), "docs/CONFIG.md is stale: run `mlm config docs --write`"
    assert "| `tokenizer.vocab_size` |" in on_disk and "## `sources.<lang>`" in on_disk


def test_effect_markers_reach_the_schema_and_the_docs():
    """Each leaf key's effect is in the JSON Schema and in a column of docs/CONFIG.md (hand-picked examples)."""
    schema = json.loads((REPO / "schemas" / "config.schema.json").read_text(encoding="utf-8"))
    props = schema["$defs"]["PretrainConfig"]["properties"]
    assert (props["lr"]["effect"], props["eval_every"]["effect"], props["device"]["effect"]) == \
        ("output", "report", "none")
    assert schema["$defs"]["TokenizerConfig"]["properties"]["max_fertility"]["effect"] == "threshold"
    assert "effect" not in props["model"]                       # a section: its own fields carry the markers
    doc = (REPO / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    assert "| key | type | default | effect | meaning |" in doc
    assert "| `pretrain.checkpoint_every` | `int` | `100` | none |" in doc
    assert "| `normalize.max_quarantine_rate` | `float` | `0.05` | threshold |" in doc


def test_cli_help_is_fast_and_imports_nothing_heavy():
    code = ("import sys, time; t=time.time(); import flows.cli as c\n"
            "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy=[m for m in ('torch','prefect','mlflow','great_expectations','duckdb','datasets') if m in sys.modules]\n"
            "print(heavy, time.time()-t, file=sys.stderr)\nassert not heavy, heavy")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    heavy, secs = r.stderr.strip().rsplit("] ", 1)
    assert float(secs) < 1.0


def test_cli_surface_is_frozen():
    """The commands users and scripts rely on; changing them is a deliberate, visible act."""
    from flows.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert sorted(sub.choices) == sorted(["run", "status", "verify", "stats", "fill-mask", "evaluate", "audit",
                                          "compare", "config", "serve", "deploy", "sync", "promote", "rollback",
                                          "sweep", "report"])
    run_opts = {o for a in sub.choices["run"]._actions for o in a.option_strings}
    assert {"--only", "--from", "--force", "--set"} <= run_opts
    opts = lambda p: {o for a in p._actions for o in a.option_strings}  # noqa: E731
    validate = next(a for a in sub.choices["config"]._actions if a.dest == "config_command").choices["validate"]
    assert "--no-paths" in opts(validate)                       # files are checked unless --no-paths
    assert {"--wait", "--pool", "--schedule", "--api-url", "--write-yaml"} <= opts(sub.choices["deploy"])
    assert {"--workdir", "--prefect-port", "--mlflow-port", "--host", "--pool", "--auth-file", "--require-auth",
            "--db", "--workers", "--timeout", "--check"} <= opts(sub.choices["serve"])   # --db/--workers: issue 10
    for cmd in ("promote", "rollback"):                       # aliases moved by hand, with the reason recorded
        assert {"--alias", "--reason", "--config"} <= opts(sub.choices[cmd])
    assert {"--version", "--force"} <= opts(sub.choices["promote"])
    assert {"--config", "--set", "--out", "--json"} <= opts(sub.choices["compare"])   # mlm compare A B --config C
    assert {"--dry-run", "--concurrency", "--set"} <= opts(sub.choices["sweep"])   # mlm sweep SWEEP.yaml (issue 12)
    assert {"--no-log", "--set"} <= opts(sub.choices["report"])            # the same --set finds the same runs
    status_config = next(a for a in sub.choices["status"]._actions if a.dest == "config")
    assert status_config.nargs == "?"                           # `mlm status` alone finds ./mlm.yaml or configs/*.yaml


def test_cli_config_validate_and_errors(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "flows.cli", "config", "validate", "configs/demo.yaml",
                         "--set", "normalize.min_chars=3"], capture_output=True, text=True, cwd=REPO)
    assert ok.returncode == 0 and "valid" in ok.stdout, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "flows.cli", "config", "validate", "configs/demo.yaml",
                          "--set", "tokenizer.vocab_sise=5"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2
    assert "tokenizer.vocab_sise: unknown key (did you mean vocab_size?)" in bad.stderr
    assert "Traceback" not in bad.stderr
