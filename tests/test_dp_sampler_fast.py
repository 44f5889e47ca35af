"""The vectorised exact sampler (protocols/dp/sampler.py): certified float decisions, the
exact path behind them, and the law of its draws.

Every Bernoulli(exp(-gamma)) coin compares one uniform U with exp(-gamma): in floating point
when the margin certifies the answer, else on exact rational bounds of exp(-gamma) with more
bits of U (``_ExactUniform``). Forcing every decision through the exact path must give the
very same draws on the same stream; the exact path must agree with 300-digit arithmetic on
near-ties; the draws must follow the discrete Gaussian pmf. ``_reference_sampler.py`` is the
coin-by-coin sampler as first written (CKS20 Algorithms 1-3 with Bernoulli(rational) coins):
the same law, a different use of the random stream.
"""

from __future__ import annotations

from fractions import Fraction

import _reference_sampler as ref
import mpmath
import numpy as np
import pytest
from scipy.stats import chisquare

from protocols import GaussianDP, PairwiseMasking
from protocols.dp import sampler
from protocols.dp.noise import keystream
from securefkm.exceptions import InputError
from securefkm.registry import make_estimator

SIGMA2 = [Fraction(1, 3), 1, 2.0, Fraction(7, 3), 100.0, 12345.678, 2.0**40, Fraction(2**56 + 1, 2**16), 2.0**60, 1e30]


def _never_certain(w, g, err):
    none = np.zeros(len(w), dtype=bool)
    return none, none.copy()


@pytest.mark.parametrize("sigma2", SIGMA2, ids=str)
def test_every_decision_taken_exactly_gives_the_same_draws(monkeypatch, sigma2):
    """With no float decision trusted, every coin and every geometric count goes through the
    exact rational path: the draws on the same stream must not change."""
    fast = sampler.sample_discrete_gaussian(sigma2, 40, as_int=True, source=keystream(3, str(sigma2)))
    monkeypatch.setattr(sampler, "_certain", _never_certain)
    slow = sampler.sample_discrete_gaussian(sigma2, 40, as_int=True, source=keystream(3, str(sigma2)))
    assert slow.tolist() == fast.tolist()


def test_exact_comparison_agrees_with_300_digit_arithmetic_on_near_ties():
    """U's first word placed on exp(-gamma)'s own 64-bit prefix (the ambiguous case): the exact
    path reads the next word and must decide as mpmath at 300 digits does."""
    mpmath.mp.dps = 300
    rng = np.random.default_rng(0)
    for _ in range(60):
        gamma = Fraction(int(rng.integers(0, 10**6)), int(rng.integers(1, 10**5)))
        e = mpmath.exp(-mpmath.mpf(gamma.numerator) / gamma.denominator)
        w = int(mpmath.floor(e * 2**64))
        nxt = int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))
        words = lambda ids, nxt=nxt: np.array([nxt], dtype=np.uint64)  # noqa: E731
        got = sampler._ExactUniform(w, 0, words).below(gamma)
        u = (mpmath.mpf(w) * 2**64 + nxt) / mpmath.mpf(2) ** 128  # U's first 128 bits
        assert got == bool(u < e), gamma
    mpmath.mp.dps = 15


def test_numpy_exp_is_far_inside_the_assumed_error_bound():
    """The float decisions assume np.exp's relative error is below _EXP_REL = 2^-40."""
    mpmath.mp.dps = 40
    g = np.concatenate([np.random.default_rng(1).uniform(0, 700, 2000), np.linspace(0, 1, 500)])
    p = np.exp(-g)
    worst = max(abs(float((mpmath.mpf(float(pi)) - mpmath.exp(-mpmath.mpf(float(gi)))) / mpmath.exp(-mpmath.mpf(float(gi)))))
                for gi, pi in zip(g, p))
    mpmath.mp.dps = 15
    assert worst < 2.0**-50 < sampler._EXP_REL


