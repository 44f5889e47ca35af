"""DWF / EWF k-means (Holzer et al. 2023): exactness, quality, fallback, errors."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.cluster import KMeans
from sklearn.datasets import load_digits

from securefkm.algorithms._kmeans import assign
from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
from securefkm.estimators.dwf import WeightedFederatedKMeans
from securefkm.exceptions import InputError
from securefkm.federation import Federation
from securefkm.messages import Broadcast


def central_lloyd(X, C, rounds):
    out = []
    for _ in range(rounds):
        labels = np.argmin(((X[:, None, :] - C[None]) ** 2).sum(-1), axis=1)
        new = C.copy()
        for j in range(len(C)):
            if np.any(labels == j):
                new[j] = X[labels == j].mean(axis=0)
        C = new
        out.append(C)
    return out


def test_one_step_full_participation_is_central_lloyd(small_blobs):
    """Eq. 2: one local step, all clients, eta=1, mu=0 -> Lloyd on the pooled data."""
    X, _, clients = small_blobs
    C0 = X[[0, 1, 2, 3]].copy()
    algo = WeightedFederatedKMeansAlgorithm(4, init=C0, tol=0.0)
    fed = Federation(algo, clients, max_rounds=12, random_state=0)
    fed.run()
    expected = central_lloyd(X, C0, 12)
    assert len(fed.transcript) == 12
    for record, ref in zip(fed.transcript, expected):
        assert np.max(np.abs(record.centres_after - ref)) < 1e-9


def test_vectorised_clients_equal_per_client_loop(small_blobs):
    X, _, clients = small_blobs
    C = X[:4].copy()
    algo = WeightedFederatedKMeansAlgorithm(4, init=C)
    b = Broadcast("train", centres=C, params={"max_local_steps": 1, "local_tol": 0.0, "weighting": "dynamic"})
    batched = algo.client_updates(clients, b, [None] * len(clients), [{}] * len(clients))
    for Xi, u in zip(clients, batched):
        labels, _ = assign(Xi, C)
        counts = np.bincount(labels, minlength=4)
        sums = np.array([Xi[labels == j].sum(axis=0) for j in range(4)])
        assert np.array_equal(u.sums["weights"], counts)
        assert np.allclose(u.sums["weighted_centres"], sums, atol=1e-12)


def test_learning_rate_and_momentum_follow_eq6(small_blobs):
    X, _, clients = small_blobs
    C0 = X[:4].copy()
    eta, mu = 0.3, 0.5
    algo = WeightedFederatedKMeansAlgorithm(4, init=C0, learning_rate=eta, momentum=mu, tol=0.0)
    fed = Federation(algo, clients, max_rounds=3, random_state=0)
    fed.run()
    C_prev, C = C0, C0
    for record in fed.transcript:
        D = central_lloyd(X, C, 1)[0]
        expected = C + eta * (D - C) + mu * (C - C_prev)
        assert np.allclose(record.centres_after, expected, atol=1e-12)
        C_prev, C = C, record.centres_after


def test_zero_weight_fallback_keeps_unreached_centre():
    """Eq. 4: a cluster no participant's record reaches keeps its centre (no relocation)."""
    clients = [np.array([[0.0, 0.0], [0.1, 0.0]]), np.array([[1.0, 1.0], [1.1, 1.0]])]
    far = np.array([[0.0, 0.0], [1.0, 1.0], [50.0, 50.0]])
    algo = WeightedFederatedKMeansAlgorithm(3, init=far, tol=0.0)
    fed = Federation(algo, clients, max_rounds=2, random_state=0)
    state = fed.run()
    assert np.array_equal(state.centres[2], far[2])
    assert np.allclose(state.centres[:2], [[0.05, 0.0], [1.05, 1.0]])


def test_zero_weight_fallback_averages_local_centres_with_several_steps():
    """With several local steps a centre with zero weights (w.r.t. the broadcast) can still move
    locally; eq. 4 then averages the participants' local centres equally."""
    X = np.array([[0.0], [1.0], [10.0], [11.0]])
    C0 = np.array([[0.5], [10.5], [6.0]])
    algo = WeightedFederatedKMeansAlgorithm(3, init=C0, max_local_steps=3, tol=0.0)
    b = algo.configure(algo.init(1, 1, np.random.default_rng(0)), 0)
    upd = algo.client_update(X, b, None)
    assert upd.sums["weights"][2] == 0
    state = algo.init(1, 1, np.random.default_rng(0))
    from securefkm.messages import AggregatedUpdate

    new = algo.aggregate(state, AggregatedUpdate(upd.sums, {}, (0,)))
    assert np.allclose(new.centres[2], upd.sums["centres"][2])


def test_dwf_non_iid_blobs_matches_best_central(blobs_noniid):
    """Mean DWF score over 10 seeds within 1% of the best of 10 central k-means runs."""
    X, clients = blobs_noniid
    central = min(KMeans(5, n_init=1, random_state=s).fit(X).inertia_ / len(X) for s in range(10))
    scores = []
    for seed in range(10):
        est = WeightedFederatedKMeans(5, random_state=seed).fit(clients)
        scores.append(est.inertia_ / len(X))
    assert np.mean(scores) <= 1.01 * central


def test_ewf_clearly_worse_than_dwf_on_non_iid_digits():
    X, _ = load_digits(return_X_y=True)
    X = X.astype(float)
    labels = KMeans(20, max_iter=5, n_init=5, random_state=0).fit(X).labels_
    clients = [X[labels == i] for i in range(20)]
    res = {}
    for weighting in ("dynamic", "equal"):
        res[weighting] = np.mean(
            [WeightedFederatedKMeans(10, weighting=weighting, max_rounds=40, random_state=s).fit(clients).inertia_ for s in range(3)]
        )
    assert res["equal"] > 1.15 * res["dynamic"]


