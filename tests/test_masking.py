"""PairwiseMasking: secure sum == plain sum under dropouts at every stage, refusals of an
honest client, the model-inconsistency check, signed keys, and the uniformity of what the
server sees. Drives the aggregator directly through its sessions and through Federation."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
from scipy import stats

from protocols.codec import FixedPointCodec
from protocols.masking import PairwiseMasking
from securefkm.exceptions import InputError, RoundAbortedError
from securefkm.federation import Federation, ServerPolicy
from securefkm.layers import ClientContext, ProtocolRefusal, RoundContext, RunInfo
from securefkm.messages import Broadcast, FieldSpec

STAGES = ("advertise", "share", "masked_input", "unmask")
SPECS = (FieldSpec("count", (1,), "count", integer=True), FieldSpec("total", (3,), "sum"))


# --------------------------------------------------------------------------- direct driver
def make_ctx(n, specs=SPECS, digest=b"D" * 32, rnd=0):
    info = RunInfo(algorithm=None, n_clients=n, n_features=3, clients_per_round=n, max_rounds=1, planned_rounds=1)
    return RoundContext(0, rnd, "sum", tuple(range(n)), specs, info, digest)


def random_sums(n, rng, specs=SPECS):
    out = {}
    for c in range(n):
        out[c] = {
            s.name: (rng.integers(0, 1000, s.shape).astype(float) if s.integer else rng.normal(size=s.shape) * 50)
            for s in specs
        }
    return out


def open_sessions(layer, n, sums, specs=SPECS, digests=None):
    ctx = make_ctx(n, specs)
    layer.setup(ctx.info)
    layer.before_round(ctx)
    server = layer.server_session(ctx)
    clients = {}
    for c in range(n):
        cctx = ctx if digests is None else make_ctx(n, specs, digests.get(c, ctx.broadcast_digest))
        clients[c] = layer.client_session(ClientContext(c, 10), cctx, sums[c])
    return server, clients


def open_sessions_together(layer, n, sums):
    """As :func:`open_sessions`, but the clients' sessions opened in one call, as a process
    opens them (``client_sessions``: shares made together, pair secrets shared): a list."""
    ctx = make_ctx(n)
    layer.setup(ctx.info)
    layer.before_round(ctx)
    server = layer.server_session(ctx)
    return server, layer.client_sessions([ClientContext(c, 10) for c in range(n)], ctx, [sums[c] for c in range(n)])


def drive(layer, n, sums, drops=None, specs=SPECS, digests=None, hook=None, persist=None):
    """Run one round; ``drops`` maps a stage to the clients that vanish at it.

    Client sessions are pickled and restored between stages (a deployment restores them
    from persistent state). ``hook(stage, messages)`` may rewrite the server's messages.
    """
    drops = drops or {}
    persist = n <= 100 if persist is None else persist
    server, clients = open_sessions(layer, n, sums, specs, digests)
    alive = tuple(range(n))
    gone: set[int] = set()
    for stage in layer.stages:  # with sign_keys: the consistency check before unmask
        gone |= set(drops.get(stage, ()))
        msgs = server.messages(stage, alive)
        if hook is not None:
            msgs = hook(stage, msgs)
        replies = {}
        for c, m in msgs.items():
            if c in gone:
                continue
            if persist:
                clients[c] = pickle.loads(pickle.dumps(clients[c]))
            replies[c] = clients[c].respond(stage, pickle.loads(pickle.dumps(m)))
        server.receive(stage, replies)
        alive = tuple(c for c in alive if c in replies)
    return server.result(), clients, server


def check_sum(result, sums, specs=SPECS, codec=None):
    agg, contributors = result
    codec = codec or FixedPointCodec()
    for s in specs:
        plain = sum(np.asarray(sums[c][s.name]) for c in contributors)
        if s.integer:
            assert np.array_equal(agg[s.name], plain), s.name
        else:
            assert np.max(np.abs(agg[s.name] - plain)) <= len(contributors) * codec.resolution / 2


def spread(clients, stages=STAGES):
    """Distribute ``clients`` over the stages round-robin."""
    out: dict[str, list[int]] = {}
    for i, c in enumerate(clients):
        out.setdefault(stages[i % len(stages)], []).append(c)
    return out


# --------------------------------------------------------------------------- correctness
@pytest.mark.parametrize("stage", STAGES)
def test_n3_drop_at_each_stage(stage):
    rng = np.random.default_rng(1)
    sums = random_sums(3, rng)
    result = drive(PairwiseMasking(threshold=2), 3, sums, {stage: [1]})[0]
    check_sum(result, sums)
    expected = (0, 2) if stage != "unmask" else (0, 1, 2)
    assert result[1] == expected


def test_no_dropouts_n3_default_threshold():
    sums = random_sums(3, np.random.default_rng(2))
    result = drive(PairwiseMasking(), 3, sums)[0]
    check_sum(result, sums)
    assert result[1] == (0, 1, 2)


def test_n3_default_threshold_tolerates_no_dropout():
    sums = random_sums(3, np.random.default_rng(2))
    with pytest.raises(RoundAbortedError, match="threshold"):
        drive(PairwiseMasking(), 3, sums, {"masked_input": [2]})


LONG_SPECS = (FieldSpec("count", (1,), "count", integer=True), FieldSpec("total", (200,), "sum"))


@pytest.mark.parametrize("cipher", ["auto", "chacha20", "aes-ctr", "shake256"])
@pytest.mark.parametrize("specs", [SPECS, LONG_SPECS], ids=["5 words", "202 words"])
def test_n10_max_dropouts_spread_over_stages(cipher, specs):
    """Every PRG, on a mask short enough for "auto" to pick SHAKE-256 and one long enough
    for ChaCha20: the dropped clients' masks are recomputed by the server exactly."""
    sums = random_sums(10, np.random.default_rng(3), specs)
    layer = PairwiseMasking(cipher=cipher)  # t = 7: 3 may drop
    result = drive(layer, 10, sums, {"advertise": [4], "share": [7], "masked_input": [9]}, specs=specs)[0]
    check_sum(result, sums, specs)
    assert result[1] == (0, 1, 2, 3, 5, 6, 8)


