"""Efficiency metrics (issue 13 part 4): parameters against transformers' count, latency percentiles, the
CPU peak-memory tracker against known allocations, gates, the model card and the evaluate data contract."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mlm_core.config import GatesConfig, ModelConfig, TokenizerConfig

SPECIALS = {"pad": {"token": "[PAD]", "id": 0}, "unk": {"token": "[UNK]", "id": 1}, "cls": {"token": "[CLS]", "id": 2},
            "sep": {"token": "[SEP]", "id": 3}, "mask": {"token": "[MASK]", "id": 4}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny random encoder (max_positions 128) + tokenizer saved as a pretrain output, and its HF export."""
    from mlm_core.model import MLMEncoder, resolve_arch, save_weights
    from mlm_core.model.export import export_hf
    from mlm_core.tokenizer.build import train
    tok = train(TokenizerConfig(algorithm="wordpiece", vocab_size=200), ["a small corpus for a tiny tokenizer"] * 20)
    arch = resolve_arch(ModelConfig(layers=2, hidden=32, heads=2, ffn=64, max_positions=128),
                        vocab_size=tok.get_vocab_size(), pad_id=0)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("model")
    model = MLMEncoder(arch)
    save_weights(model, folder / "model.safetensors")
    tok.save(str(folder / "tokenizer.json"))
    export_hf(model, folder / "hf", folder / "tokenizer.json", SPECIALS)
    return folder


@pytest.fixture(scope="module")
def report(model_dir, one_torch_thread):
    from mlm_core.evaluate.efficiency import measure_model_dir
    return measure_model_dir(model_dir, repeats=7, device="cpu")


def test_parameters_equal_transformers_count(model_dir, report):
    from transformers import BertForMaskedLM
    hf = BertForMaskedLM.from_pretrained(model_dir / "hf")
    # transformers' own count (a tied decoder weight counted once) of the exported, equivalent model
    assert report["parameters"] == hf.num_parameters()


def test_latency_throughput_memory_shape(report):
    lat = report["latency_ms"]
    assert 0 < lat["p50"] <= lat["p95"] and lat["batch"] == 1 and lat["seq_len"] == 128 and lat["repeats"] == 7
    assert report["throughput"]["sequences_per_s"] > 0 and report["throughput"]["batch"] == 32
    mem = report["peak_memory_mb"]
    # activations of batch 32 x 128 x 32 hidden fp32 are 0.5 MB each: the peak holds weights and more than one
    assert mem["128"] > report["weights_mb"] + 0.5
    assert mem["512"] is None and "max_positions 128" in report["skipped"]["peak_memory_mb.512"]
    assert report["device_kind"] == "cpu" and report["device"] and report["model"] == "mlm"


def test_cpu_peak_tracker_on_known_allocations(one_torch_thread):
    from mlm_core.evaluate.efficiency import _PeakBytes
    x = torch.zeros(1000, 1000)           # 4 MB, allocated before: not counted
    with _PeakBytes() as t:
        a = x + 1                         # 4 MB live
        b = a * 2                         # 8 MB live
        del a                             # 4 MB live
        c = b + 1                         # 8 MB live
        v = c.view(-1)                    # a view allocates nothing
    assert t.peak == 8 * 1000 * 1000 and t.current == 8 * 1000 * 1000
    del b, c, v


def test_percentiles_are_numpys(monkeypatch, model_dir, one_torch_thread):
    """p50 / p95 of the timed passes: with the clock scripted, exactly numpy's interpolated percentiles."""
    import numpy as np

    from mlm_core.evaluate import efficiency
    from mlm_core.fillmask import load_model_dir
    model = load_model_dir(model_dir)[0]
    times = iter(np.cumsum([0.0] + [0.001 * k for k in range(1, 400)]).tolist())
    monkeypatch.setattr(efficiency.time, "perf_counter", lambda: next(times))
    out = efficiency.measure(model, repeats=10, device="cpu")
    # the clock advances 1, 2, 3, ... ms between successive readings; the warm-up pass reads none and each
    # timed pass reads it twice, so the latency passes last 1, 3, 5, ..., 19 ms
    durations = [2 * k + 1 for k in range(10)]
    assert out["latency_ms"]["p50"] == pytest.approx(float(np.percentile(durations, 50)))
    assert out["latency_ms"]["p95"] == pytest.approx(float(np.percentile(durations, 95)))


