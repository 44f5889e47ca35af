"""Vectorised k-means kernels shared by every algorithm (clients and servers).

No per-record Python loops: distances are one BLAS product, per-cluster sums one
``bincount`` per column (or a sparse product for wide data), and several clients can be
processed in one pass by offsetting their labels (``segment`` ids ``client * k + label``).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from scipy import sparse

from ..exceptions import InputError


def sq_distances(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances (n, k) via ||x||^2 - 2 x.c + ||c||^2, floored at 0."""
    d = np.einsum("ij,ij->i", X, X)[:, None] - 2.0 * (X @ C.T) + np.einsum("ij,ij->i", C, C)[None, :]
    np.maximum(d, 0.0, out=d)
    return d


def assign(X: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centre of each record (ties go to the lowest index) and its squared distance.

    ||x||^2 does not change the argmin, so it is added to the winning column only. For
    few centres a running minimum over columns beats ``argmin`` along the short axis.
    """
    d = X @ (-2.0 * C.T)
    d += np.einsum("ij,ij->i", C, C)[None, :]
    k = d.shape[1]
    if k <= 8:
        best = d[:, 0].copy()
        labels = np.zeros(len(X), dtype=np.intp)
        for j in range(1, k):
            col = d[:, j]
            closer = col < best
            np.copyto(best, col, where=closer)
            labels[closer] = j
    else:
        labels = np.argmin(d, axis=1)
        best = d[np.arange(len(X)), labels]
    best += np.einsum("ij,ij->i", X, X)
    np.maximum(best, 0.0, out=best)
    return labels, best


def segment_sums(segments: np.ndarray, X: np.ndarray, n_segments: int, weights: np.ndarray | None = None):
    """Per-segment sums of rows of X (optionally weighted) and per-segment total weights."""
    w = np.ones(len(X)) if weights is None else weights
    counts = np.bincount(segments, weights=w, minlength=n_segments)
    if X.shape[1] <= 8:
        sums = np.empty((n_segments, X.shape[1]))
        for j in range(X.shape[1]):
            sums[:, j] = np.bincount(segments, weights=X[:, j] * w if weights is not None else X[:, j], minlength=n_segments)
    else:
        m = sparse.csr_matrix((w, (segments, np.arange(len(X)))), shape=(n_segments, len(X)))
        sums = np.asarray(m @ X)
    return sums, counts


#: rows per block of the pooled kernel: the (rows, k) distance block stays cache-sized
#: and no copy of the pooled records is made (peak memory ~ the data + one block)
CHUNK_ROWS = 16384


def _client_pieces(sizes, chunk: int):
    """Blocks of at most ``chunk`` rows over the clients' records, as lists of
    ``(client, start, stop)``. A client's rows are cut at multiples of ``chunk`` from *its
    own* first row, whatever clients come before it, so each client's partial sums are the
    same floating-point additions whether it is processed alone or with others."""
    block, rows = [], 0
    for c, n in enumerate(sizes):
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            if rows + stop - start > chunk and block:
                yield block
                block, rows = [], 0
            block.append((c, start, stop))
            rows += stop - start
    if block:
        yield block


_SCRATCH = threading.local()


def _scratch(name: str, shape: tuple[int, int]) -> np.ndarray:
    """A per-thread reusable float buffer of at least ``shape`` (a view of that shape).

    The pooled kernel's per-block temporaries (the block's records, its distances: MBs)
    would otherwise be fresh allocations each block; while the round's messages stay alive
    the allocator keeps mapping new pages for them, and the page faults cost more than the
    distance product itself (measured at 10,000 clients of 1M x 32, k=50)."""
    size = shape[0] * shape[1]
    buf = getattr(_SCRATCH, name, None)
    if buf is None or buf.size < size:
        buf = np.empty(max(size, 1))
        setattr(_SCRATCH, name, buf)
    return buf[:size].reshape(shape)


def labels_only(X: np.ndarray, C: np.ndarray, C2T: np.ndarray | None = None, cc: np.ndarray | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
    """Nearest centre of each record, as :func:`assign` (same ties), without the distances
    (``out``: an (n, k) buffer for them, else a fresh one)."""
    d = np.matmul(X, -2.0 * C.T if C2T is None else C2T, out=out)
    d += np.einsum("ij,ij->i", C, C)[None, :] if cc is None else cc[None, :]
    return np.argmin(d, axis=1)


def _block_sums(datas, block, C, C2T, cc):
    """Per-(client, cell) sums and counts of one block: (first client, sums of shape
    (n block clients * k, d), float counts), rows ordered by (local client, cell)."""
    k = len(C)
    parts = [datas[c][a:b] for c, a, b in block]
    n = sum(len(p) for p in parts)
    Xb = parts[0] if len(parts) == 1 else np.concatenate(parts, out=_scratch("records", (n, C.shape[1])))
    labels = labels_only(Xb, C, C2T, cc, out=_scratch("distances", (n, k)))
    first, last = block[0][0], block[-1][0]
    rows = (last - first + 1) * k
    seg = np.repeat(np.array([(c - first) * k for c, _, _ in block], dtype=np.int64), [b - a for _, a, b in block])
    seg += labels
    m = sparse.csc_matrix(
        (np.ones(len(Xb)), seg.astype(np.int32), np.arange(len(Xb) + 1, dtype=np.int32)), shape=(rows, len(Xb))
    )
    return first, m @ Xb, np.bincount(seg, minlength=rows).astype(np.float64)


_BLAS = None


def _single_threaded_blas():
    """A context in which BLAS runs on one thread (the blocks run in parallel instead:
    small threaded GEMMs spin and stall on a shared machine). The controller is built once."""
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=1, user_api="blas")


def per_client_cell_sums(datas, C: np.ndarray, chunk: int | None = None, n_threads: int | None = None):
    """For several clients at once: each client's per-cell coordinate sums (a list of
    (k, d) arrays) and counts (a list of (k,) float arrays) w.r.t. the same centres ``C``.

    One pooled pass in blocks of ``chunk`` rows (default :data:`CHUNK_ROWS`) (:func:`_client_pieces`), computed by
    ``n_threads`` threads (default: the CPU count; numpy and scipy release the GIL) with
    single-threaded BLAS, as scikit-learn's Lloyd kernel does: per block one distance
    product and one argmin, and the per-(client, cell) sums as one sparse product whose CSC
    matrix is built without sorting (each record is one column holding a 1 in row
    ``local client * k + label``). scipy adds each row's records in record order and a
    client cut over several blocks adds its blocks' partial sums in block order, so a
    client's result equals the one it gets alone (``client_updates([X])``) bit for bit. No
    copy of the pooled records is made.

    A client that lies in one block (every client of at most ``chunk`` records) gets a view
    of its rows of the block's result: no (n_clients, k, d) array is allocated and filled.
    At 10,000 clients the round's messages are 128 MB (k=50, d=32) of new memory; writing
    them once more into a fresh array of that size cost more than the distance products.
    """
    k, d = C.shape
    n_clients = len(datas)
    sums: list = [None] * n_clients
    counts: list = [None] * n_clients
    C = np.ascontiguousarray(C, dtype=np.float64)
    C2T, cc = -2.0 * C.T, np.einsum("ij,ij->i", C, C)
    for first, s, c in map_blocks(datas, lambda b: _block_sums(datas, b, C, C2T, cc), chunk, n_threads):
        for j in range(len(c) // k):
            i, rows = first + j, slice(j * k, (j + 1) * k)
            if sums[i] is None:
                sums[i], counts[i] = s[rows], c[rows]
            else:  # a client cut over blocks: its partial sums, in block order
                sums[i], counts[i] = sums[i] + s[rows], counts[i] + c[rows]
    for i in range(n_clients):
        if sums[i] is None:  # no records: in no block
            sums[i], counts[i] = np.zeros((k, d)), np.zeros(k)
    return sums, counts


def map_blocks(datas, fn, chunk: int | None = None, n_threads: int | None = None):
    """``fn(block)`` for the blocks of :func:`_client_pieces`, in block order, computed by
    ``n_threads`` threads (default: the CPU count; numpy and scipy release the GIL) with
    single-threaded BLAS. The caller combines the results in the order they come."""
    blocks = list(_client_pieces([len(X) for X in datas], chunk or CHUNK_ROWS))
    threads = min(len(blocks), n_threads or os.cpu_count() or 1)
    with _single_threaded_blas():
        if threads <= 1:
            yield from (fn(b) for b in blocks)
        else:
            with ThreadPoolExecutor(threads) as pool:
                yield from pool.map(fn, blocks)


def cluster_sums(X: np.ndarray, labels: np.ndarray, k: int, weights: np.ndarray | None = None):
    """Coordinate sums (k, d) and counts (k,) of each cluster."""
    return segment_sums(labels, X, k, weights)


def lloyd_step(X: np.ndarray, C: np.ndarray):
    """One Lloyd iteration without relocation: an empty cluster keeps its centre.

    Returns (new centres, counts w.r.t. ``C``, coordinate sums w.r.t. ``C``, labels).
    """
    labels, _ = assign(X, C)
    sums, counts = cluster_sums(X, labels, len(C))
    new = C.copy()
    nz = counts > 0
    new[nz] = sums[nz] / counts[nz, None]
    return new, counts, sums, labels


def local_lloyd(X: np.ndarray, C: np.ndarray, max_steps: int, tol: float = 0.0):
    """Up to ``max_steps`` Lloyd iterations from ``C`` on one client's records, no relocation.

    Returns (local centres, counts and sums of the *first* assignment, i.e. w.r.t. the
    received centres ``C`` -- the weights of DWF eq. 7).
    """
    new, counts0, sums0, _ = lloyd_step(X, C)
    current = new
    for _ in range(max_steps - 1):
        prev = current
        current, _, _, _ = lloyd_step(X, prev)
        if np.linalg.norm(current - prev) < tol:
            break
    return current, counts0, sums0


def seed_kmeans_plusplus(X: np.ndarray, k: int, rng: np.random.Generator, sample_weight=None) -> np.ndarray:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007; 2 + log k candidates per step,
    as scikit-learn does).

    Written here rather than calling ``sklearn.cluster.kmeans_plusplus`` because a
    simulation seeds hundreds of small clients and scikit-learn's per-call validation costs
    ~50x the arithmetic on a 100-record client.
    """
    n = len(X)
    if n < k:
        raise InputError(f"k-means++ needs at least n_clusters={k} records, the client has {n}.")
    w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    trials = 2 + int(np.log(k))
    sq_norms = np.einsum("ij,ij->i", X, X)
    centres = np.empty((k, X.shape[1]))
    first = rng.choice(n, p=w / w.sum())
    centres[0] = X[first]
    closest = np.maximum(sq_norms - 2 * X @ X[first] + sq_norms[first], 0.0)
    for c in range(1, k):
        pot = w * closest
        total = pot.sum()
        if total <= 0:  # every record coincides with a centre: pick any
            cand = rng.choice(n, size=trials)
        else:
            cand = np.searchsorted(np.cumsum(pot), rng.random(trials) * total)
            cand = np.minimum(cand, n - 1)
        d_cand = np.maximum(sq_norms[cand, None] - 2 * X[cand] @ X.T + sq_norms[None, :], 0.0)
        new_closest = np.minimum(closest[None, :], d_cand)
        best = int(np.argmin((w[None, :] * new_closest).sum(axis=1)))
        centres[c] = X[cand[best]]
        closest = new_closest[best]
    return centres


