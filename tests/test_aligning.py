"""Garst & Reinders FKM and the secure server k-means: quality on the grid, exactness, errors."""

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from securefkm.algorithms import secure_centres as sc
from securefkm.algorithms._kmeans import local_kmeans
from securefkm.algorithms.aligning import (
    AligningFederatedKMeansAlgorithm,
    client_weighted_ari,
    fkm_local_step,
    pooled_ari,
)
from securefkm.algorithms.oneshot import OneShotFederatedKMeansAlgorithm
from securefkm.datasets import garst_federated
from securefkm.estimators.aligning import AligningFederatedKMeans
from securefkm.exceptions import InputError
from securefkm.federation import Federation
from securefkm.messages import Broadcast


def _scores(beta, seeds, secure=False):
    out = {"central": [], "fkm": [], "fkm_weighted": [], "kfed": []}
    for s in seeds:
        ds = garst_federated(beta, random_state=s)
        X, y = ds.pooled(), np.concatenate(ds.labels)
        out["central"].append(adjusted_rand_score(y, KMeans(16, n_init=10, random_state=s).fit(X).labels_))
        kw = {"secure_mode": True, "init_bounds": (-12.5, 12.5)} if secure else {}
        st = Federation(AligningFederatedKMeansAlgorithm(16, **kw), ds.clients, max_rounds=100, random_state=s).run()
        out["fkm"].append(pooled_ari(st.centres, ds.clients, ds.labels))
        out["fkm_weighted"].append(client_weighted_ari(st.centres, ds.clients, ds.labels))
        st = Federation(OneShotFederatedKMeansAlgorithm(16, local_k=16), ds.clients, max_rounds=1, random_state=s).run()
        out["kfed"].append(pooled_ari(st.centres, ds.clients, ds.labels))
    return {k: float(np.mean(v)) for k, v in out.items()}


@pytest.mark.parametrize("beta", [0.1, 1, 10])
def test_grid_matches_central_and_beats_kfed(beta):
    """Garst grid, 4 clients: pooled ARI within 0.02 of central k-means, above k-FED (k'=k)."""
    r = _scores(beta, range(3))
    assert abs(r["fkm"] - r["central"]) <= 0.02
    assert r["fkm"] > r["kfed"]
    assert abs(r["fkm_weighted"] - r["central"]) <= 0.03


@pytest.mark.slow
@pytest.mark.parametrize("beta", [0.1, 1, 10])
def test_grid_paper_scale_secure_mode(beta):
    r = _scores(beta, range(10))
    assert abs(r["fkm"] - r["central"]) <= 0.02 and r["fkm"] > r["kfed"]
    s = _scores(beta, range(10), secure=True)
    assert abs(s["fkm"] - r["central"]) <= 0.02


def test_secure_mode_quality_on_grid():
    ds = garst_federated(1, random_state=0)
    plain = AligningFederatedKMeans(16, random_state=0).fit(ds)
    secure = AligningFederatedKMeans(16, secure_mode=True, init_bounds=(-12.5, 12.5), random_state=0).fit(ds)
    a_plain = pooled_ari(plain.cluster_centers_, ds.clients, ds.labels)
    a_secure = pooled_ari(secure.cluster_centers_, ds.clients, ds.labels)
    assert a_secure >= a_plain - 0.02
    # the server saw no set-fields in secure mode, only sums
    assert all(not rec.items for rec in secure.transcript_)
    assert any(rec.aggregate for rec in secure.transcript_)


