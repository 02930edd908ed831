"""Byte-reproducible outputs: every stage, run twice in separate processes on the same config and inputs,
writes the same bytes, except the time fields declared in mlm_core/reproducible.py.

The pipeline is configs/demo.yaml shrunk to seconds (tiny vocabulary, 6 training steps), plus the variants
whose writers differ: a unigram tokenizer, ELECTRA with span masking (generator + discriminator files).
The second process gets the same workdir path (the first one's is moved aside), so the config is identical
down to the paths it resolves; the two get different PYTHONHASHSEEDs so that nothing may depend on hashing.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO

TINY = ["tokenizer.vocab_size=700", "tokenizer.heldout_docs=20", "shards.seq_len=64",
        "pretrain.model.max_positions=64", "pretrain.steps=6", "pretrain.batch_size=4", "pretrain.warmup_steps=2",
        "pretrain.log_every=2", "pretrain.eval_every=3", "pretrain.checkpoint_every=3",
        "evaluate.max_sequences=4", "evaluate.pll_sentences=2", "evaluate.finetune.epochs=1"]
VARIANTS = {"unigram": (["tokenizer.algorithm=unigram"], ["tokenizer"]),
            "electra-span": (["pretrain.objective=electra", "pretrain.masking.strategy=span"], ["pretrain"])}

SCRIPT = textwrap.dedent("""
    import json, sys
    from mlm_core import stages
    from mlm_core.config.io import load_config
    work, tiny, variants = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    runs = [(tiny, list(stages.STAGES))] + [(tiny + extra, only) for extra, only in variants.values()]
    done = []
    for overrides, names in runs:
        lc = load_config("configs/demo.yaml", [f"workdir={work}", *overrides])
        plans = stages.plan(lc)
        for name in names:
            art, hit = stages.execute(lc, name, plans)
            assert not hit, (name, "a fresh workdir has nothing cached")
            done.append([name, art.fingerprint])
    print(json.dumps(done))
