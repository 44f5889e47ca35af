"""Vectorised rounds: every simulated client's update computed in one pooled pass equals,
bit for bit, the update it computes alone; the round's transcript is unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from securefkm.algorithms import _addresses, _block_pool, _cellsums, _kmeans
from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
from securefkm.algorithms.fuzzy import FederatedFuzzyCMeansAlgorithm
from securefkm.algorithms.minibatch import MiniBatchFederatedKMeansAlgorithm
from securefkm.federation import Federation


def _clients(seed=0, d=5):
    rng = np.random.default_rng(seed)
    # uneven sizes: empty-ish, tiny, and clients larger than a (shrunk) block
    sizes = [1, 3, 700, 40, 0, 1500, 2, 333, 90, 1200]
    return [rng.normal(size=(n, d)) * rng.uniform(0.1, 10) + rng.normal(size=d) for n in sizes]


def _broadcast(algo, datas, k, seed=1):
    rng = np.random.default_rng(seed)
    pooled = np.concatenate(datas)
    algo.init_ = pooled[rng.choice(len(pooled), k, replace=False)].copy()
    state = algo.init(len(datas), pooled.shape[1], np.random.default_rng(0))
    return algo.configure(state, 0)


ALGOS = [
    ("dwf", lambda k: WeightedFederatedKMeansAlgorithm(k)),
    ("ewf", lambda k: WeightedFederatedKMeansAlgorithm(k, weighting="equal")),
    ("minibatch", lambda k: MiniBatchFederatedKMeansAlgorithm(k)),
    ("minibatch-rate", lambda k: MiniBatchFederatedKMeansAlgorithm(k, client_rate=0.5)),
    ("fuzzy-fedavg", lambda k: FederatedFuzzyCMeansAlgorithm(k, averaging="fedavg")),
]


@pytest.mark.parametrize("form", ["numpy", "parallel loop"])
@pytest.mark.parametrize("name, make", ALGOS)
@pytest.mark.parametrize("k", [3, 12])
def test_batched_equals_per_client_loop_exactly(name, make, k, form, monkeypatch):
    monkeypatch.setattr(_kmeans, "CHUNK_ROWS", 512)  # several blocks, clients split across blocks
    if form != "numpy":
        _pooled_loop_available()
        monkeypatch.setattr(_cellsums, "JIT_MIN_WORK", 0)
    datas = [X for X in _clients() if len(X)]
    algo = make(k)
    bc = _broadcast(algo, datas, k)
    batched = algo.client_updates(datas, bc, [None] * len(datas), [{} for _ in datas])
    alone = [algo.client_update(X, bc, None, {}) for X in datas]
    assert len(batched) == len(alone) == len(datas)
    for b, a in zip(batched, alone):
        assert b.sums.keys() == a.sums.keys() and b.sums
        for key in a.sums:
            assert np.array_equal(b.sums[key], a.sums[key]), (name, key)


def test_cell_sums_match_definition_and_thread_count():
    datas = _clients(3, d=12)
    C = np.random.default_rng(4).normal(size=(7, 12))
    one, cnt1 = _kmeans.per_client_cell_sums(datas, C, chunk=256, n_threads=1)
    two, cnt2 = _kmeans.per_client_cell_sums(datas, C, chunk=256, n_threads=2)
    assert np.array_equal(one, two) and np.array_equal(cnt1, cnt2)
    for i, X in enumerate(datas):
        labels, _ = _kmeans.assign(X, C) if len(X) else (np.zeros(0, dtype=int), None)
        assert np.array_equal(cnt1[i], np.bincount(labels, minlength=7))
        for j in range(7):
            np.testing.assert_allclose(one[i][j], X[labels == j].sum(axis=0), rtol=1e-12, atol=1e-12)


def test_products_cut_each_piece_from_its_own_first_record(monkeypatch):
    """A record's distance product is one matmul over its piece's PRODUCT_ROWS-record cut,
    counted from the piece's first record: what shares the call depends on its client alone."""
    assert _cellsums.product_rows(20) == _cellsums.product_rows(128) == 2048
    assert _cellsums.product_rows(1000) == 262 and _cellsums.product_rows(100_000) == 256  # 2 MiB, at least 256
    monkeypatch.setattr(_cellsums, "PRODUCT_ROWS", 4)
    row_base = np.repeat(np.array([0, 3, 6, 9]), [5, 4, 1, 9])
    starts, stops = _cellsums.product_ranges(row_base, 3)
    assert list(zip(starts.tolist(), stops.tolist())) == [(0, 4), (4, 5), (5, 9), (9, 10), (10, 14), (14, 18), (18, 19)]
    starts, stops = _cellsums.product_ranges(row_base[5:9], 3)  # no piece longer than a product
    assert list(zip(starts.tolist(), stops.tolist())) == [(0, 4)]
    assert [len(r) for r in _cellsums.product_ranges(np.zeros(0, dtype=np.int64), 3)] == [0, 0]


