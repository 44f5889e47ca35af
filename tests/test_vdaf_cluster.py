"""ClusterValidity: every validity condition, boundary values, an end-to-end Prio3 run over
20 clients with exact sums, and tampered shares / joint randomness."""
from __future__ import annotations

import random

import numpy as np
import pytest

from protocols.vdaf import ClusterValidity, Field64, Field128, Prio3, VdafError

K, D, NMAX, W = 3, 2, 10, [5, 7]
CTX = b"test clustering"
VK = bytes(range(32))


def vdaf(chunk_length=None):
    return Prio3.for_circuit(ClusterValidity(k=K, d=D, n_max=NMAX, widths=W, chunk_length=chunk_length))


def seeded(v, i):
    rng = random.Random(1000 + i)
    return bytes(rng.randrange(256) for _ in range(16)), bytes(rng.randrange(256) for _ in range(v.RAND_SIZE))


def run(v, public, shares, nonce, tamper=None):
    """Both aggregators' verification; returns the output shares or raises VdafError."""
    states, vss = [], []
    for i, s in enumerate(shares):
        st, vs = v.verify_init(VK, CTX, i, None, nonce, public, s)
        states.append(st)
        vss.append(vs)
    if tamper:
        vss = tamper(vss)
    msg = v.verifier_shares_to_message(CTX, None, vss)
    msg = v.decode_verifier_message(v.encode_verifier_message(msg))
    return [v.verify_next(CTX, st, msg) for st in states]


def accepts(v, encoded, i=0) -> bool:
    nonce, rand = seeded(v, i)
    public, shares = v.shard_encoded(CTX, encoded, nonce, rand)
    try:
        run(v, public, shares, nonce)
        return True
    except VdafError:
        return False


def honest(c, t):
    v = vdaf()
    return v, v.flp.valid.encode((c, t))


# --- boundary values accepted --------------------------------------------------------------
@pytest.mark.parametrize("c,t", [
    ([0, 0, 0], [[0, 0], [0, 0], [0, 0]]),                      # c_j = 0 with t = 0
    ([10, 0, 0], [[50, 70], [0, 0], [0, 0]]),                   # sum c = n_max, t = c*w
    ([3, 3, 4], [[15, 0], [0, 21], [20, 28]]),                  # sum c = n_max, mixed bounds
])
def test_boundary_values_accepted(c, t):
    v, enc = honest(c, t)
    assert accepts(v, enc)
    out = run(v, *_shard(v, enc))
    counts, sums = v.unshard(None, [v.aggregate(None, [o]) for o in out], 1)
    assert counts.tolist() == c and sums.tolist() == t
    assert counts.dtype == np.int64


def _shard(v, enc, i=0):
    nonce, rand = seeded(v, i)
    public, shares = v.shard_encoded(CTX, enc, nonce, rand)
    return public, shares, nonce


# --- every condition rejects a violation ---------------------------------------------------
def test_encode_refuses_invalid_measurements():
    cv = ClusterValidity(k=K, d=D, n_max=NMAX, widths=W)
    with pytest.raises(ValueError, match="n_max"):
        cv.encode(([5, 5, 1], [[0, 0]] * 3))
    with pytest.raises(ValueError, match="non-negative"):
        cv.encode(([-1, 0, 0], [[0, 0]] * 3))
    with pytest.raises(ValueError, match=r"t\[0\]\[1\]"):
        cv.encode(([1, 0, 0], [[0, 8], [0, 0], [0, 0]]))
    with pytest.raises(ValueError, match=r"t\[0\]\[0\]"):
        cv.encode(([1, 0, 0], [[-1, 0], [0, 0], [0, 0]]))
    with pytest.raises(ValueError, match="integer"):
        cv.encode(([1.5, 0, 0], [[0, 0]] * 3))


