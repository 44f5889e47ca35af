"""What ``transcript_`` keeps (the estimators' ``record``): the same fit either way; a fit
whose full transcript could outgrow memory says so; attacks refuse a transcript that keeps
less than they read instead of reporting no leakage."""

import warnings

import numpy as np
import pytest

from attacks import AggregateDifferencing, CraftedCentroids, Differencing, SmallClusterDisclosure
from attacks.fuzzy import FuzzyEquationSolver
from securefkm.estimators import base
from securefkm.estimators.dwf import WeightedFederatedKMeans
from securefkm.exceptions import InputError


@pytest.fixture(scope="module")
def clients(blobs_noniid):
    return blobs_noniid[1]


def _fit(clients, record, **kw):
    kw = {"max_rounds": 8, **kw}
    return WeightedFederatedKMeans(5, random_state=0, record=record, **kw).fit(clients)


def test_aggregates_keep_each_rounds_aggregate_and_no_client_message(clients):
    full, agg = _fit(clients, "full"), _fit(clients, "aggregates")
    assert np.array_equal(full.cluster_centers_, agg.cluster_centers_)
    assert agg.transcript_.level == "aggregates" and len(agg.transcript_) == len(full.transcript_)
    assert any(f.items for f in full.transcript_)  # the k-FED seeding round's local centres
    for f, a in zip(full.transcript_, agg.transcript_):
        assert [s.stage for s in a.stages] == [s.stage for s in f.stages] and not a.items
        assert all(not s.received and not s.sent for s in a.stages)
        assert a.contributors == f.contributors and (a.aggregate or {}).keys() == (f.aggregate or {}).keys()
        assert all(np.array_equal(a.aggregate[k], f.aggregate[k]) for k in f.aggregate or {})
    assert sum(len(s.received) for f in full.transcript_ for s in f.stages) > 0
    assert len(_fit(clients, "none").transcript_) == 0


def test_bad_record_names_the_argument(clients):
    with pytest.raises(InputError, match=r"record must be one of \('full', 'aggregates', 'none'\), got 'all'"):
        _fit(clients, "all")


def test_a_default_fit_whose_full_transcript_could_outgrow_memory_warns(clients, monkeypatch):
    """The default (None) records in full and warns above the bound; record="full" asked
    for explicitly (e.g. by the attack benchmark, whose attacks read it) does not warn."""
    # 100 clients x 5 clusters x (2 + 1) values x 8 bytes = 12 kB a round; 8 training rounds
    # and the seeding round planned
    n = len(clients)
    monkeypatch.setattr(base, "TRANSCRIPT_WARN_BYTES", 10_000)
    with pytest.warns(UserWarning, match=r"up to about .* GiB over 9 planned rounds \(0\.0 MiB a round\).*record=\"aggregates\"") as got:
        default = _fit(clients, None)
    assert got[0].filename == __file__  # points at the caller's fit
    assert default.transcript_.level == "full"
    monkeypatch.setattr(base, "TRANSCRIPT_WARN_BYTES", 9 * n * 5 * 3 * 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _fit(clients, None)  # exactly at the bound: quiet
        monkeypatch.setattr(base, "TRANSCRIPT_WARN_BYTES", 10_000)
        _fit(clients, "full")  # asked for: quiet
        _fit(clients, "aggregates")


@pytest.mark.parametrize("attack", [SmallClusterDisclosure(), Differencing(), FuzzyEquationSolver()])
def test_message_attacks_refuse_a_transcript_without_client_messages(clients, attack):
    agg = _fit(clients, "aggregates")
    with pytest.raises(InputError, match=r"reads each client's messages.*record='aggregates'.*record=\"full\""):
        attack.evaluate(agg.transcript_, clients)


def test_aggregate_differencing_reads_aggregates_and_refuses_none(clients):
    """Once the centres stop moving the broadcasts repeat, and rounds whose dropouts differ
    by one client isolate that client's sums: found alike from a full record and from the
    aggregates alone."""
    ten = clients[:10]
    kw = dict(max_rounds=40, tol=0.0, dropout_rate=0.1)
    full, agg = _fit(ten, "full", **kw), _fit(ten, "aggregates", **kw)
    a, b = AggregateDifferencing().evaluate(full.transcript_, ten), AggregateDifferencing().evaluate(agg.transcript_, ten)
    assert a.extra["isolated_clients"] and a.to_dict() == b.to_dict()
    with pytest.raises(InputError, match=r"reads each round's aggregate.*record='none'.*keeps no rounds"):
        AggregateDifferencing().evaluate(_fit(ten, "none").transcript_, ten)


def test_active_attack_sees_the_whole_round_whatever_the_transcript_keeps(clients):
    """The malicious server's policy observes each round before the transcript drops its
    messages: the attack recovers as much from an estimator that records only aggregates."""
    full = CraftedCentroids(0).evaluate(WeightedFederatedKMeans(5, random_state=0), clients)
    agg = CraftedCentroids(0).evaluate(WeightedFederatedKMeans(5, random_state=0, record="aggregates"), clients)
    assert agg.records_recovered == full.records_recovered == len(clients[0])
