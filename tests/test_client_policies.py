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
    policies = {1: Replace("masked_input", b"x", rounds={0, 2}), 6: Poison(2.0), 10: Refuse("unmask")}
    local = _outcome("local", policies)
    assert any(local[2]), "the case must produce faults to compare"
    assert _outcome("processes", policies) == local


# ------------------------------------------------------------------ server faults, unattributed aborts
from securefkm.layers import PlainSum, _PlainServer  # noqa: E402


class _CheckingServer(_PlainServer):
    """PlainSum's server with an attributing check: a negative count is the sender's fault."""

    def receive(self, stage, replies):
        good = {}
        for c, r in replies.items():
            if float(np.asarray(r["count"])[0]) < 0:
                self.faults[c] = f"stage {stage!r}: field 'count' is negative"
            else:
                good[c] = r
        super().receive(stage, good)


class _Checking(PlainSum):
    def server_session(self, ctx):
        return _CheckingServer(ctx)


class _UnattributedServer(_PlainServer):
    def result(self):
        if self.ctx.attempt < self.fail_attempts:
            exc = RoundAbortedError(f"the check slot is wrong: a contributor's input or the server is at fault "
                                    f"(contributors {sorted(self.replies)})", round=self.ctx.round, stage="input")
            exc.cause = "unattributed_check_failure"
            raise exc
        return super().result()


class _Unattributed(PlainSum):
    def __init__(self, fail_attempts):
        self.fail_attempts = fail_attempts

    def server_session(self, ctx):
        server = _UnattributedServer(ctx)
        server.fail_attempts = self.fail_attempts
        return server


def _sum_fed(n=4, **kw):
    from securefkm.layers import validate_stack

    agg = kw.pop("aggregator", None)
    fed = Federation(SumAlgorithm(), _clients(n), random_state=0, **kw)
    if agg is not None:  # a test aggregator in place of PlainSum (the stack has none)
        fed.layers, fed.aggregator = validate_stack([agg], fed.algorithm)
        for rt in fed.transport.clients.values():
            rt.layers, rt.aggregator = fed.layers, fed.aggregator
    return fed


def test_server_session_faults_strike_and_exclude():
    fed = _sum_fed(4, aggregator=_Checking(), client_policies={2: Poison(-1.0)})
    state = fed.algorithm.init(4, 3, None)
    first = fed.run_round(state, round=0)
    assert fed.transcript[0].faults == {2: "stage 'input': field 'count' is negative"}
    assert first.extra["contributors"] == (0, 1, 3) and fed.excluded == {}
    fed.run_round(state, round=1)
    assert fed.excluded == {2: "stage 'input': field 'count' is negative"} and fed.strikes == {2: 2}
    third = fed.run_round(state, round=2)
    assert 2 not in fed.transcript[2].sampled and third.extra["contributors"] == (0, 1, 3)
    assert ServerSessionDefault().faults == {} and ServerSessionDefault().faults is not ServerSessionDefault().faults


class ServerSessionDefault(_PlainServer):
    def __init__(self):
        pass


def test_unattributed_check_failure_is_retried_and_counted():
    fed = _sum_fed(4, aggregator=_Unattributed(2), max_aborted_rounds=3)
    state = fed.run(0)
    assert state.extra["contributors"] == (0, 1, 2, 3)
    assert [(a.attempt, a.cause) for a in fed.transcript.aborts] == [(0, "unattributed_check_failure"),
                                                                      (1, "unattributed_check_failure")]
    assert fed.n_aborted_rounds == 2 and fed.excluded == {}  # nobody is blamed for it
    from securefkm.exceptions import TooManyAbortedRoundsError

    with pytest.raises(TooManyAbortedRoundsError, match="sign_keys=True"):
        _sum_fed(4, aggregator=_Unattributed(99), max_aborted_rounds=1).run(0)


def test_repeated_aborts_read_once_per_cause(caplog):
    """11 identical aborts: the error lists the cause once with its count and attempts (short),
    nothing is logged at WARNING (nothing printed by default), one INFO line per cause."""
    import logging

    from securefkm.exceptions import TooManyAbortedRoundsError

    fed = _sum_fed(4, aggregator=_Unattributed(99), max_aborted_rounds=10)
    with caplog.at_level(logging.DEBUG, logger="securefkm"), pytest.raises(TooManyAbortedRoundsError) as info:
        fed.run(0)
    msg = str(info.value)
    assert len(msg) < 600, len(msg)
    assert msg.count("unattributed_check_failure") == 1
    assert "round 0 attempts 0-10: 11 x unattributed_check_failure at stage 'input'" in msg
    assert "max_aborted_rounds" in msg
    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert not [m for lv, m in levels if lv >= logging.WARNING]
    assert len([m for lv, m in levels if lv == logging.INFO and "retrying" in m]) == 1
    assert len([m for lv, m in levels if lv == logging.DEBUG and "retrying" in m]) == 9


# ------------------------------------------------------------------ encoder refusals
class _Fraction(ClientPolicy):
    """Its update's integer count becomes fractional (what a buggy client-side step would do)."""

    def update(self, update, ctx):
        from securefkm.messages import Update

        sums = dict(update.sums)
        key = next(s.name for s in ctx.round_context.specs if s.integer)
        sums[key] = np.asarray(sums[key], dtype=float) + 0.5
        return Update(sums=sums, items=update.items)


