"""Two-"node" training on one machine (issue 10, part 2): two launches of the pipeline's own launcher
(``mlm_core.train.distributed.launch``; node 1 through ``python -m mlm_core.train.join``, what a second machine
runs while node 0 runs the pipeline), each a separate process like a node agent, ``nnodes: 2``,
``node_rank`` 0 and 1, one gloo process each, a c10d rendezvous on 127.0.0.1, one shared run folder.

- after k steps the parameters equal the single-node 2-process run (the DDP test's tolerance, 1e-5);
- SIGTERM to both nodes mid-run: every rank checkpoints at the same step boundary and both nodes report
  the interruption; relaunching both resumes, and every logged loss equals the uninterrupted run's.
Dropout on and dynamic masking, so the resume has to restore every rank's RNG streams.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO
from test_train import read_metrics, tiny_cfg, tiny_shards

STEPS = 8
COMMON = {"steps": STEPS, "checkpoint_every": STEPS, "model": {"dropout": 0.1}, "warmup_steps": 2, "lr": 1e-3}

# a node agent: what `mlm run` does on each node, reduced to the launcher call (exit 128+signal when stopped)
NODE = textwrap.dedent("""
    import json, sys
    from mlm_core.config import DistributedConfig
    from mlm_core.train import signals
    from mlm_core.train.distributed import launch
    spec = json.load(open(sys.argv[1]))
    try:
        res = launch(spec["args"], DistributedConfig(**spec["dist"]), spec["run_dir"], module=spec["module"],
                     env={"OMP_NUM_THREADS": "1"})
    except signals.Interrupted as e:
        print("INTERRUPTED", e, flush=True)
        sys.exit(e.exit_code)
    json.dump(res, open(spec["out"], "w"))
""")
# the same worker, slowed down (0.3 s per step) so that a signal reliably lands mid-run
SLOW_WORKER = textwrap.dedent("""
    import sys, time
    from mlm_core.train import feed, worker
    _draw = feed.Feed.draw
    def draw(self, *a, **kw):
        time.sleep(0.3)
        return _draw(self, *a, **kw)
    feed.Feed.draw = draw
    sys.exit(worker.main())
""")


# the launcher's command in the join protocol test, instead of torchrun: node 0's rank 0 waits for node 1's
# arguments of the same training (what the rendezvous does; the seed tells trainings apart), then writes the result
FAKE_WORKER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    f = Path(sys.argv[1])
    a = json.loads(f.read_text())
    if a["seed"] == 3:
        sys.exit("injected failure")
    if f.name == "worker-args.json":
        peer, deadline = f.with_name("worker-args-node1.json"), time.monotonic() + 30
        while True:
            try:
                if json.loads(peer.read_text())["seed"] == a["seed"]:
                    break
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                sys.exit("node 1 never came")
            time.sleep(0.05)
        tmp = Path(a["result_file"] + ".tmp")
        tmp.write_text(json.dumps({"seed": a["seed"], "step": 1}))
        os.replace(tmp, a["result_file"])
""")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("tiny-multinode"))


def _args(cfg, shards, out: Path) -> dict:
    return {"config": cfg.model_dump(mode="json"), "seed": 0, "shards": str(shards[0].path), "out_dir": str(out),
            "tokenizer_fingerprint": shards[1].fingerprint, "print_metrics": True}


@pytest.fixture(scope="module")
def single_node(shards, tmp_path_factory):
    """The reference: one node, 2 processes, uninterrupted."""
    from mlm_core.train.distributed import launch
    cfg = tiny_cfg(distributed={"nproc_per_node": 2, "timeout_s": 60}, **COMMON)
    out = tmp_path_factory.mktemp("single")
    res = launch(_args(cfg, shards, out), cfg.distributed, out / "launch", env={"OMP_NUM_THREADS": "1"})
    return res, out