@pytest.mark.parametrize("sigma2", [Fraction(1, 3), 1.0, Fraction(7, 3), 100.0])
def test_draws_follow_the_discrete_gaussian(sigma2):
    """200,000 draws from a fixed keyed stream against the exact pmf (chi-square, cells with
    expected count >= 20 pooled at both tails)."""
    n = 200_000
    x = sampler.sample_discrete_gaussian(sigma2, n, source=keystream(9, f"law/{sigma2}"))
    half = int(np.ceil(8 * np.sqrt(float(sigma2)))) + 2
    support = np.arange(-half, half + 1)
    expected = sampler.discrete_gaussian_pmf(sigma2, support) * n
    keep = expected >= 20
    lo, hi = support[keep][0], support[keep][-1]
    counts = np.array([np.sum(x <= lo)] + [np.sum(x == v) for v in range(lo + 1, hi)] + [np.sum(x >= hi)])
    exp_k = np.concatenate([[expected[support <= lo].sum()], expected[(support > lo) & (support < hi)],
                            [expected[support >= hi].sum()]])
    assert chisquare(counts, exp_k * n / exp_k.sum()).pvalue > 1e-3


def test_same_law_as_the_coin_by_coin_reference():
    a = sampler.sample_discrete_gaussian(2.5, 20_000, source=keystream(4, "new"))
    b = ref.sample_discrete_gaussian(2.5, 20_000, source=keystream(4, "old"))
    support = np.arange(-6, 7)
    ca = np.array([np.sum(np.clip(a, -6, 6) == v) for v in support])
    cb = np.array([np.sum(np.clip(b, -6, 6) == v) for v in support])
    assert chisquare(ca, cb * ca.sum() / cb.sum()).pvalue > 1e-3


def test_geometric_count_law():
    """V with P(V >= v) = e^-v, from one uniform per draw."""
    ids = np.arange(100_000)
    _, words = sampler._single(ids.size, keystream(6, "geo"))
    v = sampler._geometric(ids, words)
    for k in range(5):
        assert abs(np.mean(v >= k) - np.exp(-k)) < 4 * np.sqrt(np.exp(-k) / ids.size) + 1e-9


@pytest.mark.parametrize("t,m", [(1, 1), (3, 1), (1000, 1), (2**16, 1), (2**30, 2**14), (7_000_000_001, 106_811)])
def test_scaled_geometric_count_law(t, m):
    """A with P(A >= a) = exp(-a m/t), read off one uniform, for the scales the discrete
    Laplace uses (m = 1 up to t = 2^16, then m = t >> 16)."""
    ids = np.arange(100_000)
    _, words = sampler._single(ids.size, keystream(7, f"geo/{t}/{m}"))
    a = sampler._geometric_scaled(np.full(ids.size, t, dtype=np.int64), np.full(ids.size, m, dtype=np.int64), ids, words)
    for q in (0.5, 1.0, 2.0, 3.0):
        k = int(q * t / m)
        p = np.exp(-k * m / t)
        assert abs(np.mean(a >= k) - p) < 5 * np.sqrt(p * (1 - p) / ids.size) + 1e-9, (t, k)


def test_truncated_part_law():
    """B on {0..m-1} with P(B = b) ∝ exp(-b/t), here at t = 4m (visibly non-uniform)."""
    n, m, t = 100_000, 8, 32
    ids = np.arange(n)
    _, words = sampler._single(n, keystream(7, "trunc"))
    b = sampler._truncated_geometric(np.full(n, t, dtype=np.int64), np.full(n, m, dtype=np.int64), ids, words)
    p = np.exp(-np.arange(m) / t)
    counts = np.bincount(b, minlength=m)
    assert counts.sum() == n and chisquare(counts, p / p.sum() * n).pvalue > 1e-3


@pytest.mark.parametrize("t", [1, 2, 7])
def test_discrete_laplace_follows_its_pmf(t):
    """DLap(t) from the one-uniform path against P(x) ∝ exp(-|x|/t) (chi-square)."""
    n = 100_000
    ids = np.arange(n)
    _, words = sampler._single(n, keystream(8, f"lap/{t}"))
    x = sampler._discrete_laplace(np.full(n, t, dtype=np.int64), ids, words)
    half = 8 * t
    support = np.arange(-half, half + 1)
    p = np.exp(-np.abs(support) / t)
    p /= p.sum() + 2 * np.exp(-(half + 1) / t) / (1 - np.exp(-1 / t))  # the tails beyond +-half
    counts = np.array([np.sum(x == v) for v in support])
    keep = p * n >= 20
    assert chisquare(counts[keep], p[keep] * n * counts[keep].sum() / (p[keep] * n).sum()).pvalue > 1e-3


