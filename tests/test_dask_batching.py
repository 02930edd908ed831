"""Issue 23 item 2: fewer, larger Dask tasks (batches of partitions) and partitions sized from the input.

- ``tasks.engine.batches``: consecutive runs of partitions, about TASKS_PER_THREAD per worker thread, covering
  every partition once, in order (expected values written out by hand).
- ``execution.partition_mb: auto`` (``mlm_core.partition_size``): the size from the input and the workers, with a
  floor and a cap (hand-computed); the normalize plan of real files under ../shared/data/text gets the partition
  count the size gives (counted from the files' own sizes); an explicit number is honoured; a bad value is a
  config error naming the key.
- A batch that dies after some of its partitions: the rerun reuses those partitions (their folders are keyed
  per partition) and computes only the rest.
- Heavy: normalize -> tokenizer -> shards on a Dask LocalCluster of 2 workers, byte-identical (sha256 of every
  file and of the manifest's file list) to engine local, with fewer Dask submissions than partitions (one per
  partition before batching: that assertion fails on the old code).
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from mlm_core.config.io import load_config

DATA = REPO.parent / "shared" / "data" / "text"
LANGS = ("de", "fr", "ar", "ru")           # four real files, 0.17-0.5 MB, three scripts


def write_config(root: Path, partition_mb=None, lines: int | None = None) -> Path:
    srcs = {}
    for lang in LANGS:
        src = DATA / f"{lang}.txt"
        if lines is not None:
            p = root / "raw" / f"{lang}.txt"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("".join(src.read_text(encoding="utf-8").splitlines(keepends=True)[:lines]), encoding="utf-8")
            src = p
        srcs[lang] = {"paths": [str(src)]}
    raw = {"name": "batching", "workdir": str(root / "work"), "sources": srcs, "seed": 1,
           "normalize": {"workers": 1, "min_chars": 5, "max_quarantine_rate": 0.5},
           "tokenizer": {"algorithm": "bpe", "vocab_size": 2000, "heldout_docs": 20},
           "shards": {"seq_len": 64, "rows_per_shard": 32, "min_validation_tokens": 200},
           "tracking": {"enabled": False}}
    if partition_mb is not None:
        raw["execution"] = {"partition_mb": partition_mb}
    f = root / "cfg.yaml"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return f


# ---------------------------------------------------------------- batches
def test_batches_are_consecutive_runs_about_three_per_thread():
    from tasks.engine import batches
    # 10 partitions, 2 threads -> 6 tasks: 10 = 2+2+2+2+1+1
    assert [list(g) for g in batches(10, 2)] == [[0, 1], [2, 3], [4, 5], [6, 7], [8], [9]]
    # fewer partitions than tasks: one each
    assert [list(g) for g in batches(4, 2)] == [[0], [1], [2], [3]]
    # 100 partitions on 128 threads: one each; 1000 on 4 threads: 12 tasks of 83-84
    assert len(batches(100, 128)) == 100
    got = batches(1000, 4)
    assert len(got) == 12 and {len(g) for g in got} == {83, 84}
    assert [i for g in got for i in g] == list(range(1000))
    assert batches(0, 2) == []


# ---------------------------------------------------------------- auto partition size
def test_auto_size_from_input_and_workers_with_floor_and_cap():
    from mlm_core.partition_size import auto_partition_mb
    MiB = 2**20
    assert auto_partition_mb(100 * MiB, 2) == 12.5            # 100 / (2 workers x 4)
    assert auto_partition_mb(1024 * MiB, 2) == 64.0           # 128 -> the cap
    assert auto_partition_mb(1 * MiB, 2) == 8.0               # 0.125 -> the floor
    assert auto_partition_mb(100 * 1024 * MiB, 128) == 64.0   # 200 -> the cap: count grows with the input
    assert auto_partition_mb(1024 * MiB, 16) == 16.0          # 1 GiB on 16 workers: 64 partitions


def _expected_parts(files: list[Path], mb: float) -> tuple[int, int]:
    """Bounds on the text files' partition count at ``mb`` MiB, from their bytes: every partition but a file's
    last holds at least the budget and at most the budget + one line (cuts move to the next line end)."""
    budget = mb * 2**20
    lo = hi = 0
    for f in files:
        data = f.read_bytes()
        longest = max(len(x) + 1 for x in data.split(b"\n"))
        lo += math.ceil(len(data) / (budget + longest))
        hi += math.ceil(len(data) / budget)
    return lo, hi


def test_normalize_plan_auto_is_sized_from_the_input(tmp_path, monkeypatch):
    """Real files, a small floor so they split: about 4 partitions per worker, whatever the worker count."""
    import mlm_core.partition_size as ps
    from mlm_core.normalize.stage import plan
    monkeypatch.setattr(ps, "FLOOR_MB", 0.01)
    cfg = write_config(tmp_path)
    files = [DATA / f"{lang}.txt" for lang in LANGS]
    total_mib = sum(f.stat().st_size for f in files) / 2**20
    for workers in (1, 2, 4):
        lc = load_config(cfg, ["execution.engine=dask", f"execution.workers={workers}"])
        n = len(plan(lc))
        lo, hi = _expected_parts(files, total_mib / (workers * 4))
        assert lo <= n <= hi, (workers, n, lo, hi)
    # engine local: the stage's own pool (normalize.workers) is the parallelism
    lc = load_config(cfg, ["normalize.workers=2"])
    lo, hi = _expected_parts(files, total_mib / 8)
    assert lo <= len(plan(lc)) <= hi
    # without the monkeypatched floor these 1.2 MB are one partition per file (the floor is 8 MiB)
    monkeypatch.setattr(ps, "FLOOR_MB", 8.0)
    assert len(plan(load_config(cfg, ["execution.engine=dask"]))) == len(files)


def test_explicit_partition_mb_is_honoured(tmp_path):
    from mlm_core.normalize.stage import plan
    files = [DATA / f"{lang}.txt" for lang in LANGS]
    lc = load_config(write_config(tmp_path, partition_mb=0.05), ["execution.engine=dask", "execution.workers=64"])
    lo, hi = _expected_parts(files, 0.05)
    assert lo <= len(plan(lc)) <= hi


@pytest.mark.parametrize("bad", ["big", "0", "-2", "true", "[1]"])
def test_bad_partition_mb_names_the_key(tmp_path, bad):
    from mlm_core.errors import MlmError
    with pytest.raises(MlmError) as exc:
        load_config(write_config(tmp_path), [f"execution.partition_mb={bad}"])
    problems = str(exc.value).splitlines()[1:]
    assert len(problems) == 1 and problems[0].strip().startswith("execution.partition_mb: must be a size in MiB"), \
        str(exc.value)


# ---------------------------------------------------------------- a batch killed part-way, then rerun
def test_batch_failing_midway_rerun_reuses_its_finished_partitions(tmp_path, monkeypatch):
    """The first batch attempt dies at its third partition; the retry (the same batch) computes only the others,
    and the stage's files equal a plain local run's."""
    from mlm_core.normalize.stage import run_normalize
    from tasks.engine import partition_batch_task
    trace = tmp_path / "computed.txt"
    monkeypatch.setenv("MLM_PARTITION_TRACE", str(trace))
    cfg = write_config(tmp_path, partition_mb=0.05, lines=300)
    lc = load_config(cfg)
    seen = {}

    def mapper(fn, jobs):
        broken = {**jobs[2], "target": "no_such_module_xyz:STAGE"}
        with pytest.raises(ModuleNotFoundError):
            partition_batch_task.fn(jobs[:2] + [broken] + jobs[3:])
        seen["first"] = trace.read_text().split()
        trace.unlink()
        out = partition_batch_task.fn(jobs)
        seen["second"] = trace.read_text().split()
        seen["keys"] = [j["key"] for j in jobs]
        return out

    got = run_normalize(lc, tmp_path / "batched", mapper=mapper)
    assert len(seen["keys"]) >= 6
    assert seen["first"] == seen["keys"][:2]
    assert seen["second"] == seen["keys"][2:]                       # the first two were reused
    monkeypatch.delenv("MLM_PARTITION_TRACE")
    ref = run_normalize(load_config(cfg), tmp_path / "plain")
    assert _digests(tmp_path / "batched") == _digests(tmp_path / "plain")
    assert got["counts"] == ref["counts"]


def _digests(folder: Path) -> dict:
    """sha256 of every file under ``folder`` (the manifest of a stored output included)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- heavy: LocalCluster vs local, byte for byte
