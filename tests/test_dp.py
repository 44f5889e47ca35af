"""Tests of protocols.dp: exact discrete Gaussian sampler, accounting, the GaussianDP layer."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from protocols.dp.accounting import (
    PrivacyAccountant,
    epsilon_for,
    gdp_epsilon,
    noise_multiplier_for,
)
from protocols.dp.sampler import (
    bernoulli_exp_neg,
    bernoulli_rational,
    discrete_gaussian_pmf,
    sample_discrete_gaussian,
    uniform_below,
)
from securefkm.exceptions import InputError


# ----------------------------------------------------------------------------- sampler
def test_uniform_below_range_and_uniformity():
    x = uniform_below(np.full(30000, 3, dtype=np.uint64))
    assert x.min() == 0 and x.max() == 2
    counts = np.bincount(x.astype(int), minlength=3)
    assert stats.chisquare(counts).pvalue > 1e-4


def test_bernoulli_rational_exact_edges_and_mean():
    assert bernoulli_rational([0, 5], [7, 5]).tolist() == [False, True]
    coins = bernoulli_rational(np.full(40000, 1, dtype=object), np.full(40000, 3, dtype=object))
    assert abs(coins.mean() - 1 / 3) < 5 * math.sqrt(2 / 9 / 40000)
    with pytest.raises(InputError):
        bernoulli_rational([4], [3])


def test_bernoulli_exp_neg_mean():
    n = 40000
    for num, den in ((1, 2), (5, 2)):  # gamma < 1 and gamma > 1
        p = math.exp(-num / den)
        c = bernoulli_exp_neg(np.full(n, num, dtype=object), np.full(n, den, dtype=object))
        assert abs(c.mean() - p) < 5 * math.sqrt(p * (1 - p) / n)


def test_discrete_gaussian_variance_mean_and_pmf():
    sigma2 = 9.0
    n = 100_000
    x = sample_discrete_gaussian(sigma2, n)
    assert x.dtype == np.int64 and x.shape == (n,)
    # Var of N_Z(0, 9) is 9 up to ~1e-70 (CKS20 Prop. 19); SE of the sample variance ~0.45%
    assert abs(x.var() / sigma2 - 1) < 0.02
    assert abs(x.mean()) < 5 * math.sqrt(sigma2 / n)
    # chi-square against the exact pmf, tails pooled
    support = np.arange(-9, 10)
    expected = discrete_gaussian_pmf(sigma2, support) * n
    observed = np.array([(x == s).sum() for s in support], dtype=float)
    tail_exp = n - expected.sum()
    tail_obs = n - observed.sum()
    chi = stats.chisquare(np.append(observed, tail_obs), np.append(expected, tail_exp))
    assert chi.pvalue > 1e-4


def test_discrete_gaussian_large_sigma_is_fast_and_scaled():
    import time

    t0 = time.perf_counter()
    x = sample_discrete_gaussian(1e10, 5000)
    assert time.perf_counter() - t0 < 2.0
    assert 0.9 < x.astype(float).std() / 1e5 < 1.1


def test_discrete_gaussian_rejects_bad_sigma():
    with pytest.raises(InputError, match="sigma2"):
        sample_discrete_gaussian(0, 3)
    with pytest.raises(InputError, match="sigma2"):
        sample_discrete_gaussian("abc", 3)


def test_sampler_uses_no_numpy_generator(monkeypatch):
    def boom(*a, **k):  # pragma: no cover - must not be called
        raise AssertionError("numpy RNG used for DP noise")

    monkeypatch.setattr(np.random, "default_rng", boom)
    monkeypatch.setattr(np.random, "randint", boom)
    sample_discrete_gaussian(4.0, 100)


# -------------------------------------------------------------------------- accounting
def test_epsilon_for_equals_opacus_prv():
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = [(1.3, 0.2, 40)]
    assert epsilon_for(1.3, 40, 0.2, 1e-5) == pytest.approx(acc.get_epsilon(delta=1e-5), abs=1e-12)


@pytest.mark.parametrize("z,rounds", [(1.0, 10), (5.0, 100), (2.0, 1), (20.0, 400)])
def test_prv_matches_closed_form_gdp_full_participation(z, rounds):
    eps_prv = epsilon_for(z, rounds, 1.0, 1e-5)
    eps_gdp = gdp_epsilon(math.sqrt(rounds) / z, 1e-5)
    assert abs(eps_prv - eps_gdp) < 0.05
    assert eps_prv >= eps_gdp - 1e-9  # opacus reports the upper end of its error interval


def test_noise_multiplier_for_inverts_epsilon_for():
    for q, acc in ((1.0, "prv"), (0.1, "prv"), (0.1, "rdp")):
        z = noise_multiplier_for(1.0, 1e-5, 30, q, accountant=acc)
        e = epsilon_for(z, 30, q, 1e-5, accountant=acc)
        assert 0.98 <= e <= 1.0
        assert epsilon_for(z * 0.97, 30, q, 1e-5, accountant=acc) > e


def test_gdp_accountant_refused():
    with pytest.raises(InputError, match="under-reports"):
        epsilon_for(1.0, 10, 1.0, 1e-5, accountant="gdp")


def test_privacy_accountant_never_exceeds_target():
    z = noise_multiplier_for(2.0, 1e-5, 8, 1.0)
    acc = PrivacyAccountant(z, 2.0, 1e-5)
    n = 0
    while not acc.would_exceed(1.0):
        acc.step(1.0)
        n += 1
        assert acc.spent()[0] <= 2.0
    assert n >= 8
    assert acc.spent()[1] == 1e-5


def test_importing_protocols_dp_does_not_import_torch():
    code = "import sys, protocols, protocols.dp; assert 'torch' not in sys.modules and 'opacus' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
