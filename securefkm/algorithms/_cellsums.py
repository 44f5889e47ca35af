"""The inner loop of the pooled k-means kernel: each record of a block goes to its nearest
centre and is added to its (client, cell) row.

Input: a block's records ``X`` (n, d), the centres as ``C2T = -2 C^T`` and ``cc = ||c_j||^2``,
and each record's first output row ``row_base[i]`` (its client's cells are rows
``row_base[i] .. row_base[i] + k - 1``). A record's cell is the first ``j`` minimising
``(X @ C2T)[i, j] + cc[j]`` (``np.argmin``'s tie rule); a row's sum adds its records one after
the other, in record order, starting from 0.

Two implementations of exactly these floating-point operations, so they give the same bits:

* numpy's, the reference: one distance product, ``np.argmin`` and one sparse product (scipy
  adds a row's records in record order);
* a compiled loop (numba, ``nogil``; :mod:`._cellsums_jit`) that fuses the argmin and the
  sums in one pass, over sub-blocks of records (:func:`sub_rows`) whose distances stay in the
  CPU cache (scikit-learn's Lloyd loop works in chunks of 256 records for the same reason).
  Releasing the GIL is what lets the pooled kernel's blocks run on every core; numpy's
  argmin along a short axis and scipy's Python-level matrix construction do not scale past
  one core.

:func:`pooled_cell_sums` runs the whole kernel call as one compiled parallel loop over the
clients' pieces instead (numba's threads, OpenMP where numba has it), calling numpy's own
``dgemm`` (:mod:`._numpy_blas`) on :data:`POOLED_SUB_ROWS` records at a time: no Python
between blocks, no thread pool to wake (:func:`use_pooled`).

:func:`use_compiled` picks the compiled loop for calls large enough to pay for it (numba's
first compilation, or loading it from the on-disk cache, costs once per process) when numba
is installed; which one runs never changes a result (``tests/test_vectorised.py``).
"""

from __future__ import annotations

import contextlib
import os
import threading

import numpy as np
from scipy import sparse

#: calls with fewer (records x centres) than this use the numpy loop: small fits never
#: import or compile numba (0.2 s to import, 0.6 s to compile without the disk cache)
JIT_MIN_WORK = 1 << 18

#: bytes of distances per product in the compiled path: a sub-block of ``SUB_BYTES / (8 k)``
#: records (at least :data:`SUB_ROWS`). Each sub-block costs two calls from Python (the
#: product, the loop, holding the GIL that the other block threads wait for), so fewer,
#: larger ones are faster while the distances stay cached: at 100k x 16 (k=20) whole blocks
#: of 12,500 records took 2.97 ms a call against 3.75 ms for sub-blocks of 2,048; at 1M x 32
#: (k=50, 10,000 clients) 5,242 records, 2,048 and whole blocks were within noise
#: (``python -m securefkm.bench.speed_diagnostics``, 2 threads; docs/benchmarks.md)
SUB_BYTES = 1 << 21

#: the fewest records per distance product, whatever ``k``
SUB_ROWS = 2048

#: the compiled loop adds a client's run of at least ``k`` records into a local copy of its
#: ``k`` rows (:func:`._cellsums_jit.fused`): the same additions, vectorised. At 10,000
#: clients of 1M x 32 (k=50) the pooled kernel call took 94.3 and 96.8 ms with them against
#: 98.8 and 104.0 ms adding in place; at 100k x 16 (k=20, 100 clients) faster in four runs
#: of five, 2.55-3.19 ms against 2.61-2.77 ms (``python -m securefkm.bench.speed_diagnostics local_runs``;
#: docs/benchmarks.md); False adds every record in place (the diagnostic's comparison)
LOCAL_RUNS = True


