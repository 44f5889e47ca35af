"""Paillier: malformed ciphertexts are refused per client at receipt, out-of-range sums abort.

A malicious client signs whatever it likes, so the signature says nothing about the
ciphertext's content: the server checks every ciphertext is in ``Z*_{n^2}`` before it
aggregates, and checks every decrypted slot against its declared range before it releases.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import phe
import pytest

from protocols.paillier import KeyAuthority, sign_contribution
from securefkm.exceptions import InputError, RoundAbortedError
from test_paillier import _round


@pytest.fixture(scope="module")
def keypair():
    return phe.generate_paillier_keypair(n_length=1024)  # test-only size


@pytest.fixture
def authority(keypair):
    return KeyAuthority(*keypair, min_clients=2, allow_weak_key=True)


def _resign(reply, contexts, layer, ciphertexts):
    """``reply`` with other ciphertexts, signed by its own client (a malicious client)."""
    key = contexts[reply.client_id].state["paillier"]["signing_key"]
    try:
        return sign_contribution(key, layer.bundle.fingerprint, reply.client_id, reply.nonce, reply.digest,
                                 ciphertexts)
    except (OverflowError, TypeError, ValueError):  # not signable (negative, float, str): sent unsigned
        return replace(reply, ciphertexts=tuple(ciphertexts))


def _exact_sum(layer, sessions, ids, ctx):
    total = np.sum([sessions[c].values.astype(object) for c in ids], axis=0)
    return layer.codec.decode_signed(total, ctx.specs)


def test_honest_round_equals_the_plain_sum_exactly(authority):
    layer, server, replies, sessions, _, ctx = _round(authority, n_clients=3)
    server.receive("encrypted_input", replies)
    assert server.faults == {}
    sums, ids = server.result()
    assert ids == (0, 1, 2)
    want = _exact_sum(layer, sessions, ids, ctx)
    for name in want:
        np.testing.assert_array_equal(sums[name], want[name])


def _malformed_values(keypair):
    pk, sk = keypair
    n, n2 = pk.n, pk.nsquare
    return {
        "zero": (0, "outside"),
        "n^2": (n2, "outside"),
        "above n^2": (n2 + 5, "outside"),
        "negative": (-1, "outside"),
        "n": (n, "not coprime"),
        "multiple of p": (sk.p * 12345, "not coprime"),
        "bool": (True, "not an integer"),
        "float": (1.5, "not an integer"),
        "string": ("17", "not an integer"),
    }


@pytest.mark.parametrize("case", ["zero", "n^2", "above n^2", "negative", "n", "multiple of p", "bool",
                                  "float", "string"])
def test_malformed_ciphertext_is_refused_naming_the_client(authority, keypair, case):
    value, why = _malformed_values(keypair)[case]
    layer, server, replies, sessions, contexts, ctx = _round(authority, n_clients=3)
    bad = list(replies[1].ciphertexts)
    bad[0] = value
    # a value of another type travels as it is (signing would convert it to an int)
    replies[1] = (_resign(replies[1], contexts, layer, bad) if type(value) is int
                  else replace(replies[1], ciphertexts=tuple(bad)))
    server.receive("encrypted_input", replies)
    assert set(server.faults) == {1}
    assert "ciphertexts[0]" in server.faults[1] and why in server.faults[1]
    sums, ids = server.result()  # the others' round goes on, exactly
    assert ids == (0, 2)
    want = _exact_sum(layer, sessions, ids, ctx)
    for name in want:
        np.testing.assert_array_equal(sums[name], want[name])


def test_authority_refuses_a_non_unit_ciphertext_naming_the_client(authority, keypair):
    pk, _ = keypair
    layer, server, replies, _, contexts, _ = _round(authority, n_clients=3)
    replies[2] = _resign(replies[2], contexts, layer, (pk.n,) + replies[2].ciphertexts[1:])
    contributions = [replies[c] for c in sorted(replies)]
    with pytest.raises(RoundAbortedError, match="client 2 sent a value that is not a Paillier ciphertext"):
        authority.decrypt_aggregate(server.ticket.nonce, contributions)
    assert authority.n_decryptions == 0


def _bad_plaintexts(layout, n):
    w, k = layout.slot_bits, layout.slots_per_plaintext
    return {
        "headroom": (1 << (w - 1), "headroom"),
        "carry into the next slot": ((1 << w) - 1, "out of its slots' declared ranges"),
        "beyond the last slot": (1 << (k * w), "beyond its last slot"),
        "n - 1": (n - 1, "out of its slots' declared ranges"),
        "negative": (n - (1 << (k * w - 1)), "negative number modulo n"),
        "unused slot": (1 << ((k - 1) * w), "unused slot"),
    }


@pytest.mark.parametrize("case", ["headroom", "carry into the next slot", "beyond the last slot", "n - 1", "negative",
                                  "unused slot"])
def test_out_of_range_decrypted_slot_aborts_and_releases_nothing(authority, keypair, case):
    pk, _ = keypair
    layer, server, replies, _, contexts, _ = _round(authority, n_clients=3)
    assert server.n_values < layer.layout.slots_per_plaintext  # one plaintext, unused slots at its top
    plaintext, why = _bad_plaintexts(layer.layout, pk.n)[case]
    replies[0] = _resign(replies[0], contexts, layer, (pk.raw_encrypt(plaintext),))
    server.receive("encrypted_input", replies)
    assert server.faults == {}  # a well-formed ciphertext: only its content is wrong
    with pytest.raises(RoundAbortedError, match=why) as err:
        server.result()
    assert "not released" in str(err.value) and err.value.stage == "encrypted_input"


def test_sum_violation_accepts_the_extremes_of_honest_sums(keypair):
    from protocols.paillier import layout_for_key

    lay = layout_for_key(keypair[0].n, 8, 4)
    lo, hi = lay.value_range
    for v in (lo, hi):
        packs = [lay.pack(np.full(lay.slots_per_plaintext + 1, v, dtype=np.int64)) for _ in range(4)]
        total = [sum(p[i] for p in packs) for i in range(2)]
        assert lay.sum_violation(total, lay.slots_per_plaintext + 1, 4, keypair[0].n) is None
        assert lay.unpack(total, lay.slots_per_plaintext + 1, 4, keypair[0].n) == [4 * v] * (lay.slots_per_plaintext + 1)


def test_a_decrypted_n_minus_1_is_named_negative(keypair):
    from protocols.paillier import layout_for_key

    n = keypair[0].n
    lay = layout_for_key(n, 16, 4)
    assert "negative number modulo n (n - 1)" in lay.sum_violation([n - 1], 3, 2, n)
    with pytest.raises(InputError, match="out of range: plaintext 0 has bits beyond"):
        lay.unpack([n - 1], 3, 2)  # without the modulus: still refused
