"""The ``mlm-compare`` Prefect flow: ``mlm compare MODEL_A MODEL_B --config CONFIG`` from the UI.

It calls ``tasks.compare.run_compare``, the function the CLI calls, so both write the same files and the same
MLflow run; inside the flow run it also publishes the comparison table as a markdown artifact.
"""
from __future__ import annotations

from typing import Annotated

from prefect import flow, get_run_logger
from pydantic import Field

from flows.pipeline import ConfigPath, Overrides
from tasks.compare import run_compare

ModelRef = Annotated[str, Field(description="A model folder, models:/NAME@ALIAS, models:/NAME/VERSION or "
                                            "models:/NAME/latest.")]


@flow(name="mlm-compare", description="Two models on the same held-out data (evaluate + audit), B - A, "
                                      "logged as one MLflow run.")
def compare_flow(config_path: ConfigPath = "configs/adapt.yaml", model_a: ModelRef = "models:/mlm-demo@champion",
                 model_b: ModelRef = "models:/mlm-adapt/latest", overrides: Overrides = []) -> dict:  # noqa: B006
    """Compare model A (before) with model B (after) on the config's held-out data.

    Args:
        config_path: Pipeline YAML whose normalize/shards outputs are the held-out data and whose tracking
            settings locate the registry and the experiment.
        model_a: The model before (e.g. the base model).
        model_b: The model after (e.g. the continued-pretraining result).
        overrides: Config overrides KEY.PATH=VALUE in YAML syntax.
    """
    out = run_compare(config_path, model_a, model_b, overrides)
    get_run_logger().info("compare: %s vs %s -> %s (MLflow run %s)", model_a, model_b, out["paths"]["md"],
                          out["run_id"])
    return {k: out[k] for k in ("paths", "run_id", "experiment", "fingerprint", "published")}
