"""The malicious-client harness (ClientPolicy), strikes and exclusion in the runtime.

A policy rewrites what its client sends at any stage; a reply that is not even a message of
the stage is the transport's fault record; every fault is a strike and a client is excluded
after ``max_client_faults`` of them, then never sampled again. The same on every backend.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
from _backend_cases import make_clients, released
from _client_policies import Poison, Recorder, Refuse, Replace, Silent
from _sum_algorithm import SumAlgorithm, _clients

from protocols import PairwiseMasking
from securefkm.exceptions import InputError, NoParticipantsError, RoundAbortedError
from securefkm.federation import SILENT, ClientPolicy, Federation, LocalTransport
from securefkm.federation.runtime import MAX_CLIENT_FAULTS
from securefkm.federation.sampling import sample_clients
from securefkm.registry import make_estimator


def _fit(policies, backend="local", protection=None, **kw):
    est = make_estimator("dwf", n_clusters=3, random_state=0, init_bounds=(-2.0, 7.0), backend=backend,
                         protection=[PairwiseMasking()] if protection is None else protection, n_workers=2, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(make_clients(), client_policies=policies)


@pytest.mark.parametrize("stage, value, why", [
    ("update", "garbage", "stage 'update': the reply is a str, not an UpdateReply"),
    ("advertise", None, "stage 'advertise': the reply is a NoneType, not a dict"),
    ("masked_input", [1, 2], "stage 'masked_input': the reply is a list, not a ndarray"),
])
def test_malformed_reply_is_a_transport_fault_and_two_exclude(stage, value, why):
    est = _fit({3: Replace(stage, value)})
    t = est.transcript_
    assert [r.faults for r in t][:2] == [{3: why}, {3: why}]
    assert all(not r.faults for r in t[2:]) and len(t) >= 3
    assert all(3 not in r.sampled for r in t[2:]) and all(3 in r.sampled for r in t[:2])
    assert all(r.aborted is None for r in t)  # the protocol left client 3 out; nothing aborted
    assert [3 in r.contributors for r in t[:2]] == [False, False]
    assert [(e.client, e.round, e.strikes) for e in t.exclusions] == [(3, 1, 2)]
    assert est.excluded_clients_ == {3: why} and est.client_faults_ == {3: 2}
    summary = t.summary()
    assert "client faults: client 3: 2" in summary and "client 3 excluded at run 0 round 1" in summary


def test_default_max_client_faults_is_two_and_none_never_excludes():
    assert MAX_CLIENT_FAULTS == 2
    est = _fit({3: Replace("advertise", None)}, max_rounds=4)
    fed = Federation(SumAlgorithm(), _clients(5), protection=[PairwiseMasking()], random_state=0,
                     client_policies={1: Replace("masked_input", "x")}, max_client_faults=None)
    state = fed.algorithm.init(5, 3, None)
    for r in range(3):
        fed.run_round(state, round=r)
    assert fed.strikes == {1: 3} and fed.excluded == {} and fed.transcript.exclusions == []
    assert all(1 in r.sampled and 1 not in r.contributors for r in fed.transcript)
    assert est.excluded_clients_.keys() == {3}
    once = Federation(SumAlgorithm(), _clients(5), protection=[PairwiseMasking()], random_state=0,
                      client_policies={1: Replace("masked_input", "x")}, max_client_faults=1)
    once.run_round(state, round=0)
    assert once.excluded.keys() == {1}
    assert 1 not in once.run_round(state, round=1).extra["contributors"]


def test_silence_and_refusals_are_not_faults():
    est = _fit({3: Silent("masked_input"), 5: Refuse("share", "policy says no")})
    t = est.transcript_
    assert all(not r.faults for r in t) and est.excluded_clients_ == {} and t.exclusions == []
    first = t[0]
    assert 3 in first.stage("masked_input").dropped
    assert first.stage("share").refused == {5: "policy says no"}
    assert 3 not in first.contributors and 5 not in first.contributors


def test_policy_update_hook_poisons_before_the_layers_exactly():
    clients = _clients(4)
    honest = Federation(SumAlgorithm(), clients, protection=[PairwiseMasking()], random_state=0)
    bad = Federation(SumAlgorithm(), clients, protection=[PairwiseMasking()], random_state=0,
                     client_policies={2: Poison(3.0)})
    s0 = honest.algorithm.init(4, 3, None)
    a = honest.run_round(s0, round=0).extra["sums"]
    b = bad.run_round(s0, round=0).extra["sums"]
    assert b["count"][0] == a["count"][0] + 2 * len(clients[2])
    np.testing.assert_allclose(b["total"], a["total"] + 2 * clients[2].sum(0), atol=1e-5)
    assert bad.transcript[0].faults == {}  # a well-formed poisoned input is no fault


class _FusedTransport(LocalTransport):
    fuse_first_stage = True


def test_fused_first_stage_is_asked_under_its_own_name():
    """With the aggregator's first stage fused into the update exchange, the policy is asked
    about 'advertise' first and then about the update reply carrying it; a malformed fused
    advert is the transport's fault, as an unfused one is."""
    from securefkm.federation.client import ClientRuntime
    from securefkm.federation.sampling import Dropouts

    def fed(policy):
        f = Federation(SumAlgorithm(), _clients(5), protection=[PairwiseMasking()], random_state=0)
        runtimes = [ClientRuntime(i, X, f.algorithm, f.layers, f.aggregator, f.info,
                                  policy=policy if i == 1 else None) for i, X in enumerate(_clients(5))]
        f.transport = _FusedTransport(runtimes, Dropouts(None), np.random.default_rng(0))
        return f, runtimes[1].policy

    f, rec = fed(Recorder())
    f.run_round(f.algorithm.init(5, 3, None), round=0)
    assert [s for *_, s, _ in rec.log][:2] == ["advertise", "update"]
    assert [s for *_, s, _ in rec.log][2:] == ["share", "masked_input", "unmask"]
    f, _ = fed(Replace("advertise", "not an advert"))
    state = f.run_round(f.algorithm.init(5, 3, None), round=0)
    assert f.transcript[0].faults == {1: "stage 'advertise': the reply is a str, not a dict"}
    assert 1 not in state.extra["contributors"] and len(state.extra["contributors"]) == 4