def test_n_init_keeps_run_with_lowest_federated_score(blobs_noniid):
    X, clients = blobs_noniid
    est = WeightedFederatedKMeans(5, init="k-means++", n_init=4, random_state=1).fit(clients)
    scores = [r.aggregate["inertia"][0] / r.aggregate["count"][0] for r in est.transcript_.with_action("score")]
    assert len(scores) == 4
    assert est.federated_score_ == pytest.approx(min(scores))
    assert est.inertia_ / len(X) == pytest.approx(min(scores), rel=1e-9)


def test_patience_rule_stops_when_movement_stalls():
    from securefkm.federation.convergence import has_converged

    assert not has_converged([5.0, 4.0, 3.0], tol=0.1, patience=2)
    assert has_converged([5.0, 1.0, 2.0, 1.5], tol=0.1, patience=2)
    assert has_converged([5.0, 0.05], tol=0.1, patience=None)


def test_partial_participation_and_transcript(small_blobs):
    X, _, clients = small_blobs
    est = WeightedFederatedKMeans(4, clients_per_round=3, max_rounds=5, tol=0.0, random_state=0).fit(clients)
    train = est.transcript_.with_action("train")
    assert len(train) == 5
    for r in train:
        assert len(r.sampled) == 3
        plain = r.plain_sums()
        assert set(plain) == set(r.sampled)
        total = sum(plain[c]["weights"] for c in r.sampled)
        assert np.array_equal(total, r.aggregate["weights"])
        assert total.sum() == sum(len(clients[c]) for c in r.sampled)


def test_dropout_schedule_removes_client_from_aggregate(small_blobs):
    X, _, clients = small_blobs
    est = WeightedFederatedKMeans(
        4, init=X[:4], max_rounds=2, tol=0.0, dropout_rate={0: [1, 2]}, random_state=0
    ).fit(clients)
    first = est.transcript_[0]
    assert first.contributors == (0, 3, 4, 5)
    assert first.aggregate["weights"].sum() == sum(len(clients[c]) for c in (0, 3, 4, 5))


def test_estimator_surface(small_blobs):
    _, y_orig, clients = small_blobs
    X = np.vstack(clients)  # labels_ follow the pooled order: client 0's records first
    perm = np.concatenate(np.array_split(np.random.default_rng(3).permutation(len(X)), 6))
    y = y_orig[perm]
    est = WeightedFederatedKMeans(4, random_state=0)
    assert clone(est).get_params() == est.get_params()
    labels = est.fit_predict(clients)
    assert labels.shape == (len(X),)
    assert np.array_equal(est.predict(X), labels)
    assert est.transform(X).shape == (len(X), 4)
    assert est.score(X) == pytest.approx(-est.inertia_)
    from sklearn.metrics import adjusted_rand_score

    assert adjusted_rand_score(y, labels) > 0.95


@pytest.mark.parametrize(
    "clients, kwargs, needle",
    [
        ([np.array([[np.nan, 1.0]]), np.ones((3, 2))], {}, "NaN"),
        ([np.array([[np.inf, 1.0]]), np.ones((3, 2))], {}, "infinity"),
        ([np.ones(3), np.ones(3)], {}, "2-D"),
        ([[[1.0, 2.0], [3.0]], np.ones((3, 2))], {}, "clients[0]"),
        ([np.ones((0, 2)), np.ones((3, 2))], {}, "clients[0]"),
        ([np.ones((3, 2)), np.ones((3, 2))], {"n_clusters": 7}, "n_clusters"),
        ([np.ones((3, 2)), np.ones((3, 2))], {"weighting": "dynamical"}, "weighting"),
        ([np.ones((3, 2)), np.ones((3, 2))], {"learning_rate": 1.5}, "learning_rate"),
        ([np.ones((3, 2)), np.ones((3, 2))], {"clients_per_round": 5}, "clients_per_round"),
        ([np.ones((3, 2)), np.ones((3, 2))], {"init": "kmeans"}, "init"),
        ([np.ones((3, 2)), np.ones((3, 2))], {"protection": "masking"}, "protection"),
    ],
)
def test_bad_input_names_the_argument(clients, kwargs, needle):
    params = {"n_clusters": 2, "random_state": 0, **kwargs}
    with pytest.raises(InputError) as exc:
        WeightedFederatedKMeans(**params).fit(clients)
    assert needle in str(exc.value)


def test_private_seeding_alone_is_near_optimal_on_blobs(blobs_noniid):
    """init='private' (a sum-field round over a data-independent grid) lands within 1% of the
    best central score before any training round (0.0750 vs 0.0745 on seed 0)."""
    X, clients = blobs_noniid
    central = min(KMeans(5, n_init=1, random_state=s).fit(X).inertia_ / len(X) for s in range(10))
    algo = WeightedFederatedKMeansAlgorithm(5, init="private", init_bounds=(-2, 2), tol=0.0)
    fed = Federation(algo, clients, max_rounds=1, random_state=0)
    fed.run()
    seeding = fed.transcript[0]
    assert seeding.action == "init.private" and set(seeding.aggregate) == {"bucket_counts", "bucket_sums"}
    _, d2 = assign(X, seeding.centres_after)
    assert d2.mean() <= 1.01 * central
