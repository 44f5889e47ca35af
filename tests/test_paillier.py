"""Tests of the Paillier aggregator (protocols.paillier): packing, authority, federation."""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import phe
import pytest

from protocols.codec import FixedPointCodec
from protocols.paillier import (
    AuthorityRefusal,
    EncryptedContribution,
    EncryptRequest,
    KeyAuthority,
    Paillier,
    PaillierClientSession,
    SlotLayout,
    headroom_bits,
    homomorphic_sum,
    layout_for_key,
    sign_contribution,
)
from securefkm.algorithms.base import Algorithm, AlgorithmState
from securefkm.exceptions import InputError, RoundAbortedError
from securefkm.federation.runtime import Federation
from securefkm.layers import ClientContext, ProtocolRefusal, RoundContext, RunInfo
from securefkm.messages import Broadcast, FieldSpec, Update

CODEC = FixedPointCodec(frac_bits=24)


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def keypair():
    """One small (1024-bit, test-only) phe keypair reused by every test of this module."""
    return phe.generate_paillier_keypair(n_length=1024)


@pytest.fixture
def authority(keypair):
    """A fresh authority (empty enrollment, fresh tickets) over the shared small keypair."""
    return KeyAuthority(*keypair, min_clients=2, allow_weak_key=True)


class SumAlgorithm(Algorithm):
    """Tiny fake algorithm: one integer count field and one float sum field per round.

    The server keeps every round's aggregate and contributors, so tests compare the secure
    sum against the plain sum of the same clients' updates.
    """

    name = "fake-sum"

    def __init__(self, rounds=3, k=3):
        self.rounds, self.n_clusters = rounds, k

    def init(self, n_clients, n_features, rng):
        return AlgorithmState(centres=None, extra={"aggs": [], "contributors": []})

    def configure(self, state, round):
        return Broadcast(action="sum", params={"round": int(state.round)}, sample="all")

    def sum_fields(self, broadcast):
        return (
            FieldSpec("counts", (self.n_clusters,), "count", integer=True),
            FieldSpec("sums", (self.n_clusters, 2), "sum"),
        )

    def client_update(self, X, broadcast, rng, memory=None):
        return Update(sums=self.local_sums(X, broadcast.params["round"]))

    def local_sums(self, X, round):
        labels = (np.arange(len(X)) + round) % self.n_clusters
        counts = np.bincount(labels, minlength=self.n_clusters).astype(float)
        sums = np.zeros((self.n_clusters, 2))
        np.add.at(sums, labels, X[:, :2] - 0.3 * round)  # negative values too
        return {"counts": counts, "sums": sums}

    def aggregate(self, state, agg):
        extra = {
            "aggs": state.extra["aggs"] + [{k: v.copy() for k, v in agg.sums.items()}],
            "contributors": state.extra["contributors"] + [agg.contributors],
        }
        return AlgorithmState(centres=None, round=state.round + 1, extra=extra)

    def converged(self, state):
        return state.round >= self.rounds


def make_clients(n=5, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 3, size=(int(rng.integers(5, 30)), 2)) for _ in range(n)]


def plain_sum(algo, clients, ids, round):
    parts = [algo.local_sums(clients[c], round) for c in ids]
    return {k: np.sum([p[k] for p in parts], axis=0) for k in parts[0]}


def check_secure_equals_plain(algo, clients, state, n_rounds):
    assert len(state.extra["aggs"]) == n_rounds
    for t, (agg, ids) in enumerate(zip(state.extra["aggs"], state.extra["contributors"])):
        ref = plain_sum(algo, clients, ids, t)
        np.testing.assert_array_equal(agg["counts"], ref["counts"])  # integers: bit-exact
        tol = len(ids) * CODEC.resolution / 2
        assert np.max(np.abs(agg["sums"] - ref["sums"])) <= tol


