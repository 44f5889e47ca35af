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
    epsilon_for_history,
    gdp_epsilon,
    noise_multiplier_for,
    noise_multiplier_for_schedule,
    schedule_history,
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
    assert time.perf_counter() - t0 < 5.0  # ~0.1 s unloaded; generous for shared CI
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
    acc.history = [(1.3, 0.5, 10)]
    assert epsilon_for(1.3, 10, 0.5, 1e-5) == pytest.approx(acc.get_epsilon(delta=1e-5), abs=1e-12)


@pytest.mark.parametrize("z,rounds", [(1.0, 10), (5.0, 100), (2.0, 1), (20.0, 400)])
def test_prv_matches_closed_form_gdp_full_participation(z, rounds):
    eps_prv = epsilon_for(z, rounds, 1.0, 1e-5)
    eps_gdp = gdp_epsilon(math.sqrt(rounds) / z, 1e-5)
    assert abs(eps_prv - eps_gdp) < 0.05
    assert eps_prv >= eps_gdp - 1e-9  # opacus reports the upper end of its error interval


@pytest.mark.parametrize(
    "q,acc", [(1.0, "prv"), (0.1, "rdp"), pytest.param(0.1, "prv", marks=pytest.mark.slow)]
)
def test_noise_multiplier_for_inverts_epsilon_for(q, acc):
    if True:
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


# ------------------------------------------------------------------------ GaussianDP layer
from protocols.dp import GaussianDP  # noqa: E402
from protocols.participation import ParticipationCap  # noqa: E402
from securefkm.algorithms.base import Algorithm, AlgorithmState  # noqa: E402
from securefkm.exceptions import PrivacyBudgetExceededError, ProtectionConfigError  # noqa: E402
from securefkm.federation import Federation  # noqa: E402
from securefkm.messages import Broadcast, FieldSpec, Update  # noqa: E402


class CountSum(Algorithm):
    """Tiny fake algorithm: one 'count' field (records per client) and one 'sum' field."""

    name = "countsum"

    def __init__(self, rounds=3, kind="sum", items=False):
        self.n_clusters = 1
        self.rounds = rounds
        self.kind = kind
        self.items = items
        self.seen = []

    def init(self, n_clients, n_features, rng):
        return AlgorithmState(centres=np.zeros((1, n_features)))

    def configure(self, state, round):
        return Broadcast(action="train", centres=state.centres)

    def sum_fields(self, broadcast):
        d = broadcast.centres.shape[1]
        return (FieldSpec("count", (1,), "count", integer=True), FieldSpec("total", (1, d), self.kind))

    def client_update(self, X, broadcast, rng, memory=None):
        items = {"centres": X.mean(axis=0, keepdims=True)} if self.items else {}
        return Update(sums={"count": np.array([float(len(X))]), "total": X.sum(axis=0, keepdims=True)}, items=items)

    def aggregate(self, state, agg):
        self.seen.append({k: v.copy() for k, v in agg.sums.items()})
        from dataclasses import replace

        return replace(state, round=state.round + 1, centres=agg.sums["total"] / max(agg.sums["count"][0], 1.0))

    def converged(self, state):
        return state.round >= self.rounds

    def planned_rounds(self, max_rounds):
        return min(max_rounds, self.rounds)


def _clients(n=4, m=50, d=2, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(m, d)) * 3 for _ in range(n)]


def test_layer_central_end_to_end_spent_within_target_and_noise_scale():
    algo = CountSum(rounds=3)
    dp = GaussianDP(epsilon=2.0, delta=1e-5, clip=1.0, count_share=None)  # equal shares
    fed = Federation(algo, _clients(), protection=[dp], max_rounds=3, random_state=0)
    fed.run()
    rep = dp.report()
    eps, delta = fed.privacy_spent()
    assert 0 < eps <= 2.0 and delta == 1e-5
    assert rep["accountant"] == "prv" and rep["max_client_rounds"] == 3
    z = rep["noise_multiplier"]
    assert epsilon_for(z, 3, 1.0, 1e-5) <= 2.0
    # joint sensitivity sqrt(2): sigma_count = sqrt(2) z (plus the 2^-20 lattice term)
    assert rep["field_sigmas"]["count"] == pytest.approx(math.sqrt(2) * z, rel=1e-5)
    assert rep["field_sigmas"]["total"] == pytest.approx(math.sqrt(2) * z * 1.0, rel=1e-5)
    # the aggregate was noised: count 200 is no longer exact
    counts = [s["count"][0] for s in algo.seen]
    assert any(c != 200.0 for c in counts)
    assert all(abs(c - 200) < 8 * math.sqrt(2) * z for c in counts)


def test_layer_refuses_round_past_budget():
    # calibrate for 2 rounds by fixing the noise multiplier, then ask for 6
    z = noise_multiplier_for(1.0, 1e-5, 2, 1.0)
    algo = CountSum(rounds=6)
    dp = GaussianDP(epsilon=1.0, delta=1e-5, clip=1.0, noise_multiplier=z)
    fed = Federation(algo, _clients(), protection=[dp], max_rounds=6, random_state=0)
    with pytest.raises(PrivacyBudgetExceededError, match="budget"):
        fed.run()
    assert 2 <= len(algo.seen) < 6
    assert dp.report()["privacy_spent"][0] <= 1.0


