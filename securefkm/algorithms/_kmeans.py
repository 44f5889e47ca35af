"""Vectorised k-means kernels shared by every algorithm (clients and servers).

No per-record Python loops: distances are one BLAS product, per-cluster sums one
``bincount`` per column (or a sparse product for wide data), and several clients can be
processed in one pass by offsetting their labels (``segment`` ids ``client * k + label``).
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import sparse

from ..exceptions import InputError
from . import _local
from ._addresses import _data_address, _record_addresses
from ._block_pool import _pool, _run_shared, _single_threaded_blas, _threads
from ._cellsums import (
    block_cell_sums,
    lanes,
    loop_threads,
    pooled_cell_sums,
    scratch,
    use_compiled,
    use_pooled,
)


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


def _client_pieces(sizes, chunk: int, block_rows: int | None = None) -> list[np.ndarray]:
    """The clients' records cut into pieces and grouped into blocks: a list of (pieces, 3)
    int64 arrays of ``(client, start, stop)`` rows, in client order.

    A client's rows are cut at multiples of ``chunk`` from *its own* first row, whatever
    clients come before it, so each client's partial sums are the same floating-point
    additions whether it is processed alone or with others. Which block a piece goes to
    changes no result: block ``b`` takes the pieces that start in rows
    ``[b * block_rows, (b + 1) * block_rows)`` of the pooled order (default ``chunk``), so
    ``block_rows`` can be chosen to balance the blocks over the threads
    (:func:`_balanced_rows`); a block has fewer than ``block_rows`` + ``chunk`` rows."""
    pieces = _pieces(sizes, chunk)
    lengths = pieces[:, 2] - pieces[:, 1]
    block = (np.cumsum(lengths) - lengths) // (block_rows or chunk)
    return np.split(pieces, np.flatnonzero(np.diff(block)) + 1) if len(pieces) else []


def _pieces(sizes, chunk: int) -> np.ndarray:
    """The clients' records cut into pieces of at most ``chunk`` rows, each client's from its
    own first row: a (pieces, 3) int64 array of ``(client, start, stop)`` rows in client order."""
    sizes = np.asarray(sizes, dtype=np.int64)
    counts = -(-sizes // chunk)
    client = np.repeat(np.arange(len(sizes), dtype=np.int64), counts)
    start = (np.arange(len(client), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)) * chunk
    return np.stack([client, start, np.minimum(sizes[client], start + chunk)], axis=1)


@functools.lru_cache(maxsize=16)
def _pieces_of(sizes: tuple, chunk: int) -> np.ndarray:
    """:func:`_pieces`, read-only and remembered for the last few layouts (a fit's rounds
    ask for the same one every round)."""
    pieces = _pieces(sizes, chunk)
    pieces.flags.writeable = False
    return pieces


def _balanced_rows(total: int, chunk: int, threads: int) -> int:
    """Rows per block for ``total`` rows over ``threads`` threads: at most ``chunk``, and a
    number of blocks that is a multiple of ``threads`` (7 blocks on 2 threads take 4 block
    times; 8 blocks of 7/8 the size take 3.5)."""
    n_blocks = -(-max(total, 1) // chunk)
    n_blocks = -(-n_blocks // threads) * threads
    return -(-max(total, 1) // n_blocks)


def _blocks(sizes, chunk: int | None, threads: int) -> list[np.ndarray]:
    """The pooled kernels' blocks of clients of ``sizes`` records: pieces cut at ``chunk``
    (default :data:`CHUNK_ROWS`), grouped for ``threads`` threads (:func:`_balanced_rows`).
    Read-only arrays, remembered for the last few layouts: a fit's rounds ask for the same
    one every round, and computing it (tens of us at 100 clients) delayed every block."""
    return list(_blocks_of(tuple(int(n) for n in sizes), chunk or CHUNK_ROWS, threads))


@functools.lru_cache(maxsize=16)
def _blocks_of(sizes: tuple, chunk: int, threads: int) -> tuple:
    blocks = _client_pieces(sizes, chunk, _balanced_rows(sum(sizes), chunk, threads))
    for b in blocks:
        b.flags.writeable = False
    return tuple(blocks)


def _block_records(datas, block, d: int) -> np.ndarray:
    """The block's records as one (rows, d) array: a view of the clients' own memory when
    its pieces lie back to back in it -- clients that are consecutive slices of one C-ordered
    float64 array, as a simulation's data set usually is -- else a copy into the thread's
    scratch buffer. The view spans only the pieces' own memory, all alive while ``datas`` is."""
    clients, starts, stops = block[:, 0], block[:, 1], block[:, 2]
    rows = int((stops - starts).sum())
    if len(block) == 1:  # C-ordered float64 as every other form reads it (BLAS's kernel depends on the layout)
        return np.ascontiguousarray(datas[clients[0]][starts[0] : stops[0]], dtype=np.float64)
    arrays = [datas[c] for c in clients.tolist()]
    f64, tail = np.dtype(np.float64), (d,)
    if all(X.dtype == f64 and X.shape[1:] == tail and X.flags.c_contiguous for X in arrays):
        row_bytes = 8 * d
        addresses = np.array([_data_address(X) for X in arrays], dtype=np.int64)
        if np.array_equal(addresses[1:] + starts[1:] * row_bytes, addresses[:-1] + stops[:-1] * row_bytes):
            head = arrays[0][starts[0] :]
            return np.lib.stride_tricks.as_strided(head, shape=(rows, d), strides=head.strides)
    parts = [X[a:b] for X, a, b in zip(arrays, starts.tolist(), stops.tolist())]
    return np.concatenate(parts, out=scratch("records", (rows, d)))


