"""Candidate-vote refinement (PE-means's generations as DWF rounds): the vote field, the plan's
rule and accounting, and what the rounds do to the centres."""

from __future__ import annotations


import numpy as np
import pytest
from sklearn.datasets import make_blobs

from protocols.dp import GaussianDP
from protocols.dp.planning import REFINE_ROUNDS, refine_applies, refine_mutants
from protocols.masking import PairwiseMasking
from securefkm.algorithms import _candidate_vote as cv
from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
from securefkm.domain import Ball
from securefkm.estimators.dwf import WeightedFederatedKMeans
from securefkm.exceptions import InputError
from securefkm.messages import Broadcast

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _ball_blobs(n=2000, k=16, d=4, seed=3):
    X, y = make_blobs(n_samples=n, n_features=d, centers=k, random_state=seed, cluster_std=0.5)
    X -= X.mean(axis=0)
    X /= np.linalg.norm(X, axis=1).max()
    return X, y


def _fit(X, k, eps, mode="central", rng="system", seed=0, **kw):
    layers = [GaussianDP(eps, len(X) ** -1.1, clip=1.0, mode=mode, rng=rng)]
    if mode == "distributed":
        layers.append(PairwiseMasking())
    return WeightedFederatedKMeans(k, protection=layers, random_state=seed, crypto="ideal", **kw).fit(
        np.array_split(X, 2))


def test_vote_field_is_a_count_of_sensitivity_one_summing_to_the_records():
    X, _ = _ball_blobs(n=301)
    algo = WeightedFederatedKMeansAlgorithm(16, refine_rounds=1)
    population = cv.candidates(X[:16], 3, 0, np.random.default_rng(0), Ball(0.0, 1.0))
    assert population.shape == (64, 4)
    b = Broadcast(action="refine", centres=population)
    (spec,) = algo.sum_fields(b)
    assert (spec.name, spec.shape, spec.kind, spec.integer, spec.cells) == ("votes", (64,), "count", True, 1)
    layer = GaussianDP(1.0, 1e-5, clip=1.0)
    assert layer.sensitivity(spec, 4) == 1.0
    votes = algo.client_update(X, b, None).sums["votes"]
    assert votes.sum() == len(X) and np.all(votes >= 0)
    # one record more: exactly one count moves, by exactly 1 (L2 distance 1)
    more = algo.client_update(np.vstack([X, X[:1] * 0.5]), b, None).sums["votes"]
    assert np.abs(more - votes).sum() == 1.0 and np.linalg.norm(more - votes) == 1.0


def test_threshold_keeps_the_largest_counts_down_to_n_and_zeros_negatives():
    noisy = np.array([5.0, -2.0, 9.0, 1.0, 3.0])
    assert cv.threshold_counts(noisy, 12).tolist() == [5.0, 0.0, 9.0, 0.0, 0.0]  # 9 + 5 reaches 12
    assert cv.threshold_counts(noisy, 100).tolist() == [5.0, 0.0, 9.0, 1.0, 3.0]  # never reached: positives


def test_mutant_steps_shrink_by_half_per_generation_and_stay_in_the_domain():
    C = np.array([[0.0, 0.0], [0.4, 0.0], [0.9, 0.0]])
    assert cv.step_sizes(C, 0).tolist() == pytest.approx([0.2, 0.2, 0.25])
    assert cv.step_sizes(C, 2).tolist() == pytest.approx([0.05, 0.05, 0.0625])
    pop = cv.candidates(C, 50, 0, np.random.default_rng(1), Ball(0.0, 1.0))
    assert pop.shape == (153, 2) and np.all(np.linalg.norm(pop, axis=1) <= 1.0 + 1e-12)
    assert np.array_equal(pop[:3], C)