def test_wide_discrete_laplace_tails_and_low_digits():
    """At t = 7e6 (|X| = m A + B, m = 106): P(|X| >= g) = 2 q^g / (1 + q) with q = e^(-1/t),
    symmetric signs, and |X| mod m (that is B) uniform up to exp(-m/t) ~ 1 - 1.5e-5."""
    n, t = 100_000, 7_000_000
    ids = np.arange(n)
    _, words = sampler._single(n, keystream(8, "lap/wide"))
    x = sampler._discrete_laplace(np.full(n, t, dtype=np.int64), ids, words)
    for g in (t // 2, t, 2 * t, 3 * t):
        p = 2 * np.exp(-g / t) / (1 + np.exp(-1 / t))
        assert abs(np.mean(np.abs(x) >= g) - p) < 5 * np.sqrt(p * (1 - p) / n), g
    assert abs(np.mean(x > 0) - 0.5) < 5 * np.sqrt(0.25 / n)
    m = t >> sampler._SPLIT_BITS
    assert chisquare(np.bincount(np.abs(x) % m, minlength=m)).pvalue > 1e-3


def test_a_request_draws_the_same_alone_or_in_any_batch():
    sigma2s, sizes = [1.0, 2.0**40, 55.5, 3.0, 1e30], [15, 7, 0, 30, 4]
    alone = [sampler.sample_discrete_gaussian(s, n, source=keystream(1, f"g{i}"), as_int=True)
             for i, (s, n) in enumerate(zip(sigma2s, sizes))]
    for order in ([0, 1, 2, 3, 4], [4, 2, 0, 3, 1]):
        batch = sampler.sample_discrete_gaussian_batch(
            [sigma2s[i] for i in order], [sizes[i] for i in order], [keystream(1, f"g{i}") for i in order], as_int=True)
        for i, got in zip(order, batch):
            assert got.tolist() == alone[i].tolist()


@pytest.mark.parametrize("read_ahead", [0, 1, 24])
def test_read_ahead_of_the_sources_does_not_change_a_draw(monkeypatch, read_ahead):
    """A batch reads each request's stream ahead into a buffer; however short that buffer
    (0: every pass refills it), every request gets what it draws alone."""
    monkeypatch.setattr(sampler._Words, "READ_AHEAD", read_ahead)
    sigma2s, sizes = [1.0, 2.0**40, 3.0, Fraction(7, 3)] * 3, [1, 40, 300, 0] * 3
    alone = [sampler.sample_discrete_gaussian(s, n, source=keystream(5, f"r{i}"), as_int=True)
             for i, (s, n) in enumerate(zip(sigma2s, sizes))]
    batch = sampler.sample_discrete_gaussian_batch(sigma2s, sizes, [keystream(5, f"r{i}") for i in range(len(sizes))],
                                                   as_int=True)
    assert [b.tolist() for b in batch] == [a.tolist() for a in alone]


def test_batch_from_the_os_stream_has_the_right_variance():
    draws = sampler.sample_discrete_gaussian_batch([4.0, 2.0**30], [20000, 20000])
    assert abs(draws[0].var() / 4.0 - 1) < 0.05
    assert abs(draws[1].astype(float).var() / 2.0**30 - 1) < 0.05


def test_batch_arguments_must_line_up():
    from securefkm.exceptions import InputError

    with pytest.raises(InputError, match="one entry per request"):
        sampler.sample_discrete_gaussian_batch([1.0, 2.0], [3])


@pytest.mark.parametrize("mode", ["distributed", "local"])
def test_layer_batch_equals_client_by_client(mode):
    """GaussianDP.client_updates (one sampler pass for all clients) returns, client by client,
    what client_update returns: the batched simulation path and a deployed client agree."""
    rng = np.random.default_rng(0)
    clients = [rng.normal(2.5, 1.0, size=(40, 2)).clip(-2, 7) for _ in range(8)]
    est = make_estimator("dwf", n_clusters=3, random_state=4, init_bounds=(-2.0, 7.0), max_rounds=2,
                         protection=[GaussianDP(1.0, 1e-5, bounds=(-2.0, 7.0), mode=mode, rng="seeded",
                                                **({"min_clients": 4} if mode == "distributed" else {}))]
                         + ([PairwiseMasking()] if mode == "distributed" else []))
    fed, _ = est.make_federation(clients)
    fed.run_round(fed.algorithm.init(fed.n_clients, 2, np.random.default_rng(0)), round=0)  # sets the layers up
    runtimes = list(fed.transport.clients.values())
    ctx = runtimes[0]._ctx  # round 0's context, as the clients saw it
    broadcasts = list(fed.transcript)[-1].broadcasts
    updates = [fed.algorithm.client_update(r.X, broadcasts[r.client_id], None, r.memory) for r in runtimes]
    layer = runtimes[0].layers[0]
    assert isinstance(layer, GaussianDP)
    one_by_one = [layer.client_update(u, r.context, ctx) for u, r in zip(updates, runtimes)]
    together = layer.client_updates(updates, [r.context for r in runtimes], ctx)
    assert len(together) == len(one_by_one) == 8
    for a, b in zip(one_by_one, together):
        assert a.sums.keys() == b.sums.keys() and a.sums
        for k in a.sums:
            assert np.asarray(a.sums[k]).tobytes() == np.asarray(b.sums[k]).tobytes()
    if mode == "distributed":  # a malformed update (an algorithm bug) is named, not noised
        import dataclasses

        name = ctx.specs[0].name
        bad = dataclasses.replace(updates[3], sums={**updates[3].sums, name: np.zeros(7)})
        with pytest.raises(InputError, match=f"sum-field {name!r} has shape"):
            layer.client_updates(updates[:3] + [bad], [r.context for r in runtimes[:4]], ctx)


def test_box_check_of_a_batch_names_the_first_client_outside():
    """GaussianDP.client_datas checks a round's records in one pass; a record outside the box
    still gets client_data's error naming that client, and records inside pass unchanged."""
    from securefkm.layers import ClientContext
    layer = GaussianDP(1.0, 1e-5, bounds=(0.0, 1.0), mode="distributed")
    layer._BOX_CHECK_ROWS = 7  # several passes over the batch
    rng = np.random.default_rng(0)
    Xs = [rng.uniform(0, 1, (n, 2)) for n in (3, 5, 0, 9, 4)]
    clients = [ClientContext(client_id=i, n_records=len(X)) for i, X in enumerate(Xs)]

    class _Ctx:  # a round without a radius bound
        broadcast = None
        action = "train"

    layer.radius_bound.round_radius = lambda ctx: None
    assert all(a is b for a, b in zip(layer.client_datas(Xs, clients, _Ctx()), Xs))
    Xs[3] = Xs[3].copy()
    Xs[3][5, 1] = 1.5
    with pytest.raises(InputError, match="client 3 has 1 record\\(s\\) outside the declared box \\(first: row 5\\)"):
        layer.client_datas(Xs, clients, _Ctx())


def test_os_stream_is_a_fresh_keystream_per_batch():
    """Unseeded batches read a ChaCha20 keystream under a fresh key from os.urandom: two batches
    never share bytes, and a stream's bytes look uniform (byte frequencies, chi-square)."""
    a, b = sampler.os_keyed_stream(), sampler.os_keyed_stream()
    x, y = a(1 << 17), b(1 << 17)
    assert x != y and a(64) != x[:64]  # another key; the stream moves on
    counts = np.bincount(np.frombuffer(x, dtype=np.uint8), minlength=256)
    assert chisquare(counts).pvalue > 1e-4
    big = a((1 << 16) + 10)  # beyond the shared zero buffer
    assert len(big) == (1 << 16) + 10