def test_n100_complete_with_n_minus_t_dropouts():
    n = 100
    sums = random_sums(n, np.random.default_rng(4))
    layer = PairwiseMasking()  # t = 67: 33 may drop
    drops = spread(list(range(5, 5 + 33)))
    result = drive(layer, n, sums, drops)[0]
    check_sum(result, sums)
    assert len(result[1]) == n - 33 + len(drops["unmask"])


def test_sparse_n1000():
    n = 1000
    sums = random_sums(n, np.random.default_rng(5))
    layer = PairwiseMasking(graph="sparse", neighbours=16)
    drops = spread(list(range(0, 1000, 125)))  # 8 clients, 2 per stage
    result, clients, server = drive(layer, n, sums, drops)
    check_sum(result, sums)
    assert server.plan.graph.kind == "sparse" and server.plan.graph.degree == 16
    assert len(result[1]) == n - 6


@pytest.mark.slow
def test_sparse_n1000_default_degree():
    n = 1000
    sums = random_sums(n, np.random.default_rng(6))
    result = drive(PairwiseMasking(graph="sparse"), n, sums, spread(list(range(0, 1000, 50))))[0]
    check_sum(result, sums)


@pytest.mark.slow
def test_complete_n1000():
    n = 1000
    sums = random_sums(n, np.random.default_rng(7))
    result = drive(PairwiseMasking(), n, sums, spread(list(range(0, 1000, 10))))[0]
    check_sum(result, sums)


def test_sparse_graph_is_regular_and_public():
    layer = PairwiseMasking(graph="sparse", neighbours=6)
    ctx = make_ctx(50)
    g1, g2 = layer.plan(ctx).graph, layer.plan(ctx).graph
    assert np.array_equal(g1.order, g2.order)  # every party derives the same graph
    degrees = [len(g1.neighbours(u)) for u in range(50)]
    assert set(degrees) == {6}
    assert all(g1.is_neighbour(v, u) for u in range(50) for v in g1.neighbours(u).tolist())
    assert not np.array_equal(layer.plan(make_ctx(50, rnd=1)).graph.order, g1.order)