def _block_sums(datas, block, C2T, cc, sums, counts, fast):
    """Per-(client, cell) sums and counts of one block into ``sums`` / ``counts`` (zeros of
    (n block clients * k, d) and (n block clients * k,)), rows ordered by (local client, cell)."""
    k = len(cc)
    Xb = _block_records(datas, block, C2T.shape[0])
    row_base = np.repeat((block[:, 0] - block[0, 0]) * k, block[:, 2] - block[:, 1])
    block_cell_sums(Xb, C2T, cc, row_base, sums, counts, fast)


def per_client_cell_sums(datas, C: np.ndarray, chunk: int | None = None, n_threads: int | None = None):
    """For several clients at once: each client's per-cell coordinate sums (a list of
    (k, d) arrays) and counts (a list of (k,) float arrays) w.r.t. the same centres ``C``.

    One pooled pass over the clients' pieces of at most ``chunk`` rows (default
    :data:`CHUNK_ROWS`) (:func:`_client_pieces`), computed by ``n_threads`` threads
    (default: the CPUs this process may use, :func:`securefkm._kernel_threads.kernel_threads`)
    with single-threaded BLAS, as scikit-learn's Lloyd kernel does: distance products, then
    one pass that assigns each record and adds it to its (client, cell) row. Large calls
    run compiled: as one parallel loop over the pieces (:func:`_pooled_per_client`) where
    numpy's own ``dgemm`` can be called from it (:func:`._cellsums.use_pooled`), else as
    blocks on a thread pool (:func:`._cellsums.block_cell_sums`, without the GIL); small
    calls run numpy's loop in blocks. The same bits every way. A row adds its records in record order and a
    client cut over several blocks adds its blocks' partial sums in block order, so a
    client's result equals the one it gets alone (``client_updates([X])``) bit for bit. The
    pooled records are never copied as a whole: a block is read in place when its clients
    lie back to back in memory, else copied into its thread's scratch buffer.

    Every block writes into its own rows of one output allocated for the whole call, and
    each client gets a view of its rows: at 10,000 clients the round's messages are 128 MB
    (k=50, d=32) of new memory, and one allocation of that size is backed by huge pages
    (numpy advises them above 4 MB) where one per block faulted in 4 kB pages, which cost
    more than the distance products.
    """
    k, d = C.shape
    n_clients = len(datas)
    C = np.ascontiguousarray(C, dtype=np.float64)
    C2T, cc = -2.0 * C.T, np.einsum("ij,ij->i", C, C)
    sizes = [len(X) for X in datas]
    threads = _threads(n_threads)
    if use_pooled(sum(sizes) * k):
        return _pooled_per_client(datas, C2T, cc, sizes, chunk or CHUNK_ROWS, threads)
    blocks = _blocks(sizes, chunk, threads)
    if not blocks:  # no client has records
        return [np.zeros((k, d)) for _ in datas], [np.zeros(k) for _ in datas]
    firsts = np.array([b[0, 0] for b in blocks], dtype=np.int64)
    lasts = np.array([b[-1, 0] for b in blocks], dtype=np.int64)
    group0 = np.concatenate([[0], np.cumsum(lasts - firsts + 1)])  # each block's first (client, cell) group
    out_sums, out_counts = np.zeros((group0[-1] * k, d)), np.zeros(group0[-1] * k)
    fast = use_compiled(sum(sizes) * k)

    def run(i):
        rows = slice(group0[i] * k, group0[i + 1] * k)
        _block_sums(datas, blocks[i], C2T, cc, out_sums[rows], out_counts[rows], fast)

    for _ in map_blocks(datas, run, n_threads=threads, blocks=range(len(blocks))):
        pass
    groups, group_counts = out_sums.reshape(-1, k, d), out_counts.reshape(-1, k)
    if len(groups) == n_clients and all(sizes):  # no client cut or without records: group i is client i's
        sums, counts = list(groups), list(group_counts)
    else:  # a client's first group: in the first block reaching it (none if it has no records)
        clients = np.arange(n_clients)
        b = np.minimum(np.searchsorted(lasts, clients, side="left"), len(blocks) - 1)
        first_group = (group0[:-1][b] + clients - firsts[b]).tolist()
        sums = [groups[g] if n else np.zeros((k, d)) for g, n in zip(first_group, sizes)]
        counts = [group_counts[g] if n else np.zeros(k) for g, n in zip(first_group, sizes)]
    for b in np.flatnonzero(firsts[1:] == lasts[:-1]) + 1:  # a client cut over blocks: partial sums in block order
        i = int(firsts[b])
        sums[i], counts[i] = sums[i] + groups[group0[b]], counts[i] + group_counts[group0[b]]
    return sums, counts


