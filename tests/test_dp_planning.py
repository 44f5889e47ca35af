"""DP defaults: the estimator's plan, radius-bounded rounds,
hierarchical shrinkage, and the FastLloyd baseline of the DP benchmark."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from protocols.dp import GaussianDP
from protocols.dp.planning import (
    NOISE_PRIVATE_START,
    NOISE_START_PRIOR,
    lloyd_rounds,
    plan,
    spread_start,
)
from protocols.dp.radius import VOLUME_FACTOR, RadiusBound, auto_radius, volume_radius
from benchmarks import dp_fastlloyd as fl
from benchmarks.protocols_dp import loss, reference_loss
from securefkm.estimators.dwf import WeightedFederatedKMeans

warnings.simplefilter("ignore", UserWarning)


def test_rounds_rule():
    assert [lloyd_rounds(e) for e in (1.0, 0.71, 0.7, 0.5, 0.1, 0.03, 1e-6)] == [1, 1, 2, 2, 3, 4, 6]


def test_plan_is_a_function_of_public_inputs_and_starts_inside_the_inner_box():
    a = plan(3, 4, 0.5, 1e-3, -1.0, 1.0, 150, seed=5)
    b = plan(3, 4, 0.5, 1e-3, -1.0, 1.0, 150, seed=5)
    np.testing.assert_array_equal(a.start, b.start)
    assert a.rounds == b.rounds == 2 and math.isclose(a.noise_level, b.noise_level)
    assert np.all(np.abs(a.start) <= 0.5) and len(np.unique(a.start, axis=0)) == 3
    # more records or more budget: less noise, never fewer rounds
    assert plan(3, 4, 0.5, 1e-3, -1.0, 1.0, 15000, seed=5).rounds > a.rounds
    assert plan(3, 4, 0.05, 1e-3, -1.0, 1.0, 150, seed=5).rounds == 1
    s = spread_start(4, np.zeros(2), np.full(2, 10.0), seed=1)
    assert np.all((s >= 2.5) & (s <= 7.5))


def test_low_noise_plans_a_private_start():
    """e < E_p: a private seeding round instead of the spread points (the start is data-
    dependent, paid for by one more release); e >= E_p keeps the spread start."""
    low = plan(5, 2, 1.0, 1e-5, -2.0, 2.0, 10_000, seed=1)
    high = plan(3, 4, 1.0, 1e-3, -1.0, 1.0, 150, seed=1)  # iris-sized: e = 0.12
    assert low.noise_level < NOISE_PRIVATE_START <= high.noise_level
    assert low.private_start and low.start is None and "private seeding" in low.describe()["start"]
    assert not high.private_start and high.start is not None


def test_private_start_escapes_the_local_optimum_of_the_spread_start():
    """A 5-blob set of 10,000 records over 100 clients at eps 1 (e = 0.0035), tuning seed 1009:
    from the spread start the plan's rounds end in a local optimum (1.96 times the best central
    loss when measured), from the private seeding at the optimum; within the budget either way."""
    from protocols.dp import planning
    from securefkm.datasets.federated import FederatedDataset
    from securefkm.datasets.generators import dwf_blobs

    X, y = dwf_blobs(n_samples=10_000, random_state=7)
    data = FederatedDataset.from_pooled(X, y, split="dirichlet", n_clients=100, random_state=1009)
    ref = reference_loss(X, 5)

    def fit():
        est = WeightedFederatedKMeans(5, protection=[GaussianDP(1.0, 1e-5, bounds=(-2.0, 2.0), mode="central",
                                                                 rng="seeded")], random_state=1009, crypto="ideal")
        est.fit(data.clients)
        assert est.privacy_spent_[0] <= 1.0
        return loss(X, est.cluster_centers_) / ref, est.dp_plan_

    private, p = fit()
    assert p.private_start and private < 1.01
    old, planning.NOISE_PRIVATE_START = planning.NOISE_PRIVATE_START, 0.0
    try:
        spread, q = fit()
    finally:
        planning.NOISE_PRIVATE_START = old
    assert not q.private_start and spread > 1.5


def _wine(seed):
    return fl.setting_data("wine", seed)


def test_default_fit_plans_rounds_radius_and_reports_them():
    clients, k = _wine(0)
    n = sum(map(len, clients))
    est = WeightedFederatedKMeans(k, protection=[GaussianDP(1.0, fl.setting_delta(n), bounds=(-1.0, 1.0))],
                                  random_state=0).fit(clients)
    p = est.dp_plan_
    # e = 0.167 (wine, eps 1, count share 1 / (1 + 2 sqrt(13))): R = 1 + ceil(log2(0.7 / e) / 2) = 3
    assert p is not None and p.rounds == 3 and p.noise_level == pytest.approx(0.1655, abs=1e-4) and p.n_records == n
    rep = est.protection_report_["GaussianDP"]
    assert rep["plan"]["rounds"] == 3 and rep["plan"]["records_declared_public"] == n
    assert rep["radius"] == pytest.approx(auto_radius(2 * math.sqrt(13), 3, 13, sides=np.full(13, 2.0)))
    assert "3 Lloyd rounds" in rep["summary"] and "noise multiplier" in rep["summary"]
    assert rep["max_client_rounds"] == 3  # no seeding round: every round is a Lloyd round
    assert est.privacy_spent_[0] <= 1.0
    # an explicit max_rounds opts out: no plan, the user's settings as given
    est2 = WeightedFederatedKMeans(k, protection=[GaussianDP(1.0, 1e-4, bounds=(-1.0, 1.0))], max_rounds=2,
                                   random_state=0).fit(clients)
    assert est2.dp_plan_ is None and est2.protection_report_["GaussianDP"]["radius"] is None


def test_radius_rounds_noise_sums_relative_to_the_centres(monkeypatch):
    """With the noise replaced by the identity, every noised row of a radius round is a sum of
    x' - c_j over records clipped to r around c_j (row mean inside the ball), and the first round is
    centred on the box centre (row mean inside the half-box)."""
    clients, k = _wine(1)
    seen = []

    def no_noise(val, sigma, step, source=None):
        seen.append(np.array(val, dtype=np.float64))
        return np.array(val, dtype=np.float64)

    monkeypatch.setattr(GaussianDP, "_noise_fine", staticmethod(no_noise))
    est = WeightedFederatedKMeans(k, protection=[GaussianDP(1.0, 1e-4, bounds=(-1.0, 1.0))], random_state=0)
    est.fit(clients)
    r = est.protection_report_["GaussianDP"]["radius"]
    sums = [v for v in seen if v.ndim == 2]
    counts = [v for v in seen if v.ndim == 1]
    assert len(sums) == est.dp_plan_.rounds >= 2
    for i, (T, N) in enumerate(zip(sums, counts)):
        rows = N > 0
        norms = np.linalg.norm(T[rows] / N[rows, None], axis=1)
        bound = math.sqrt(13) if i == 0 else r
        assert np.all(norms <= bound + 1e-9), (i, norms.max(), bound)
    assert r < math.sqrt(13)


def test_radius_rounds_clip_records_farther_than_r_and_not_the_first_round():
    from securefkm.algorithms._kmeans import assign
    from securefkm.layers import ClientContext, RoundContext, RunInfo
    from securefkm.messages import Broadcast

    algo = WeightedFederatedKMeans(2)._make_algorithm(2, 1)
    dp = GaussianDP(1.0, 1e-5, bounds=(-1.0, 1.0), radius=0.5)
    info = RunInfo(algorithm=algo, n_clients=1, n_features=2, clients_per_round=1, max_rounds=3, planned_rounds=3)
    algo.init_ = np.zeros((2, 2))  # an array start: no seeding round
    dp.setup(info)
    X = np.array([[0.1, 0.0], [0.9, 0.9], [-0.5, -0.5], [-0.9, 0.9]])
    C = np.array([[0.0, 0.0], [-0.6, -0.6]])

    def ctx(rnd):
        return RoundContext(run=0, round=rnd, action="train", sampled=(0,), specs=(), info=info,
                            broadcast=Broadcast(action="train", centres=C))

    np.testing.assert_array_equal(dp.client_data(X, ClientContext(0, 4), ctx(0)), X)  # first round: all
    got = dp.client_data(X, ClientContext(0, 4), ctx(1))
    np.testing.assert_array_equal(got[[0, 2]], X[[0, 2]])  # within r of their centre: unchanged
    # beyond r: on the segment to their nearest centre, a hair inside the sphere of radius r
    for i in (1, 3):
        np.testing.assert_allclose(got[i], 0.5 * X[i] / np.linalg.norm(X[i]), rtol=1e-8)
        assert np.linalg.norm(got[i]) <= 0.5
    np.testing.assert_array_equal(assign(got, C)[0], assign(X, C)[0])  # nearest centres unchanged
    assert np.all(np.abs(got) <= 1.0)  # still in the box
    # records on a Voronoi boundary keep their side, and the batched path equals the single one
    rng = np.random.default_rng(3)
    Y = rng.uniform(-1, 1, size=(2000, 2))
    clipped = dp.client_data(Y, ClientContext(0, 4), ctx(1))
    labels, d2 = assign(clipped, C)
    np.testing.assert_array_equal(labels, assign(Y, C)[0])
    assert d2.max() <= 0.25
    batch = dp.client_datas([Y, X], [ClientContext(0, 4), ClientContext(1, 4)], ctx(1))
    np.testing.assert_array_equal(batch[0], clipped)
    np.testing.assert_array_equal(batch[1], got)


def test_clipped_radius_rounds_find_a_cluster_beyond_r_of_every_centre():
    """Iris at eps 1, tuning seed 1030, central, seeded noise: after the first round no centre
    lies within r of setosa; dropping the records beyond r (FastLloyd's rule) leaves it without a
    centre (4.19 times the optimum), clipping them to r pulls a centre to it (1.22)."""
    clients, k = fl.setting_data("iris", 1030)
    X = np.vstack(clients)
    dp = GaussianDP(1.0, fl.setting_delta(len(X)), bounds=(-1.0, 1.0), mode="central", rng="seeded")
    est = WeightedFederatedKMeans(k, protection=[dp], random_state=1030, crypto="ideal").fit(clients)
    assert est.dp_plan_.rounds == 3 and est.privacy_spent_[0] <= 1.0
    assert loss(X, est.cluster_centers_) / reference_loss(X, k) < 1.5


def test_hierarchical_shrink_is_post_processing_of_released_values():
    dp = GaussianDP(1.0, 1e-5, bounds=(-1.0, 1.0), shrink="hierarchical")
    dp._d = 3
    from securefkm.messages import FieldSpec

    specs = (FieldSpec("n", (3,), "count", integer=True), FieldSpec("S", (3, 3), "sum", weighted_by="n"))
    sums = {"n": np.array([50.0, 0.5, 40.0]), "S": np.array([[25.0, 25, 25], [9, 9, 9], [-20, -20, -20]])}
    sigmas = {"n": (2.0, 0, 0), "S": (3.0, 0, 0)}
    a = dp.post_processing.shrunk(dict(sums), specs, sigmas, "train")
    b = dp.post_processing.shrunk(dict(sums), specs, sigmas, "train")
    np.testing.assert_array_equal(a["S"], b["S"])
    # the row with a noisy count below the count sigma sits at the (shrunk) overall mean
    target = a["S"][1] / a["n"][1]
    assert a["n"][1] == 2.0 and np.allclose(target, target[0])
    # the well-estimated rows stay on their side of the target
    assert (a["S"][0] / a["n"][0])[0] > target[0] > (a["S"][2] / a["n"][2])[0]


def test_hierarchical_rows_get_the_james_stein_factor_and_stay_apart():
    """Noise-dominated rows (||m_j - t||^2 below d v_j) are shrunk by the James-Stein factor
    1 - (d - 2) v_j / ||m_j - t||^2, not put on the target by the plug-in factor: with the plug-in
    d, the first round of a plan puts several centres on the overall mean."""
    from securefkm.messages import FieldSpec

    d = 4
    dp = GaussianDP(1.0, 1e-5, bounds=(-1.0, 1.0), shrink="hierarchical")
    dp._d = d
    specs = (FieldSpec("n", (3,), "count", integer=True), FieldSpec("S", (3, d), "sum", weighted_by="n"))
    n = np.array([20.0, 20.0, 110.0])
    means = np.array([[0.25, 0.25, 0.0, 0.0], [-0.25, 0.0, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0]])
    sums = {"n": n, "S": means * n[:, None]}
    sigma_sum = 4.2  # v_j = (4.2 / 20)^2 = 0.0441 per coordinate for the two small rows
    out = dp.post_processing.shrunk(dict(sums), specs, {"n": (5.0, 0, 0), "S": (sigma_sum, 0, 0)}, "train")
    got = out["S"] / out["n"][:, None]
    target = dp.post_processing.hierarchical_target(n, sums["S"], sigma_sum)
    for j in (0, 1):
        diff = means[j] - target
        v = (sigma_sum / n[j]) ** 2
        assert d * v > diff @ diff > (d - 2) * v  # the plug-in factor would be 0 here
        np.testing.assert_allclose(got[j], target + (1 - (d - 2) * v / (diff @ diff)) * diff, rtol=1e-12)
    assert np.linalg.norm(got[0] - got[1]) > 0.1  # the two small rows stay apart


@pytest.mark.parametrize("mode", ["central", "distributed"])
def test_defaults_beat_a_fixed_quality_bound_on_wine_with_seeded_noise(mode):
    """Wine at epsilon 1 in FastLloyd's setting, 3 seeds, seeded (reproducible) noise: the
    benchmark's 30-seed means are about 1.6 for ours and 1.65 for FastLloyd
    (docs/protocols/dp-utility.md); the mean here must stay below 1.9."""
    layers_extra = []
    if mode == "distributed":
        from protocols.masking import PairwiseMasking

        layers_extra = [PairwiseMasking()]
    ref = reference_loss(np.vstack(_wine(0)[0]), 3)
    ratios = []
    for s in range(3):
        clients, k = _wine(s)
        n = sum(map(len, clients))
        dp = GaussianDP(1.0, fl.setting_delta(n), bounds=(-1.0, 1.0), mode=mode, rng="seeded")
        est = WeightedFederatedKMeans(k, protection=[dp, *layers_extra], random_state=s).fit(clients)
        assert est.privacy_spent_[0] <= 1.0
        ratios.append(loss(np.vstack(clients), est.cluster_centers_) / ref)
    assert np.mean(ratios) < 1.9, ratios


def test_fastlloyd_baseline_pieces():
    np.testing.assert_allclose(fl.fold(np.array([1.5, -1.25, 0.3, 3.5])), [0.5, -0.75, 0.3, -0.5])
    from protocols.dp import noise_multiplier_for

    # the analytic Gaussian is exact for one release, like the PRV accountant
    assert fl.analytic_gaussian_scale(1.0, 1e-5) == pytest.approx(noise_multiplier_for(1.0, 1e-5, 1, 1.0), rel=0.02)
    assert fl.iterations(150, 3, 4, fl.analytic_gaussian_scale(1.0, fl.setting_delta(150))) == 2
    clients, k = fl.setting_data("iris", 0)
    X = np.vstack(clients)
    assert X.min() == -1.0 and X.max() == 1.0 and len(clients) == 2
    ratio = np.mean([loss(X, fl.fastlloyd_fit(clients, k, 1.0, s)) / reference_loss(X, k) for s in range(5)])
    # FastLloyd on iris at eps 1: 1.55 over these 5 seeds, 1.494 over seeds 0-29 (docs/protocols/dp-utility.md)
    assert ratio < 2.5


def test_clip_only_dp_plans_its_rounds_instead_of_300():
    """GaussianDP(clip=...) with init_bounds: the fit runs the rule's number of rounds (not 300
    rounds at 1/300 of the budget), within the budget."""
    from protocols import GaussianDP, PairwiseMasking
    from protocols.dp.planning import lloyd_rounds, noise_level
    from securefkm import WeightedFederatedKMeans, load_dataset

    data = load_dataset("dwf-blobs", split="non-iid", n_clients=20, random_state=0)
    model = WeightedFederatedKMeans(
        n_clusters=5, init_bounds=(-2, 2), random_state=0, crypto="ideal",
        protection=[GaussianDP(epsilon=1.0, delta=1e-5, clip=2.0, mode="distributed"), PairwiseMasking()],
    ).fit(data)
    e, _ = noise_level(5, 2, 1.0, 1e-5, data.n_samples)
    assert model.dp_plan_ is not None and model.dp_plan_.start is None
    assert model.dp_plan_.rounds == lloyd_rounds(e) <= 6
    assert model.n_iter_ <= model.dp_plan_.rounds
    assert model.privacy_spent_[0] <= 1.0 + 1e-9
    # a fixed per-round noise keeps the estimator's own default: nothing to plan
    fixed = WeightedFederatedKMeans(n_clusters=5, init_bounds=(-2, 2), random_state=0, crypto="ideal", max_rounds=None,
                                    protection=[GaussianDP(1.0, 1e-5, noise_multiplier=5.0, clip=2.0, mode="distributed"),
                                                PairwiseMasking()])
    assert fixed.make_federation(data)[0].max_rounds == 300


def test_step_shrink_pulls_noisy_steps_towards_the_broadcast_centres():
    """shrink='step': rows shrink towards their own broadcast centre (not the overall mean), a
    row whose noisy count is below the count sigma keeps its centre; a deterministic function of
    released sums, public sigmas and the round's public centres."""
    from securefkm.layers import RoundContext
    from securefkm.messages import Broadcast, FieldSpec

    dp = GaussianDP(1.0, 1e-5, bounds=(-1.0, 1.0), shrink="step")
    dp._d = 3
    C = np.array([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0], [-0.5, -0.5, -0.5]])
    ctx = RoundContext(run=0, round=1, action="train", sampled=(0,), specs=(), info=None,
                       broadcast=Broadcast(action="train", centres=C))
    specs = (FieldSpec("n", (3,), "count", integer=True), FieldSpec("S", (3, 3), "sum", weighted_by="n"))
    # row 0: a large step (kept, shrunk a little); row 1: low count; row 2: a step within the noise
    sums = {"n": np.array([50.0, 0.5, 40.0]), "S": np.array([[40.0, 40, 40], [9, 9, 9], [-20.4, -20, -19.6]])}
    sigmas = {"n": (2.0, 0, 0), "S": (3.0, 0, 0)}
    a = dp.post_processing.shrunk(dict(sums), specs, sigmas, "train", ctx)
    means = a["S"] / a["n"][:, None]
    raw0 = sums["S"][0] / 50.0
    factor = 1 - 3 * (3.0 / 50) ** 2 / np.sum((raw0 - C[0]) ** 2)
    np.testing.assert_allclose(means[0], C[0] + factor * (raw0 - C[0]))
    assert a["n"][1] == 2.0 and np.allclose(means[1], C[1])
    np.testing.assert_allclose(means[2], C[2])  # ||step||^2 = 0.0001 < d v: shrunk to no move
    # without broadcast centres it falls back to the hierarchical rule
    b = dp.post_processing.shrunk(dict(sums), specs, sigmas, "train", None)
    dp.shrink = "hierarchical"
    np.testing.assert_array_equal(b["S"], dp.post_processing.shrunk(dict(sums), specs, sigmas, "train")["S"])


