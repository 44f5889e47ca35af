"""The compiled per-client local k-means (k-means++ seeding, Lloyd): the same bits as a
plain Python reference of the same operations, the same random stream as before, and
k-means quality against scikit-learn."""

import bisect

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.datasets import make_blobs

from securefkm.algorithms import _local
from securefkm.algorithms._kmeans import local_kmeans, seed_kmeans_plusplus


def _sq(a, b):
    s = 0.0
    for x, y in zip(a, b):
        s += (x - y) * (x - y)
    return s


def _reference_seeds(X, k, rng):
    """k-means++ in plain Python, operation by operation as documented in _local_jit."""
    n = len(X)
    trials = 2 + int(np.log(k))
    cdf = np.cumsum(np.ones(n) / n)
    cdf /= cdf[-1]
    first = int(np.searchsorted(cdf, rng.random(), side="right"))
    u = rng.random((k - 1, trials))
    rows = [list(map(float, x)) for x in X]
    seeds = [first]
    closest = [_sq(r, rows[first]) for r in rows]
    for c in range(1, k):
        running, total = [], 0.0
        for v in closest:
            total += v
            running.append(total)
        cands = [min(bisect.bisect_left(running, u[c - 1, t] * total), n - 1) if total > 0 else min(int(u[c - 1, t] * n), n - 1)
                 for t in range(trials)]
        best = None
        for j in cands:
            new = [min(_sq(r, rows[j]), old) for r, old in zip(rows, closest)]
            pot = 0.0
            for v in new:
                pot += v
            if best is None or pot < best[0]:
                best = (pot, j, new)
        seeds.append(best[1])
        closest = best[2]
    return X[seeds]


def _reference_lloyd(X, C, max_iter, abs_tol):
    rows = [list(map(float, x)) for x in X]
    C = [list(map(float, c)) for c in C]
    d = len(rows[0])

    def labels():
        out = []
        for r in rows:
            dist = [_sq(r, c) for c in C]
            out.append(min(range(len(C)), key=lambda j: (dist[j], j)))
        return out

    for _ in range(max_iter):
        lab = labels()
        sums, counts = [[0.0] * d for _ in C], [0.0] * len(C)
        for r, j in zip(rows, lab):
            counts[j] += 1.0
            for t in range(d):
                sums[j][t] += r[t]
        shift = 0.0
        for j in range(len(C)):
            if counts[j] > 0:
                for t in range(d):
                    new = sums[j][t] / counts[j]
                    shift += (new - C[j][t]) * (new - C[j][t])
                    C[j][t] = new
        if shift <= abs_tol:
            break
    return np.array(C), np.array(labels())


@pytest.fixture(params=["numpy", "compiled"])
def impl(request, monkeypatch):
    """Run the local k-means with the numpy reference, or with the compiled loops from the
    first call."""
    if request.param == "compiled":
        pytest.importorskip("numba")
        monkeypatch.setattr(_local, "LOCAL_JIT_MIN_WORK", 0)
    else:
        monkeypatch.setattr(_local, "LOCAL_JIT_MIN_WORK", 1 << 62)
    return request.param


@pytest.mark.parametrize("n,d,k,seed", [(40, 2, 5, 0), (60, 7, 12, 1), (25, 3, 25, 2), (80, 16, 3, 3)])
def test_seeding_matches_python_reference_bit_for_bit(impl, n, d, k, seed):
    X = np.random.default_rng(seed).normal(size=(n, d))
    got = seed_kmeans_plusplus(X, k, np.random.default_rng(seed + 10))
    want = _reference_seeds(X, k, np.random.default_rng(seed + 10))
    assert np.array_equal(got, want)


@pytest.mark.parametrize("n", [1, 40])
@pytest.mark.parametrize("d", [3, 13, 130])
def test_distances_are_sums_feature_by_feature(d, n):
    """Every squared distance is added feature by feature, in numpy and compiled alike: the
    same bits as a Python loop, also past 8 features and for a single record, where a numpy
    sum over the features would add pairwise."""
    rng = np.random.default_rng(d)
    X, C = rng.normal(size=(n, d)) * 10.0 ** rng.integers(-3, 4, size=d), rng.normal(size=(5, d))
    want = np.array([[_sq(x, c) for x in X.tolist()] for c in C.tolist()])
    assert np.array_equal(_local.direct_sq_distances(X, C).T, want)
    jit = pytest.importorskip("securefkm.algorithms._local_jit")
    out = np.empty(len(X))
    for c, row in zip(C, want):
        jit._distances_to(X.T.copy(), c, out)
        assert np.array_equal(out, row)


