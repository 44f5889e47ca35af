"""Weighted DP round schedules (GaussianDP(round_weights=...)), count_share="auto" and the
post-processing of the private seeding (James-Stein shrinkage, top-k fallback)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from protocols.dp import GaussianDP
from protocols.dp.budget import Budget
from protocols.dp.accounting import (
    PrivacyAccountant,
    epsilon_for_history,
    gdp_epsilon,
    noise_multiplier_for,
    noise_multiplier_for_schedule,
    schedule_history,
)
from securefkm.algorithms import _seeding
from securefkm.algorithms.base import Algorithm, AlgorithmState
from securefkm.exceptions import InputError, PrivacyBudgetExceededError
from securefkm.federation import Federation
from securefkm.messages import Broadcast, FieldSpec, Update

pytest.importorskip("opacus")


class SeedThenTrain(Algorithm):
    """Fake algorithm: one 'seed' round, then 'train' rounds; count + sum fields of width d."""

    name = "seedtrain"

    def __init__(self, rounds=2, with_schedule=True):
        self.n_clusters = 1
        self.rounds = rounds
        self.seen = []
        if with_schedule:
            self.planned_actions = lambda max_rounds: {"seed": 1, "train": min(max_rounds, self.rounds)}

    def init(self, n_clients, n_features, rng):
        return AlgorithmState(centres=np.zeros((1, n_features)), phase="init")

    def configure(self, state, round):
        return Broadcast(action="seed" if state.phase == "init" else "train", centres=state.centres)

    def sum_fields(self, broadcast):
        d = broadcast.centres.shape[1]
        return (FieldSpec("count", (1,), "count", integer=True), FieldSpec("total", (1, d), "sum"))

    def client_update(self, X, broadcast, rng, memory=None):
        return Update(sums={"count": np.array([float(len(X))]), "total": X.sum(axis=0, keepdims=True)})

    def aggregate(self, state, agg):
        self.seen.append(dict(agg.sums))
        centres = agg.sums["total"] / max(agg.sums["count"][0], 1.0)
        if state.phase == "init":
            return replace(state, centres=centres, phase="train")
        return replace(state, round=state.round + 1, centres=centres)

    def converged(self, state):
        return state.round >= self.rounds

    def planned_rounds(self, max_rounds):
        return min(max_rounds, self.rounds) + 1


def _clients(n=4, m=50, d=3, seed=0):
    rng = np.random.default_rng(seed)
    return [np.clip(rng.normal(size=(m, d)), -1, 1) for _ in range(n)]


def _layer(fed):
    return next(layer for layer in fed.layers if isinstance(layer, GaussianDP))


# ------------------------------------------------------------------ accounting of a schedule
def test_schedule_calibration_is_the_exact_gdp_of_the_heterogeneous_mechanisms():
    from opacus.accountants import PRVAccountant

    schedule = [(0.5, 1), (1.0, 3)]
    z = noise_multiplier_for_schedule(1.0, 1e-5, schedule)
    hist = schedule_history(z, schedule)
    assert hist == [(z / math.sqrt(0.5), 1.0, 1), (z, 1.0, 3)]
    # full participation: the composition is mu-GDP with mu^2 = sum_i n_i / z_i^2, evaluated exactly
    mu = math.sqrt(sum(n / zi**2 for zi, _, n in hist))
    eps = epsilon_for_history(hist, 1e-5)
    assert eps == gdp_epsilon(mu, 1e-5) and 1.0 - 1e-9 <= eps <= 1.0  # the whole target, on the safe side
    assert epsilon_for_history(schedule_history(0.999 * z, schedule), 1e-5) > 1.0
    # opacus's PRV composes the same mechanisms numerically: the upper end of its error interval
    acc = PRVAccountant()
    acc.history = list(hist)
    eps_opacus = acc.get_epsilon(delta=1e-5)
    assert eps <= eps_opacus < eps + 0.05
    # a uniform schedule is the old single-z calibration
    assert noise_multiplier_for_schedule(1.0, 1e-5, [(1.0, 4)]) == pytest.approx(noise_multiplier_for(1.0, 1e-5, 4, 1.0))


def test_accountant_steps_with_their_own_noise_multiplier():
    acc = PrivacyAccountant(5.0, 1.25, 1e-5)  # below the all-at-z_min bound: exact value reported
    acc.step(1.0, noise_multiplier=8.0)
    acc.step(1.0)
    acc.step(1.0)
    assert acc.history == [(8.0, 1.0, 1), (5.0, 1.0, 2)]
    assert acc.spent()[0] == pytest.approx(epsilon_for_history([(8.0, 1.0, 1), (5.0, 1.0, 2)], 1e-5))


def test_layer_with_round_weights_charges_each_round_at_its_noise():
    from opacus.accountants import PRVAccountant

    algo = SeedThenTrain(rounds=2)
    dp = GaussianDP(1.0, 1e-5, bounds=(-1, 1), count_share=0.2, round_weights={"seed": 0.25})
    fed = Federation(algo, _clients(), protection=[dp], max_rounds=2, random_state=0)
    fed.run()
    layer = _layer(fed)
    rep = layer.report()
    z = rep["noise_multiplier"]
    assert rep["planned_schedule"] == [(0.25, 1), (1.0, 2)]
    assert rep["round_noise_multipliers"] == {"seed": pytest.approx(2 * z)}
    eps = rep["privacy_spent"][0]
    assert eps == pytest.approx(gdp_epsilon(math.sqrt(1 / (2 * z) ** 2 + 2 / z**2), 1e-5), abs=1e-12)
    acc = PRVAccountant()
    acc.history = [(2 * z, 1.0, 1), (z, 1.0, 2)]
    assert eps <= acc.get_epsilon(delta=1e-5)  # opacus's numerical bound of the same composition
    assert eps <= 1.0 and fed.privacy_spent()[0] == eps
    # the last (train) round's sigmas: z / sqrt(share), R = sqrt(3) (box [-1, 1]^3)
    assert rep["field_sigmas"]["count"] == pytest.approx(z / math.sqrt(0.2), rel=1e-5)
    assert rep["field_sigmas"]["total"] == pytest.approx(z * math.sqrt(3) / math.sqrt(0.8), rel=1e-4)  # + lattice term
    # same budget as 3 equal rounds at z_u: mu^2 = 1/(2z)^2 + 2/z^2 = 3/z_u^2 -> z = z_u sqrt(3/4)
    unweighted = GaussianDP(1.0, 1e-5, bounds=(-1, 1), count_share=0.2)
    Federation(SeedThenTrain(rounds=2), _clients(), protection=[unweighted], max_rounds=2)
    assert z == pytest.approx(unweighted.z * math.sqrt(0.75), rel=0.03)


def test_round_weights_without_planned_actions_assume_the_heaviest_weight():
    algo = SeedThenTrain(rounds=2, with_schedule=False)
    dp = GaussianDP(1.0, 1e-5, bounds=(-1, 1), round_weights={"seed": 0.25})
    fed = Federation(algo, _clients(), protection=[dp], max_rounds=2, random_state=0)
    fed.run()
    rep = _layer(fed).report()
    assert rep["planned_schedule"] == [(1.0, 3)]  # unknown split: every round at weight 1
    assert rep["noise_multiplier"] == pytest.approx(noise_multiplier_for(1.0, 1e-5, 3, 1.0))
    assert rep["privacy_spent"][0] <= 1.0


def test_weighted_schedule_refuses_rounds_past_the_budget():
    algo = SeedThenTrain(rounds=6)
    z = noise_multiplier_for_schedule(1.0, 1e-5, [(0.5, 1), (1.0, 2)])
    dp = GaussianDP(1.0, 1e-5, bounds=(-1, 1), noise_multiplier=z, round_weights={"seed": 0.5})
    fed = Federation(algo, _clients(), protection=[dp], max_rounds=6, random_state=0)
    with pytest.raises(PrivacyBudgetExceededError, match="budget"):
        fed.run()
    assert len(algo.seen) == 3  # seeding + the 2 Lloyd rounds the budget covers
    assert _layer(fed).report()["privacy_spent"][0] <= 1.0


def test_within_plan_is_dominance_by_the_calibrated_schedule():
    dp = GaussianDP(1.0, 1e-5, bounds=(-1, 1), round_weights={"seed": 0.25})
    Federation(SeedThenTrain(rounds=2), _clients(), protection=[dp], max_rounds=2)
    z = dp.z  # plan: one seed round at 2z, two train rounds at z
    assert dp.budget.within_plan([(2 * z, 1.0, 1), (z, 1.0, 2)]) and dp.budget.within_plan([(z, 1.0, 2)])
    assert dp.budget.within_plan([(3 * z, 1.0, 3)])  # every round noisier than planned
    assert not dp.budget.within_plan([(z, 1.0, 3)])  # the seed round taken at the train rounds' noise
    assert not dp.budget.within_plan([(2 * z, 1.0, 1), (z, 1.0, 3)])  # one round more
    assert not dp.budget.within_plan([(0.99 * z, 1.0, 1)])  # an under-noised (aborted) round
    given = GaussianDP(1.0, 1e-5, bounds=(-1, 1), noise_multiplier=z)
    Federation(SeedThenTrain(rounds=2), _clients(), protection=[given], max_rounds=2)
    assert not given.budget.within_plan([(10 * z, 1.0, 1)])  # z given, nothing calibrated: always the accountant


@pytest.mark.parametrize("weights", [None, {"seed": 0.25}])
def test_rounds_within_the_plan_skip_the_accountant_and_change_nothing(monkeypatch, weights):
    import inspect

    calls = []
    real = PrivacyAccountant._epsilon

    def counted(self, history):
        calls.append(inspect.stack()[1].function)
        return real(self, history)

    monkeypatch.setattr(PrivacyAccountant, "_epsilon", counted)
    fits = []
    for fast in (True, False):
        calls.clear()
        algo = SeedThenTrain(rounds=3)
        dp = GaussianDP(1.0, 1e-5, bounds=(-1, 1), round_weights=weights, rng="seeded")
        if not fast:
            monkeypatch.setattr(Budget, "within_plan", lambda self, history: False)  # the exact check every round
        fed = Federation(algo, _clients(), protection=[dp], max_rounds=3, random_state=0)
        state = fed.run()
        fits.append((state.centres, fed.privacy_spent(), calls.count("refusal")))
    (c_fast, spent_fast, n_fast), (c_exact, spent_exact, n_exact) = fits
    assert n_fast == 0 and n_exact == 4  # 4 planned rounds: the accountant in every one, or in none
    assert np.array_equal(c_fast, c_exact) and spent_fast == spent_exact and spent_fast[0] <= 1.0


def test_round_weights_validation():
    with pytest.raises(InputError, match="round_weights"):
        GaussianDP(1.0, 1e-5, clip=1.0, round_weights={"seed": 0.0})
    with pytest.raises(InputError, match="round_weights"):
        GaussianDP(1.0, 1e-5, clip=1.0, round_weights=[0.5])


@pytest.mark.parametrize("kw", [{"count_share": "auto"}, {}], ids=["explicit", "default"])
def test_count_share_auto_is_fastlloyds_split(kw):
    d = 3
    dp = GaussianDP(1.0, 1e-5, bounds=(-1, 1), **kw)
    fed = Federation(SeedThenTrain(rounds=1), _clients(d=d), protection=[dp], max_rounds=1, random_state=0)
    fed.run()
    rep = _layer(fed).report()
    z, c = rep["noise_multiplier"], 1 / (1 + 2 * math.sqrt(d))  # c / (1 - c) = sqrt(d) / (rho R), rho = 1/2
    assert rep["field_sigmas"]["count"] == pytest.approx(z / math.sqrt(c), rel=1e-5)
    assert rep["field_sigmas"]["total"] == pytest.approx(z * math.sqrt(d) / math.sqrt(1 - c), rel=1e-4)  # + lattice term


def test_dwf_planned_actions_add_up_to_planned_rounds():
    from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm

    for init, score in (("private", False), ("private", True), ("uniform", False), (np.zeros((2, 2)), False)):
        algo = WeightedFederatedKMeansAlgorithm(2, init=init, init_bounds=(-1, 1), score_round=score)
        actions = algo.planned_actions(3)
        assert sum(actions.values()) == algo.planned_rounds(3)
        assert ("init.private" in actions) == (isinstance(init, str) and init == "private")


# ------------------------------------------------------------------ seeding post-processing
def test_shrink_means_lowers_the_error_of_noisy_means():
    rng = np.random.default_rng(0)
    d, m, sigma = 32, 40, 50.0
    true = rng.normal(size=(m, d)) * 2
    counts = np.full(m, 30.0)
    noisy = true + rng.normal(size=(m, d)) * sigma / counts[:, None]
    shrunk = _seeding.shrink_means(noisy, counts, sigma, true.mean(axis=0))
    assert np.sum((shrunk - true) ** 2) < 0.8 * np.sum((noisy - true) ** 2)
    # no noise: no change; fewer than 3 dimensions: no change
    assert np.allclose(_seeding.shrink_means(true, counts, 0.0, np.zeros(d)), true)
    assert np.array_equal(_seeding.shrink_means(noisy[:, :2], counts, sigma, np.zeros(2)), noisy[:, :2])


def test_private_seeding_falls_back_to_the_largest_buckets_not_to_the_box():
    """With fewer than k buckets above the noise threshold the seeding used to fill in uniform
    points of the box (far from the data in high dimension); now the k largest noisy counts."""
    rng = np.random.default_rng(1)
    d, n_buckets, k = 16, 64, 6
    counts = rng.normal(0, 10, n_buckets)  # sigma_hat ~ 10: the threshold is ~30
    sums = rng.normal(0, 5, (n_buckets, d))
    counts[:4] = [100, 90, 25, 20]  # only 2 clear the threshold
    sums[:4] = counts[:4, None] * 0.5  # these buckets' mean: 0.5 in every coordinate
    centres = _seeding._private_seeding_centres({"bucket_counts": counts, "bucket_sums": sums}, k, rng, (-10, 10))
    assert centres.shape == (k, d)
    assert np.all(np.abs(centres) <= 3)  # near the data / the overall mean, not box corners (|x| ~ 10)


def test_last_round_weights_noise_the_last_planned_round_less_and_charge_it_exactly(monkeypatch):
    """``last_round_weights={"train": 2}``: the last of DWF's planned training rounds (from its
    ``planned_sequence``) is noised at z / sqrt(2), the others at z; the calibrated schedule is
    [(1, 2), (2, 1)] and the charge is the exact GDP composition of those three rounds."""
    from securefkm.estimators.dwf import WeightedFederatedKMeans

    sigmas = []

    def record(val, sigma, step, source=None):
        sigmas.append(sigma)
        return np.array(val, dtype=np.float64)

    monkeypatch.setattr(GaussianDP, "_noise_fine", staticmethod(record))
    clients = _clients()
    start = np.array([[-0.5, 0.0, 0.0], [0.5, 0.0, 0.0]])
    dp = GaussianDP(1.0, 1e-5, bounds=(-1, 1), last_round_weights={"train": 2.0})
    est = WeightedFederatedKMeans(2, init=start, max_rounds=3, tol=0.0, protection=[dp], random_state=0)
    est.fit(clients)
    rep = est.protection_report_["GaussianDP"]
    z = rep["noise_multiplier"]
    assert rep["planned_schedule"] == [(1.0, 2), (2.0, 1)]
    assert rep["last_round_noise_multipliers"] == {"train": pytest.approx(z / math.sqrt(2))}
    counts = sigmas[0::2]  # (count, sum) per round, in spec order
    assert len(counts) == 3
    assert counts[0] == pytest.approx(counts[1]) and counts[2] == pytest.approx(counts[0] / math.sqrt(2))
    eps = rep["privacy_spent"][0]
    assert eps == pytest.approx(gdp_epsilon(math.sqrt(2 / z**2 + 2 / z**2), 1e-5), abs=1e-9)
    assert eps <= 1.0
    # same budget as 4 equal rounds: mu^2 = 2 / z^2 + 2 / z^2 = 4 / z_u^2 -> z = z_u
    assert z == pytest.approx(noise_multiplier_for(1.0, 1e-5, 4, 1.0), rel=0.03)
    # without a planned_sequence the weight is not used at all (neither calibrated nor applied)
    algo = SeedThenTrain(rounds=2)
    plain = GaussianDP(1.0, 1e-5, bounds=(-1, 1), last_round_weights={"train": 2.0})
    Federation(algo, _clients(), protection=[plain], max_rounds=2).run()
    assert plain.report()["planned_schedule"] == [(1.0, 3)] and plain.report()["last_round_noise_multipliers"] == {}
    with pytest.raises(InputError, match="last_round_weights"):
        GaussianDP(1.0, 1e-5, bounds=(-1, 1), last_round_weights={"train": 0.0})


def test_spent_stays_within_target_when_the_charged_history_sums_in_another_order():
    """A DP plan of three noise levels (private seeding weight R, R - 2 Lloyd rounds, the
    final round weight R - 1): the layer's charged history, grouped per level and summed in
    its own order, evaluated 0.25000000000000094 for a target of 0.25 when the calibration
    was exact to the last bit (this test failed with ``accounting.CALIBRATION_MARGIN = 0``); the
    calibration's relative margin keeps it within target."""
    import warnings

    from sklearn.datasets import make_blobs

    from securefkm import WeightedFederatedKMeans

    X, _ = make_blobs(1500, n_features=2, centers=7, cluster_std=1.0, random_state=14)
    X = 2 * (X - X.min(axis=0)) / (X.max(axis=0) - X.min(axis=0)) - 1
    delta = 1 / (1500 * np.log(1500))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = WeightedFederatedKMeans(7, protection=[GaussianDP(0.25, delta, bounds=(-1.0, 1.0), rng="seeded")],
                                      random_state=2000).fit(np.array_split(X, 2))
    assert est.privacy_spent_[0] <= 0.25 and est.privacy_spent_[1] <= delta, est.privacy_spent_