def test_sampling_without_exclusions_is_unchanged_and_never_draws_excluded():
    for seed in range(5):
        a, b = np.random.default_rng(seed), np.random.default_rng(seed)
        assert sample_clients(a, 50, 7) == sample_clients(b, 50, 7, excluded={})
    rng = np.random.default_rng(0)
    for _ in range(50):
        s = sample_clients(rng, 10, 4, excluded={2: "x", 7: "y"})
        assert len(s) == 4 and not {2, 7} & set(s) and s == tuple(sorted(s))
    assert sample_clients(rng, 5, 9, excluded={0: "x"}) == (1, 2, 3, 4)


def test_every_client_excluded_ends_the_run_with_a_clear_error():
    fed = Federation(SumAlgorithm(), _clients(3), random_state=0, max_client_faults=1,
                     client_policies={c: Replace("update", 1) for c in range(3)})
    with pytest.raises(RoundAbortedError):
        fed.run_round(fed.algorithm.init(3, 3, None), round=0)
    assert fed.excluded.keys() == {0, 1, 2}
    with pytest.raises(NoParticipantsError, match="every client is excluded"):
        fed.run_round(fed.algorithm.init(3, 3, None), round=1)


def test_client_policies_are_checked_and_copied():
    with pytest.raises(InputError, match="client_policies key 9"):
        Federation(SumAlgorithm(), _clients(3), client_policies={9: ClientPolicy()})
    with pytest.raises(InputError, match=r"client_policies\[1\].*not a ClientPolicy"):
        Federation(SumAlgorithm(), _clients(3), client_policies={1: object()})
    rec = Recorder()
    fed = Federation(SumAlgorithm(), _clients(3), random_state=0, client_policies={0: rec})
    fed.run_round(fed.algorithm.init(3, 3, None), round=0)
    assert rec.log == [] and fed.client_policies[0].log  # the caller's object is untouched
    assert pickle.loads(pickle.dumps(SILENT)) is SILENT is ClientPolicy.SILENT


def _outcome(backend, policies):
    est = _fit(policies, backend=backend, max_rounds=4)
    t = est.transcript_
    return (est.cluster_centers_.tobytes(), released(t), [r.faults for r in t],
            [(e.client, e.round, e.attempt) for e in t.exclusions], [a.describe() for a in t.aborts])


def test_policies_act_identically_on_every_backend():
    """A fit with malicious clients (malformed, silent, refusing, poisoning) gives the same
    centres, the same released transcript, the same faults and exclusions in process and on
    worker processes (each policy lives in its client's worker for the whole fit)."""
    policies = {1: Replace("masked_input", b"x", rounds={0, 2}), 4: Silent("share"), 6: Poison(2.0),
                9: Replace("update", 7), 10: Refuse("unmask")}
    local = _outcome("local", policies)
    assert any(local[2]), "the case must produce faults to compare"
    assert _outcome("processes", policies) == local
