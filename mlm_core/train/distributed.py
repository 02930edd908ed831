"""Multi-process training: the torchrun launcher (caller side) and rank setup / model wrapping (worker side).

Caller: ``launch(args, dist_cfg, run_dir, metrics_cb=...)`` runs
``python -m torch.distributed.run --nproc_per_node N [...] -m mlm_core.train.worker <run_dir>/worker-args.json``
as a subprocess in its own process group, streams every output line to the logger, forwards the metrics
lines rank 0 prints (``@@MLM_METRICS {json}``) to ``metrics_cb``, and returns rank 0's ``result.json``.
On failure it raises ``DistributedTrainingError`` carrying the first failing rank's traceback (each worker
writes ``<run_dir>/errors/rank<r>.txt`` before exiting). It never hangs: torchrun stops every rank when
one fails, collectives time out after ``timeout_s``, and a wall-clock guard kills the whole group when no
line and no heartbeat arrived for ``timeout_s`` seconds.

Multi-node (``nnodes`` > 1): every node calls ``launch`` with the same arguments and its own ``node_rank``,
``rdzv_endpoint`` = node 0's host:port. ``run_dir`` (and the checkpoint folder beside it) must be one shared
folder: rank 0 writes the weights and the result, every rank its RNG/sampler state, into the same checkpoint.
The torchrun run id (``--rdzv_id``) is derived from the arguments, so the nodes of one training meet and two
trainings on one endpoint do not. With the c10d backend the rendezvous numbers the ranks (torchrun ignores
``node_rank``; rank 0 may run on any node) and node 0 hosts the rendezvous store; ``rdzv_backend: static``
numbers them by ``node_rank``. Every node's ``launch`` returns rank 0's result, read from the shared folder.
A SIGTERM to one node stops all ranks at the same step boundary (checkpoint first); every node then raises
``signals.Interrupted``, and relaunching every node resumes from that checkpoint. Through the pipeline: node 0
runs ``mlm run``; every other node runs ``python -m mlm_core.train.join WORKDIR --node-rank R``
(``join``: the arguments of node 0's live attempt, from the shared folder).

Worker: ``setup()`` reads RANK / WORLD_SIZE / LOCAL_RANK, picks the backend (gloo on CPU, nccl on CUDA)
and calls ``init_process_group`` with the timeout. ``wrap_model`` returns DDP, or the module sharded
in place with FSDP2 ``fully_shard`` (each transformer block, then the root).
"""
from __future__ import annotations

import collections
import contextlib
import datetime
import json
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from mlm_core.errors import StageError
from mlm_core.train import signals
from mlm_core.train.collective import all_reduce_sum  # noqa: F401 - also public here

log = logging.getLogger(__name__)
METRICS_PREFIX = "@@MLM_METRICS "
HEARTBEAT_PREFIX = "@@MLM_HB "
ERROR_DIR_ENV = "MLM_ERROR_DIR"


class DistributedTrainingError(StageError):
    """A multi-process run that failed or stalled; the message carries the failing rank's error."""


# ------------------------------------------------------------------------------------------------ worker side
def env_ranks() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun's environment; (0, 1, 0) without it."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0)))


def pick_backend(requested: str, device: torch.device) -> str:
    if requested == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if requested == "nccl" and device.type != "cuda":
        raise DistributedTrainingError("distributed.backend nccl needs CUDA devices; use gloo (or auto) on CPU")
    return requested


def setup(backend: str, device: torch.device, timeout_s: int) -> tuple[int, int, int]:
    """Join the process group when WORLD_SIZE > 1; returns (rank, world_size, local_rank)."""
    rank, world, local = env_ranks()
    if world > 1 and not torch.distributed.is_initialized():
        import torch.distributed as dist
        if device.type == "cuda":
            torch.cuda.set_device(local)
        kw = {"device_id": torch.device("cuda", local)} if device.type == "cuda" else {}
        dist.init_process_group(pick_backend(backend, device), timeout=datetime.timedelta(seconds=timeout_s), **kw)
    return rank, world, local


def teardown() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _blocks(model: nn.Module) -> list[nn.Module]:
    from mlm_core.model import MLMEncoder
    return [b for m in model.modules() if isinstance(m, MLMEncoder) for b in m.blocks]


