"""The compiled loops of local k-means (:mod:`._local`, which also holds their numpy
reference): k-means++ seeding and Lloyd's iterations on one client's records. Each performs
the floating-point operations of its numpy twin in the same order (no fast-math), so both
give the same bits; the tests compare them. Compiled once and cached on disk
(``cache=True``). Whole-array assignments (``a[:] = b``) are written as loops: numba's array
expressions tripled the compilation time."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def _distances_to(XT, c, out):  # pragma: no cover - compiled
    """``out[i] = sum_t (XT[t, i] - c[t]) ** 2``, features in order. The records are the
    inner, contiguous loop (``XT``: the records transposed, (d, n)): independent sums that
    vectorise, each still added feature by feature, so every entry is the sequential sum."""
    d, n = XT.shape
    for i in range(n):
        diff = XT[0, i] - c[0]
        out[i] = diff * diff
    for t in range(1, d):
        ct = c[t]
        for i in range(n):
            diff = XT[t, i] - ct
            out[i] += diff * diff


@numba.njit(nogil=True, cache=True)
def kmeans_plusplus(X, XT, w, first, u):  # pragma: no cover - compiled
    """Greedy k-means++ seeds (Arthur & Vassilvitskii 2007, with scikit-learn's ``trials``
    candidates per step) as record indices, and how many were placed while some record lay
    off every seed.

    Seed 0 is ``first``; step ``c`` draws candidate ``t`` at the first record whose running
    potential ``sum_{i<=r} w_i D_i`` reaches ``u[c-1, t]`` times the total (``D_i``: squared
    distance to the closest seed so far) and keeps the candidate whose addition leaves the
    smallest potential (the first on ties). Once the potential is zero (every record on a
    seed: the records have as many distinct values as seeds placed) candidate ``t`` is record
    ``floor(u[c-1, t] n)``; the second result is the number of seeds placed before that."""
    n = X.shape[0]
    k = u.shape[0] + 1
    trials = u.shape[1]
    seeds = np.empty(k, np.int64)
    seeds[0] = first
    placed = k
    closest = np.empty(n)
    _distances_to(XT, X[first], closest)
    running = np.empty(n)
    cand = np.empty(trials, np.int64)
    dist = np.empty(n)
    cand_closest = np.empty((trials, n))
    for c in range(1, k):
        total = 0.0
        for i in range(n):
            total += w[i] * closest[i]
            running[i] = total
        if total <= 0.0 and placed == k:
            placed = c
        for t in range(trials):
            if total > 0.0:
                target = u[c - 1, t] * total
                lo, hi = 0, n
                while lo < hi:  # the first record whose running potential reaches target
                    mid = (lo + hi) // 2
                    if running[mid] < target:
                        lo = mid + 1
                    else:
                        hi = mid
                cand[t] = min(lo, n - 1)
            else:
                cand[t] = min(int(u[c - 1, t] * n), n - 1)
        best, best_pot = 0, np.inf
        for t in range(trials):
            _distances_to(XT, X[cand[t]], dist)
            pot = 0.0
            for i in range(n):
                m = dist[i] if dist[i] < closest[i] else closest[i]
                cand_closest[t, i] = m
                pot += w[i] * m
            if pot < best_pot:
                best, best_pot = t, pot
        seeds[c] = cand[best]
        for i in range(n):
            closest[i] = cand_closest[best, i]
    return seeds, placed


@numba.njit(nogil=True, cache=True)
def _assign(XT, C, labels, best, dist):  # pragma: no cover - compiled
    """Each record's nearest centre (the first on ties) and squared distance to it."""
    _distances_to(XT, C[0], best)
    for i in range(XT.shape[1]):
        labels[i] = 0
    for j in range(1, C.shape[0]):
        _distances_to(XT, C[j], dist)
        for i in range(XT.shape[1]):
            if dist[i] < best[i]:
                best[i] = dist[i]
                labels[i] = j


@numba.njit(nogil=True, cache=True)
def lloyd(X, XT, C, max_iter, abs_tol):  # pragma: no cover - compiled
    """Lloyd's iterations from centres ``C`` (modified in place) until the squared shift of
    all centres is at most ``abs_tol`` or after ``max_iter``; an empty cluster keeps its
    centre. Returns (labels, squared distances) of the records to the final centres."""
    n, d = X.shape
    k = C.shape[0]
    labels = np.empty(n, np.int64)
    best = np.empty(n)
    dist = np.empty(n)
    sums = np.empty((k, d))
    counts = np.empty(k)
    for _ in range(max_iter):
        _assign(XT, C, labels, best, dist)
        for j in range(k):
            counts[j] = 0.0
            for t in range(d):
                sums[j, t] = 0.0
        for i in range(n):
            j = labels[i]
            counts[j] += 1.0
            for t in range(d):
                sums[j, t] += X[i, t]
        shift = 0.0
        for j in range(k):
            if counts[j] > 0:
                for t in range(d):
                    new = sums[j, t] / counts[j]
                    diff = new - C[j, t]
                    shift += diff * diff
                    C[j, t] = new
        if shift <= abs_tol:
            break
    _assign(XT, C, labels, best, dist)
    return labels, best