def test_participation_cap_reduces_calibrated_rounds():
    dp_cap = GaussianDP(epsilon=2.0, delta=1e-5, clip=1.0)
    Federation(CountSum(rounds=8), _clients(), protection=[ParticipationCap(2), dp_cap], max_rounds=8)
    dp_nocap = GaussianDP(epsilon=2.0, delta=1e-5, clip=1.0)
    Federation(CountSum(rounds=8), _clients(), protection=[dp_nocap], max_rounds=8)
    assert dp_cap.report()["planned_compositions"] == 2
    assert dp_cap.z < dp_nocap.z


def test_value_field_refused_with_fix():
    fed = Federation(CountSum(kind="value"), _clients(), protection=[GaussianDP(1.0, 1e-5, clip=1.0)], max_rounds=2)
    with pytest.raises(ProtectionConfigError, match="max_local_steps=1.*mode='local'"):
        fed.run()


def test_local_mode_accepts_value_and_items():
    algo = CountSum(kind="value", items=True, rounds=2)
    dp = GaussianDP(2.0, 1e-5, clip=1.0, mode="local")
    fed = Federation(algo, _clients(), protection=[dp], max_rounds=2)
    fed.run()
    assert dp.report()["privacy_spent"][0] <= 2.0
    # the set-field centres were projected and noised: not equal to the true means
    sent = fed.transcript.rounds[0].items
    assert all(not np.allclose(v["centres"], X.mean(axis=0)) for v, X in zip(sent.values(), _clients()))


def test_central_refuses_set_fields_unless_allowed():
    algo = CountSum(items=True, rounds=1)
    fed = Federation(algo, _clients(), protection=[GaussianDP(1.0, 1e-5, clip=1.0)], max_rounds=1)
    with pytest.raises(ProtectionConfigError, match="set-fields"):
        fed.run()
    dp = GaussianDP(1.0, 1e-5, clip=1.0, allow_plain_set_fields=True)
    Federation(CountSum(items=True, rounds=1), _clients(), protection=[dp], max_rounds=1).run()
    assert dp.report()["privacy_spent"][0] == float("inf")


def test_clipping_exact_and_bounds_violation():
    from securefkm.layers import ClientContext

    dp = GaussianDP(1.0, 1e-5, clip=1.5)
    X = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, -9.0]])
    Y = dp.client_data(X, ClientContext(0, 3), None)
    norms = np.linalg.norm(Y, axis=1)
    assert np.all(norms <= 1.5 + 1e-12)
    np.testing.assert_allclose(Y[0], [0.9, 1.2])
    np.testing.assert_array_equal(Y[1], X[1])  # inside: untouched
    np.testing.assert_allclose(Y[2], [0.0, -1.5])
    boxed = GaussianDP(1.0, 1e-5, bounds=(-1.0, 1.0))
    np.testing.assert_array_equal(boxed.client_data(X[1:2], ClientContext(0, 1), None), X[1:2])
    with pytest.raises(InputError, match="outside the declared box"):
        boxed.client_data(X, ClientContext(3, 3), None)


def test_constructor_errors_name_the_argument():
    with pytest.raises(InputError, match="not both"):
        GaussianDP(1.0, 1e-5, clip=1.0, bounds=(-1, 1))
    assert GaussianDP(1.0, 1e-5).bounds is None  # the domain may come from the estimator's init_bounds
    with pytest.raises(InputError, match="mode"):
        GaussianDP(1.0, 1e-5, clip=1.0, mode="global")
    with pytest.raises(InputError, match="epsilon"):
        GaussianDP(-1.0, 1e-5, clip=1.0)


def test_distributed_mode_needs_secure_aggregator():
    with pytest.raises(ProtectionConfigError, match="secure aggregator"):
        Federation(CountSum(), _clients(), protection=[GaussianDP(1.0, 1e-5, clip=1.0, mode="distributed")])


class _Codec:
    resolution = 2.0**-16


def _fake_secure_plain():
    """PlainSum dressed up as a secure aggregator with a codec (the real ones live in
    protocols.masking / protocols.paillier, written elsewhere)."""
    from securefkm.layers import PlainSum

    class FakeSecure(PlainSum):
        secure = True
        codec = _Codec()

    return FakeSecure()


def test_distributed_mode_shares_sum_to_calibrated_noise():
    algo = CountSum(rounds=1)
    dp = GaussianDP(5.0, 1e-5, clip=1.0, mode="distributed")
    fed = Federation(algo, _clients(n=4), protection=[dp, _fake_secure_plain()], max_rounds=1)
    fed.run()
    rec = fed.transcript.rounds[0]
    sent = rec.stages[1].received  # what the (fake) aggregator got from each client
    for sums in sent.values():
        # every share is on the lattice: integers for the integer count, 2^-16 for the sum
        assert float(sums["count"][0]).is_integer()
        assert np.all(np.mod(sums["total"] * 2**16, 1.0) == 0)
    rep = dp.report()
    assert rep["kls21_tau"] < 1e-6
    assert rep["privacy_spent"][0] <= 5.0


