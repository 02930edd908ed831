"""Config sections of the register stage (registry, promotion gates) and of operations (MLflow tracking, where
data-stage partitions run), split out of ``mlm_core.config`` (re-exported there; the effect markers are explained
in its docstring).

Like ``mlm_core.config`` this module is a leaf.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from mlm_core.config.effects import Section


class GatesConfig(Section):
    """Promotion gates: the model moves to alias `champion` only when every declared gate passes."""

    min_top1: float | None = Field(default=None, ge=0, le=1, description="Minimum masked-token top-1 accuracy in every language.",
        json_schema_extra={"effect": "output"})
    min_top1_over_baseline: float | None = Field(
        default=0.0, description="Minimum top-1 margin over the unigram-frequency baseline in every language.",
        json_schema_extra={"effect": "output"})
    top1_over_baseline_ci_above: float | None = Field(
        default=None, ge=-1, lt=1, description="The lower end of the bootstrap 95% interval of (top-1 − unigram "
        "baseline top-1), at the same masked positions, must be strictly above this value in every language "
        "(0 = the model beats the baseline beyond sampling noise of the validation documents).",
        json_schema_extra={"effect": "output"})
    max_ece: float | None = Field(default=None, ge=0, le=1, description="Maximum expected calibration error in every language.",
        json_schema_extra={"effect": "output"})
    max_crows_deviation: float | None = Field(default=None, ge=0, le=50, description="Maximum |CrowS-Pairs score − 50| in every audited language.",
        json_schema_extra={"effect": "output"})
    max_transfer_gap: float | None = Field(default=None, ge=0, description="Maximum zero-shot transfer gap (source − target score).",
        json_schema_extra={"effect": "output"})
    min_transfer_gain_over_untrained: float | None = Field(
        default=None, ge=-1, lt=1, description="Per transfer task and target language, the lower end of the 95% "
        "bootstrap interval of gain_over_untrained (score − the untrained-encoder control's score, paired over "
        "target sentences) must be strictly above this value (0 = pretraining helps beyond the sampling noise of "
        "the target sentences). The lower end, not the mean: a mean gain inside the noise does not pass. Needs "
        "evaluate.untrained_control; a target without the control fails.",
        json_schema_extra={"effect": "output", "omit_default": True})
    min_rtd_acc_over_baseline: float | None = Field(
        default=None, ge=-1, le=1, description="ELECTRA: minimum margin of the discriminator's replaced-token "
        "detection accuracy over predicting 'original' everywhere, in every language (fraction of tokens). "
        "A model without a discriminator fails it.", json_schema_extra={"effect": "output"})
    min_rtd_auc: float | None = Field(
        default=None, ge=0, le=1, description="ELECTRA: minimum ROC AUC of the discriminator's replaced-token "
        "logits on held-out rows, in every language (0.5 = chance).", json_schema_extra={"effect": "output"})
    max_p95_latency_ms: float | None = Field(default=None, gt=0, description="Maximum p95 inference latency at batch 1 "
        "(ms; evaluate's efficiency report, on the device it names).", json_schema_extra={"effect": "output"})
    min_throughput: float | None = Field(default=None, gt=0, description="Minimum inference throughput at batch 32 "
        "(sequences/s).", json_schema_extra={"effect": "output"})
    max_peak_memory_mb: float | None = Field(default=None, gt=0, description="Maximum peak inference memory (MB) at the "
        "longest measured seq_len (512, or 128 when the model is shorter).", json_schema_extra={"effect": "output"})
    max_parameters: int | None = Field(default=None, ge=1, description="Maximum number of model parameters.",
        json_schema_extra={"effect": "output"})


class RegistryConfig(Section):
    """The MLflow model registry: where trained models are registered and when they are promoted."""

    model_name: str = Field(default="mlm-model", description="Registered model name.",
        json_schema_extra={"effect": "output"})
    gates: GatesConfig = Field(default_factory=GatesConfig, description="Promotion gates.")
    fail_on_gates: bool = Field(
        default=False, description="When a promotion gate fails, end the Prefect flow run Failed (state message "
        "'registered version N, gates FAILED (k of n): ...') instead of Completed with that message. The model is "
        "registered either way (no champion alias). Default off: interactive users want a failed-gate model "
        "registered as a candidate to inspect, and `mlm run` already exits 3 when gates fail; turn it on for "
        "scheduled runs (Prefect deployments), where only a Failed flow run raises an alert.",
        json_schema_extra={"effect": "none"})


class TrackingConfig(Section):
    """MLflow tracking: where runs, metrics and artifacts go."""

    uri: str | None = Field(
        default=None,
        description="MLflow tracking URI (http://host:port or sqlite:///path). Default: a SQLite file in the workdir.",
        json_schema_extra={"effect": "none"})
    experiment: str = Field(default="mlm-pipeline", description="MLflow experiment name.",
        json_schema_extra={"effect": "none"})
    enabled: bool = Field(default=True, description="Log to MLflow at all.", json_schema_extra={"effect": "none"})


class ExecutionConfig(Section):
    """Where the partitions of the data stages (normalize, shards) run: speed only, outputs are byte-identical
    whatever is set here (docs/SCALING.md)."""

    engine: Literal["local", "dask"] = Field(
        default="local", description="local: this process's own pool (normalize.workers / shards.workers); "
        "dask: batches of partitions (about 3 per worker thread) are Prefect tasks on prefect-dask's DaskTaskRunner "
        "(a cluster at `address`, else a LocalCluster of `workers` processes). Workers must see the workdir "
        "(shared filesystem).",
        json_schema_extra={"effect": "none"})
    address: str | None = Field(
        default=None, description="engine dask: the scheduler of an existing cluster, e.g. tcp://10.0.0.5:8786 "
        "(unset: a LocalCluster on this machine). Ignored, with a warning, by engine local.",
        json_schema_extra={"effect": "none"})
    workers: int = Field(default=2, ge=1, description="engine dask without address: LocalCluster worker processes "
                         "(one thread each). With `address`: the cluster's worker threads, which `partition_mb: auto` "
                         "sizes partitions for.", json_schema_extra={"effect": "none"})
    partition_mb: float | Literal["auto"] = Field(
        default="auto", description="Large inputs are split into partitions of about this many MiB (normalize: "
        "by file and byte range; shards: by language and run of documents), each processed independently. auto: "
        "from the input's size and the workers (about 4 partitions per worker, each between 8 and 64 MiB; "
        "mlm_core/partition_size.py).", json_schema_extra={"effect": "none"})

    @field_validator("partition_mb", mode="before")
    @classmethod
    def _size_or_auto(cls, v):
        if v is None or v == "auto":
            return "auto"
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v != v or v == float("inf"):
            raise ValueError("must be a size in MiB > 0 or 'auto'")
        return float(v)