# --------------------------------------------------------------------------- thresholds
def test_one_fewer_survivor_aborts_direct():
    sums = random_sums(10, np.random.default_rng(8))
    with pytest.raises(RoundAbortedError, match="fewer than the threshold"):
        drive(PairwiseMasking(), 10, sums, {"advertise": [1], "share": [2], "masked_input": [3, 4]})
    with pytest.raises(RoundAbortedError, match="b-shares"):
        drive(PairwiseMasking(), 10, sums, {"share": [2], "masked_input": [3], "unmask": [5, 6]})


# --------------------------------------------------------------------------- refusals
def _after_masked_input(n=5, **kw):
    sums = random_sums(n, np.random.default_rng(9))
    layer = PairwiseMasking(**kw)
    server, clients = open_sessions(layer, n, sums)
    alive = tuple(range(n))
    for stage in STAGES[:3]:
        msgs = server.messages(stage, alive)
        replies = {c: clients[c].respond(stage, m) for c, m in msgs.items()}
        server.receive(stage, replies)
    return clients


def test_refuses_peer_listed_as_survivor_and_dropped():
    clients = _after_masked_input()
    with pytest.raises(ProtocolRefusal, match="both survivor and dropped"):
        clients[0].respond("unmask", {"survivors": (0, 1, 2, 3, 4), "dropped": (3,)})


def test_refuses_second_share_type_of_a_peer():
    clients = _after_masked_input(threshold=3)
    first = clients[0].respond("unmask", {"survivors": (0, 1, 2, 3), "dropped": (4,)})
    assert set(first["b"]) == {0, 1, 2, 3} and set(first["s"]) == {4}
    # the server now claims 3 dropped (to get s_3 on top of b_3): refused
    with pytest.raises(ProtocolRefusal, match="already answered"):
        clients[0].respond("unmask", {"survivors": (0, 1, 2, 4), "dropped": (3,)})


def test_refuses_too_few_survivors_and_self_not_survivor():
    clients = _after_masked_input()  # t = 4 of 5
    with pytest.raises(ProtocolRefusal, match="minimum"):
        clients[0].respond("unmask", {"survivors": (0, 1, 2), "dropped": (3, 4)})
    with pytest.raises(ProtocolRefusal, match="not listed as a survivor"):
        clients[1].respond("unmask", {"survivors": (0, 2, 3, 4), "dropped": (1,)})


def test_survivor_set_memo_is_by_identity_of_int_tuples_only():
    from protocols.masking.client import _id_set

    t = tuple(range(50))
    assert _id_set(t) is _id_set(t) and _id_set(t) == frozenset(range(50))
    assert _id_set(tuple(range(50))) == _id_set(t)  # an equal fresh tuple: same set
    lst = list(range(5))
    first = _id_set(lst)
    lst.append(99)  # a mutable list is never memoised
    assert 99 in _id_set(lst) and 99 not in first
    mixed = (np.int64(1), 2)
    assert _id_set(mixed) == frozenset({1, 2}) and _id_set(mixed) is not _id_set(mixed)


def test_unmask_answers_and_refusals_same_with_a_shared_survivor_tuple():
    """In process every client gets the same survivor tuple object (read once, memoised);
    the answers and refusals are those of per-client copies, as from a network."""
    shared = {"survivors": (0, 1, 2, 3), "dropped": (4,)}
    a, b = _after_masked_input(threshold=3), _after_masked_input(threshold=3)
    for c in range(4):
        got = a[c].respond("unmask", shared)
        want = b[c].respond("unmask", {"survivors": list(shared["survivors"]), "dropped": list(shared["dropped"])})
        assert got.keys() == want.keys() and {k: set(v) for k, v in got.items()} == {k: set(v) for k, v in want.items()}
        assert set(got["b"]) == {0, 1, 2, 3} and set(got["s"]) == {4}
    clients = _after_masked_input()  # t = 4 of 5
    dup = {"survivors": (0, 1, 1, 2, 2), "dropped": (3, 4)}  # 3 distinct survivors: below the minimum
    for c in (0, 1):
        with pytest.raises(ProtocolRefusal, match="minimum"):
            clients[c].respond("unmask", dup)
    clients = _after_masked_input(threshold=3)
    with pytest.raises(ProtocolRefusal, match="not listed as a survivor"):
        clients[4].respond("unmask", shared)


