"""Clients enforce the run's floor: the fewest clients a round with sum-fields may sample,
the secure threshold and the survivors floor, all from the client's own RunInfo."""

from __future__ import annotations

import numpy as np
import pytest
from _sum_algorithm import SumAlgorithm, _clients
from test_masking_consistency import N, VICTIM, open_round, split_view_attack

from protocols.masking import PairwiseMasking
from securefkm.exceptions import InputError, RoundAbortedError
from securefkm.federation import Federation, ServerPolicy
from securefkm.layers import ProtocolRefusal, RoundContext, RunInfo
from securefkm.messages import FieldSpec

SPECS = (FieldSpec("count", (1,), "count", integer=True), FieldSpec("total", (3,), "sum"))


class Isolate(ServerPolicy):
    """A malicious server that samples the victim and one more client only."""

    def __init__(self, chosen=(0, 1)):
        self.chosen = tuple(chosen)

    def plan(self, state, round, broadcast, sampled, n_clients):
        return self.chosen, {c: broadcast for c in self.chosen}


def info(n, cpr=None):
    return RunInfo(algorithm=None, n_clients=n, n_features=3, clients_per_round=cpr or n, max_rounds=1,
                   planned_rounds=1)


@pytest.mark.parametrize("sign_keys", [False, True])
@pytest.mark.parametrize("chosen", [(0, 1), tuple(range(10))])
def test_isolating_round_is_refused_by_every_client_and_releases_nothing(sign_keys, chosen):
    fed = Federation(SumAlgorithm(), _clients(20), protection=[PairwiseMasking(sign_keys=sign_keys)],
                     server_policy=Isolate(chosen), random_state=0)
    state = fed.algorithm.init(20, 3, None)
    with pytest.raises(RoundAbortedError):
        fed.run_round(state, round=0)
    rec = fed.transcript[-1]
    assert rec.aborted and rec.aggregate is None
    update = rec.stages[0]
    assert set(update.refused) == set(chosen) and update.received == {}
    floor = fed.aggregator.sampled_floor(fed.info)
    assert floor == 18
    for c, why in update.refused.items():
        assert f"client {c} refuses the round" in why and "'sampled'" in why and f"floor of {floor}" in why
    assert all(len(s.received) == 0 for s in rec.stages[1:])  # no masked input ever left a client


def test_sampled_floor_from_the_run_and_the_dropout_allowance():
    layer = PairwiseMasking()
    assert layer.sampled_floor(info(100)) == 90  # 10% dropout allowance
    assert layer.sampled_floor(info(200, 100)) == 90
    assert layer.sampled_floor(info(5)) == 4  # at least one client of allowance
    assert layer.sampled_floor(info(2)) == 2
    assert PairwiseMasking(threshold=5).sampled_floor(info(5)) == 5  # rounds of fewer could not complete


def test_round_refusal_checks_the_sampled_set_itself():
    layer = PairwiseMasking()
    run = info(20)
    layer.setup(run)

    def ctx(sampled):
        return RoundContext(0, 0, "sum", tuple(sampled), SPECS, run, b"D" * 32)

    assert layer.round_refusal(ctx(range(20)), 3) is None
    assert "does not list this client" in layer.round_refusal(ctx(range(1, 20)), 0)
    assert "twice" in layer.round_refusal(ctx(list(range(19)) + [0]), 3)
    assert "outside 0..19" in layer.round_refusal(ctx(list(range(19)) + [25]), 3)
    assert "below the run's floor of 18" in layer.round_refusal(ctx(range(17)), 3)
    # a round without sum-fields (a seeding round asking one client for plain set-fields)
    assert layer.round_refusal(RoundContext(0, 0, "init", (3,), (), run, b""), 3) is None


def test_insecure_threshold_refused_naming_the_argument_and_the_opt_in():
    with pytest.raises(InputError, match=r"threshold=2 .*allow_insecure_threshold=True"):
        PairwiseMasking(threshold=2).setup(info(100))
    with pytest.raises(InputError, match=r"threshold=0.5 .*t=50 .*floor t=51"):
        PairwiseMasking(threshold=0.5).setup(info(100))
    PairwiseMasking(threshold=51).setup(info(100))  # a strict majority is fine
    layer = PairwiseMasking(threshold=2, allow_insecure_threshold=True)
    layer.setup(info(100))
    assert layer.insecure_threshold() and layer.report()["insecure_threshold"] is True
    sees, _ = layer.server_view(SumAlgorithm(), layer)
    assert "INSECURE" in sees and "allow_insecure_threshold=True" in sees
    assert "allow_insecure_threshold=True" in repr(layer)
    honest = PairwiseMasking()
    honest.setup(info(100))
    assert not honest.insecure_threshold() and "INSECURE" not in honest.server_view(SumAlgorithm(), honest)[0]