def _evaluation(p95: float = 12.0, params: int = 1000) -> dict:
    return {"efficiency": {"device": "Test CPU", "parameters": params, "latency_ms": {"p50": 10.0, "p95": p95},
                           "throughput": {"sequences_per_s": 50.0}, "peak_memory_mb": {"128": 20.0, "512": 80.0}}}


def test_gates_pass_and_fail_on_the_threshold():
    from mlm_core.register.gates import evaluate_gates
    ev = _evaluation()
    ok = evaluate_gates(GatesConfig(min_top1_over_baseline=None, max_p95_latency_ms=12.5, min_throughput=40,
                                    max_peak_memory_mb=100, max_parameters=1000), ev, {})
    assert [g.name for g in ok] == ["max_p95_latency_ms", "min_throughput", "max_peak_memory_mb", "max_parameters"]
    assert all(g.passed for g in ok) and "Test CPU" in ok[0].detail
    bad = evaluate_gates(GatesConfig(min_top1_over_baseline=None, max_p95_latency_ms=11.9, min_throughput=60,
                                     max_peak_memory_mb=79), ev, {})
    assert [g.passed for g in bad] == [False, False, False] and bad[2].value == 80.0   # the longest seq_len
    missing = evaluate_gates(GatesConfig(min_top1_over_baseline=None, max_p95_latency_ms=5), {}, {})
    assert not missing[0].passed and "efficiency" in missing[0].detail


def test_model_card_has_the_efficiency_section(report):
    from mlm_core.register.modelcard import model_card
    card = model_card(name="m", version=1, fingerprints={}, data={}, tokenizer={}, training={},
                      evaluation={"efficiency": report}, audit={}, gates=[], promoted=False)
    assert "### Efficiency" in card and report["device"] in card
    assert f"{report['parameters']:,}" in card and "latency p50 / p95" in card


def test_evaluate_contract_passes_with_the_new_fields(tmp_path, report):
    import pyarrow as pa
    import pyarrow.parquet as pq

    import tasks.validation.contracts  # noqa: F401  (registers the table providers)
    from mlm_core.evaluate.stage import intrinsic_rows, transfer_rows
    from tasks.validation import ValidationFailed, validate_stage
    intr = {"en": {"n_positions": 10, "top1": 0.5, "top5": 0.7, "ece": 0.1, "baseline_top1": 0.2}}
    transfer = {"classification": {"source_score": 0.8, "targets": {"fr": {"score": 0.6, "macro_f1": 0.55}}}}

    def write(eff: dict) -> Path:
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        result = {"intrinsic": intr, "transfer": transfer, "efficiency": eff}
        pq.write_table(pa.Table.from_pylist(intrinsic_rows(result)), d / "intrinsic.parquet")
        pq.write_table(pa.Table.from_pylist(transfer_rows(result)), d / "transfer.parquet")
        (d / "evaluation.json").write_text(json.dumps(result))
        return d

    manifest = {"languages": {"en": {}}}
    rep = validate_stage("evaluate", write(report), manifest)
    assert rep.success and rep.n_rows_sampled["efficiency"] == 1
    assert validate_stage("evaluate", write({}), manifest).success     # efficiency off
    broken = dict(report, latency_ms={**report["latency_ms"], "p50": report["latency_ms"]["p95"] + 1})
    with pytest.raises(ValidationFailed):
        validate_stage("evaluate", write(broken), manifest)


def test_cuda_requested_without_a_device_is_a_clear_error():
    from mlm_core.evaluate.efficiency import resolve_device
    if torch.cuda.is_available():
        assert resolve_device("cuda").type == "cuda" and resolve_device("auto").type == "cuda"
    else:
        with pytest.raises(ValueError, match="evaluate.efficiency_device"):
            resolve_device("cuda")
        assert resolve_device("auto").type == "cpu"