def test_refuses_too_few_surviving_holders_in_the_sparse_graph():
    """The holder count is taken over the client's neighbourhood: a survivor list that is
    long enough overall but keeps fewer than t of its holders is refused."""
    n = 200
    sums = random_sums(n, np.random.default_rng(12))
    layer = PairwiseMasking(graph="sparse", neighbours=8, threshold=5)
    server, clients = open_sessions(layer, n, sums)
    alive = tuple(range(n))
    for stage in STAGES[:3]:
        msgs = server.messages(stage, alive)
        server.receive(stage, {c: clients[c].respond(stage, m) for c, m in msgs.items()})
    me = 0
    neigh = set(server.plan.graph.neighbours(me).tolist())
    keep = sorted(neigh)[:3]  # me + 3 holders = 4 < t = 5
    survivors = tuple(c for c in range(n) if c == me or c not in neigh or c in keep)
    dropped = tuple(sorted(neigh - set(keep)))
    with pytest.raises(ProtocolRefusal, match="4 of my neighbourhood survived"):
        clients[me].respond("unmask", {"survivors": survivors, "dropped": dropped})
    survivors = tuple(sorted(set(survivors) | {sorted(neigh - set(keep))[0]}))
    dropped = dropped[1:] if dropped[0] in survivors else dropped
    out = clients[me].respond("unmask", {"survivors": survivors, "dropped": tuple(sorted(neigh - set(survivors)))})
    assert len(out["b"]) == 5 and len(out["s"]) == 4


def test_refuses_replayed_stage():
    sums = random_sums(3, np.random.default_rng(10))
    _, clients = open_sessions(PairwiseMasking(), 3, sums)
    clients[0].respond("advertise", {})
    with pytest.raises(ProtocolRefusal, match="already answered"):
        clients[0].respond("advertise", {})


def test_never_reveals_both_shares_of_a_client():
    """A second unmask request that names a survivor of the first as dropped (to get its
    mask key after its self-mask seed) is refused: the stage is answered once."""
    clients = _after_masked_input(threshold=3)
    first = clients[0].respond("unmask", {"survivors": (0, 1, 2, 3), "dropped": (4,)})
    assert set(first["b"]) == {0, 1, 2, 3} and set(first["s"]) == {4}
    with pytest.raises(ProtocolRefusal, match="already answered"):
        clients[0].respond("unmask", {"survivors": (0, 1, 2, 4), "dropped": (3,)})


# --------------------------------------------------------------------------- signatures
def test_signed_keys_reject_tampered_key():
    sums = random_sums(4, np.random.default_rng(11))
    layer = PairwiseMasking(sign_keys=True, threshold=3)
    result = drive(layer, 4, sums)[0]
    check_sum(result, sums)

    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    evil = X25519PrivateKey.generate().public_key().public_bytes_raw()

    def tamper(stage, msgs):
        if stage != "share":
            return msgs
        out = {}
        for c, m in msgs.items():
            ks = {v: dict(adv) for v, adv in m["keys"].items()}
            if c != 2:
                ks[2]["s_pk"] = evil  # man in the middle on client 2's mask key
            out[c] = {"keys": ks}
        return out

    with pytest.raises(ProtocolRefusal, match="signature"):
        drive(PairwiseMasking(sign_keys=True, threshold=3), 4, sums, hook=tamper)

    def list_twice(stage, msgs):  # client 2 listed again under another key type, other keys
        if stage != "share":
            return msgs
        fresh = {"c_pk": X25519PrivateKey.generate().public_key().public_bytes_raw(), "s_pk": evil}
        return {c: {"keys": {**m["keys"], "2": fresh}} if c == 0 else m for c, m in msgs.items()}

    with pytest.raises(ProtocolRefusal, match="has the key '2', which is not a client id"):
        drive(PairwiseMasking(threshold=3), 4, sums, hook=list_twice)
    # without signatures the substitution goes unnoticed at the share stage
    drive_unsigned = PairwiseMasking(threshold=3)
    with pytest.raises(RoundAbortedError, match="check slot"):
        drive(drive_unsigned, 4, sums, hook=tamper)