@pytest.mark.parametrize("alg, plain_default", [("minibatch", 200), ("fcm-fedavg", 100)])
def test_minibatch_and_fedavg_fcm_plan_their_rounds_under_dp(alg, plain_default):
    """Mini-batch k-means and fedavg fuzzy c-means have Lloyd's round sensitivity: with
    max_rounds unset they run the rule's rounds for the budget (not 200 / 100 rounds at a
    200th / 100th of it), computed from the records a round is expected to sum; without DP,
    or with max_rounds given, their own defaults."""
    from protocols import PairwiseMasking
    from protocols.dp.planning import noise_level
    from securefkm import load_dataset
    from securefkm.registry import make_estimator

    data = load_dataset("dwf-blobs", split="non-iid", n_clients=20, random_state=0)
    dp = lambda: [GaussianDP(1.0, 1e-5, bounds=(-2.0, 2.0), mode="distributed", rng="seeded"), PairwiseMasking()]  # noqa: E731
    model = make_estimator(alg, n_clusters=5, init_bounds=(-2, 2), random_state=0, crypto="ideal", protection=dp())
    model.fit(data)
    e, _ = noise_level(5, 2, 1.0, 1e-5, data.n_samples)
    assert model.dp_plan_ is not None and model.dp_plan_.rounds == lloyd_rounds(e) <= 6
    assert model.privacy_spent_[0] <= 1.0 + 1e-9
    half = make_estimator(alg, n_clusters=5, init_bounds=(-2, 2), random_state=0, crypto="ideal", protection=dp(),
                          clients_per_round=0.5)
    half.fit(data)  # half the clients a round: half the records, twice the relative noise
    assert half.dp_plan_.noise_level == pytest.approx(2 * model.dp_plan_.noise_level, rel=0.01)
    plain = make_estimator(alg, n_clusters=5, random_state=0)
    assert plain.make_federation(data)[0].max_rounds == plain_default
    fixed = make_estimator(alg, n_clusters=5, init_bounds=(-2, 2), random_state=0, crypto="ideal", protection=dp(),
                           max_rounds=7)
    assert fixed.make_federation(data)[0].max_rounds == 7


