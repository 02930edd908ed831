"""``python -m mlm_core.train.join WORKDIR --node-rank R``: node R (> 0) of a multi-node pretrain.

Node 0 runs the pipeline (``mlm run CONFIG`` with ``pretrain.distributed.nnodes`` > 1 and ``rdzv_endpoint`` =
node 0's host:port); its pretrain stage writes the worker arguments into the shared workdir and waits for the
other nodes. Each other node runs this command on the same shared workdir: it waits for a live attempt of
node 0 (one whose launch has not ended) and launches its own processes with its arguments (``distributed.join``).
Exit 0 when training completed, 128 + signal when stopped by a signal (every node checkpointed at the same step:
run both again to resume), 1 on a failure.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m mlm_core.train.join",
                                 description="Join a multi-node pretrain as node R (node 0 runs `mlm run`).")
    ap.add_argument("root", help="the shared workdir (or the launch folder holding node 0's worker-args.json)")
    ap.add_argument("--node-rank", type=int, required=True)
    ap.add_argument("--wait", type=float, default=600, help="seconds to wait for node 0 (default 600)")
    ap.add_argument("--module", default="mlm_core.train.worker", help=argparse.SUPPRESS)   # tests
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from mlm_core.train import signals
    from mlm_core.train.distributed import DistributedTrainingError, join
    try:
        res = join(Path(a.root), a.node_rank, wait_s=a.wait, module=a.module)
    except signals.Interrupted as e:
        print(f"INTERRUPTED {e}", file=sys.stderr)
        return e.exit_code
    except DistributedTrainingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps({k: res.get(k) for k in ("step", "final_loss", "checkpoint", "completed")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
