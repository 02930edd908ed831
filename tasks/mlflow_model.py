"""The trained model as an MLflow model, logged and registered.

In: a pretrain output (``hf/`` Hugging Face export, or our own weights folder; ELECTRA also ``hf-discriminator/``),
the stage's MLflow run. Out: a LoggedModel (``models:/m-<id>``) and a new version of the registered model made
from it, with a signature (the fill-mask table, param ``top_k``) and an input example; nothing pickled.

* With an ``hf/`` export (BERT, RoFormer, ModernBERT, ELECTRA's generator): MLflow's ``transformers`` flavor, task
  fill-mask (``tasks.mlflow_hf_model``: ``model/`` is the export byte for byte; ELECTRA's ``hf-discriminator/``
  travels next to it). Its pyfunc (``tasks/fillmask_serving.py``, shipped in the model) needs transformers, not
  this project: ``mlflow models serve -m models:/NAME@ALIAS`` serves it in any environment with transformers.
* Without one (our own weights folder only): the ``python_function`` flavor from code (``tasks/pyfunc_fillmask.py``)
  with the files as artifacts under ``artifacts/weights``; loading it needs mlm-pipeline installed.
  Also the fallback when transformers is not installed where the pipeline runs. The log line says which.

Either way ``mlflow.pyfunc.load_model("models:/NAME@ALIAS").predict([...])`` fills masks and the MLflow UI's
version page finds its MLmodel. ``model_dir_in`` maps a downloaded version back to the folder ``mlm fill-mask`` /
``mlm evaluate`` / ``pretrain.init_from`` read.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

CODE = Path(__file__).with_name("pyfunc_fillmask.py")
WEIGHT_FILES = ("model.safetensors", "tokenizer.json", "model_config.json")
# the packages the fill-mask code imports; mlm-pipeline itself is not on an index: serve with --env-manager local
REQUIREMENTS = ("mlm-pipeline", "mlflow", "torch", "tokenizers", "safetensors", "pandas")
# the transformers flavor's: no mlm-pipeline
HF_REQUIREMENTS = ("mlflow", "transformers", "torch", "tokenizers", "safetensors", "pandas")


def _requirements(packages=REQUIREMENTS) -> list[str]:
    """Pinned to what is installed (recorded for the reader; never resolved: pip_requirements given skips
    MLflow's requirement inference, which would load the model in a subprocess)."""
    from importlib.metadata import PackageNotFoundError, version
    out = []
    for pkg in packages:
        try:
            v = version(pkg)
        except PackageNotFoundError:
            out.append(pkg)
            continue
        out.append(f"{pkg}=={v.split('+')[0]}" if pkg == "torch" else f"{pkg}=={v}")
    return out


def signature():
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
    out = Schema([ColSpec("long", "row"), ColSpec("long", "mask"), ColSpec("long", "rank"), ColSpec("string", "token"),
                  ColSpec("long", "token_id"), ColSpec("double", "score"), ColSpec("string", "sequence")])
    return ModelSignature(inputs=Schema([ColSpec("string")]), outputs=out,
                          params=ParamSchema([ParamSpec("top_k", "long", 5)]))


def mask_token(folder: Path) -> str:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    return "[MASK]" if tok.token_to_id("[MASK]") is not None else "<mask>"


def model_artifacts(pretrain_dir: Path, scratch: Path) -> dict[str, str]:
    """{pyfunc artifact name: local folder}: ``hf`` (or ``weights``, the files copied into ``scratch``) and, for
    ELECTRA, ``hf-discriminator``."""
    pretrain_dir = Path(pretrain_dir)
    arts = {}
    if (pretrain_dir / "hf").is_dir():
        arts["hf"] = str(pretrain_dir / "hf")
    else:
        w = Path(scratch) / "weights"
        w.mkdir(parents=True)
        for n in WEIGHT_FILES:
            if (pretrain_dir / n).exists():
                shutil.copy2(pretrain_dir / n, w / n)
        arts["weights"] = str(w)
    if (pretrain_dir / "hf-discriminator").is_dir():
        arts["hf-discriminator"] = str(pretrain_dir / "hf-discriminator")
    return arts


def log_and_register(pretrain_dir: Path, run_id: str, name: str, tags: dict, description: str,
                     tracking_uri: str) -> int:
    """Log the pretrain output as a pyfunc model of run ``run_id`` and register it as a new version of ``name``
    (tags and description on the version), in the store at ``tracking_uri``."""
    import mlflow
    # Model.log only follows the process-wide URIs: point them at our store for the call, then put them back
    before = (mlflow.get_tracking_uri(), mlflow.get_registry_uri())
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    try:
        model_id, model_uri = _log(pretrain_dir, run_id)
        # also under our URI: the registry resolves a models:/m-<id> source through the process-wide one
        return _register(mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri), name, model_uri,
                         model_id, run_id, tags, description)
    finally:
        mlflow.set_tracking_uri(before[0])
        mlflow.set_registry_uri(before[1])


