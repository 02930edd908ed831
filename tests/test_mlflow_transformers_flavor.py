"""The registered model is logged with MLflow's ``transformers`` flavor and serves without this project (issue 24,
item 10).

For each family with a Hugging Face export (BERT, RoFormer, ModernBERT, ELECTRA's generator) a tiny random model is
exported (``hf/``), logged and registered by ``tasks.mlflow_model.log_and_register`` into a SQLite registry, then:
its MLmodel has the transformers flavor with task fill-mask; ``mlflow.pyfunc.load_model("models:/NAME@ALIAS")``
in a separate Python where ``mlm_core`` / ``tasks`` / ``flows`` cannot be imported (a ``sitecustomize`` on
PYTHONPATH blocks them) predicts the same top-1 token as a plain ``transformers.pipeline("fill-mask", model=hf/)``
(the independent reference) and the transformers flavor itself loads there. A text without the mask token gets an
HTTP 400 naming the mask token, from MLflow's scoring app and from a real ``mlflow models serve`` process.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))

from conftest import wait_for_ping  # noqa: E402
from test_export import wordpiece  # noqa: E402
from test_export_families import _spread  # noqa: E402 - weights far from the init: top-1 is no near-tie

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FAMILIES = ("bert", "roformer", "modernbert", "electra")
TEXT = "le chat {m} sur le tapis"
BLOCK = textwrap.dedent("""\
    # the project is not importable in this interpreter: mlm_core, tasks, flows raise ModuleNotFoundError
    import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("mlm_core", "tasks", "flows"):
                raise ModuleNotFoundError(f"blocked by the test: {name}")
            return None
    sys.meta_path.insert(0, _Block())
    """)


def _export(family: str, out: Path) -> Path:
    """A tiny random pretrain output folder of ``family`` holding ``hf/`` (ELECTRA: also ``hf-discriminator/``)."""
    from tokenizers import Tokenizer

    from mlm_core.config import ModelConfig
    from mlm_core.model import MLMEncoder, export_hf, resolve_arch
    out.mkdir(parents=True)
    tok_file = out / "tokenizer.json"
    specials = wordpiece(tok_file)
    vocab = Tokenizer.from_file(str(tok_file)).get_vocab_size()
    base = {"size": "tiny", "layers": 2, "hidden": 32, "heads": 4, "max_positions": 64}
    extra = {"bert": {}, "electra": {}, "roformer": {"position": "rotary"},
             "modernbert": {"family": "modernbert", "layers": 3, "window": 8, "global_every": 2}}[family]
    torch.manual_seed(0)
    arch = resolve_arch(ModelConfig(**(base | extra)), vocab, specials["pad"]["id"])
    if family == "electra":
        from mlm_core.model.electra import ElectraModel
        from mlm_core.model.export_electra import export_electra
        model = ElectraModel(arch, resolve_arch(ModelConfig(**(base | {"hidden": 16, "heads": 2})), vocab,
                                                specials["pad"]["id"]))
        _spread(model)
        export_electra(model.gen, model.disc, out, tok_file, specials)
    else:
        model = MLMEncoder(arch)
        _spread(model)
        export_hf(model, out / "hf", tok_file, specials)
    return out


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """{family: (pretrain folder, version)}, all registered under one name each in one SQLite store; uri."""
    import mlflow

    from tasks.mlflow_model import log_and_register
    root = tmp_path_factory.mktemp("hf-flavor")
    uri = f"sqlite:///{root}/mlflow.db"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.create_experiment("flavor", artifact_location=str(root / "artifacts"))
    out = {}
    for fam in FAMILIES:
        pre = _export(fam, root / fam)
        run = client.create_run(exp).info.run_id
        v = log_and_register(pre, run, f"m-{fam}", {"family": fam}, f"tiny {fam}", uri)
        client.set_registered_model_alias(f"m-{fam}", "served", str(v))
        out[fam] = (pre, v)
    return out, uri, root


def _block_dir(root: Path) -> Path:
    d = root / "block"
    if not d.is_dir():
        d.mkdir()
        (d / "sitecustomize.py").write_text(BLOCK)
    return d


def _env(root: Path, uri: str) -> dict:
    """No project on the path: PYTHONPATH is only the blocking sitecustomize."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLM_", "MLFLOW_", "PYTHON"))}
    env.update(PYTHONPATH=str(_block_dir(root)), MLFLOW_TRACKING_URI=uri, HF_HUB_OFFLINE="1",
               MLFLOW_DISABLE_TELEMETRY="true", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return env


def _reference_top1(hf: Path, text: str) -> str:
    pipe = tf.pipeline("fill-mask", model=str(hf), device="cpu")
    return pipe(text, top_k=1)[0]["token_str"]


LOAD = textwrap.dedent("""\
    import importlib, json, sys
    for name in ("mlm_core", "tasks", "flows"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            pass
        else:
            raise SystemExit(f"{name} is importable: the test does not prove anything")
    import mlflow, mlflow.transformers, yaml
    name, texts = sys.argv[1], json.loads(sys.argv[2])
    uri = f"models:/{name}@served"
    local = mlflow.artifacts.download_artifacts(uri)
    flavors = yaml.safe_load(open(local + "/MLmodel"))["flavors"]
    out = mlflow.pyfunc.load_model(uri).predict(texts, params={"top_k": 2})
    pipe = mlflow.transformers.load_model(uri)          # the flavor itself: a transformers pipeline
    print(json.dumps({"flavors": flavors, "rows": out.to_dict(orient="records"),
                      "pipeline": type(pipe).__name__,
                      "project": sorted(m for m in sys.modules if m.split(".")[0] in ("mlm_core", "tasks", "flows"))}))
    """)


@pytest.mark.heavy
@pytest.mark.parametrize("family", FAMILIES)
def test_registered_model_is_transformers_fill_mask_and_loads_without_the_project(registry, family, tmp_path):
    versions, uri, root = registry
    pre, _ = versions[family]
    hf = pre / "hf"
    mask = tf.AutoTokenizer.from_pretrained(str(hf)).mask_token
    texts = [TEXT.format(m=mask), f"the dog {mask} in the house"]
    p = subprocess.run([sys.executable, "-c", LOAD, f"m-{family}", json.dumps(texts)], cwd=tmp_path,
                       env=_env(root, uri), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["project"] == []
    assert got["flavors"]["transformers"]["task"] == "fill-mask"
    assert got["flavors"]["python_function"]["loader_module"] == "fillmask_serving"
    assert got["pipeline"] == "FillMaskPipeline"
    rows = got["rows"]
    assert [(r["row"], r["rank"]) for r in rows] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    for i, text in enumerate(texts):
        top = next(r for r in rows if r["row"] == i and r["rank"] == 1)
        assert top["token"] == _reference_top1(hf, text), (family, text)


def test_the_version_keeps_the_export_bytes_signature_example_and_electra_discriminator(registry, tmp_path):
    """``model/`` is the export byte for byte, the signature and input example are there, ELECTRA's discriminator
    travels with it, requirements name transformers and not mlm-pipeline; ``model_dir_in`` gives ``hf/`` with its
    sibling (what ``mlm fill-mask`` / ``init_from`` read)."""
    import mlflow

    from tasks.mlflow_model import model_dir_in
    versions, uri, root = registry
    for fam in FAMILIES:
        pre, v = versions[fam]
        client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
        where = client.get_model_version_download_uri(f"m-{fam}", str(v))
        got = Path(mlflow.artifacts.download_artifacts(artifact_uri=where, dst_path=str(tmp_path / fam),
                                                       tracking_uri=uri, registry_uri=uri))
        for f in (pre / "hf").iterdir():
            assert (got / "model" / f.name).read_bytes() == f.read_bytes(), (fam, f.name)
        model = mlflow.models.Model.load(str(got / "MLmodel"))
        assert [c["name"] for c in model.signature.outputs.to_dict()] == ["row", "mask", "rank", "token", "token_id",
                                                                          "score", "sequence"]
        assert model.saved_input_example_info is not None
        reqs = (got / "requirements.txt").read_text()
        assert "transformers==" in reqs and "mlm-pipeline" not in reqs
        assert (got / "hf-discriminator").is_dir() is (fam == "electra")
        folder = model_dir_in(got)
        assert folder == got / "hf" and (folder / "model.safetensors").is_file()
        if fam == "electra":
            from mlm_core.external import discriminator_sibling
            assert discriminator_sibling(folder) == got / "hf-discriminator"
            assert (got / "hf-discriminator" / "model.safetensors").read_bytes() == \
                (pre / "hf-discriminator" / "model.safetensors").read_bytes()


def test_a_model_without_hf_export_keeps_the_project_pyfunc_and_says_so(tmp_path, caplog):
    """Our own weights folder only (an architecture transformers has no class for): today's pyfunc, which needs
    the project, and the log line says so."""
    import logging

    import mlflow

    from mlm_core.config import ModelConfig
    from mlm_core.model import MLMEncoder, resolve_arch, save_weights
    from tasks.mlflow_model import log_and_register
    pre = tmp_path / "plain"
    pre.mkdir()
    specials = wordpiece(pre / "tokenizer.json")
    from tokenizers import Tokenizer
    vocab = Tokenizer.from_file(str(pre / "tokenizer.json")).get_vocab_size()
    model = MLMEncoder(resolve_arch(ModelConfig(size="tiny", layers=1, hidden=32, heads=2, max_positions=64), vocab,
                                    specials["pad"]["id"]))
    save_weights(model, pre / "model.safetensors")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.create_experiment("plain", artifact_location=str(tmp_path / "artifacts"))
    run = client.create_run(exp).info.run_id
    with caplog.at_level(logging.INFO, logger="tasks.mlflow_model"):
        v = log_and_register(pre, run, "plain", {}, "", uri)
    msgs = [r.getMessage() for r in caplog.records if r.name == "tasks.mlflow_model"]
    assert any("no Hugging Face export" in m and "python_function" in m and "mlm-pipeline" in m for m in msgs), msgs
    got = mlflow.artifacts.download_artifacts(
        artifact_uri=client.get_model_version_download_uri("plain", str(v)), dst_path=str(tmp_path / "dl"),
        tracking_uri=uri, registry_uri=uri)
    flavors = mlflow.models.Model.load(str(Path(got) / "MLmodel")).flavors
    assert "transformers" not in flavors and "python_function" in flavors
    assert (Path(got) / "artifacts" / "weights" / "model.safetensors").is_file()


# ---- a text without the mask token: HTTP 400 naming it ------------------------------------------------------
def _no_mask_checks(status: int, body: dict, mask: str) -> None:
    assert status == 400, body
    msg = body["message"]
    assert f"mask token {mask}" in msg and "Verify that the serialized input" not in msg, msg
    assert body["error_code"] == "INVALID_PARAMETER_VALUE"


def test_scoring_app_answers_400_naming_the_mask_token(registry):
    import mlflow
    from fastapi.testclient import TestClient
    from mlflow.pyfunc import scoring_server
    versions, uri, _ = registry
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    for fam in ("bert", "modernbert"):
        where = client.get_model_version_download_uri(f"m-{fam}", str(versions[fam][1]))
        local = mlflow.artifacts.download_artifacts(artifact_uri=where, tracking_uri=uri, registry_uri=uri)
        app = TestClient(scoring_server.init(mlflow.pyfunc.load_model(local)))
        mask = tf.AutoTokenizer.from_pretrained(str(versions[fam][0] / "hf")).mask_token
        r = app.post("/invocations", json={"inputs": ["the cat sat on the mat"]})
        _no_mask_checks(r.status_code, r.json(), mask)
        r = app.post("/invocations", json={"inputs": [TEXT.format(m=mask)], "params": {"top_k": 1}})
        assert r.status_code == 200 and len(r.json()["predictions"]) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, payload: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.heavy
def test_mlflow_models_serve_without_the_project_fills_masks_and_answers_400(registry, tmp_path):
    """A real `mlflow models serve -m models:/NAME@ALIAS` process in which the project cannot be imported."""
    versions, uri, root = registry
    pre, _ = versions["bert"]
    mask = tf.AutoTokenizer.from_pretrained(str(pre / "hf")).mask_token
    port = _free_port()
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m",
                             "models:/m-bert@served", "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port),
                             "-w", "1"], cwd=tmp_path, env=_env(root, uri), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_for_ping(proc, port, tmp_path / "serve.log")
        text = TEXT.format(m=mask)
        status, body = _post(port, {"inputs": [text], "params": {"top_k": 2}})
        assert status == 200, body
        assert [r["rank"] for r in body["predictions"]] == [1, 2]
        assert body["predictions"][0]["token"] == _reference_top1(pre / "hf", text)
        status, body = _post(port, {"inputs": ["the cat sat on the mat"]})
        _no_mask_checks(status, body, mask)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    assert "blocked by the test" not in (tmp_path / "serve.log").read_text(errors="replace")
