"""The compiled loops of the pooled round kernels: :func:`pooled` (the whole k-means
kernel call, one parallel loop over the clients' pieces) and :func:`fused` (one block's
inner loop, the thread-pool form) for :mod:`._cellsums`, :func:`fcm_weights_m2` for
:func:`._fcm.membership_weights`. Imported only when a call is
large enough (numba costs 0.2 s to import); compiled once and cached on disk
(``cache=True``). Each performs the floating-point operations of its numpy reference in
the same order (no fast-math: no reassociation, no fused multiply-add), so both give the
same bits; the tests compare them."""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic


@intrinsic
def _f64_pointer(typingctx, address):
    """The float64 pointer at integer ``address`` (a client's records, kept alive by the caller)."""
    sig = types.CPointer(types.float64)(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.float64)))

    return sig, codegen


@intrinsic
def _dgemm(typingctx, address, chars, ints, scalars, a, b, c):
    """Call the Fortran ``dgemm`` at ``address``: ``dgemm(chars[0], chars[1], ints[0],
    ints[1], ints[2], scalars[0], a, ints[3], b, ints[4], scalars[1], c, ints[5])``, every
    argument passed by reference as Fortran does. The arrays are arguments of this call, so
    they are alive while it runs. Taking the address at run time keeps the kernel cacheable
    (a ctypes function as a global would bake it into the compiled code)."""
    sig = types.none(address, chars, ints, scalars, a, b, c)

    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()

        def ptr(ty, value, index=0):
            data = context.make_array(ty)(context, builder, value).data
            return builder.bitcast(builder.gep(data, [ir.Constant(ir.IntType(64), index)]), i8p)

        fn_address, chars_v, ints_v, scalars_v, a_v, b_v, c_v = args
        _, chars_t, ints_t, scalars_t, a_t, b_t, c_t = signature.args
        fnty = ir.FunctionType(ir.VoidType(), [i8p] * 13)
        fn = builder.inttoptr(fn_address, fnty.as_pointer())
        builder.call(fn, [ptr(chars_t, chars_v, 0), ptr(chars_t, chars_v, 1), ptr(ints_t, ints_v, 0),
                          ptr(ints_t, ints_v, 1), ptr(ints_t, ints_v, 2), ptr(scalars_t, scalars_v, 0),
                          ptr(a_t, a_v), ptr(ints_t, ints_v, 3), ptr(b_t, b_v), ptr(ints_t, ints_v, 4),
                          ptr(scalars_t, scalars_v, 1), ptr(c_t, c_v), ptr(ints_t, ints_v, 5)])
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(nogil=True, cache=True, inline="always")
def _nearest(D, q, cc):  # pragma: no cover - compiled
    """The first ``j`` minimising ``D[q, j] + cc[j]`` (``np.argmin``'s tie rule)."""
    best = D[q, 0] + cc[0]
    label = 0
    for j in range(1, cc.shape[0]):
        v = D[q, j] + cc[j]
        if v < best:  # strict: the first minimum wins
            best = v
            label = j
    return label


@numba.njit(nogil=True, cache=True, inline="always")
def _add_record(X, q, row, sums, counts):  # pragma: no cover - compiled
    """Add record ``q`` of ``X`` to row ``row`` of ``sums`` and one to ``counts[row]``."""
    counts[row] += 1.0
    for t in range(X.shape[1]):
        sums[row, t] += X[q, t]


@numba.njit(nogil=True, parallel=True, cache=True)
def pooled(dgemm, int_proto, addresses, rows, order, lane_start, d, C2T, cc, sums, counts, sub):  # pragma: no cover - compiled
    """Per-piece cell sums of a pooled k-means kernel call (:func:`._cellsums.pooled_cell_sums`),
    the pieces spread over numba's threads: lane ``l`` (one per thread; numba splits a
    ``prange`` statically) computes pieces ``order[lane_start[l]:lane_start[l + 1]]``.

    Piece ``p`` is ``rows[p]`` C-ordered float64 records of ``d`` features at address
    ``addresses[p]``; its records go to rows ``p * k .. p * k + k - 1`` of ``sums`` /
    ``counts`` (zeros). Its distance products are computed ``sub`` records at a time by
    ``dgemm`` (numpy's, :mod:`._numpy_blas`; ``int_proto``: an array of its integer type),
    each record added to the row of its first nearest centre in record order: the
    operations of :func:`fused` on the products ``np.matmul`` gives, so the same bits as
    the numpy reference (:func:`._cellsums.cell_sums_numpy`). A piece of at least ``k``
    records is added into a local copy of its rows (as :func:`fused` does)."""
    k = cc.shape[0]
    for lane in numba.prange(lane_start.shape[0] - 1):
        # the lane's buffers, reused piece after piece
        D = np.empty((sub, k))
        acc = np.empty((k, d))
        cnt = np.empty(k)
        ints = int_proto.copy()
        chars = np.empty(2, dtype=np.uint8)
        chars[0] = 84  # 'T': the distances' transpose (k x m) = (-2 C) (k x d) . X^T (d x m)
        chars[1] = 78  # 'N'
        scalars = np.empty(2)
        scalars[0] = 1.0
        scalars[1] = 0.0
        for i in range(lane_start[lane], lane_start[lane + 1]):
            p = order[i]
            X = numba.carray(_f64_pointer(addresses[p]), (rows[p], d))
            _piece_sums(dgemm, chars, ints, scalars, X, C2T, cc, sums[p * k : (p + 1) * k], counts[p * k : (p + 1) * k],
                        D, acc, cnt)


@numba.njit(nogil=True, cache=True)
def _piece_sums(dgemm, chars, ints, scalars, X, C2T, cc, sums, counts, D, acc, cnt):  # pragma: no cover - compiled
    """One piece of :func:`pooled`: its records ``X`` into its rows ``sums`` / ``counts``
    (zeros), distance products of at most ``len(D)`` records. A piece of at least ``k``
    records is added into a local copy of its rows (``acc``, ``cnt``), as :func:`fused` does."""
    n, d = X.shape
    k = cc.shape[0]
    local = n >= k
    if local:
        acc[:, :] = 0.0
        cnt[:] = 0.0
    start = 0
    while start < n:
        stop = min(n, start + D.shape[0])
        m = stop - start
        Xs = X[start:stop]
        ints[0] = k
        ints[1] = m
        ints[2] = d
        ints[3] = d
        ints[4] = d
        ints[5] = k
        _dgemm(dgemm, chars, ints, scalars, C2T, Xs, D)
        for q in range(m):
            label = _nearest(D, q, cc)
            if local:
                _add_record(Xs, q, label, acc, cnt)
            else:
                _add_record(Xs, q, label, sums, counts)
        start = stop
    if local:
        for j in range(k):
            counts[j] = cnt[j]
            for t in range(d):
                sums[j, t] = acc[j, t]


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
            label = _nearest(D, q, cc)
            if local:
                _add_record(X, q, label, acc, cnt)
            else:
                _add_record(X, q, base + label, sums, counts)
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