def test_minibatch_defaults_run_dwfs_full_plan():
    """With E = 1, B = None and unit rates every mini-batch round is a distributed Lloyd round:
    under a budget-led GaussianDP it runs DWF's plan on the same data (private seeding round,
    rounds, radius, last-round weight and step shrinkage), reported alike; a server rate
    alpha < 1 or sampled clients keep the rounds-only plan (no radius, no private start)."""
    from protocols import PairwiseMasking
    from securefkm import load_dataset
    from securefkm.registry import make_estimator

    data = load_dataset("dwf-blobs", random_state=0)
    dp = lambda: [GaussianDP(1.0, 1e-5, bounds=(-2.0, 2.0), mode="distributed", rng="seeded"), PairwiseMasking()]  # noqa: E731
    fits = {a: make_estimator(a, n_clusters=5, random_state=0, crypto="ideal", protection=dp()).fit(data)
            for a in ("dwf", "minibatch")}
    dwf, mb = fits["dwf"], fits["minibatch"]
    assert mb.dp_plan_.describe() == dwf.dp_plan_.describe() and mb.dp_plan_.private_start
    r_dwf, r_mb = dwf.protection_report_["GaussianDP"], mb.protection_report_["GaussianDP"]
    for key in ("radius", "planned_schedule", "noise_multiplier", "round_noise_multipliers", "max_client_rounds"):
        assert r_mb[key] == r_dwf[key], key
    assert r_mb["radius"] is not None and len(r_mb["planned_schedule"]) == 3  # Lloyd rounds, the last, the seeding
    assert mb.privacy_spent_[0] <= 1.0 + 1e-9 and np.all(np.abs(mb.cluster_centers_) <= 2.0)
    X = np.vstack(data.clients)
    inertia = lambda C: float((((X[:, None] - C[None]) ** 2).sum(-1)).min(1).sum())  # noqa: E731
    assert inertia(mb.cluster_centers_) < 1.2 * inertia(dwf.cluster_centers_)
    for params in ({"server_rate": 0.5}, {"clients_per_round": 0.5}):
        other = make_estimator("minibatch", n_clusters=5, random_state=0, crypto="ideal", protection=dp(),
                               **params).fit(data)
        assert not other.dp_plan_.private_start, params
        assert other.protection_report_["GaussianDP"]["radius"] is None, params


