import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import davies_bouldin_score, silhouette_score

from securefkm import metrics as m
from securefkm.datasets import dwf_blobs, split_non_iid
from securefkm.exceptions import InputError


@pytest.fixture(scope="module")
def data():
    X, y = dwf_blobs(n_samples=600, n_noise=20)
    km = KMeans(n_clusters=5, n_init=3, random_state=0, tol=0).fit(X)
    C = km.cluster_centers_
    for _ in range(100):  # iterate to an exact Lloyd fixed point: centres = means of their records
        lab = m.assign(X, C)
        new = np.array([X[lab == k].mean(0) for k in range(5)])
        if np.array_equal(new, C):
            break
        C = new
    parts = split_non_iid(X, n_clients=7, random_state=0)
    return X, y, C, parts


def test_assign_ties_to_lowest_index():
    X = np.array([[0.0], [0.9], [-2.0]])
    C = np.array([[-1.0], [1.0], [1.0]])
    assert m.assign(X, C).tolist() == [0, 1, 0]


def test_kmeans_score_exact_values():
    X = np.array([[0.0, 0.0], [2.0, 0.0], [10.0, 0.0]])
    C = np.array([[1.0, 0.0], [10.0, 1.0]])
    assert m.sse(X, C) == 3.0
    assert m.kmeans_score(X, C) == 1.0
    assert m.mean_intra_cluster_distance(X, C) == 1.0
    assert m.kmeans_score_terms(X, C) == {"inertia": 3.0, "count": 3.0}


def test_federated_equals_central(data):
    X, _, C, parts = data
    clients = [X[p] for p in parts]
    t_score = [m.kmeans_score_terms(c, C) for c in clients]
    assert abs(m.federated_kmeans_score(t_score) - m.kmeans_score(X, C)) < 1e-12
    assert abs(m.federated_kmeans_score(m.sum_terms(t_score)) - m.kmeans_score(X, C)) < 1e-12
    t_sil = [m.simplified_silhouette_terms(c, C) for c in clients]
    assert abs(m.federated_simplified_silhouette(t_sil) - m.simplified_silhouette(X, C)) < 1e-12
    t_db = [m.davies_bouldin_terms(c, C) for c in clients]
    central_db = m.federated_davies_bouldin(m.davies_bouldin_terms(X, C), C)
    assert abs(m.federated_davies_bouldin(t_db, C) - central_db) < 1e-12
    assert (
        abs(m.federated_mean_intra_cluster_distance(t_db) - m.mean_intra_cluster_distance(X, C))
        < 1e-12
    )


def test_federated_db_matches_sklearn(data):
    X, _, C, parts = data
    lab = m.assign(X, C)
    terms = [m.davies_bouldin_terms(X[p], C) for p in parts]
    assert np.isclose(
        m.federated_davies_bouldin(terms, C), davies_bouldin_score(X, lab), rtol=1e-10, atol=0
    )
    assert m.davies_bouldin(X, lab) == davies_bouldin_score(X, lab)


def test_federated_db_hand_example_and_empty_cluster():
    X = np.array([[0.0], [2.0], [10.0], [12.0]])
    C = np.array([[1.0], [11.0], [100.0]])  # third centre gets no record
    t = m.davies_bouldin_terms(X, C)
    assert t["count"].tolist() == [2.0, 2.0, 0.0] and t["dist_sum"].tolist() == [2.0, 2.0, 0.0]
    # S = (1, 1), M = 10 -> R = 0.2 for both clusters; the empty cluster is skipped
    assert m.federated_davies_bouldin(t, C) == pytest.approx(0.2, abs=1e-15)
    with pytest.raises(InputError, match="at least 2 non-empty"):
        m.federated_davies_bouldin(m.davies_bouldin_terms(X[:2], C), C)


def test_simplified_silhouette_hand_example():
    X = np.array([[0.0], [3.0]])
    C = np.array([[0.0], [4.0]])
    # record 0: a=0, b=4 -> 1 ; record 1: a=1, b=3 -> 2/3
    assert m.simplified_silhouette(X, C) == pytest.approx((1 + 2 / 3) / 2, abs=1e-15)
    with pytest.raises(InputError, match="at least 2 centres"):
        m.simplified_silhouette(X, C[:1])


def test_accuracy_majority_vs_hungarian():
    y_true = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    y_pred = np.array([0, 0, 1, 1, 2, 2, 2, 2])
    # majority: cluster 0 -> 0 (2), cluster 1 -> 0 (2), cluster 2 -> 1 or 2 (2): 6/8
    assert m.accuracy(y_true, y_pred) == 0.75
    # one-to-one: 0->0 (2), 2->1 or 2 (2), 1->remaining label (0): 4/8
    assert m.accuracy(y_true, y_pred, matching="hungarian") == 0.5
    perm = np.array([2, 0, 1])[y_true]
    assert m.accuracy(y_true, perm, matching="hungarian") == 1.0 == m.accuracy(y_true, perm)
    with pytest.raises(InputError, match="matching"):
        m.accuracy(y_true, y_pred, matching="best")


def test_ari_v_measure_silhouette_wrappers(data):
    X, y, C, _ = data
    lab = m.assign(X, C)
    assert m.ari(y, y) == 1.0 and m.v_measure(y, y) == 1.0
    assert m.ari([0, 0, 1, 1], [1, 1, 0, 0]) == 1.0
    assert m.silhouette(X, lab) == silhouette_score(X, lab)
    s1 = m.silhouette(X, lab, sample_size=200, random_state=3)
    assert s1 == m.silhouette(X, lab, sample_size=200, random_state=3)


def test_bad_inputs():
    X = np.zeros((3, 2))
    with pytest.raises(InputError, match="centres has 3 features but X has 2"):
        m.kmeans_score(X, np.zeros((2, 3)))
    with pytest.raises(InputError, match="X contains NaN"):
        m.sse(np.array([[np.nan, 0.0]]), np.zeros((1, 2)))
    with pytest.raises(InputError, match="y_true has 2 labels but y_pred has 3"):
        m.ari([0, 1], [0, 1, 1])
    with pytest.raises(InputError, match="missing"):
        m.federated_kmeans_score([{"inertia": 1.0}])
    with pytest.raises(InputError, match="terms\\[1\\] has keys"):
        m.federated_kmeans_score([{"inertia": 1.0, "count": 1.0}, {"inertia": 1.0}])
    with pytest.raises(InputError, match="same centres"):
        m.federated_davies_bouldin({"dist_sum": np.zeros(2), "count": np.ones(2)}, np.zeros((3, 2)))