def test_blocks_cut_each_client_from_its_own_first_row():
    blocks = _kmeans._client_pieces([5, 12, 3, 0, 9], 4)
    pieces = [tuple(p) for b in blocks for p in b.tolist()]
    assert pieces == [(0, 0, 4), (0, 4, 5), (1, 0, 4), (1, 4, 8), (1, 8, 12), (2, 0, 3),
                      (4, 0, 4), (4, 4, 8), (4, 8, 9)]
    # block b takes the pieces starting in pooled rows [4b, 4b + 4): fewer than 4 + 4 rows
    assert [[tuple(p) for p in b.tolist()] for b in blocks][:2] == [[(0, 0, 4)], [(0, 4, 5), (1, 0, 4)]]
    assert all(sum(b - a for _, a, b in blk.tolist()) < 8 for blk in blocks)
    # 29 rows in chunks of 4 are 8 blocks; 3 threads get 9 (a multiple of 3) of <= 4 rows
    assert _kmeans._balanced_rows(29, 4, 3) == 4 and _kmeans._balanced_rows(29, 8, 2) == 8
    assert _kmeans._balanced_rows(100_000, 16384, 2) == 12500  # 8 blocks, not 7


@pytest.mark.parametrize("pooled", [True, False])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_cell_sums_do_not_depend_on_blocking_or_threads(threads, pooled, monkeypatch):
    """The same bits whatever the thread count (which sets the block grouping) and
    whichever implementation runs: numpy, or compiled as one parallel loop or as blocks
    on the thread pool."""
    pytest.importorskip("numba")
    datas = _clients(5, d=9)
    C = np.random.default_rng(6).normal(size=(11, 9))
    ref = _kmeans.per_client_cell_sums(datas, C, chunk=256, n_threads=1)
    monkeypatch.setattr(_cellsums, "JIT_MIN_WORK", 0)  # every call compiled
    monkeypatch.setattr(_cellsums, "POOLED", pooled)
    if pooled and not _cellsums.use_pooled(1):
        pytest.skip("numpy's BLAS is not an OpenBLAS it ships: no parallel loop")
    got = _kmeans.per_client_cell_sums(datas, C, chunk=256, n_threads=threads)
    for a, b in zip(ref[0] + ref[1], got[0] + got[1]):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("local_runs", [True, False])
@pytest.mark.parametrize("product_rows", [None, 512])
@pytest.mark.parametrize("k, d", [(1, 1), (2, 3), (7, 1), (20, 16), (50, 32)])
def test_compiled_loop_equals_numpy_loop(k, d, product_rows, local_runs, monkeypatch):
    """The compiled inner loop and numpy's give the same bits, ties included (integer
    data, a duplicated centre: the first of equal distances wins in both), on clients given
    as non-contiguous views and Fortran-ordered arrays; with the default products (one per
    client here) and with products of 512 records, which cut clients; with the compiled loop
    adding clients' runs of records into local rows (the default: the 5-record client's run
    is shorter than k from k = 7 on and is added in place) and adding every record in place."""
    pytest.importorskip("numba")
    monkeypatch.setattr(_cellsums, "LOCAL_RUNS", local_runs)
    if product_rows is not None:
        monkeypatch.setattr(_cellsums, "PRODUCT_ROWS", product_rows)
    rng = np.random.default_rng(k * 100 + d)
    C = rng.integers(-3, 4, size=(k, d)).astype(float)
    if k > 1:
        C[-1] = C[0]  # a tie on every record nearest to it
    wide = rng.integers(-4, 5, size=(3000, 2 * d)).astype(float) + rng.normal(size=(3000, 2 * d)) * (k % 2)
    datas = [wide[:700, ::2], np.asfortranarray(wide[700:1900, :d]), wide[1900:1905, d:], wide[1905:, :d]]
    row_base = np.repeat(np.arange(len(datas), dtype=np.int64) * k, [len(X) for X in datas])
    Xb = np.concatenate(datas)
    cc = np.einsum("ij,ij->i", C, C)
    out = []
    for fast in (False, True):
        sums, counts = np.zeros((len(datas) * k, d)), np.zeros(len(datas) * k)
        _cellsums.block_cell_sums(Xb, -2.0 * C.T, cc, row_base, sums, counts, fast)
        out.append((sums, counts))
    assert np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1])
    assert out[0][1].sum() == len(Xb)
    if k > 1:
        assert not out[0][1].reshape(len(datas), k)[:, -1].any()  # the duplicate never wins


