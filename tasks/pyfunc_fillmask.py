"""MLflow "models from code" script: the registered model's ``python_function`` flavor (fill-mask) when the
pretrain output has no Hugging Face export (our own weights folder only); models with an ``hf/`` export are
logged with the transformers flavor instead (``tasks.mlflow_hf_model``, ``tasks/fillmask_serving.py``).

Never imported by the pipeline: ``tasks.mlflow_model`` passes this file's *path* to ``mlflow.pyfunc.log_model``,
which copies it into the logged model, and ``mlflow.pyfunc.load_model`` / ``mlflow models serve`` execute it.
Models from code instead of a pickled ``PythonModel``: the registry holds no pickle, only this source, the
safetensors weights and the tokenizer (artifact ``hf``: the Hugging Face export; ``weights``: our own folder
when the architecture has no export). It needs ``mlm_core`` importable (the mlm-pipeline package installed:
serve with ``--env-manager local``) and nothing from the network.

In: a DataFrame with a string column ``text`` (or a list of strings, or one string), each text holding the
tokenizer's mask token ([MASK] or <mask>); param ``top_k`` (default 5). Out: a DataFrame, one row per
(input row, mask, rank): row, mask, rank, token, token_id, score, sequence.
"""
from __future__ import annotations

from pathlib import Path

import mlflow
from mlflow.pyfunc import PythonModel

COLUMNS = ["row", "mask", "rank", "token", "token_id", "score", "sequence"]


def _texts(model_input) -> list[str]:
    import pandas as pd
    if isinstance(model_input, str):
        return [model_input]
    if isinstance(model_input, pd.DataFrame):
        col = "text" if "text" in model_input.columns else model_input.columns[0]
        return [str(t) for t in model_input[col].tolist()]
    if isinstance(model_input, dict):
        v = model_input.get("text", next(iter(model_input.values()), []))
        return [v] if isinstance(v, str) else [str(t) for t in v]
    return [str(t) for t in model_input]


class FillMask(PythonModel):
    # the signature is declared when logging (tasks.mlflow_model.signature): no type-hint validation/inference
    # (and no "Add type hints" warning on every load)
    _skip_type_hint_validation = True

    def load_context(self, context):
        from mlm_core.fillmask import load_model_dir
        arts = context.artifacts
        self._loaded = load_model_dir(Path(arts.get("hf") or arts["weights"]))

    def predict(self, context, model_input, params=None):
        import pandas as pd

        from mlm_core.fillmask import fill_mask_loaded
        top_k = int((params or {}).get("top_k") or 5)
        rows = []
        for i, text in enumerate(_texts(model_input)):
            for m, preds in enumerate(fill_mask_loaded(self._loaded, text, top_k)):
                rows += [{"row": i, "mask": m, "rank": r + 1, **p} for r, p in enumerate(preds)]
        return pd.DataFrame(rows, columns=COLUMNS)


mlflow.models.set_model(FillMask())
