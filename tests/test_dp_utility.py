"""Utility of record-level DP federated k-means at epsilon = 1 on the DWF 5-blob set and digits.

Configuration of ``python -m benchmarks protocols --part dp`` (benchmarks/protocols_dp.py):
private seeding + DP Lloyd round(s) under GaussianDP(1, 1e-5, bounds=centred declared box,
count_share="auto", round_weights={"init.private": 0.5}, shrink="vector").

Blobs bound: the issue's target, 1.10 x the non-private loss. Over the benchmark's 10 seeds
the ratio at epsilon 1 is about 1.01 (docs/protocols/dp-utility.md), so the mean over 2 seeds
stays below 1.10 unless the seeding or the noise calibration regresses. The non-private
reference here is one scikit-learn KMeans(n_init=3), which can only be >= the benchmark's
best of 10 and so makes the ratio no larger. Digits: see its test.
"""

import warnings

import numpy as np
import pytest

from benchmarks import protocols_dp as bench
from securefkm.estimators.base import UnprotectedInitWarning

pytest.importorskip("opacus")

EPSILON = 1.0
BOUND = 1.10


def test_blobs_epsilon_1_ratio_and_budget():
    from sklearn.cluster import KMeans

    ratios = []
    for seed in range(2):
        data, k, box = bench.load("blobs", seed)
        X = data.pooled()
        if seed == 0:
            ref = KMeans(k, n_init=3, random_state=0).fit(X).inertia_
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnprotectedInitWarning)  # "private" is a protected init
            centres, spent = bench.dp_fit(data, k, box, EPSILON, seed=seed)
        assert spent[0] <= EPSILON and spent[1] <= bench.DELTA
        ratios.append(bench.loss(X, centres) / ref)
    assert np.mean(ratios) < BOUND, ratios
    assert max(ratios) < BOUND + 0.05, ratios


DIGITS_BOUND = 1.58


def test_digits_epsilon_1_ratio_and_budget():
    """Digits (1,797 x 64, k = 10) at epsilon 1, 2 seeds. The benchmark's 10 seeds give a mean
    of about 1.48 with a per-run std of about 0.03-0.05 (docs/protocols/dp-utility.md); the DP
    noise comes from the OS CSPRNG, so the check is statistical: 1.58 is about 3 standard
    errors of a 2-run mean above it."""
    ref = bench.reference_loss(bench.load("digits", 0)[0].pooled(), 10, runs=3)
    ratios = []
    for seed in range(2):
        data, k, box = bench.load("digits", seed)
        centres, spent = bench.dp_fit(data, k, box, EPSILON, seed=seed)
        assert spent[0] <= EPSILON and spent[1] <= bench.DELTA
        ratios.append(bench.loss(data.pooled(), centres) / ref)
    assert np.mean(ratios) < DIGITS_BOUND, ratios


def test_sweep_compares_variants_on_the_same_seeds():
    """``protocols_dp.sweep``: one ratio per (variant, seed), the paired difference of the first
    variant to itself is 0, a variant whose options differ changes the fit; bad input names the fix."""
    lines = []
    ratios = bench.sweep({"default": {}, "noise multiplier 50": {"noise_multiplier": 50.0}}, dataset="blobs",
                         epsilon=1.0, seeds=range(2), out=lines.append)
    assert set(ratios) == {"default", "noise multiplier 50"} and all(len(r) == 2 for r in ratios.values())
    assert all(r >= 0.99 for rs in ratios.values() for r in rs)  # no better than the non-private reference
    assert "difference +0.0000 ± 0.0000" in lines[1]
    assert np.mean(ratios["noise multiplier 50"]) > np.mean(ratios["default"])  # 50x the noise costs utility
    with pytest.raises(ValueError, match="variants"):
        bench.sweep({})
    with pytest.raises(ValueError, match="dataset must be one of"):
        bench.sweep({"a": {}}, dataset="mnist")
