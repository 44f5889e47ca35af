"""Issue 12's GaussianDP warnings: central noise without a secure aggregator, and delta > 1/n."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from protocols.dp import CentralDPWarning, DeltaWarning, GaussianDP
from securefkm.estimators.dwf import WeightedFederatedKMeans


def _fit(layers, n_records=60):
    X = np.random.default_rng(0).uniform(-1, 1, size=(n_records, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        WeightedFederatedKMeans(2, init="uniform", init_bounds=(-1, 1), max_rounds=1, max_local_steps=1,
                                protection=layers, random_state=0).fit(np.array_split(X, 4))
    return [w.category for w in caught]


def test_central_dp_without_secure_aggregator_warns_at_fit_time():
    from protocols.masking import PairwiseMasking

    assert CentralDPWarning in _fit([GaussianDP(1.0, 1e-5, bounds=(-1, 1))])
    assert CentralDPWarning not in _fit([GaussianDP(1.0, 1e-5, bounds=(-1, 1)), PairwiseMasking()])
    dist = [GaussianDP(1.0, 1e-5, bounds=(-1, 1), mode="distributed"), PairwiseMasking()]
    assert CentralDPWarning not in _fit(dist)
    assert CentralDPWarning not in _fit([GaussianDP(1.0, 1e-5, bounds=(-1, 1), mode="local")])
    with pytest.warns(CentralDPWarning, match="exact update"):
        GaussianDP(1.0, 1e-5, bounds=(-1, 1))._warn_about_trust_and_delta(_info(None))


def _info(sizes):
    from securefkm.layers import RunInfo

    return RunInfo(algorithm=None, n_clients=4, n_features=2, clients_per_round=4, max_rounds=1, planned_rounds=1,
                   client_sizes=sizes)


def test_delta_above_one_over_n_warns_with_the_reason():
    cats = _fit([GaussianDP(1.0, 0.05, bounds=(-1, 1), mode="local")], n_records=60)  # 1/n = 0.0167
    assert DeltaWarning in cats
    assert DeltaWarning not in _fit([GaussianDP(1.0, 0.01, bounds=(-1, 1), mode="local")], n_records=60)
    dp = GaussianDP(1.0, 0.05, bounds=(-1, 1), mode="local")
    with pytest.warns(DeltaWarning, match=r"above 1/n = 0.0167 .*n=60 records.*publishes a randomly chosen record"):
        dp._warn_about_trust_and_delta(_info((15, 15, 15, 15)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dp._warn_about_trust_and_delta(_info(None))  # record count unknown (a deployment): no check
