"""The compiled loops of the pooled round kernels: :func:`fused` for :mod:`._cellsums`,
:func:`fcm_weights_m2` for :func:`._fcm.membership_weights`. Imported only when a call is
large enough (numba costs 0.2 s to import); compiled once and cached on disk
(``cache=True``). Each performs the floating-point operations of its numpy reference in
the same order (no fast-math: no reassociation, no fused multiply-add), so both give the
same bits; the tests compare them."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(nogil=True, cache=True)
def fused(D, cc, X, row_base, sums, counts, min_run):  # pragma: no cover - compiled
    """Add each record ``r`` to row ``row_base[r] + j`` of ``sums`` / ``counts``, ``j`` the
    first index minimising ``D[r, j] + cc[j]``, records in order (:mod:`._cellsums`).

    A run of at least ``min_run`` consecutive records of one client (one ``row_base``) is
    added into a local copy of its ``k`` rows, stored back at the run's end: the same
    additions in the same order, but into memory the compiler knows no other array shares,
    so the per-feature additions vectorise (``_cellsums.LOCAL_RUNS``). Shorter runs add in
    place: copying ``k`` rows in and out would cost more than their records."""
    n, k = D.shape
    d = X.shape[1]
    acc = np.empty((k, d))
    cnt = np.empty(k)
    r = 0
    while r < n:
        base = row_base[r]
        end = r + 1
        while end < n and row_base[end] == base:
            end += 1
        local = end - r >= min_run
        if local:
            for j in range(k):
                cnt[j] = counts[base + j]
                for t in range(d):
                    acc[j, t] = sums[base + j, t]
        for q in range(r, end):
            best = D[q, 0] + cc[0]
            label = 0
            for j in range(1, k):
                v = D[q, j] + cc[j]
                if v < best:  # strict: the first minimum wins, as np.argmin
                    best = v
                    label = j
            if local:
                cnt[label] += 1.0
                for t in range(d):
                    acc[label, t] += X[q, t]
            else:
                s = base + label
                counts[s] += 1.0
                for t in range(d):
                    sums[s, t] += X[q, t]
        if local:
            for j in range(k):
                counts[base + j] = cnt[j]
                for t in range(d):
                    sums[base + j, t] = acc[j, t]
        r = end


@numba.njit(nogil=True, cache=True)
def fcm_weights_m2(X, CT, W):  # pragma: no cover - compiled
    """``W[i, j] = u_ij ** 2`` (Stallmann & Wilbik eqs. 5-6, m = 2) as
    :func:`._fcm.membership_weights` computes it with numpy: squared distances
    ``sum_t (x_it - c_jt) ** 2`` over the features in order (``CT``: the centres transposed,
    (d, k)), the ratio ``min_l D_il / D_ij`` (a row with zero distances: 1 at those centres,
    0 elsewhere), divided by the row's sum taken as numpy's pairwise sum (8 interleaved
    partial sums; k <= 128), squared."""
    n, d = X.shape
    k = CT.shape[1]
    r = np.empty(8)
    for i in range(n):
        for j in range(k):
            t0 = X[i, 0] - CT[0, j]
            W[i, j] = t0 * t0
        for t in range(1, d):
            x = X[i, t]
            for j in range(k):  # independent across j: vectorised, each entry summed in t order
                diff = x - CT[t, j]
                W[i, j] = W[i, j] + diff * diff
        dmin = W[i, 0]
        for j in range(1, k):
            if W[i, j] < dmin:
                dmin = W[i, j]
        if dmin <= 0.0:  # on one or more centres: full membership shared among them
            for j in range(k):
                W[i, j] = 1.0 if W[i, j] <= 0.0 else 0.0
        else:
            for j in range(k):
                W[i, j] = dmin / W[i, j]
        if k < 8:
            s = 0.0
            for j in range(k):
                s += W[i, j]
        else:
            for t in range(8):
                r[t] = W[i, t]
            j = 8
            while j < k - (k % 8):
                for t in range(8):
                    r[t] += W[i, j + t]
                j += 8
            s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
            while j < k:
                s += W[i, j]
                j += 1
        for j in range(k):
            u = W[i, j] / s
            W[i, j] = u * u