def test_count_one_above_total_rejected():
    v = vdaf()
    cv = v.flp.valid
    c = [5, 5, 1]  # sum n_max + 1: the slack would be -1, not representable
    enc = cv.encode_parts(c, [[0, 0]] * 3, -1, [[c[j] * W[e] for e in range(D)] for j in range(K)])
    assert not accepts(v, enc)
    # and with the slack forced to 0 and to n_max
    for s in (0, NMAX):
        assert not accepts(v, cv.encode_parts(c, [[0, 0]] * 3, s, [[c[j] * W[e] for e in range(D)]
                                                                   for j in range(K)]))


def test_negative_count_as_p_minus_1_rejected():
    v = vdaf()
    cv = v.flp.valid
    p = Field128.MODULUS
    enc = cv.encode_parts([0, 0, 0], [[0, 0]] * 3, NMAX, [[0, 0]] * 3)
    enc[0] = p - 1               # c_0 = -1 = p - 1 in the field (its first "bit" is p - 1)
    assert not accepts(v, enc)   # sum check fails: -1 + n_max != n_max
    enc[cv._slack_at] += 1       # slack's weight-1 digit 1 -> 2: slack = n_max + 1, sum check holds
    out = cv.eval(enc, [3] * cv.JOINT_RAND_LEN, 1)
    assert out[1] == 0 and out[0] != 0   # only the bit check and the box checks catch it now
    assert not accepts(v, enc)
    assert not accepts(v, enc)
    # the circuit itself (no joint-randomness luck) is non-zero on it
    jr = [3] * cv.JOINT_RAND_LEN
    assert any(cv.eval(enc, jr, 1))


@pytest.mark.parametrize("t00", [5 * 2 + 1, -1])
def test_sum_outside_box_rejected(t00):
    v = vdaf()
    cv = v.flp.valid
    c = [2, 0, 0]
    rows = [[t00, 0], [0, 0], [0, 0]]
    slack = [[c[j] * W[e] - rows[j][e] for e in range(D)] for j in range(K)]  # -1 or 11 -> wraps mod 2**B
    enc = cv.encode_parts(c, rows, NMAX - 2, slack)
    assert not accepts(v, enc)
    assert any(cv.eval(enc, [7] * cv.JOINT_RAND_LEN, 1)[1:])


def test_non_bit_in_encoding_rejected_even_when_linear_checks_hold():
    v, enc = honest([2, 0, 0], [[4, 0], [0, 0], [0, 0]])
    cv = v.flp.valid
    # t_00 = 4 as bits 0,0,1,0: replace by "bits" 2,1,0,0 (2 + 2*1 = 4): value unchanged, not bits
    pos = cv._t_at[0][0]
    forged = list(enc)
    forged[pos:pos + 4] = [2, 1, 0, 0]
    assert cv.truncate(forged) == cv.truncate(enc)
    assert all(x == 0 for x in cv.eval(forged, [5] * cv.JOINT_RAND_LEN, 1)[1:])
    assert not accepts(v, forged)


@pytest.mark.parametrize("c,t", [
    ([0, 0, 0], [[0, 0], [0, 0], [0, 0]]),
    ([10, 0, 0], [[50, 70], [0, 0], [0, 0]]),
    ([3, 3, 4], [[15, 0], [0, 21], [20, 28]]),
])
def test_lenient_encoding_of_a_valid_measurement_is_the_encoding(c, t):
    v, enc = honest(c, t)
    assert v.flp.valid.encode_lenient((c, t)) == enc
    assert accepts(v, enc)