def test_secure_lloyd_equals_plain_weighted_kmeans_from_same_start():
    """Secure iterations reproduce scikit-learn's weighted Lloyd over the pooled local centres."""
    rng = np.random.default_rng(0)
    clients = [rng.normal(loc, 0.5, (60, 2)) for loc in ([0, 0], [5, 0], [0, 5], [5, 5])]
    local = [local_kmeans(X, 3, np.random.default_rng(i)) for i, X in enumerate(clients)]
    memories = []
    for c, s in local:
        m = {}
        sc.store_local_centres(m, c, s, exact_means=True)
        memories.append(m)
    G0 = np.array([[1.0, 1.0], [4.0, 1.0], [1.0, 4.0], [4.0, 4.0]])
    G = G0.copy()
    for it in range(50):
        b = sc.secure_broadcast(G, exact_means=True, iteration=it)
        ups = [sc.secure_client_update(m, b).sums for m in memories]
        total = {k: sum(u[k] for u in ups) for k in ups[0]}
        G, mov = sc.secure_server_step(G, total)
        if mov < 1e-12:
            break
    points = np.vstack([c for c, _ in local])
    weights = np.concatenate([s for _, s in local])
    ref = KMeans(4, init=G0, n_init=1, tol=0, max_iter=300).fit(points, sample_weight=weights).cluster_centers_
    assert np.max(np.abs(G - ref)) < 1e-9


def test_local_step_drops_empty_and_sizes_give_sums():
    X = np.array([[0.0, 0.0], [0.2, 0.0], [10.0, 10.0], [10.2, 10.0], [10.4, 10.0]])
    G = np.array([[0.0, 0.0], [50.0, 50.0], [10.0, 10.0]])
    C, S = fkm_local_step(X, G)
    assert C.shape == (2, 2)  # the empty global cluster (50, 50) is dropped
    assert np.array_equal(S, [2.0, 3.0])
    assert np.allclose(C * S[:, None], [[0.2, 0.0], [30.6, 30.0]])


def test_min_cluster_size_never_sent():
    X = np.array([[0.0, 0.0], [0.1, 0.0], [9.0, 9.0]])
    algo = AligningFederatedKMeansAlgorithm(2)
    b = Broadcast("fkm.train", centres=np.array([[0.0, 0.0], [9.0, 9.0]]), params={"min_cluster_size": 2, "secure": False})
    up = algo.client_update(X, b, None, {})
    assert np.array_equal(up.items["sizes"], [2.0])


def test_secure_mode_keeps_local_centres_in_memory():
    algo = AligningFederatedKMeansAlgorithm(2, secure_mode=True, init_bounds=(0, 1))
    X = np.array([[0.0, 0.0], [0.1, 0.0], [9.0, 9.0], [9.1, 9.0]])
    b = Broadcast("fkm.train", centres=np.array([[0.0, 0.0], [9.0, 9.0]]), params={"min_cluster_size": 2, "secure": True})
    memory = {}
    up = algo.client_update(X, b, None, memory)
    assert not up.items and not up.sums
    assert np.allclose(memory[sc.MEMORY_KEY]["centres"], [[0.05, 0.0], [9.05, 9.0]])


def test_bad_input_names_argument():
    with pytest.raises(InputError, match="min_cluster_size"):
        AligningFederatedKMeans(4, min_cluster_size=0).fit([np.random.default_rng(0).normal(size=(20, 2))] * 2)
    with pytest.raises(InputError, match="local_init"):
        AligningFederatedKMeans(4, local_init="bogus").fit([np.random.default_rng(0).normal(size=(20, 2))] * 2)
    with pytest.raises(InputError, match="init_bounds"):
        AligningFederatedKMeansAlgorithm(4, secure_mode=True, init="uniform").init(2, 2, np.random.default_rng(0))


def test_secure_mode_runs_under_pairwise_masking():
    protocols = pytest.importorskip("protocols")
    ds = garst_federated(1, random_state=0)
    kw = {"secure_mode": True, "init_bounds": (-12.5, 12.5), "random_state": 0}
    plain_sum = AligningFederatedKMeans(16, **kw).fit(ds)
    masked = AligningFederatedKMeans(16, protection=[protocols.PairwiseMasking()], **kw).fit(ds)
    assert np.max(np.abs(masked.cluster_centers_ - plain_sum.cluster_centers_)) < 1e-3
    assert pooled_ari(masked.cluster_centers_, ds.clients, ds.labels) > 0.93