def wrap_model(model: nn.Module, dist_cfg, device: torch.device, world_size: int) -> nn.Module:
    """DDP, FSDP2 (dist_cfg.fsdp) or the model itself for one process."""
    if world_size == 1:
        return model
    if dist_cfg.fsdp:
        from torch.distributed.fsdp import fully_shard
        for block in _blocks(model):
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def write_error(rank: int, text: str) -> None:
    d = os.environ.get(ERROR_DIR_ENV)
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        (Path(d) / f"rank{rank}.txt").write_text(text, encoding="utf-8")


# ------------------------------------------------------------------------------------------------ caller side
def rendezvous_id(args: dict, run_dir: Path) -> str:
    """The torchrun run id every node of one training computes alike: from the worker arguments and the run
    folder's last two names (the trajectory key, then ``launch``), not its absolute path, which may differ
    between nodes mounting the same shared folder. Two different trainings on one endpoint never meet."""
    import copy
    import hashlib
    config = copy.deepcopy(args.get("config") or {})
    config.get("distributed", {}).pop("node_rank", None)        # the one setting that differs between nodes
    key = {"config": config, "seed": args.get("seed"), "dir": "/".join(Path(run_dir).parts[-2:])}
    return "mlm-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def torchrun_command(dist_cfg, args_file: Path, module: str = "mlm_core.train.worker",
                     rdzv_id: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(dist_cfg.nproc_per_node),
           "--nnodes", str(dist_cfg.nnodes), "--max_restarts", "0"]
    if dist_cfg.nnodes == 1 and not dist_cfg.rdzv_endpoint:
        cmd += ["--standalone"]                    # single node: a free local port, no rendezvous server
    else:
        if not dist_cfg.rdzv_endpoint:
            raise DistributedTrainingError("pretrain.distributed.rdzv_endpoint is required when nnodes > 1 (host:port)")
        cmd += ["--node_rank", str(dist_cfg.node_rank), "--rdzv_backend", dist_cfg.rdzv_backend,
                "--rdzv_endpoint", dist_cfg.rdzv_endpoint]
        if rdzv_id:
            cmd += ["--rdzv_id", rdzv_id]
        if dist_cfg.rdzv_backend == "c10d":
            # c10d assigns global ranks itself (torchrun ignores node_rank); node_rank 0 hosts the rendezvous
            # store, so the endpoint is node 0's address (no guessing from host names, which fails when
            # several "nodes" share one host), and a node that never comes fails after timeout_s, not 600 s
            cmd += ["--rdzv_conf", f"is_host={int(dist_cfg.node_rank == 0)},join_timeout={dist_cfg.timeout_s}"]
    return cmd + ["-m", module, str(args_file)]


_MARKER = re.compile(r"(?=@@MLM_(?:METRICS|HB) )")


def split_marked(line: str) -> list[str]:
    """One read line as the lines the ranks meant: a marker glued onto another line (ranks share one pipe;
    a writer outside our ``emit``, such as a library's print, can still split a line) starts a line of its own."""
    return [part for part in _MARKER.split(line) if part]


