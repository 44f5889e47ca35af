"""The compiled loop of :mod:`._cellsums` (imported only when a call is large enough: numba
costs 0.2 s to import). Compiled once and cached on disk (``cache=True``)."""

from __future__ import annotations

import numba


@numba.njit(nogil=True, cache=True)
def fused(D, cc, X, row_base, sums, counts):  # pragma: no cover - compiled
    """Add each record ``r`` to row ``row_base[r] + j`` of ``sums`` / ``counts``, ``j`` the
    first index minimising ``D[r, j] + cc[j]``, records in order (:mod:`._cellsums`)."""
    k = D.shape[1]
    d = X.shape[1]
    for r in range(D.shape[0]):
        best = D[r, 0] + cc[0]
        label = 0
        for j in range(1, k):
            v = D[r, j] + cc[j]
            if v < best:  # strict: the first minimum wins, as np.argmin
                best = v
                label = j
        s = row_base[r] + label
        counts[s] += 1.0
        for t in range(d):
            sums[s, t] += X[r, t]
