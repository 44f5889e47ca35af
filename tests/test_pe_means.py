"""The PE-means baseline (benchmarks/pe_means.py): its privacy accounting, its protocol's
pieces and that it clusters."""

import math

import numpy as np
import pytest
from scipy.stats import norm

from benchmarks import pe_means as pm


def _gaussian_delta(mu: float, eps: float) -> float:
    """delta(eps) of mu-GDP, written out independently of the library's accountant."""
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


@pytest.fixture(scope="module")
def blobs():
    from sklearn.datasets import make_blobs

    X, _ = make_blobs(n_samples=2000, n_features=2, centers=4, cluster_std=0.6, random_state=3)
    return pm.preprocess(X)


@pytest.mark.parametrize("eps", [0.25, 1.0, 4.0])
@pytest.mark.parametrize("rounds", [1, 8, 45])
def test_noise_meets_the_target_and_is_not_wasted(eps, rounds):
    delta = 20000 ** -1.1
    sigma = pm.noise_std(eps, delta, rounds)
    mu = math.sqrt(rounds) / sigma
    assert _gaussian_delta(mu, eps) <= delta  # (eps, delta)-DP for the composed releases
    assert pm.spent_epsilon(sigma, rounds, delta) <= eps
    # tight: 1 % less noise would break the target
    assert _gaussian_delta(mu / 0.99, eps) > delta


def test_replace_neighbouring_scales_the_noise_by_sqrt2():
    delta = 1e-5
    a = pm.noise_std(1.0, delta, 10, 1.0)
    b = pm.noise_std(1.0, delta, 10, math.sqrt(2))
    assert b == pytest.approx(math.sqrt(2) * a, rel=1e-9)


@pytest.mark.parametrize("eps", [0.25, 2.0])
def test_a_run_spends_at_most_its_target(blobs, eps):
    delta = pm.protocol_delta(len(blobs))
    res = pm.pe_means(blobs, 4, eps, delta, seed=5)
    assert res.rounds == pm.generations(eps, 2)
    assert res.epsilon_spent <= eps
    assert res.epsilon_spent > 0.999 * eps


def test_loss_beats_random_centres(blobs):
    delta = pm.protocol_delta(len(blobs))
    res = pm.pe_means(blobs, 4, 1.0, delta, seed=1)
    ours = pm.per_point_loss(blobs, res.centres)
    rng = np.random.default_rng(0)
    random_losses = []
    for _ in range(20):
        c = pm.packed_start(4, 2, 1.0, rng)
        random_losses.append(pm.per_point_loss(blobs, c))
    assert ours < 0.5 * np.median(random_losses)
    from sklearn.cluster import KMeans

    best = KMeans(4, n_init=10, random_state=0).fit(blobs).inertia_ / len(blobs)
    assert ours < 3 * best


def test_deterministic_by_seed(blobs):
    delta = pm.protocol_delta(len(blobs))
    a = pm.pe_means(blobs, 4, 0.5, delta, seed=11).centres
    b = pm.pe_means(blobs, 4, 0.5, delta, seed=11).centres
    c = pm.pe_means(blobs, 4, 0.5, delta, seed=12).centres
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(np.sort(a, axis=0), np.sort(c, axis=0))


def test_threshold_keeps_the_top_counts_until_n():
    noisy = np.array([5.0, -2.0, 30.0, 12.0, 1.0, 40.0])
    w = pm.threshold_counts(noisy, 75)
    np.testing.assert_array_equal(w, [0.0, 0.0, 30.0, 12.0, 0.0, 40.0])  # 40 + 30 + 12 >= 75
    # never reaching n: every positive count is kept, negatives dropped
    np.testing.assert_array_equal(pm.threshold_counts(noisy, 1000), [5.0, 0.0, 30.0, 12.0, 1.0, 40.0])