def _stage_digests(res: dict) -> dict:
    path = Path(res["path"])
    files = json.loads((path / "manifest.json").read_text())["files"]
    on_disk = _digests(path)
    on_disk.pop("manifest.json", None)         # it holds its run's timestamps: compared key by key below
    on_disk = {k: v for k, v in on_disk.items() if not k.startswith(".")}    # the store's own marker files
    assert {k: v["sha256"] for k, v in files.items()} == {k: on_disk[k] for k in files}
    m = json.loads((path / "manifest.json").read_text())
    for timing in ("created_at", "duration_s"):               # when and how long it ran: the only differences
        m.pop(timing)
    m.get("counts", {}).pop("train_seconds", None)           # the tokenizer's training time
    return {"files": {k: v["sha256"] for k, v in sorted(files.items())}, "on_disk": on_disk, "manifest": m}


@pytest.mark.heavy
def test_batched_dask_output_equals_local(tmp_path, prefect_harness, monkeypatch):
    import prefect_dask

    from flows.pipeline import STAGE_FLOWS
    submitted: list[int] = []
    real_submit = prefect_dask.DaskTaskRunner.submit

    def counting_submit(self, task, parameters, *a, **kw):
        submitted.append(len(parameters.get("jobs") or [parameters.get("job")]))
        return real_submit(self, task, parameters, *a, **kw)
    monkeypatch.setattr(prefect_dask.DaskTaskRunner, "submit", counting_submit)

    out = {}
    for engine, over in (("local", ["execution.engine=local"]),
                         ("dask", ["execution.engine=dask", "execution.workers=2"])):
        cfg = write_config(tmp_path / engine, partition_mb=0.05)
        out[engine] = {}
        for name in ("normalize", "tokenizer", "shards"):
            submitted.clear()
            [res] = STAGE_FLOWS[name](config_path=str(cfg), overrides=over)
            out[engine][name] = (res, list(submitted))
    for name in ("normalize", "tokenizer", "shards"):
        (lres, _), (dres, calls) = out["local"][name], out["dask"][name]
        assert dres["fingerprint"] == lres["fingerprint"]
        assert _stage_digests(dres) == _stage_digests(lres), name
    for name in ("normalize", "shards"):
        res, calls = out["dask"][name]
        n_parts = sum(calls)                                  # partitions submitted, over every task
        if name == "normalize":
            assert n_parts == json.loads((Path(res["path"]) / "manifest.json").read_text())["partitions"]
        assert n_parts >= 12 and len(calls) <= 6 < n_parts, (name, calls)     # 2 worker threads x 3: batched
