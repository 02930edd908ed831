"""The registered model's ``python_function`` flavor when it is a Hugging Face export: fill-mask over MLflow's
``transformers`` flavor, with a clear error for a text that has no mask token.

Never imported by the pipeline: ``tasks.mlflow_hf_model`` ships this file inside the logged model (``code/``) and
names it as the pyfunc loader module (MLflow's custom-flavor hook, ``mlflow.pyfunc.add_to_model(loader_module=...,
code=...)``); ``mlflow.pyfunc.load_model`` / ``mlflow models serve`` import it from there and call
``_load_pyfunc(<model folder>)``. It imports mlflow, transformers and pandas only, never this project, so the model
loads and serves wherever transformers is installed. The weights are read by ``mlflow.transformers.load_model``
from the same folder (the ``transformers`` flavor: ``model/`` + ``components/tokenizer/``).

Why not the transformers flavor's own pyfunc: given a text without the mask token its pipeline raises a
``PipelineException``, which MLflow's scoring server answers with a generic "Verify that the serialized input
Dataframe is compatible" 400; here the check comes first and raises an ``MlflowException`` (INVALID_PARAMETER_VALUE,
HTTP 400) that names the mask token. Its output is also richer (all top-k, not the top-1 string) and is the same
table the project's own pyfunc returns (``tasks/pyfunc_fillmask.py``).

In: a DataFrame with a string column ``text`` (or the first column), a list of strings, or one string; each text
holding the tokenizer's mask token; param ``top_k`` (default 5). Out: a DataFrame, one row per (input row, mask,
rank): row, mask, rank, token, token_id, score, sequence.
"""
from __future__ import annotations

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


class FillMask:
    def __init__(self, pipe):
        self.pipe = pipe
        self.mask = pipe.tokenizer.mask_token

    def predict(self, model_input, params=None):
        import pandas as pd
        from mlflow.exceptions import MlflowException
        texts = _texts(model_input)
        missing = [i for i, t in enumerate(texts) if self.mask not in t]
        if missing:
            shown = ", ".join(str(i) for i in missing[:5]) + (", ..." if len(missing) > 5 else "")
            raise MlflowException.invalid_parameter_value(
                f"fill-mask input needs the tokenizer's mask token {self.mask} in every text: input row(s) {shown} "
                f"have none (e.g. {texts[missing[0]][:80]!r}); write {self.mask} where a word should be predicted")
        top_k = int((params or {}).get("top_k") or 5)
        rows = []
        for i, text in enumerate(texts):
            out = self.pipe(text, top_k=top_k)
            per_mask = out if out and isinstance(out[0], list) else [out]     # one list per mask when several
            for m, preds in enumerate(per_mask):
                rows += [{"row": i, "mask": m, "rank": r + 1, "token": p["token_str"], "token_id": int(p["token"]),
                          "score": float(p["score"]), "sequence": p["sequence"]} for r, p in enumerate(preds)]
        return pd.DataFrame(rows, columns=COLUMNS)


def _load_pyfunc(path, model_config=None):
    import mlflow.transformers
    return FillMask(mlflow.transformers.load_model(str(path)))