def _pooled_loop_available():
    pytest.importorskip("numba")
    from securefkm.algorithms import _numpy_blas

    if _numpy_blas.dgemm() is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS it ships: no parallel loop")


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("sub", [2048, 256, 7])
@pytest.mark.parametrize("k, d", [(1, 1), (2, 3), (7, 1), (20, 16), (50, 32), (300, 5)])
def test_parallel_loop_equals_numpy_reference(k, d, sub, threads, monkeypatch):
    """The pooled kernel as one compiled parallel loop (numpy's own dgemm on ``sub``
    records of a piece at a time, as the reference's np.matmul) gives the numpy reference's bits, ties included (integer data, a
    duplicated centre: the first of equal distances wins in both): on clients given as
    non-contiguous views, Fortran-ordered, float32 and back-to-back slices of one array,
    a client shorter than k (added in place), an empty one, and clients cut into several
    pieces (chunk=512) and several products."""
    _pooled_loop_available()
    rng = np.random.default_rng(k * 100 + d)
    C = rng.integers(-3, 4, size=(k, d)).astype(float)
    if k > 1:
        C[-1] = C[0]  # a tie on every record nearest to it
    wide = rng.integers(-4, 5, size=(4000, 2 * d)).astype(float) + rng.normal(size=(4000, 2 * d)) * (k % 2)
    pooled = np.ascontiguousarray(wide[3000:, :d])
    datas = [wide[:700, ::2], np.asfortranarray(wide[700:1900, :d]), wide[1900:1905, d:], wide[1905:1905, :d],
             wide[1905:3000, :d].astype(np.float32), pooled[:300], pooled[300:301], pooled[301:]]
    monkeypatch.setattr(_cellsums, "PRODUCT_ROWS", sub)

    def both(clients, chunk):
        monkeypatch.setattr(_cellsums, "JIT_MIN_WORK", 1 << 62)  # the reference: numpy
        ref = _kmeans.per_client_cell_sums(clients, C, chunk=chunk, n_threads=1)
        monkeypatch.setattr(_cellsums, "JIT_MIN_WORK", 0)
        assert _cellsums.use_pooled(1)
        got = _kmeans.per_client_cell_sums(clients, C, chunk=chunk, n_threads=threads)
        for a, b in zip(ref[0] + ref[1], got[0] + got[1]):
            assert a.shape == b.shape and np.array_equal(a, b)
        return got

    got = both(datas, 512)
    for X in datas[:2]:  # the strided and the Fortran-ordered client alone: a block of one piece
        both([X], 1 << 20)
    counts = np.array(got[1])
    assert counts.sum() == sum(len(X) for X in datas) and not counts[3].any()
    if k > 1:
        assert not counts[:, -1].any()  # the duplicate never wins


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_lanes_deal_every_piece_once_in_piece_order_with_even_rows(threads):
    """numba splits a parallel loop evenly by iteration count: the pooled loop runs over one
    lane per thread, each with about the same rows, even when the largest clients come
    first (a split by count gave one thread 94 % of the rows)."""
    rng = np.random.default_rng(threads)
    rows = np.sort((rng.pareto(1.2, 300) * 300 + 1).astype(np.int64))[::-1]
    order, lane_start = _cellsums.lanes(rows, threads)
    assert len(lane_start) == threads + 1 and lane_start[0] == 0 and lane_start[-1] == len(rows)
    assert sorted(order.tolist()) == list(range(len(rows)))
    loads = [rows[order[a:b]].sum() for a, b in zip(lane_start[:-1], lane_start[1:])]
    for a, b in zip(lane_start[:-1], lane_start[1:]):
        assert np.all(np.diff(order[a:b]) > 0)  # piece order within a lane
    assert max(loads) - min(loads) <= rows.max()  # within one piece of even
    assert _cellsums.lanes(np.array([5]), 3)[1].tolist() == [0, 1]  # fewer pieces than threads