def test_first_round_prior_is_the_start_only_at_high_noise():
    """The first of several Lloyd rounds shrinks towards the spread start when the noise level e
    exceeds E_s = 0.35, else towards the overall mean (hierarchical)."""
    d = fl.setting_delta(150)
    noisy = plan(3, 4, 0.25, d, -1.0, 1.0, 150, seed=0)  # iris at eps 0.25: e = 0.40, R = 2
    quiet = plan(3, 4, 1.0, d, -1.0, 1.0, 150, seed=0)  # e = 0.12, R = 3
    one = plan(3, 4, 0.1, d, -1.0, 1.0, 150, seed=0)  # e = 0.88: one round (its prior is the start anyway)
    assert NOISE_START_PRIOR == 0.35
    assert noisy.rounds == 2 and noisy.noise_level > NOISE_START_PRIOR and noisy.first_round_prior == "start"
    assert quiet.rounds == 3 and quiet.first_round_prior == "overall mean"
    assert one.rounds == 1 and one.first_round_prior == "overall mean"
    assert noisy.describe()["first_round_prior"] == "start"
    # wine at eps 0.5 (e = 0.32, R = 2) stays hierarchical
    wine = plan(3, 13, 0.5, fl.setting_delta(178), -1.0, 1.0, 178, seed=0)
    assert wine.rounds == 2 and wine.first_round_prior == "overall mean"