def _reader(stream, q: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        for part in split_marked(line.rstrip("\n")):
            q.put(part)
    q.put(None)


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _rank_errors(err_dir: Path) -> list[tuple[float, int, str]]:
    out = []
    for f in err_dir.glob("rank*.txt") if err_dir.is_dir() else []:
        try:
            out.append((f.stat().st_mtime, int(f.stem[4:]), f.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            pass
    return sorted(out)


def launch(args: dict, dist_cfg, run_dir: Path, *, metrics_cb: Callable[[dict], None] | None = None,
           module: str = "mlm_core.train.worker", stall_timeout_s: float | None = None,
           env: dict | None = None) -> dict:
    """Run the worker under torchrun; returns rank 0's result dict (see the module docstring)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    err_dir, result_file = run_dir / "errors", run_dir / "result.json"
    # Several nodes share run_dir (checkpoints need a shared folder anyway). Node 0 clears the last attempt's
    # files before its torchrun starts, hence before any rank of this attempt can run (they wait for node 0
    # in the rendezvous); the others leave them alone. Each node writes its own arguments file; node 0's names
    # a new attempt, and node 0 marks that attempt finished when its launch ends, however it ends, so that
    # `join` never takes the arguments of an attempt whose node 0 is gone.
    primary = dist_cfg.node_rank == 0
    if primary:
        for f in err_dir.glob("rank*.txt"):
            f.unlink()
        result_file.unlink(missing_ok=True)
    attempt = uuid.uuid4().hex if primary else args.get("attempt")
    args_file = run_dir / ("worker-args.json" if primary else f"worker-args-node{dist_cfg.node_rank}.json")
    from mlm_core.store import write_json_atomic
    write_json_atomic(args_file, {**args, "attempt": attempt, "result_file": str(result_file)})
    if not primary:
        return _run(args, dist_cfg, args_file, metrics_cb, module, stall_timeout_s, env)
    outcome = "failed"
    try:
        res = _run(args, dist_cfg, args_file, metrics_cb, module, stall_timeout_s, env)
        outcome = "completed"
        return res
    except (signals.Interrupted, KeyboardInterrupt):
        outcome = "interrupted"
        raise
    finally:
        _finish_attempt(args_file, attempt, outcome)


def _finish_attempt(args_file: Path, attempt: str, outcome: str) -> None:
    """Mark node 0's attempt over in its arguments file (``finished``); a later attempt's file is left alone."""
    from mlm_core.store import write_json_atomic
    try:
        cur = json.loads(args_file.read_text(encoding="utf-8"))
        if cur.get("attempt") == attempt:
            at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            write_json_atomic(args_file, {**cur, "finished": {"outcome": outcome, "at": at}})
    except (OSError, ValueError) as e:      # never hide the launch's own outcome; join's age check remains
        log.warning("could not mark attempt %s finished in %s: %s", attempt, args_file, e)


def _run(args: dict, dist_cfg, args_file: Path, metrics_cb, module: str, stall_timeout_s, env) -> dict:
    """One node's torchrun for ``launch``, its arguments file written: stream, wait, return rank 0's result."""
    run_dir = args_file.parent
    err_dir, result_file = run_dir / "errors", run_dir / "result.json"
    cmd = torchrun_command(dist_cfg, args_file, module,
                           rdzv_id=rendezvous_id(args, run_dir) if dist_cfg.nnodes > 1 else None)
    procs = dist_cfg.nproc_per_node
    penv = {**os.environ, "PYTHONUNBUFFERED": "1", ERROR_DIR_ENV: str(err_dir), **(env or {})}
    penv.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // procs)))
    stall = float(stall_timeout_s or dist_cfg.timeout_s)
    log.info("launching %d-process training: %s", procs * dist_cfg.nnodes, " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=penv,
                            start_new_session=True, bufsize=1)
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
    tail: collections.deque = collections.deque(maxlen=60)
    last, stalled, forwarded = time.monotonic(), False, 0
    stop = signals.graceful()
    stop.__enter__()        # a SIGTERM/SIGINT to us is forwarded to torchrun, which passes it to every rank
    from mlm_core.progress import RecordFeed
    total = args.get("stop_after") or args.get("config", {}).get("steps")
    shown = RecordFeed("pretrain", total)   # live progress from rank 0's records and heartbeats
    try:
        while True:
            if signals.requested() and not forwarded:
                forwarded = signals.requested()
                log.warning("forwarding %s to the training processes (they checkpoint, then stop)",
                            signal.Signals(forwarded).name)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, forwarded)
            try:
                line = q.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() - last > stall:
                    stalled = True
                    _kill_group(proc)
                    break
                continue
            if line is None:
                break
            last = time.monotonic()
            if line.startswith(METRICS_PREFIX):
                rec = json.loads(line[len(METRICS_PREFIX):])
                shown.record(rec)
                if metrics_cb is not None:
                    metrics_cb(rec)
            elif line.startswith(HEARTBEAT_PREFIX):
                rank_s, _, step_s = line[len(HEARTBEAT_PREFIX):].partition(" ")
                if rank_s == "0" and step_s.isdigit():
                    shown.step(int(step_s))
            else:
                tail.append(line)
                log.info("%s", line)
        rc = proc.wait(timeout=60)
    except BaseException:
        shown.close(failed=True)
        _kill_group(proc)
        raise
    finally:
        stop.__exit__(None, None, None)
    shown.close(failed=rc != 0 or stalled)
    errors = _rank_errors(err_dir) if rc != 0 or forwarded else []
    # multi-node: a signal another node received stops every rank at the same step (signals.should_stop);
    # this node then reports the same interruption, not a failure
    peer_stop = rc != 0 and errors and all(t.startswith("Interrupted: ") for _, _, t in errors)
    if forwarded or peer_stop:
        raise signals.Interrupted((errors[0][2].strip().splitlines()[0].removeprefix("Interrupted: ") if errors else
                                   f"pretrain: stopped by {signal.Signals(forwarded).name}") +
                                  f" (torchrun exit code {rc})", forwarded or signal.SIGTERM)
    if stalled:
        raise DistributedTrainingError(f"distributed training made no progress for {stall:.0f} s "
                                       f"(distributed.timeout_s): all ranks were stopped. Last output:\n"
                                       + "\n".join(list(tail)[-15:]))
    if rc != 0:
        if errors:
            _, rank, text = errors[0]
            raise DistributedTrainingError(f"distributed training failed on rank {rank} (torchrun exit code {rc}):\n"
                                           + "\n".join(text.strip().splitlines()[-25:]))
        raise DistributedTrainingError(f"torchrun exited with code {rc}; last output:\n" + "\n".join(list(tail)[-25:]))
    return _wait_result(result_file, stall)


def _wait_result(path: Path, timeout_s: float) -> dict:
    """Rank 0's result. It may run on another node, whose torchrun ends after ours: wait for its file in the
    shared folder (rank 0 writes it right after training, before leaving the process group)."""
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise DistributedTrainingError(f"training ended on this node but rank 0 wrote no {path} within "
                                           f"{timeout_s:.0f} s: is {path.parent} on a filesystem every node shares?")
        time.sleep(0.2)
    return json.loads(path.read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------------ other nodes
def _live_args(root: Path) -> tuple[Path | None, list[str]]:
    """The newest worker-args.json node 0 wrote under ``root`` (a launch folder, or a workdir:
    ``pretrain-checkpoints/*/launch/``) whose attempt is live: not marked ``finished`` (node 0's launch ended)
    and younger than its own rendezvous timeout (an older one is an attempt whose node 0 no longer waits, or was
    killed before it could mark it). Also returns why each other file was passed over, for the timeout error."""
    direct = root / "worker-args.json"
    cands = [direct] if direct.is_file() else list(root.glob("pretrain-checkpoints/*/launch/worker-args.json"))
    skipped = []
    for mtime, path in sorted(((p.stat().st_mtime, p) for p in cands), reverse=True):
        try:
            args = json.loads(path.read_text(encoding="utf-8"))
            timeout = args["config"]["distributed"]["timeout_s"]
        except (OSError, ValueError, KeyError) as e:
            skipped.append(f"{path}: unreadable ({type(e).__name__}: {e})")
            continue
        if done := args.get("finished"):
            skipped.append(f"{path}: attempt {args.get('attempt')} finished ({done.get('outcome')} at {done.get('at')})")
        elif (age := time.time() - mtime) > timeout:
            skipped.append(f"{path}: written {age:.0f} s ago, older than its distributed.timeout_s {timeout}")
        else:
            return path, skipped
    return None, skipped


def join(root: Path, node_rank: int, *, wait_s: float = 600, module: str = "mlm_core.train.worker") -> dict:
    """Run node ``node_rank`` of a multi-node pretrain whose node 0 runs the pipeline (``mlm run``).

    Node 0's pretrain stage writes ``worker-args.json`` into the shared launch folder, then waits for the
    other nodes in the rendezvous. Running ``mlm run`` on the other nodes too would not do: they would wait for
    node 0's locks on the shared workdir. Instead each runs ``python -m mlm_core.train.join
    WORKDIR_OR_LAUNCH_FOLDER --node-rank R``, which waits (``wait_s``) for a live attempt of node 0 (not one
    that already ended: see ``_live_args``) and launches this node's processes with its arguments; returns rank
    0's result."""
    root, t0 = Path(root), time.monotonic()
    while (path := (live := _live_args(root))[0]) is None:
        if time.monotonic() - t0 > wait_s:
            found = "; ".join(live[1]) or "no worker-args.json at all"
            raise DistributedTrainingError(f"no live attempt from node 0 under {root} within {wait_s:.0f} s "
                                           f"(found: {found}): start `mlm run` on node 0 (nnodes > 1) with the same "
                                           "shared workdir")
        time.sleep(1.0)
    args = json.loads(path.read_text(encoding="utf-8"))
    args.pop("result_file", None)
    from mlm_core.config import DistributedConfig
    dist = DistributedConfig.model_validate({**args["config"]["distributed"], "node_rank": node_rank})
    if dist.nnodes < 2 or not 0 < node_rank < dist.nnodes:
        raise DistributedTrainingError(f"{path}: nnodes is {dist.nnodes}, so --node-rank must be in 1..{dist.nnodes - 1}")
    log.info("node %d joins the training of %s", node_rank, path)
    return launch(args, dist, path.parent, module=module)


__all__ = ["DistributedTrainingError", "launch", "join", "rendezvous_id", "setup", "teardown", "wrap_model", "all_reduce_sum",
           "env_ranks", "torchrun_command", "METRICS_PREFIX", "HEARTBEAT_PREFIX"]
