"""A parallel, resumable sweep over independent benchmark configurations.

    results = run_sweep(fit_one, [{"alg": "dwf", "seed": 0}, ...], jobs=2, cache_dir="out/cache")

``fn`` is a module-level function ``cell (JSON-able dict) -> result (JSON-able)``; it must be
pure (same cell, same result) so cells can run in any order, in any process. A script calling
it with ``jobs > 1`` needs an ``if __name__ == "__main__":`` guard (workers re-import ``__main__``). The engines are
existing ones: ``concurrent.futures.ProcessPoolExecutor`` on one machine (``backend="processes"``)
and Ray tasks on a cluster (``backend="ray"``, an optional extra; ``RAY_ADDRESS`` or an earlier
``ray.init(address=...)`` joins an existing cluster, otherwise a local one is started).

Each result is written to ``cache_dir/<key>.json`` as soon as it arrives, the key a SHA-256 of
``fn``'s qualified name and the cell's canonical JSON: an interrupted sweep re-run with the same
``cache_dir`` computes only the missing cells. Every result (computed or cached, serial or
parallel) goes through one JSON round trip, so the returned list is identical whatever the
backend, the number of jobs or the cache state, and in the order of ``cells``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .exceptions import InputError

BACKENDS = ("processes", "ray")
RAY_HINT = 'Ray is an optional extra: pip install -e ".[ray]" (or pip install ray), or use backend="processes".'


def _canonical(obj, what: str) -> str:
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what} must be JSON-able (dicts, lists, str, numbers, bool, None): {exc}.") from None


def _fn_name(fn) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def cell_key(fn, cell) -> str:
    """The cache key of ``cell`` under ``fn``: stable across processes, runs and dict order."""
    return hashlib.sha256(f"{_fn_name(fn)}\n{_canonical(cell, 'a cell')}".encode()).hexdigest()[:32]


def _roundtrip(result, cell):
    return json.loads(_canonical(result, f"the result of cell {cell!r}"))


def _write_cache(cache: Path, key: str, cell, result) -> None:
    """Atomic: a sweep killed mid-write leaves no half file that a resume would trust."""
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=f".{key}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(_canonical({"cell": cell, "result": result}, "a cache entry"))
    os.replace(tmp, cache / f"{key}.json")


def _read_cache(cache: Path, key: str):
    path = cache / f"{key}.json"
    try:
        return True, json.loads(path.read_text())["result"]
    except (OSError, ValueError, KeyError):
        return False, None


def _check(fn, cells, jobs, backend):
    if not callable(fn):
        raise InputError(f"fn must be a function cell -> result, got {type(fn).__name__}.")
    if "<locals>" in fn.__qualname__ or fn.__qualname__ == "<lambda>":
        raise InputError(f"fn must be a module-level function (worker processes import it by name), "
                         f"got {fn.__qualname__!r}; move it to the top level of a module.")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise InputError(f"jobs must be an int >= 1 (parallel workers; 1 = serial), got {jobs!r}.")
    if backend not in BACKENDS:
        raise InputError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}.")
    cells = list(cells)
    for c in cells:
        _canonical(c, f"cell {c!r}")
    return cells


def run_sweep(fn: Callable[[Any], Any], cells, *, jobs: int = 1, backend: str = "processes",
              cache_dir=None, desc: str = "sweep", progress: bool = True) -> list:
    """``[fn(cell) for cell in cells]``, in parallel and cached; see the module docstring.

    ``jobs``: worker processes (``processes``) or concurrent Ray tasks (``ray``); ``jobs=1``
    with ``processes`` runs in this process. ``progress``: one tqdm bar for the sweep (cached
    cells count as done at the start). An exception in ``fn`` stops the sweep and propagates;
    results that finished before it are cached.
    """
    cells = _check(fn, cells, jobs, backend)
    cache = None
    if cache_dir is not None:
        cache = Path(cache_dir)
        cache.mkdir(parents=True, exist_ok=True)
    keys = [cell_key(fn, c) for c in cells]
    results: list = [None] * len(cells)
    todo = []
    for i, k in enumerate(keys):
        hit, value = _read_cache(cache, k) if cache is not None else (False, None)
        if hit:
            results[i] = value
        else:
            todo.append(i)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(cells), initial=len(cells) - len(todo), desc=desc, unit="cell")

    def done(i, value):
        results[i] = _roundtrip(value, cells[i])
        if cache is not None:
            _write_cache(cache, keys[i], cells[i], results[i])
        if bar is not None:
            bar.update(1)

    try:
        with _sigterm_as_interrupt():
            if backend == "ray":
                _run_ray(fn, cells, todo, jobs, done)
            elif jobs == 1 or len(todo) <= 1:
                with _cell_threads():
                    for i in todo:
                        done(i, fn(cells[i]))
            else:
                _run_processes(fn, cells, todo, jobs, done)
    finally:
        if bar is not None:
            bar.close()
    return results


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (``kill``, a job scheduler's stop) raises KeyboardInterrupt in the sweep, so the
    workers are stopped as on Ctrl-C instead of outliving the killed driver. Main thread only
    (signal handlers can only be set there); the previous handler is restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                "NUMEXPR_NUM_THREADS")


#: threads per native pool (BLAS, OpenMP, torch) a cell runs with, whatever ``jobs`` is: a
#: threaded reduction sums in an order that depends on its thread count, so results would
#: otherwise change with ``jobs`` and with the machine's cores. Parallelism comes from jobs.
CELL_THREADS = 1


@contextlib.contextmanager
def _cell_threads():
    """Serial cells in this process run under the same thread limits as worker processes."""
    import sys

    from threadpoolctl import threadpool_limits

    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    with threadpool_limits(limits=CELL_THREADS):
        if torch is not None:
            torch.set_num_threads(CELL_THREADS)
        try:
            yield
        finally:
            if torch is not None:
                torch.set_num_threads(before)


def _pin_threads(n: int) -> None:
    """Worker initializer: at most ``n`` threads per native pool (BLAS, OpenMP, torch).

    Each library sizes its pool to the machine's cores, so ``jobs`` workers each running
    BLAS/OpenMP/torch with all cores oversubscribe the CPU ``jobs``-fold (on 2 cores, 4 spinning
    threads: ``jobs=2`` measured slower than ``jobs=1``). The variables cover libraries loaded
    later; threadpoolctl and ``torch.set_num_threads`` those already loaded (forkserver preload).
    """
    import sys

    for var in _THREAD_VARS:
        os.environ[var] = str(n)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    # and the library's own pooled kernels; with one CPU a fit's backend="auto" also keeps
    # its clients in the worker instead of starting worker processes of its own
    from ._kernel_threads import set_kernel_threads

    set_kernel_threads(n)


def _run_processes(fn, cells, todo, jobs, done) -> None:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    # forkserver: workers do not inherit the parent's threads or locks (torch, tqdm) as fork would.
    # Preloading fn's module makes the forkserver import it (numpy, sklearn, securefkm) once, so
    # each worker of each sweep starts from a fork of that instead of importing it again.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", fn.__module__])  # no effect once the server runs
    workers = min(jobs, len(todo))
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_pin_threads,
                               initargs=(CELL_THREADS,))
    pending = {pool.submit(fn, cells[i]): i for i in todo}
    try:
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                done(pending.pop(fut), fut.result())
    except BaseException:
        # Ctrl-C, SIGTERM or a failed cell: drop the queue and stop the running cells now (the
        # executor would wait for them, minutes for a slow cell, and an orphaned worker runs
        # on); what finished is cached
        for fut in pending:
            fut.cancel()
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _run_ray(fn, cells, todo, jobs, done) -> None:
    try:
        import ray
    except ImportError:
        raise InputError(f"backend='ray' needs the ray package, which is not installed. {RAY_HINT}") from None
    if not ray.is_initialized():
        # honours RAY_ADDRESS (joins that cluster); otherwise starts a local instance
        ray.init(include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(fn)
    queue = list(todo)
    running: dict = {}
    try:
        while queue or running:
            while queue and len(running) < jobs:  # at most `jobs` tasks in flight
                i = queue.pop(0)
                running[remote.remote(cells[i])] = i
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                done(running.pop(ref), ray.get(ref))
    except BaseException:
        for ref in running:
            ray.cancel(ref, force=True)
        raise


__all__ = ["BACKENDS", "cell_key", "run_sweep"]
