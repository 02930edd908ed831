"""The registered model is an MLflow model (issue 14 item 2) and its aliases mean something (item 5).

One tiny real pipeline output (``test_register.pipeline_out``: 4 training steps on en/ru lines) is registered
through the pretrain stage's registry step into a SQLite registry; then: pyfunc loading, a real
``mlflow models serve`` process, signature and description, the evaluation verdict and ``candidate``, and
``mlm promote`` / ``mlm rollback``.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import types
import urllib.request
from pathlib import Path

import pytest

from conftest import wait_for_ping
from test_register import pipeline_out  # noqa: F401 - the module-scoped pipeline run, reused as a fixture

pytestmark = pytest.mark.usefixtures("one_torch_thread")
NAME = "regtest-model"


@pytest.fixture(scope="module")
def registered(pipeline_out):  # noqa: F811
    """(lc, arts, tracker, pretrain run id, version): the pretrain output registered as the stage registers it."""
    from tasks import registry
    from tasks.tracking import Tracker
    lc, arts = pipeline_out
    import mlflow
    tracker = Tracker(lc.config.tracking, lc.workdir)
    run_id = tracker.start_stage("pretrain", arts["pretrain"].fingerprint)
    elsewhere = lc.workdir.parent / "elsewhere" / "mlflow.db"   # a process-wide URI set by someone else
    mlflow.set_tracking_uri(f"sqlite:///{elsewhere}")
    version = registry.register_pretrained(arts["pretrain"], tracker, run_id, lc)
    assert not elsewhere.parent.exists() and mlflow.get_tracking_uri() == f"sqlite:///{elsewhere}"
    mlflow.set_tracking_uri(tracker.uri)
    return lc, arts, tracker, run_id, version


def _mask(arts) -> str:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(arts["pretrain"].path / "hf" / "tokenizer.json"))
    return "[MASK]" if tok.token_to_id("[MASK]") is not None else "<mask>"


def _reference(hf: Path, text: str, k: int) -> list[tuple[int, float]]:
    """Top-k (token id, probability) at the mask, computed by transformers' own masked-LM class from hf/."""
    transformers = pytest.importorskip("transformers")
    import torch
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(hf / "tokenizer.json"))
    ids = tok.encode(text).ids                                 # with the post-processor's [CLS]/[SEP]
    mask = "[MASK]" if tok.token_to_id("[MASK]") is not None else "<mask>"
    model = transformers.AutoModelForMaskedLM.from_pretrained(str(hf)).eval()
    with torch.no_grad():
        probs = model(input_ids=torch.tensor([ids])).logits[0].softmax(-1)
    p, i = probs[ids.index(tok.token_to_id(mask))].topk(k)
    return list(zip(i.tolist(), p.tolist()))


def test_pyfunc_load_model_predicts_fill_mask(registered):
    import mlflow
    lc, arts, tracker, _, version = registered
    text = f"The quick brown {_mask(arts)} jumps."
    model = mlflow.pyfunc.load_model(f"models:/{NAME}/{version}")
    out = model.predict([text], params={"top_k": 3})
    assert list(out["rank"]) == [1, 2, 3] and set(out["row"]) == {0} and set(out["mask"]) == {0}
    ref = _reference(arts["pretrain"].path / "hf", text, 3)
    assert list(out["token_id"]) == [i for i, _ in ref]
    assert list(out["score"]) == pytest.approx([p for _, p in ref], abs=1e-4)
    # a DataFrame with one text column works as well, one result block per row
    import pandas as pd
    two = model.predict(pd.DataFrame({"text": [text, text]}))
    assert len(two) == 10 and sorted(set(two["row"])) == [0, 1]


