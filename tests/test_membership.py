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


# ---------------------------------------------------------------- chance levels, and why the benchmark sees none
def test_chance_levels_match_brute_force():
    from attacks.membership import chance_levels

    c = chance_levels(30, 40, n_sim=3000, random_state=0)
    rng = np.random.default_rng(1)
    sims = [membership_metrics(rng.random(30), rng.random(40)) for _ in range(3000)]
    auc = np.array([m["auc"] for m in sims])
    adv = np.array([m["membership_advantage"] for m in sims])
    lo, hi = np.quantile(auc, [0.025, 0.975])
    assert abs(c["auc_low"] - lo) < 0.02 and abs(c["auc_high"] - hi) < 0.02
    assert abs(c["advantage_high"] - np.quantile(adv, 0.95)) < 0.03
    assert abs(c["advantage_mean"] - adv.mean()) < 0.01
    assert c["auc_sd"] == pytest.approx(math.sqrt(71 / (12 * 30 * 40)), rel=0.08)
    # averaging over runs narrows the interval by about sqrt(runs)
    c4 = chance_levels(30, 40, n_runs=4, n_sim=3000, random_state=0)
    assert c4["auc_sd"] == pytest.approx(c["auc_sd"] / 2, rel=0.1) and c4["advantage_high"] < c["advantage_high"]
    with pytest.raises(InputError, match="n_in"):
        chance_levels(0, 5)
    with pytest.raises(InputError, match="level"):
        chance_levels(5, 5, level=1.5)


def _bench_blobs(seed):
    from attacks import matrix
    from attacks.evaluate import membership_candidates

    data, k, _, held = matrix.load({"name": "blobs-small", "split": "non-iid", "n_clients": 20}, seed)
    members, non = membership_candidates(data, held, random_state=20_000 + seed)
    return data, k, members, non


def test_benchmark_setting_gives_the_distance_attack_no_signal_and_small_cells_do():
    """The quick benchmark's data (400 blob records, 20 clients, k = 4: about 90 records per
    centre): the AUC of the unprotected fit is chance, over 8 seeds inside the no-signal
    interval; the score direction is right: with 100 centres over the same records (about 3.6
    per centre) the same attack on the same candidates reaches a clear advantage."""
    from attacks.membership import chance_levels

    aucs, small = [], []
    for seed in range(8):
        data, k, members, non = _bench_blobs(seed)
        est = WeightedFederatedKMeans(n_clusters=k, max_rounds=10, random_state=seed).fit(data)
        aucs.append(MembershipInference("distance").evaluate(est, data, members, non).auc)
        if seed < 2:
            est = WeightedFederatedKMeans(n_clusters=100, max_rounds=10, random_state=seed).fit(data)
            small.append(MembershipInference("distance").evaluate(est, data, members, non).auc)
    c = chance_levels(len(non), len(non), n_runs=8, random_state=0)
    assert c["auc_low"] <= np.mean(aucs) <= c["auc_high"], (aucs, c)  # measured mean 0.49
    assert min(aucs) < 0.5  # single seeds below 0.5 are sampling error, not a reversed score
    c1 = chance_levels(len(non), len(non), random_state=0)
    assert min(small) > c1["auc_high"] + 0.1, small  # measured 0.85 and 0.83


def test_lira_finds_the_signal_the_distance_attack_misses_and_dp_removes_it():
    """On the quick benchmark's unprotected DWF fit (seed 0) the strong adversary of LiRA
    (knows the other training records, re-runs the algorithm: 16 shadow fits) separates the
    members the distance attack cannot; under GaussianDP(epsilon=0.5) it is back at chance."""
    from attacks import matrix
    from attacks.membership import chance_levels

    stacks = matrix.default_stacks(epsilons=(0.5,))
    data, k, members, non = _bench_blobs(0)
    c1 = chance_levels(len(non), len(non), random_state=0)
    aucs = {}
    for st in ("none", "dp-central(eps=0.5)"):
        specs = stacks[st]
        est = matrix.make_fit("dwf", specs, k, matrix.BOXES["blobs-small"], 0, 10,
                              dp_planned=matrix.plans_dp_rounds("dwf", specs)).fit(data)
        rep = MembershipInference("lira", n_shadow=16, random_state=0).evaluate(est, data, members, non)
        aucs[st] = rep.auc
        if st != "none":
            sin, sout = rep.extra["scores_in"], rep.extra["scores_out"]
            assert dp_roc_violation(sin, sout, 0.5, 1e-5, alpha=0.05) <= 0
    plain = MembershipInference("distance").evaluate(
        matrix.make_fit("dwf", [], k, matrix.BOXES["blobs-small"], 0, 10).fit(data), data, members, non)
    assert c1["auc_low"] <= plain.auc <= c1["auc_high"]  # distance: 0.54, chance
    assert aucs["none"] > c1["auc_high"] + 0.03, aucs  # LiRA: measured 0.71
    assert c1["auc_low"] <= aucs["dp-central(eps=0.5)"] <= c1["auc_high"], aucs  # measured 0.56
