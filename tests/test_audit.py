"""Privacy auditing: the audit respects a correct GaussianDP and flags injected bugs.

The DP noise comes from the OS CSPRNG (not seedable), so the statistical tests are set up
with false-failure probabilities far below 1e-3: the bound-below-claim tests use alpha=1e-3
(a correct mechanism trips them with probability <= alpha by construction); the bug tests
use bugs whose separation is total.
"""

import math

import numpy as np
import pytest
from scipy import stats

from attacks.audit import (
    METHODS,
    audit_dp_game,
    audit_epsilon,
    clopper_pearson,
    gaussian_dp_round_game,
    gdp_mu_to_epsilon,
    one_run_epsilon,
    one_run_p_value,
    run_dp_game,
)
from securefkm.exceptions import InputError


# ------------------------------------------------------------------ unit: bounds
def test_clopper_pearson_matches_scipy_beta():
    k = np.array([0, 1, 5, 50, 99, 100])
    n = 100
    up = clopper_pearson(k, n, 0.05, "upper")
    lo = clopper_pearson(k, n, 0.05, "lower")
    for i, kk in enumerate(k):
        exp_up = 1.0 if kk == n else stats.beta.ppf(0.95, kk + 1, n - kk)
        exp_lo = 0.0 if kk == 0 else stats.beta.ppf(0.05, kk, n - kk + 1)
        assert up[i] == pytest.approx(exp_up, rel=1e-12)
        assert lo[i] == pytest.approx(exp_lo, rel=1e-12)
    # coverage of the upper bound: P[p <= ub] >= 0.95 exactly computed for p = 0.3
    p, ks = 0.3, np.arange(n + 1)
    covered = clopper_pearson(ks, n, 0.05, "upper") >= p
    assert stats.binom.pmf(ks, n, p)[covered].sum() >= 0.95
    assert clopper_pearson(0, 10, 0.05) == pytest.approx(1 - 0.05 ** (1 / 10))


def test_gdp_conversion_matches_accountant():
    from protocols.dp.accounting import gdp_epsilon

    for mu in (0.1, 0.5, 1.0, 3.0):
        assert gdp_mu_to_epsilon(mu, 1e-5) == pytest.approx(gdp_epsilon(mu, 1e-5), rel=1e-9)
    assert gdp_mu_to_epsilon(0.0, 1e-5) == 0.0


def test_gdp_audit_recovers_mu_of_exact_gaussian_scores():
    # scores N(mu, 1) vs N(0, 1): a mu-GDP test; with many samples mu_lb -> mu from below
    rng = np.random.default_rng(0)
    mu = 1.0
    res = audit_epsilon(rng.normal(mu, 1, 200_000), rng.normal(0, 1, 200_000), 1e-5, 0.05, "gdp", random_state=1)
    assert 0.85 * mu < res.details["mu_lower_bound"] <= mu * 1.02
    assert res.epsilon_lower_bound <= gdp_mu_to_epsilon(mu * 1.02, 1e-5)


def _randomized_response(eps, m, rng):
    bits = rng.random(m) < 0.5
    keep = rng.random(m) < math.exp(eps) / (1 + math.exp(eps))
    out = np.where(keep, bits, ~bits).astype(float) + 1e-3 * rng.random(m)  # tie-break noise
    return out[bits], out[~bits]


def test_one_run_bound_on_randomized_response():
    rng = np.random.default_rng(0)
    eps = 2.0
    small = audit_epsilon(*_randomized_response(eps, 200, rng), 0.0, 0.05, "one-run", guesses=[(100, 100)],
                          random_state=0)
    big = audit_epsilon(*_randomized_response(eps, 100_000, rng), 0.0, 0.05, "one-run",
                        guesses=[(50_000, 50_000)], random_state=0)
    assert small.epsilon_lower_bound < eps and big.epsilon_lower_bound < eps
    assert big.epsilon_lower_bound > 0.95 * eps  # close with many canaries
    assert big.epsilon_lower_bound > small.epsilon_lower_bound
    # p-value at the true epsilon is ~ 1/2 when all guesses are made (v ~ Bin(r, q))
    assert one_run_p_value(1000, 1000, 881, eps, 0.0) > 0.05
    assert one_run_epsilon(100, 100, 50, 0.0) == 0.0


def test_one_run_delta_term_weakens_the_bound():
    e0 = one_run_epsilon(1000, 200, 180, 0.0)
    e1 = one_run_epsilon(1000, 200, 180, 1e-4)
    assert 0 < e1 < e0


