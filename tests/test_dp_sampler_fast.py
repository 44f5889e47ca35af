"""The vectorised exact sampler (protocols/dp/sampler.py) against the digit-by-digit reference.

``_reference_sampler.py`` is the sampler as first written: every coin decided on the exact
binary expansion of its probability with Python integers, one request at a time. Fed the same
keyed byte stream, the fast sampler must return the very same integers -- which shows its
float shortcut never changes a decision -- and a request must get the same numbers alone or
inside any batch (what makes seeded DP noise independent of how clients are grouped).
"""

from __future__ import annotations

from fractions import Fraction

import _reference_sampler as ref
import numpy as np
import pytest

from protocols import GaussianDP, PairwiseMasking
from protocols.dp import sampler
from protocols.dp.noise import keystream
from securefkm.registry import make_estimator

SIGMA2 = [Fraction(1, 3), 1, 2.0, Fraction(7, 3), 100.0, 12345.678, 2.0**40, Fraction(2**56 + 1, 2**16), 1e30]


@pytest.mark.parametrize("sigma2", SIGMA2, ids=str)
def test_fast_sampler_equals_reference_on_the_same_stream(sigma2):
    for size in (0, 1, 17, 300):
        label = f"{sigma2}/{size}"
        want = ref.sample_discrete_gaussian(sigma2, size, as_int=True, source=keystream(11, label))
        got = sampler.sample_discrete_gaussian(sigma2, size, as_int=True, source=keystream(11, label))
        assert got.tolist() == want.tolist()


def test_every_decision_taken_digit_by_digit_gives_the_same_draws(monkeypatch):
    """With the float shortcut disabled every coin goes through the exact fallback path."""
    fast = sampler.sample_discrete_gaussian(2.0**20, 200, source=keystream(3, "x"))
    monkeypatch.setattr(sampler, "_U_SLACK", 2.0)  # no float decision is ever certain
    slow = sampler.sample_discrete_gaussian(2.0**20, 200, source=keystream(3, "x"))
    assert slow.tolist() == fast.tolist()


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
