"""Two real `mlm run` on one fresh workdir reach registration together and register one version (issue 24 item 2).

The runs are made to overlap, not hoped to: a ``sitecustomize`` put on the runs' PYTHONPATH by this test (no hook in
the project's code) wraps ``tasks.registry`` when it is imported, so that each run writes ``<pid>.arrived`` when it
reaches registration and waits there until both have arrived; inside the registry lock each writes
``<pid>.interval`` (entered, left, version). Both arrival times precede both exits from
registration, so the two runs were in registration at once; then one of them waited on the registry lock.
Before the fix the two runs both found no version and registered two (version 1 left ``evaluation=pending``), or
one died on SQLite's UNIQUE constraint on ``model_version_tags`` with exit 1.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from conftest import REPO, write_en_ru_config

MLM = [sys.executable, "-m", "flows.cli"]
NAME = "concurrent-model"

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.heavy]


BARRIER = r'''
import contextlib, importlib.abc, importlib.machinery, os, sys, time
from pathlib import Path

FOLDER = Path(os.environ["REGISTRY_BARRIER_DIR"])


def _patch(reg):
    lock, register = reg.registry_lock, reg._register_pretrained

    @contextlib.contextmanager
    def barrier_lock(lc, what):
        if what.startswith("registering pretrain output"):      # arrive, then wait (<= 120 s) for the other run
            FOLDER.mkdir(parents=True, exist_ok=True)
            (FOLDER / f"{os.getpid()}.arrived").write_text(repr(time.time()))
            deadline = time.monotonic() + 120
            while len(list(FOLDER.glob("*.arrived"))) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
        with lock(lc, what) as waited:
            yield waited

    def timed_register(art, tracker, run_id, lc):              # runs inside the lock
        t_in = time.time()
        version = register(art, tracker, run_id, lc)
        (FOLDER / f"{os.getpid()}.interval").write_text(f"{t_in!r} {time.time()!r} {version}")
        return version

    reg.registry_lock, reg._register_pretrained = barrier_lock, timed_register


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "tasks.registry":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)
        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())
'''


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "PREFECT_HOME", "MLM_TRACKING_URI", "MLFLOW_TRACKING_URI", "MLM_VERBOSE")}
    return env | {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.timeout(1800)
def test_two_runs_overlapping_at_registration_register_one_version(tmp_path):
    cfg = write_en_ru_config(
        tmp_path, "concurrent", 60,
        tokenizer={"vocab_size": 300, "heldout_docs": 5, "min_vocab_fraction": 0.1, "max_fertility": 20},
        shards={"seq_len": 16, "workers": 1},
        pretrain={"model": {"size": "tiny", "max_positions": 16}, "steps": 10, "batch_size": 8, "eval_every": 1000,
                  "checkpoint_every": 1000, "warmup_steps": 2},
        evaluate={"pll_sentences": 0},
        registry={"model_name": NAME, "gates": {"min_top1_over_baseline": -1.0}})
    work = tmp_path / "work"
    barrier = tmp_path / "barrier"
    assert not work.exists()
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(BARRIER, encoding="utf-8")
    env = _env(REGISTRY_BARRIER_DIR=str(barrier))
    env["PYTHONPATH"] = f"{hook}{os.pathsep}{env['PYTHONPATH']}"
    t0 = time.monotonic()
    procs = [subprocess.Popen([*MLM, "run", str(cfg)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=900))
        finally:
            if p.poll() is None:
                p.kill()
    secs = time.monotonic() - t0
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out[-2000:] + err[-4000:]
        assert "Traceback" not in err and "IntegrityError" not in err, err[-4000:]
    # they overlapped: both arrived at registration before either had left it
    arrived = {f.stem: float(f.read_text()) for f in barrier.glob("*.arrived")}
    intervals = {f.stem: [float(x) for x in f.read_text().split()[:2]] + [int(f.read_text().split()[2])]
                 for f in barrier.glob("*.interval")}
    assert len(arrived) == 2 and sorted(intervals) == sorted(arrived), (arrived, intervals)
    assert max(arrived.values()) < min(left for _, left, _ in intervals.values()), (arrived, intervals)
    (a_in, a_out, va), (b_in, b_out, vb) = sorted(intervals.values())
    assert a_out <= b_in, intervals                 # the lock serialized them: the second entered after the first left
    assert va == vb == 1, intervals                 # and reused the first one's version
    # one of them waited on the lock at registration (either may also wait later, at the evaluation or gate tags,
    # which take the same lock: the CI run saw both runs print a wait, the second one's at a later step)
    waited = [err for _, err in outs
              if re.search(r"registry: another run is writing model .* before registering pretrain output", err)]
    assert len(waited) == 1, [e[-1500:] for _, e in outs]
    # exactly one version for the fingerprint, none left pending
    from tasks.tracking import mlflow_client
    client = mlflow_client(f"sqlite:///{work.resolve()}/mlflow.db")
    versions = [v for v in client.search_model_versions() if v.name == NAME]
    assert len(versions) == 1, [(v.version, v.tags) for v in versions]
    tags = versions[0].tags
    assert tags["evaluation"] in ("passed", "failed") and tags["gates"] == "passed", tags
    fps = {tags["pretrain_fingerprint"]}
    assert len(fps) == 1
    print(f"\nconcurrent runs: both exited 0 in {secs:.1f} s; registration intervals "
          f"{[round(x - min(arrived.values()), 1) for iv in sorted(intervals.values()) for x in iv[:2]]} s after the "
          f"last arrival; one version ({tags['evaluation']}, gates {tags['gates']})")