def _start_nodes(shards, work: Path, out: Path, port: int, module: str = "mlm_core.train.worker",
                 tag: str = "") -> list[tuple[subprocess.Popen, Path, Path]]:
    """Node 0: the launcher as the pretrain stage calls it (node.py); node 1: ``python -m mlm_core.train.join``
    on the shared folder, with node 0's arguments."""
    (work / "node.py").write_text(NODE)
    (work / "slow_worker.py").write_text(SLOW_WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), str(REPO)]), "OMP_NUM_THREADS": "1"}
    cfg = tiny_cfg(distributed={"nproc_per_node": 1, "nnodes": 2, "node_rank": 0,
                                "rdzv_endpoint": f"127.0.0.1:{port}", "timeout_s": 60}, **COMMON)
    spec = work / f"node0{tag}.json"
    spec.write_text(json.dumps({"args": _args(cfg, shards, out), "dist": cfg.distributed.model_dump(),
                                "run_dir": str(out / "launch"), "module": module, "out": str(work / f"result0{tag}.json")}))
    cmds = {0: [sys.executable, str(work / "node.py"), str(spec)],
            1: [sys.executable, "-m", "mlm_core.train.join", str(out / "launch"), "--node-rank", "1",
                "--module", module, "--wait", "120"]}
    nodes = []
    for rank, cmd in cmds.items():
        res, log = work / f"result{rank}{tag}.json", work / f"node{rank}{tag}.log"
        with open(log, "wb") as fh, open(res if rank else os.devnull, "wb") as fo:
            p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fo if rank else fh, stderr=fh, start_new_session=True)
        nodes.append((p, res, log))
    return nodes


def _wait(nodes, timeout: float = 240) -> list[int]:
    rcs = []
    for p, _, log in nodes:
        try:
            rcs.append(p.wait(timeout))
        except subprocess.TimeoutExpired:
            for q, _, _ in nodes:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            raise AssertionError(f"node did not finish:\n{log.read_text(errors='replace')[-3000:]}")
    return rcs


def _params(checkpoint: str) -> dict:
    from safetensors.torch import load_file
    return load_file(str(Path(checkpoint) / "model.safetensors"))


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out)}


def _loss_diff(a: Path, b: Path) -> float:
    la, lb = _losses(a), _losses(b)
    return max(abs(la[k] - lb[k]) for k in la)


@pytest.mark.heavy
def test_two_nodes_equal_one_node_with_two_processes(shards, single_node, tmp_path):
    from flows.procs import free_port
    ref, ref_out = single_node
    out = tmp_path / "shared"
    t0 = time.monotonic()
    nodes = _start_nodes(shards, tmp_path, out, free_port())
    rcs = _wait(nodes)
    logs = [log.read_text(errors="replace")[-3000:] for _, _, log in nodes]
    assert rcs == [0, 0], logs
    print(f"\n2 nodes x 1 process, {STEPS} steps: {time.monotonic() - t0:.1f} s")
    got, summary = (json.loads(res.read_text()) for _, res, _ in nodes)
    assert summary == {k: got[k] for k in summary} and summary["completed"]     # node 1 has rank 0's result too
    assert got["step"] == ref["step"] == STEPS and got["tokens"] == ref["tokens"] == STEPS * 2 * 4 * 32
    diff = _max_diff(_params(ref["checkpoint"]), _params(got["checkpoint"]))
    assert diff < 1e-5, diff
    assert _losses(out) == pytest.approx(_losses(ref_out), abs=1e-6)
    assert sorted(_losses(out)) == list(range(1, STEPS + 1))
    print(f"max |param diff| {diff:.1e}, max |loss diff| {_loss_diff(out, ref_out):.1e} vs 1 node x 2 processes")
    ck = Path(got["checkpoint"])
    assert ck.parent == out / "checkpoints"             # one checkpoint folder, shared by both nodes
    assert (ck / "rng-rank0.safetensors").is_file() and (ck / "rng-rank1.safetensors").is_file()
    assert (out / "launch" / "worker-args.json").is_file() and (out / "launch" / "worker-args-node1.json").is_file()
    assert json.loads((out / "launch" / "worker-args.json").read_text())["finished"]["outcome"] == "completed"