# ---------------------------------------------------------------------- packing
def test_headroom_bits_is_ceil_log2():
    assert [headroom_bits(m) for m in (1, 2, 3, 4, 5, 8, 9, 1024, 1025)] == [
        0,
        1,
        2,
        2,
        3,
        3,
        4,
        10,
        11,
    ]


def test_layout_2048_and_3072_slot_counts():
    lay = SlotLayout(value_bits=32, max_clients=1024, plaintext_bits=2047)
    assert (lay.slot_bits, lay.slots_per_plaintext) == (42, 48)
    assert SlotLayout(32, 1024, 3071).slots_per_plaintext == 73
    assert lay.n_plaintexts(48) == 1 and lay.n_plaintexts(49) == 2


def test_pack_roundtrip_integers_exact_with_negatives():
    rng = np.random.default_rng(1)
    lay = SlotLayout(value_bits=16, max_clients=6, plaintext_bits=200)
    lo, hi = lay.value_range
    vals = [rng.integers(lo, hi + 1, size=37) for _ in range(6)]
    vals[0][:3] = [lo, hi, -1]
    packed = [lay.pack(v) for v in vals]
    assert all(p >= 0 for ps in packed for p in ps)
    assert len(packed[0]) == lay.n_plaintexts(37)
    assert lay.unpack(packed[0], 37, 1) == vals[0].tolist()
    total = [sum(col) for col in zip(*packed)]
    assert lay.unpack(total, 37, 6) == np.sum(vals, axis=0).tolist()


def test_headroom_bound_no_carry_and_one_more_client_refused():
    lay = SlotLayout(value_bits=8, max_clients=8, plaintext_bits=64)  # 11-bit slots
    lo, hi = lay.value_range
    n = lay.slots_per_plaintext
    extreme = np.array([hi if i % 2 == 0 else lo for i in range(n)])
    one = lay.pack(extreme)
    total8 = [sum(one * 1 for _ in range(8)) for one in one]
    assert lay.unpack(total8, n, 8) == (8 * extreme).tolist()  # max_clients maximal slots: no carry
    total9 = [p * 9 for p in one]
    with pytest.raises(InputError, match="max_clients"):
        lay.unpack(total9, n, 9)
    with pytest.raises(InputError, match="max_clients"):
        lay.check_clients(9)
    # the refusal matters: without it 9 maximal slots carry into the neighbour slot
    w, mask = lay.slot_bits, (1 << lay.slot_bits) - 1
    raw = [((total9[0] >> (j * w)) & mask) - 9 * lay.offset for j in range(n)]
    assert raw != (9 * extreme).tolist()


def test_pack_refuses_values_outside_slot():
    lay = SlotLayout(value_bits=8, max_clients=4, plaintext_bits=64)
    with pytest.raises(InputError, match="slot_bits"):
        lay.pack(np.array([1, 128]))
    with pytest.raises(InputError, match="slot_bits"):
        lay.pack(np.array([-129]))


def test_float_roundtrip_through_codec_within_resolution():
    specs = (FieldSpec("c", (4,), "count", integer=True), FieldSpec("s", (3, 2), "sum"))
    rng = np.random.default_rng(2)
    updates = [
        {"c": rng.integers(0, 50, 4).astype(float), "s": rng.normal(0, 40, (3, 2))}
        for _ in range(5)
    ]
    lay = SlotLayout(value_bits=64, max_clients=5, plaintext_bits=1023)
    packed = [lay.pack(CODEC.encode_signed(u, specs, 5)) for u in updates]
    total = [sum(col) for col in zip(*packed)]
    dec = CODEC.decode_signed(np.array(lay.unpack(total, 10, 5), dtype=object), specs)
    np.testing.assert_array_equal(dec["c"], np.sum([u["c"] for u in updates], axis=0))
    assert (
        np.max(np.abs(dec["s"] - np.sum([u["s"] for u in updates], axis=0)))
        <= 5 * CODEC.resolution / 2
    )