def weighted_kmeans(
    points: np.ndarray,
    k: int,
    rng: np.random.Generator,
    weights: np.ndarray | None = None,
    n_init: int = 10,
    max_iter: int = 300,
    init="k-means++",
) -> np.ndarray:
    """Server-side (weighted) k-means over a set of points, e.g. clients' local centres.

    scikit-learn's Lloyd with ``sample_weight`` minimises Garst & Reinders' eq. 1,
    sum_j S_j min_i ||C_j - C_i||^2. With fewer distinct points than ``k`` the points
    themselves are returned, padded by repeating (k-means is undefined there).
    """
    from sklearn.cluster import KMeans  # lazy: a deployed client process rarely needs it
    from threadpoolctl import threadpool_limits

    points = np.asarray(points, dtype=np.float64)
    if len(points) == 0:
        raise InputError("server k-means got no points (every client sent an empty set).")
    if len(np.unique(points, axis=0)) <= k:
        idx = np.arange(k) % len(points)
        return points[idx].copy()
    km = KMeans(
        n_clusters=k,
        init=init,
        n_init=n_init if isinstance(init, str) else 1,
        max_iter=max_iter,
        random_state=int(rng.integers(2**31 - 1)),
    )
    # A few hundred points: OpenMP threads cost more than they save (and spin under load).
    with threadpool_limits(limits=1 if len(points) < 20_000 else None, user_api="openmp"):
        km.fit(points, sample_weight=weights)
    return km.cluster_centers_


