"""Federated fuzzy c-means and FedFuzzDB (Stallmann & Wilbik 2022): exactness, the
motivational example, knowledge gap, secure rounds and input errors."""

import warnings

import numpy as np
import pytest
from sklearn.base import clone

from securefkm.algorithms._fcm import fcm_step, fuzzy_cmeans, fuzzy_memberships, local_fcm
from securefkm.algorithms.fuzzy import FederatedFuzzyCMeansAlgorithm
from securefkm.datasets import stallmann_motivational
from securefkm.estimators.fuzzy import (
    FederatedFuzzyCMeans,
    elbow_k,
    select_n_clusters,
    suggest_k_range,
)
from securefkm.exceptions import InputError
from securefkm.federation import Federation
from securefkm.messages import Broadcast
from securefkm.metrics_fuzzy import (
    federated_fuzzy_davies_bouldin,
    federated_fuzzy_davies_bouldin_terms,
    fuzzy_davies_bouldin,
    knowledge_gap,
)

MU = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.5, 0.5]])


@pytest.fixture(scope="module")
def motivational():
    return stallmann_motivational(random_state=0)


@pytest.fixture(scope="module")
def blobs3():
    rng = np.random.default_rng(7)
    centres = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]])
    X = np.vstack([c + rng.normal(size=(150, 2)) for c in centres])
    parts = np.array_split(rng.permutation(len(X)), 4)
    return X, [X[p] for p in parts]


# ----------------------------------------------------------------- kernels
def naive_memberships(X, C, m):
    d = np.sqrt(((X[:, None, :] - C[None]) ** 2).sum(-1))
    ratio = (d[:, :, None] / d[:, None, :]) ** (2.0 / (m - 1.0))
    return 1.0 / ratio.sum(axis=2)


@pytest.mark.parametrize("m", [2.0, 1.5, 3.0])
def test_memberships_follow_eq5(m):
    rng = np.random.default_rng(0)
    X, C = rng.normal(size=(200, 3)), rng.normal(size=(4, 3))
    U = fuzzy_memberships(X, C, m)
    assert np.allclose(U, naive_memberships(X, C, m), rtol=1e-12, atol=1e-14)
    assert np.allclose(U.sum(axis=1), 1.0)


def test_memberships_on_a_centre_are_crisp():
    C = np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [5.0, 5.0]])
    X = np.array([[0.0, 0.0], [1.0, 1.0], [1e-300, 0.0]])
    U = fuzzy_memberships(X, C, 2.0)
    assert np.array_equal(U[0], [1.0, 0.0, 0.0, 0.0])
    assert np.array_equal(U[1], [0.0, 0.5, 0.5, 0.0])  # coinciding centres share it
    assert U[2, 0] == pytest.approx(1.0) and np.all(np.isfinite(U))


def test_central_fcm_decreases_objective_and_converges(blobs3):
    X, _ = blobs3
    C, U, n_iter = fuzzy_cmeans(X, 3, random_state=0, tol=1e-6)
    assert n_iter < 300
    # at convergence the centres are the fixed point of eq. 6 for these memberships
    W = U**2
    assert np.allclose(C, (W.T @ X) / W.sum(0)[:, None], atol=1e-4)
    assert knowledge_gap(C, np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]]), X) < 0.05


# ----------------------------------------------------------------- fed averaging = central FCM
def test_fedavg_one_client_equals_central_fcm_steps(blobs3):
    X, _ = blobs3
    C0 = X[[0, 200, 400]].copy()
    algo = FederatedFuzzyCMeansAlgorithm(
        3, averaging="fedavg", init=C0, global_tol=0.0, validity_round=False
    )
    fed = Federation(algo, [X], max_rounds=6, random_state=0)
    fed.run()
    C = C0
    assert len(fed.transcript) == 6
    for record in fed.transcript:
        C, _ = fcm_step(X, C, 2.0)
        assert np.max(np.abs(record.centres_after - C)) < 1e-10


def test_fedavg_full_participation_equals_central_fcm_on_pooled(blobs3):
    X, clients = blobs3
    pooled = np.vstack(clients)
    C0 = X[[0, 200, 400]].copy()
    algo = FederatedFuzzyCMeansAlgorithm(
        3, averaging="fedavg", m=1.7, init=C0, global_tol=0.0, validity_round=False
    )
    fed = Federation(algo, clients, max_rounds=4, random_state=0)
    state = fed.run()
    C = C0
    for _ in range(4):
        C, _ = fcm_step(pooled, C, 1.7)
    assert np.max(np.abs(state.centres - C)) < 1e-10