def test_encrypted_packed_sum_decrypts_to_exact_sum(keypair):
    pk, sk = keypair
    lay = layout_for_key(pk.n, 32, 4)
    rng = np.random.default_rng(3)
    vals = [rng.integers(-(2**31), 2**31, size=50) for _ in range(4)]
    cts = [[pk.raw_encrypt(p) for p in lay.pack(v)] for v in vals]
    total = homomorphic_sum(pk, cts)
    plain = [sk.raw_decrypt(c) for c in total]
    assert lay.unpack(plain, 50, 4) == np.sum(vals, axis=0).tolist()


# ---------------------------------------------------------------------- federation
def test_secure_sum_equals_plain_sum_through_federation(authority):
    algo, clients = SumAlgorithm(rounds=3), make_clients(5)
    layer = Paillier(min_clients=2, authority=authority)
    fed = Federation(algo, clients, protection=[layer], max_rounds=3, random_state=0)
    state = fed.run()
    check_secure_equals_plain(algo, clients, state, 3)
    assert all(ids == (0, 1, 2, 3, 4) for ids in state.extra["contributors"])
    assert authority.n_decryptions == 3
    assert fed.transcript[0].stages[-1].stage == "encrypted_input"


def test_secure_sum_with_dropouts_leaves_dropped_clients_out(authority):
    algo, clients = SumAlgorithm(rounds=3), make_clients(5, seed=4)
    drops = {0: {"encrypted_input": [2]}, 1: {"update": [0, 4]}, 2: {"encrypted_input": [1, 3]}}
    fed = Federation(
        algo, clients, protection=[Paillier(authority=authority)], dropout_rate=drops, max_rounds=3
    )
    state = fed.run()
    assert state.extra["contributors"] == [(0, 1, 3, 4), (1, 2, 3), (0, 2, 4)]
    check_secure_equals_plain(algo, clients, state, 3)
    assert fed.transcript[0].stage("encrypted_input").dropped == (2,)


def test_too_few_survivors_aborts_without_decrypting(authority):
    algo, clients = SumAlgorithm(rounds=1), make_clients(4)
    layer = Paillier(min_clients=3, authority=authority)
    fed = Federation(
        algo,
        clients,
        protection=[layer],
        dropout_rate={0: {"encrypted_input": [0, 1]}},
        max_rounds=1,
    )
    state = algo.init(4, 2, None)
    with pytest.raises(RoundAbortedError, match="min_clients") as err:
        fed.run_round(state, round=0)
    assert err.value.stage == "encrypted_input"
    assert state.extra == {"aggs": [], "contributors": []} and state.round == 0
    assert authority.n_decryptions == 0
    rec = fed.transcript[0]
    assert rec.aborted and rec.aggregate is None


def test_transcript_holds_only_client_ciphertexts(authority, keypair):
    pk, sk = keypair
    algo, clients = SumAlgorithm(rounds=1), make_clients(4, seed=5)
    layer = Paillier(authority=authority)
    fed = Federation(algo, clients, protection=[layer], max_rounds=1)
    fed.run()
    rec = fed.transcript[0]
    assert rec.plain_sums() == {}
    stage = rec.stage("encrypted_input")
    assert set(stage.received) == {0, 1, 2, 3}
    specs = algo.sum_fields(None)
    for c, msg in stage.received.items():
        assert isinstance(msg, EncryptedContribution) and msg.client_id == c
        assert all(isinstance(x, int) and 0 < x < pk.nsquare for x in msg.ciphertexts)
        own = CODEC.encode_signed(algo.local_sums(clients[c], 0), specs, 4)
        packed = layer.layout.pack(own)
        assert not set(packed) & set(msg.ciphertexts)  # the packed plaintext never travels
        # ... but it is what the ciphertext hides (checked with the test's private key)
        assert [sk.raw_decrypt(x) for x in msg.ciphertexts] == packed
    # the server's requests carry only public material
    for msg in stage.sent.values():
        assert isinstance(msg, EncryptRequest) and msg.bundle.n == pk.n


