"""CPU seconds spent by this process's descendants (Linux ``/proc``), sampled over time.

Wall time of a deployment round on a shared machine moves with whatever else runs there;
the CPU time of the deployment's own processes (SuperLink, SuperNodes, SuperExecs, every
ClientApp and ServerApp process, the ``flwr run`` clients) does not. The deployment
benchmarks therefore report both.

Accounting: a live process counts its own ``utime + stime`` plus ``cutime + cstime`` (the
totals of the children it has reaped); this process counts only its reaped children
(:func:`os.times`). Every process that ever ran below us is then counted exactly once, live
or reaped, as long as its parent waits for it (Flower's executors and the fork server do).
"""

from __future__ import annotations

import bisect
import os
import threading
import time

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def available() -> bool:
    return os.path.isfile(f"/proc/{os.getpid()}/stat")


def descendants_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds used so far by every process below ``root`` (default: this process)."""
    from securefkm.flower.deploy import descendants, proc_stats

    root = os.getpid() if root is None else int(root)
    stats = proc_stats()
    own = 0.0
    if root == os.getpid():
        t = os.times()
        own = t.children_user + t.children_system
    # utime + stime + cutime + cstime of every live descendant
    return own + sum(sum(int(x) for x in stats[p][11:15]) for p in descendants(root, stats)) / _TICK


class CpuSampler:
    """Samples :func:`descendants_cpu_seconds` every ``interval`` seconds in a thread;
    :meth:`between` interpolates the CPU seconds spent between two ``time.time()`` stamps."""

    def __init__(self, interval: float = 0.25):
        self.interval = float(interval)
        self.times: list[float] = []
        self.cpu: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _sample(self) -> None:
        self.cpu.append(descendants_cpu_seconds())
        self.times.append(time.time())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def at(self, t: float) -> float:
        """CPU seconds at wall-clock time ``t`` (linear between the samples around it)."""
        times, cpu = list(self.times), list(self.cpu)
        if not times:
            raise ValueError("no samples yet")
        i = bisect.bisect_left(times, t)
        if i == 0:
            return cpu[0]
        if i >= len(times):
            return cpu[-1]
        t0, t1 = times[i - 1], times[i]
        return cpu[i - 1] + (cpu[i] - cpu[i - 1]) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)

    def between(self, t0: float, t1: float) -> float:
        return self.at(t1) - self.at(t0)
