"""How many threads the pooled k-means kernels (``algorithms._kmeans``) use when a call
does not say: the CPU count, unless this process runs clients for a worker that owns one CPU
(``federation.workers.Shard`` sets 1). Its own module so that both can import it."""

from __future__ import annotations

import os

from ._validation import check_int

_DEFAULT: int | None = None
_CPUS: int | None = None  # read once: os.cpu_count() reads /sys on every call (once per round)


def set_kernel_threads(n_threads: int | None) -> None:
    """Threads of the pooled kernels when a call does not say (None: the CPU count)."""
    global _DEFAULT
    if n_threads is not None:
        n_threads = check_int(n_threads, "n_threads", minimum=1)
    _DEFAULT = n_threads


def kernel_threads() -> int:
    """The default thread count of the pooled kernels."""
    global _CPUS
    if _CPUS is None:
        _CPUS = os.cpu_count() or 1
    return max(1, _DEFAULT or _CPUS)