def test_fedavg_vectorised_clients_equal_loop(blobs3):
    _, clients = blobs3
    C = clients[0][:3].copy()
    algo = FederatedFuzzyCMeansAlgorithm(3, averaging="fedavg", init=C)
    b = Broadcast("train.fedavg", centres=C, params={"m": 2.0})
    batched = algo.client_updates(clients, b, [None] * 4, [{}] * 4)
    for Xi, u in zip(clients, batched):
        single = algo.client_update(Xi, b, None, {})
        for k in single.sums:
            assert np.allclose(u.sums[k], single.sums[k], rtol=1e-12, atol=1e-12)


def test_kmeans_averaging_server_sees_only_local_centres(blobs3):
    _, clients = blobs3
    algo = FederatedFuzzyCMeansAlgorithm(3, init=clients[0][:3].copy())
    fed = Federation(algo, clients, max_rounds=20, random_state=0)
    state = fed.run()
    train = [r for r in fed.transcript if r.action == "train.local_fcm"]
    assert train and all(r.aggregate == {} for r in train)
    for r in train:
        assert set(r.items) == {0, 1, 2, 3}
        assert all(set(v) == {"centres"} and v["centres"].shape == (3, 2) for v in r.items.values())
    assert fed.transcript[-1].action == "validity"
    assert state.movements[-1] <= 1e-3


# ----------------------------------------------------------------- FedFuzzDB
def naive_fuzzy_db(X, C, m=2.0):
    U = naive_memberships(X, C, m)
    K = len(C)
    S = [U[:, i].mean() * np.mean(np.linalg.norm(X - C[i], axis=1)) for i in range(K)]
    R = [
        max((S[i] + S[j]) / np.linalg.norm(C[i] - C[j]) for j in range(K) if j != i)
        for i in range(K)
    ]
    return float(np.mean(R))


def test_fuzzy_db_matches_the_definition(blobs3):
    X, _ = blobs3
    C = np.array([[0.1, 0.0], [4.0, 0.2], [0.0, 3.9], [2.0, 2.0]])
    assert fuzzy_davies_bouldin(X, C) == pytest.approx(naive_fuzzy_db(X, C), rel=1e-12)


def test_federated_fuzzy_db_equals_central_on_pooled(motivational):
    X = motivational.pooled()
    C, U, _ = fuzzy_cmeans(X, 5, random_state=0)
    terms = [federated_fuzzy_davies_bouldin_terms(Xi, C) for Xi in motivational.clients]
    summed = {k: sum(t[k] for t in terms) for k in terms[0]}
    central = fuzzy_davies_bouldin(X, C)
    assert abs(federated_fuzzy_davies_bouldin(summed, C) - central) < 1e-10
    assert abs(fuzzy_davies_bouldin(X, C, memberships=U) - central) < 1e-10
    # and the protocol's validity round gives the same number from its summed fields
    algo = FederatedFuzzyCMeansAlgorithm(5, init=C, global_tol=1e9)
    state = Federation(algo, motivational.clients, max_rounds=5, random_state=0).run()
    assert abs(state.score - fuzzy_davies_bouldin(X, state.centres)) < 1e-10


def test_knowledge_gap_pairs_centres_and_scales_by_variance():
    X = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 4.0], [2.0, 4.0]])  # var = (1, 4)
    ref = np.array([[0.0, 0.0], [2.0, 4.0]])
    assert knowledge_gap(ref[::-1], ref, X) == 0.0
    assert knowledge_gap(ref + [1.0, 2.0], ref, X) == pytest.approx(2 * (1.0 / 1 + 4.0 / 4))


# ----------------------------------------------------------------- the paper's experiment
@pytest.fixture(scope="module")
def motivational_selection(motivational):
    return select_n_clusters(motivational, 2, 8, random_state=1, local_k_max=5)


def test_framework_finds_five_clusters_that_no_client_sees(motivational, motivational_selection):
    """Sec. 3.2.1 / Table 1: FedFuzzDB is minimal at K=5; every client alone picks K=2
    (local K in 2..5, as in the paper's local columns)."""
    r = motivational_selection
    assert r.best_k == 5
    assert r.local_best_k == {0: 2, 1: 2, 2: 2}
    assert set(r.local_scores[0]) == {2, 3, 4, 5}
    assert knowledge_gap(r.centres[5], MU, motivational.pooled()) < 0.05