def test_first_round_with_start_prior_shrinks_towards_the_start_and_moves_empty_rows_to_the_mean():
    from securefkm.layers import RoundContext
    from securefkm.messages import Broadcast, FieldSpec

    dp = GaussianDP(1.0, 1e-5, bounds=(-1.0, 1.0), shrink="step")
    dp._d, dp.radius_bound = 3, RadiusBound(first_train=0)
    C = np.array([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0], [-0.5, -0.5, -0.5]])
    ctx = RoundContext(run=0, round=0, action="train", sampled=(0,), specs=(), info=None,
                       broadcast=Broadcast(action="train", centres=C))
    specs = (FieldSpec("n", (3,), "count", integer=True), FieldSpec("S", (3, 3), "sum", weighted_by="n"))
    sums = {"n": np.array([50.0, 0.5, 40.0]), "S": np.array([[40.0, 40, 40], [9, 9, 9], [-20.4, -20, -19.6]])}
    sigmas = {"n": (2.0, 0, 0), "S": (3.0, 0, 0)}
    dp.plan = {"rounds": 2, "first_round_prior": "start"}
    a = dp.post_processing.shrunk(dict(sums), specs, sigmas, "train", ctx)
    means = a["S"] / a["n"][:, None]
    raw0 = sums["S"][0] / 50.0
    factor = 1 - 3 * (3.0 / 50) ** 2 / np.sum((raw0 - C[0]) ** 2)
    np.testing.assert_allclose(means[0], C[0] + factor * (raw0 - C[0]))  # towards its start point
    np.testing.assert_allclose(means[2], C[2])  # a step within the noise: no move
    target = dp.post_processing.hierarchical_target(sums["n"], sums["S"], 3.0)
    assert a["n"][1] == 2.0 and np.allclose(means[1], target) and not np.allclose(means[1], C[1])
    # the same round under an overall-mean prior is the hierarchical rule
    dp.plan = {"rounds": 2, "first_round_prior": "overall mean"}
    b = dp.post_processing.shrunk(dict(sums), specs, sigmas, "train", ctx)
    dp.shrink = "hierarchical"
    np.testing.assert_array_equal(b["S"], dp.post_processing.shrunk(dict(sums), specs, sigmas, "train", ctx)["S"])
    assert not np.allclose(a["S"][0], b["S"][0])