def test_rounding_before_dp_refused():
    from protocols.rounding import Rounding

    with pytest.raises(ProtectionConfigError, match="Rounding"):
        Federation(CountSum(), _clients(), protection=[Rounding(count_multiple=5), GaussianDP(1.0, 1e-5, clip=1.0)])


def test_min_cluster_before_noise_inflates_sensitivity():
    from protocols.min_cluster import MinClusterSize

    dp = GaussianDP(2.0, 1e-5, clip=1.0, count_share=None)  # equal shares: sigma = sqrt(2) z Delta
    Federation(CountSum(rounds=1), _clients(), protection=[MinClusterSize(p=3), dp], max_rounds=1).run()
    z = dp.report()["noise_multiplier"]
    assert dp.report()["field_sigmas"]["count"] == pytest.approx(3 * math.sqrt(2) * z, rel=1e-5)


def test_count_share_splits_the_sensitivity_budget():
    """sigma_f = z Delta_f / sqrt(w_f) with w_count = c, w_sum = 1 - c: same epsilon, other split."""
    dp = GaussianDP(epsilon=2.0, delta=1e-5, clip=1.0, count_share=0.1)
    fed = Federation(CountSum(rounds=2), _clients(), protection=[dp], max_rounds=2, random_state=0)
    fed.run()
    rep = dp.report()
    z = rep["noise_multiplier"]
    assert rep["field_sigmas"]["count"] == pytest.approx(z / math.sqrt(0.1), rel=1e-5)
    assert rep["field_sigmas"]["total"] == pytest.approx(z / math.sqrt(0.9), rel=1e-5)
    assert fed.privacy_spent()[0] <= 2.0
    with pytest.raises(InputError, match="count_share"):
        GaussianDP(epsilon=1.0, delta=1e-5, clip=1.0, count_share=1.0)


def test_calibration_is_cached_on_disk_for_fresh_processes(tmp_path):
    """A deployed client runs each message in a fresh process: the second calibration of a
    subsampled schedule (opacus's PRV) must come from the disk cache, equal, without importing
    torch; full participation is the closed form and never imports torch."""
    import subprocess
    import sys

    code = (
        "import sys; from protocols.dp.accounting import noise_multiplier_for; "
        "print(noise_multiplier_for(1.0, 1e-5, 3, {q}), 'torch' in sys.modules)"
    )
    env = {**__import__("os").environ, "SECUREFKM_CACHE_DIR": str(tmp_path)}

    def run(q):
        return subprocess.run([sys.executable, "-c", code.format(q=q)], capture_output=True, text=True, env=env,
                              check=True).stdout.split()

    first, second = run(0.5), run(0.5)
    assert first[0] == second[0]
    assert first[1] == "True" and second[1] == "False"
    assert noise_multiplier_for(1.0, 1e-5, 3, 0.5) == float(first[0])
    full = run(1.0)
    assert full[1] == "False" and float(full[0]) == noise_multiplier_for(1.0, 1e-5, 3, 1.0)


def test_full_participation_is_calibrated_by_the_exact_gdp_curve():
    """q = 1: the composition is exactly mu-GDP, mu^2 = sum_i n_i / z_i^2; the calibration spends
    the whole target (up to rounding) and needs less noise than opacus's PRV upper bound."""
    from opacus.accountants import PRVAccountant

    from protocols.dp.accounting import gdp_mu

    for eps, delta, schedule in [(0.1, 1e-3, [(1.0, 1)]), (0.25, 5e-4, [(1.0, 2)]), (1.0, 1e-5, [(5.0, 1), (1.0, 5)])]:
        z = noise_multiplier_for_schedule(eps, delta, schedule)
        hist = schedule_history(z, schedule)
        spent = epsilon_for_history(hist, delta)
        assert eps - 1e-9 <= spent <= eps
        mu = math.sqrt(sum(n / zi**2 for zi, _, n in hist))
        assert mu == pytest.approx(gdp_mu(eps, delta), rel=1e-9)
        assert gdp_epsilon(mu, delta) == spent
        acc = PRVAccountant()
        acc.history = list(hist)
        assert acc.get_epsilon(delta=delta) >= spent - 1e-9  # opacus: an upper bound of the same curve
    # the PRV's error margin: even 5% more noise than the exact calibration is above the target
    # for opacus at epsilon 0.1 (a PRV-calibrated release needed 9% more)
    z = noise_multiplier_for(0.1, 1e-3, 1, 1.0)
    acc = PRVAccountant()
    acc.history = [(1.05 * z, 1.0, 1)]
    assert acc.get_epsilon(delta=1e-3) > 0.1
