"""EWF under DP: prior-weighted local centres (sensitivity diameter / (1 + m)), its DP plan
(DWF's start, its own rounds, the prior weight reported), and m = 0 being eq. 8 exactly."""

import hashlib
import math
import warnings

import numpy as np
import pytest

from protocols.dp import GaussianDP
from protocols.dp.planning import EWF_PRIOR_FACTOR
from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
from securefkm.exceptions import InputError
from securefkm.messages import Broadcast, FieldSpec
from securefkm.registry import make_estimator

BOX = (-2.0, 2.0)


@pytest.fixture(scope="module")
def clients():
    rng = np.random.default_rng(0)
    centres = np.array([[-1.0, -1.0], [1.0, 1.0], [1.0, -1.0]])
    return [np.clip(centres[rng.integers(0, 3, 60)] + rng.normal(0, 0.3, (60, 2)), *BOX) for _ in range(4)]


def _fit(clients, **kw):
    est = make_estimator("ewf", n_clusters=3, random_state=0, crypto="ideal", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(clients)


@pytest.mark.parametrize("m", [0.0, 1.0, 7.5])
@pytest.mark.parametrize("cells", [1, 3])
def test_mean_sensitivity_is_the_diameter_over_one_plus_m(m, cells):
    dp = GaussianDP(1.0, 1e-5, bounds=BOX)
    dp._d = 2
    spec = FieldSpec("centres", (3, 2), "mean", cells=cells, prior_weight=m)
    assert dp.sensitivity(spec, 2) == pytest.approx(math.sqrt(cells) * 4 * math.sqrt(2) / (1 + m))


def test_one_record_moves_a_projected_prior_weighted_centre_by_at_most_diameter_over_one_plus_m():
    """The derivation (docs/protocols/differential-privacy.md): adding x moves (S + m C) / (n + m)
    by (x - c) / (n + m + 1), and after projecting into the box by at most diam / (n + m + 1),
    also for broadcast centres outside the box (a malicious server's)."""
    rng = np.random.default_rng(1)
    diam = 4 * math.sqrt(2)
    worst = 0.0
    for m in (0.0, 0.5, 3.0):
        alg = WeightedFederatedKMeansAlgorithm(3, weighting="equal", prior_weight=m)
        for _ in range(200):
            C = rng.normal(0, 3.0, (3, 2))  # some rows far outside the box
            X = rng.uniform(*BOX, (int(rng.integers(0, 6)), 2))
            x = rng.uniform(*BOX, (1, 2))
            b = alg.configure(_state(C), 0)
            a, a2 = (np.clip(alg.client_updates([Y], b, [None])[0].sums["centres"], *BOX) for Y in (X, np.vstack([X, x])))
            moved = np.linalg.norm(a2 - a, axis=1)
            assert np.count_nonzero(moved) <= 1  # one record: one row
            worst = max(worst, moved.max() * (1 + m) / diam)
    assert 0.5 < worst <= 1.0 + 1e-12


def _state(C):
    from securefkm.algorithms.dwf import WeightedKMeansState

    return WeightedKMeansState(centres=C, phase="train", rng=None, n_clients=1)


def test_zero_prior_weight_is_eq_8_bit_for_bit(clients):
    # the centres of this fit before prior_weight existed (same seed, same data)
    plain = _fit(clients, init="k-means++", max_rounds=5, tol=0)
    zero = _fit(clients, init="k-means++", max_rounds=5, tol=0, prior_weight=0.0)
    assert hashlib.sha256(plain.cluster_centers_.tobytes()).hexdigest()[:16] == "84f52764c083b785"
    assert np.array_equal(plain.cluster_centers_, zero.cluster_centers_)
    C = np.array([[-1.0, -1.0], [1.0, 1.0], [5.0, 5.0]])  # the last cell is empty: eq. 8 reports C_j
    alg = WeightedFederatedKMeansAlgorithm(3, weighting="equal")
    b = alg.configure(_state(C), 0)
    assert "prior_weight" not in b.params  # m = 0 broadcasts (and their digests) are unchanged
    got = alg.client_updates([clients[0]], b, [None])[0].sums["centres"]
    near = ((clients[0][:, None] - C[None]) ** 2).sum(-1).argmin(1)
    want = np.array([clients[0][near == j].mean(0) if (near == j).any() else C[j] for j in range(3)])
    assert np.array_equal(got, want)


def test_prior_weight_pulls_local_centres_towards_the_broadcast_centre(clients):
    C = np.array([[-1.0, -1.0], [1.0, 1.0], [5.0, 5.0]])
    alg = WeightedFederatedKMeansAlgorithm(3, weighting="equal", prior_weight=2.0)
    b = alg.configure(_state(C), 0)
    assert b.params["prior_weight"] == 2.0
    assert alg.sum_fields(b)[0].prior_weight == 2.0
    X = clients[0]
    near = ((X[:, None] - C[None]) ** 2).sum(-1).argmin(1)
    got = alg.client_updates([X], b, [None])[0].sums["centres"]
    for j in range(3):
        n = (near == j).sum()
        np.testing.assert_allclose(got[j], (X[near == j].sum(0) + 2.0 * C[j]) / (n + 2.0), rtol=1e-12)
    np.testing.assert_array_equal(got[2], C[2])  # empty cell: C_j


@pytest.mark.parametrize("stack", ["central", "distributed+masking"])
def test_ewf_dp_fit_spends_at_most_its_budget_and_reports_m_and_rounds(stack, clients):
    dp = GaussianDP(1.0, 1e-5, bounds=BOX, mode="central" if stack == "central" else "distributed")
    est = _fit(clients, protection=[dp] if stack == "central" else [dp, "masking"])
    eps, delta = est.privacy_spent_
    assert 0 < eps <= 1.0 and delta == 1e-5
    C = est.cluster_centers_
    assert np.all(C >= BOX[0]) and np.all(C <= BOX[1])
    plan = est.dp_plan_
    assert plan.prior_weight == pytest.approx(EWF_PRIOR_FACTOR * 240 / (4 * 3))  # 4 n / (clients k) = 80
    assert 1 <= est.n_iter_ <= plan.rounds
    reported = est.protection_report_["GaussianDP"]["plan"]
    assert reported["prior_weight"] == plan.prior_weight and reported["rounds"] == plan.rounds
    assert reported["round_noise_level"] == plan.round_noise_level
    # the layer noised the field at the reduced sensitivity: diam / (1 + m)
    spec = FieldSpec("centres", (3, 2), "mean", prior_weight=plan.prior_weight)
    assert dp.calibration.sensitivity(spec, 2) == pytest.approx(4 * math.sqrt(2) / (1 + plan.prior_weight))


def test_explicit_prior_weight_is_used_and_plans_fewer_rounds_when_smaller(clients):
    low = _fit(clients, protection=[GaussianDP(1.0, 1e-5, bounds=BOX)], prior_weight=0.0)
    high = _fit(clients, protection=[GaussianDP(1.0, 1e-5, bounds=BOX)], prior_weight=200.0)
    assert low.dp_plan_.prior_weight == 0.0 and high.dp_plan_.prior_weight == 200.0
    # noise level of the rounds: 2 z sqrt(d) / ((1 + m) I) (one mean over k (1 + m) I / (2 sqrt(1 - c)) records)
    assert low.dp_plan_.round_noise_level / high.dp_plan_.round_noise_level == pytest.approx(201.0, rel=1e-2)
    assert low.dp_plan_.rounds <= high.dp_plan_.rounds
    assert low.privacy_spent_[0] <= 1.0 and high.privacy_spent_[0] <= 1.0


def test_no_dp_leaves_prior_weight_zero(clients):
    est = _fit(clients, max_rounds=3)
    assert est.dp_plan_ is None
    assert est._make_algorithm(2, 4).prior_weight == 0.0


def test_local_dp_projects_into_the_box(clients):
    est = _fit(clients, protection=[GaussianDP(1.0, 1e-5, bounds=BOX, mode="local")])
    assert est.privacy_spent_[0] <= 1.0
    assert np.all(est.cluster_centers_ >= BOX[0]) and np.all(est.cluster_centers_ <= BOX[1])


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "many", True])
def test_bad_prior_weight_names_it(bad, clients):
    with pytest.raises(InputError, match="prior_weight"):
        _fit(clients, prior_weight=bad, max_rounds=2)
    with pytest.raises(InputError, match="prior_weight"):
        FieldSpec("centres", (3, 2), "mean", prior_weight=bad)