def test_refinement_escapes_a_local_optimum_that_lloyd_keeps():
    """No noise: two centres in one blob, one between two blobs. Lloyd's rounds keep the split
    blob's centres; the vote rounds' re-clustering of the candidates finds the three blobs."""
    rng = np.random.default_rng(0)
    truth = np.array([[-0.6, 0.0], [0.0, 0.0], [0.6, 0.0]])
    X = np.vstack([t + 0.03 * rng.standard_normal((300, 2)) for t in truth])
    start = np.array([[-0.62, 0.0], [-0.58, 0.0], [0.3, 0.0]])
    fits = {G: WeightedFederatedKMeans(3, init=start, refine_rounds=G, max_rounds=20, random_state=0).fit(
        np.array_split(X, 2)) for G in (0, 3)}
    def err(c):
        return float(np.abs(np.sort(c[:, 0]) - truth[:, 0]).max())
    assert err(fits[0].cluster_centers_) > 0.2  # Lloyd: stuck
    assert err(fits[3].cluster_centers_) < 0.01


def test_rule_applies_for_many_clusters_in_moderate_dimension_only():
    assert refine_applies(16, 4) and refine_applies(64, 16) and refine_applies(64, 64)
    assert not refine_applies(15, 16) and not refine_applies(10, 4) and not refine_applies(16, 3)
    assert not refine_applies(16, 65) and not refine_applies(3, 4)
    assert refine_mutants(16, 20000, 1e-9) == 32 and refine_mutants(64, 20000, 1e9) == 2
    # 20000 / (16 * 2 * 25) = 25 records per sigma: L = 24
    assert refine_mutants(16, 20000, 25.0) == 24
    X, y = _ball_blobs(n=600, k=5, d=4)
    est = _fit(X, 5, 1.0)
    assert est.dp_plan_.refine_rounds == 0 and est.protection_report_["GaussianDP"]["plan"]["refine_rounds"] == 0


@pytest.mark.parametrize("mode", ["central", "distributed"])
def test_planned_refinement_composes_within_the_target(mode):
    X, _ = _ball_blobs()
    est = _fit(X, 16, 1.0, mode=mode)
    p = est.dp_plan_
    assert p.refine_rounds == REFINE_ROUNDS and p.refine_candidates == 16 * (p.refine_mutants + 1)
    rep = est.protection_report_["GaussianDP"]
    assert rep["plan"]["refine_rounds"] == REFINE_ROUNDS and rep["plan"]["refine_mutants"] == p.refine_mutants
    seeding = 1 if p.private_start else 0
    assert rep["max_client_rounds"] == seeding + REFINE_ROUNDS + p.rounds
    assert rep["round_noise_multipliers"]["refine"] == pytest.approx(rep["noise_multiplier"])
    eps, delta = est.privacy_spent_
    assert 0.99 < eps <= 1.0 and delta <= len(X) ** -1.1
    assert np.all(np.linalg.norm(est.cluster_centers_, axis=1) <= 1.0 + 1e-9)


def test_explicit_refinement_outside_the_plan_is_charged_too():
    X, _ = _ball_blobs(n=800)
    est = _fit(X, 4, 2.0, refine_rounds=2, max_rounds=3)  # no plan: every round weight 1
    assert est.dp_plan_ is None
    assert est.protection_report_["GaussianDP"]["max_client_rounds"] == 1 + 2 + 3
    assert est.privacy_spent_[0] <= 2.0


def test_seeded_central_and_distributed_fits_agree_at_a_huge_epsilon():
    X, _ = _ball_blobs()
    a = _fit(X, 16, 1e4, rng="seeded", seed=5, refine_rounds=3).cluster_centers_
    b = _fit(X, 16, 1e4, mode="distributed", rng="seeded", seed=5, refine_rounds=3).cluster_centers_
    a, b = a[np.lexsort(a.T)], b[np.lexsort(b.T)]
    assert np.abs(a - b).max() < 1e-3


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_bad_refine_rounds_is_refused_naming_it(bad):
    X, _ = _ball_blobs(n=200, k=4)
    with pytest.raises(InputError, match="refine_rounds"):
        _fit(X, 4, 1.0, refine_rounds=bad)
