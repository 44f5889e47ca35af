"""scikit-learn surface beyond check_estimator: pooled data with groups, pipelines and
group-aware splitting, text protection specs, one data domain, refused input."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import sklearn
from sklearn.model_selection import GroupKFold, cross_validate
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from protocols import GaussianDP, PairwiseMasking
from securefkm import FederatedFuzzyCMeans, MiniBatchFederatedKMeans, WeightedFederatedKMeans
from securefkm.exceptions import InputError


@pytest.fixture(scope="module")
def pooled():
    rng = np.random.default_rng(0)
    centres = np.array([[-1.0, -1.0], [1.0, 1.0], [1.0, -1.0]])
    X = np.vstack([c + 0.1 * rng.standard_normal((30, 2)) for c in centres])
    groups = rng.integers(0, 4, len(X))  # 4 clients, records interleaved
    return np.clip(X, -1.9, 1.9), groups


def _n_clients(est):
    return max(len(r.sampled) for r in est.transcript_.rounds)


def test_groups_equal_list_of_clients_and_labels_follow_X(pooled):
    X, g = pooled
    by_groups = WeightedFederatedKMeans(3, max_rounds=20, random_state=0).fit(X, groups=g)
    clients = [X[g == c] for c in range(4)]
    by_list = WeightedFederatedKMeans(3, max_rounds=20, random_state=0).fit(clients)
    np.testing.assert_array_equal(by_groups.cluster_centers_, by_list.cluster_centers_)
    assert _n_clients(by_groups) == 4
    np.testing.assert_array_equal(by_groups.labels_, by_groups.predict(X))  # order of X
    np.testing.assert_array_equal(by_groups.fit_predict(X, groups=g), by_groups.labels_)


def test_groups_with_federated_dataset_refused(pooled):
    from securefkm import FederatedDataset

    X, g = pooled
    with pytest.raises(InputError, match="groups is given but X is a FederatedDataset"):
        WeightedFederatedKMeans(3).fit(FederatedDataset([X]), groups=g)
    with pytest.raises(InputError, match="groups must be 1-D with one client label per row of X"):
        WeightedFederatedKMeans(3).fit(X, groups=g[:-1])


def test_pooled_without_groups_is_one_client(pooled):
    X, _ = pooled
    est = WeightedFederatedKMeans(3, max_rounds=20, random_state=0).fit(X)
    assert _n_clients(est) == 1
    one = WeightedFederatedKMeans(3, max_rounds=20, random_state=0).fit([X])
    np.testing.assert_array_equal(est.cluster_centers_, one.cluster_centers_)


def test_groups_routed_through_pipeline_and_group_kfold(pooled):
    X, g = pooled
    with sklearn.config_context(enable_metadata_routing=True):
        est = MiniBatchFederatedKMeans(3, max_rounds=5, random_state=0).set_fit_request(groups=True)
        pipe = make_pipeline(StandardScaler(), est).fit(X, groups=g)
        assert _n_clients(pipe[-1]) == 4
        res = cross_validate(pipe, X, params={"groups": g}, cv=GroupKFold(n_splits=2),
                             return_estimator=True)
    # GroupKFold holds whole clients out: each fold trains on the other clients only
    assert sorted(_n_clients(e[-1]) for e in res["estimator"]) == [2, 2]
    assert np.all(np.isfinite(res["test_score"]))
    assert set(est.get_metadata_routing().fit.requests) == {"groups"}  # not server_policy/transport


def test_text_protection_specs_equal_layer_objects(pooled):
    X, g = pooled
    params = dict(n_clusters=3, max_rounds=3, random_state=0, init_bounds=(-2, 2))
    by_text = WeightedFederatedKMeans(protection="masking", **params).fit(X, groups=g)
    by_obj = WeightedFederatedKMeans(protection=[PairwiseMasking()], **params).fit(X, groups=g)
    np.testing.assert_array_equal(by_text.cluster_centers_, by_obj.cluster_centers_)
    est = WeightedFederatedKMeans(
        protection=["dp:epsilon=1,delta=1e-3,clip=3,mode=distributed", "masking"], **params
    ).fit(X, groups=g)
    assert list(est.protection_report_)[:2] == ["GaussianDP", "PairwiseMasking"]
    assert est.privacy_spent_[0] == pytest.approx(1.0, rel=0.05)


def test_domain_declared_once_on_gaussian_dp(pooled):
    X, g = pooled
    dp = GaussianDP(epsilon=1.0, delta=1e-3, bounds=(-2, 2), mode="distributed")
    est = WeightedFederatedKMeans(3, max_rounds=2, random_state=0, protection=[dp, PairwiseMasking()])
    est.fit(X, groups=g)  # no init_bounds: the DP bounds serve the protected start
    assert est.transcript_.meta["init_bounds"] == (-2.0, 2.0)
    same = WeightedFederatedKMeans(3, max_rounds=2, random_state=0, init_bounds=(-2, 2),
                                   protection=[dp, PairwiseMasking()]).fit(X, groups=g)
    assert same.n_iter_ == est.n_iter_
    bad = WeightedFederatedKMeans(3, random_state=0, init_bounds=(-3, 3), protection=[dp, PairwiseMasking()])
    with pytest.raises(InputError, match=r"init_bounds=\(-3, 3\) and GaussianDP\(bounds="):
        bad.fit(X, groups=g)


@pytest.mark.parametrize("bounds", [(2, -2), (1, 1), ([0, 0], [1, -1])])
def test_reversed_or_empty_init_bounds_refused(pooled, bounds):
    X, g = pooled
    with pytest.raises(InputError, match="init_bounds.*low < high"):
        WeightedFederatedKMeans(3, init_bounds=bounds, protection="masking").fit(X, groups=g)


def test_complex_and_sparse_refused_dataframes_accepted(pooled):
    pd = pytest.importorskip("pandas")
    X, g = pooled
    with pytest.raises(InputError, match="Complex data not supported"):
        WeightedFederatedKMeans(3).fit([X + 1j, X])
    with pytest.raises(InputError, match="sparse matrix.*toarray"):
        WeightedFederatedKMeans(3).fit(sp.csr_matrix(X))
    with pytest.raises(InputError, match="sparse matrix"):
        WeightedFederatedKMeans(3).fit([sp.csr_matrix(X[:40]), X[40:]])
    frames = [pd.DataFrame(X[g == c], columns=["a", "b"]) for c in range(4)]
    est = FederatedFuzzyCMeans(3, max_rounds=5, random_state=0).fit(frames)
    assert list(est.feature_names_in_) == ["a", "b"] and _n_clients(est) == 4
    assert est.predict(pd.DataFrame(X, columns=["a", "b"])).shape == (len(X),)


def test_leakage_report_repr_summary_to_dict():
    import json

    from attacks.report import score_reconstructions

    clients = [np.arange(20.0).reshape(10, 2), np.arange(20.0, 40.0).reshape(10, 2)]
    claims = [(0, clients[0][3]), (1, clients[1][5] + 5.0)] + [(0, clients[0][i]) for i in range(10)]
    rep = score_reconstructions(claims, clients, attack="passive", extra={"means": np.zeros((50, 2))})
    assert rep.records_recovered == 10
    assert "\n" not in repr(rep) and "array" not in repr(rep) and len(repr(rep)) < 200
    assert repr(rep).startswith("LeakageReport(passive: recovered 10/20 records exactly (50.00%)")
    table = rep.summary().splitlines()
    assert table[1].split() == ["records", "recovered", "(exact)", "10", "/", "20", "(50.00%)"]
    assert table[-1].split() == ["means", "array(50,", "2)"]
    assert json.loads(json.dumps(rep.to_dict()))["records_recovered"] == 10


def test_text_specs_reach_active_attacks(pooled):
    from attacks import CraftedCentroids

    X, g = pooled
    clients = [X[g == c] for c in range(4)]
    est = WeightedFederatedKMeans(3, random_state=0, init_bounds=(-2, 2), protection="masking")
    rep = CraftedCentroids(target=0, max_rounds=3).evaluate(est, clients)
    assert rep.records_recovered == 0  # the masked sums hide client 0's cells