def sub_rows(k: int) -> int:
    """Records per distance product for ``k`` centres (:data:`SUB_BYTES`)."""
    return max(SUB_ROWS, SUB_BYTES // (8 * max(k, 1)))


#: scratch buffers up to this size are kept by their thread between calls (a block of
#: 16,384 records of 32 features is 4 MB; the numpy loop's distances for k = 1,000, 131 MB,
#: are not kept by the kernel's long-lived threads)
SCRATCH_KEEP_BYTES = 1 << 26

_COMPILED = None  # the compiled loop, False when numba is unavailable
_SCRATCH = threading.local()


def scratch(name: str, shape: tuple[int, int]) -> np.ndarray:
    """A per-thread reusable float buffer of at least ``shape`` (a view of that shape).

    The pooled kernel's per-block temporaries (the block's records, its distances: MBs)
    would otherwise be fresh allocations each block; while the round's messages stay alive
    the allocator keeps mapping new pages for them, and the page faults cost more than the
    distance product itself (measured at 10,000 clients of 1M x 32, k=50)."""
    size = shape[0] * shape[1]
    buf = getattr(_SCRATCH, name, None)
    if buf is None or buf.size < size:
        buf = np.empty(max(size, 1))
        if buf.nbytes > SCRATCH_KEEP_BYTES:  # the kernel's threads live on: keep no giant buffer
            return buf[:size].reshape(shape)
        setattr(_SCRATCH, name, buf)
    return buf[:size].reshape(shape)


def compiled(name: str = "fused"):
    """The compiled loop ``name`` of :mod:`._cellsums_jit` (compiled, or loaded from numba's
    disk cache, on first use), or None without numba."""
    global _COMPILED
    if _COMPILED is None:
        try:
            from . import _cellsums_jit

            _COMPILED = _cellsums_jit
        except ImportError:
            _COMPILED = False
    return getattr(_COMPILED, name) if _COMPILED else None


def use_compiled(work: int) -> bool:
    """Whether a call of ``work`` (records x centres, all blocks) runs the compiled loop."""
    return work >= JIT_MIN_WORK and compiled() is not None


def cell_sums_numpy(X, C2T, cc, row_base, sums, counts):
    """The reference loop: write the block's sums and counts into ``sums`` / ``counts``."""
    D = np.matmul(X, C2T, out=scratch("distances", (len(X), len(cc))))
    D += cc[None, :]
    seg = row_base + np.argmin(D, axis=1)
    m = sparse.csc_matrix(
        (np.ones(len(X)), seg.astype(np.int32), np.arange(len(X) + 1, dtype=np.int32)), shape=(len(sums), len(X))
    )
    sums[...] = m @ X
    counts[...] = np.bincount(seg, minlength=len(counts))


def cell_sums_compiled(X, C2T, cc, row_base, sums, counts):
    """The compiled loop over sub-blocks of :func:`sub_rows` records, adding into ``sums`` /
    ``counts`` (zeros): a row's records are added in record order across sub-blocks too."""
    fused = compiled()
    step = sub_rows(len(cc))
    min_run = len(cc) if LOCAL_RUNS else len(X) + 1
    D = scratch("distances", (min(step, len(X)), len(cc)))
    for start in range(0, len(X), step):
        stop = min(len(X), start + step)
        Dsub = np.matmul(X[start:stop], C2T, out=D[: stop - start])
        fused(Dsub, cc, X[start:stop], row_base[start:stop], sums, counts, min_run)


#: records per distance product in :func:`pooled_cell_sums` (scikit-learn's Lloyd loop
#: uses 256 too: the (256, k) distances stay in the L1/L2 cache)
POOLED_SUB_ROWS = 256

#: False: the pooled kernel keeps its thread-pool form even where :func:`pooled_cell_sums`
#: could run (the diagnostics' comparison, and the tests of both forms)
POOLED = True

_POOLED_LOCK = threading.Lock()
_THREADSAFE_LAYER: bool | None = None  # whether numba's threading layer may be entered by two threads at once


_FORKED = False  # this process was forked from one that had run pooled_cell_sums


def _after_fork_in_child() -> None:
    """numba's OpenMP layer terminates a forked child that starts a parallel loop after its
    parent ran one ("fork() called from a process already using GNU OpenMP, this is
    unsafe"): such a child uses the thread-pool form instead (the same bits)."""
    global _FORKED
    _FORKED = _FORKED or _THREADSAFE_LAYER is not None


os.register_at_fork(after_in_child=_after_fork_in_child)


def use_pooled(work: int) -> bool:
    """Whether a kernel call of ``work`` (records x centres) runs :func:`pooled_cell_sums`:
    large enough for the compiled loops (:func:`use_compiled`), numpy's ``dgemm`` found
    (:func:`._numpy_blas.dgemm`), and not in a child forked after the parent ran it."""
    if not (POOLED and not _FORKED and use_compiled(work)):
        return False
    from ._numpy_blas import dgemm

    return dgemm() is not None


def pooled_cell_sums(addresses, rows, d: int, C2T, cc, threads: int):
    """Each piece's per-cell sums and counts, ``(pieces * k, d)`` and ``(pieces * k,)``:
    piece ``p``, ``rows[p]`` C-ordered float64 records of ``d`` features at ``addresses[p]``
    (alive during the call), in rows ``p * k .. p * k + k - 1``.

    One call of the compiled parallel loop :func:`._cellsums_jit.pooled` on ``threads``
    of numba's threads (at most numba's own count); BLAS must run single-threaded (the
    caller's context). numba's ``workqueue`` layer (used where neither OpenMP nor TBB is
    installed) must not be entered by two threads at once: calls are serialised until
    numba reports a thread-safe layer."""
    global _THREADSAFE_LAYER
    import numba

    from ._numpy_blas import dgemm

    k = len(cc)
    address, int_type = dgemm()
    sums, counts = np.zeros((len(addresses) * k, d)), np.zeros(len(addresses) * k)
    before = numba.get_num_threads()
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    try:
        with _POOLED_LOCK if not _THREADSAFE_LAYER else contextlib.nullcontext():
            compiled("pooled")(address, np.zeros(6, dtype=int_type), addresses, rows, d, np.asfortranarray(C2T),
                               cc, sums, counts, POOLED_SUB_ROWS)
    finally:
        numba.set_num_threads(before)
        if _THREADSAFE_LAYER is None:
            try:
                _THREADSAFE_LAYER = numba.threading_layer() in ("omp", "tbb")
            except ValueError:  # the loop never launched: numba has no layer yet
                pass
    return sums, counts


def block_cell_sums(X, C2T, cc, row_base, sums, counts, fast: bool):
    """Add a block's records to their (client, cell) rows of ``sums`` / ``counts`` (zeros of
    (rows, d) and (rows,)); ``fast``: the compiled loop (:func:`use_compiled`)."""
    (cell_sums_compiled if fast else cell_sums_numpy)(X, C2T, cc, row_base, sums, counts)
