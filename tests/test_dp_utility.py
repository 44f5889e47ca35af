"""Utility of record-level DP federated k-means at epsilon = 1 on the DWF 5-blob set.

Configuration of ``securefkm bench protocols --part dp`` (securefkm/bench/protocols_dp.py):
private seeding + one DP Lloyd round under GaussianDP(1, 1e-5, bounds=centred declared box).

Bound: the issue's target for blobs, 1.10 x the non-private loss. Over the benchmark's
10 seeds the ratio at epsilon 1 is 1.008 ± 0.007 (docs/protocols/dp-utility.md), so the mean over 2 seeds stays below 1.10 unless the
seeding or the noise calibration regresses. The non-private reference here is one
scikit-learn KMeans(n_init=3), which can only be >= the benchmark's best of 10 and so
makes the ratio no larger.
"""

import warnings

import numpy as np
import pytest

from securefkm.bench import protocols_dp as bench
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