@pytest.mark.heavy
def test_both_nodes_stopped_and_restarted_resume_exactly(shards, single_node, tmp_path):
    from flows.procs import free_port
    ref, ref_out = single_node
    out = tmp_path / "shared"
    port = free_port()
    nodes = _start_nodes(shards, tmp_path, out, port, module="slow_worker", tag="-a")
    deadline = time.monotonic() + 180
    while not (out / "metrics.jsonl").is_file() or len(read_metrics(out)) < 2:   # rank 0 logged step 2
        assert all(p.poll() is None for p, _, _ in nodes), [log.read_text(errors="replace")[-3000:]
                                                              for _, _, log in nodes]
        assert time.monotonic() < deadline, "no training step within 180 s"
        time.sleep(0.1)
    for p, _, _ in nodes:
        p.send_signal(signal.SIGTERM)                     # both "nodes" preempted
    rcs = _wait(nodes)
    logs = [log.read_text(errors="replace") for _, _, log in nodes]
    assert rcs == [128 + signal.SIGTERM] * 2, [x[-3000:] for x in logs]
    assert all("INTERRUPTED" in x and "checkpoint saved in" in x for x in logs), [x[-2000:] for x in logs]
    stopped = [int(c.name.split("-")[1]) for c in (out / "checkpoints").glob("step-*")]
    # node 1 below may start before node 0 writes the new arguments: it must wait for them, not join this attempt
    assert json.loads((out / "launch" / "worker-args.json").read_text())["finished"]["outcome"] == "interrupted"
    assert stopped and max(stopped) < STEPS, stopped
    print(f"\nstopped both nodes at step {max(stopped)} of {STEPS}")

    nodes = _start_nodes(shards, tmp_path, out, port, tag="-b")        # same endpoint, same run folder
    rcs = _wait(nodes)
    assert rcs == [0, 0], [log.read_text(errors="replace")[-3000:] for _, _, log in nodes]
    got = json.loads(nodes[0][1].read_text())
    assert got["resumed_from"] == max(stopped) and got["step"] == STEPS
    assert _losses(out) == pytest.approx(_losses(ref_out), abs=1e-6)
    assert sorted(_losses(out)) == list(range(1, STEPS + 1))
    assert len(read_metrics(out)) == STEPS              # steps before the stop logged once, not twice
    diff = _max_diff(_params(ref["checkpoint"]), _params(got["checkpoint"]))
    assert diff < 1e-5, diff
    print(f"after the restart: max |param diff| {diff:.1e}, max |loss diff| {_loss_diff(out, ref_out):.1e}")


@pytest.mark.heavy
def test_join_waits_for_the_next_attempt_not_a_finished_one(tmp_path, monkeypatch):
    """The join protocol on the shared folder, without torchrun (FAKE_WORKER). A node started right after an
    attempt ended must not take that attempt's arguments (it used to, for timeout_s after node 0 wrote them, and
    then failed to meet a node 0 that was gone): it waits for node 0's next attempt and joins that one, or times
    out naming the folder and the finished attempt it found. Finished = completed, failed or interrupted."""
    from concurrent.futures import ThreadPoolExecutor

    from mlm_core.train import distributed
    from mlm_core.train.distributed import DistributedTrainingError, join, launch
    (tmp_path / "fake_worker.py").write_text(FAKE_WORKER)
    monkeypatch.setattr(distributed, "torchrun_command",
                        lambda dist_cfg, args_file, module, rdzv_id=None: [sys.executable, str(tmp_path / "fake_worker.py"),
                                                                           str(args_file)])
    cfg = tiny_cfg(distributed={"nproc_per_node": 1, "nnodes": 2, "node_rank": 0, "rdzv_endpoint": "127.0.0.1:1",
                                "timeout_s": 60})
    run_dir = tmp_path / "pretrain-checkpoints" / "key" / "launch"          # where the pretrain stage launches
    node0 = lambda seed: launch({"config": cfg.model_dump(mode="json"), "seed": seed}, cfg.distributed, run_dir)
    pool = ThreadPoolExecutor(2)
    try:
        first = pool.submit(node0, 1)
        assert join(tmp_path, 1, wait_s=30)["seed"] == 1          # attempt 1: both nodes, from the workdir
        assert first.result(30)["seed"] == 1
        late = pool.submit(join, run_dir, 1, wait_s=60)           # a node started after attempt 1 ended
        time.sleep(3)
        assert not late.done(), f"joined the finished attempt: {late.result() if late.done() else ''}"
        assert node0(2)["seed"] == 2                              # node 0's next training meets it
        assert late.result(30)["seed"] == 2
        assert json.loads((run_dir / "worker-args-node1.json").read_text())["seed"] == 2
    finally:
        pool.shutdown(wait=False)
    with pytest.raises(DistributedTrainingError) as e:
        join(tmp_path, 1, wait_s=2)
    msg = str(e.value)
    assert str(tmp_path) in msg and str(run_dir / "worker-args.json") in msg and "completed" in msg, msg
    with pytest.raises(DistributedTrainingError):
        node0(3)                                                  # a failed attempt is finished too
    with pytest.raises(DistributedTrainingError, match="failed"):
        join(run_dir, 1, wait_s=2)


def test_two_nodes_without_rendezvous_endpoint_is_a_config_error(tmp_path):
    from mlm_core.config.io import load_config
    from mlm_core.errors import MlmError
    cfg = tmp_path / "two-nodes.yaml"
    cfg.write_text("name: x\nsources: {en: {paths: [a.txt]}}\npretrain: {distributed: {nnodes: 2, node_rank: 1}}\n")
    with pytest.raises((MlmError, ValueError)) as e:
        load_config(cfg, [])
    msg = str(e.value)
    assert "pretrain.distributed.rdzv_endpoint" in msg and str(cfg) in msg, msg
