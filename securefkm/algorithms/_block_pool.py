"""The process-wide thread pool of the pooled k-means kernel (:mod:`._kmeans`) and
single-threaded BLAS around it: blocks of records run in parallel on kept threads, the
calling thread taking blocks too."""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from .._kernel_threads import kernel_threads

_BLAS = None


def _single_threaded_blas():
    """A context in which BLAS runs on one thread (the blocks run in parallel instead:
    small threaded GEMMs spin and stall on a shared machine). The controller is built once."""
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=1, user_api="blas")


_POOLS: dict = {}
_POOLS_LOCK = threading.Lock()
_POOL_PREFIX = "securefkm-blocks"


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's pool threads (and maybe a lock some thread
    held): it starts with no pools and a fresh lock."""
    global _POOLS_LOCK
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _threads(n_threads: int | None) -> int:
    """The thread count of the pooled kernels: ``n_threads``, else
    :func:`securefkm._kernel_threads.kernel_threads`; one inside a block worker (a nested
    pooled call runs in its caller's thread)."""
    if threading.current_thread().name.startswith(_POOL_PREFIX):
        return 1
    return max(1, n_threads or kernel_threads())


def shutdown_pools() -> None:
    """Stop the kernel's worker threads (they and their scratch buffers are made again on
    the next pooled call); for a clean memory measurement, or a long-lived process that is
    done with fitting."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.shutdown(wait=True)


def _pool(workers: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``workers`` threads, kept between calls (a round at 100 clients
    is a few ms: starting threads each time cost a tenth of it)."""
    with _POOLS_LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix=_POOL_PREFIX)
        return _POOLS[workers]


def _run_shared(pool: ThreadPoolExecutor, fn, blocks: list, helpers: int = 1) -> list:
    """``[fn(b) for b in blocks]`` computed by the calling thread and ``helpers`` tasks on
    ``pool`` together: each takes the next block not yet taken (one shared counter; taking is
    atomic under the GIL) until none is left, so a thread that starts late or runs slowly
    simply takes fewer blocks.

    The caller is already running, a pool thread has to be woken: between two rounds the
    pool's threads sleep while the server does its part, and the pool thread starts its
    first block about 0.1 ms after the caller (``python -m benchmarks.speed_diagnostics``;
    scikit-learn's OpenMP threads spin instead). With the caller working from the start (and
    larger distance products, since replaced by :data:`._cellsums.PRODUCT_ROWS`) the DWF round at 100k x 16 went
    from 2.3 to 1.8 x scikit-learn's Lloyd iteration (docs/benchmarks.md). One task per
    helper rather than one future per block: a submit costs several us under the GIL, eight
    of them delayed the caller's first block. A block that raises stops everyone taking
    more; the first error is raised once the helpers are done (a helper still queued, e.g.
    behind another caller's blocks, is cancelled instead of waited for).
    Which thread computes a block changes no result: each block writes its own output."""
    n = len(blocks)
    results: list = [None] * n
    take = itertools.count().__next__
    failed: list = []

    def work():
        while not failed:
            i = take()
            if i >= n:
                return
            try:
                results[i] = fn(blocks[i])
            except BaseException:
                failed.append(i)
                raise

    futures = [pool.submit(work) for _ in range(helpers)]
    error = None
    try:
        work()
    except BaseException as exc:
        error = exc
    for future in futures:
        if future.cancel():
            continue
        try:
            future.result()
        except BaseException as exc:
            error = error or exc
    if error is not None:
        raise error
    return results