@pytest.mark.slow
def test_start_prior_beats_the_overall_mean_on_iris_at_eps_quarter(monkeypatch):
    """Paired, seeded noise, tuning seeds 1000-1009 (central): the start prior above E_s against a
    first round that is always hierarchical (E_s = inf) on iris at eps 0.25 in FastLloyd's
    setting; on the 100 tuning seeds the gain is 0.60 +- 0.12 (protocols/dp/planning.py)."""
    import protocols.dp.planning as planning

    ref = reference_loss(np.vstack(fl.setting_data("iris", 0)[0]), 3)

    def ratios():
        out = []
        for s in range(1000, 1010):
            clients, k = fl.setting_data("iris", s)
            dp = GaussianDP(0.25, fl.setting_delta(150), bounds=(-1.0, 1.0), rng="seeded")
            est = WeightedFederatedKMeans(k, protection=[dp], random_state=s).fit(clients)
            assert est.privacy_spent_[0] <= 0.25
            out.append(loss(np.vstack(clients), est.cluster_centers_) / ref)
        return np.mean(out)

    new = ratios()
    monkeypatch.setattr(planning, "NOISE_START_PRIOR", float("inf"))
    old = ratios()
    assert new < old - 0.2, (new, old)


def test_auto_radius_is_fastlloyds_capped_by_the_volume_matched_ball():
    """r = min(FastLloyd's diag * 0.8 / (2 k^(1/d)), 1.25 x the radius of the d-ball of volume
    vol(box) / k): FastLloyd's in low d, the cap from d = 6 on (cube boxes)."""
    def fastlloyd(k, d):
        return 2 * math.sqrt(d) * 0.8 / (2 * k ** (1 / d))

    # d = 2: the disc of area 4 / k (the square [-1, 1]^2 split k ways)
    assert volume_radius([2.0, 2.0], 4) == pytest.approx(1 / math.sqrt(math.pi))
    assert volume_radius([2.0, 2.0], 1) == pytest.approx(2 / math.sqrt(math.pi))
    for k, d in [(3, 4), (8, 5), (5, 2)]:  # iris, the off-table k = 8 d = 5, blobs: unchanged
        assert auto_radius(2 * math.sqrt(d), k, d, sides=np.full(d, 2.0)) == pytest.approx(fastlloyd(k, d))
    for k, d, ratio in [(3, 13, 0.873), (2, 30, 0.816), (10, 64, 0.788)]:  # wine, breast cancer, digits
        r = auto_radius(2 * math.sqrt(d), k, d, sides=np.full(d, 2.0))
        assert r == pytest.approx(VOLUME_FACTOR * volume_radius(np.full(d, 2.0), k))
        assert r / fastlloyd(k, d) == pytest.approx(ratio, abs=1e-3)
    # a flat side (zero width) or no sides: FastLloyd's radius
    assert auto_radius(2 * math.sqrt(30), 2, 30, sides=np.r_[np.full(29, 2.0), 0.0]) == pytest.approx(fastlloyd(2, 30))
    assert auto_radius(2 * math.sqrt(30), 2, 30) == pytest.approx(fastlloyd(2, 30))


