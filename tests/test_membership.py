"""Membership inference on released centres: leaks without DP, bounded under GaussianDP."""

import math

import numpy as np
import pytest

from attacks.membership import (
    MembershipInference,
    auc_score,
    dp_roc_violation,
    membership_metrics,
    roc_curve,
)
from securefkm.datasets import FederatedDataset
from securefkm.estimators.dwf import WeightedFederatedKMeans
from securefkm.exceptions import InputError


@pytest.fixture(scope="module")
def tiny():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(160, 2))
    members, non = X[:80], X[80:]
    parts = np.array_split(members, 4)
    return FederatedDataset(parts), members, non


def _factory(seed=0):
    counter = iter(range(1000))
    return lambda data: WeightedFederatedKMeans(n_clusters=30, max_rounds=10, random_state=seed + next(counter)).fit(data)


def test_metrics_against_brute_force():
    rng = np.random.default_rng(1)
    a, b = rng.normal(1, 1, 60), rng.normal(0, 1, 70)
    brute = np.mean(a[:, None] > b[None, :]) + 0.5 * np.mean(a[:, None] == b[None, :])
    assert auc_score(a, b) == pytest.approx(brute)
    fpr, tpr, thr = roc_curve(a, b)
    assert fpr[0] == tpr[0] == 1.0 and fpr[-1] == tpr[-1] == 0.0
    m = membership_metrics(a, b)
    adv = max(np.mean(a >= t) - np.mean(b >= t) for t in np.concatenate([a, b]))
    assert m["membership_advantage"] == pytest.approx(adv)
    assert membership_metrics(np.ones(5), np.zeros(5))["tpr_at_1pct_fpr"] == 1.0


def test_distance_attack_leaks_on_small_clusters(tiny):
    data, members, non = tiny
    est = _factory(0)(data)
    rep = MembershipInference("distance").evaluate(est, data, members, non)
    assert rep.auc > 0.68, rep.auc  # measured 0.79 (30 centres for 80 records)
    assert rep.membership_advantage > 0.25
    assert "roc" in rep.extra
    # the same attack given random centres is blind
    blind = MembershipInference("distance").evaluate(np.random.default_rng(5).normal(size=(30, 2)), data, members, non)
    assert abs(blind.auc - 0.5) < 0.15


def test_lira_attack_runs_with_a_factory(tiny):
    data, members, non = tiny
    est = _factory(0)(data)
    rep = MembershipInference("lira", n_shadow=6, fit=_factory(100), random_state=0).evaluate(est, data, members, non)
    assert rep.auc > 0.65, rep.auc
    assert rep.extra["shadow_in_counts"].shape == (160,)


def test_membership_advantage_bounded_under_gaussian_dp(tiny):
    from protocols.dp.layer import GaussianDP

    data, members, non = tiny
    eps, delta = 0.5, 1e-5
    grid = np.stack(np.meshgrid(np.linspace(-2, 2, 6), np.linspace(-2, 2, 5)), -1).reshape(-1, 2)
    est = WeightedFederatedKMeans(n_clusters=30, max_rounds=1, init=grid,  # data-independent start
                                  protection=[GaussianDP(eps, delta, clip=4.0)], random_state=0).fit(data)
    assert est.privacy_spent_[0] <= eps + 1e-9
    rep = MembershipInference("distance").evaluate(est, data, members, non)
    sin, sout = rep.extra["scores_in"], rep.extra["scores_out"]
    # TPR <= e^eps FPR + delta at every threshold, up to a DKW band at 99.9%
    assert dp_roc_violation(sin, sout, eps, delta, alpha=1e-3) <= 0
    slack = 2 * math.sqrt(math.log(4 / 1e-3) / (2 * 80))
    assert rep.membership_advantage <= math.exp(eps) - 1 + delta + slack


def test_dp_roc_violation_can_fail():
    # a perfect attack refutes eps = 0.5 with 200 candidates
    assert dp_roc_violation(np.ones(200), np.zeros(200), 0.5, 1e-5, 0.05) > 0


def test_bad_input(tiny):
    data, members, non = tiny
    with pytest.raises(InputError, match="method"):
        MembershipInference("loss")
    with pytest.raises(InputError, match="n_shadow"):
        MembershipInference("lira", n_shadow=1)
    with pytest.raises(InputError, match="candidates_in"):
        MembershipInference().evaluate(np.zeros((3, 2)), data, np.zeros((4, 3)), non)
    with pytest.raises(InputError, match="target_estimator_or_centres"):
        MembershipInference().evaluate(np.zeros(3), data, members, non)
    with pytest.raises(InputError, match="fit="):
        MembershipInference("lira").evaluate(np.zeros((3, 2)), data, members, non)
