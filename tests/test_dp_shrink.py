"""Shrinkage of noisy means (post-processing of GaussianDP releases): GaussianDP(shrink=...)
on Lloyd rounds and the coordinate-wise empirical-Bayes shrinkage of the private seeding."""

from __future__ import annotations


import numpy as np
import pytest

from protocols.dp import GaussianDP
from securefkm.algorithms import _seeding
from securefkm.algorithms._seeding import shrink_coordinates, shrink_means
from securefkm.estimators.dwf import WeightedFederatedKMeans
from securefkm.exceptions import InputError
from securefkm.messages import FieldSpec

pytest.importorskip("opacus")


def _noisy_means(seed=0, k=10, d=32, n=100.0, sigma=300.0):
    """k true means differing only in the first 8 coordinates, noisy sums / counts."""
    rng = np.random.default_rng(seed)
    true = np.zeros((k, d))
    true[:, :8] = rng.normal(0.0, 4.0, size=(k, 8))
    counts = np.full(k, n)
    noisy = true + rng.normal(0.0, sigma, size=(k, d)) / n
    return true, noisy, counts, sigma


def test_shrink_coordinates_fixed_seed_beats_raw_and_vector_shrinkage():
    errs = {"raw": 0.0, "vector": 0.0, "coordinate": 0.0}
    for seed in range(20):
        true, noisy, counts, sigma = _noisy_means(seed)
        target = noisy.mean(axis=0)
        errs["raw"] += np.sum((noisy - true) ** 2)
        errs["vector"] += np.sum((shrink_means(noisy, counts, sigma, target) - true) ** 2)
        errs["coordinate"] += np.sum((shrink_coordinates(noisy, counts, sigma, target) - true) ** 2)
    # flat coordinates (24 of 32) are pulled to the target: far below the raw error
    assert errs["coordinate"] < 0.5 * errs["raw"], errs
    assert errs["coordinate"] < errs["vector"] < errs["raw"], errs


def test_shrink_coordinates_small_counts_do_not_swamp_the_prior():
    """Morris weights: one row with a tiny count (huge noise) must not make every other row
    collapse onto the target (the unweighted moment estimate did, on digits)."""
    true, noisy, counts, sigma = _noisy_means(1, sigma=100.0)
    counts = counts.copy()
    counts[0] = 2.0
    noisy[0] = true[0] + np.random.default_rng(5).normal(0.0, sigma, size=true.shape[1]) / 2.0
    target = noisy[1:].mean(axis=0)
    out = shrink_coordinates(noisy, counts, sigma, target)
    spread_true = np.abs(true[1:, :8] - true[1:, :8].mean(axis=0)).mean()
    spread_out = np.abs(out[1:, :8] - target[:8]).mean()
    assert spread_out > 0.6 * spread_true


def test_shrink_coordinates_without_noise_and_few_rows():
    _, noisy, counts, _ = _noisy_means(2)
    np.testing.assert_allclose(shrink_coordinates(noisy, counts, 0.0, noisy.mean(axis=0)), noisy)
    three = noisy[:3]
    target = three.mean(axis=0)
    np.testing.assert_allclose(shrink_coordinates(three, counts[:3], 300.0, target), shrink_means(three, counts[:3], 300.0, target))


def _specs(k=4, d=5):
    return (FieldSpec("weights", (k,), "count", integer=True), FieldSpec("weighted_centres", (k, d), "sum"))


def _released(k=4, d=5, seed=0):
    rng = np.random.default_rng(seed)
    counts = np.array([50.0, 40.0, -3.0, 60.0])[:k]
    sums = counts[:, None] * rng.normal(size=(k, d)) + rng.normal(0, 20.0, size=(k, d))
    return {"weights": counts, "weighted_centres": sums}


@pytest.mark.parametrize("how", ["vector", "coordinate"])
def test_layer_shrink_is_a_function_of_released_sums_and_public_sigmas(how):
    layer = GaussianDP(1.0, 1e-5, bounds=(-1, 1), shrink=how)
    specs, sums = _specs(), _released()
    sigmas = {"weights": (7.0, 0.0, 1.0), "weighted_centres": (20.0, 0.0, 1.0)}
    out = layer.post_processing.shrunk(dict(sums), specs, sigmas, "train")
    again = layer.post_processing.shrunk(dict(sums), specs, sigmas, "train")
    np.testing.assert_array_equal(out["weighted_centres"], again["weighted_centres"])  # deterministic
    assert layer.budget is None  # nothing calibrated, nothing charged
    np.testing.assert_array_equal(out["weights"], sums["weights"])  # counts released as they are
    np.testing.assert_array_equal(out["weighted_centres"][2], sums["weighted_centres"][2])  # count <= 0: untouched
    pos = sums["weights"] > 0
    means = sums["weighted_centres"][pos] / sums["weights"][pos, None]
    target = sums["weighted_centres"][pos].sum(axis=0) / sums["weights"][pos].sum()
    fn = shrink_means if how == "vector" else shrink_coordinates
    args = (means, sums["weights"][pos], 20.0, target) + ((7.0,) if how == "coordinate" else ())
    np.testing.assert_allclose(out["weighted_centres"][pos] / sums["weights"][pos, None], fn(*args))
    # seeding rounds, d < 3 and other layouts are left alone
    assert layer.post_processing.shrunk(dict(sums), specs, sigmas, "init.private") == sums
    small = {"weights": sums["weights"], "weighted_centres": sums["weighted_centres"][:, :2]}
    assert layer.post_processing.shrunk(dict(small), _specs(d=2), sigmas, "train") is not None
    np.testing.assert_array_equal(layer.post_processing.shrunk(dict(small), _specs(d=2), sigmas, "train")["weighted_centres"], small["weighted_centres"])
    assert GaussianDP(1.0, 1e-5, bounds=(-1, 1)).post_processing.shrunk(dict(sums), specs, sigmas, "train") == sums


def test_shrink_validation():
    with pytest.raises(InputError):
        GaussianDP(1.0, 1e-5, bounds=(-1, 1), shrink="yes")


def test_dwf_with_shrink_spends_exactly_the_same_budget():
    rng = np.random.default_rng(0)
    clients = [np.clip(rng.normal(size=(60, 5)) + (i % 3), -4, 4) for i in range(6)]
    spent, centres = [], []
    for shrink in (None, "vector", "coordinate"):
        est = WeightedFederatedKMeans(
            3, init="private", init_bounds=(-4, 4), max_rounds=2, max_local_steps=1, tol=0,
            protection=[GaussianDP(1.0, 1e-5, bounds=(-4, 4), count_share="auto", round_weights={"init.private": 0.5}, shrink=shrink)],
            random_state=0,
        ).fit(clients)
        spent.append(tuple(est.privacy_spent_))
        centres.append(est.cluster_centers_)
    assert spent[0] == spent[1] == spent[2]
    assert spent[0][0] <= 1.0 and spent[0][1] <= 1e-5
    assert all(np.all(np.isfinite(c)) for c in centres)


def test_private_seeding_uses_coordinate_shrinkage_by_default():
    assert _seeding.SHRINK == "coordinate"
