"""The batched paths of pairwise masking equal the per-item ones they replaced: key
derivation for all of a client's peers (pair_keys), share encryption with one nonce read
(encrypt_shares_many), keystream sums (MaskExpander.add_signed), and a client's masked
vector against the protocol's formula computed seed by seed."""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_masking import STAGES, check_sum, drive, make_ctx, open_sessions_together, random_sums

from protocols.masking import PairwiseMasking, keys, prg
from protocols.masking.client import MaskingClient
from securefkm.layers import ClientContext


def test_pair_keys_equal_the_per_peer_derivations():
    c_sk, _, c_key = keys.x25519_keypair(with_key=True)
    s_sk, _, s_key = keys.x25519_keypair(with_key=True)
    rid, digest, me = keys.round_id(3, 7, "update"), os.urandom(32), 50
    peers = [1, 2, 49, 51, 99, 10_000]
    s_pks = [keys.x25519_keypair()[1] for _ in peers]
    c_pks = [keys.x25519_keypair()[1] for _ in peers]
    got = keys.pair_keys(s_key, c_key, rid, me, peers, s_pks, c_pks, digest)
    for seed, send, recv, v, s_pk, c_pk in zip(*got, peers, s_pks, c_pks, strict=True):
        assert seed == keys.kdf(keys.x25519_agree(s_sk, s_pk), keys.mask_seed_info(rid, me, v, digest))
        assert (send, recv) == keys.share_keys(keys.x25519_agree(c_sk, c_pk), rid, me, v)
    bad = list(c_pks)
    bad[3] = bytes(32)  # a small-order point: the shared secret would be all zeros
    with pytest.raises(keys.PeerKeyError) as info:
        keys.pair_keys(s_key, c_key, rid, me, peers, s_pks, bad, digest)
    assert info.value.peer == 51 and isinstance(info.value.failure, keys.CryptoFailure)


def test_encrypt_shares_many_equals_encrypt_shares(monkeypatch):
    rid = keys.round_id(0, 1, "update")
    receivers = [3, 8, 20]
    ks = [os.urandom(32) for _ in receivers]
    payloads = [os.urandom(84) for _ in receivers]
    stream = os.urandom(12 * len(receivers))
    monkeypatch.setattr(keys.os, "urandom", lambda n: stream[:n])
    many = keys.encrypt_shares_many(ks, rid, 5, receivers, payloads)
    one_by_one = []
    for i, (k, r, p) in enumerate(zip(ks, receivers, payloads)):
        monkeypatch.setattr(keys.os, "urandom", lambda n, i=i: stream[12 * i : 12 * i + n])
        one_by_one.append(keys.encrypt_shares(k, rid, 5, r, p))
    monkeypatch.undo()
    assert many == one_by_one
    for k, r, p, blob in zip(ks, receivers, payloads, keys.encrypt_shares_many(ks, rid, 5, receivers, payloads)):
        assert keys.decrypt_shares(k, rid, 5, r, blob) == p
        with pytest.raises(keys.CryptoFailure):
            keys.decrypt_shares(k, rid, 6, r, blob)  # another sender: the associated data differ


def test_decrypt_shares_many_equals_decrypt_shares_and_names_the_sender():
    rid = keys.round_id(0, 1, "update")
    senders, receiver = [3, 8, 20, 31], 5
    ks = [os.urandom(32) for _ in senders]
    payloads = [os.urandom(84) for _ in senders]
    blobs = [keys.encrypt_shares(k, rid, s, receiver, p) for k, s, p in zip(ks, senders, payloads)]
    blobs[2] = bytearray(blobs[2])  # another bytes-like type takes the checked path
    assert keys.decrypt_shares_many(ks, rid, senders, receiver, blobs) == payloads
    assert [keys.decrypt_shares(k, rid, s, receiver, b) for k, s, b in zip(ks, senders, blobs)] == payloads
    for bad, why in ((bytes(blobs[1][:-1]) + b"x", "authentication"), (b"short", "malformed"), (None, "malformed")):
        tampered = list(blobs)
        tampered[1] = bad
        with pytest.raises(keys.PeerKeyError) as info:
            keys.decrypt_shares_many(ks, rid, senders, receiver, tampered)
        assert info.value.peer == 8 and why in str(info.value.failure)
    with pytest.raises(keys.PeerKeyError) as info:  # the receiver is in the associated data
        keys.decrypt_shares_many(ks, rid, senders, receiver + 1, blobs)
    assert info.value.peer == 3