def test_parallel_loop_leaves_numba_threads_and_runs_from_two_threads():
    """A call sets numba's thread count for itself only (the caller's setting is put
    back), and two Python threads may call the kernel at once."""
    _pooled_loop_available()
    import threading

    import numba

    rng = np.random.default_rng(3)
    datas = [rng.normal(size=(5000, 8)) for _ in range(12)]
    C = rng.normal(size=(9, 8))
    expected = _kmeans.per_client_cell_sums(datas, C, n_threads=2)
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        _kmeans.per_client_cell_sums(datas, C, n_threads=2)
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(before)
    results = []

    def call():
        for _ in range(5):
            results.append(_kmeans.per_client_cell_sums(datas, C, n_threads=2))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 10
    for got in results:
        assert all(np.array_equal(a, b) for a, b in zip(expected[0] + expected[1], got[0] + got[1]))


_WORKQUEUE_SCRIPT = """
import threading, numpy as np
from securefkm.algorithms import _kmeans, _cellsums
rng = np.random.default_rng(3)
datas = [rng.normal(size=(5000, 8)) for _ in range(12)]
C = rng.normal(size=(9, 8))
expected = _kmeans.per_client_cell_sums(datas, C, n_threads=2)
import numba
assert numba.threading_layer() == "workqueue" and _cellsums._THREADSAFE_LAYER is False
results = []
def call():
    for _ in range(10):
        results.append(_kmeans.per_client_cell_sums(datas, C, n_threads=2))
threads = [threading.Thread(target=call) for _ in range(3)]
[t.start() for t in threads]
[t.join() for t in threads]
assert len(results) == 30
assert all(np.array_equal(a, b) for r in results for a, b in zip(expected[0] + expected[1], r[0] + r[1]))
print("ok")
"""