# ---------------------------------------------------------------------- authority
_CLIENT_STATES: dict = {}


def _round(authority, n_clients=3, min_clients=2, round=0, run=0):
    """Run one round's sessions by hand; return (layer, server, replies, sessions, contexts, ctx).

    Client persistent state (their enrolled identity) is kept per authority across calls,
    as a deployment keeps it on each node.
    """
    states = _CLIENT_STATES.setdefault(id(authority), (authority, {}))[1]
    algo, clients = SumAlgorithm(), make_clients(n_clients, seed=7)
    layer = Paillier(min_clients=min_clients, authority=authority)
    info = RunInfo(algo, n_clients, 2, n_clients, 3, 3)
    layer.setup(info)
    bc = algo.configure(algo.init(n_clients, 2, None), 0)
    ctx = RoundContext(
        run, round, "sum", tuple(range(n_clients)), algo.sum_fields(bc), info, bc.digest()
    )
    contexts = [
        ClientContext(c, len(clients[c]), states.setdefault(c, {})) for c in range(n_clients)
    ]
    sessions = [
        layer.client_session(contexts[c], ctx, algo.local_sums(clients[c], 0))
        for c in range(n_clients)
    ]
    server = layer.server_session(ctx)
    msgs = server.messages("encrypted_input", ctx.sampled)
    replies = {c: sessions[c].respond("encrypted_input", msgs[c]) for c in ctx.sampled}
    return layer, server, replies, sessions, contexts, ctx


def test_authority_refuses_fewer_than_min_clients_and_duplicates(authority):
    _, server, replies, *_ = _round(authority)
    with pytest.raises(AuthorityRefusal, match="min_clients"):
        authority.decrypt_aggregate(server.ticket.nonce, [replies[0]])
    _, server, replies, *_ = _round(authority, round=1)
    with pytest.raises(AuthorityRefusal, match="twice"):
        authority.decrypt_aggregate(server.ticket.nonce, [replies[0], replies[0]])
    assert authority.n_decryptions == 0


def test_authority_refuses_tampered_and_forged_contributions(authority, keypair):
    pk, _ = keypair
    _, server, replies, _, _, ctx = _round(authority)
    nonce = server.ticket.nonce
    c0 = replies[0]
    # tampered: a ciphertext swapped for another valid ciphertext (e.g. of a chosen value)
    tampered = replace(c0, ciphertexts=(pk.raw_encrypt(12345),) + c0.ciphertexts[1:])
    with pytest.raises(AuthorityRefusal, match="signature"):
        authority.decrypt_aggregate(nonce, [tampered, replies[1], replies[2]])
    # the refused ticket is burned: the same round cannot be retried with another subset
    with pytest.raises(AuthorityRefusal, match="ticket"):
        authority.decrypt_aggregate(nonce, [replies[1], replies[2]])
    # forged: a server-made "client" signing with its own key under an enrolled id
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    fake_key = Ed25519PrivateKey.generate().private_bytes_raw()
    fp = authority.public_bundle().fingerprint
    for i, cid in enumerate((1, 99)):  # impersonating an enrolled client; an unknown id
        _, server, replies, *_ = _round(authority, round=1 + i)
        t = server.ticket
        forged = sign_contribution(fake_key, fp, cid, t.nonce, t.digest, replies[0].ciphertexts)
        with pytest.raises(AuthorityRefusal, match="signature" if cid == 1 else "not enrolled"):
            authority.decrypt_aggregate(t.nonce, [replies[0], forged])
    assert authority.n_decryptions == 0


