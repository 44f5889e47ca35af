"""The one-run audit: its f-DP bound against closed forms and simulated Gaussian channels, and
audits of real GaussianDP fits -- the correct layer stays below its claim, planted bugs exceed it.

Fits use ``noise_rng="seeded"`` (the layer's keyed noise stream) and fixed ``random_state``, so
every number here is deterministic.
"""

import math

import numpy as np
import pytest
from scipy import stats

from attacks.audit import (
    gdp_mu_to_epsilon,
    gdp_one_run_epsilon,
    gdp_one_run_mu,
    gdp_one_run_p_value,
    one_run_epsilon,
)
from attacks.audit_one_run import (
    background_cells,
    correct_guesses,
    one_run_audit,
    planned_guesses,
)
from securefkm.exceptions import InputError


# ------------------------------------------------------------------ the bound itself
def test_p_value_with_every_guess_is_the_binomial_tail():
    # r = m: every canary guessed, each correct w.p. Phi(mu/2) independently
    m, mu = 1000, 0.5
    for v in (500, 560, 600):
        assert gdp_one_run_p_value(m, m, v, mu) == pytest.approx(stats.binom.sf(v - 1, m, stats.norm.cdf(mu / 2)), rel=1e-10)
    assert gdp_one_run_p_value(m, m, 0, mu) == 1.0


def test_p_value_matches_monte_carlo_of_top_r_guessing():
    # the order-statistics integral against a simulation of the optimal top-r guesser
    m, r, mu = 400, 40, 1.0
    rng = np.random.default_rng(0)
    n = 20000
    b = rng.random((n, m)) < 0.5
    x = rng.normal(mu * b, 1.0)
    conf = np.abs(x - mu / 2)
    top = np.argsort(-conf, axis=1)[:, :r]
    rows = np.arange(n)[:, None]
    v = ((x[rows, top] > mu / 2) == b[rows, top]).sum(axis=1)
    for thr in (30, 33, 36):
        sim = float(np.mean(v >= thr))
        p = gdp_one_run_p_value(m, r, thr, mu)
        se = math.sqrt(sim * (1 - sim) / n)
        assert sim - 4 * se <= p <= sim + 4 * se + 1.0 / 2000, (thr, sim, p)  # upper bound, slack <= 1/grid


def test_p_value_increases_with_mu_and_refutes_monotonically():
    ps = [gdp_one_run_p_value(10000, 2000, 1300, mu) for mu in (0.2, 0.4, 0.6, 0.8)]
    assert ps == sorted(ps) and ps[0] < 1e-6 and ps[-1] > 0.5
    mu = gdp_one_run_mu(10000, 2000, 1300, 0.05)
    assert gdp_one_run_p_value(10000, 2000, 1300, mu) < 0.05 <= gdp_one_run_p_value(10000, 2000, 1300, mu + 2e-4)
    assert gdp_one_run_mu(1000, 1000, 500, 0.05) == 0.0
    assert gdp_one_run_epsilon(10000, 2000, 1300, 1e-5) == pytest.approx(gdp_mu_to_epsilon(mu, 1e-5))


@pytest.mark.parametrize("mu,m", [(0.2643, 100_000), (1.0, 10_000)])
def test_bound_on_ideal_gaussian_is_valid_and_tight(mu, m):
    # eps 1 and about 4.4 at delta 1e-5; r planned from the claim, 6 seeds
    g = planned_guesses(m, mu, 1e-5, 0.05)
    true = gdp_mu_to_epsilon(mu, 1e-5)
    eps, st = [], []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        b = rng.random(m) < 0.5
        x = rng.normal(mu * b, 1.0)
        eps.append(gdp_one_run_epsilon(m, g["fdp"], correct_guesses(x, b, g["fdp"], mu / 2), 1e-5))
        st.append(one_run_epsilon(m, g["steinke"], correct_guesses(x, b, g["steinke"], mu / 2), 1e-5))
    assert max(eps) <= true and max(st) <= true
    assert np.median(eps) >= 0.85 * true
    assert np.median(st) < np.median(eps)  # Steinke et al.'s bound is the looser one


