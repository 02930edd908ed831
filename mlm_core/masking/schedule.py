"""The masking-rate schedule (``pretrain.masking.schedule``): the selection rate p at a training step.

Masking-rate schedules: Wettig et al. 2023 ("Should you mask 15% in MLM?"), Yang et al. 2023 (time-variant
masking). Token and whole-word masks are nested across rates, so a schedule grows or shrinks a static mask and
never reshuffles it.
"""
from __future__ import annotations

import math

from mlm_core.config import MaskingConfig


def masking_rate(cfg: MaskingConfig, step: int, total_steps: int) -> float:
    """Selection rate p at ``step``.

    constant: cfg.rate. linear / cosine: rate_max at step 0 -> rate_min at step total_steps (held after).
    cyclical: rate_min + (rate_max - rate_min) * |sin(2 pi step / period)|.
    """
    if cfg.schedule == "constant":
        return float(cfg.rate)
    lo, hi = float(cfg.rate_min), float(cfg.rate_max)
    if cfg.schedule == "cyclical":
        return lo + (hi - lo) * abs(math.sin(2 * math.pi * step / cfg.period))
    frac = min(max(step / max(total_steps, 1), 0.0), 1.0)
    if cfg.schedule == "linear":
        return hi + (lo - hi) * frac
    if cfg.schedule == "cosine":
        return lo + (hi - lo) * 0.5 * (1.0 + math.cos(math.pi * frac))
    raise ValueError(f"unknown masking schedule {cfg.schedule!r}")


__all__ = ["masking_rate"]