def test_private_seeding_grid_follows_the_plans_noise():
    """With the plan's noise level e, the 2-D/3-D private seeding grid has clip(0.3 / e, 4, 16)
    cells per cluster (16-32 were too noisy at 0.02 < e < 0.1); without a plan, 16."""
    from securefkm.algorithms._seeding import lsh_bits

    assert lsh_bits(5, 2) == 7 and lsh_bits(5, 2, noise_level=0.0035) == 7  # large data: 16 per cluster
    assert lsh_bits(5, 2, noise_level=0.088) == 5  # 4 cells per cluster: 20 -> 32 buckets
    assert lsh_bits(2, 2, noise_level=0.04) == 4 and lsh_bits(2, 2) == 6
    assert lsh_bits(10, 8, noise_level=0.088) == lsh_bits(10, 8)  # hyperplanes (d > 3): unchanged
    # the estimator hands the plan's e to the seeding round: 250 records, k = 5, eps 1 (e = 0.088)
    from sklearn.datasets import make_blobs

    X, _ = make_blobs(250, n_features=2, centers=5, cluster_std=0.8, random_state=302)
    X = 2 * (X - X.min(axis=0)) / (X.max(axis=0) - X.min(axis=0)) - 1
    dp = GaussianDP(1.0, fl.setting_delta(250), bounds=(-1.0, 1.0), rng="seeded")
    est = WeightedFederatedKMeans(5, protection=[dp], random_state=1000).fit(np.array_split(X, 2))
    assert est.dp_plan_.private_start and 0.08 < est.dp_plan_.noise_level < 0.1
    first = est.transcript_.rounds[0]
    assert first.action == "init.private"
    assert {b.params["bits"] for b in first.broadcasts.values()} == {5}


def _setting_fits(n, k, std, random_state, epsilon, seeds):
    """The defaults in FastLloyd's setting (2-D blobs min-max scaled to [-1, 1], shuffled by the
    seed over 2 clients, delta = 1/(N ln N), seeded noise): yields (estimator, records, best
    central loss) per seed."""
    from sklearn.datasets import make_blobs

    X0, _ = make_blobs(n, n_features=2, centers=k, cluster_std=std, random_state=random_state)
    X0 = 2 * (X0 - X0.min(axis=0)) / (X0.max(axis=0) - X0.min(axis=0)) - 1
    ref = reference_loss(X0, k)
    for s in seeds:
        X = X0[np.random.default_rng(s).permutation(n)]
        dp = GaussianDP(epsilon, fl.setting_delta(n), bounds=(-1.0, 1.0), rng="seeded")
        yield WeightedFederatedKMeans(k, protection=[dp], random_state=s, crypto="ideal").fit(np.array_split(X, 2)), X, ref


def test_final_lloyd_round_gets_the_budget_of_the_rounds_before_it():
    """R >= 3: the plan weights its last Lloyd round R - 1 (``last_round_weights``), so the noise
    that stays in the centres is smaller. 400 records, k = 2 (a near-optimal cell for FastLloyd),
    eps 1, tuning seeds 1000-1005, seeded noise: mean loss / best central loss 1.031 (1.075 with
    equal weights; FastLloyd 1.019 on these seeds)."""
    from protocols.dp.planning import final_round_weight

    assert [final_round_weight(r) for r in (1, 2, 3, 4, 6)] == [1.0, 1.0, 2.0, 3.0, 5.0]
    ratios = []
    for est, X, ref in _setting_fits(400, 2, 2.0, 304, 1.0, range(1000, 1006)):
        p, rep = est.dp_plan_, est.protection_report_["GaussianDP"]
        assert p.rounds == 4 and p.final_round_weight == 3.0 and p.describe()["final_round_weight"] == 3.0
        assert rep["planned_schedule"] == [(1.0, 3), (3.0, 1), (4.0, 1)]  # Lloyd rounds, the last, the seeding
        assert rep["last_round_noise_multipliers"] == {"train": pytest.approx(rep["noise_multiplier"] / math.sqrt(3))}
        assert est.privacy_spent_[0] <= 1.0 and est.privacy_spent_[1] <= fl.setting_delta(400)
        ratios.append(loss(X, est.cluster_centers_) / ref)
    assert np.mean(ratios) < 1.05