@pytest.mark.parametrize("cipher", prg.CIPHERS)
@pytest.mark.parametrize("length, n_plus, n_minus", [(1, 3, 2), (16, 1, 0), (16, 30, 13), (16, 0, 9000), (40_000, 2, 3), (70_000, 3, 1)])
def test_add_signed_equals_adding_seed_by_seed(cipher, length, n_plus, n_minus):
    """Batched rows, several scratch matrices (9,000 seeds of 128 bytes > BATCH_BYTES) and
    the seed-by-seed fallback for long masks all give the words of repeated add()."""
    rng = np.random.default_rng(length + n_plus)
    plus = [os.urandom(32) for _ in range(n_plus)]
    minus = [os.urandom(32) for _ in range(n_minus)]
    start = rng.integers(0, 2**63, length, dtype=np.uint64) * np.uint64(2)
    ref = start.copy()
    one = prg.MaskExpander(length, cipher)
    for s in plus:
        one.add(ref, s, +1)
    for s in minus:
        one.add(ref, s, -1)
    got = start.copy()
    prg.MaskExpander(length, cipher).add_signed(got, plus, minus)
    assert np.array_equal(got, ref)


def test_client_masked_vector_is_the_protocol_formula():
    """y_u = x_u + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv) mod 2**64, each
    mask expanded on its own: checked for every client of a sparse 150-client round."""
    n = 150
    layer = PairwiseMasking(graph="sparse", neighbours=10)
    sums = random_sums(n, np.random.default_rng(4))
    ctx = make_ctx(n)
    layer.setup(ctx.info)
    layer.before_round(ctx)
    server = layer.server_session(ctx)
    clients = {c: layer.client_session(ClientContext(c, 10), ctx, sums[c]) for c in range(n)}
    alive = tuple(range(n))
    for stage in STAGES[:2]:
        msgs = server.messages(stage, alive)
        server.receive(stage, {c: clients[c].respond(stage, m) for c, m in msgs.items()})
    msgs = server.messages("masked_input", alive)
    for c, m in msgs.items():
        cl = clients[c]
        x, b, seeds = cl.vector.copy(), cl.b_seed, dict(cl.pair_seeds)
        y = cl.respond("masked_input", m)
        ref = x + prg.expand(b, cl.length)
        for v in sorted(int(u) for u in m):
            ref = ref + prg.expand(seeds[v], cl.length) if c < v else ref - prg.expand(seeds[v], cl.length)
        assert np.array_equal(y, ref), c


@pytest.mark.parametrize("graph, n", [("sparse", 60), ("complete", 12)])
def test_sessions_open_with_prepared_sharings_used_once_at_the_share_stage(graph, n):
    """client_sessions makes every client's mask key, self-mask seed and their shares at all
    its possible holders together; the share stage sends those of the holders that
    advertised (client 3 never does) and keeps nothing of them, and the round's sum is
    exact."""
    layer = PairwiseMasking(graph=graph, **({"neighbours": 8} if graph == "sparse" else {}))
    sums = random_sums(n, np.random.default_rng(5))
    server, sessions = open_sessions_together(layer, n, sums)
    assert all(len(s._payloads) == len(s.neigh) + 1 and len(s.b_seed) == 32 for s in sessions)
    alive = tuple(range(n))
    for stage in STAGES:
        msgs = server.messages(stage, alive)
        server.receive(stage, {c: sessions[c].respond(stage, m) for c, m in msgs.items() if c != 3})
        alive = tuple(c for c in alive if c != 3)
        if stage == "share":
            assert not any(hasattr(s, a) for i, s in enumerate(sessions) if i != 3
                           for a in ("_payloads", "_s_key", "_s_pk", "s_sk"))
    agg, contributors = server.result()
    assert 3 not in contributors
    expect = sum(np.asarray(sums[c]["count"]) for c in contributors)
    assert np.array_equal(agg["count"], expect)


def test_batched_sessions_encode_each_client_as_alone():
    n = 30
    layer = PairwiseMasking()
    sums = random_sums(n, np.random.default_rng(6))
    ctx = make_ctx(n)
    layer.setup(ctx.info)
    layer.before_round(ctx)
    many = layer.client_sessions([ClientContext(c, 10) for c in range(n)], ctx, [sums[c] for c in range(n)])
    for c in range(n):
        alone = layer.client_session(ClientContext(c, 10), ctx, sums[c])
        assert alone.vector.dtype == many[c].vector.dtype == np.uint64
        assert np.array_equal(alone.vector, many[c].vector) and alone.vector[-1] == 1
        expect = layer.codec.encode(sums[c], ctx.specs, n)
        assert np.array_equal(many[c].vector[:-1], expect)