def test_protocol_pieces():
    X = pm.preprocess(np.random.default_rng(0).normal(3.0, 2.0, (500, 5)))
    assert np.linalg.norm(X, axis=1).max() == pytest.approx(1.0)
    np.testing.assert_allclose(X.mean(axis=0), 0.0, atol=1e-12)
    assert pm.generations(0.5, 4) == 8 and pm.generations(4.0, 4) == 32 and pm.generations(2.0, 16) == 32
    assert pm.mutants_per_centre(150, 3) == 10 and pm.mutants_per_centre(20000, 64) == 62
    assert pm.protocol_delta(150) == pytest.approx(150 ** -1.1)
    # the trapezoid over the uneven grid: a constant curve c gives c * 3.75
    assert pm.auc([0.1] * 5) == pytest.approx(0.375)
    assert pm.auc([1, 0, 0, 0, 0]) == pytest.approx(0.125)


def test_mutants_and_start_stay_in_the_ball():
    rng = np.random.default_rng(2)
    start = pm.packed_start(200, 3, 1.0, rng)
    assert np.linalg.norm(start, axis=1).max() <= 1.0
    gaps = np.linalg.norm(start[:, None] - start[None], axis=2) + np.eye(200) * 9
    assert gaps.min() > 0
    m = pm.levy_mutants(start[:5] * 0.999, 50, 1.0, rng)
    assert m.shape == (250, 3)
    assert np.linalg.norm(m, axis=1).max() <= 1.0 + 1e-12


def test_records_outside_the_ball_are_refused():
    with pytest.raises(ValueError, match="outside"):
        pm.pe_means(np.array([[2.0, 0.0], [0.0, 0.1]]), 1, 1.0, 1e-3)


def test_verdict_uses_the_run_spread_and_the_rounding():
    res = {"auc": 0.2899, "auc_sd": 0.039, "runs": 50}
    ok, z = pm.verdict(res, 0.2894)
    assert ok == "yes" and abs(z) < 1
    assert pm.verdict({"auc": 0.36, "auc_sd": 0.039, "runs": 50}, 0.2894)[0] == "no"
    # a spread far below the published rounding: equal to 4 digits is reproduced
    assert pm.verdict({"auc": 0.07782, "auc_sd": 1e-6, "runs": 10}, 0.0778)[0] == "yes"
    assert pm.verdict({"auc": 0.0790, "auc_sd": 1e-6, "runs": 10}, 0.0778)[0] == "no"


def test_published_table_and_data_sets():
    assert pm.PUBLISHED["iris"] == {"PE-means": 0.2894, "Google": 0.6892, "FastLloyd": 0.3979}
    names = {f"blobs-K{k}-D{d}" for k in (4, 16, 64) for d in (4, 16, 64, 128)}
    assert set(pm.PUBLISHED) == {"iris"} | names
    X, k = pm.load("blobs-K16-D4")
    assert X.shape == (20000, 4) and k == 16
    assert np.linalg.norm(X, axis=1).max() == pytest.approx(1.0)
    X, k = pm.load("iris")
    assert X.shape == (150, 4) and k == 3
    with pytest.raises(ValueError):
        pm.load("wine")


def test_paired_seeding_comparison_runs_each_variant_and_restores_the_rules():
    from benchmarks import pe_means
    from securefkm.algorithms import _seeding

    rules = _seeding.VORONOI_PER_AXIS, _seeding.MAX_BITS_ABOVE_GRID
    lines = []
    voronoi = pe_means.paired(["iris"], epsilons=(1.0,), seeds=2, out=lines.append)
    planes = pe_means.paired(["iris"], epsilons=(1.0,), seeds=2, buckets="hyperplanes", max_bits=8, out=lines.append)
    assert (_seeding.VORONOI_PER_AXIS, _seeding.MAX_BITS_ABOVE_GRID) == rules
    assert len(voronoi[("iris", 1.0)]) == 2 and all(v > 0 for v in planes[("iris", 1.0)])
    assert "hyperplanes, max bits 8" in lines[1] and "seeds 700-701" in lines[0]