def test_2d_rows_below_the_count_floor_move_next_to_the_largest_clusters():
    """d <= 2 under a plan of R >= 3 rounds: a row whose noisy count is below one count sigma is
    moved half the radius from the mean of the row with the largest count, towards its own
    centre, with the floor as its count; the others stay as released. Without the plan's flag
    (or in d >= 3, where the step shrinkage keeps such a row's centre) nothing moves here."""
    from types import SimpleNamespace

    from securefkm.messages import Broadcast, FieldSpec

    specs = (FieldSpec("weights", (3,), "count", integer=True),
             FieldSpec("weighted_centres", (3, 2), "sum", weighted_by="weights"))
    centres = np.array([[-0.5, 0.5], [0.5, 0.5], [-0.9, -0.9]])
    n = np.array([80.0, 120.0, 4.0])
    S = np.array([[-40.0, 40.0], [60.0, 72.0], [-37.0, 22.0]])  # row 2: noise over a count of 4
    sums = {"weights": n, "weighted_centres": S}
    sigmas = {"weights": (10.0, 0.0, 1.0), "weighted_centres": (5.0, 0.0, 1.0)}
    ctx = SimpleNamespace(round=1, action="train", broadcast=Broadcast("train", centres=centres))
    dp = GaussianDP(1.0, 1e-5, bounds=(-1.0, 1.0), shrink="step")
    dp.radius_bound = RadiusBound(0.4)
    dp.plan = {"rounds": 3, "relocate_low_count_rows": True}
    out = dp.post_processing.shrunk(sums, specs, sigmas, "train", ctx)
    np.testing.assert_array_equal(out["weights"], [80.0, 120.0, 10.0])
    np.testing.assert_array_equal(out["weighted_centres"][:2], S[:2])
    big = S[1] / n[1]
    u = (centres[2] - big) / np.linalg.norm(centres[2] - big)
    np.testing.assert_allclose(out["weighted_centres"][2] / 10.0, big + 0.2 * u)
    dp.plan = {"rounds": 2, "relocate_low_count_rows": False}
    assert dp.post_processing.shrunk(sums, specs, sigmas, "train", ctx) is sums
    assert plan(3, 2, 0.5, 1e-4, -1.0, 1.0, 200, seed=0).describe()["relocate_low_count_rows"]
    assert not plan(3, 2, 0.25, 1e-4, -1.0, 1.0, 200, seed=0).describe()["relocate_low_count_rows"]


def test_2d_plan_leaves_no_centre_without_records():
    """200 records, k = 3 in 2-D, eps 0.5 (e = 0.115, spread start, R = 3), tuning seeds
    1000-1007, seeded noise: with the relocation every returned centre is the nearest of some
    record and the mean loss / best central loss is 1.72 (without it 4 of the 8 fits kept a centre
    on the box's edge without records, mean 2.27; FastLloyd 1.96 over seeds 1000-1039)."""
    ratios = []
    for est, X, ref in _setting_fits(200, 3, 1.5, 101, 0.5, range(1000, 1008)):
        assert est.dp_plan_.rounds == 3 and est.dp_plan_.start is not None
        assert est.privacy_spent_[0] <= 0.5
        C = est.cluster_centers_
        assert len(np.unique(((X[:, None] - C[None]) ** 2).sum(axis=2).argmin(axis=1))) == 3
        ratios.append(loss(X, C) / ref)
    assert np.mean(ratios) < 2.0


def test_a_plan_is_applied_by_a_validated_copy_of_the_layer():
    """Planning swaps the fit's DP layer for ``layer.with_plan(...)``, built through the
    constructor's checks; the user's layer and the fit's original copy are never changed."""
    import numpy as np
    import pytest

    from protocols.dp import GaussianDP
    from securefkm.estimators.dwf import WeightedFederatedKMeans
    from securefkm.exceptions import InputError

    user = GaussianDP(1.0, 1e-5, bounds=(-2.0, 2.0))
    rng = np.random.default_rng(0)
    clients = [np.clip(rng.normal(size=(50, 2)), -2, 2) for _ in range(4)]
    est = WeightedFederatedKMeans(3, protection=[user], crypto="ideal", random_state=0)
    fed, _ = est.make_federation(clients)
    planned = fed.layers[0]
    assert planned is not user and planned.plan == est.dp_plan_.describe()
    assert (planned.radius, planned.shrink) == ("auto", "step") and (user.radius, user.shrink) == (None, None)
    assert user.plan is None and repr(planned) == repr(user)
    copy = user.with_plan({"rounds": 2}, shrink="step")
    assert copy.shrink == "step" and copy.epsilon == user.epsilon and user.shrink is None
    with pytest.raises(InputError, match="shrink"):
        user.with_plan({}, shrink="bogus")
    with pytest.raises(InputError, match="not epsilon"):
        user.with_plan({}, epsilon=3.0)


def test_a_fit_builds_its_protection_list_once(monkeypatch):
    """Text and dict specs are built into layers once per fit (the fit's own copies); the DP
    plan's validated copy is the one further GaussianDP construction."""
    import warnings

    import numpy as np

    from securefkm import registry

    built = []
    real = registry._construct
    monkeypatch.setattr(registry, "_construct", lambda name, cls, params: built.append(name) or real(name, cls, params))
    rng = np.random.default_rng(0)
    clients = [np.clip(rng.normal(size=(50, 2)), -2, 2) for _ in range(4)]
    for name, params in (("dwf", {}), ("minibatch", {}), ("aligning", {"secure_mode": True}), ("fcm-fedavg", {})):
        cls, fixed = registry.estimator_class(name)
        est = cls(n_clusters=3, crypto="ideal", random_state=0, **fixed, **params,
                  protection="dp:epsilon=1:delta=1e-5:bounds=[-2,2]:mode=distributed,masking")  # text: built by fit
        built.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(clients)
        assert sorted(built) == ["dp", "masking"], (name, built)
