"""Module-level cell functions for tests/test_sweep.py (worker processes import them by name)."""

import os
from pathlib import Path

import numpy as np


def noisy_mean(cell):
    """A pure cell: a seeded computation with a float result and a nested structure."""
    rng = np.random.default_rng(cell["seed"])
    x = rng.normal(size=cell["n"])
    return {"seed": cell["seed"], "mean": float(x.mean()), "pid_free": [int(v) for v in np.sign(x[:3])]}


def logged(cell):
    """Appends its index to ``cell['log']``; fails on ``cell['i'] == cell['fail_at']`` while the
    file ``cell['flag']`` exists (an interrupted sweep)."""
    Path(cell["log"]).open("a").write(f"{cell['i']}\n")
    if cell["i"] == cell["fail_at"] and os.path.exists(cell["flag"]):
        raise KeyboardInterrupt("interrupted")
    return cell["i"] ** 2


def native_threads(cell: dict) -> dict:
    """The thread counts a worker's native pools (BLAS, OpenMP) and torch would use."""
    import os

    import numpy as np  # noqa: F401 (loads OpenBLAS)
    from threadpoolctl import threadpool_info

    return {"pools": max(p["num_threads"] for p in threadpool_info()), "omp_env": os.environ.get("OMP_NUM_THREADS")}


def slow(cell):
    """Writes its worker's pid to ``cell['dir']`` and sleeps: a cell a stopped sweep must kill."""
    import time

    Path(cell["dir"], f"{os.getpid()}.pid").write_text("")
    time.sleep(cell["seconds"])
    return cell["i"]