@functools.lru_cache(maxsize=16)
def _lanes_of(sizes: tuple, chunk: int, threads: int) -> tuple:
    """:func:`._cellsums.lanes` of :func:`_pieces_of`, remembered (read-only) per layout."""
    pieces = _pieces_of(sizes, chunk)
    out = lanes(pieces[:, 2] - pieces[:, 1], threads)
    for a in out:
        a.flags.writeable = False
    return out


def _pooled_per_client(datas, C2T, cc, sizes: list, chunk: int, threads: int):
    """:func:`per_client_cell_sums` as one compiled parallel call over the clients' pieces
    (:func:`._cellsums.pooled_cell_sums`): each piece summed alone, a client's pieces added
    in piece order -- the partial sums the thread-pool form makes (a block never holds two
    pieces of one client), so the same bits."""
    k, d = len(cc), C2T.shape[0]
    layout = tuple(sizes)
    pieces = _pieces_of(layout, chunk)
    kept, bases = _record_addresses(datas)
    addresses = bases[pieces[:, 0]] + pieces[:, 1] * (8 * d)
    sums, counts = pooled_cell_sums(addresses, pieces[:, 2] - pieces[:, 1], d, C2T, cc,
                                    _lanes_of(layout, chunk, loop_threads(threads)))
    del kept
    groups, group_counts = sums.reshape(-1, k, d), counts.reshape(-1, k)
    if len(groups) == len(datas) and all(sizes):  # one piece per client: group i is client i's
        return list(groups), list(group_counts)
    n_pieces = -(-np.asarray(sizes, dtype=np.int64) // chunk)
    first = (np.cumsum(n_pieces) - n_pieces).tolist()
    out_sums = [groups[g] if n else np.zeros((k, d)) for g, n in zip(first, sizes)]
    out_counts = [group_counts[g] if n else np.zeros(k) for g, n in zip(first, sizes)]
    for i in np.flatnonzero(n_pieces > 1).tolist():  # partial sums in piece order
        for g in range(first[i] + 1, first[i] + int(n_pieces[i])):
            out_sums[i], out_counts[i] = out_sums[i] + groups[g], out_counts[i] + group_counts[g]
    return out_sums, out_counts


def map_blocks(datas, fn, chunk: int | None = None, n_threads: int | None = None, blocks=None):
    """``fn(block)`` for the blocks of :func:`_client_pieces` (or for the given ``blocks``),
    in block order, computed by ``n_threads`` threads (default: :func:`_threads`): the calling
    thread and ``n_threads - 1`` kept pool threads (:func:`_run_shared`; numpy, scipy and the
    compiled loops release the GIL), with single-threaded BLAS. The caller combines the
    results in the order they come."""
    threads = _threads(n_threads)
    if blocks is None:
        blocks = _blocks([len(X) for X in datas], chunk, threads)
    blocks = list(blocks)
    threads = min(len(blocks), threads)
    with _single_threaded_blas():
        if threads <= 1:
            yield from (fn(b) for b in blocks)
        else:
            yield from _run_shared(_pool(threads - 1), fn, blocks, threads - 1)


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
    as scikit-learn does): :func:`._local.kmeans_plusplus`, compiled in large runs.

    Written here rather than calling ``sklearn.cluster.kmeans_plusplus`` because a
    simulation seeds thousands of small clients, and scikit-learn's per-call validation and
    per-step numpy calls cost many times the arithmetic on a 100-record client.

    Draws from ``rng``: the first seed as ``rng.choice(n, p=w / w.sum())``, then
    ``rng.random(trials)`` per later seed (drawn at once: the same stream).
    """
    n = len(X)
    if n < k:
        raise InputError(f"k-means++ needs at least n_clusters={k} records, the client has {n}.")
    X = np.ascontiguousarray(X, dtype=np.float64)
    w = np.ones(n) if sample_weight is None else np.ascontiguousarray(sample_weight, dtype=np.float64)
    return X[_kmeans_plusplus(X, X.T.copy(), w, k, rng)[0]]


def _kmeans_plusplus(X, XT, w, k, rng):
    """(seed indices, seeds placed while some record lay off every seed): see
    :func:`._local.kmeans_plusplus`."""
    trials = 2 + int(np.log(k))
    # rng.choice(len(X), p=w / w.sum()) as numpy computes it, without its argument checks
    # (a tenth of a millisecond: more than the seeding of a 100-record client)
    cdf = np.cumsum(w / w.sum())
    cdf /= cdf[-1]
    first = int(np.searchsorted(cdf, rng.random(), side="right"))
    impl = _local.use_compiled(len(X) * k) or _local
    return impl.kmeans_plusplus(X, XT, w, first, rng.random((k - 1, trials)))


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

    k-means++ seeding then Lloyd iterations (:func:`._local.lloyd`) until the
    centres' squared shift is at most ``tol`` times the data's mean variance (as in
    scikit-learn), best of ``n_init``. ``k`` is capped at the number of distinct records;
    clusters left empty are dropped, so a client may return fewer than ``k`` centres. Sizes
    count the records assigned to each centre.
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    if len(X) == 0:
        raise InputError("local k-means got a client without records.")
    XT, w = X.T.copy(), np.ones(len(X))
    abs_tol = tol * float(np.mean(np.var(X, axis=0))) if len(X) > 1 else 0.0
    best = None
    for _ in range(n_init):
        seeds, distinct = _kmeans_plusplus(X, XT, w, min(k, len(X)), rng)
        C = X[seeds[:distinct]]  # fewer distinct records than k: one centre per value
        labels, d2 = (_local.use_compiled(len(X) * len(C)) or _local).lloyd(X, XT, C, max_iter, abs_tol)
        inertia = float(d2.sum())
        if best is None or inertia < best[0]:
            best = (inertia, C, labels)
    _, C, labels = best
    sizes = np.bincount(labels, minlength=len(C)).astype(np.float64)
    keep = sizes > 0
    return C[keep], sizes[keep]


def uniform_in_bounds(bounds, k: int, n_features: int, rng: np.random.Generator) -> np.ndarray:
    """k centres uniform in a declared box (or ball, :class:`securefkm.domain.Ball`):
    data-independent, so safe under any protection."""
    from ..domain import Ball

    if isinstance(bounds, Ball):
        return bounds.sample(k, n_features, rng)
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