def test_auto_prg_is_shake256_up_to_1kib_then_chacha20():
    assert prg.resolve_cipher("auto", 128) == "shake256"  # 1,024 bytes
    assert prg.resolve_cipher("auto", 129) == "chacha20"
    assert prg.resolve_cipher("aes-ctr", 1) == "aes-ctr"
    assert prg.MaskExpander(16).cipher == "shake256" and prg.MaskExpander(1000).cipher == "chacha20"
    with pytest.raises(prg.InputError, match="cipher must be one of"):
        prg.resolve_cipher("rc4", 16)


@pytest.mark.parametrize("length", [16, 128, 129, 5000])
def test_masks_are_the_standard_prg_outputs(length):
    """Known answers: a mask is SHAKE-256 (FIPS 202) of the seed, or the ChaCha20 keystream
    under the seed with a zero counter||nonce, read as little-endian uint64 words; "auto"
    gives the one its rule names."""
    import hashlib

    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    seed = bytes(range(32))
    shake = np.frombuffer(hashlib.shake_256(seed).digest(8 * length), dtype="<u8")
    chacha = np.frombuffer(Cipher(algorithms.ChaCha20(seed, bytes(16)), mode=None).encryptor().update(bytes(8 * length)), dtype="<u8")
    assert np.array_equal(prg.expand(seed, length, "shake256"), shake)
    assert np.array_equal(prg.expand(seed, length, "chacha20"), chacha)
    assert np.array_equal(prg.expand(seed, length), shake if length <= 128 else chacha)
    assert prg.keystream_bytes(seed, 8 * length, "shake256") == shake.tobytes()
    with pytest.raises(prg.InputError, match="32 bytes"):
        prg.expand(seed[:16], length)


def test_a_process_answers_sparse_sessions_in_ring_order_with_the_same_replies():
    """serve() answers a stage in the order of the sessions' locality (the sparse graph's
    ring: neighbours close together, so the pair secrets they share are taken soon after
    they are made) and returns the replies in the order of the messages; the complete
    graph gives no order. The round's sum is exact."""
    from types import SimpleNamespace

    from securefkm.federation.client import serve

    n = 40
    layer = PairwiseMasking(graph="sparse", neighbours=6, threshold=4)
    sums = random_sums(n, np.random.default_rng(8))
    server, sessions = open_sessions_together(layer, n, sums)
    ring = server.plan.graph.order.tolist()
    assert [s.locality for s in sessions] == [ring.index(c) for c in range(n)]
    answered = []

    class Runtime(SimpleNamespace):
        def answer(self, stage, message):
            answered.append(self.session.me)
            return self.session.respond(stage, message)

    clients = {c: Runtime(session=s, policy=None) for c, s in enumerate(sessions)}
    alive = tuple(range(n))
    for stage in STAGES:
        answered.clear()
        msgs = server.messages(stage, alive)
        replies, refused = serve(clients, stage, msgs)
        assert answered == ring and not refused
        assert list(replies) == list(msgs)
        server.receive(stage, replies)
    agg, contributors = server.result()
    assert np.array_equal(agg["count"], sum(np.asarray(sums[c]["count"]) for c in range(n)))
    _, complete = open_sessions_together(PairwiseMasking(graph="complete"), 5, sums)
    assert all(s.locality is None for s in complete)


@pytest.mark.parametrize("graph", ["sparse", "complete"])
def test_share_stage_checks_an_honest_key_list_in_bulk_with_the_item_by_item_peers(graph, monkeypatch):
    """Without signatures an untampered key list passes the bulk check (_listed_peers), which
    gives the peers the item-by-item check gives, and the sum is exact; with signatures every
    key list is checked item by item. (Each tampered list falls back to the item-by-item
    check and is refused: test_share_stage_refuses_a_tampered_key_list.)"""
    n = 12
    sums = random_sums(n, np.random.default_rng(5))
    calls = {"bulk": 0, "items": 0}
    bulk, items = MaskingClient._listed_peers, MaskingClient._checked_peers

    def listed(self, adverts):
        calls["bulk"] += 1
        got = bulk(self, adverts)
        assert got is not None and got == items(self, adverts)
        return got

    def checked(self, adverts):
        calls["items"] += 1
        return items(self, adverts)

    monkeypatch.setattr(MaskingClient, "_listed_peers", listed)
    monkeypatch.setattr(MaskingClient, "_checked_peers", checked)
    shape = {"neighbours": 4, "threshold": 3} if graph == "sparse" else {"threshold": 8}
    result = drive(PairwiseMasking(graph=graph, **shape), n, sums)[0]
    check_sum(result, sums)
    assert result[1] == tuple(range(n)) and calls == {"bulk": n, "items": 0}
    calls.update(bulk=0, items=0)
    check_sum(drive(PairwiseMasking(graph=graph, sign_keys=True, **shape), n, sums)[0], sums)
    assert calls == {"bulk": 0, "items": n}
