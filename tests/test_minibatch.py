"""Mini-batch federated k-means (Triebe & Rajagopal): exactness, quality, reassignment, errors."""

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import davies_bouldin_score

from securefkm.algorithms._kmeans import assign
from securefkm.algorithms.minibatch import MiniBatchFederatedKMeansAlgorithm, client_kmeans
from securefkm.datasets import triebe_1d
from securefkm.estimators.minibatch import MiniBatchFederatedKMeans
from securefkm.exceptions import InputError
from securefkm.federation import Federation
from securefkm.messages import AggregatedUpdate, Broadcast


def test_full_batch_full_participation_is_lloyd(small_blobs):
    X, _, clients = small_blobs
    C0 = X[:4].copy()
    fed = Federation(MiniBatchFederatedKMeansAlgorithm(4, init=C0, tol=0.0), clients, max_rounds=5, random_state=0)
    fed.run()
    C = C0
    for rec in fed.transcript:
        labels, _ = assign(X, C)
        C = np.array([X[labels == j].mean(0) if np.any(labels == j) else C[j] for j in range(4)])
        assert np.max(np.abs(rec.centres_after - C)) < 1e-9


def test_vectorised_path_equals_client_kmeans(small_blobs):
    _, _, clients = small_blobs
    C = clients[0][:4].copy()
    for beta in (1.0, 0.3):
        algo = MiniBatchFederatedKMeansAlgorithm(4, init=C, client_rate=beta)
        b = Broadcast("train", centres=C, params={"local_epochs": 1, "batch_size": None, "client_rate": beta})
        fast = algo.client_updates(clients, b, [None] * len(clients), [{}] * len(clients))
        for Xi, u in zip(clients, fast):
            lam, wc = client_kmeans(Xi, C, 1, None, beta, None)
            assert np.array_equal(u.sums["sizes"], lam)
            assert np.allclose(u.sums["weighted_centres"], wc, atol=1e-10)


def test_server_rate_follows_update_rule():
    algo = MiniBatchFederatedKMeansAlgorithm(2, init=np.array([[0.0], [10.0]]), server_rate=0.5, reassign=False)
    state = algo.init(2, 1, np.random.default_rng(0))
    agg = AggregatedUpdate(sums={"sizes": np.array([2.0, 0.0]), "weighted_centres": np.array([[4.0], [0.0]])},
                           items={}, contributors=(0, 1))
    new = algo.aggregate(state, agg)
    assert np.array_equal(new.centres, [[1.0], [10.0]])  # 0 + 0.5 (2 - 0); empty cluster unmoved


def test_small_cluster_reassigned_after_patience():
    algo = MiniBatchFederatedKMeansAlgorithm(2, init=np.array([[0.0], [100.0]]), reassign_patience=3, init_bounds=(0, 1))
    state = algo.init(1, 1, np.random.default_rng(0))
    agg = AggregatedUpdate(sums={"sizes": np.array([500.0, 1.0]), "weighted_centres": np.array([[0.0], [100.0]])},
                           items={}, contributors=(0,))
    for _ in range(3):
        state = algo.aggregate(state, agg)
    assert state.reassigned == 1 and 0.0 <= state.centres[1, 0] <= 1.0


def test_triebe_1d_davies_bouldin_not_worse_than_central():
    """Triebe setting (50 clients x 10 points, C=0.2, B=inf, E=1, T=200) over 10 seeds."""
    fed, central = [], []
    for seed in range(10):
        ds = triebe_1d(random_state=seed)
        X = ds.pooled()
        est = MiniBatchFederatedKMeans(5, clients_per_round=0.2, init="uniform", init_bounds=(0.0, 6.0),
                                       max_rounds=200, random_state=seed).fit(ds)
        fed.append(davies_bouldin_score(X, est.labels_))
        central.append(davies_bouldin_score(X, KMeans(5, init="random", n_init=1, random_state=seed).fit(X).labels_))
    assert np.mean(fed) <= np.mean(central)


def test_minibatch_epochs_run_and_use_value_kind():
    ds = triebe_1d(random_state=0)
    est = MiniBatchFederatedKMeans(5, batch_size=4, local_epochs=2, client_rate=0.5, init="uniform",
                                   init_bounds=(0.0, 6.0), max_rounds=20, random_state=0).fit(ds)
    assert est.transcript_[0].specs[1].kind == "value"
    assert est.cluster_centers_.shape == (5, 1)


@pytest.mark.parametrize(
    "kw, name",
    [({"batch_size": 0}, "batch_size"), ({"server_rate": 1.5}, "server_rate"), ({"client_rate": 0.0}, "client_rate"),
     ({"local_epochs": 0}, "local_epochs"), ({"init": "bogus"}, "init")],
)
def test_bad_input_names_argument(kw, name):
    with pytest.raises(InputError, match=name):
        MiniBatchFederatedKMeans(2, **kw).fit([np.arange(10.0).reshape(-1, 1)] * 2)
