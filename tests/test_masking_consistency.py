"""The split-view attack on pairwise masking and the consistency-check stage that stops it.

A malicious server tells half of a victim B's holders "B dropped" (they return B's
mask-key shares) and the other half "B survived" (they return B's self-mask shares). Each
honest client sees a consistent view, so the per-client refusals do not fire; with enough
shares of both kinds the server reconstructs b_B and s_B and strips every mask off B's
masked vector. The consistency check (Bonawitz et al. 2017, Fig. 4, round 3) makes every
client sign the survivor list U3 it was told and unmask only after a quorum of its holders
signed the same U3.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from protocols import shamir
from protocols.masking import PairwiseMasking, keys
from protocols.masking.prg import MaskExpander
from securefkm.exceptions import RoundAbortedError
from securefkm.federation import Federation
from securefkm.layers import ClientContext, ProtocolRefusal, RoundContext, RunInfo
from securefkm.messages import FieldSpec

SPECS = (FieldSpec("count", (1,), "count", integer=True), FieldSpec("total", (3,), "sum"))


def make_ctx(n, digest=b"D" * 32):
    info = RunInfo(algorithm=None, n_clients=n, n_features=3, clients_per_round=n, max_rounds=1, planned_rounds=1)
    return RoundContext(0, 0, "sum", tuple(range(n)), SPECS, info, digest)


def random_sums(n, seed):
    rng = np.random.default_rng(seed)
    return {c: {"count": rng.integers(0, 1000, 1).astype(float), "total": rng.normal(size=3) * 50} for c in range(n)}


def open_round(layer, n, sums):
    ctx = make_ctx(n)
    layer.setup(ctx.info)
    layer.before_round(ctx)
    server = layer.server_session(ctx)
    clients = {c: layer.client_session(ClientContext(c, 10), ctx, sums[c]) for c in range(n)}
    encoded = {c: layer.codec.encode(sums[c], SPECS, n) for c in range(n)}
    return server, clients, encoded


def honest_until_masked_input(server, clients):
    alive = tuple(sorted(clients))
    masked = {}
    for stage in ("advertise", "share", "masked_input"):
        msgs = server.messages(stage, alive)
        replies = {c: clients[c].respond(stage, pickle.loads(pickle.dumps(m))) for c, m in msgs.items()}
        server.receive(stage, replies)
        masked = replies
    return masked


def split_view_attack(layer, n, victim, told_dropped, corrupt=(), sums=None):
    """Mount the split-view attack on ``victim``; return (recovered vector or None, refusals).

    ``told_dropped``: honest clients told "victim dropped" (asked for its mask-key share);
    every other honest client is told "victim survived" (asked for its self-mask share).
    ``corrupt`` clients collude with the server: it restores a copy of their session for
    each view, so they answer (and sign) both.
    """
    sums = sums or random_sums(n, 0)
    server, clients, encoded = open_round(layer, n, sums)
    masked = honest_until_masked_input(server, clients)
    y_victim = masked[victim].copy()
    snapshot = {c: pickle.dumps(clients[c]) for c in corrupt}
    everyone = tuple(range(n))
    views = {
        "dropped": {
            "survivors": tuple(c for c in everyone if c != victim),
            "dropped": (victim,),
            "members": (set(told_dropped) - {victim}) | set(corrupt),
        },
        "survived": {
            "survivors": everyone,
            "dropped": (),
            "members": (set(everyone) - set(told_dropped)) | set(corrupt),
        },
    }
    sessions = {}

    def session(c, view):
        if c in corrupt:
            return sessions.setdefault((c, view), pickle.loads(snapshot[c]))
        return clients[c]

    refusals: dict[tuple[int, str], str] = {}
    signatures: dict[str, dict[int, bytes]] = {v: {} for v in views}
    if "consistency_check" in layer.stages:
        for name, view in views.items():
            for c in sorted(view["members"]):
                try:
                    signatures[name][c] = session(c, name).respond("consistency_check", {"survivors": view["survivors"]})
                except ProtocolRefusal as exc:
                    refusals[(c, name)] = str(exc)
    shares = {"b": [], "s": []}
    for name, view in views.items():
        msg = {"survivors": view["survivors"], "dropped": view["dropped"], "signatures": signatures[name]}
        for c in sorted(view["members"]):
            if (c, name) in refusals:
                continue
            try:
                reply = session(c, name).respond("unmask", pickle.loads(pickle.dumps(msg)))
            except ProtocolRefusal as exc:
                refusals[(c, name)] = str(exc)
                continue
            for kind in ("b", "s"):
                if victim in reply[kind]:
                    shares[kind].append(reply[kind][victim])
    t = server.plan.t_share
    if len(shares["b"]) < t or len(shares["s"]) < t:
        return None, refusals, encoded[victim]
    b_seed = shamir.reconstruct(shares["b"], t)
    s_sk = shamir.reconstruct(shares["s"], t)
    assert keys.x25519_public(s_sk) == server.adverts[victim]["s_pk"]
    # strip the self-mask and every pairwise mask the victim added
    x = y_victim.copy()
    expander = MaskExpander(server.plan.length, layer.cipher)
    expander.add(x, b_seed, -1)
    sk = keys.load_x25519(s_sk)
    for v in server.plan.graph.neighbours(victim).tolist():
        seed = keys.kdf(
            keys.x25519_agree(sk, server.adverts[v]["s_pk"]),
            keys.mask_seed_info(server.plan.rid, victim, v, server.digest),
        )
        expander.add(x, seed, -1 if victim < v else +1)
    return x, refusals, encoded[victim]


# --------------------------------------------------------------------------- the attack
N, VICTIM = 10, 3
HALF = (0, 1, 2, 4, 5)  # told "3 dropped"; 3, 6, 7, 8, 9 are told "3 survived"


def test_split_view_recovers_victim_exactly_without_consistency_check():
    """Without sign_keys (semi-honest setting, no consistency check) and an explicit t = 5
    of 10, two disjoint halves of honest holders each meet the threshold: the server strips
    every mask off the victim's vector. (Before the consistency check existed, this held
    with sign_keys=True as well.)"""
    layer = PairwiseMasking(threshold=5, allow_insecure_threshold=True)
    assert "consistency_check" not in layer.stages
    x, refusals, plain = split_view_attack(layer, N, VICTIM, HALF)
    assert refusals == {}
    assert x is not None
    assert x[-1] == 1 and np.array_equal(x[:-1], plain)  # the victim's individual input, bit for bit


@pytest.mark.parametrize("told_dropped", [(0, 1, 2, 4), HALF, (0, 1, 2, 4, 5, 6), (0, 1, 2, 4, 5, 6, 7)])
def test_split_view_refused_with_consistency_check(told_dropped):
    """sign_keys=True: the same attack, at every split the server can choose, recovers nothing.
    Quorum max(5, 10 // 2 + 1) = 6: at most one of the two views collects 6 signatures,
    so at most one kind of the victim's shares leaves the honest clients."""
    layer = PairwiseMasking(threshold=5, sign_keys=True, allow_insecure_threshold=True)
    assert layer.stages == ("advertise", "share", "masked_input", "consistency_check", "unmask")
    x, refusals, _ = split_view_attack(layer, N, VICTIM, told_dropped)
    assert x is None
    assert refusals, "the attack must be detected by the honest clients"
    assert all("signed the survivor list" in why for why in refusals.values())
    refused_views = {view for _, view in refusals}
    assert refused_views  # the minority view is refused outright
    small = "dropped" if len(told_dropped) < N - len(told_dropped) else "survived"
    if len(told_dropped) != N // 2:
        assert small in refused_views


def test_split_view_refused_at_default_threshold_even_with_colluders():
    """Default t = 7 of 10 with 2 colluding clients: 2t = 14 > m + n_C = 12."""
    layer = PairwiseMasking(sign_keys=True)
    x, refusals, _ = split_view_attack(layer, N, VICTIM, (0, 1, 2, 4), corrupt=(8, 9))
    assert x is None and refusals


def test_split_view_with_colluders_beyond_the_bound_still_works():
    """The documented limit: colluding clients sign and answer both views, so with
    t = 6 of 10 and n_C = 2 (2t = 12 <= m + n_C) the check cannot help (nor can any
    signature quorum <= t). Choose t > (m + n_C) / 2."""
    layer = PairwiseMasking(threshold=6, sign_keys=True)
    x, refusals, plain = split_view_attack(layer, N, VICTIM, (0, 1, 2, 4), corrupt=(8, 9))
    assert refusals == {}
    assert x is not None and np.array_equal(x[:-1], plain)


# --------------------------------------------------------------------------- honest rounds
STAGES = PairwiseMasking.STAGES_CHECKED


def drive(layer, n, sums, drops=None, digests=None):
    """An honest round; ``drops`` maps a stage to the clients that vanish at it."""
    drops = drops or {}
    ctx = make_ctx(n)
    layer.setup(ctx.info)
    layer.before_round(ctx)
    server = layer.server_session(ctx)
    clients = {}
    for c in range(n):
        cctx = ctx if digests is None or c not in digests else make_ctx(n, digests[c])
        clients[c] = layer.client_session(ClientContext(c, 10), cctx, sums[c])
    alive, gone = tuple(range(n)), set()
    for stage in layer.stages:
        gone |= set(drops.get(stage, ()))
        msgs = server.messages(stage, alive)
        replies = {}
        for c, m in msgs.items():
            if c in gone:
                continue
            clients[c] = pickle.loads(pickle.dumps(clients[c]))
            replies[c] = clients[c].respond(stage, pickle.loads(pickle.dumps(m)))
        server.receive(stage, replies)
        alive = tuple(c for c in alive if c in replies)
    return server.result()


def check_sum(result, sums, n_contrib=None):
    agg, contributors = result
    if n_contrib is not None:
        assert len(contributors) == n_contrib
    assert np.array_equal(agg["count"], sum(sums[c]["count"] for c in contributors))
    plain = sum(sums[c]["total"] for c in contributors)
    assert np.max(np.abs(agg["total"] - plain)) <= len(contributors) * 2.0**-25


def test_honest_round_dropouts_at_consistency_check_exact():
    sums = random_sums(10, 1)
    layer = PairwiseMasking(sign_keys=True)  # t = 7: 3 may drop
    result = drive(layer, 10, sums, {"masked_input": [9], "consistency_check": [2, 5]})
    check_sum(result, sums)
    assert result[1] == (0, 1, 2, 3, 4, 5, 6, 7, 8)  # 2 and 5 sent masked input: their b is rebuilt


def test_honest_round_sparse_dropouts_at_every_stage():
    n = 40
    sums = random_sums(n, 2)
    layer = PairwiseMasking(sign_keys=True, graph="sparse", neighbours=10)
    drops = {"advertise": [0], "share": [13], "masked_input": [21], "consistency_check": [30], "unmask": [35]}
    result = drive(layer, n, sums, drops)
    check_sum(result, sums, n_contrib=n - 3)


def test_too_few_signers_aborts_cleanly():
    sums = random_sums(10, 3)
    with pytest.raises(RoundAbortedError, match="signed the survivor list"):
        drive(PairwiseMasking(sign_keys=True), 10, sums, {"masked_input": [9], "consistency_check": [2, 5, 7]})


def test_signature_covers_the_broadcast_digest():
    """Without bind_broadcast the digest is still signed: if too many clients got another
    broadcast, no quorum forms and the round aborts before unmasking."""
    sums = random_sums(6, 4)
    digests = {c: b"E" * 32 for c in (0, 1, 2)}
    with pytest.raises(RoundAbortedError, match="signed the survivor list"):
        drive(PairwiseMasking(sign_keys=True, bind_broadcast=False), 6, sums, digests=digests)


# --------------------------------------------------------------------------- client refusals
def _signed(n=5, threshold=3):
    layer = PairwiseMasking(threshold=threshold, sign_keys=True)
    server, clients, _ = open_round(layer, n, random_sums(n, 5))
    honest_until_masked_input(server, clients)
    return layer, server, clients


def test_refusals_around_the_consistency_check():
    layer, server, clients = _signed()
    everyone = (0, 1, 2, 3, 4)
    # unmask without a consistency check first: out of order
    with pytest.raises(ProtocolRefusal, match="out of order"):
        clients[0].respond("unmask", {"survivors": everyone, "dropped": (), "signatures": {}})
    msgs = server.messages("consistency_check", everyone)
    sigs = {c: clients[c].respond("consistency_check", msgs[c]) for c in everyone}
    with pytest.raises(ProtocolRefusal, match="already answered"):
        clients[0].respond("consistency_check", msgs[0])
    # a different survivor list than the one signed
    with pytest.raises(ProtocolRefusal, match="differs from the one I signed"):
        clients[1].respond("unmask", {"survivors": (0, 1, 2, 3), "dropped": (4,), "signatures": sigs})
    # signatures missing, forged, too few, or over another survivor list
    forged = {c: bytes(64) for c in everyone}
    other = {c: keys.sign(layer.registry.private(c), keys.consistency_message(server.plan.rid, b"D" * 32, (0, 1, 2, 3)))
             for c in everyone}
    for bad in ({}, forged, {c: sigs[c] for c in (2, 3)}, other, {**forged, 0: sigs[0], 1: sigs[1]}):
        with pytest.raises(ProtocolRefusal, match="signed the survivor list"):
            clients[4].respond("unmask", {"survivors": everyone, "dropped": (), "signatures": bad})
    with pytest.raises(ProtocolRefusal, match="no consistency-check signatures"):
        clients[4].respond("unmask", {"survivors": everyone, "dropped": ()})
    # the honest request is answered, from the signed view
    reply = clients[3].respond("unmask", {"survivors": everyone, "dropped": (), "signatures": sigs})
    assert set(reply["b"]) == set(everyone) and reply["s"] == {}


def test_consistency_check_refuses_bad_survivor_lists():
    _, _, clients = _signed()
    with pytest.raises(ProtocolRefusal, match="not listed as a survivor"):
        clients[0].respond("consistency_check", {"survivors": (1, 2, 3, 4)})
    with pytest.raises(ProtocolRefusal, match="minimum"):
        clients[1].respond("consistency_check", {"survivors": (1, 2)})
    with pytest.raises(ProtocolRefusal, match="not sampled"):
        clients[2].respond("consistency_check", {"survivors": (0, 1, 2, 3, 4, 77)})
    with pytest.raises(ProtocolRefusal, match="twice"):
        clients[3].respond("consistency_check", {"survivors": (0, 1, 2, 3, 3)})


def test_unmask_answers_only_from_the_signed_view():
    """The server asks for 4's mask key though 4 is in the signed U3: nothing but b-shares."""
    _, server, clients = _signed()
    everyone = (0, 1, 2, 3, 4)
    sigs = {c: clients[c].respond("consistency_check", {"survivors": everyone}) for c in everyone}
    reply = clients[0].respond("unmask", {"survivors": everyone, "dropped": (), "signatures": sigs})
    assert reply["s"] == {} and set(reply["b"]) == set(everyone)


def test_unmask_releases_mask_keys_of_u2_minus_u3():
    layer, server, clients = _signed()
    u3 = (0, 1, 2, 3)  # 4 sent shares (it is in U2) but, as the server says, no masked input
    sigs = {c: clients[c].respond("consistency_check", {"survivors": u3}) for c in u3}
    reply = clients[0].respond("unmask", {"survivors": u3, "dropped": (), "signatures": sigs})
    assert set(reply["b"]) == set(u3) and set(reply["s"]) == {4}


# --------------------------------------------------------------------------- Federation
from _sum_algorithm import SumAlgorithm, _clients  # noqa: E402


@pytest.mark.parametrize("stage", STAGES)
def test_federation_signed_dropouts_at_every_stage(stage):
    data = _clients(10)
    fed = Federation(
        SumAlgorithm(), data, protection=[PairwiseMasking(sign_keys=True)],
        dropout_rate={0: {stage: [1, 4, 8]}}, random_state=0,
    )
    new = fed.run_round(fed.algorithm.init(10, 3, None), round=0)
    contributors = new.extra["contributors"]
    late = stage in ("consistency_check", "unmask")
    assert contributors == (tuple(range(10)) if late else tuple(c for c in range(10) if c not in (1, 4, 8)))
    assert new.extra["sums"]["count"][0] == sum(len(data[c]) for c in contributors)
    plain = sum(data[c].sum(axis=0) for c in contributors)
    assert np.max(np.abs(new.extra["sums"]["total"] - plain)) <= 10 * 2.0**-24
    rec = fed.transcript[-1]
    assert [s.stage for s in rec.stages] == ["update", *STAGES]
    assert all(isinstance(sig, bytes) and len(sig) == 64 for sig in rec.stage("consistency_check").received.values())


def test_federation_below_quorum_at_consistency_check_state_unchanged():
    fed = Federation(
        SumAlgorithm(), _clients(10), protection=[PairwiseMasking(sign_keys=True)],
        dropout_rate={0: {"masked_input": [9], "consistency_check": [1, 4, 8]}}, random_state=0,
    )
    state = fed.algorithm.init(10, 3, None)
    before = state.centres.copy()
    with pytest.raises(RoundAbortedError, match="consistency_check"):
        fed.run_round(state, round=0)
    assert np.array_equal(state.centres, before) and state.round == 0 and state.extra == {}
    rec = fed.transcript[-1]
    assert rec.aborted and rec.aggregate is None
    assert "unmask" not in [s.stage for s in rec.stages]  # no share was requested, none released