def test_prior_weight_is_refused_where_its_bound_does_not_hold(clients):
    with pytest.raises(InputError, match="max_local_steps=1"):
        _fit(clients, prior_weight=1.0, max_local_steps=3, max_rounds=2)
    with pytest.raises(InputError, match="weighting='equal'"):
        make_estimator("dwf", n_clusters=3, prior_weight=1.0, max_rounds=2).fit(clients)
    with pytest.raises(InputError, match="only for 'mean' fields"):
        FieldSpec("s", (3, 2), "sum", prior_weight=1.0)


def test_shrinkage_of_a_mean_field_uses_the_exact_count():
    """The step shrinkage of a ``mean`` field summed over n contributors equals the (count, sum)
    shrinkage with counts n and no count noise."""
    from protocols.dp.postprocessing import PostProcessor

    class Ctx:
        broadcast = Broadcast("train", centres=np.zeros((3, 4)))
        round = 1

    post = PostProcessor(lambda d: None, 4, "step", {"rounds": 2}, True)
    rng = np.random.default_rng(0)
    T = rng.normal(0, 1.0, (3, 4)) * 5
    spec = FieldSpec("centres", (3, 4), "mean")
    out = post.shrunk({"centres": T}, (spec,), {"centres": (2.0, 0.0, 1.0)}, "train", Ctx(), n_contributors=5)
    ref = post._shrunk_step(np.full(3, 5.0), T, np.zeros((3, 4)), 2.0, 0.0, "n", "s")["s"]
    np.testing.assert_array_equal(out["centres"], ref)
    factor = np.clip(1 - 4 * (2.0 / 5) ** 2 / ((T / 5) ** 2).sum(1), 0, 1)
    np.testing.assert_allclose(out["centres"], T * factor[:, None])
    assert not np.array_equal(out["centres"], T)
