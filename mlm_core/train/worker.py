"""One training process: ``python -m mlm_core.train.worker ARGS.json`` (what torchrun runs on every rank).

ARGS.json: {"config": PretrainConfig as JSON, "seed": int, "shards": shard folder, "tokenizer_fingerprint":
str | null, "verify": "once" | "every_open" | "off", "out_dir": working folder (metrics.jsonl, checkpoints/),
"resume": bool, "stop_after": int | null, "result_file": path | null (rank 0 writes the result there),
"init": ``init_from.InitSpec`` as JSON | null (pretrain.init_from, resolved and checked by the parent),
"bias": ``bias.regularizer.GroupTable`` as JSON | null (pretrain.bias_regularizer, built by the parent)}.
Without torchrun (no WORLD_SIZE) it trains as a single process. Rank 0 prints each metrics record as
``@@MLM_METRICS {json}`` on stdout when ``print_metrics`` is set (the launcher forwards them), every rank
prints a heartbeat every few seconds, and a failing rank writes its traceback to ``$MLM_ERROR_DIR/rank<r>.txt``.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path


def run(args: dict) -> dict:
    import torch

    from mlm_core.config import PretrainConfig
    from mlm_core.shards import ShardDataset
    from mlm_core.store import write_json_atomic
    from mlm_core.train.distributed import HEARTBEAT_PREFIX, METRICS_PREFIX, env_ranks, setup
    from mlm_core.train.loop import build_model, resolve_device, train

    cfg = PretrainConfig.model_validate(args["config"])
    device = resolve_device(cfg, env_ranks()[2])
    rank, world, local = setup(cfg.distributed.backend, device, cfg.distributed.timeout_s)
    ds = ShardDataset(args["shards"], verify=args.get("verify", "once"),
                      expect_tokenizer_fingerprint=args.get("tokenizer_fingerprint"),
                      tokenizer_dir=args.get("tokenizer_dir"))
    specials = {r: int(e["id"]) for r, e in ds.manifest["special_tokens"].items()}
    seed = int(args.get("seed", 0))
    torch.manual_seed(seed)                             # identical initial weights on every rank
    init = None
    if args.get("init"):        # pretrain.init_from: the parent resolved and checked it; build the same model
        from mlm_core.train.init_from import InitSpec
        init = InitSpec(**args["init"])
    model, _ = build_model(cfg, int(ds.manifest["vocab_size"]), specials["pad"], init=init)
    bias = None
    if args.get("bias"):
        from mlm_core.bias.regularizer import GroupTable
        bias = GroupTable.from_json(args["bias"])

    def emit(line: str) -> None:
        # every rank shares torchrun's stdout pipe: one write per line keeps lines whole (a pipe write below
        # PIPE_BUF is atomic; print() writes the text and its newline separately, so another rank's line
        # could land in between)
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), (line + "\n").encode())

    def metrics_cb(rec: dict) -> None:
        emit(METRICS_PREFIX + json.dumps(rec))

    beat = {"t": 0.0}

    def heartbeat(step: int) -> None:
        if time.monotonic() - beat["t"] > 5:
            beat["t"] = time.monotonic()
            emit(f"{HEARTBEAT_PREFIX}{rank} {step}")

    from mlm_core.train import signals
    signals.install()           # torchrun forwards SIGTERM/SIGINT: every rank checkpoints at the same step
    with signals.graceful():
        result = train(cfg, ds, model, Path(args["out_dir"]), seed=seed, rank=rank, world_size=world,
                       local_rank=local, resume=bool(args.get("resume", True)), stop_after=args.get("stop_after"),
                       metrics_cb=metrics_cb if args.get("print_metrics") else None, heartbeat=heartbeat,
                       show_progress=not args.get("print_metrics"),   # the launcher shows the forwarded records
                       bias=bias)
    if rank == 0 and args.get("result_file"):
        write_json_atomic(Path(args["result_file"]), result)
    return result


def main(argv: list[str] | None = None) -> int:
    from mlm_core.train.distributed import env_ranks, teardown, write_error
    argv = sys.argv[1:] if argv is None else argv
    rank = env_ranks()[0]
    logging.basicConfig(level=logging.INFO, format=f"[rank{rank}] %(asctime)s %(levelname)s %(name)s: %(message)s")
    if len(argv) != 1:
        print("usage: python -m mlm_core.train.worker ARGS.json", file=sys.stderr)
        return 2
    try:
        run(json.loads(Path(argv[0]).read_text(encoding="utf-8")))
    except BaseException as e:      # noqa: BLE001 - report, then exit non-zero (torchrun stops the other ranks)
        text = f"{type(e).__name__}: {e}\n\n{traceback.format_exc()}"
        write_error(rank, text)
        sys.stderr.write(f"[rank{rank}] FAILED: {text}\n")
        sys.stderr.flush()
        return 1
    teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
