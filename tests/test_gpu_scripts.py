"""The GPU scripts stay runnable while no GPU is lent (issues 21 and 23): their CPU dry runs take the same code path
(gpu.sh: the benchmark on a tiny model; experiments_gpu.sh: every sweep planned with the GPU size words), and on a
machine without CUDA the real run refuses with a line naming the dry run."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import REPO

pytestmark = pytest.mark.heavy


def _run(args, **env):
    return subprocess.run(["bash", *args], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **env})


def test_experiments_gpu_dry_run_plans_every_sweep_at_the_gpu_size(tmp_path):
    r = _run(["benchmarks/experiments_gpu.sh", "--dry-run"], OUT=str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr[-2000:]
    heads = [l for l in r.stdout.splitlines() if l.startswith("sweep ")]
    assert [h.split()[1].rstrip(":") for h in heads] == ["masking-rate", "masking-strategy", "temperature",
                                                          "masking-schedule", "electra-vs-mlm", "bias-mitigation"]
    rows = [l.split() for l in r.stdout.splitlines() if l.startswith(("rate0.15 ", "token ", "alpha0.3 "))]
    assert rows and all(row[2] == "1500" for row in rows), rows       # the GPU steps reach every run
    assert not (tmp_path / "out").exists()                            # a dry run writes nothing


def test_gpu_scripts_refuse_without_cuda_and_name_the_dry_run(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    for script in ("benchmarks/experiments_gpu.sh", "benchmarks/gpu.sh"):
        r = _run([script], OUT=str(tmp_path / "out"))
        assert r.returncode == 2, (script, r.stdout[-500:], r.stderr[-500:])
        assert "no CUDA device visible" in r.stderr and "--dry-run" in r.stderr, r.stderr


def test_gpu_bench_dry_run_measures_both_models(tmp_path):
    out = tmp_path / "gpu"
    r = _run(["benchmarks/gpu.sh", "--dry-run"], OUT=str(out))
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    res = json.loads((tmp_path / "gpu-dry-run" / "gpu_results.json").read_text())
    eager = [r for r in res["rows"] if not r["compiled"]]
    # every uncompiled row of both models measured: no error, a positive rate and an MFU in (0, 1]
    assert {r["impl"] for r in eager} == {"ours", "hf"} and len(eager) == 2 * len({r["seq"] for r in eager}), eager
    for r in eager:
        assert "error" not in r and r.get("tokens_per_s", 0) > 0 and 0 < r["mfu"] <= 1, r
