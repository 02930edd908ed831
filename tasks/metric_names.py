"""MLflow metric names: our internal metric keys -> sectioned names (``train/loss``, ``val/en/mask_acc``, ...).

In: an internal key as stored (a manifest metric such as ``en.val_acc``, or a ``metrics.jsonl`` record field
such as ``loss`` of a ``train`` record) and the stage it belongs to. Out: the name MLflow shows. The one
place that maps them: live logging (``Tracker.log_stage``, the metrics stream) and ``mlm sync`` (replaying
metrics.jsonl and manifests) both go through ``mlflow_name``, so a synced run gets the names of a live one.
The stored outputs keep their keys (fingerprints and bytes unchanged).

Why: MLflow's run page groups charts into sections by the part of the name before its last ``/`` and sorts
both sections and the charts in a section by name (MLflow 3.17 UI, ``RunsChartsCardConfig.
getBaseChartAndSectionConfigs``: named sections ``.sort()``-ed, then "Model metrics" for unprefixed names,
then "System metrics"). A pretrain run showed ~55 unsectioned charts with the loss far down. Here the
pretrain run's first section is ``train`` and its first chart ``train/loss``: every other training figure
either sorts after ``loss`` in ``train/`` or sits in a later sub-section (``train/loss_parts``,
``train/optim``, ``train/speed``); in-training validation follows in ``val/`` and ``val/<lang>/``.
Other stages get one section per stage (``eval/<lang>/`` for evaluate, ``normalize/<lang>/`` ...).
"""
from __future__ import annotations

# pretrain's training records (metrics.jsonl "train"): sub-sections sorting after the "train" section
TRAIN_SUBSECTION = {"lr": "optim", "grad_norm": "optim",
                    "tokens_per_s": "speed", "mfu": "speed", "data_pct": "speed", "masking_pct": "speed"}
# pretrain's manifest totals and final loss: in the train section, after "loss"
PRETRAIN_TRAIN_KEYS = {"steps": "train/steps", "tokens": "train/tokens", "params": "train/params",
                       "final_loss": "train/loss_final"}
# one section per stage; stages not listed (e.g. a ``compare`` run) keep their keys as they are
STAGE_SECTION = {"normalize": "normalize", "tokenizer": "tokenizer", "shards": "shards", "evaluate": "eval",
                 "audit": "audit", "register": "register"}


def _train_name(key: str) -> str:
    if key == "loss":
        return "train/loss"
    if key.endswith("_loss") or key == "bias_reg":      # objective parts (mlm_loss, disc_loss, bias_reg)
        return f"train/loss_parts/{key}"
    sub = TRAIN_SUBSECTION.get(key)
    return f"train/{sub}/{key}" if sub else f"train/{key}"


def _val_name(key: str) -> str:
    """``en.val_mask_acc`` and ``en.mask_acc`` -> ``val/en/mask_acc``; a key without a language -> ``val/<key>``."""
    if "." not in key:
        return f"val/{key}"
    lang, rest = key.split(".", 1)
    rest = rest[len("val_"):] if rest.startswith("val_") else rest
    return f"val/{lang}/{rest.replace('.', '/')}"


def mlflow_name(stage: str, key: str, kind: str | None = None) -> str:
    """The MLflow name of internal metric ``key`` of ``stage``; ``kind``: a metrics.jsonl record's type
    (``train`` / ``eval``), None for a manifest metric (``tasks.publish.flat_metrics``)."""
    key = str(key)
    if stage == "pretrain":
        if kind == "train":
            return _train_name(key)
        if kind is None and key in PRETRAIN_TRAIN_KEYS:
            return PRETRAIN_TRAIN_KEYS[key]
        return _val_name(key)
    section = STAGE_SECTION.get(stage)
    return f"{section}/{key.replace('.', '/')}" if section else key


def mlflow_metrics(stage: str, metrics: dict) -> dict:
    """``metrics`` (a manifest's flat metrics) keyed by their MLflow names."""
    return {mlflow_name(stage, k): v for k, v in (metrics or {}).items()}


def val_acc_languages(metric_keys) -> list[str]:
    """The languages a pretrain run validated on, from its MLflow metric names (``val/<lang>/acc``; runs
    logged before the sectioned names: ``<lang>.val_acc``)."""
    langs = set()
    for k in metric_keys:
        parts = k.split("/")
        if len(parts) == 3 and parts[0] == "val" and parts[2] == "acc":
            langs.add(parts[1])
        elif k.endswith(".val_acc") and k.count(".") == 1:
            langs.add(k[: -len(".val_acc")])
    return sorted(langs)


__all__ = ["mlflow_name", "mlflow_metrics", "val_acc_languages"]