@pytest.mark.parametrize("attack, why", [
    ("flip", None),
    ("swap", None),  # client 3's blob relabelled as client 1's
    ("short", None),
    ("stranger", "not one of my key-sharing neighbours"),
    ("twice", "has the key '1', which is not a client id"),
])
def test_masked_input_refuses_tampered_or_misrouted_share_ciphertexts(attack, why):
    """The server relays the share ciphertexts; client 0 refuses a request that names a
    stranger or a non-id; a ciphertext it cannot authenticate as its neighbour's, sent to it
    (``why`` None), is not a refusal: client 0 answers without that neighbour and names it
    (``failed_shares``), and the server leaves client 1 out of the round, blamed."""
    sums = random_sums(5, np.random.default_rng(13))

    def tamper(stage, msgs):
        if stage != "masked_input":
            return msgs
        m = dict(msgs[0])
        if attack == "flip":
            m[1] = m[1][:-1] + bytes([m[1][-1] ^ 1])
        elif attack == "swap":
            m[1] = m[3]
        elif attack == "short":
            m[1] = m[1][:20]
        elif attack == "stranger":
            m[99] = m.pop(1)
        else:
            m["1"] = m[1]  # client 1 listed twice, under two key types
        return {**msgs, 0: m}

    if why is None:
        result, _, server = drive(PairwiseMasking(threshold=3), 5, sums, hook=tamper)
        assert result[1] == (0, 2, 3, 4)
        check_sum(result, sums)
        assert list(server.faults) == [1] and "its share ciphertext to client 0 failed authentication" in server.faults[1]
        return
    with pytest.raises(ProtocolRefusal, match=why):
        drive(PairwiseMasking(threshold=3), 5, sums, hook=tamper)


def test_masked_input_refuses_authentic_shares_of_the_wrong_size(monkeypatch):
    """A malicious neighbour (client 1) encrypts a short payload to client 0 under their
    true key: it authenticates, client 0 answers without client 1 and names it, and the
    server leaves client 1 out of the round."""
    from protocols.masking import keys

    real = keys.encrypt_shares_many

    def short_to_0(ks, rid, sender, receivers, payloads):
        if sender == 1:
            payloads = [p[:10] if r == 0 else p for r, p in zip(receivers, payloads)]
        return real(ks, rid, sender, receivers, payloads)

    monkeypatch.setattr(keys, "encrypt_shares_many", short_to_0)
    sums = random_sums(5, np.random.default_rng(13))
    result, _, server = drive(PairwiseMasking(threshold=3), 5, sums)
    assert result[1] == (0, 2, 3, 4) and list(server.faults) == [1]
    check_sum(result, sums)


# --------------------------------------------------------------------------- broadcast binding
def test_inconsistent_digest_fails_only_when_bound():
    sums = random_sums(6, np.random.default_rng(12))
    digests = {2: b"E" * 32}
    with pytest.raises(RoundAbortedError, match="inconsistent broadcasts"):
        drive(PairwiseMasking(), 6, sums, digests=digests)
    result = drive(PairwiseMasking(bind_broadcast=False), 6, sums, digests=digests)[0]
    check_sum(result, sums)


# --------------------------------------------------------------------------- transcript view
def test_masked_vector_looks_uniform_plain_encoding_does_not():
    specs = (FieldSpec("count", (64,), "count", integer=True), FieldSpec("total", (4000,), "sum"))
    rng = np.random.default_rng(13)
    sums = {c: {"count": rng.integers(0, 30, 64).astype(float), "total": rng.normal(size=4000)} for c in range(3)}
    layer = PairwiseMasking(threshold=2)
    server, clients = open_sessions(layer, 3, sums, specs)
    alive = (0, 1, 2)
    for stage in STAGES[:3]:
        msgs = server.messages(stage, alive)
        replies = {c: clients[c].respond(stage, m) for c, m in msgs.items()}
        server.receive(stage, replies)
    masked = replies[0]
    plain = layer.codec.encode(sums[0], specs, 3)

    def byte_pvalue(words):
        hist = np.bincount(np.ascontiguousarray(words).view(np.uint8), minlength=256)
        return stats.chisquare(hist).pvalue

    def top_bits_pvalue(words):
        top = (words >> np.uint64(56)).astype(np.int64)
        return stats.chisquare(np.bincount(top, minlength=256)).pvalue

    assert byte_pvalue(masked) > 1e-4 and top_bits_pvalue(masked) > 1e-4
    assert byte_pvalue(plain) < 1e-12 and top_bits_pvalue(plain) < 1e-12


