"""Local k-means on one client's records: k-means++ seeding and Lloyd's iterations, in two
implementations of exactly the same floating-point operations, so they give the same bits
(``tests/test_local_kmeans.py``):

* numpy's, below, the reference, on :func:`direct_sq_distances` (shared with fuzzy
  c-means): a few numpy calls per feature, seeding step or Lloyd iteration;
* compiled loops (numba, :mod:`._local_jit`): 0.27 ms for a 100-record client with k=50,
  against 7.2 ms in numpy and 3.1-4.2 ms for scikit-learn's ``KMeans(n_init=1)``
  (``python -m benchmarks.speed_diagnostics local_kmeans``).

The operations: a squared distance is ``sum_t (x_t - c_t) ** 2`` added feature by feature
(exact up to rounding: no cancellation, unlike the ``||x||^2 - 2 x.c + ||c||^2`` expansion,
and no BLAS, whose blocking depends on the matrix sizes); every other sum runs in record
order (numpy's ``cumsum`` and ``bincount`` add sequentially).

A simulation's seeding round runs one local k-means per client: 2,000 clients of 100
records (k=50) took 4.8 s with the former BLAS-based numpy code (profiled), 0.5 s compiled. Which one runs is
decided per process by the work done so far (:func:`use_compiled`): a small fit never
imports numba (0.2 s) or compiles the loops (about 1.3 s without numba's disk cache); a
large one switches after its first clients. The switch changes no result.
"""

from __future__ import annotations

import numpy as np

from ..lazy import optional_module

#: local k-means work (records x centres, summed over calls in this process) after which
#: the compiled loops run: about 50 clients of 100 records at k = 50, about as long in numpy
#: as importing numba and loading the cached loops takes
LOCAL_JIT_MIN_WORK = 1 << 18

_work_done = 0


def use_compiled(work: int):
    """The compiled module once this process's local k-means work (records x centres) has
    reached :data:`LOCAL_JIT_MIN_WORK`, counting ``work``; else None (numpy)."""
    global _work_done
    _work_done += work
    if _work_done < LOCAL_JIT_MIN_WORK:
        return None
    return optional_module(__package__ + "._local_jit")


def direct_sq_distances(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Squared distances (n, k) as ``sum_t (x_t - c_t) ** 2``, the features added in order.

    Unlike the BLAS expansion (:func:`._fcm.exact_sq_distances`), each entry depends on its
    record and centre alone, not on how many records the call holds (BLAS picks other
    kernels, with other summation orders, for other matrix sizes: measured, a record's
    products differ in the last bits between a 50-row call and a 1-, 2- or 17-row one), and
    it is exactly 0 only on the centre. A client's round sums are then the same bits
    whether it computes alone or pooled with others (the vectorised rounds' contract)."""
    X = np.asarray(X, dtype=np.float64)
    C = np.asarray(C, dtype=np.float64)
    n, d = X.shape
    D = np.zeros((n, len(C)))
    if d == 0:
        return D
    diff = np.subtract(X[:, 0:1], C[None, :, 0])
    np.multiply(diff, diff, out=D)
    for t in range(1, d):
        np.subtract(X[:, t : t + 1], C[None, :, t], out=diff)
        np.multiply(diff, diff, out=diff)
        D += diff
    return D


def kmeans_plusplus(X, XT, w, first, u):
    """numpy twin of :func:`._local_jit.kmeans_plusplus` (see there): (seed indices, seeds
    placed while some record lay off every seed). ``XT`` (the compiled loops' layout) is
    not needed here."""
    n = len(X)
    k = u.shape[0] + 1
    seeds = np.empty(k, np.int64)
    seeds[0] = first
    placed = k
    closest = direct_sq_distances(X, X[first : first + 1])[:, 0]
    for c in range(1, k):
        running = np.cumsum(w * closest)
        total = running[-1]
        if total > 0.0:
            cand = np.minimum(np.searchsorted(running, u[c - 1] * total, side="left"), n - 1)
        else:
            placed = min(placed, c)
            cand = np.minimum((u[c - 1] * n).astype(np.int64), n - 1)
        new = np.minimum(direct_sq_distances(X, X[cand]).T, closest[None, :])
        pots = np.cumsum(w[None, :] * new, axis=1)[:, -1]
        best = int(np.argmin(pots))
        seeds[c] = cand[best]
        closest = new[best]
    return seeds, placed


def _assign(X, C):
    D = direct_sq_distances(X, C)
    labels = np.argmin(D, axis=1)  # the first minimum, as the compiled loop's strict <
    return labels, D[np.arange(len(D)), labels]


def lloyd(X, XT, C, max_iter, abs_tol):
    """numpy twin of :func:`._local_jit.lloyd` (see there): ``C`` updated in place;
    (labels, squared distances) to the final centres. ``XT`` is not needed here."""
    k, d = C.shape
    for _ in range(max_iter):
        labels, _ = _assign(X, C)
        counts = np.bincount(labels, minlength=k).astype(np.float64)
        nz = np.flatnonzero(counts > 0)
        sums = np.stack([np.bincount(labels, weights=X[:, t], minlength=k)[nz] for t in range(d)], axis=1)
        new = sums / counts[nz][:, None]
        diff = new - C[nz]
        shift = np.cumsum((diff * diff).ravel())[-1]
        C[nz] = new
        if shift <= abs_tol:
            break
    return _assign(X, C)