def test_parallel_loop_on_numbas_workqueue_layer_is_serialised():
    """numba's workqueue layer (no OpenMP or TBB installed) aborts the process when two
    threads enter a parallel loop at once: the calls are serialised there (three threads
    calling together get the right sums; without the lock the process was terminated)."""
    _pooled_loop_available()
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    run = subprocess.run([sys.executable, "-c", _WORKQUEUE_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def test_without_numpys_openblas_the_thread_pool_form_runs(monkeypatch):
    """Where numpy's BLAS is not an OpenBLAS it ships (MKL, Accelerate), there is no
    ``dgemm`` to call from the loop: the compiled thread-pool form runs, with np.matmul."""
    pytest.importorskip("numba")
    from securefkm.algorithms import _numpy_blas

    monkeypatch.setattr(_numpy_blas, "_FOUND", None)
    monkeypatch.setattr(_cellsums, "JIT_MIN_WORK", 0)
    assert _cellsums.use_compiled(1) and not _cellsums.use_pooled(1)
    called = []
    monkeypatch.setattr(_kmeans, "pooled_cell_sums", lambda *a: called.append(a))
    datas = _clients(2, d=4)
    sums, counts = _kmeans.per_client_cell_sums(datas, np.random.default_rng(1).normal(size=(3, 4)))
    assert not called and sum(c.sum() for c in counts) == sum(len(X) for X in datas)


def test_numpys_dgemm_is_found_with_numpys_openblas():
    """numpy's wheels ship OpenBLAS (``scipy-openblas``): its dgemm is found there, in
    numpy's own library directory, not in SciPy's (another build)."""
    import numpy

    from securefkm.algorithms import _numpy_blas

    blas = numpy.__config__.CONFIG["Build Dependencies"]["blas"]["name"]
    if blas != "scipy-openblas":
        pytest.skip(f"numpy built with {blas}")
    found = _numpy_blas.dgemm()
    assert found is not None and found[0] > 0 and found[1] in (np.int32, np.int64)
    path = _numpy_blas._numpy_openblas_path()
    assert "scipy.libs" not in path and any(path.startswith(p) for p in _numpy_blas.numpy_blas_dirs())


def _forked_result(target):
    """What ``target(queue)`` puts on the queue in a child forked from this process (which
    must exit cleanly within a minute, not hang or be terminated)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=target, args=(queue,))
    child.start()
    child.join(60)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and child.exitcode == 0
    return queue.get(timeout=5)


def _parallel_loop_in_forked_child(queue):
    rng = np.random.default_rng(0)
    datas = [rng.normal(size=(20_000, 4)) for _ in range(4)]
    sums, _ = _kmeans.per_client_cell_sums(datas, rng.normal(size=(5, 4)), n_threads=2)
    queue.put((float(sum(s.sum() for s in sums)), _cellsums._FORKED))


def test_a_child_forked_after_the_parallel_loop_uses_the_thread_pool_form():
    """numba's OpenMP layer terminates a forked child that starts a parallel loop after its
    parent ran one; such a child computes the same sums in the thread-pool form."""
    _pooled_loop_available()

    rng = np.random.default_rng(0)
    datas = [rng.normal(size=(20_000, 4)) for _ in range(4)]
    expected, _ = _kmeans.per_client_cell_sums(datas, rng.normal(size=(5, 4)), n_threads=2)
    assert _cellsums._STARTED  # the parent ran the parallel loop
    assert _forked_result(_parallel_loop_in_forked_child) == (float(sum(s.sum() for s in expected)), True)


@pytest.mark.parametrize("name, make", ALGOS[:3])
def test_federation_transcript_identical_batched_or_not(name, make, monkeypatch):
    datas = [X for X in _clients(7) if len(X)]

    def fit(batched):
        algo = make(4)
        _broadcast(algo, datas, 4)
        if not batched:  # one client per call: the per-client loop
            one = type(algo).client_updates
            algo.client_updates = lambda ds, bc, rs, ms: [one(algo, [X], bc, [r], [m])[0] for X, r, m in zip(ds, rs, ms)]
        fed = Federation(algo, datas, max_rounds=4, random_state=0, record="full")
        return fed.run(), fed.transcript

    (sa, ta), (sb, tb) = fit(True), fit(False)
    assert np.array_equal(sa.centres, sb.centres)
    assert len(ta) == len(tb) == 4
    for x, y in zip(ta, tb):
        assert x.contributors == y.contributors and x.aggregate.keys() == y.aggregate.keys()
        for key in x.aggregate:
            assert np.array_equal(x.aggregate[key], y.aggregate[key])
        for sx, sy in zip(x.stages, y.stages):
            assert sx.received.keys() == sy.received.keys()
            for c in sx.received:
                for key, v in sx.received[c].items():
                    assert np.array_equal(v, sy.received[c][key])


def test_round_pauses_cyclic_gc_and_restores_it():
    """Rounds run with the cyclic collector paused (its full collections traversed the
    transcript at 10,000 clients) and leave it as they found it."""
    import gc

    datas = [X for X in _clients(7) if len(X)]
    algo = WeightedFederatedKMeansAlgorithm(4)
    _broadcast(algo, datas, 4)
    seen = []
    one = type(algo).client_updates
    algo.client_updates = lambda ds, bc, rs, ms: seen.append(gc.isenabled()) or one(algo, ds, bc, rs, ms)
    assert gc.isenabled()
    Federation(algo, datas, max_rounds=2, random_state=0).run()
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:  # a caller that disabled it keeps it disabled
        Federation(algo, datas, max_rounds=1, random_state=0).run()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_small_fits_never_import_numba():
    """The compiled loop is for large calls only: a small fit does not pay numba's import
    (0.2 s) or compilation; a large call does use it."""
    from _numba_imports import numba_imported

    small = ("from securefkm.algorithms import _kmeans\n"
             "_kmeans.per_client_cell_sums([rng.normal(size=(100, 2)) for _ in range(50)], rng.normal(size=(5, 2)))")
    large = "_kmeans.per_client_cell_sums([rng.normal(size=(30_000, 4))], rng.normal(size=(10, 4)))"
    assert numba_imported(small, large) == ["False", "True"]


def test_clients_back_to_back_in_memory_are_read_in_place():
    """Clients that are consecutive slices of one array are read where they lie (no copy
    of the block's records) and give the same bits as separate copies; slices out of order,
    or with gaps, are copied."""
    rng = np.random.default_rng(8)
    pooled = rng.normal(size=(3000, 6))
    views = np.array_split(pooled, 9)
    C = rng.normal(size=(4, 6))
    blocks = _kmeans._client_pieces([len(X) for X in views], 1024)
    multi = next(b for b in blocks if len(b) > 1)
    assert np.shares_memory(_kmeans._block_records(views, multi, 6), pooled)
    reordered = views[::-1]
    gapped = [X[:-1] for X in views]
    for datas in (reordered, gapped):
        b = _kmeans._client_pieces([len(X) for X in datas], 1024)[0]
        assert len(b) > 1
        records = _kmeans._block_records(datas, b, 6)
        assert not np.shares_memory(records, pooled)
        assert np.array_equal(records, np.concatenate([datas[c][a:e] for c, a, e in b.tolist()]))
    for datas in (views, reordered, gapped):
        copies = [X.copy() for X in datas]
        a = _kmeans.per_client_cell_sums(datas, C, chunk=1024, n_threads=2)
        b = _kmeans.per_client_cell_sums(copies, C, chunk=1024, n_threads=2)
        assert all(np.array_equal(x, y) for x, y in zip(a[0] + a[1], b[0] + b[1]))
        # one group per client (the list of views) or, with a client without records, the mapping
        c = _kmeans.per_client_cell_sums(datas + [np.zeros((0, 6))], C, chunk=1024, n_threads=2)
        assert all(np.array_equal(x, y) for x, y in zip(a[0] + a[1], c[0][:-1] + c[1][:-1]))
        assert not c[0][-1].any() and not c[1][-1].any()


def test_data_addresses_are_remembered_only_while_the_array_lives():
    """The kernel remembers each client array's data address (reading it costs ~1 us per
    client per round); the entry is that array's only, and goes when the array does, so an
    array born later at the same id gets its own address."""
    import gc

    pooled = np.zeros((40, 3))
    views = np.array_split(pooled, 4)
    addresses = [_addresses._data_address(X) for X in views]
    assert addresses == [X.__array_interface__["data"][0] for X in views]
    assert addresses == [pooled.__array_interface__["data"][0] + 8 * 3 * 10 * i for i in range(4)]
    key = id(views[1])
    assert key in _addresses._ADDRESSES
    del views[1]
    gc.collect()
    assert key not in _addresses._ADDRESSES
    fresh = np.ones((5, 3))
    assert _addresses._data_address(fresh) == fresh.__array_interface__["data"][0]


def test_kernel_threads_default_and_worker_setting(monkeypatch):
    """The kernels use the CPU count unless told (a worker with one CPU sets 1); a call's
    n_threads wins; a call nested in a block worker runs in that worker's thread."""

    from securefkm import _kernel_threads

    monkeypatch.setattr(_kernel_threads, "_DEFAULT", None)
    assert _block_pool._threads(None) == _kernel_threads.process_cpus()
    _kernel_threads.set_kernel_threads(1)
    assert _block_pool._threads(None) == 1 and _block_pool._threads(3) == 3
    _kernel_threads.set_kernel_threads(None)
    nested = list(_block_pool._pool(2).map(lambda _: _block_pool._threads(4), range(2)))
    assert nested == [1, 1]


def _failing_at(bad: int, error: type, ran: list):
    """A block function that records the blocks it ran and raises ``error`` at block ``bad``."""

    def fn(b):
        ran.append(b)
        if b == bad:
            raise error(f"block {bad}")
        return b

    return fn


def test_blocks_shared_by_caller_and_pool_in_order_even_when_the_pool_is_busy():
    """The calling thread and the pool's helper take the next block from one counter: the
    results come in block order whoever computed them; with the pool's only thread busy
    elsewhere the caller does every block instead of waiting (its queued helper is
    cancelled); an error in a block is raised and no block after it is started."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        assert _block_pool._run_shared(pool, lambda b: b * b, list(range(9))) == [b * b for b in range(9)]
        release = threading.Event()
        busy = pool.submit(release.wait, 30)
        callers = []
        out = _block_pool._run_shared(pool, lambda b: callers.append(threading.current_thread()) or -b, list(range(5)))
        assert out == [0, -1, -2, -3, -4] and callers == [threading.current_thread()] * 5
        ran = []
        with pytest.raises(ValueError, match="block 3"):
            _block_pool._run_shared(pool, _failing_at(3, ValueError, ran), list(range(6)))
        release.set()
        busy.result()
        pool.submit(lambda: None).result()  # the queue is drained: the cancelled helper never ran
        assert ran == [0, 1, 2, 3]


def test_a_failing_block_in_the_helper_is_raised_after_the_caller_stops():
    """Two helpers and the caller, a block failing wherever it runs: the error reaches the
    caller, the blocks after the failure are not all computed, and nothing runs afterwards."""
    from concurrent.futures import ThreadPoolExecutor

    ran = []
    with ThreadPoolExecutor(2) as pool:
        with pytest.raises(KeyError, match="block 2"):
            _block_pool._run_shared(pool, _failing_at(2, KeyError, ran), list(range(400)), helpers=2)
        settled = len(ran)
        pool.submit(lambda: None).result()
    assert 2 in ran and settled == len(ran) < 400


def _cell_sums_in_child(queue):
    rng = np.random.default_rng(0)
    datas = [rng.normal(size=(300, 3)) for _ in range(8)]
    sums, _ = _kmeans.per_client_cell_sums(datas, rng.normal(size=(4, 3)), chunk=256, n_threads=2)
    queue.put(float(sum(s.sum() for s in sums)))


def test_kept_thread_pool_survives_fork():
    """The kernel's pool is kept between calls; a forked child (multiprocessing's fork start
    method) has none of its threads and must build its own instead of waiting forever."""

    rng = np.random.default_rng(0)
    datas = [rng.normal(size=(300, 3)) for _ in range(8)]
    expected, _ = _kmeans.per_client_cell_sums(datas, rng.normal(size=(4, 3)), chunk=256, n_threads=2)
    assert 1 in _block_pool._POOLS  # the parent's pool (one thread beside the caller) exists when the child is forked
    assert _forked_result(_cell_sums_in_child) == float(sum(s.sum() for s in expected))


def test_scratch_buffers_kept_only_up_to_a_size(monkeypatch):
    """The kernel's threads live as long as the process: a thread keeps its scratch buffer
    for the next block, except a giant one (the numpy loop's distances for a large k)."""
    monkeypatch.setattr(_cellsums, "SCRATCH_KEEP_BYTES", 8 * 1000)
    monkeypatch.setattr(_cellsums, "_SCRATCH", __import__("threading").local())
    small1, small2 = _cellsums.scratch("x", (10, 10)), _cellsums.scratch("x", (5, 10))
    assert np.shares_memory(small1, small2)
    big1, big2 = _cellsums.scratch("y", (100, 100)), _cellsums.scratch("y", (100, 100))
    assert not np.shares_memory(big1, big2)


def test_bad_kernel_settings_name_the_argument():
    from securefkm import _kernel_threads
    from securefkm.exceptions import InputError

    with pytest.raises(InputError, match="n_threads"):
        _kernel_threads.set_kernel_threads(0)
    with pytest.raises(InputError, match="seeding_noise"):
        WeightedFederatedKMeansAlgorithm(3, seeding_noise=-0.1)


def test_default_threads_follow_the_affinity_and_omp_num_threads(monkeypatch):
    """The CPUs this process may use: its affinity mask, capped by OMP_NUM_THREADS when set
    (what scikit-learn's OpenMP kernels and joblib's workers follow), ignoring bad values."""
    import os

    from securefkm import _kernel_threads

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert _kernel_threads.process_cpus() == cpus
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert _kernel_threads.process_cpus() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", str(cpus + 5))
    assert _kernel_threads.process_cpus() == cpus
    for bad in ("0", "two", ""):
        monkeypatch.setenv("OMP_NUM_THREADS", bad)
        assert _kernel_threads.process_cpus() == cpus


def test_a_worker_shard_runs_the_kernel_in_one_thread(monkeypatch):
    """A worker process or Ray actor owns one CPU: building its shard sets the kernels' default
    to one thread (without it, n_workers processes would each start a thread per CPU)."""
    import pickle

    from securefkm import _kernel_threads
    from securefkm.federation.workers import Shard

    monkeypatch.setattr(_kernel_threads, "_DEFAULT", None)
    monkeypatch.setattr(_kernel_threads, "_CPUS", 4)  # the CPU count, read once per process
    assert _block_pool._threads(None) == 4
    Shard(pickle.dumps(([], [], [], None, [], None, None)))
    assert _block_pool._threads(None) == 1


@pytest.mark.parametrize("k, d", [(1, 1), (2, 3), (7, 5), (8, 2), (9, 16), (20, 16), (64, 7), (128, 3)])
def test_compiled_fcm_weights_equal_numpy(k, d):
    """Fuzzy c-means weights u_ij^2 from the compiled loop and from numpy (eq. 5, then the
    power of eq. 6) are the same bits: row sums of fewer and more than 8 centres (numpy's
    pairwise sum), wide scales, non-contiguous and Fortran-ordered records."""
    pytest.importorskip("numba")
    from securefkm.algorithms._fcm import membership_weights

    rng = np.random.default_rng(k * 31 + d)
    C = rng.normal(size=(k, d)) * 3
    wide = rng.normal(size=(2500, 2 * d)) * rng.uniform(0.01, 50, size=2 * d)
    for X in (wide[:, ::2], np.asfortranarray(wide[:1200, :d]), wide[1000:1003, d:]):
        ref = membership_weights(X, C, 2.0, fast=False).copy()
        got = membership_weights(X, C, 2.0, fast=True)
        assert np.array_equal(got, ref)
        np.testing.assert_allclose(np.sqrt(ref).sum(axis=1), 1.0, rtol=1e-12)


def test_fcm_weights_of_records_on_centres():
    """A record on a centre (d = 0 exactly: eq. 5's limit, full membership there, shared
    equally between coinciding centres) and one a hair's breadth away, compiled and numpy
    alike; the direct distances see the zero that the BLAS expansion loses to rounding."""
    pytest.importorskip("numba")
    from securefkm.algorithms._fcm import direct_sq_distances, membership_weights

    rng = np.random.default_rng(3)
    C = rng.normal(size=(5, 4)) * 1e3
    C[3] = C[1]
    X = rng.normal(size=(300, 4)) * 1e3
    X[120], X[150] = C[2], C[1]
    X[200] = C[4] + 1e-9
    assert direct_sq_distances(X[120:121], C)[0, 2] == 0.0 and direct_sq_distances(X[200:201], C)[0, 4] > 0.0
    got = membership_weights(X, C, 2.0, fast=True)
    assert np.array_equal(got, membership_weights(X, C, 2.0, fast=False))
    assert np.array_equal(got[120], np.eye(5)[2]) and np.array_equal(got[150], [0, 0.25, 0, 0.25, 0])
    assert got[200, 4] > 0.999999


@pytest.mark.parametrize("m", [2.0, 1.7])
def test_fuzzy_pooled_compiled_round_equals_per_client_numpy(m, monkeypatch):
    """A fedavg fuzzy c-means round computed pooled with the compiled loop (clients cut
    across blocks, 2 threads) gives every client the sums it computes alone with numpy."""
    pytest.importorskip("numba")
    monkeypatch.setattr(_kmeans, "CHUNK_ROWS", 512)
    datas = [X for X in _clients(6, d=5) if len(X)]
    algo = FederatedFuzzyCMeansAlgorithm(9, averaging="fedavg", m=m)
    bc = _broadcast(algo, datas, 9)
    monkeypatch.setattr(_cellsums, "JIT_MIN_WORK", 1 << 60)
    alone = [algo.client_update(X, bc, None, {}) for X in datas]
    monkeypatch.setattr(_cellsums, "JIT_MIN_WORK", 0)
    pooled = algo.client_updates(datas, bc, [None] * len(datas), [{} for _ in datas])
    for a, b in zip(alone, pooled):
        for key in a.sums:
            assert np.array_equal(a.sums[key], b.sums[key]), key


def test_call_addresses_are_remembered_for_the_same_arrays_only():
    """A pooled call remembers its clients' record addresses by the ids of their arrays; a
    later call with the same arrays reuses them, a call whose arrays died (even if new
    arrays took their ids) or that needs copies computes them afresh."""
    import weakref

    pooled = np.arange(60.0).reshape(20, 3)
    datas = np.array_split(pooled, 4)
    kept, bases = _addresses._record_addresses(datas)
    assert kept is datas and bases.tolist() == [X.__array_interface__["data"][0] for X in datas]
    assert _addresses._record_addresses(datas)[1] is bases  # remembered
    # an entry whose arrays died is not trusted, whatever ids the new arrays got
    key = tuple(map(id, datas))
    _addresses._CALL_ADDRESSES[key] = (tuple(weakref.ref(np.zeros(1)) for _ in datas), np.zeros(4, dtype=np.int64))
    assert _addresses._record_addresses(datas)[1].tolist() == bases.tolist()
    # Fortran-ordered or float32 clients are copied for the call and not remembered
    odd = [np.asfortranarray(X) for X in datas[:2]] + [X.astype(np.float32) for X in datas[2:]]
    kept, bases = _addresses._record_addresses(odd)
    assert all(K.flags.c_contiguous and K.dtype == np.float64 and np.array_equal(K, X) for K, X in zip(kept, odd))
    assert bases.tolist() == [K.__array_interface__["data"][0] for K in kept]
    assert tuple(map(id, odd)) not in _addresses._CALL_ADDRESSES
    # a bounded number of calls is remembered
    for _ in range(2 * _addresses._CALL_ADDRESSES_KEPT):
        _addresses._record_addresses([X.copy() for X in datas])
    assert len(_addresses._CALL_ADDRESSES) <= _addresses._CALL_ADDRESSES_KEPT


def test_numpy_blas_single_threaded_sets_and_restores_its_threads():
    from securefkm.algorithms import _numpy_blas

    if _numpy_blas.dgemm() is None:
        pytest.skip("numpy's BLAS is not the OpenBLAS its wheels ship")
    lib = _numpy_blas._CONTROLLER.lib_controllers[0]
    before = lib.get_num_threads()
    lib.set_num_threads(2)
    try:
        with _numpy_blas.single_threaded():
            assert lib.get_num_threads() == 1
        assert lib.get_num_threads() == 2
    finally:
        lib.set_num_threads(before)