def test_bound_exceeds_truth_no_more_often_than_alpha():
    m, mu = 2000, 1.0
    r = planned_guesses(m, mu, 1e-5, 0.05)["fdp"]
    over = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        b = rng.random(m) < 0.5
        x = rng.normal(mu * b, 1.0)
        over += gdp_one_run_mu(m, r, correct_guesses(x, b, r, mu / 2), 0.05, tol=1e-3) > mu
    assert over <= 20  # P[Bin(200, 0.05) > 20] < 1e-3


def test_bad_input_names_argument():
    with pytest.raises(InputError, match="r <= m"):
        gdp_one_run_p_value(10, 11, 3, 1.0)
    with pytest.raises(InputError, match="mode"):
        one_run_audit("trusted")
    with pytest.raises(InputError, match="n_canaries"):
        one_run_audit(n_canaries=5)
    with pytest.raises(InputError, match="crypto"):
        one_run_audit("distributed", crypto="fake")
    with pytest.raises(InputError, match="random_state"):
        one_run_audit(noise_rng="seeded")
    with pytest.raises(InputError, match="canary_scale"):
        one_run_audit(canary_scale=0.5)


# ------------------------------------------------------------------ the audit design
def test_every_canary_and_background_record_has_its_own_cell():
    from securefkm.algorithms._kmeans import per_client_cell_sums

    m, n = 500, 3
    ang = 2 * np.pi * np.arange(m) / m
    U = np.c_[np.cos(ang), np.sin(ang)]
    owner = np.arange(m) % n
    bg_owner = (owner + 1) % n
    counts, sums = background_cells(U, 1.0, bg_owner, 2, n)
    records = [np.repeat(0.5 * U[bg_owner == c], 2, axis=0) for c in range(n)]
    got_s, got_c = per_client_cell_sums(records, U)
    for c in range(n):
        np.testing.assert_array_equal(got_c[c], counts[c])
        np.testing.assert_allclose(got_s[c], sums[c], atol=1e-12)
    # clipped canaries (norm 1) land exactly on their own centre
    s, c = per_client_cell_sums([U], U)
    np.testing.assert_array_equal(c[0], np.ones(m))


# ------------------------------------------------------------------ audits of real fits
@pytest.mark.parametrize("mode", ["central", "distributed", "local"])
def test_correct_layer_stays_below_its_claim(mode):
    res = one_run_audit(mode, 1.0, 1e-5, 10_000, rounds=2, noise_rng="seeded", random_state=3)
    assert res.claimed_epsilon == pytest.approx(1.0, abs=1e-3)
    assert res.rounds == 2 and res.details["rounds_charged"] == 2
    assert 0.7 * res.claimed_epsilon < res.epsilon_fdp < res.claimed_epsilon
    assert res.epsilon_steinke < res.epsilon_fdp
    assert max(res.blackbox_epsilon_fdp, res.blackbox_epsilon_steinke) < res.claimed_epsilon
    assert res.violates_claim is False and res.confidence == 0.95


def test_real_masking_and_its_ideal_functionality_give_the_same_audit():
    real, ideal = (one_run_audit("distributed", 1.0, 1e-5, 5000, crypto=c, noise_rng="seeded", random_state=5)
                   for c in ("real", "ideal"))
    assert real.details["crypto"] == "real" and ideal.details["crypto"] == "ideal"
    assert (real.epsilon_fdp, real.epsilon_steinke, real.blackbox_epsilon_fdp, real.details["white_box"]) == (
        ideal.epsilon_fdp, ideal.epsilon_steinke, ideal.blackbox_epsilon_fdp, ideal.details["white_box"])
    assert real.epsilon_fdp > 0


@pytest.mark.parametrize("mode", ["central", "distributed", "local"])
@pytest.mark.parametrize("broken,epsilon,rounds,m", [
    ("small_noise", 4.0, 1, 20_000),   # sigma x 0.8
    ("no_clipping", 1.0, 1, 10_000),   # canaries of norm 2 clip go in unclipped
    ("uncharged_round", 1.0, 2, 10_000),  # 2 rounds released, 1 charged
])
def test_planted_bug_exceeds_the_claim(mode, broken, epsilon, rounds, m):
    res = one_run_audit(mode, epsilon, 1e-5, m, rounds=rounds, broken=broken, noise_rng="seeded", random_state=3)
    assert res.epsilon_fdp > res.claimed_epsilon, res.details
    assert res.violates_claim
