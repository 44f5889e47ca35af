"""GaussianDP(rng="seeded"): DP noise as a deterministic function of the fit's seeds, in
central, distributed and local mode; rng="system" stays fresh OS randomness."""

from __future__ import annotations

import numpy as np
import pytest

from protocols.dp import GaussianDP, refuse_seeded_noise
from protocols.dp.noise import keystream
from protocols.dp.sampler import sample_discrete_gaussian
from securefkm.estimators.dwf import WeightedFederatedKMeans
from securefkm.exceptions import InputError, ProtectionConfigError
from securefkm.layers import ClientContext, RoundContext, RunInfo
from securefkm.messages import FieldSpec, Update

LOW, HIGH = -2.0, 2.0


def _clients(n_clients=6, seed=0):
    rng = np.random.default_rng(seed)
    X = np.clip(np.vstack([rng.normal(c, 0.3, size=(30, 2)) for c in (-1.0, 0.0, 1.0)]), LOW, HIGH)
    rng.shuffle(X)
    return np.array_split(X, n_clients)


def _fit(mode, seed, rng="seeded", clients=None):
    layers = [GaussianDP(1.0, 1e-5, bounds=(LOW, HIGH), mode=mode, rng=rng)]
    if mode == "distributed":
        from protocols.masking import PairwiseMasking

        layers.append(PairwiseMasking())
    est = WeightedFederatedKMeans(
        3, init="uniform", init_bounds=(LOW, HIGH), max_rounds=2, max_local_steps=1, tol=0,
        protection=layers, random_state=seed,
    ).fit(clients or _clients())
    return est.cluster_centers_, tuple(est.privacy_spent_)


@pytest.mark.parametrize("mode", ["central", "distributed", "local"])
def test_seeded_noise_makes_the_fit_a_function_of_its_seed(mode):
    a, spent_a = _fit(mode, 3)
    b, spent_b = _fit(mode, 3)
    np.testing.assert_array_equal(a, b)
    assert spent_a == spent_b
    c, _ = _fit(mode, 4)
    assert not np.array_equal(a, c)


def test_system_noise_differs_between_two_runs_with_the_same_seed():
    a, _ = _fit("central", 3, rng="system")
    b, _ = _fit("central", 3, rng="system")
    assert not np.array_equal(a, b)


def test_seeded_noise_does_not_depend_on_the_order_clients_are_processed():
    """Each client's noise share is keyed by (run, round, action, client, field): processing the
    clients in reverse order gives every client the same noised message."""
    spec = (FieldSpec("counts", (3,), "count", integer=True),)
    info = RunInfo(algorithm=None, n_clients=4, n_features=2, clients_per_round=4, max_rounds=1,
                   planned_rounds=1, random_state=7)

    class Codec:
        resolution = 2.0**-16

    def messages(order):
        dp = GaussianDP(1.0, 1e-5, bounds=(LOW, HIGH), mode="distributed", rng="seeded", noise_multiplier=1.0)
        dp._codec = Codec()
        dp.setup(info)
        ctx = RoundContext(run=0, round=0, action="train", sampled=(0, 1, 2, 3), specs=spec, info=info)
        out = {}
        for c in order:
            up = Update(sums={"counts": np.array([5.0, 1.0, 0.0])})
            out[c] = dp.client_update(up, ClientContext(c, 10), ctx).sums["counts"]
        return out

    forward, backward = messages([0, 1, 2, 3]), messages([3, 2, 1, 0])
    for c in range(4):
        np.testing.assert_array_equal(forward[c], backward[c])
    assert len({tuple(v) for v in forward.values()}) > 1  # clients get different shares


def test_keystream_is_keyed_by_seed_and_label_and_feeds_the_exact_sampler():
    x = sample_discrete_gaussian(100.0, 500, source=keystream(1, "a"))
    np.testing.assert_array_equal(x, sample_discrete_gaussian(100.0, 500, source=keystream(1, "a")))
    assert not np.array_equal(x, sample_discrete_gaussian(100.0, 500, source=keystream(1, "b")))
    assert not np.array_equal(x, sample_discrete_gaussian(100.0, 500, source=keystream(2, "a")))
    assert 0.8 < x.var() / 100.0 < 1.2


def test_seeded_without_random_state_and_unknown_rng_are_refused():
    with pytest.raises(InputError, match="random_state"):
        _fit("central", None)
    with pytest.raises(InputError, match="rng.*system.*seeded"):
        GaussianDP(1.0, 1e-5, clip=1.0, rng="numpy")


def test_deployments_refuse_seeded_noise():
    refuse_seeded_noise([GaussianDP(1.0, 1e-5, clip=1.0)])
    with pytest.raises(ProtectionConfigError, match="rng='system'"):
        refuse_seeded_noise([GaussianDP(1.0, 1e-5, clip=1.0, rng="seeded")])
    from securefkm.flower.spec import RunSpec, build_federation

    spec = RunSpec(algorithm="dwf", params={"n_clusters": 2, "init": "uniform", "init_bounds": [LOW, HIGH],
                                            "max_local_steps": 1},
                   protection=[{"name": "dp", "epsilon": 1.0, "delta": 1e-5, "clip": 2.0, "rng": "seeded"}],
                   random_state=0)
    with pytest.raises(ProtectionConfigError, match="rng='seeded'"):
        build_federation(spec, 4, 2, transport=None)