def test_authority_refuses_replay_stale_round_and_wrong_server_sum(authority, keypair):
    pk, _ = keypair
    layer, server, replies, *_ = _round(authority, round=5)
    contribs = [replies[c] for c in sorted(replies)]
    wrong = homomorphic_sum(pk, [c.ciphertexts for c in contribs[:2]])
    with pytest.raises(AuthorityRefusal, match="server's homomorphic sum"):
        authority.decrypt_aggregate(server.ticket.nonce, contribs, wrong)
    layer, server, replies, *_ = _round(authority, round=6)
    server.receive("encrypted_input", replies)
    sums, ids = server.result()
    assert ids == (0, 1, 2) and authority.n_decryptions == 1
    with pytest.raises(AuthorityRefusal, match="ticket"):  # replay of a used ticket
        authority.decrypt_aggregate(server.ticket.nonce, [replies[0], replies[1]])
    with pytest.raises(AuthorityRefusal, match="not after"):  # stale round id
        authority.open_round(0, 6, b"", n_ciphertexts=1, max_clients=3)
    # a contribution signed for round 6's ticket is refused under a new ticket
    t = authority.open_round(
        0, 7, server.ticket.digest, n_ciphertexts=len(replies[0].ciphertexts), max_clients=3
    )
    with pytest.raises(AuthorityRefusal, match="another round ticket"):
        authority.decrypt_aggregate(t.nonce, [replies[0], replies[1]])
    assert authority.n_decryptions == 1


def test_server_drops_invalid_contribution_and_aborts_below_min(authority, keypair):
    pk, _ = keypair
    _, server, replies, *_ = _round(authority, n_clients=2)
    replies[1] = replace(replies[1], ciphertexts=(pk.raw_encrypt(1),) + replies[1].ciphertexts[1:])
    server.receive("encrypted_input", replies)
    assert set(server.rejected) == {1}
    with pytest.raises(RoundAbortedError, match="only 1 client"):
        server.result()
    assert authority.n_decryptions == 0


def test_client_refuses_key_not_signed_by_trusted_authority(authority, keypair):
    _, server, _, sessions, _, _ = _round(authority)
    rogue = KeyAuthority(*keypair, allow_weak_key=True)  # a server-run "authority"
    msg = EncryptRequest(bundle=rogue.public_bundle(), ticket=server.ticket)
    with pytest.raises(ProtocolRefusal, match="trust"):
        sessions[0].respond("encrypted_input", msg)
    good = server.messages("encrypted_input", (0,))[0]
    with pytest.raises(ProtocolRefusal, match="round ticket"):
        sessions[0].respond("encrypted_input", replace(good, ticket=replace(good.ticket, round=9)))


def test_client_session_and_messages_are_picklable(authority):
    _, server, replies, sessions, contexts, _ = _round(authority)
    msg = server.messages("encrypted_input", (0,))[0]
    restored = pickle.loads(pickle.dumps(sessions[0]))
    assert isinstance(restored, PaillierClientSession)
    reply = restored.respond("encrypted_input", pickle.loads(pickle.dumps(msg)))
    assert pickle.loads(pickle.dumps(reply)) == reply
    assert reply.ciphertexts != replies[0].ciphertexts  # fresh randomness per encryption
    pickle.dumps(contexts[0].state)  # the client's persistent identity is plain bytes
    server.receive("encrypted_input", {0: reply, 1: replies[1], 2: replies[2]})
    sums, ids = server.result()
    assert ids == (0, 1, 2)


def test_reenrollment_with_another_key_refused(authority):
    _round(authority)
    with pytest.raises(InputError, match="already enrolled"):
        authority.enroll(0, b"\x01" * 32)


# ---------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"key_size": 1024}, "key_size"),
        ({"key_size": "2048"}, "key_size"),
        ({"min_clients": 0}, "min_clients"),
        ({"slot_bits": 1}, "slot_bits"),
        ({"slot_bits": 65}, "slot_bits"),
        ({"slot_bits": 32.0}, "slot_bits"),
        ({"codec": "fixed"}, "codec"),
        ({"max_clients": 1, "min_clients": 2}, "max_clients"),
        ({"authority": "me"}, "authority"),
    ],
)
def test_bad_arguments_raise_input_error(kwargs, match):
    with pytest.raises(InputError, match=match):
        Paillier(**kwargs)


