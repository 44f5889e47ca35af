"""Pairwise masking names the client at fault: malformed replies, replayed keys and masked
inputs, garbage share ciphertexts, wrong shares revealed (verifiable shares), and an
unattributed check failure for a corrupted masked input."""

from __future__ import annotations

import numpy as np
import pytest

from protocols.masking import PairwiseMasking
from securefkm.exceptions import RoundAbortedError
from tests.test_masking import check_sum, make_ctx, open_sessions, random_sums

N = 7


def run(layer, sums, tamper=None, rnd=0, n=N):
    """One round driven stage by stage; ``tamper(stage, replies)`` rewrites the replies."""
    ctx = make_ctx(n, rnd=rnd)
    layer.setup(ctx.info)
    server = layer.server_session(ctx)
    from securefkm.layers import ClientContext
    clients = {c: layer.client_session(ClientContext(c, 10), ctx, sums[c]) for c in range(n)}
    alive = tuple(range(n))
    for stage in layer.stages:
        msgs = server.messages(stage, alive)
        replies = {c: clients[c].respond(stage, m) for c, m in msgs.items()}
        if tamper is not None:
            replies = tamper(stage, replies)
        server.receive(stage, replies)
        alive = tuple(c for c in alive if c in replies)
    return server, server.result()


@pytest.mark.parametrize("stage, bad, field", [
    ("advertise", lambda r: "abc", "not the advertised keys"),
    ("advertise", lambda r: {**r, "c_pk": None}, "field 'c_pk'"),
    ("advertise", lambda r: {**r, "s_pk": bytes(32)}, "small order"),
    ("advertise", lambda r: {**r, "commit": b"x"}, "field 'commit'"),
    ("share", lambda r: {"abc": b"x", **r}, "the key 'abc'"),
    ("share", lambda r: {None: b"x", **r}, "the key None"),
    ("share", lambda r: dict(list(r.items())[1:]), "no ciphertext for neighbour"),
    ("share", lambda r: {k: v[:5] for k, v in r.items()}, "is not"),
    ("masked_input", lambda r: r.astype(np.int64), "field 'masked'"),
    ("masked_input", lambda r: r[:-1], "field 'masked'"),
    ("masked_input", lambda r: {"masked": r}, "neither"),
    ("unmask", lambda r: {"b": {"abc": b"x"}, "s": {}}, "the key 'abc'"),
    ("unmask", lambda r: None, "not {'b'"),
])
def test_malformed_reply_is_the_senders_fault_and_the_round_completes(stage, bad, field):
    sums = random_sums(N, np.random.default_rng(1))

    def tamper(s, replies):
        if s == stage:
            replies = {**replies, 2: bad(replies[2])}
        return replies

    server, result = run(PairwiseMasking(threshold=4), sums, tamper)
    assert list(server.faults) == [2] and f"stage '{stage}'" in server.faults[2] and field in server.faults[2]
    if stage == "unmask":
        assert result[1] == tuple(range(N))  # its shares unused; the others suffice
    else:
        assert result[1] == tuple(c for c in range(N) if c != 2)
    check_sum(result, sums)


def test_replayed_masked_input_and_copied_keys_name_the_replayer():
    layer = PairwiseMasking(threshold=4)
    sums = random_sums(N, np.random.default_rng(2))
    kept = {}

    def keep(stage, replies):
        kept[stage] = replies[4]
        return replies

    run(layer, sums, keep, rnd=0)
    server, result = run(layer, sums, lambda s, r: {**r, 4: kept["masked_input"]} if s == "masked_input" else r, rnd=1)
    assert list(server.faults) == [4] and "replayed input" in server.faults[4]
    assert result[1] == (0, 1, 2, 3, 5, 6)
    check_sum(result, sums)
    server, result = run(layer, sums, lambda s, r: {**r, 1: kept["advertise"]} if s == "advertise" else r, rnd=2)
    assert list(server.faults) == [1] and "earlier round" in server.faults[1]  # not client 4, the victim
    check_sum(result, sums)


def test_one_key_two_clients_in_a_round_excludes_both_without_a_fault():
    sums = random_sums(N, np.random.default_rng(3))
    server, result = run(PairwiseMasking(threshold=4), sums,
                         lambda s, r: {**r, 5: dict(r[0])} if s == "advertise" else r)
    assert server.faults == {} and sorted(server.unattributed) == [0, 5]
    assert result[1] == (1, 2, 3, 4, 6)
    check_sum(result, sums)


def test_garbage_share_ciphertext_names_its_sender_not_the_receiver():
    sums = random_sums(N, np.random.default_rng(4))

    def garble(stage, replies):
        if stage == "share":
            cts = dict(replies[1])
            cts[3] = cts[3][:-1] + bytes([cts[3][-1] ^ 1])
            replies = {**replies, 1: cts}
        return replies

    server, result = run(PairwiseMasking(threshold=4), sums, garble)
    assert list(server.faults) == [1]
    assert "its share ciphertext to client 3 failed authentication (client 1, or the server" in server.faults[1]
    assert result[1] == (0, 2, 3, 4, 5, 6)
    check_sum(result, sums)


def test_wrong_share_revealed_is_named_and_the_others_reconstruct():
    sums = random_sums(N, np.random.default_rng(5))

    def lie(stage, replies):
        if stage == "unmask":
            b = {o: bytes([sh[0]]) + sh[1:-1] + bytes([sh[-1] ^ 1]) for o, sh in replies[2]["b"].items()}
            replies = {**replies, 2: {"b": b, "s": replies[2]["s"]}}
        return replies

    server, result = run(PairwiseMasking(threshold=4), sums, lie)
    assert list(server.faults) == [2] and "does not match the commitment" in server.faults[2]
    assert result[1] == tuple(range(N))
    check_sum(result, sums)


@pytest.mark.parametrize("how", ["random", "check_plus_one"])
def test_corrupted_masked_input_is_an_unattributed_check_failure(how):
    sums = random_sums(N, np.random.default_rng(6))

    def corrupt(stage, replies):
        if stage == "masked_input":
            y = replies[0].copy()
            if how == "random":
                y[:] = np.random.default_rng(0).integers(0, 2**63, y.size, dtype=np.uint64)
            else:
                y[-1] += np.uint64(1)
            replies = {**replies, 0: y}
        return replies

    with pytest.raises(RoundAbortedError) as info:
        run(PairwiseMasking(threshold=4), sums, corrupt)
    assert type(info.value) is RoundAbortedError and info.value.cause == "unattributed_check_failure"
    assert "a client may have sent a corrupted masked input, or the server sent different broadcasts (binding" in str(info.value)