def _register(client, name: str, model_uri: str, model_id: str, run_id: str, tags: dict, description: str) -> int:
    from mlflow.exceptions import MlflowException

    from tasks.tracking import tag_values
    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    mv = client.create_model_version(name, source=model_uri, run_id=run_id, tags=tag_values(tags) or None,
                                     description=description, model_id=model_id)
    return int(mv.version)


def _transformers_missing() -> bool:
    from importlib.util import find_spec
    return find_spec("transformers") is None


def _log(pretrain_dir: Path, run_id: str) -> tuple[str, str]:
    """(model id, models:/m-<id> URI) of the model logged to ``run_id`` (process-wide tracking URI): the
    transformers flavor for an ``hf/`` export, else the project's pyfunc (see the module docstring)."""
    import tempfile

    import mlflow
    from mlflow.models import Model
    pretrain_dir = Path(pretrain_dir)
    # created in the run's experiment: left to Model.log it lands in the default experiment 0, whose artifacts
    # go to ./mlruns in whatever the current directory is, not to the workdir
    experiment = mlflow.MlflowClient().get_run(run_id).info.experiment_id
    if (pretrain_dir / "hf").is_dir() and not _transformers_missing():
        from tasks import mlflow_hf_model
        example = [f"The capital of France is {mask_token(pretrain_dir / 'hf')}."]
        lm = mlflow.initialize_logged_model(name="model", source_run_id=run_id, experiment_id=experiment)
        info = Model.log(artifact_path=None, name="model", flavor=mlflow_hf_model, run_id=run_id,
                         model_id=lm.model_id, pretrain_dir=pretrain_dir, signature=signature(),
                         input_example=example, pip_requirements=_requirements(HF_REQUIREMENTS),
                         flavor_name="transformers")
        log.info("model logged with MLflow's transformers flavor (fill-mask%s): loads and serves wherever "
                 "transformers is installed", ", the discriminator in hf-discriminator/"
                 if (pretrain_dir / mlflow_hf_model.DISCRIMINATOR).is_dir() else "")
        return info.model_id, info.model_uri
    why = ("has no Hugging Face export (hf/)" if not (pretrain_dir / "hf").is_dir()
           else "has an hf/ export but transformers is not installed here (pip install transformers)")
    with tempfile.TemporaryDirectory(prefix="mlm-pyfunc-") as scratch:
        arts = model_artifacts(pretrain_dir, Path(scratch))
        example = [f"The capital of France is {mask_token(next(iter(arts.values())))}."]
        lm = mlflow.initialize_logged_model(name="model", source_run_id=run_id, experiment_id=experiment)
        info = Model.log(artifact_path=None, name="model", flavor=mlflow.pyfunc, run_id=run_id, model_id=lm.model_id,
                         python_model=str(CODE), artifacts=arts, signature=signature(), input_example=example,
                         pip_requirements=_requirements(), flavor_name="python_function")
    log.warning("%s %s: model logged with the project's python_function code (tasks/pyfunc_fillmask.py), "
                "not the transformers flavor; loading or serving it needs mlm-pipeline installed "
                "(mlflow models serve ... --env-manager local)", pretrain_dir, why)
    return info.model_id, info.model_uri


def model_dir_in(folder: Path) -> Path:
    """The model folder inside a downloaded version (a folder this process owns): for the transformers flavor its
    ``model/`` (the ``hf/`` export), RENAMED ``hf/`` in place, the pretrain output's name, so an ELECTRA generator
    finds its ``hf-discriminator/`` sibling as in a pretrain output (the download no longer loads as an MLflow
    model afterwards); for the project's pyfunc its ``hf`` (or ``weights``) artifact; else the folder itself
    (versions registered as plain files)."""
    from tasks.mlflow_hf_model import MODEL_DIR, is_transformers_model
    folder = Path(folder)
    if not (folder / "MLmodel").is_file():
        return folder
    if is_transformers_model(folder):
        if (folder / MODEL_DIR).is_dir() and not (folder / "hf").exists():
            (folder / MODEL_DIR).rename(folder / "hf")
        if (folder / "hf").is_dir():
            return folder / "hf"
    for sub in ("hf", "weights"):
        if (folder / "artifacts" / sub).is_dir():
            return folder / "artifacts" / sub
    return folder