# --------------------------------------------------------------------------- Federation
from _sum_algorithm import SumAlgorithm, _clients  # noqa: E402


@pytest.mark.parametrize("stage", STAGES)
def test_federation_n10_dropouts_at_stage(stage):
    data = _clients(10)
    fed = Federation(SumAlgorithm(), data, protection=[PairwiseMasking()], dropout_rate={0: {stage: [1, 4, 8]}}, random_state=0)
    state = fed.algorithm.init(10, 3, None)
    new = fed.run_round(state, round=0)
    contributors = new.extra["contributors"]
    expected = tuple(range(10)) if stage == "unmask" else tuple(c for c in range(10) if c not in (1, 4, 8))
    assert contributors == expected
    assert new.extra["sums"]["count"][0] == sum(len(data[c]) for c in contributors)
    plain = sum(data[c].sum(axis=0) for c in contributors)
    assert np.max(np.abs(new.extra["sums"]["total"] - plain)) <= 10 * 2.0**-24
    rec = fed.transcript[-1]
    masked = rec.stage("masked_input").received
    assert all(isinstance(v, np.ndarray) and v.dtype == np.uint64 for v in masked.values())
    assert rec.plain_sums() == {}


def test_federation_one_fewer_survivor_aborts_state_unchanged():
    data = _clients(10)
    fed = Federation(
        SumAlgorithm(), data, protection=[PairwiseMasking()],
        dropout_rate={0: {"advertise": [1], "share": [4], "masked_input": [8], "unmask": [9]}}, random_state=0,
    )
    state = fed.algorithm.init(10, 3, None)
    before = state.centres.copy()
    with pytest.raises(RoundAbortedError, match="threshold"):
        fed.run_round(state, round=0)
    assert np.array_equal(state.centres, before) and state.round == 0 and state.extra == {}
    rec = fed.transcript[-1]
    assert rec.aborted and rec.aggregate is None


class SplitViewPolicy(ServerPolicy):
    """A malicious server that sends client 0 different centres (model inconsistency)."""

    def plan(self, state, round, broadcast, sampled, n_clients):
        per = {c: broadcast for c in sampled}
        per[0] = Broadcast(broadcast.action, centres=broadcast.centres + 1.0, params=broadcast.params)
        return sampled, per


@pytest.mark.parametrize("bind", [True, False])
def test_federation_model_inconsistency_attack(bind):
    data = _clients(6)
    fed = Federation(
        SumAlgorithm(), data, protection=[PairwiseMasking(bind_broadcast=bind)],
        server_policy=SplitViewPolicy(), random_state=0,
    )
    state = fed.algorithm.init(6, 3, None)
    if bind:
        with pytest.raises(RoundAbortedError, match="inconsistent broadcasts"):
            fed.run_round(state, round=0)
        assert state.extra == {}
    else:
        new = fed.run_round(state, round=0)
        assert new.extra["sums"]["count"][0] == sum(len(x) for x in data)


def test_federation_codec_overflow_precheck():
    fed = Federation(
        SumAlgorithm(), _clients(4),
        protection=[PairwiseMasking(codec=FixedPointCodec(frac_bits=50, bound=1e6))], random_state=0,
    )
    with pytest.raises(InputError, match="frac_bits"):
        fed.run_round(fed.algorithm.init(4, 3, None), round=0)


def test_federation_out_of_bound_value_names_field():
    fed = Federation(
        SumAlgorithm(), _clients(4),
        protection=[PairwiseMasking(threshold=3, codec=FixedPointCodec(bound=1.0))], random_state=0,
    )
    with pytest.raises(InputError, match="'count'|'total'"):
        fed.run_round(fed.algorithm.init(4, 3, None), round=0)


