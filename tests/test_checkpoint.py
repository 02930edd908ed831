"""Checkpoints: kill -9 at random moments never leaves a loadable partial checkpoint, a corrupt checkpoint
is skipped for the previous complete one, another architecture is refused by name, no pickles."""
from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from test_train import read_metrics, run, tiny_cfg, tiny_shards  # noqa: F401  (shared tiny-data helpers)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("tiny-ckpt"))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def last_logged(work: Path) -> int:
    """Last logged step; tolerant of a line being written right now."""
    steps = []
    for ln in (work / "metrics.jsonl").read_text().splitlines() if (work / "metrics.jsonl").exists() else []:
        try:
            steps.append(json.loads(ln)["step"])
        except ValueError:
            pass
    return steps[-1] if steps else 0


def complete_steps(root: Path) -> list[int]:
    from mlm_core.train.checkpoint import find_latest, verify
    steps = []
    for p in sorted(root.glob("step-*")):
        verify(p)                                  # every folder named step-* is complete and intact
        steps.append(int(p.name[5:]))
    latest = find_latest(root)
    assert (latest[0].name if latest else None) == (f"step-{steps[-1]:012d}" if steps else None)
    return steps


@pytest.mark.heavy
def test_kill_9_at_random_moments_then_resume_exactly(shards, tmp_path):
    """5 trials of kill -9 on a ``python -m mlm_core.train.worker`` process (one while a checkpoint folder is
    being written, made slow by the MLM_CHECKPOINT_DELAY_S hook); each restart resumes from the newest
    complete checkpoint, losing at most one interval; the finished run's losses equal a run never killed."""
    every, steps = 5, 60
    cfg = tiny_cfg(steps=steps, checkpoint_every=every, keep_checkpoints=3, model={"dropout": 0.1})
    straight = run(cfg, shards[0], tmp_path / "straight")
    work = tmp_path / "killed"
    args = {"config": cfg.model_dump(mode="json"), "seed": 0, "shards": str(shards[0].path), "out_dir": str(work),
            "result_file": str(tmp_path / "result.json")}
    (tmp_path / "args.json").write_text(json.dumps(args))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    rng = random.Random(7)
    ckroot = work / "checkpoints"
    during_write_seen = False
    for trial in range(5):
        during_write = trial == 2
        penv = {**env, "MLM_CHECKPOINT_DELAY_S": "30"} if during_write else env
        base = max(complete_steps(ckroot)) if ckroot.exists() and list(ckroot.glob("step-*")) else 0
        proc = subprocess.Popen([sys.executable, "-m", "mlm_core.train.worker", str(tmp_path / "args.json")],
                                env=penv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        target = base + rng.randint(2, 9)
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 60:
            tmp = list(ckroot.glob(f".tmp-step-*-{proc.pid}")) if ckroot.exists() else []   # this writer's
            logged = last_logged(work)
            if (during_write and tmp) or (not during_write and logged >= target):
                if during_write:
                    during_write_seen = True
                    time.sleep(rng.uniform(0.0, 0.5))
                break
            time.sleep(0.02)
        assert proc.poll() is None, f"trial {trial}: the worker ended on its own: {proc.stderr.read().decode()[-2000:]}"
        proc.kill()
        proc.wait()
        logged = last_logged(work)
        have = complete_steps(ckroot)
        assert logged - have[-1] <= every, (trial, logged, have)
        if during_write:
            assert list(ckroot.glob(f".tmp-step-*-{proc.pid}")), "the kill was meant to land inside a checkpoint write"
    assert during_write_seen
    # the last restart runs to the end: a partial folder is never read and is cleaned up
    before = max(complete_steps(ckroot))
    r = subprocess.run([sys.executable, "-m", "mlm_core.train.worker", str(tmp_path / "args.json")], env=env,
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["resumed_from"] == before and result["completed"]
    assert not list(ckroot.glob(".tmp-step-*"))
    assert complete_steps(ckroot) == [50, 55, 60]                # keep_checkpoints=3
    assert [(m["step"], m["loss"]) for m in read_metrics(work)] == \
           [(m["step"], m["loss"]) for m in read_metrics(tmp_path / "straight")]
    assert result["final_loss"] == straight["final_loss"]
    # exact resume down to the bytes: the last checkpoint's model and optimizer files equal the straight run's
    last = "step-000000000060"
    for name in ("model.safetensors", "optimizer.safetensors", "optimizer.json", "scheduler.json"):
        assert (ckroot / last / name).read_bytes() == (tmp_path / "straight" / "checkpoints" / last / name).read_bytes(), name


def test_corrupt_checkpoint_is_skipped_for_the_previous_one(shards, tmp_path, caplog):
    cfg = tiny_cfg(steps=9, checkpoint_every=3, keep_checkpoints=3)
    run(cfg, shards[0], tmp_path)
    root = tmp_path / "checkpoints"
    assert complete_steps(root) == [3, 6, 9]
    f = root / "step-000000000009" / "optimizer.safetensors"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    (root / "step-000000000006" / "meta.json").unlink()               # incomplete: no meta.json
    with caplog.at_level(logging.WARNING, logger="mlm_core.train.checkpoint"):
        res = run(cfg.model_copy(update={"steps": 10}), shards[0], tmp_path)
    assert res["resumed_from"] == 3
    msgs = " | ".join(r.getMessage() for r in caplog.records)
    assert "step-000000000009: optimizer.safetensors does not match its sha256 (corrupt)" in msgs
    assert "step-000000000006: no meta.json" in msgs


def test_other_architecture_is_refused_by_field(shards, tmp_path):
    from mlm_core.train.checkpoint import CheckpointMismatch
    run(tiny_cfg(steps=3, checkpoint_every=3), shards[0], tmp_path)
    with pytest.raises(CheckpointMismatch) as e:
        run(tiny_cfg(steps=6, model={"hidden": 32, "layers": 2}), shards[0], tmp_path)
    msg = str(e.value)
    assert "hidden: checkpoint 64 vs config 32" in msg and "layers: checkpoint 1 vs config 2" in msg
    assert "heads" not in msg and "vocab_size" not in msg
    with pytest.raises(CheckpointMismatch, match=r"holds an MLM encoder model but the config trains an ELECTRA"):
        run(tiny_cfg(steps=6, objective="electra"), shards[0], tmp_path)


def _is_pickle(data: bytes) -> bool:
    """A pickle stream (protocol 2+ starts with PROTO 0x80) or torch.save's zip container (PK header)."""
    return data[:1] == b"\x80" or data[:2] == b"PK"


def test_checkpoint_files_hold_no_pickles(shards, tmp_path, monkeypatch):
    """Every file is JSON or safetensors (checked by their bytes), resume never calls a pickle loader, and
    the optimizer and RNG states read back without pickle equal what the training process held."""
    import pickle

    import torch
    from safetensors.torch import load_file

    from mlm_core.tensorfile import load_tree
    from mlm_core.train.checkpoint import plain
    run(tiny_cfg(steps=2, checkpoint_every=2, objective="electra"), shards[0], tmp_path)
    d = tmp_path / "checkpoints" / "step-000000000002"
    assert sorted(p.name for p in d.iterdir()) == [
        "meta.json", "model.safetensors", "optimizer.json", "optimizer.safetensors", "rng-rank0.json",
        "rng-rank0.safetensors", "sampler-rank0.json", "scheduler.json", "state.json"]
    for f in d.iterdir():
        data = f.read_bytes()
        assert not _is_pickle(data), f"{f.name} is a pickle"
        if f.suffix == ".json":
            json.loads(data)
        else:                                      # safetensors: u64 header length, then a JSON header
            n = int.from_bytes(data[:8], "little")
            assert json.loads(data[8:8 + n]) is not None and len(load_file(str(f))) >= 1
    opt = load_tree(d / "optimizer.safetensors", d / "optimizer.json")
    assert opt["state"] and {"lr", "betas", "weight_decay"} <= set(opt["param_groups"][0])
    assert isinstance(opt["param_groups"][0]["betas"], tuple)
    assert all(isinstance(k, int) for k in opt["state"]), "integer parameter ids must come back as ints"
    assert set(opt["state"]) <= {i for g in opt["param_groups"] for i in g["params"]}
    rng = load_tree(d / "rng-rank0.safetensors", d / "rng-rank0.json")
    assert {"torch_cpu", "gen_mask", "numpy", "python"} <= set(rng)
    assert rng["torch_cpu"].dtype == torch.uint8 and len(rng["numpy"][1]) == 624
    meta = json.loads((d / "meta.json").read_text())
    assert meta["format"] == 2
    assert set(meta["files"]) == {p.name for p in d.iterdir()} - {"meta.json"}
    assert meta["step"] == 2 and meta["tokens"] == 2 * 4 * 32 and meta["arch"]["generator"]["hidden"] < 64
    assert "gen.tok_emb.0.weight" in meta["aliases"] or any("tok_emb" in a for a in meta["aliases"])
    assert len(load_file(str(d / "model.safetensors"))) > 10
    with pytest.raises(TypeError, match="cannot store object"):
        plain({"a": [object()]})

    # resuming reads no pickle: any pickle loader called during it fails the test
    def no_pickle(*a, **k):
        raise AssertionError("a pickle loader was called while resuming")
    monkeypatch.setattr(torch, "load", no_pickle)
    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(pickle, "loads", no_pickle)
    res = run(tiny_cfg(steps=3, checkpoint_every=2, objective="electra"), shards[0], tmp_path)
    assert res["resumed_from"] == 2


def test_optimizer_and_rng_states_round_trip_exactly(tmp_path):
    """save_tree/load_tree give back an AdamW state that continues bit for bit, and every RNG stream."""
    import random as pyrandom

    import numpy as np
    import torch

    from mlm_core.tensorfile import load_tree, save_tree
    from mlm_core.train.checkpoint import rng_state, set_rng_state
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95))

    def step(o):
        o.zero_grad()
        model(torch.ones(3, 4)).square().sum().backward()
        o.step()
    step(opt)
    save_tree(opt.state_dict(), tmp_path / "o.safetensors", tmp_path / "o.json")
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    step(opt)
    after_a = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(snapshot)
    opt2 = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt2.load_state_dict(load_tree(tmp_path / "o.safetensors", tmp_path / "o.json"))
    assert opt2.param_groups[0]["betas"] == (0.8, 0.95)
    step(opt2)
    assert all(torch.equal(after_a[k], v) for k, v in model.state_dict().items())

    g = torch.Generator().manual_seed(5)
    save_tree(rng_state({"mask": g}), tmp_path / "r.safetensors", tmp_path / "r.json")
    first = (torch.rand(3), torch.rand(2, generator=g), np.random.rand(2), pyrandom.random())
    torch.manual_seed(99), np.random.seed(99), pyrandom.seed(99), g.manual_seed(99)
    set_rng_state(load_tree(tmp_path / "r.safetensors", tmp_path / "r.json"), {"mask": g})
    again = (torch.rand(3), torch.rand(2, generator=g), np.random.rand(2), pyrandom.random())
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert np.array_equal(first[2], again[2]) and first[3] == again[3]


def test_old_pickle_checkpoint_is_refused_by_name(shards, tmp_path):
    """A format-1 checkpoint (torch.save pickles) is never unpickled and never silently skipped."""
    from mlm_core.train.checkpoint import CheckpointFormatError
    run(tiny_cfg(steps=2, checkpoint_every=2), shards[0], tmp_path)
    d = tmp_path / "checkpoints" / "step-000000000002"
    meta = json.loads((d / "meta.json").read_text())
    (d / "meta.json").write_text(json.dumps({**meta, "format": 1}))
    with pytest.raises(CheckpointFormatError, match=r"step-000000000002 is a format-1 checkpoint.*never unpickles"):
        run(tiny_cfg(steps=4, checkpoint_every=2), shards[0], tmp_path)
