"""pretrain.threads / mlm_core.train.threads: pretraining picks its torch thread count itself (issue 20)."""
from __future__ import annotations

import subprocess
import sys
import time

from mlm_core.train.threads import choose_threads, runnable_others


def test_configured_and_env_win():
    assert choose_threads(3, env={"OMP_NUM_THREADS": "1"}, cores=2, others=0)[0] == 3
    assert choose_threads(None, env={"OMP_NUM_THREADS": "1"}, cores=8, others=0) == (1, "$OMP_NUM_THREADS")


def test_free_cores_at_least_one():
    assert choose_threads(None, env={}, cores=2, others=0)[0] == 2
    assert choose_threads(None, env={}, cores=2, others=1)[0] == 1
    assert choose_threads(None, env={}, cores=2, others=7)[0] == 1
    assert choose_threads(None, env={}, cores=16, others=5)[0] == 11
    assert choose_threads(None, env={}, cores=4, others=None)[0] == 4     # load unknown: all cores


def test_busy_machine_gets_one_thread():
    """Two processes spinning on a 2-core budget: the measured count sees them and training gets 1 thread."""
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.5)
        others = runnable_others()
        assert others is not None and others >= 2, others
        assert choose_threads(None, env={}, cores=2)[0] == 1
    finally:
        for p in spin:
            p.kill()
            p.wait()