def test_constructor_errors():
    with pytest.raises(InputError, match="graph"):
        PairwiseMasking(graph="ring")
    with pytest.raises(InputError, match="threshold"):
        PairwiseMasking(threshold=1)
    with pytest.raises(InputError, match="threshold"):
        PairwiseMasking(threshold=1.5)
    with pytest.raises(InputError, match="neighbours"):
        PairwiseMasking(neighbours=4)
    with pytest.raises(InputError, match="cipher"):
        PairwiseMasking(cipher="rc4")


@pytest.mark.parametrize("length", [1, 31, 32, 33, 64, 100, 256])
def test_kdf_is_sp800_56c_one_step_sha256(length):
    """The key derivation is NIST SP 800-56C's one-step KDF over SHA-256: the bytes of
    ``cryptography``'s ConcatKDFHash, for every length and for other secrets and infos."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.concatkdf import ConcatKDFHash

    from protocols.masking.keys import kdf

    rng = np.random.default_rng(length)
    for secret_len, info_len in ((32, 0), (32, 90), (22, 7), (1, 300)):
        secret, info = rng.bytes(secret_len), rng.bytes(info_len)
        want = ConcatKDFHash(algorithm=hashes.SHA256(), length=length, otherinfo=info).derive(secret)
        assert kdf(secret, info, length) == want
    assert kdf(b"\x0b" * 32, b"x", length) != kdf(b"\x0b" * 32, b"y", length)
    assert kdf(b"\x0b" * 32, b"x", 64)[:32] == kdf(b"\x0b" * 32, b"x", 32)


@pytest.mark.parametrize("length", [0, 257])
def test_kdf_refuses_lengths_it_cannot_give(length):
    from protocols.masking.keys import kdf

    with pytest.raises(ValueError, match="kdf length"):
        kdf(b"s" * 32, b"info", length)


# --------------------------------------------------------------------------- pair secrets in process
def _batch_after_advertise(n, layer):
    """Sessions opened together (one PairSecrets), past the advertise stage, with the
    server's share requests."""
    server, sessions = open_sessions_together(layer, n, random_sums(n, np.random.default_rng(21)))
    server.receive("advertise", {c: s.respond("advertise", m) for (c, m), s in
                                 zip(server.messages("advertise", tuple(range(n))).items(), sessions)})
    return sessions, server.messages("share", tuple(range(n)))


def _crossed(msgs, a, b, via_a, via_b):
    """The server hands ``a`` client ``b``'s mask key in place of its neighbour ``via_a``'s, and
    ``b`` client ``a``'s in place of ``via_b``'s: ``a`` and ``b`` then agree a seed although
    they are not neighbours (no signatures, so neither notices)."""
    out = {c: {"keys": {v: dict(adv) for v, adv in m["keys"].items()}} for c, m in msgs.items()}
    out[a]["keys"][via_a]["s_pk"] = msgs[b]["keys"][b]["s_pk"]
    out[b]["keys"][via_b]["s_pk"] = msgs[a]["keys"][a]["s_pk"]
    return out


@pytest.mark.parametrize("tamper", [False, True])
def test_sessions_opened_together_agree_each_pair_once_with_the_same_bytes(tamper):
    """Sessions opened together compute each pairwise X25519 secret once between them; every
    seed and key is byte for byte what each session computes alone (a pickled copy, which
    drops the shared object) -- also when the server substitutes keys so that two
    non-neighbours agree a seed."""
    n = 30
    layer = PairwiseMasking(graph="sparse", neighbours=6, threshold=4)
    sessions, msgs = _batch_after_advertise(n, layer)
    if tamper:
        a = 0
        b = next(c for c in range(n) if c not in sessions[a].neigh and c != a)
        msgs = _crossed(msgs, a, b, min(sessions[a].neigh), min(sessions[b].neigh))
    alone = [pickle.loads(pickle.dumps(s)) for s in sessions]
    assert all("_pairs" not in s.__dict__ for s in alone) and all("_pairs" in s.__dict__ for s in sessions)
    from benchmarks.speed import _count_crypto

    def share(group):
        return lambda: [s.respond("share", msgs[s.me]) for s in group]

    # each client its own: two agreements per neighbour
    assert _count_crypto(share(alone))["agree"] == 2 * 6 * n
    # one agreement per pair and key type; crossed: the pairs a-via_a and b-via_b no longer
    # match (a holds via_a's c_pk with b's s_pk), so each side computes both of its own
    # secrets: two pairs of four agreements instead of two
    assert _count_crypto(share(sessions))["agree"] == 6 * n + (4 if tamper else 0)
    for s, t in zip(sessions, alone):
        assert s.pair_seeds == t.pair_seeds and s.recv_keys == t.recv_keys, s.me
        assert "_pairs" not in s.__dict__  # released after the share stage