def test_weak_key_refused_without_test_flag(keypair):
    with pytest.raises(InputError, match="too weak"):
        KeyAuthority(*keypair)
    with pytest.raises(InputError, match="key_size"):
        KeyAuthority.generate(1024)


def test_min_clients_above_federation_size_refused(authority):
    with pytest.raises(InputError, match="min_clients"):
        Federation(
            SumAlgorithm(),
            make_clients(3),
            protection=[Paillier(min_clients=4, authority=authority)],
        )


def test_round_sampling_more_than_max_clients_refused(authority):
    algo = SumAlgorithm(rounds=1)
    fed = Federation(
        algo,
        make_clients(5),
        protection=[Paillier(max_clients=4, authority=authority)],
        max_rounds=1,
    )
    with pytest.raises(RoundAbortedError, match="max_clients"):
        fed.run_round(algo.init(5, 2, None), round=0)


def test_value_beyond_slot_names_the_field(authority, keypair):
    algo, clients = SumAlgorithm(rounds=1), make_clients(3)
    clients[1] = clients[1] * 1000.0
    fed = Federation(
        algo, clients, protection=[Paillier(slot_bits=32, authority=authority)], max_rounds=1
    )
    # client 1's own encoder refuses its update: the round goes on without it, named
    with pytest.warns(UserWarning, match="client 1: .*'sums'.*slot_bits"):
        fed.run()
    record = fed.transcript[0]
    assert list(record.stage("update").refused) == [1] and record.contributors == (0, 2)
    fresh = KeyAuthority(*keypair, min_clients=2, allow_weak_key=True)
    every = Federation(algo, [c * 1000.0 for c in make_clients(3)],
                       protection=[Paillier(slot_bits=32, authority=fresh)], max_rounds=1)
    with pytest.raises(InputError, match="every sampled client refused.*'sums'.*slot_bits"):
        every.run()


def test_slot_bits_default_follows_codec_bound(authority):
    assert Paillier().value_bits == 64
    assert (
        Paillier(codec=FixedPointCodec(frac_bits=24, bound=100.0)).value_bits == 32
    )  # 100*2^24 < 2^31
    assert Paillier(slot_bits=20).value_bits == 20


# ---------------------------------------------------------------------- full-size keys
@pytest.mark.slow
@pytest.mark.parametrize("key_size", [2048, 3072])
def test_full_size_keys_secure_sum(key_size):
    algo, clients = SumAlgorithm(rounds=2), make_clients(4, seed=11)
    layer = Paillier(key_size=key_size, codec=FixedPointCodec(bound=1e4))
    fed = Federation(algo, clients, protection=[layer], max_rounds=2)
    state = fed.run()
    check_secure_equals_plain(algo, clients, state, 2)
    assert layer.authority.key_size == key_size
    assert layer.report()["slots_per_ciphertext"] == (key_size - 1) // layer.layout.slot_bits


def test_flatten_order_matches_codec():  # packing relies on the codec's flatten order
    specs = SumAlgorithm().sum_fields(None)
    sums = SumAlgorithm().local_sums(make_clients(1)[0], 0)
    enc = CODEC.encode_signed(sums, specs, 1)
    flat = np.concatenate([np.asarray(sums[s.name], dtype=np.float64).ravel() for s in specs])
    np.testing.assert_allclose(enc[:3], flat[:3])


def test_messages_pass_the_flower_wire_codec(authority):
    wire = pytest.importorskip("securefkm.flower._wire")
    _, server, replies, *_ = _round(authority)
    msg = server.messages("encrypted_input", (0,))[0]
    assert wire.decode("encrypted_input", "request", wire.encode("encrypted_input", "request", msg)) == msg
    reply = wire.decode("encrypted_input", "reply", wire.encode("encrypted_input", "reply", replies[0]))
    assert reply == replies[0]
