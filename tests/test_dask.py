"""engine: dask with real processes: a `dask scheduler` and `dask worker` subprocesses on 127.0.0.1.

The normalize stage runs through the stage's Prefect flow (the path `mlm run` takes), each partition a
Prefect task on prefect-dask's DaskTaskRunner; its files must be byte-identical (manifest sha256s) to
engine local, also after a worker is killed mid-stage (its partitions rerun on the other worker). An
unreachable scheduler, a worker that does not see the workdir, a scheduler lost mid-stage: clear errors.
Many small partitions (execution.partition_mb) and a per-partition delay (MLM_PARTITION_DELAY_S, read by
the workers) make the kill land mid-stage.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from conftest import REPO

DASK = Path(sys.executable).parent / "dask"
DEMO = REPO / "configs" / "demo" / "corpus"
LANGS = ("en", "fr", "ru", "zh")
PARTITION_MB = 0.1             # 16 partitions of the demo's en/fr/ru/zh files
DELAY = {"MLM_PARTITION_DELAY_S": "0.25"}   # per partition, on the workers: a kill lands mid-stage


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A scheduler and N workers as subprocesses (no nanny: a killed worker stays dead); always cleaned up."""

    def __init__(self, tmp: Path, n: int, env: dict | None = None, wrap=None):
        self.port = _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.tmp, self.env = tmp, {**os.environ, **(env or {})}
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._start("scheduler", [str(DASK), "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                  "--no-dashboard", "--no-show"])
        for i in range(n):
            cmd = [str(DASK), "worker", self.address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                   "--name", f"w{i}", "--local-directory", str(tmp / f"w{i}-scratch")]
            self._start(f"w{i}", wrap(cmd) if wrap else cmd)
        self.wait_workers(n)

    def _start(self, name: str, cmd: list[str]) -> None:
        log = open(self.tmp / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)

    def wait_workers(self, n: int, timeout: float = 60) -> None:
        from distributed import Client
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with Client(self.address, timeout="2s", set_as_default=False) as c:
                    c.wait_for_workers(n, timeout=max(1, deadline - time.time()))
                    return
            except (OSError, TimeoutError):
                time.sleep(0.3)
        raise AssertionError(f"{n} dask workers did not register: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in self.tmp.glob("*.log"))

    def kill(self, name: str) -> None:
        p = self.procs[name]
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)

    def close(self) -> None:
        for name in reversed(list(self.procs)):
            self.kill(name)


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    """Two workers for the equality test, then the kill test (which kills w1: it runs after)."""
    c = Cluster(tmp_path_factory.mktemp("shared-cluster"), 2, env=DELAY)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def clusters(tmp_path):
    started: list[Cluster] = []

    def start(n: int = 2, **kw) -> Cluster:
        c = Cluster(tmp_path / f"cluster{len(started)}", n, **kw)
        started.append(c)
        return c
    try:
        yield start
    finally:
        for c in started:
            c.close()


def write_config(tmp_path: Path, name: str) -> Path:
    raw = {"name": name, "workdir": str(tmp_path / name / "work"),
           "sources": {lang: {"paths": [str(DEMO / f"{lang}.txt")]} for lang in LANGS},
           "normalize": {"min_chars": 5, "max_chars": 20000, "workers": 1},
           "tracking": {"enabled": False}, "execution": {"partition_mb": PARTITION_MB}}
    p = tmp_path / name / "pipeline.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return p


def run_flow(cfg: Path, *overrides: str, force: bool = False) -> dict:
    from flows.pipeline import STAGE_FLOWS
    [res] = STAGE_FLOWS["normalize"](config_path=str(cfg), overrides=list(overrides), force=force)
    return res


def dask_overrides(cluster: Cluster) -> list[str]:
    return ["execution.engine=dask", f"execution.address={cluster.address}"]


def sha256s(path: str | Path) -> dict:
    m = json.loads((Path(path) / "manifest.json").read_text())
    return {k: v["sha256"] for k, v in m["files"].items()}


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    """engine local, in-process (no Prefect): the sha256s the Dask runs must reproduce."""
    from mlm_core import stages
    from mlm_core.config.io import load_config
    tmp = tmp_path_factory.mktemp("local")
    lc = load_config(write_config(tmp, "local"))
    art, _ = stages.execute(lc, "normalize", stages.plan(lc))
    assert art.manifest["partitions"] >= 12          # many partitions, or the kill could land after the last
    return art


def test_dask_cluster_output_equals_local(tmp_path, shared_cluster, local_reference, prefect_harness):
    c = shared_cluster
    cfg = write_config(tmp_path, "dask")
    res = run_flow(cfg, *dask_overrides(c))
    assert res["fingerprint"] == local_reference.fingerprint        # execution is in no fingerprint
    assert sha256s(res["path"]) == sha256s(local_reference.path)
    # both workers took partitions (each Prefect task run logs on the worker that ran it)
    assert all("Task run 'normalize[" in (c.tmp / f"w{i}.log").read_text() for i in range(2)), c.logs()
    assert not list((Path(res["path"]).parents[1] / "partitions" / "normalize").iterdir())   # merged: removed


def test_local_cluster_output_equals_local(tmp_path, local_reference, prefect_harness):
    """engine dask without address: a LocalCluster of execution.workers processes, closed after the run."""
    import tasks.engine as engine
    res = run_flow(write_config(tmp_path, "lc"), "execution.engine=dask", "execution.workers=2")
    assert sha256s(res["path"]) == sha256s(local_reference.path)
    assert engine._SESSION is None                      # the run's LocalCluster is closed



def kill_after_partitions(cluster, worker: str, parts: Path, n: int, timeout: float):
    """kill -9 ``worker`` once ``n`` partitions under ``parts`` are complete: (event set on the kill, thread)."""
    killed = threading.Event()

    def killer():
        deadline = time.time() + timeout
        while time.time() < deadline:
            if len(list(parts.glob("*/part.json"))) >= n:
                cluster.kill(worker)
                killed.set()
                return
            time.sleep(0.05)
    t = threading.Thread(target=killer, daemon=True)
    t.start()
    return killed, t


def test_worker_killed_mid_stage_output_identical(tmp_path, shared_cluster, local_reference, prefect_harness):
    c = shared_cluster
    cfg = write_config(tmp_path, "kill")
    parts = tmp_path / "kill" / "work" / "partitions" / "normalize"
    killed, t = kill_after_partitions(c, "w1", parts, 3, timeout=120)
    res = run_flow(cfg, *dask_overrides(c))
    t.join(5)
    assert killed.is_set(), "the worker was not killed mid-stage"
    assert c.procs["w1"].poll() is not None
    assert sha256s(res["path"]) == sha256s(local_reference.path)
    for lang in LANGS:                          # no missing or duplicate document
        got = pq.read_table(Path(res["path"]) / "docs" / f"{lang}.parquet", columns=["doc_id"]).column(0).to_pylist()
        want = pq.read_table(local_reference.path / "docs" / f"{lang}.parquet", columns=["doc_id"]).column(0).to_pylist()
        assert got == want and len(set(got)) == len(got)


def test_unreachable_scheduler_fails_before_any_work(tmp_path, prefect_harness):
    from tasks.engine import EngineError
    cfg = write_config(tmp_path, "bad")
    t0 = time.time()
    with pytest.raises(EngineError, match=r"execution.address tcp://127.0.0.1:\d+: no Dask scheduler answers"):
        run_flow(cfg, "execution.engine=dask", f"execution.address=tcp://127.0.0.1:{_free_port()}")
    assert time.time() - t0 < 8          # refused at once, not after Dask's connect retries
    work = tmp_path / "bad" / "work"
    assert not (work / "normalize").exists() and not (work / "partitions").exists()    # nothing ran


def _private_mount(target: Path):
    """Wrap a worker command so it sees an empty tmpfs at ``target``: a node without the shared filesystem."""
    def wrap(cmd: list[str]) -> list[str]:
        inner = f"mount -t tmpfs none {target} && exec " + " ".join(cmd)
        return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", inner]
    return wrap


def test_workdir_not_visible_from_a_worker(tmp_path, clusters, prefect_harness):
    from tasks.engine import EngineError
    shared = tmp_path / "nfs"
    shared.mkdir()
    ok = subprocess.run(_private_mount(shared)(["true"]), capture_output=True)
    if ok.returncode != 0 or shutil.which("unshare") is None:
        pytest.skip(f"no user+mount namespaces here (unshare: {ok.stderr.decode()[:200]!r}): cannot hide the workdir")
    cfg = write_config(shared, "hidden")
    c = clusters(1, wrap=_private_mount(shared))
    with pytest.raises(EngineError, match=r"is not shared with every Dask worker.*\n  worker tcp://.*cannot read"):
        run_flow(cfg, *dask_overrides(c))
    assert not (shared / "hidden" / "work" / "normalize").exists()


def test_scheduler_lost_mid_stage_then_rerun_recomputes_only_missing(tmp_path, clusters, local_reference,
                                                                    prefect_harness):
    from tasks.engine import EngineError
    trace = tmp_path / "computed.txt"
    env = {**DELAY, "MLM_PARTITION_TRACE": str(trace)}
    c = clusters(2, env=env)
    cfg = write_config(tmp_path, "lost")
    parts = tmp_path / "lost" / "work" / "partitions" / "normalize"

    def killer():
        deadline = time.time() + 120
        while time.time() < deadline and len(list(parts.glob("*/part.json"))) < 3:
            time.sleep(0.05)
        c.kill("scheduler")
    threading.Thread(target=killer, daemon=True).start()
    with pytest.raises(EngineError, match="the Dask scheduler at tcp://.* went away mid-stage"):
        run_flow(cfg, *dask_overrides(c))
    c.close()
    stage_dir = tmp_path / "lost" / "work" / "normalize"
    assert [p.name for p in stage_dir.iterdir()] == [f".failed-{local_reference.fingerprint}"]
    done_before = {p.parent.name for p in parts.glob("*/part.json")}
    assert 3 <= len(done_before) < local_reference.manifest["partitions"]
    trace.unlink()
    c2 = clusters(2, env={"MLM_PARTITION_TRACE": str(trace)})
    res = run_flow(cfg, *dask_overrides(c2))
    recomputed = set(trace.read_text().split())
    assert recomputed.isdisjoint(done_before)                         # the finished partitions were reused
    assert len(recomputed) == local_reference.manifest["partitions"] - len(done_before)
    assert sha256s(res["path"]) == sha256s(local_reference.path)


def test_worker_with_other_library_version_is_named(tmp_path, clusters, prefect_harness):
    """A real worker whose pyarrow reports another version (a --preload patches what it reports)."""
    from tasks.engine import EngineError
    pre = tmp_path / "fake_pyarrow_version.py"
    pre.write_text("import mlm_core.store as s\nif not hasattr(s, '_real_versions'):\n"
                   "    s._real_versions = s.library_versions\n"
                   "    s.library_versions = lambda: {**s._real_versions(), 'pyarrow': '0.0.0-other'}\n",
                   encoding="utf-8")
    c = clusters(1, wrap=lambda cmd: [*cmd, "--preload", str(pre)])
    cfg = write_config(tmp_path, "versions")
    with pytest.raises(EngineError, match=r"worker tcp://127.0.0.1:\d+: pyarrow 0.0.0-other \(here: \d"):
        run_flow(cfg, *dask_overrides(c))
    assert not (tmp_path / "versions" / "work" / "normalize").exists()


def test_version_mismatch_is_named():
    from tasks.engine import compare_versions
    got = compare_versions({"pyarrow": "25.0.1", "dask": "2026.8.0"},
                           {"tcp://10.0.0.7:4000": {"pyarrow": "24.0.0", "dask": "2026.8.0"}})
    assert got == ["worker tcp://10.0.0.7:4000: pyarrow 24.0.0 (here: 25.0.1)"]


# ---------------------------------------------------------------- the shards stage on the cluster (H8)
def shards_config(tmp_path: Path, name: str) -> Path:
    """normalize -> tokenizer (byte-level BPE: the same files every time it trains) -> shards, ~15 shards
    partitions (language x run of documents) of ~0.1 MB of text."""
    p = write_config(tmp_path, name)
    raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    raw |= {"tokenizer": {"algorithm": "bpe", "vocab_size": 2000, "heldout_docs": 20},
            "shards": {"seq_len": 64, "rows_per_shard": 64, "min_validation_tokens": 500}}
    p.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def shards_reference(tmp_path_factory):
    """engine local, in-process: normalize, tokenizer, shards."""
    from mlm_core import stages
    from mlm_core.config.io import load_config
    lc = load_config(shards_config(tmp_path_factory.mktemp("shards-local"), "local"))
    plans = stages.plan(lc)
    return {name: stages.execute(lc, name, plans)[0] for name in ("normalize", "tokenizer", "shards")}


def _docs_per_split(art) -> dict:
    """(split, lang) -> documents in its rows ([SEP] count): a document lost or packed twice changes it."""
    import numpy as np

    from mlm_core.shards.reader import read_shard_file
    m = art.manifest
    sep = m["special_tokens"]["sep"]["id"]
    out: dict = {}
    for s in m["shards"]:
        rows = read_shard_file(art.path, s["file"], m)["input_ids"]
        out[(s["split"], s["lang"])] = out.get((s["split"], s["lang"]), 0) + int((np.asarray(rows)[:, 1:] == sep).sum())
    return out


def test_shards_on_dask_with_a_worker_killed_equal_local(tmp_path, clusters, shards_reference, prefect_harness):
    """normalize + tokenizer + shards through the stage flows on a real scheduler + 2 workers, w1 killed -9
    while the shards partitions run: every stage's files equal engine local's; no document lost or doubled."""
    from flows.pipeline import STAGE_FLOWS
    c = clusters(2, env=DELAY)
    cfg = shards_config(tmp_path, "shards-kill")
    over = dask_overrides(c)
    for name in ("normalize", "tokenizer"):
        [res] = STAGE_FLOWS[name](config_path=str(cfg), overrides=over)
        assert sha256s(res["path"]) == sha256s(shards_reference[name].path), name
    parts = tmp_path / "shards-kill" / "work" / "partitions" / "shards"
    killed, t = kill_after_partitions(c, "w1", parts, 3, timeout=180)
    [res] = STAGE_FLOWS["shards"](config_path=str(cfg), overrides=over)
    t.join(5)
    assert killed.is_set(), "the worker was not killed mid-stage"
    ref = shards_reference["shards"]
    assert res["fingerprint"] == ref.fingerprint
    assert ref.manifest["counts"]["docs"] > 0 and len(ref.manifest["shards"]) > 8
    assert sha256s(res["path"]) == sha256s(ref.path)
    from mlm_core.store import StageStore
    art = StageStore(Path(res["path"]).parents[1]).load("shards", res["fingerprint"])
    got = _docs_per_split(art)
    normalized = sum(pq.ParquetFile(f).metadata.num_rows for f in (shards_reference["normalize"].path / "docs").glob("*.parquet"))
    assert got == _docs_per_split(ref) and sum(got.values()) == normalized     # every document once
    assert "Task run 'shards[" in (c.tmp / "w0.log").read_text(), c.logs()
    assert not list(parts.iterdir())            # merged: the partition folders are removed
