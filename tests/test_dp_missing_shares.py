"""Distributed DP sized for noise shares that may be missing: dropouts and clients that add none."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from protocols.dp import GaussianDP
from protocols.dp.accounting import PrivacyAccountant
from protocols.dp.modes import Distributed
from protocols.masking import PairwiseMasking
from securefkm.estimators.dwf import WeightedFederatedKMeans
from securefkm.exceptions import ProtectionConfigError


def _clients(n, per=40, seed=0):
    rng = np.random.default_rng(seed)
    X = np.clip(rng.normal(size=(n * per, 2)) * 0.3 + rng.choice([-0.5, 0.5], size=(n * per, 1)), -1, 1)
    return np.array_split(X, n)


def _fit(n, dp=None, masking=None, **kw):
    dp = GaussianDP(1.0, 1e-5, bounds=(-1.0, 1.0), mode="distributed", rng="seeded", **(dp or {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return WeightedFederatedKMeans(2, protection=[dp, PairwiseMasking(**(masking or {}))], crypto="ideal",
                                       random_state=0, max_rounds=2, **kw).fit(_clients(n))


def _epsilon(z, rounds, delta=1e-5):
    acc = PrivacyAccountant(z, 1e3, delta)
    acc.history = [(z, 1.0, rounds)]
    return acc.spent()[0]


@pytest.mark.parametrize("n, dropped, colluders", [(20, 2, 1), (100, 10, 5), (1000, 100, 50)])
def test_shares_are_sized_for_the_declared_missing_shares(n, dropped, colluders):
    """Default: PairwiseMasking's dropouts (10%) plus its declared colluders (5%) may be missing.
    Each share is sized for the H = n - dropped - colluders others, so the survivors' sum holds
    sigma^2 with that many colluders adding nothing, and less with one more."""
    est = _fit(n)
    dp = est.protection[0] if isinstance(est.protection[0], GaussianDP) else None
    report = est.protection_report_["GaussianDP"]
    assert report["min_clients"] == n - dropped
    text = report["missing_shares"]
    assert f"up to {dropped + colluders} of the {n} sampled clients' noise shares missing" in text
    assert f"{dropped} dropouts and {colluders} surviving clients that add no noise" in text
    assert "add no noise" in est.protection_report_.views[0].trust
    del dp
    fed, _ = WeightedFederatedKMeans(
        2, protection=[GaussianDP(1.0, 1e-5, bounds=(-1.0, 1.0), mode="distributed", rng="seeded"),
                       PairwiseMasking()], crypto="ideal", random_state=0, max_rounds=2).make_federation(_clients(n))
    layer = fed.layers[0]
    h = layer._honest_shares
    assert h == n - dropped - colluders
    for sigma, step in [(3.0, 1.0), (0.7, 2.0 ** -16)]:
        target = (sigma / step) ** 2
        share = Distributed.share_variance(layer, sigma, step)
        survivors_noise = (n - dropped - colluders) * share  # fewest survivors, colluders add none
        assert survivors_noise >= target * (1 - 1e-12)
        if share * h == pytest.approx(target):  # not raised by the KLS21 floor: the sizing is tight
            assert (n - dropped - colluders - 1) * share < target


def test_epsilon_holds_with_the_declared_missing_shares():
    """The real epsilon of a round whose sum lacks the shares of the dropouts and colluders is
    the accounted one; sized the old way (for min_clients shares), 5 colluders of 100 raised it."""
    z, rounds = 2.0, 10
    target = _epsilon(z, rounds)
    n, dropped, colluders = 100, 10, 5
    honest = n - dropped - colluders
    # new sizing: shares for `honest` clients, `honest` of them present
    assert _epsilon(z * math.sqrt(honest / honest), rounds) == pytest.approx(target)
    # the old sizing (shares for n - dropped) with the same clients missing
    assert _epsilon(z * math.sqrt(honest / (n - dropped)), rounds) > target * 1.02


def test_missing_shares_argument():
    est = _fit(20, dp={"missing_shares": 6})
    assert "up to 6 of the 20" in est.protection_report_["GaussianDP"]["missing_shares"]
    assert "2 dropouts and 4 surviving" in est.protection_report_["GaussianDP"]["missing_shares"]
    with pytest.raises(ProtectionConfigError, match=r"missing_shares=1 is below the 2 dropouts.*missing_shares >= 2"):
        _fit(20, dp={"missing_shares": 1})
    with pytest.raises(ProtectionConfigError, match="no share is sure to reach the sum"):
        _fit(20, dp={"missing_shares": 20})
    with pytest.raises(Exception, match="missing_shares"):
        GaussianDP(1.0, 1e-5, bounds=(-1, 1), mode="distributed", missing_shares=-1)


def test_more_missing_shares_means_more_noise_same_budget():
    """Declaring more possibly-missing shares adds noise to the released sums (here the total
    count of every training round, whose exact value is the number of records) and never
    changes the accounted budget. Seeded noise: the figures are fixed."""
    n_records = 20 * 40
    spread = {}
    for missing in (2, 12):
        dev = []
        for seed in range(20):
            dp = GaussianDP(1.0, 1e-5, bounds=(-1.0, 1.0), mode="distributed", rng="seeded", missing_shares=missing)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est = WeightedFederatedKMeans(2, protection=[dp, PairwiseMasking()], crypto="ideal", random_state=seed,
                                              max_rounds=2).fit(_clients(20))
            assert est.privacy_spent_[0] <= 1.0 + 1e-9
            dev += [float(r.aggregate["weights"].sum()) - n_records for r in est.transcript_ if r.action == "train"]
        spread[missing] = float(np.mean(np.square(dev)))
    # shares sized for 18 vs 8 honest clients, 20 present: variance 20/8 vs 20/18 of sigma^2
    assert spread[12] > 1.5 * spread[2]