def test_version_is_an_mlflow_model_with_signature_example_and_description(registered):
    import mlflow
    lc, arts, tracker, run_id, version = registered
    mv = tracker.client.get_model_version(NAME, str(version))
    assert mv.source.startswith("models:/m-") and mv.run_id == run_id
    # the model's files live with the run's experiment in the workdir, not in ./mlruns of the current directory
    model = tracker.client.get_logged_model(mv.source[len("models:/"):])
    assert "READY" in str(model.status)                        # finalized, not left PENDING
    assert str(lc.workdir) in model.artifact_location and model.source_run_id == run_id
    assert not (Path.cwd() / "mlruns").exists()
    info = mlflow.models.get_model_info(f"models:/{NAME}/{version}")
    assert "python_function" in info.flavors
    assert info.signature.inputs.to_dict() and info.signature.outputs.to_dict()
    assert [c["name"] for c in info.signature.outputs.to_dict()] == ["row", "mask", "rank", "token", "token_id",
                                                                     "score", "sequence"]
    assert info.saved_input_example_info is not None
    steps = arts["pretrain"].manifest["steps"]
    assert mv.description.startswith("Multilingual masked language model") and f"{steps} steps" in mv.description
    assert "en, ru" in mv.description and "Not evaluated yet." in mv.description
    assert mv.tags["evaluation"] == "pending" and mv.tags["pretrain_fingerprint"] == arts["pretrain"].fingerprint
    assert not mv.aliases                                         # no alias before evaluation
    # mlm fill-mask / evaluate read the hf/ folder inside the MLflow model
    from tasks.registry import resolve_model
    with resolve_model(f"models:/{NAME}/{version}", tracker.uri) as folder:
        assert folder.name == "hf" and (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.heavy
def test_mlflow_models_serve_answers_an_invocation(registered, tmp_path):
    import mlflow
    lc, arts, tracker, _, version = registered
    tracker.client.set_registered_model_alias(NAME, "served", str(version))
    port = _free_port()
    env = dict(os.environ, MLFLOW_TRACKING_URI=tracker.uri, HF_HUB_OFFLINE="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")   # uvicorn of this venv
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m",
                             f"models:/{NAME}@served", "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
                            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    text = f"The quick brown {_mask(arts)} jumps."
    try:
        wait_for_ping(proc, port, tmp_path / "serve.log")
        body = json.dumps({"inputs": [text], "params": {"top_k": 2}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                     headers={"Content-Type": "application/json"})
        got = json.loads(urllib.request.urlopen(req, timeout=60).read())["predictions"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    ref = _reference(arts["pretrain"].path / "hf", text, 2)
    assert [r["token_id"] for r in got] == [i for i, _ in ref] and [r["rank"] for r in got] == [1, 2]
    assert [r["score"] for r in got] == pytest.approx([p for _, p in ref], abs=1e-4)
    mlflow.MlflowClient(tracker.uri).delete_registered_model_alias(NAME, "served")


# ---- aliases: candidate after evaluation, champion by the gates or by hand -------------------------------
def _evaluate_art(tmp_path, pretrain_fp: str, margins: dict[str, float]):
    """An evaluate output whose languages score top-1 = baseline + margin (the verdict reads evaluation.json)."""
    d = tmp_path / f"eval-{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    intr = {lang: {"top1": 0.2 + m, "baseline_top1": 0.2} for lang, m in margins.items()}
    (d / "evaluation.json").write_text(json.dumps({"intrinsic": intr}), encoding="utf-8")
    return types.SimpleNamespace(path=d, upstream={"pretrain": pretrain_fp})       # an Evaluation's fields


def _register_plain(tracker, fp: str) -> int:
    from tasks import tracking
    client = tracker.client
    run = client.create_run(tracker.experiment_id)
    return tracking.register_version(tracker, NAME, run.info.run_id, "model", tags={"pretrain_fingerprint": fp})


def test_candidate_is_the_latest_version_that_passed_evaluation(registered, tmp_path):
    from tasks import aliases, registry
    lc, arts, tracker, _, version = registered
    client = tracker.client
    # the real 4-step model, evaluated on held-out text: it passes only where top-1 beats the unigram baseline
    ev = json.loads((arts["evaluate"].path / "evaluation.json").read_text())
    beats = all(r["top1"] > r["baseline_top1"] for r in ev["intrinsic"].values() if not r.get("missing"))
    real = types.SimpleNamespace(path=arts["evaluate"].path, upstream={"pretrain": arts["pretrain"].fingerprint})
    registry.after_evaluate(real, tracker, None, lc)
    tags = client.get_model_version(NAME, str(version)).tags
    assert tags["evaluation"] == ("passed" if beats else "failed")
    assert (aliases.holder(client, NAME, "candidate") == version) is beats
    # a version below the baseline in one language of two fails, tagged with the reason, and gets no alias
    a, b, c = "a" * 16, "b" * 16, "c" * 16
    va, vb, vc = (_register_plain(tracker, fp) for fp in (a, b, c))
    before = aliases.holder(client, NAME, "candidate")
    registry.after_evaluate(_evaluate_art(tmp_path, a, {"en": 0.1, "ru": -0.05}), tracker, None, lc)
    mv = client.get_model_version(NAME, str(va))
    assert mv.tags["evaluation"] == "failed" and "ru: top-1" in mv.tags["evaluation_failed"] and not mv.aliases
    assert aliases.holder(client, NAME, "candidate") == before
    # a tie with the baseline is not a pass (the zh 0.1875 vs 0.1875)
    registry.after_evaluate(_evaluate_art(tmp_path, b, {"en": 0.1, "ru": 0.0}), tracker, None, lc)
    assert client.get_model_version(NAME, str(vb)).tags["evaluation"] == "failed"
    # passing versions take candidate; an older one evaluated later does not take it back
    registry.after_evaluate(_evaluate_art(tmp_path, c, {"en": 0.1, "ru": 0.02}), tracker, None, lc)
    assert aliases.holder(client, NAME, "candidate") == vc
    registry.after_evaluate(_evaluate_art(tmp_path, b, {"en": 0.1, "ru": 0.1}), tracker, None, lc)
    assert client.get_model_version(NAME, str(vb)).tags["evaluation"] == "passed"
    assert aliases.holder(client, NAME, "candidate") == vc
    hist = client.get_model_version(NAME, str(vc)).tags
    moved = json.loads(hist["alias.candidate"])          # one tag per alias, holding the move's record
    assert moved["by"] == "pipeline" and moved["reason"] == "passed evaluation"
    # the evaluate contract failing (critical) also tags the version failed and removes its candidate alias
    report = types.SimpleNamespace(failed_critical=[{"table": "intrinsic", "type": "expect_column_values_to_be_between",
                                                     "kwargs": {"column": "top1"}}])
    registry.evaluation_failed(tracker, lc, c, report)
    assert client.get_model_version(NAME, str(vc)).tags["evaluation"] == "failed"
    assert aliases.holder(client, NAME, "candidate") is None


def test_promote_and_rollback_move_aliases_by_hand_with_the_reason(registered, monkeypatch, capsys):
    from flows.cli import main
    from tasks import aliases
    lc, arts, tracker, _, version = registered
    client = tracker.client
    monkeypatch.setenv("MLM_TRACKING_URI", tracker.uri)
    v1, v2, v3 = (_register_plain(tracker, fp * 16) for fp in "def")
    for v, gates in ((v1, "passed"), (v2, "passed"), (v3, "failed")):
        client.set_model_version_tag(NAME, str(v), "gates", gates)
    assert main(["promote", NAME, "--alias", "champion", "--version", str(v1), "--reason", "first release"]) == 0
    assert main(["promote", NAME, "--version", str(v2), "--reason", "better on fr"]) == 0
    assert f"version {v1} -> {v2} (better on fr)" in capsys.readouterr().out
    tags = client.get_model_version(NAME, str(v2)).tags
    assert aliases.holder(client, NAME, "champion") == v2
    moved = json.loads(tags["alias.champion"])
    assert (moved["by"], moved["reason"], moved["previous"]) == \
        ("promote", "better on fr", str(v1))
    # a version that failed its gates needs --force, and gets it with the reason recorded
    assert main(["promote", NAME, "--version", str(v3), "--reason", "try"]) != 0
    assert "--force" in capsys.readouterr().err and aliases.holder(client, NAME, "champion") == v2
    assert main(["promote", NAME, "--version", str(v3), "--reason", "demo day", "--force"]) == 0
    # rollback walks the history back: v3 -> v2 -> v1, each move's reason on the versions
    assert main(["rollback", NAME, "--reason", "v3 regressed on ru"]) == 0
    assert aliases.holder(client, NAME, "champion") == v2
    assert client.get_model_version(NAME, str(v3)).tags["alias.champion.rolled_back"] == "v3 regressed on ru"
    assert json.loads(client.get_model_version(NAME, str(v2)).tags["alias.champion"])["by"] == "rollback"
    assert main(["rollback", NAME, "--alias", "champion", "--reason", "again"]) == 0
    assert aliases.holder(client, NAME, "champion") == v1
    capsys.readouterr()
    # v1 held it first and no older version passed its gates: nothing to roll back to, a clear error
    older = [int(v.version) for v in client.search_model_versions() if v.name == NAME
             and int(v.version) < v1 and (v.tags or {}).get("gates") == "passed"]
    assert older == []
    assert main(["rollback", NAME, "--reason", "once more"]) != 0
    assert "mlm promote" in capsys.readouterr().err and aliases.holder(client, NAME, "champion") == v1
    # the reason is required
    with pytest.raises(SystemExit):
        main(["promote", NAME, "--version", str(v1)])


# ---- what `mlm evaluate` / `mlm audit` print (issue 14 item 7) ---------------------------------------------
@pytest.fixture
def cfg_path(pipeline_out, tmp_path):  # noqa: F811
    import yaml
    lc, _ = pipeline_out
    f = tmp_path / "cfg.yaml"
    f.write_text(yaml.safe_dump(lc.config.model_dump(mode="json")), encoding="utf-8")
    return f


def test_evaluate_prints_retrieval_and_no_missing_flag_and_audit_prints_small_kl(pipeline_out, cfg_path,  # noqa: F811
                                                                                 monkeypatch, capsys):
    import mlm_core.audit
    import mlm_core.evaluate.stage as ev_stage
    from flows.cli import main
    _, arts = pipeline_out
    result = {"intrinsic": {"en": {"n_positions": 40, "top1": 0.25, "baseline_top1": 0.05},
                            "ru": {"missing": "no held-out data"}},
              "transfer": {"upos": {"source_lang": "en", "source_score": 0.9,
                                    "targets": {"ru": {"score": 0.6, "source_score": 0.9, "gap": 0.3}}},
                           "retrieval": {"pivot": "en", "layer": 2, "metric": "accuracy@1",
                                         "pairs": {"ru": {"n": 20, "src_to_tgt": 0.35, "tgt_to_src": 0.3,
                                                          "mean": 0.325, "chance": 0.05}}}}}
    monkeypatch.setattr(ev_stage, "evaluate_model", lambda *a, **k: result)
    assert main(["evaluate", str(arts["pretrain"].path / "hf"), "--config", str(cfg_path)]) == 0
    out = capsys.readouterr().out
    assert "missing" not in out and "False" not in out
    assert "retrieval" in out and "en-ru" in out and "0.325" in out
    assert "gap = source - target" in out
    monkeypatch.setattr(mlm_core.audit, "run_audit", lambda *a, **k: {
        "templates": {"en": {"delta_bias": {"female_vs_male": 0.5}, "kl_to_neutral_mean": 2e-06}}})
    assert main(["audit", str(arts["pretrain"].path / "hf"), "--config", str(cfg_path)]) == 0
    out = capsys.readouterr().out
    assert "2e-06" in out and "0.0000" not in out


def test_electra_logs_generator_and_discriminator(tmp_path):
    """ELECTRA outputs hold hf/ (generator, the fill-mask model) and hf-discriminator/: both are model artifacts;
    an output without a Hugging Face export logs its own weight files."""
    from tasks.mlflow_model import model_artifacts, model_dir_in
    electra = tmp_path / "electra"
    for d in ("hf", "hf-discriminator"):
        (electra / d).mkdir(parents=True)
    arts = model_artifacts(electra, tmp_path / "s1")
    assert arts == {"hf": str(electra / "hf"), "hf-discriminator": str(electra / "hf-discriminator")}
    plain = tmp_path / "plain"
    plain.mkdir()
    for n in ("model.safetensors", "tokenizer.json", "model_config.json"):
        (plain / n).write_text(n)
    arts = model_artifacts(plain, tmp_path / "s2")
    assert list(arts) == ["weights"] and sorted(p.name for p in Path(arts["weights"]).iterdir()) == \
        ["model.safetensors", "model_config.json", "tokenizer.json"]
    # a downloaded MLflow model resolves to its hf/ artifact; a plain folder (older versions) to itself
    (tmp_path / "dl" / "artifacts" / "hf").mkdir(parents=True)
    (tmp_path / "dl" / "MLmodel").write_text("flavors: {}")
    assert model_dir_in(tmp_path / "dl") == tmp_path / "dl" / "artifacts" / "hf"
    assert model_dir_in(plain) == plain


def test_register_stage_makes_the_card_summary_the_description_and_logs_the_card(registered):
    from tasks import registry
    lc, arts, tracker, pre_run, version = registered
    run_id = tracker.start_stage("register", arts["register"].fingerprint)
    assert registry.promote(arts["register"], tracker, run_id, lc) == version
    mv = tracker.client.get_model_version(NAME, str(version))
    card = (arts["register"].path / "model_card.md").read_text(encoding="utf-8")
    first_paragraph = card.split("\n\n")[1].strip()                # after the "# Model card" title
    summary, where = mv.description.split("\n\n")                  # the card's summary, then the gate table
    assert summary == first_paragraph and "unigram baseline" in summary
    assert f"gates/v{version}.json" in where and pre_run in where
    assert "Multilingual masked language model" in mv.description
    logged = {a.path for a in tracker.client.list_artifacts(pre_run, "model_card")}
    assert f"model_card/v{version}.md" in logged                  # the full card, on the version's run


def test_fill_mask_cli_reads_the_mlflow_model_in_a_fresh_process(registered, tmp_path):
    """`mlm fill-mask models:/NAME/V` in a new process (no process-wide tracking URI set) finds the version's
    hf/ folder inside the MLflow model and leaves nothing in the current directory (no ./mlflow.db, ./mlruns)."""
    lc, arts, tracker, _, version = registered
    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, MLM_TRACKING_URI=tracker.uri, HF_HUB_OFFLINE="1", PYTHONPATH=str(repo))
    out = subprocess.run([sys.executable, "-m", "flows.cli", "fill-mask", f"models:/{NAME}/{version}",
                          f"a {_mask(arts)} b", "--top-k", "2", "--json"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)[0]) == 2
    assert list(tmp_path.iterdir()) == []


def test_fill_mask_cli_finds_the_demo_registry_with_no_tracking_uri_set(registered, tmp_path):
    """The README's `mlm fill-mask models:/NAME@ALIAS` with no --config and no $MLM_TRACKING_URI: the registry
    is ./.mlm/mlflow.db. MLflow resolves a version's `models:/m-<id>` source through the process-wide tracking
    URI (its default: ./mlflow.db), so the download must not go through it: found, and no ./mlflow.db left."""
    lc, arts, tracker, _, version = registered
    repo = Path(__file__).resolve().parent.parent
    assert tracker.uri == f"sqlite:///{lc.workdir.resolve()}/mlflow.db"
    (tmp_path / ".mlm").symlink_to(lc.workdir.resolve(), target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MLM_TRACKING_URI", "MLFLOW_TRACKING_URI",
                                                            "MLFLOW_REGISTRY_URI", "PREFECT_API_URL")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(repo))
    out = subprocess.run([sys.executable, "-m", "flows.cli", "fill-mask", f"models:/{NAME}/{version}",
                          f"a {_mask(arts)} b", "--top-k", "2", "--json"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)[0]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mlm"]
