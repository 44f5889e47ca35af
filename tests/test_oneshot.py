"""One-shot federated k-means: k-FED (same functions as DWF's kfed init), child/parent, secure mode."""

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.datasets import make_blobs

from securefkm.algorithms import _seeding
from securefkm.algorithms.oneshot import (
    OneShotFederatedKMeansAlgorithm,
    child_split,
    online_mean_update,
)
from securefkm.estimators.oneshot import OneShotFederatedKMeans
from securefkm.exceptions import InputError
from securefkm.federation import Federation
from securefkm.messages import AggregatedUpdate


def _naive_online(C, N, X):
    C, N = C.copy(), N.copy()
    for x in X:  # the notebook's loop
        j = int(np.argmin(((x - C) ** 2).sum(1)))
        C[j] = (C[j] * N[j] + x) / (N[j] + 1)
        N[j] += 1
    return C, N


@pytest.fixture(scope="module")
def three_blobs():
    X, y = make_blobs(2400, centers=3, cluster_std=1.5, random_state=1)
    order = np.argsort(y, kind="stable")  # non-IID: each client holds mostly one blob
    return X, np.array_split(X[order], 8)


def _sse(X, C):
    return float(((X[:, None] - C[None]) ** 2).sum(-1).min(1).sum())


def test_online_update_equals_record_loop():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 3))
    C = rng.normal(size=(6, 3))
    N = rng.integers(1, 5, 6).astype(float)
    a = online_mean_update(C, N, X, block=64)
    b = _naive_online(C, N, X)
    assert np.array_equal(a[1], b[1])
    assert np.max(np.abs(a[0] - b[0])) < 1e-12


def test_child_split_takes_first_quarter_as_update():
    X = np.arange(20.0).reshape(10, 2)
    base, update = child_split(X)
    assert np.array_equal(update, X[:2]) and np.array_equal(base, X[2:])


@pytest.mark.parametrize("secure", [False, True])
def test_child_parent_sse_within_15_percent_of_central(three_blobs, secure):
    X, clients = three_blobs
    central = KMeans(3, n_init=10, random_state=0).fit(X).inertia_
    kw = {"secure_mode": True, "init_bounds": (X.min(), X.max())} if secure else {}
    est = OneShotFederatedKMeans(3, variant="child-parent", random_state=0, **kw).fit(clients)
    assert _sse(X, est.cluster_centers_) <= 1.15 * central
    assert est.n_iter_ == 1


def test_kfed_is_the_dwf_kfed_seeding(three_blobs):
    """Same local_kmeans / weighted_kmeans calls as DWF's init='kfed' -> same centres."""
    _, clients = three_blobs
    algo = OneShotFederatedKMeansAlgorithm(3)
    fed = Federation(algo, clients, max_rounds=1, random_state=5)
    state = fed.run()
    rec = fed.transcript[0]
    # replay the server step with the seeding module on the same items and server rng
    replay_rng = np.random.default_rng(Federation(algo, clients, random_state=5)._algo_seq.spawn(1)[0])
    agg = AggregatedUpdate(sums={}, items=rec.items, contributors=rec.contributors)
    assert np.array_equal(_seeding.seeding_aggregate(agg, 3, replay_rng), state.centres)
    assert all(len(it["centres"]) == 3 for it in rec.items.values())


def test_secure_kfed_hides_local_centres(three_blobs):
    X, clients = three_blobs
    plain = OneShotFederatedKMeans(3, random_state=0).fit(clients)
    secure = OneShotFederatedKMeans(3, secure_mode=True, weighted=True, init_bounds=(X.min(), X.max()), random_state=0).fit(clients)
    assert all(not rec.items for rec in secure.transcript_)
    assert _sse(X, secure.cluster_centers_) <= 1.01 * _sse(X, plain.cluster_centers_)


def test_bad_input_names_argument():
    clients = [np.random.default_rng(i).normal(size=(20, 2)) for i in range(3)]
    with pytest.raises(InputError, match="variant"):
        OneShotFederatedKMeans(2, variant="bogus").fit(clients)
    with pytest.raises(InputError, match="local_k"):
        OneShotFederatedKMeans(2, local_k=0).fit(clients)
    with pytest.raises(InputError, match="N >= 1"):
        online_mean_update(np.zeros((2, 2)), np.array([1.0, 0.0]), np.zeros((3, 2)))