@pytest.mark.parametrize("c,t,why", [
    ([-1, 0, 0], [[0, 0], [0, 0], [0, 0]], "negative count"),
    ([16, 0, 0], [[0, 0], [0, 0], [0, 0]], "count beyond its digits"),
    ([6, 5, 0], [[0, 0], [0, 0], [0, 0]], "total above n_max"),
    ([2, 0, 0], [[11, 0], [0, 0], [0, 0]], "sum above count x width"),
    ([2, 0, 0], [[-1, 0], [0, 0], [0, 0]], "negative shifted sum"),
    ([0, 0, 0], [[0, 3], [0, 0], [0, 0]], "sum with count 0"),
    ([2, 0, 0], [[10 ** 9, 0], [0, 0], [0, 0]], "sum far outside"),
])
def test_lenient_encoding_of_an_invalid_measurement_keeps_its_values_and_fails_the_proof(c, t, why):
    v = vdaf()
    cv = v.flp.valid
    enc = cv.encode_lenient((c, t))
    with pytest.raises(ValueError):
        cv.encode((c, t))
    q = Field128.MODULUS
    # the true values survive (so the linear outputs hold), only the bit check fails
    assert cv.truncate(enc) == [x % q for x in c] + [x % q for row in t for x in row], why
    assert all(x == 0 for x in cv.eval(enc, [5] * cv.JOINT_RAND_LEN, 1)[1:]), why
    assert not accepts(v, enc), why


