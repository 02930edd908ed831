"""A pretrain output's Hugging Face export as an MLflow model of the ``transformers`` flavor (task fill-mask).

The "flavor" ``tasks.mlflow_model`` hands to ``mlflow.models.Model.log`` (which calls ``save_model(path,
mlflow_model, **kwargs)`` and uploads ``path``). Out, in ``path``:

  MLmodel               flavors ``transformers`` (task fill-mask: ``mlflow.transformers.load_model`` gives the
                        pipeline) and ``python_function`` (loader module ``fillmask_serving``, shipped in
                        ``code/``: transformers-only, a clear 400 for a text without the mask token)
  model/                the ``hf/`` export itself, byte for byte (what MLflow's own local-checkpoint logging does;
                        its ``transformers_model=<folder>`` form fails on transformers 5: ``check_task`` returns
                        the pipeline class as a string). So fingerprints of ``init_from: models:/...`` are those of
                        the files the pretrain stage wrote.
  components/tokenizer/ the tokenizer as transformers saves it (the transformers flavor reads it from there)
  hf-discriminator/     ELECTRA only: the discriminator export (not part of the flavor; ``mlm`` commands read it)
  signature, input example, requirements.txt (mlflow, transformers, torch, ...: no mlm-pipeline)

Nothing is pickled: safetensors, json and the loader's source.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

LOADER = Path(__file__).with_name("fillmask_serving.py")
DISCRIMINATOR = "hf-discriminator"
MODEL_DIR = "model"         # MLflow's name for the transformers flavor's weights folder


def save_model(path, mlflow_model, pretrain_dir, signature=None, input_example=None, pip_requirements=None,
               **_ignored) -> None:
    import mlflow.pyfunc
    import mlflow.transformers
    import transformers
    path, pretrain_dir = Path(path), Path(pretrain_dir)
    hf = pretrain_dir / "hf"
    quiet = [logging.getLogger(n) for n in ("mlflow.transformers", "transformers")]
    levels = [q.level for q in quiet]
    for q in quiet:                 # "model card could not be retrieved from the hub" and "verify the license":
        q.setLevel(logging.ERROR)   # a local export has neither
    try:
        pipe = transformers.pipeline("fill-mask", model=str(hf), tokenizer=str(hf), device="cpu")
        mlflow.transformers.save_model(pipe, str(path), task="fill-mask", mlflow_model=mlflow_model,
                                       signature=signature, input_example=input_example,
                                       pip_requirements=pip_requirements, code_paths=[str(LOADER)])
    finally:
        for q, lv in zip(quiet, levels):
            q.setLevel(lv)
    (path / "LICENSE.txt").unlink(missing_ok=True)      # it points at huggingface.co/<this local folder>
    shutil.rmtree(path / MODEL_DIR)
    shutil.copytree(hf, path / MODEL_DIR)
    if (pretrain_dir / DISCRIMINATOR).is_dir():
        shutil.copytree(pretrain_dir / DISCRIMINATOR, path / DISCRIMINATOR)
    code = mlflow_model.flavors["transformers"]["code"]
    # the environment files transformers' save_model wrote, as its own python_function entry names them
    env = mlflow_model.flavors["python_function"]["env"]
    mlflow.pyfunc.add_to_model(mlflow_model, loader_module=LOADER.stem, code=code, conda_env=env["conda"],
                               python_env=env["virtualenv"])
    mlflow_model.save(str(path / "MLmodel"))


def is_transformers_model(folder: Path) -> bool:
    """A downloaded MLflow model of the transformers flavor (``MLmodel`` naming it)."""
    import yaml
    f = Path(folder) / "MLmodel"
    if not f.is_file():
        return False
    return "transformers" in ((yaml.safe_load(f.read_text(encoding="utf-8")) or {}).get("flavors") or {})