def test_bad_input_names_argument():
    with pytest.raises(InputError, match="scores_in"):
        audit_epsilon([], [1.0], 1e-5)
    with pytest.raises(InputError, match="scores_out"):
        audit_epsilon([1.0], [np.nan], 1e-5)
    with pytest.raises(InputError, match="method"):
        audit_epsilon([1.0] * 5, [0.0] * 5, 1e-5, method="bogus")
    with pytest.raises(InputError, match="alpha"):
        audit_epsilon([1.0] * 5, [0.0] * 5, 1e-5, alpha=2)
    with pytest.raises(InputError, match="delta"):
        audit_epsilon([1.0] * 5, [0.0] * 5, 1.5)
    with pytest.raises(InputError, match="broken"):
        gaussian_dp_round_game(broken="no_noise")
    with pytest.raises(InputError, match="n_trials"):
        run_dp_game(lambda d, n: np.zeros(n), (0, 1), 1)


def test_perfect_separation_gives_finite_cp_bound():
    res = audit_epsilon(np.ones(500), np.zeros(500), 1e-5, 0.05, "clopper-pearson", thresholds=[0.5])
    # FPR_ub = FNR_ub = 1 - 0.025^(1/500): eps_lb = log((1 - delta - ub) / ub)
    ub = 1 - 0.025 ** (1 / 500)
    assert res.epsilon_lower_bound == pytest.approx(math.log((1 - 1e-5 - ub) / ub), rel=1e-9)


# ------------------------------------------------------------------ the GaussianDP game
@pytest.fixture(scope="module")
def correct_scores():
    game = gaussian_dp_round_game(1.0, 1e-5, clip=1.0, random_state=0)
    gs = run_dp_game(game.mechanism, game.neighbour_pair, 2000, score=game.score, random_state=1)
    return game, gs


def test_layer_claim_and_sigmas(correct_scores):
    game, _ = correct_scores
    assert game.claimed_epsilon <= 1.0 + 1e-9
    z = game.info["noise_multiplier"]
    # the layer's default split of the round's unit budget: counts get c = 1 / (1 + 2 sqrt(d)), d = 2
    c = 1 / (1 + 2 * math.sqrt(2))
    assert game.info["field_sigmas"]["weights"] == pytest.approx(z / math.sqrt(c), rel=1e-6)


def test_batched_noise_has_the_calibrated_sigma(correct_scores):
    game, _ = correct_scores
    rel = game.mechanism(game.neighbour_pair[0], 1500)
    sig = game.info["field_sigmas"]["weights"]
    assert np.std(rel["weights"][:, 2]) == pytest.approx(sig, rel=0.08)
    assert abs(np.corrcoef(rel["weights"][:, 0], rel["weights"][:, 1])[0, 1]) < 0.1


@pytest.mark.parametrize("method", METHODS)
def test_audit_stays_below_claim_under_correct_gaussian_dp(correct_scores, method):
    game, gs = correct_scores
    res = audit_epsilon(gs.scores_in, gs.scores_out, game.delta, 1e-3, method, random_state=2,
                        claimed_epsilon=game.claimed_epsilon)
    assert res.epsilon_lower_bound < game.claimed_epsilon, res.details
    assert res.violates_claim is False


def test_lr_score_detects_the_canary(correct_scores):
    # not vacuous: the attack sees the canary (AUC of a 1/z-shift Gaussian test)
    from attacks.membership import auc_score

    game, gs = correct_scores
    mu = game.info["claimed_mu"]
    assert auc_score(gs.scores_in, gs.scores_out) > 0.5 + 0.5 * (stats.norm.cdf(mu / math.sqrt(2)) - 0.5)


@pytest.mark.parametrize(
    "broken,score",
    [("no_count_noise", "count"), ("no_clipping", "sum")],
)
def test_injected_bug_is_flagged(broken, score):
    game = gaussian_dp_round_game(1.0, 1e-5, clip=1.0, broken=broken, score=score, random_state=0)
    gs = run_dp_game(game.mechanism, game.neighbour_pair, 600, score=game.score, random_state=3)
    flagged = []
    for method in METHODS:
        res = audit_epsilon(gs.scores_in, gs.scores_out, game.delta, 0.05, method, random_state=4,
                            claimed_epsilon=game.claimed_epsilon)
        flagged.append(res.violates_claim)
        if method == "clopper-pearson":  # the assumption-free bound must flag it
            assert res.epsilon_lower_bound > 2 * game.claimed_epsilon, res.details
    assert all(flagged)
