"""The one collective the training loop and the stop signal share: a sum over ranks.

A leaf module (torch only), so that ``distributed`` (the launcher and rank setup, which catches
``signals.Interrupted``) and ``signals`` (whose ``should_stop`` takes the max of the stop flag over ranks)
both import it without importing each other.
"""
from __future__ import annotations

import torch


def all_reduce_sum(t: torch.Tensor, world_size: int, device: torch.device) -> torch.Tensor:
    """Sum a small tensor over ranks (identity for one process). Moves it to the collective's device."""
    if world_size == 1:
        return t
    import torch.distributed as dist
    dev = device if dist.get_backend() == "nccl" else torch.device("cpu")
    x = t.to(dev).clone()
    dist.all_reduce(x)
    return x.to(t.device)


__all__ = ["all_reduce_sum"]