@pytest.mark.parametrize("crypto", ["real", "ideal"])
@pytest.mark.parametrize("bad", ["nan", "fraction"])
def test_a_client_whose_encoder_refuses_is_that_clients_refusal(crypto, bad):
    policy = Poison(np.nan) if bad == "nan" else _Fraction()
    est = make_estimator("dwf", n_clusters=3, random_state=0, init_bounds=(-2.0, 7.0), backend="local",
                         protection=[PairwiseMasking()], crypto=crypto, max_rounds=3)
    with pytest.warns(UserWarning, match="client 5: its encoder refused its update: sum-field") as rec:
        est.fit(make_clients(), client_policies={5: policy})
    assert len([w for w in rec if "refused their update" in str(w.message)]) == len(est.transcript_)
    for r in est.transcript_:
        assert list(r.stage("update").refused) == [5] and 5 not in r.contributors
        assert len(r.contributors) == 11 and not r.faults and r.aborted is None
    assert est.excluded_clients_ == {}  # its own refusal: no strike


def test_encoder_refusals_are_the_same_on_every_backend():
    def run(backend):
        est = make_estimator("dwf", n_clusters=3, random_state=0, init_bounds=(-2.0, 7.0), backend=backend,
                             n_workers=2, protection=[PairwiseMasking()], max_rounds=3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(make_clients(), client_policies={2: Poison(np.nan), 9: _Fraction()})
        return est.cluster_centers_.tobytes(), released(est.transcript_)

    local = run("local")
    assert local == run("processes")
    assert [dict(s[3]) for s in local[1][0][10] if s[0] == "update"][0].keys() == {2, 9}


def test_codec_error_names_the_failing_row():
    from protocols.codec import FixedPointCodec
    from securefkm.exceptions import EncodingError
    from securefkm.messages import FieldSpec

    specs = (FieldSpec("n", (2,), "count", integer=True),)
    good, bad = {"n": np.array([1.0, 2.0])}, {"n": np.array([1.0, 2.5])}
    with pytest.raises(EncodingError, match="update 2 of the 3 encoded together: sum-field 'n'") as info:
        FixedPointCodec().encode_signed_many([good, good, bad], specs, 3)
    assert info.value.row == 2 and info.value.field == "n" and isinstance(info.value, InputError)


def test_estimators_take_max_client_faults():
    from securefkm.registry import make_estimator as make

    for name in ("dwf", "minibatch", "kfed"):
        try:
            est = make(name, n_clusters=3)
        except Exception:  # not every name is registered under this spelling
            continue
        assert est.get_params()["max_client_faults"] == MAX_CLIENT_FAULTS
    est = _fit({3: Replace("advertise", None)}, max_client_faults=1, max_rounds=3)
    assert est.excluded_clients_.keys() == {3} and est.transcript_.exclusions[0].round == 0
    est = _fit({3: Replace("advertise", None)}, max_client_faults=None, max_rounds=3)
    assert est.excluded_clients_ == {} and est.client_faults_ == {3: len(est.transcript_)}
    with pytest.raises(InputError, match="max_client_faults"):
        _fit({}, max_client_faults=0)


def test_exclusions_below_the_run_floor_stop_the_run_with_a_clear_error():
    if not hasattr(PairwiseMasking(), "sampled_floor"):
        pytest.skip("the aggregator declares no sampled floor")
    fed = Federation(SumAlgorithm(), _clients(8), protection=[PairwiseMasking()], random_state=0,
                     max_client_faults=1, client_policies={c: Replace("masked_input", "x") for c in (1, 2)})
    state = fed.algorithm.init(8, 3, None)
    fed.run_round(state, round=0)
    assert fed.excluded.keys() == {1, 2}
    floor = fed.aggregator.sampled_floor(fed.info)
    assert floor > 6
    with pytest.raises(NoParticipantsError, match=rf"client 1, client 2\), leaving 6 to sample, fewer than the {floor}"):
        fed.run_round(state, round=1)


class _LeftOutServer(_PlainServer):
    def result(self):
        self.unattributed = {1: "stage 'advertise': advertised client 3's public key (a leaked key or collusion)"}
        return super().result()


class _LeftOut(PlainSum):
    def server_session(self, ctx):
        return _LeftOutServer(ctx)


def test_unattributed_clients_are_recorded_without_a_strike():
    """A client a check leaves out without blaming it (the server session's ``unattributed``)
    is named in the round's record with the reason, and is never struck or excluded."""
    fed = _sum_fed(4, aggregator=_LeftOut())
    state = fed.algorithm.init(4, 3, None)
    for t in range(3):
        fed.run_round(state, round=t)
    for record in fed.transcript:
        assert record.unattributed == {1: "stage 'advertise': advertised client 3's public key (a leaked key or "
                                          "collusion)"}
        assert record.faults == {}
    assert fed.strikes == {} and fed.excluded == {}
    assert "left out, unattributed (no strike): client 1: stage 'advertise'" in fed.transcript.summary()
