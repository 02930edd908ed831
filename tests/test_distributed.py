"""torchrun training on CPU (gloo): 2 processes == 1 process with grad_accum=2 (DDP and FSDP2); a failing rank
fails the launch with that rank's error, quickly, instead of hanging the other rank."""
from __future__ import annotations

import os
import textwrap
import time

import pytest

from conftest import REPO
from test_train import run, tiny_cfg, tiny_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("tiny-dist"))


def _args(cfg, shards, out) -> dict:
    return {"config": cfg.model_dump(mode="json"), "seed": 0, "shards": str(shards[0].path), "out_dir": str(out),
            "tokenizer_fingerprint": shards[1].fingerprint, "print_metrics": True}


@pytest.mark.heavy
@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp2"])
def test_two_gloo_processes_equal_one_process_with_accumulation(shards, tmp_path, fsdp):
    """Same global batch (rank r takes sampler draws r, r+2, ...; one process takes them in order), static
    masking (a function of the sequence id), dropout 0: the parameters after 3 steps agree to float rounding."""
    import torch
    from safetensors.torch import load_file

    from mlm_core.train.distributed import launch
    common = {"steps": 3, "checkpoint_every": 3, "masking": {"mode": "static"}, "model": {"dropout": 0.0},
              "warmup_steps": 0, "lr": 1e-3}
    one = tiny_cfg(grad_accum=2, **common)
    two = tiny_cfg(distributed={"nproc_per_node": 2, "fsdp": fsdp, "timeout_s": 60}, **common)
    torch.set_num_threads(1)
    ref = run(one, shards[0], tmp_path / "one")
    seen = []
    got = launch(_args(two, shards, tmp_path / "two"), two.distributed, tmp_path / "two", metrics_cb=seen.append,
                 env={"OMP_NUM_THREADS": "1"})
    a = load_file(ref["checkpoint"] + "/model.safetensors")
    b = load_file(got["checkpoint"] + "/model.safetensors")
    assert a.keys() == b.keys()
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert diff < 1e-5, diff
    assert got["final_loss"] == pytest.approx(ref["final_loss"], abs=1e-5)
    assert got["tokens"] == ref["tokens"] == 3 * 2 * 4 * 32
    assert [r["step"] for r in seen if r["type"] == "train"] == [1, 2, 3]        # forwarded from rank 0
    ck = tmp_path / "two" / "checkpoints" / "step-000000000003"
    assert (ck / "rng-rank0.safetensors").is_file() and (ck / "rng-rank1.safetensors").is_file()
    assert got["eval"].keys() == ref["eval"].keys()


@pytest.mark.heavy
def test_a_failing_rank_fails_the_launch_with_its_error(shards, tmp_path):
    from mlm_core.train.distributed import DistributedTrainingError, launch
    (tmp_path / "failing_worker.py").write_text(textwrap.dedent("""
        import sys
        import torch.distributed as dist
        from mlm_core.train import loop, worker

        def train(*a, rank=0, **kw):
            if rank == 1:
                raise RuntimeError("injected failure on rank 1")
            dist.barrier()          # rank 0 waits for a rank that is gone: only torchrun can end this
            return {}

        loop.train = train
        sys.exit(worker.main())
    """))
    cfg = tiny_cfg(distributed={"nproc_per_node": 2, "timeout_s": 300})
    t0 = time.monotonic()
    with pytest.raises(DistributedTrainingError) as e:
        launch(_args(cfg, shards, tmp_path / "out"), cfg.distributed, tmp_path / "out", module="failing_worker",
               env={"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    elapsed = time.monotonic() - t0
    msg = str(e.value)
    assert "failed on rank 1" in msg and "RuntimeError: injected failure on rank 1" in msg
    assert elapsed < 90, elapsed                     # not the 300 s collective timeout


@pytest.mark.heavy
def test_stall_guard_kills_a_silent_group(shards, tmp_path):
    from mlm_core.train.distributed import DistributedTrainingError, launch
    (tmp_path / "silent_worker.py").write_text("import time\ntime.sleep(600)\n")
    cfg = tiny_cfg(distributed={"nproc_per_node": 2, "timeout_s": 600})
    t0 = time.monotonic()
    with pytest.raises(DistributedTrainingError, match="no progress for 8 s"):
        launch(_args(cfg, shards, tmp_path / "out"), cfg.distributed, tmp_path / "out", module="silent_worker",
               stall_timeout_s=8, env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    assert time.monotonic() - t0 < 60


def test_torchrun_command_for_multi_node():
    from mlm_core.config import DistributedConfig
    from mlm_core.train.distributed import DistributedTrainingError, torchrun_command
    cmd = torchrun_command(DistributedConfig(nproc_per_node=4, nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29400"),
                           "a.json")
    s = " ".join(cmd)
    assert "--nproc_per_node 4 --nnodes 2" in s and "--node_rank 1 --rdzv_backend c10d --rdzv_endpoint 10.0.0.1:29400" in s
    assert s.endswith("-m mlm_core.train.worker a.json") and "--standalone" not in s
    assert "--standalone" in " ".join(torchrun_command(DistributedConfig(nproc_per_node=2), "a.json"))
    with pytest.raises(DistributedTrainingError, match="rdzv_endpoint"):
        # the config refuses it (test_multinode); the launcher refuses it too for a config built without checks
        torchrun_command(DistributedConfig.model_construct(nproc_per_node=2, nnodes=2), "a.json")


def test_a_marker_glued_onto_another_line_is_split_off():
    """Ranks share torchrun's stdout pipe: a heartbeat once landed between a metrics record and its newline
    (CI, test_multinode). The launcher reads every marker as a line of its own."""
    from mlm_core.train.distributed import split_marked
    rec = '{"type": "train", "step": 1, "loss": 6.0}'
    assert split_marked("@@MLM_METRICS " + rec + "@@MLM_HB 1 1") == ["@@MLM_METRICS " + rec, "@@MLM_HB 1 1"]
    assert split_marked("W0101 some warning@@MLM_HB 0 7") == ["W0101 some warning", "@@MLM_HB 0 7"]
    assert split_marked("@@MLM_HB 0 3") == ["@@MLM_HB 0 3"]
    assert split_marked("a plain @@MLM_ line") == ["a plain @@MLM_ line"]
