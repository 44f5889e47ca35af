"""How many threads the pooled k-means kernels (``algorithms._kmeans``) use when a call
does not say, and how many CPUs ``backend="auto"`` may spread clients over
(``federation.workers.auto_backend``): the CPUs this process may run on, capped by
``OMP_NUM_THREADS`` when that is set -- the limit scikit-learn's OpenMP kernels follow, and
the one joblib's workers and ``securefkm.sweep``'s workers are started with -- unless this
process runs clients for a worker that owns one CPU (``federation.workers.Shard`` sets 1).
Its own module so that both can import it."""

from __future__ import annotations

import os

from .validation import check_int

_DEFAULT: int | None = None
_CPUS: int | None = None  # read once: the affinity mask and the environment, not once per round


def set_kernel_threads(n_threads: int | None) -> None:
    """Threads of the pooled kernels when a call does not say (None: :func:`process_cpus`)."""
    global _DEFAULT
    if n_threads is not None:
        n_threads = check_int(n_threads, "n_threads", minimum=1)
    _DEFAULT = n_threads


def affinity_cpus() -> int:
    """CPUs this process may run on (the affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def process_cpus() -> int:
    """CPUs this process may run on (:func:`affinity_cpus`), at most ``OMP_NUM_THREADS``
    when that is a positive int."""
    cpus = affinity_cpus()
    limit = os.environ.get("OMP_NUM_THREADS", "").strip()
    if limit.isdigit() and int(limit) >= 1:
        cpus = min(cpus, int(limit))
    return max(1, cpus)


def kernel_threads() -> int:
    """The default thread count of the pooled kernels."""
    global _CPUS
    if _CPUS is None:
        _CPUS = process_cpus()
    return max(1, _DEFAULT or _CPUS)