def test_pair_secrets_keep_only_what_a_session_of_theirs_will_take():
    """A secret is kept for a peer key advertised by one of the object's sessions and
    removed when that peer takes it: after every session shared, nothing is left; a
    session that never reaches the share stage leaves exactly its pairs' secrets."""
    n = 12
    layer = PairwiseMasking(graph="sparse", neighbours=4, threshold=3)
    sessions, msgs = _batch_after_advertise(n, layer)
    pairs = sessions[0]._pairs
    for s in sessions[1:]:
        s.respond("share", msgs[s.me])
    assert len(pairs._open) == len(sessions[0].neigh)  # client 0's neighbours' secrets await it
    sessions[0].respond("share", msgs[0])
    assert pairs._open == {}
    from protocols.masking.keys import PairSecrets, load_x25519, x25519_agree, x25519_keypair

    outsider = PairSecrets()
    (c_sk, c_pk), (s_sk, s_pk) = x25519_keypair(), x25519_keypair()
    peer_c, peer_s = x25519_keypair()[1], x25519_keypair()[1]
    got = outsider.agree(load_x25519(s_sk), load_x25519(c_sk), (c_pk, s_pk), peer_c, peer_s)
    assert got == (x25519_agree(s_sk, peer_s), x25519_agree(c_sk, peer_c))
    assert outsider._open == {}  # the peer is none of its sessions: nobody would take it


@pytest.mark.parametrize("attack, why", [
    ("stranger", "names client {x}, who is not my neighbour"),
    ("short_key", "malformed advertised keys for client {a}"),
    ("missing_key", "malformed advertised keys for client {a}"),
    ("not_a_dict", "malformed advertised keys for client {a}"),
    ("replayed_key", r"not all distinct \(client {b}\): a replayed key"),
    ("same_key_twice", r"not all distinct \(client {a}\)"),
    ("my_keys_changed", "does not contain my own advertised keys unchanged"),
    ("id_as_text", "has the key '{a}', which is not a client id"),
])
def test_share_stage_refuses_a_tampered_key_list(attack, why):
    """The server forwards the neighbours' advertised keys; client 0 refuses a list that
    names a stranger, carries malformed or repeated keys, or changes its own."""
    n = 12
    sums = random_sums(n, np.random.default_rng(17))
    layer = PairwiseMasking(graph="sparse", neighbours=4, threshold=3)
    ids = {}

    def tamper(stage, msgs):
        if stage != "share":
            return msgs
        ks = {v: dict(adv) for v, adv in msgs[0]["keys"].items()}
        order = list(ks)  # client 0's neighbourhood, in the server's order
        a, b = [v for v in order if v != 0][:2]
        x = next(c for c in range(n) if c not in ks)
        ids.update(a=a, b=b, x=x)
        if attack == "stranger":
            ks[x] = dict(msgs[x]["keys"][x])
        elif attack == "short_key":
            ks[a]["c_pk"] = ks[a]["c_pk"][:31]
        elif attack == "missing_key":
            del ks[a]["s_pk"]
        elif attack == "not_a_dict":
            ks[a] = [ks[a]["c_pk"], ks[a]["s_pk"]]
        elif attack == "replayed_key":
            ks[b]["c_pk"] = ks[a]["c_pk"]
        elif attack == "same_key_twice":
            ks[a]["s_pk"] = ks[a]["c_pk"]
        elif attack == "my_keys_changed":
            ks[0]["s_pk"] = ks[a]["s_pk"]
        else:
            ks[str(a)] = ks[a]
        return {**msgs, 0: {"keys": ks}}

    with pytest.raises(ProtocolRefusal) as refused:
        drive(layer, n, sums, hook=tamper)
    assert re.search(why.format(**ids), str(refused.value)), str(refused.value)