def test_numpy_and_compiled_local_kmeans_give_the_same_bits(monkeypatch):
    """Both implementations on blob clients of several sizes, with duplicated records and
    fewer records than k: the same centres and sizes, bit for bit."""
    pytest.importorskip("numba")
    cases = []
    for s in range(12):
        n, d, k = [7, 60, 300][s % 3], [1, 5, 32, 300][s % 4], [3, 10, 50][s % 3]
        X, _ = make_blobs(n, d, centers=4, random_state=s)
        cases.append((np.round(X) if s % 4 == 0 else X, k, s))
    runs = {}
    for name, threshold in (("numpy", 1 << 62), ("compiled", 0)):
        monkeypatch.setattr(_local, "LOCAL_JIT_MIN_WORK", threshold)
        runs[name] = [local_kmeans(X, k, np.random.default_rng(s)) for X, k, s in cases]
    for (Ca, sa), (Cb, sb) in zip(runs["numpy"], runs["compiled"]):
        assert np.array_equal(Ca, Cb) and np.array_equal(sa, sb)


def test_seeding_draws_the_same_stream_as_choice_then_random_per_step(impl):
    """The first seed as rng.choice(n, p=...), then rng.random(trials) per later seed: a
    caller's generator ends in the same state as with the per-step draws of the numpy loop."""
    X = np.random.default_rng(0).normal(size=(50, 3))
    k, trials = 8, 2 + int(np.log(8))
    rng = np.random.default_rng(7)
    seeds = seed_kmeans_plusplus(X, k, rng)
    ref = np.random.default_rng(7)
    first = ref.choice(50, p=np.ones(50) / 50)
    for _ in range(k - 1):
        ref.random(trials)
    assert seeds[0].tolist() == X[first].tolist()
    assert rng.random() == ref.random()


@pytest.mark.parametrize("which", ["numpy", "compiled"])
def test_local_lloyd_matches_python_reference_bit_for_bit(which):
    X, _ = make_blobs(90, 4, centers=4, random_state=3)
    X = np.ascontiguousarray(X)
    C0 = X[[0, 10, 20, 30, 40]].copy()
    C = C0.copy()
    module = _local if which == "numpy" else pytest.importorskip("securefkm.algorithms._local_jit")
    labels, d2 = module.lloyd(X, X.T.copy(), C, 50, 1e-6)
    want_C, want_labels = _reference_lloyd(X, C0, 50, 1e-6)
    assert np.array_equal(C, want_C)
    assert labels.tolist() == want_labels.tolist()
    assert np.array_equal(d2, [_sq(x, want_C[j]) for x, j in zip(X.tolist(), want_labels)])


def test_local_kmeans_quality_close_to_sklearn(impl):
    """Over 20 clients of 5-blob data, the local k-means loss is within 2 % of scikit-learn's
    KMeans (k-means++, one init each) in total."""
    ours, theirs = 0.0, 0.0
    for s in range(20):
        X, _ = make_blobs(200, 5, centers=5, cluster_std=1.5, random_state=s)
        C, sizes = local_kmeans(X, 5, np.random.default_rng(s))
        assert sizes.sum() == len(X)
        ours += ((X[:, None, :] - C[None]) ** 2).sum(-1).min(1).sum()
        theirs += KMeans(5, n_init=1, random_state=s).fit(X).inertia_
    assert ours <= 1.02 * theirs


def test_local_kmeans_caps_k_at_distinct_records(impl):
    """Three distinct values (repeated) and k = 5: one centre per value, sized by its count;
    fewer records than k: at most one centre per record."""
    X = np.repeat(np.array([[0.0, 0.0], [1.0, 2.0], [5.0, 5.0]]), [4, 2, 3], axis=0)
    C, sizes = local_kmeans(X, 5, np.random.default_rng(0))
    got = sorted(zip(map(tuple, C), sizes))
    assert got == [((0.0, 0.0), 4.0), ((1.0, 2.0), 2.0), ((5.0, 5.0), 3.0)]
    C, sizes = local_kmeans(np.arange(6.0).reshape(3, 2), 10, np.random.default_rng(0))
    assert len(C) == 3 and sizes.tolist() == [1.0, 1.0, 1.0]


def test_local_kmeans_refuses_an_empty_client():
    from securefkm.exceptions import InputError

    with pytest.raises(InputError, match="without records"):
        local_kmeans(np.empty((0, 3)), 2, np.random.default_rng(0))


def test_small_fits_never_import_numba_large_seeding_rounds_do():
    """A small k-FED-seeded fit runs the numpy twin (no numba import, no compilation);
    once a process's local k-means work passes LOCAL_JIT_MIN_WORK the compiled loops run."""
    from _numba_imports import numba_imported

    small = ("from securefkm import WeightedFederatedKMeans\n"
             "X = rng.normal(size=(400, 2))\n"
             "WeightedFederatedKMeans(3, init='kfed', random_state=0, max_rounds=2).fit(X, groups=np.arange(400) % 8)")
    large = ("from securefkm.algorithms._kmeans import local_kmeans\n"
             "for i in range(60):\n"
             "    local_kmeans(rng.normal(size=(100, 2)), 50, np.random.default_rng(i))")
    assert numba_imported(small, large) == ["False", "True"]