def local_kmeans(X: np.ndarray, k: int, rng: np.random.Generator, n_init: int = 1, max_iter: int = 300, tol: float = 1e-4):
    """A client's own k-means (k-FED's local step, Dennis et al. 2021): centres and sizes.

    k-means++ seeding then Lloyd iterations until the centres move less than ``tol``
    (relative to the data's variance, as in scikit-learn), best of ``n_init``. ``k`` is
    capped at the number of distinct records; clusters left empty are dropped, so a client
    may return fewer than ``k`` centres. Sizes count the records assigned to each centre.
    """
    k_eff = min(k, len(np.unique(X, axis=0)))
    abs_tol = tol * float(np.mean(np.var(X, axis=0))) if len(X) > 1 else 0.0
    best = None
    for _ in range(n_init):
        C = seed_kmeans_plusplus(X, k_eff, rng)
        for _ in range(max_iter):
            new, counts, _, labels = lloyd_step(X, C)
            shift = float(((new - C) ** 2).sum())
            C = new
            if shift <= abs_tol:
                break
        labels, d2 = assign(X, C)
        inertia = float(d2.sum())
        if best is None or inertia < best[0]:
            best = (inertia, C, labels)
    _, C, labels = best
    sizes = np.bincount(labels, minlength=len(C)).astype(np.float64)
    keep = sizes > 0
    return C[keep], sizes[keep]


def uniform_in_bounds(bounds, k: int, n_features: int, rng: np.random.Generator) -> np.ndarray:
    """k centres uniform in a declared box: data-independent, so safe under any protection."""
    low, high = _check_bounds(bounds, n_features)
    return low + (high - low) * rng.random((k, n_features))


def _check_bounds(bounds, n_features: int):
    try:
        low, high = bounds
        low = np.broadcast_to(np.asarray(low, dtype=np.float64), (n_features,))
        high = np.broadcast_to(np.asarray(high, dtype=np.float64), (n_features,))
    except (TypeError, ValueError):
        raise InputError(
            "init_bounds must be (low, high) with scalars or arrays of length n_features, "
            f"got {bounds!r}."
        ) from None
    if not np.all(high > low):
        raise InputError(f"init_bounds needs high > low in every feature, got {bounds!r}.")
    return low, high
