"""The inner loop of the pooled k-means kernel: each record goes to its nearest centre and
is added to its (client, cell) row.

Input: the records of a block of client pieces ``X`` (n, d), the centres as
``C2T = -2 C^T`` and ``cc = ||c_j||^2``, and each record's first output row ``row_base[i]``
(its client's cells are rows ``row_base[i] .. row_base[i] + k - 1``; a run of equal
``row_base`` is one piece of one client). A record's cell is the first ``j`` minimising
``P[i, j] + cc[j]`` (``np.argmin``'s tie rule); a row's sum adds its records one after the
other, in record order, starting from 0.

``P`` is the distance product ``X @ C2T``, computed by one ``np.matmul`` per
:func:`product_rows` records of a piece (2,048 for up to 128 centres), counted from the
piece's first record (:func:`product_ranges`). BLAS picks other kernels (other summation orders) for other
matrix sizes, so a product's last bits could depend on what else shares its call; with
this rule a record's products depend on its own client alone, and a client gets the same
labels computed alone or pooled with any others, whichever form runs.

Three implementations of exactly these floating-point operations, so they give the same
bits:

* numpy's, the reference: the products, ``np.argmin`` and one sparse product (scipy adds
  a row's records in record order);
* a compiled loop (numba, ``nogil``; :mod:`._cellsums_jit`) that fuses the argmin and the
  sums in one pass after each product, run for blocks on a thread pool (releasing the GIL
  lets the blocks run on every core; numpy's argmin along a short axis and scipy's
  Python-level matrix construction do not scale past one core);
* :func:`pooled_cell_sums`: the whole kernel call as one compiled parallel loop over the
  clients' pieces (numba's threads, OpenMP where numba has it), calling numpy's own
  ``dgemm`` (:mod:`._numpy_blas`) from the loop: no Python between pieces, no thread pool
  to wake (:func:`use_pooled`).

:func:`use_compiled` picks the compiled loops for calls large enough to pay for them (numba's
first compilation, or loading it from the on-disk cache, costs once per process) when numba
is installed; which one runs never changes a result (``tests/test_vectorised.py``).
"""

from __future__ import annotations

import contextlib
import os
import threading

import numpy as np
from scipy import sparse

from ..lazy import optional_module

#: calls with fewer (records x centres) than this use the numpy loop: small fits never
#: import or compile numba (0.2 s to import, 0.6 s to compile without the disk cache)
JIT_MIN_WORK = 1 << 18

#: the most records per distance product, counted from each piece's first record (the
#: module's rule, :func:`product_rows`). The parallel loop took the same time with 256,
#: 2,048 and 16,384 (1M x 32, k=50, 100 clients: 69.0, 68.5, 68.0 ms; 100k x 16, k=20:
#: 2.03, 1.99 ms for 256 and 2,048; an ad-hoc run of ``speed_diagnostics._kernel_variants``):
#: 2,048 keeps the numpy loop at one product per client of up to 2,048 records
PRODUCT_ROWS = 2048

#: fewer records per product for many centres: a product's distances stay within
#: :data:`PRODUCT_BYTES` (a parallel-loop thread keeps one such buffer), down to
#: :data:`PRODUCT_MIN_ROWS` records
PRODUCT_BYTES = 1 << 21
PRODUCT_MIN_ROWS = 256

#: the compiled loop adds a client's run of at least ``k`` records into a local copy of its
#: ``k`` rows (:func:`._cellsums_jit.fused`): the same additions, vectorised. At 10,000
#: clients of 1M x 32 (k=50) the pooled kernel call took 94.3 and 96.8 ms with them against
#: 98.8 and 104.0 ms adding in place; at 100k x 16 (k=20, 100 clients) faster in four runs
#: of five, 2.55-3.19 ms against 2.61-2.77 ms (``python -m benchmarks.speed_diagnostics local_runs``;
#: docs/benchmarks.md); False adds every record in place (the diagnostic's comparison)
LOCAL_RUNS = True