""")


def run_pipeline(work: Path, hash_seed: int) -> list[tuple[str, str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": str(hash_seed),
           "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(work), json.dumps(TINY), json.dumps(VARIANTS)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    return [tuple(x) for x in json.loads(r.stdout.strip().splitlines()[-1])]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("repro")
    work = base / "work"
    first = run_pipeline(work, hash_seed=1)
    work.rename(base / "first")
    second = run_pipeline(work, hash_seed=2)
    assert first == second, "the same config must give the same fingerprints"
    return first, base / "first", work


@pytest.mark.heavy
def test_every_stage_output_is_byte_identical_except_declared_time_fields(two_runs):
    from mlm_core.reproducible import FILE_TIME_FIELDS, comparable_output
    from mlm_core.stages import STAGES
    outputs, a, b = two_runs
    assert {name for name, _ in outputs} == set(STAGES)
    assert len(outputs) == len(STAGES) + 2
    differ = {}
    for name, fp in outputs:
        ca, cb = comparable_output(name, a / name / fp), comparable_output(name, b / name / fp)
        assert ca["files"], f"{name}: no files"
        bad = sorted(f for f in ca["files"].keys() | cb["files"].keys() if ca["files"].get(f) != cb["files"].get(f))
        if bad:
            differ[f"{name}/{fp}"] = bad
        if ca["manifest"] != cb["manifest"]:
            keys = sorted(k for k in ca["manifest"].keys() | cb["manifest"].keys()
                          if ca["manifest"].get(k) != cb["manifest"].get(k))
            differ[f"{name}/{fp}/manifest.json"] = keys
        # the raw file tables too: only the declared time-bearing files may differ in bytes
        raw_a = json.loads((a / name / fp / "manifest.json").read_text())["files"]
        raw_b = json.loads((b / name / fp / "manifest.json").read_text())["files"]
        timed = set(FILE_TIME_FIELDS.get(name, {}))
        raw_bad = sorted(f for f in raw_a.keys() | raw_b.keys() if f not in timed and raw_a.get(f) != raw_b.get(f))
        if raw_bad:
            differ[f"{name}/{fp} (bytes)"] = raw_bad
    assert not differ, f"outputs that differ between two runs of the same config: {differ}"
    pretrain = [(a / n / fp) for n, fp in outputs if n == "pretrain"]
    files = {p.relative_to(a).as_posix() for d in pretrain for p in d.rglob("*.safetensors")}
    assert any(f.endswith("/discriminator.safetensors") for f in files), files   # the ELECTRA writers ran
    assert any(f.endswith("/hf/model.safetensors") for f in files), files


@pytest.mark.heavy
def test_declared_time_fields_exist(two_runs):
    """The declaration stays honest: each declared field is really written (a renamed field must be renamed here)."""
    from mlm_core.reproducible import FILE_TIME_FIELDS, MANIFEST_TIME_FIELDS
    outputs, a, _ = two_runs
    for name, fp in outputs:
        manifest = json.loads((a / name / fp / "manifest.json").read_text())
        for dotted in MANIFEST_TIME_FIELDS["*"] + MANIFEST_TIME_FIELDS.get(name, ()):
            obj = manifest
            for key in dotted.split("."):
                assert key in obj, f"{name}: manifest has no {dotted}"
                obj = obj[key]
        for rel, keys in FILE_TIME_FIELDS.get(name, {}).items():
            recs = [json.loads(ln) for ln in (a / name / fp / rel).read_text().splitlines() if ln.strip()]
            seen = set().union(*recs)
            assert set(keys) <= seen, (name, rel, set(keys) - seen)


def _header(path: Path) -> tuple[int, dict]:
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return n, json.loads(data[8:8 + n])


def test_safetensors_header_is_canonical_whatever_order_it_was_written_in(tmp_path):
    """Independent of the process: a header whose metadata is in reverse order comes out of canonicalize
    sorted and byte-equal to the one written in sorted order; tensors still load."""
    import torch
    from safetensors import safe_open

    from mlm_core.tensorfile import canonicalize, save_tensors
    tensors = {"b": torch.arange(6, dtype=torch.float32).reshape(2, 3), "a": torch.ones(3, dtype=torch.bfloat16)}
    meta = {"format": "pt", "arch": '{"hidden": 8}', "zeta": "1", "alpha": "é"}
    save_tensors(tensors, tmp_path / "x.safetensors", metadata=meta)
    n, header = _header(tmp_path / "x.safetensors")
    assert list(header)[0] == "__metadata__" and list(header["__metadata__"]) == sorted(meta)
    # write the same file with the metadata reversed, by hand, then canonicalize it
    data = (tmp_path / "x.safetensors").read_bytes()
    rev = {"__metadata__": dict(reversed(sorted(meta.items())))} | {k: v for k, v in header.items() if k != "__metadata__"}
    body = json.dumps(rev, separators=(",", ":"), ensure_ascii=False).encode()
    body += b" " * (n - len(body))
    (tmp_path / "y.safetensors").write_bytes(data[:8] + body + data[8 + n:])
    assert (tmp_path / "y.safetensors").read_bytes() != data
    canonicalize(tmp_path / "y.safetensors")
    assert (tmp_path / "y.safetensors").read_bytes() == data
    with safe_open(str(tmp_path / "y.safetensors"), "pt") as f:
        assert f.metadata() == meta and torch.equal(f.get_tensor("b"), tensors["b"])


def test_save_weights_bytes_do_not_depend_on_the_process(tmp_path):
    """save_weights writes three metadata keys (format, arch, the tied decoder alias); safetensors' own header
    order is random per process (1 of 6 orders here). Two processes must write the same bytes, with the
    metadata in sorted order."""
    code = textwrap.dedent("""
        import sys, torch
        from mlm_core.config import ModelConfig
        from mlm_core.model import MLMEncoder, resolve_arch, save_weights
        torch.manual_seed(0)
        arch = resolve_arch(ModelConfig(size="tiny", hidden=8, heads=2, layers=1, max_positions=8), 50, 0)
        assert arch.tie_embeddings
        save_weights(MLMEncoder(arch), sys.argv[1])
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    blobs = set()
    for i in range(2):
        out = tmp_path / f"w{i}.safetensors"
        r = subprocess.run([sys.executable, "-c", code, str(out)], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        blobs.add(out.read_bytes())
        meta = list(_header(out)[1]["__metadata__"])
        assert len(meta) == 3 and meta == sorted(meta), meta
    assert len(blobs) == 1