def test_insecure_threshold_runs_with_the_opt_in_and_the_report_says_so():
    fed = Federation(SumAlgorithm(), _clients(6), random_state=0,
                     protection=[PairwiseMasking(threshold=2, allow_insecure_threshold=True)])
    state = fed.run_round(fed.algorithm.init(6, 3, None), round=0)
    assert state.extra["contributors"] == tuple(range(6))
    with pytest.raises(InputError, match="allow_insecure_threshold"):
        Federation(SumAlgorithm(), _clients(6), random_state=0, protection=[PairwiseMasking(threshold=2)])


def test_split_view_recovers_nothing_under_the_default_threshold_without_sign_keys():
    """The attack that recovers the victim with t = 5 of 10 (opt-in) recovers nothing at
    the default t = 7: no two disjoint sets of holders both reach it."""
    x, _, _ = split_view_attack(PairwiseMasking(), N, VICTIM, (0, 1, 2, 4, 5))
    assert x is None
    x, _, plain = split_view_attack(PairwiseMasking(threshold=5, allow_insecure_threshold=True), N, VICTIM,
                                    (0, 1, 2, 4, 5))
    assert x is not None and np.array_equal(x[:-1], plain)


@pytest.mark.parametrize("sign_keys", [False, True])
def test_survivor_list_below_the_floor_is_refused(sign_keys):
    layer = PairwiseMasking(sign_keys=sign_keys)
    server, clients, _ = open_round(layer, 10, {c: {"count": np.array([1.0]), "total": np.ones(3)} for c in range(10)})
    for stage in ("advertise", "share", "masked_input"):
        msgs = server.messages(stage, tuple(range(10)))
        server.receive(stage, {c: clients[c].respond(stage, m) for c, m in msgs.items()})
    shrunk = tuple(range(6))  # the floor is 7 (t = 7 of 10)
    stage = "consistency_check" if sign_keys else "unmask"
    msg = {"survivors": shrunk} if sign_keys else {"survivors": shrunk, "dropped": tuple(range(6, 10))}
    with pytest.raises(ProtocolRefusal, match=r"client 0 refuses: field 'survivors' lists only 6 clients.* minimum 7"):
        clients[0].respond(stage, msg)


def test_the_signed_statement_binds_the_run_floor():
    ctx = RoundContext(0, 0, "sum", tuple(range(10)), SPECS, info(10), b"D" * 32)
    a, b = PairwiseMasking(sign_keys=True), PairwiseMasking(sign_keys=True)
    a.setup(info(10))
    b.setup(info(20, 10))
    assert a.statement_digest(ctx) == a.statement_digest(ctx)
    assert a.statement_digest(ctx) != b.statement_digest(ctx)  # another declared run: another statement
    c = PairwiseMasking(sign_keys=True)
    c.setup(info(10, 9))
    assert a.statement_digest(ctx) != c.statement_digest(ctx)


def test_graph_params_renamed_from_bounds():
    layer = PairwiseMasking(corrupt_fraction=0.1)
    assert layer.graph_params["corrupt_fraction"] == 0.1 and not hasattr(layer, "bounds")


def test_sampled_set_is_checked_once_per_round_not_once_per_client(monkeypatch):
    """The clients of one simulated round share the request's sampled tuple: its checks (which
    read the whole set) run once, not once per client (quadratic in the cohort), and the
    masking plan is made once, while every client still checks that it is listed."""
    from securefkm.layers import Aggregator

    calls = {"check": 0, "plan": 0}
    check, make = Aggregator._check_sampled, PairwiseMasking.plan.__globals__["make_plan"]

    def counting_check(self, sampled, info):
        calls["check"] += 1
        return check(self, sampled, info)

    def counting_plan(*args, **kw):
        calls["plan"] += 1
        return make(*args, **kw)

    monkeypatch.setattr(Aggregator, "_check_sampled", counting_check)
    monkeypatch.setitem(PairwiseMasking.plan.__globals__, "make_plan", counting_plan)
    fed = Federation(SumAlgorithm(), _clients(60), protection=[PairwiseMasking()], random_state=0, backend="local")
    fed.run_round(fed.algorithm.init(60, 3, None), round=0)
    assert fed.transcript[-1].aborted is None and len(fed.transcript[-1].contributors) == 60
    assert calls == {"check": 1, "plan": 1}


def test_a_client_left_out_of_a_shared_sampled_tuple_still_refuses():
    layer = PairwiseMasking()
    run = info(20)
    layer.setup(run)
    sampled = tuple(range(1, 20))
    ctx = RoundContext(run=0, round=0, action="train", sampled=sampled, specs=SPECS, info=run, broadcast_digest=b"d")
    assert layer.round_refusal(ctx, 1) is None
    assert "does not list this client" in layer.round_refusal(ctx, 0)
    listed_twice = RoundContext(run=0, round=0, action="train", sampled=sampled + (1,), specs=SPECS, info=run,
                                broadcast_digest=b"d")
    assert "lists a client twice" in layer.round_refusal(listed_twice, 1)
    assert layer.round_refusal(ctx, 2) is None  # the verdict of the tuple seen before is not reused for another