def test_kmeans_averaging_has_lower_knowledge_gap_than_fedavg(motivational):
    """Sec. 3.2.1 / Table 2: on the non-IID clients, from the same start (k-means++ on one
    client), federated averaging misses the global structure, k-means averaging finds it."""
    X = motivational.pooled()
    gaps = {}
    for averaging in ("kmeans", "fedavg"):
        gaps[averaging] = [
            knowledge_gap(
                FederatedFuzzyCMeans(5, averaging=averaging, random_state=s)
                .fit(motivational)
                .cluster_centers_,
                MU,
                X,
            )
            for s in (1, 2)
        ]
    assert max(gaps["kmeans"]) < 0.05
    assert min(gaps["fedavg"]) > 5 * max(gaps["kmeans"])


def test_rule_of_thumb_range(motivational):
    r = suggest_k_range(motivational, 5, random_state=0)
    assert r.local_k == {0: 2, 1: 2, 2: 2}
    assert (r.k_min, r.k_max, r.k_sum) == (2, 4, 6)


def test_elbow_definition():
    assert elbow_k({2: 1.0, 3: 0.4, 4: 0.35, 5: 0.3, 6: 0.28}) == 3
    assert elbow_k({2: 1.0, 3: 0.9}) == 3  # too few points: minimum
    assert elbow_k({2: 0.5, 3: 0.6, 4: 0.7}) == 2  # nothing below the chord: minimum


# ----------------------------------------------------------------- estimator surface
def test_estimator_surface(blobs3):
    X, clients = blobs3
    est = FederatedFuzzyCMeans(3, random_state=0).fit(clients)
    P = est.predict_proba(X[:50])
    assert P.shape == (50, 3) and np.allclose(P.sum(1), 1.0)
    assert np.array_equal(est.predict(X[:50]), P.argmax(1))
    assert est.fuzzy_index_ == pytest.approx(
        fuzzy_davies_bouldin(np.vstack(clients), est.cluster_centers_), abs=1e-10
    )
    assert clone(est).get_params()["m"] == 2.0


def test_secure_mode_under_pairwise_masking(motivational):
    masking = pytest.importorskip("protocols.masking")
    est = FederatedFuzzyCMeans(
        5,
        secure_mode=True,
        init_bounds=(-0.6, 1.6),
        protection=[masking.PairwiseMasking()],
        random_state=1,
        max_rounds=200,
    ).fit(motivational)
    assert all(not r.items for r in est.transcript_)  # no client's local centres, ever
    assert any(r.action == "secure.kmeans" for r in est.transcript_)
    assert knowledge_gap(est.cluster_centers_, MU, motivational.pooled()) < 0.05
    assert est.fuzzy_index_ == pytest.approx(
        fuzzy_davies_bouldin(motivational.pooled(), est.cluster_centers_), abs=1e-6
    )


# ----------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"averaging": "mean"}, "averaging"),
        ({"m": 1.0}, "m"),
        ({"local_tol": -1.0}, "local_tol"),
        ({"n_clusters": 1}, "n_clusters"),
        ({"centre_weights": "size"}, "centre_weights"),
        ({"averaging": "fedavg", "secure_mode": True}, "secure_mode"),
    ],
)
def test_bad_estimator_parameters_name_the_argument(blobs3, kwargs, word):
    _, clients = blobs3
    params = {"n_clusters": 3, **kwargs}
    est = FederatedFuzzyCMeans(**params)
    assert est.get_params()[next(iter(kwargs))] == kwargs[next(iter(kwargs))]  # stored unchanged
    with pytest.raises(InputError, match=word):
        est.fit(clients)


def test_bad_metric_and_selection_inputs(blobs3):
    X, clients = blobs3
    with pytest.raises(InputError, match="X"):
        fuzzy_davies_bouldin(np.array([[np.nan, 0.0]]), np.eye(2))
    with pytest.raises(InputError, match="centres"):
        fuzzy_davies_bouldin(X, np.zeros((1, 2)))
    with pytest.raises(InputError, match="reference_centres"):
        knowledge_gap(np.zeros((2, 2)), np.zeros((3, 2)), X)
    with pytest.raises(InputError, match="summed_terms"):
        federated_fuzzy_davies_bouldin({"n": [10]}, np.eye(2))
    with pytest.raises(InputError, match="k_max"):
        select_n_clusters(clients, 4, 3)
    with pytest.raises(InputError, match="n_clusters"):
        fuzzy_cmeans(X[:2], 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fuzzy_memberships(np.zeros((2, 2)), np.zeros((2, 2)))  # all distances zero: no warning


def test_local_fcm_stops_at_tolerance(blobs3):
    X, _ = blobs3
    C, U, n = local_fcm(X, X[:3].copy(), 2.0, tol=1e-3)
    C2, U2, _ = local_fcm(X, C, 2.0, tol=1e-3, max_iter=1)
    assert np.max(np.abs(U2 - U)) <= 1e-3 * 5
    assert n >= 2
