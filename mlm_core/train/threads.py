"""How many torch intra-op threads pretraining uses on a CPU: ``pretrain.threads``, else chosen here.

Why pretraining sets it itself: torch's default is one thread per core, and its OpenMP workers spin-wait
between ops. When other processes share the cores (a CI run, a sweep's second run, the user's editor and
browser), the spinning threads fight them and each other: a 6x slowdown of pretraining was measured on a
loaded 2-core machine (issue 20), where one thread ran at full speed.

In: ``pretrain.threads`` (an int: used as given), ``$OMP_NUM_THREADS`` (the user's choice, used as given),
the cores this process may run on (``os.sched_getaffinity``) and the runnable tasks on the machine now
(``/proc/loadavg``'s fourth field, sampled a few times: the instantaneous count, not the 1-minute average,
which still remembers the stages this process just ran). Out: the thread count: the free cores, at least 1.
"""
from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)
SAMPLES, SAMPLE_GAP_S = 5, 0.05


def available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):        # not Linux
        return max(1, os.cpu_count() or 1)


def runnable_others(samples: int = SAMPLES, gap: float = SAMPLE_GAP_S) -> int | None:
    """Runnable tasks other than this one (median of a few samples of /proc/loadavg), None where unknown."""
    seen = []
    for i in range(samples):
        try:
            with open("/proc/loadavg", encoding="ascii") as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        seen.append(max(0, running - 1))     # the reading counts this process (it is running to read it)
        if i + 1 < samples:
            time.sleep(gap)
    return sorted(seen)[len(seen) // 2]


def choose_threads(configured: int | None, env: dict | None = None, cores: int | None = None,
                   others: int | None = -1) -> tuple[int, str]:
    """(threads, why). ``others=-1``: measure now; tests pass a number (or None for "unknown")."""
    env = os.environ if env is None else env
    cores = cores or available_cores()
    if configured:
        return int(configured), "pretrain.threads"
    omp = str(env.get("OMP_NUM_THREADS", "")).strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp), "$OMP_NUM_THREADS"
    if others == -1:
        others = runnable_others()
    if others is None:
        return cores, f"{cores} core(s), load unknown"
    free = max(1, cores - others)
    return free, f"{cores} core(s), {others} other runnable task(s)"


def apply(configured: int | None) -> int:
    """Set torch's intra-op thread count for this process (CPU training); returns it."""
    import torch
    n, why = choose_threads(configured)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    log.info("pretrain: %d torch thread(s) (%s)", n, why)
    return n


__all__ = ["choose_threads", "apply", "available_cores", "runnable_others"]
