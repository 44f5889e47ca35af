"""attacks.evaluate: one call for every attack, the same report as the attack's own call;
attacks.membership_candidates / hold_out: membership inference's candidates in one call."""

from __future__ import annotations

import numpy as np
import pytest

import attacks
from attacks import (
    CraftedCentroids,
    Differencing,
    MembershipInference,
    SmallClusterDisclosure,
    Sybil,
    evaluate,
    hold_out,
    membership_candidates,
)
from securefkm import FederatedDataset, WeightedFederatedKMeans
from securefkm.exceptions import InputError


@pytest.fixture(scope="module")
def split():
    rng = np.random.default_rng(0)
    data = FederatedDataset.from_arrays([rng.normal(c, 0.4, (25, 2)) for c in (0.0, 1.0, 2.0, 3.0)])
    return hold_out(data, 0.2, random_state=0)


@pytest.fixture(scope="module")
def fitted(split):
    train, _ = split
    return WeightedFederatedKMeans(n_clusters=6, max_rounds=8, random_state=0).fit(train)


def _same(a, b):
    return repr(a.to_dict()) == repr(b.to_dict())


@pytest.mark.parametrize("attack", [SmallClusterDisclosure(), Differencing()], ids=["small-cluster", "differencing"])
def test_passive_attack_gives_the_direct_report(fitted, split, attack):
    train, _ = split
    assert _same(evaluate(attack, fitted, train), attack.evaluate(fitted.transcript_, train))
    assert _same(attacks.evaluate(attack, fitted, train.clients), attack.evaluate(fitted.transcript_, train))


@pytest.mark.parametrize("make", [lambda: CraftedCentroids(0, max_rounds=10),
                                  lambda: Sybil(1, n_sybils=2, max_rounds=8)], ids=["crafted", "sybil"])
def test_active_attack_gives_the_direct_report(fitted, split, make):
    train, _ = split
    via = evaluate(make(), fitted, train)
    direct = make().evaluate(fitted, train)
    assert _same(via, direct) and via.rounds_used > 0


def test_membership_in_one_call_gives_the_direct_report(fitted, split):
    train, held = split
    cin, cout = membership_candidates(train, held, random_state=3)
    assert cin.shape == cout.shape == held.shape
    pooled = train.pooled()
    assert all((pooled == x).all(axis=1).any() for x in cin)  # members are training records
    direct = MembershipInference("distance").evaluate(fitted, train, cin, cout)
    via = evaluate(MembershipInference("distance"), fitted, train, held_out=held, random_state=3)
    assert _same(via, direct) and 0.0 <= via.auc <= 1.0
    assert _same(evaluate(MembershipInference(), fitted, train, candidates_in=cin, candidates_out=cout), direct)
    small_in, small_out = membership_candidates(train, held, n=5, random_state=0)
    assert len(small_in) == len(small_out) == 5
    assert all((held == x).all(axis=1).any() for x in small_out)


def test_hold_out_keeps_records_out_of_the_fit(split):
    train, held = split
    assert train.n_clients == 4 and train.n_samples + len(held) == 100 and len(held) > 0
    pooled = train.pooled()
    assert not any((pooled == x).all(axis=1).any() for x in held)
    with pytest.raises(InputError, match="fraction"):
        hold_out(train, 1.5)


def test_membership_candidates_match_the_benchmark_draw(split):
    """The attack benchmark draws its members through membership_candidates: same records as
    its former inline draw."""
    train, held = split
    rng = np.random.default_rng(20_000)
    pooled = train.pooled()
    expected = pooled[rng.choice(len(pooled), size=min(len(held), len(pooled)), replace=False)]
    got, out = membership_candidates(train, held, random_state=20_000)
    assert np.array_equal(got, expected) and np.array_equal(out, held)


def test_errors_name_the_argument(fitted, split):
    train, held = split
    unfitted = WeightedFederatedKMeans(n_clusters=3)
    with pytest.raises(InputError, match=r"estimator: this WeightedFederatedKMeans is not fitted"):
        evaluate(Differencing(), unfitted, train)
    with pytest.raises(InputError, match=r"estimator must be a fitted securefkm estimator"):
        evaluate(Differencing(), fitted.cluster_centers_, train)
    with pytest.raises(InputError, match=r"attack must be an attack object of this library.*got str"):
        evaluate("differencing", fitted, train)
    with pytest.raises(InputError, match=r"attack must be an attack object.*got WeightedFederatedKMeans"):
        evaluate(fitted, fitted, train)
    with pytest.raises(InputError, match="MembershipInference needs candidate records: held_out="):
        evaluate(MembershipInference(), fitted, train)
    with pytest.raises(InputError, match="takes no keyword arguments here, got held_out"):
        evaluate(Differencing(), fitted, train, held_out=held)
    with pytest.raises(InputError, match="data: the clients' records have 3 features"):
        evaluate(Differencing(), fitted, [np.zeros((4, 3))])
    with pytest.raises(InputError, match=r"held_out must hold finite records of shape \(m, 2\)"):
        membership_candidates(train, np.zeros((3, 5)))