def product_rows(k: int) -> int:
    """Records per distance product with ``k`` centres: :data:`PRODUCT_ROWS`, fewer when
    their distances would pass :data:`PRODUCT_BYTES` (k > 128), at least
    :data:`PRODUCT_MIN_ROWS`. It depends on ``k`` alone, which every client of a call shares."""
    return max(1, min(PRODUCT_ROWS, max(PRODUCT_MIN_ROWS, PRODUCT_BYTES // (8 * max(k, 1)))))


def product_ranges(row_base: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, stops)``: the record ranges of a block's distance products, each piece (a
    run of equal ``row_base``) cut every :func:`product_rows` records from its first."""
    rows = product_rows(k)
    n = len(row_base)
    cuts = np.flatnonzero(row_base[1:] != row_base[:-1]) + 1
    starts, stops = np.concatenate([[0], cuts]), np.concatenate([cuts, [n]])
    if n == 0:
        return starts[:0], stops[:0]
    lengths = stops - starts
    if lengths.max() > rows:  # long pieces: more than one product each
        count = -(-lengths // rows)
        first = np.repeat(starts, count)
        offset = (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)) * rows
        starts = first + offset
        stops = np.minimum(np.repeat(stops, count), starts + rows)
    return starts, stops


#: scratch buffers up to this size are kept by their thread between calls (a block of
#: 16,384 records of 32 features is 4 MB; the numpy loop's distances for k = 1,000, 131 MB,
#: are not kept by the kernel's long-lived threads)
SCRATCH_KEEP_BYTES = 1 << 26

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
    module = optional_module(__package__ + "._cellsums_jit")
    return getattr(module, name) if module else None


def use_compiled(work: int) -> bool:
    """Whether a call of ``work`` (records x centres, all blocks) runs the compiled loop."""
    return work >= JIT_MIN_WORK and compiled() is not None


def products(X, C2T, row_base, D) -> np.ndarray:
    """``D = X @ C2T`` by the module's rule: one ``np.matmul`` per :func:`product_ranges`
    range; consecutive ranges of one length (clients of one size) go as one stacked matmul,
    which makes the same BLAS call for each of them (``X``: C-ordered)."""
    starts, stops = product_ranges(row_base, C2T.shape[1])
    if not len(starts):
        return D
    lengths = stops - starts
    runs = np.flatnonzero(lengths[1:] != lengths[:-1]) + 1
    d, k = X.shape[1], C2T.shape[1]
    for first, last in zip([0, *runs.tolist()], [*runs.tolist(), len(starts)]):
        start, end, m = int(starts[first]), int(stops[last - 1]), int(lengths[first])
        np.matmul(X[start:end].reshape(last - first, m, d), C2T, out=D[start:end].reshape(last - first, m, k))
    return D


def cell_sums_numpy(X, C2T, cc, row_base, sums, counts):
    """The reference loop: write the block's sums and counts into ``sums`` / ``counts``."""
    D = products(X, C2T, row_base, scratch("distances", (len(X), len(cc))))
    D += cc[None, :]
    seg = row_base + np.argmin(D, axis=1)
    m = sparse.csc_matrix(
        (np.ones(len(X)), seg.astype(np.int32), np.arange(len(X) + 1, dtype=np.int32)), shape=(len(sums), len(X))
    )
    sums[...] = m @ X
    counts[...] = np.bincount(seg, minlength=len(counts))


def cell_sums_compiled(X, C2T, cc, row_base, sums, counts):
    """The compiled loop over the block's products (:func:`products`), adding into ``sums`` /
    ``counts`` (zeros) in record order."""
    D = products(X, C2T, row_base, scratch("distances", (len(X), len(cc))))
    compiled()(D, cc, X, row_base, sums, counts, len(cc) if LOCAL_RUNS else len(X) + 1)


#: False: the pooled kernel keeps its thread-pool form even where :func:`pooled_cell_sums`
#: could run (the diagnostics' comparison, and the tests of both forms)
POOLED = True

_POOLED_LOCK = threading.Lock()
_THREADSAFE_LAYER: bool | None = None  # whether numba's threading layer may be entered by two threads at once


_STARTED = False  # this process has started pooled_cell_sums at least once
_FORKED = False  # this process was forked from one that had started it


def _after_fork_in_child() -> None:
    """numba's OpenMP layer terminates a forked child that starts a parallel loop after its
    parent ran one ("fork() called from a process already using GNU OpenMP, this is
    unsafe"): such a child uses the thread-pool form instead (the same bits). The lock is
    new: a thread of the parent may have held it at the fork."""
    global _FORKED, _POOLED_LOCK
    _FORKED = _FORKED or _STARTED
    _POOLED_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def use_pooled(work: int) -> bool:
    """Whether a kernel call of ``work`` (records x centres) runs :func:`pooled_cell_sums`:
    large enough for the compiled loops (:func:`use_compiled`), numpy's ``dgemm`` found
    (:func:`._numpy_blas.dgemm`), and not in a child forked after the parent ran it."""
    if not (POOLED and not _FORKED and use_compiled(work)):
        return False
    from ._numpy_blas import dgemm

    return dgemm() is not None


def lanes(rows, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """The pieces of ``rows`` records dealt to ``threads`` lanes of about equal rows:
    ``(order, lane_start)``, lane ``l`` computing pieces ``order[lane_start[l]:lane_start[l + 1]]``
    in piece order. numba splits a parallel loop's iterations evenly by count, without
    regard to their cost, so the loop runs over lanes rather than pieces: with clients of
    very different sizes (the largest first) a loop over pieces gained nothing from a
    second thread. Pieces are dealt largest first in snake order (lane 0, 1, .., T-1,
    T-1, .., 0, ...). Which lane computes a piece changes no result."""
    rows = np.asarray(rows)
    threads = max(1, min(threads, len(rows)))
    by_size = np.argsort(-rows, kind="stable")
    turn = np.arange(len(rows)) % (2 * threads)
    lane = np.empty(len(rows), dtype=np.int64)
    lane[by_size] = np.where(turn < threads, turn, 2 * threads - 1 - turn)
    order = np.argsort(lane, kind="stable").astype(np.int64)
    lane_start = np.searchsorted(lane[order], np.arange(threads + 1)).astype(np.int64)
    return order, lane_start


def loop_threads(threads: int) -> int:
    """``threads``, at most numba's own thread count (``NUMBA_NUM_THREADS``)."""
    import numba

    return max(1, min(threads, numba.config.NUMBA_NUM_THREADS))


def pooled_cell_sums(addresses, rows, d: int, C2T, cc, lanes_: tuple):
    """Each piece's per-cell sums and counts, ``(pieces * k, d)`` and ``(pieces * k,)``:
    piece ``p``, ``rows[p]`` C-ordered float64 records of ``d`` features at ``addresses[p]``
    (alive during the call), in rows ``p * k .. p * k + k - 1``.

    One call of the compiled parallel loop :func:`._cellsums_jit.pooled`, one of numba's
    threads per lane of ``lanes_`` (:func:`lanes` for at most :func:`loop_threads`
    threads), numpy's OpenBLAS limited to one thread meanwhile (a threaded product inside
    each of the loop's threads would oversubscribe the cores). numba's ``workqueue`` layer
    (used where neither OpenMP nor TBB is installed) must not be entered by two threads at
    once: calls are serialised until numba reports a thread-safe layer."""
    global _THREADSAFE_LAYER, _STARTED
    import numba

    from ._numpy_blas import dgemm, single_threaded

    order, lane_start = lanes_
    threads = len(lane_start) - 1
    k = len(cc)
    address, int_type = dgemm()
    sums, counts = np.zeros((len(addresses) * k, d)), np.zeros(len(addresses) * k)
    _STARTED = True
    before = numba.get_num_threads()
    if before != threads:
        numba.set_num_threads(threads)
    try:
        with _POOLED_LOCK if not _THREADSAFE_LAYER else contextlib.nullcontext(), single_threaded():
            compiled("pooled")(address, np.zeros(6, dtype=int_type), addresses, rows, order, lane_start, d,
                               np.asfortranarray(C2T), cc, sums, counts, product_rows(k))
    finally:
        if before != threads:
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
