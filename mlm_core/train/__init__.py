"""The pretraining engine: the loop (``loop.train``), checkpoints (``checkpoint``), AdamW + LR schedule
(``optim``), torchrun launch and rank setup (``distributed``, ``worker``) and the stage (``stage.run_pretrain``).

Importing this package imports nothing heavy; import the submodules (they import torch).
"""
from __future__ import annotations

__all__ = ["run_pretrain", "train", "build_model", "CheckpointMismatch", "CheckpointError",
           "DistributedTrainingError"]


def __getattr__(name: str):
    if name == "run_pretrain":
        from mlm_core.train.stage import run_pretrain
        return run_pretrain
    if name in ("train", "build_model"):
        from mlm_core.train import loop
        return getattr(loop, name)
    if name in ("CheckpointMismatch", "CheckpointError"):
        from mlm_core.train import checkpoint
        return getattr(checkpoint, name)
    if name == "DistributedTrainingError":
        from mlm_core.train.distributed import DistributedTrainingError
        return DistributedTrainingError
    raise AttributeError(name)