def test_forged_proof_share_rejected():
    v, enc = honest([1, 1, 1], [[1, 2], [3, 4], [5, 6]])
    public, shares, nonce = _shard(v, enc)
    meas, proofs, blind = shares[0]
    for idx in (0, len(proofs) // 2, len(proofs) - 1):
        bad = list(proofs)
        bad[idx] = (bad[idx] + 1) % Field128.MODULUS
        with pytest.raises(VdafError):
            run(v, public, [(meas, bad, blind), shares[1]], nonce)


def test_end_to_end_20_clients_exact_sums():
    valid = ClusterValidity(k=5, d=4, n_max=1000, widths=[65536] * 4)
    v = Prio3.for_circuit(valid, num_proofs=1)
    rng = random.Random(7)
    agg = [v.agg_init(None), v.agg_init(None)]
    tot_c, tot_t = np.zeros(5, dtype=object), np.zeros((5, 4), dtype=object)
    for i in range(20):
        c = [rng.randrange(201) for _ in range(5)]
        t = [[rng.randrange(c[j] * 65536 + 1) for _ in range(4)] for j in range(5)]
        if i == 0:
            c, t = [200] * 5, [[200 * 65536] * 4] * 5
        nonce, rand = bytes(rng.randrange(256) for _ in range(16)), bytes(rng.randrange(256) for _ in range(v.RAND_SIZE))
        public, shares = v.shard(CTX, (c, t), nonce, rand)
        public = v.decode_public_share(v.encode_public_share(public))
        shares = [v.decode_input_share(a, v.encode_input_share(a, s)) for a, s in enumerate(shares)]
        states, vss = [], []
        for a in (0, 1):
            st, vs = v.verify_init(VK, CTX, a, None, nonce, public, shares[a])
            states.append(st)
            vss.append(v.decode_verifier_share(v.encode_verifier_share(vs)))
        msg = v.verifier_shares_to_message(CTX, None, vss)
        for a in (0, 1):
            agg[a] = v.agg_update(None, agg[a], v.verify_next(CTX, states[a], msg))
        tot_c += np.array(c, dtype=object)
        tot_t += np.array(t, dtype=object)
    agg = [v.decode_agg_share(v.encode_agg_share(a)) for a in agg]
    counts, sums = v.unshard(None, agg, 20)
    assert counts.tolist() == tot_c.tolist() and sums.tolist() == tot_t.tolist()


def _jr_vdaf_shares():
    v, enc = honest([2, 3, 0], [[10, 7], [1, 21], [0, 0]])
    return (v, *_shard(v, enc))


def test_tampered_leader_input_share_rejected():
    v, public, shares, nonce = _jr_vdaf_shares()
    meas, proofs, blind = shares[0]
    bad = list(meas)
    bad[0] = (bad[0] + 1) % Field128.MODULUS
    with pytest.raises(VdafError):
        run(v, public, [(bad, proofs, blind), shares[1]], nonce)


def test_tampered_helper_share_rejected():
    v, public, shares, nonce = _jr_vdaf_shares()
    seed, blind = shares[1]
    with pytest.raises(VdafError):
        run(v, public, [shares[0], (bytes([seed[0] ^ 1]) + seed[1:], blind)], nonce)
    with pytest.raises(VdafError):
        run(v, public, [shares[0], (seed, bytes([blind[0] ^ 1]) + blind[1:])], nonce)


def test_wrong_joint_randomness_part_rejected():
    v, public, shares, nonce = _jr_vdaf_shares()
    for agg in (0, 1):
        bad = list(public)
        bad[agg] = bytes([bad[agg][0] ^ 1]) + bad[agg][1:]
        with pytest.raises(VdafError):
            run(v, bad, shares, nonce)
    # a verifier share carrying a wrong part
    def swap(vss):
        vs, part = vss[1]
        return [vss[0], (vs, bytes(len(part)))]
    with pytest.raises(VdafError):
        run(v, public, shares, nonce, tamper=swap)


def test_field_capacity_and_max_clients():
    cv = ClusterValidity(k=5, d=4, n_max=1000, widths=[65536] * 4)
    assert cv.max_clients() == (Field128.MODULUS - 1) // (1000 * 65536)
    cv.check_clients(cv.max_clients())
    with pytest.raises(ValueError, match="n_clients"):
        cv.check_clients(cv.max_clients() + 1)
    with pytest.raises(ValueError, match="n_clients"):
        cv.decode([0] * cv.OUTPUT_LEN, cv.max_clients() + 1)
    small = ClusterValidity(k=2, d=1, n_max=1000, widths=[2**20], field=Field64)
    assert small.max_clients() == (Field64.MODULUS - 1) // (1000 * 2**20)
    with pytest.raises(ValueError, match="n_clients"):
        ClusterValidity(k=2, d=1, n_max=1000, widths=[2**20], field=Field64, n_clients=2**40)
    with pytest.raises(ValueError, match="too large"):
        ClusterValidity(k=2, d=1, n_max=2**30, widths=[2**40], field=Field64)


def test_parameter_checks():
    for kw, word in (({"k": 0}, "k"), ({"d": 0}, "d"), ({"n_max": 0}, "n_max"), ({"widths": [1]}, "widths"),
                     ({"widths": [-1, 2]}, "widths"), ({"chunk_length": 0}, "chunk_length")):
        args = {"k": 2, "d": 2, "n_max": 5, "widths": [3, 4]}
        args.update(kw)
        with pytest.raises(ValueError, match=word):
            ClusterValidity(**args)


def test_layout_and_lengths():
    cv = ClusterValidity(k=K, d=D, n_max=NMAX, widths=W)
    assert cv.cb == 4 and cv.tb == [6, 7]
    assert cv.MEAS_LEN == K * 4 + 4 + 2 * K * (6 + 7)
    assert cv.OUTPUT_LEN == K + K * D and cv.EVAL_OUTPUT_LEN == 2 + K * D
    enc = cv.encode(([1, 2, 3], [[5, 0], [10, 14], [0, 21]]))
    assert set(enc) <= {0, 1} and len(enc) == cv.MEAS_LEN
    assert cv.truncate(enc) == [1, 2, 3, 5, 0, 10, 14, 0, 21]
    assert cv.eval(enc, [9] * cv.JOINT_RAND_LEN, 1) == [0] * cv.EVAL_OUTPUT_LEN


@pytest.mark.parametrize("chunk", [1, 7, 200])
def test_chunk_lengths_and_field64_multiproof(chunk):
    v = vdaf(chunk)
    assert accepts(v, v.flp.valid.encode(([1, 2, 3], [[5, 0], [10, 14], [0, 21]])))
    v64 = Prio3.for_circuit(ClusterValidity(k=K, d=D, n_max=NMAX, widths=W, chunk_length=chunk, field=Field64),
                            num_proofs=3)
    good = v64.flp.valid.encode(([1, 2, 3], [[5, 0], [10, 14], [0, 21]]))
    assert accepts(v64, good)
    bad = list(good)
    bad[0] = 2
    assert not accepts(v64, bad)


def test_default_chunk_length_minimises_proof_length():
    cv = ClusterValidity(k=5, d=4, n_max=1000, widths=[65536] * 4)
    best = min(ClusterValidity(k=5, d=4, n_max=1000, widths=[65536] * 4, chunk_length=ch).proof_len()
               for ch in (1, 8, 16, 30, 33, 35, 37, 40, 48, 64, 100, 1100))
    assert cv.chunk_length == 36 and cv.proof_len() == 135 <= best


# --- vote histograms (votes=(V, B)) ---------------------------------------------------------
def vote_vdaf():
    return Prio3.for_circuit(ClusterValidity(k=K, d=D, n_max=NMAX, widths=W, votes=(D, 4)))


def one_hot(j_bins):
    """Votes k x D x 4: cluster j votes bin j_bins[j] in every coordinate (None: no vote)."""
    return [[[int(b is not None and i == b) for i in range(4)] for _ in range(D)] for b in j_bins]


def test_votes_valid_histograms_accepted_and_summed_exactly():
    v = vote_vdaf()
    cv = v.flp.valid
    meas = [([2, 0, 1], [[3, 5], [0, 0], [4, 0]], one_hot([1, None, 3])),
            ([0, 4, 0], [[0, 0], [8, 9], [0, 0]], one_hot([None, 0, None])),
            ([1, 1, 1], [[5, 7], [0, 7], [5, 0]], one_hot([1, 2, 3]))]
    outs = []
    for i, m in enumerate(meas):
        enc = cv.encode(m)
        assert cv.encode_lenient(m) == enc and accepts(v, enc, i)
        nonce, rand = seeded(v, i)
        public, shares = v.shard_encoded(CTX, enc, nonce, rand)
        outs.append(run(v, public, shares, nonce))
    aggs = [v.aggregate(None, [o[a] for o in outs]) for a in range(2)]
    counts, sums, votes = v.unshard(None, aggs, len(meas))
    assert counts.tolist() == [3, 5, 2] and sums.tolist() == [[8, 12], [8, 16], [9, 0]]
    assert votes.tolist() == np.sum([np.array(m[2]) for m in meas], axis=0).tolist()


@pytest.mark.parametrize("why", ["two votes in a coordinate", "a vote of 2", "a negative vote",
                                 "one coordinate left out"])
def test_votes_malformed_histograms_rejected(why):
    v = vote_vdaf()
    cv = v.flp.valid
    votes = one_hot([0, None, 2])
    if why == "two votes in a coordinate":
        votes[0][1][3] = 1
    elif why == "a vote of 2":
        votes[0][0] = [2, 0, 0, 0]
        votes[0][1] = [2, 0, 0, 0]
    elif why == "a negative vote":
        votes[2][0] = [1, -1, 1, 0]
    else:
        votes[2][1] = [0, 0, 0, 0]
    m = ([1, 0, 1], [[0, 0], [0, 0], [0, 0]], votes)
    with pytest.raises(ValueError):
        cv.encode(m)
    assert not accepts(v, cv.encode_lenient(m)), why


def test_votes_shape_is_checked():
    cv = vote_vdaf().flp.valid
    with pytest.raises(ValueError, match="counts, shifted_sums, votes"):
        cv.encode(([0, 0, 0], [[0, 0]] * 3))
    with pytest.raises(ValueError, match="votes must be"):
        cv.encode(([0, 0, 0], [[0, 0]] * 3, [[[0] * 3] * D] * K))
    with pytest.raises(ValueError, match="bins >= 2"):
        ClusterValidity(k=K, d=D, n_max=NMAX, widths=W, votes=(D, 1))
