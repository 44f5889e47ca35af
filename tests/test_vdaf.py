"""Prio3 (draft-irtf-cfrg-vdaf-20) against the draft's published test vectors, plus the
field, XOF and FLP building blocks and hostile-byte decoding."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from protocols.vdaf import (Field64, Field128, FieldDecodeError, Mul, PolyEval, Prio3, SumVec, Valid, VdafError,
                            XofFixedKeyAes128, XofTurboShake128)
from protocols.vdaf.field import Lagrange, poly_eval

VEC_DIR = Path(os.environ.get("VDAF_TEST_VEC", "/work/shared/vdaf/test_vec"))
needs_vectors = pytest.mark.skipif(not VEC_DIR.is_dir(),
                                   reason=f"VDAF test vectors not found at {VEC_DIR} (set VDAF_TEST_VEC)")
TEST_ID = 0xFFFFFFFF  # algorithm id the draft's vectors use for non-registered test instances


class Range3(Valid):
    """The draft's Sec. 7.3.1.1 example ``Range3(x) = x**3 - 3x**2 + 2x`` (x in {0,1,2}) over
    Field64 with one PolyEval call: the circuit behind the Prio3HigherDegree vector."""

    MEAS_LEN = 1
    JOINT_RAND_LEN = 0
    OUTPUT_LEN = 1
    EVAL_OUTPUT_LEN = 1

    def __init__(self):
        self.field = Field64
        self.GADGETS = [PolyEval([0, 2, -3, 1], 1)]
        self.GADGET_CALLS = [1]

    def encode(self, m):
        return [int(m)]

    def eval(self, meas, joint_rand, num_shares):
        return [self.GADGETS[0].eval(self.field, [meas[0]])]

    def truncate(self, meas):
        return list(meas)

    def decode(self, output, num_measurements):
        return output[0]


def make_vdaf(name: str, d: dict) -> Prio3:
    s = d["shares"]
    if name.startswith("Prio3Count"):
        return Prio3.count(s)
    if name.startswith("Prio3Sum_"):
        return Prio3.sum(d["max_measurement"], s)
    if name.startswith("Prio3SumVecWithMultiproof"):
        return Prio3(SumVec(Field64, d["length"], d["max_measurement"], d["chunk_length"]), 3, s, TEST_ID)
    if name.startswith("Prio3SumVec_"):
        return Prio3.sum_vec(d["length"], d["max_measurement"], d["chunk_length"], s)
    if name.startswith("Prio3Histogram"):
        return Prio3.histogram(d["length"], d["chunk_length"], s)
    if name.startswith("Prio3MultihotCountVec"):
        return Prio3.multihot_count_vec(d["length"], d["max_weight"], d["chunk_length"], s)
    if name.startswith("Prio3HigherDegree"):
        return Prio3(Range3(), 1, s, TEST_ID)
    raise AssertionError(f"no parameters known for {name}")


VECTOR_FILES = sorted(p.name for p in (VEC_DIR / "vdaf").glob("Prio3*.json")) if VEC_DIR.is_dir() else []


def run_vector(v: Prio3, d: dict) -> list[str]:
    """Execute the vector's operations in order; returns the failed operation names."""
    h = bytes.fromhex
    ctx, vk = h(d["ctx"]), h(d["verify_key"])
    states, outs, failed = {}, {}, []
    for op in d["operations"]:
        kind, ok = op["operation"], op["success"]
        ri = op.get("report_index")
        r = d["reports"][ri] if ri is not None else None
        agg = op.get("aggregator_id")
        try:
            if kind == "shard":
                ps, shares = v.shard(ctx, r["measurement"], h(r["nonce"]), h(r["rand"]))
                assert v.encode_public_share(ps).hex() == r["public_share"]
                assert [v.encode_input_share(i, s).hex() for i, s in enumerate(shares)] == r["input_shares"]
            elif kind == "verify_init":
                st, vs = v.verify_init(vk, ctx, agg, None, h(r["nonce"]), v.decode_public_share(h(r["public_share"])),
                                       v.decode_input_share(agg, h(r["input_shares"][agg])))
                states[(ri, agg)] = st
                assert v.encode_verifier_share(vs).hex() == r["verifier_shares"][0][agg]
            elif kind == "verifier_shares_to_message":
                vss = [v.decode_verifier_share(h(x)) for x in r["verifier_shares"][op["round"]]]
                msg = v.verifier_shares_to_message(ctx, None, vss)
                assert v.encode_verifier_message(msg).hex() == r["verifier_messages"][op["round"]]
            elif kind == "verify_next":
                msg = v.decode_verifier_message(h(r["verifier_messages"][op["round"] - 1]))
                out = v.verify_next(ctx, states[(ri, agg)], msg)
                outs[(ri, agg)] = out
                assert v.encode_out_share(out).hex() == r["out_shares"][agg]
            elif kind == "aggregate":
                mine = [outs[(i, agg)] for i in range(len(d["reports"])) if (i, agg) in outs]
                assert v.encode_agg_share(v.aggregate(None, mine)).hex() == d["agg_shares"][agg]
            elif kind == "unshard":
                aggs = [v.decode_agg_share(h(x)) for x in d["agg_shares"]]
                assert v.unshard(None, aggs, len(d["reports"])) == d["agg_result"]
            else:
                raise AssertionError(f"unknown operation {kind}")
        except VdafError:
            if ok:
                raise
            failed.append(kind)
            continue
        assert ok, f"operation {kind} succeeded but the vector marks it as failing"
    return failed


@needs_vectors
@pytest.mark.parametrize("name", VECTOR_FILES)
def test_prio3_vector(name):
    d = json.loads((VEC_DIR / "vdaf" / name).read_text())
    failed = run_vector(make_vdaf(name, d), d)
    expected = [op["operation"] for op in d["operations"] if not op["success"]]
    assert failed == expected
    if "_bad_" in name:
        assert failed, "a bad vector must be rejected"


def test_vector_files_cover_every_variant():
    if not VECTOR_FILES:
        pytest.skip(f"VDAF test vectors not found at {VEC_DIR}")
    stems = {n.rsplit("_", 1)[0] for n in VECTOR_FILES if "_bad_" not in n}
    assert stems == {"Prio3Count", "Prio3Sum", "Prio3SumVec", "Prio3SumVecWithMultiproof", "Prio3Histogram",
                     "Prio3MultihotCountVec", "Prio3HigherDegree"}


@needs_vectors
@pytest.mark.parametrize("xof,name", [(XofTurboShake128, "XofTurboShake128.json"),
                                      (XofFixedKeyAes128, "XofFixedKeyAes128.json")])
def test_xof_vector(xof, name):
    d = json.loads((VEC_DIR / name).read_text())
    seed, dst, binder = (bytes.fromhex(d[k]) for k in ("seed", "dst", "binder"))
    assert xof.derive_seed(seed, dst, binder).hex() == d["derived_seed"]
    vec = xof.expand_into_vec(Field128, seed, dst, binder, d["length"])
    assert Field128.encode_vec(vec).hex() == d["expanded_vec_field128"]


def test_xof_stream_is_consistent_across_reads():
    x1 = XofTurboShake128(b"s" * 32, b"dst", b"b")
    x2 = XofTurboShake128(b"s" * 32, b"dst", b"b")
    assert x1.next(5) + x1.next(27) == x2.next(32)
    a1 = XofFixedKeyAes128(b"k" * 16, b"dst", b"b")
    a2 = XofFixedKeyAes128(b"k" * 16, b"dst", b"b")
    assert a1.next(7) + a1.next(30) == a2.next(37)


@pytest.mark.parametrize("F", [Field64, Field128])
def test_field_encoding_rejects_non_canonical(F):
    assert F.decode_vec(F.encode_vec([0, 1, F.MODULUS - 1])) == [0, 1, F.MODULUS - 1]
    with pytest.raises(FieldDecodeError):
        F.decode_vec(F.MODULUS.to_bytes(F.ENCODED_SIZE, "little"))
    with pytest.raises(FieldDecodeError):
        F.decode_vec(b"\x00" * (F.ENCODED_SIZE + 1))
    assert F.encode_vec([1]) == b"\x01" + b"\x00" * (F.ENCODED_SIZE - 1)


@pytest.mark.parametrize("F", [Field64, Field128])
def test_generator_order_and_ntt(F):
    g = F.gen()
    assert pow(g, F.GEN_ORDER, F.MODULUS) == 1 and pow(g, F.GEN_ORDER // 2, F.MODULUS) != 1
    rng = random.Random(3)
    for n in (1, 2, 8, 32):
        coeffs = [rng.randrange(F.MODULUS) for _ in range(n)]
        w = F.nth_root(n)
        naive = [poly_eval(F, coeffs, pow(w, i, F.MODULUS)) for i in range(n)]
        assert F.ntt(coeffs, n) == naive
        assert F.inv_ntt(naive, n) == coeffs
        s = F.nth_root(2 * n)
        assert F.ntt(coeffs, n, True) == [poly_eval(F, coeffs, s * pow(w, i, F.MODULUS) % F.MODULUS)
                                          for i in range(n)]


def test_lagrange_operations_match_monomial_evaluation():
    F = Field128
    lag = Lagrange(F)
    rng = random.Random(5)
    coeffs = [rng.randrange(F.MODULUS) for _ in range(6)]  # degree 5
    vals8 = F.ntt(coeffs, 8)
    x = rng.randrange(F.MODULUS)
    assert lag.poly_eval(vals8, x) == poly_eval(F, coeffs, x)
    # at the roots themselves (the barycentric form's poles), and batched
    for w in F.nth_root_powers(8):
        assert lag.poly_eval(vals8, w) == poly_eval(F, coeffs, w)
    more = [F.ntt([rng.randrange(F.MODULUS) for _ in range(7)], 8) for _ in range(5)]
    assert lag.poly_eval_batched(more, x) == [lag.poly_eval(p, x) for p in more]
    part = vals8[:6]
    lag.extend_values_to_power_of_2(part, 8)
    assert part == vals8
    assert lag.double_evaluations(vals8) == F.ntt(coeffs, 16)
    other = [rng.randrange(F.MODULUS) for _ in range(8)]
    prod = lag.poly_mul(vals8, F.ntt(other, 8))
    assert prod == [a * b % F.MODULUS for a, b in zip(F.ntt(coeffs, 16), F.ntt(other, 16))]


def test_gadgets():
    F = Field64
    assert Mul().eval(F, [3, 5]) == 15
    assert PolyEval([0, -1, 1], 4).eval(F, [5]) == 20
    assert PolyEval([0, -1, 1, 0, 0], 4).DEGREE == 2
    with pytest.raises(ValueError):
        PolyEval([0, 0], 1)


def _vdafs():
    return [Prio3.count(), Prio3.sum(255), Prio3.histogram(5, 2), Prio3.sum_vec(3, 15, 2, shares=3)]


@pytest.mark.parametrize("idx", range(4))
def test_hostile_bytes_raise_vdaf_error_only(idx):
    v = _vdafs()[idx]
    rng = random.Random(idx)
    decoders = [v.decode_public_share, lambda b: v.decode_input_share(0, b), lambda b: v.decode_input_share(1, b),
                v.decode_verifier_share, v.decode_verifier_message, v.decode_agg_share]
    for dec in decoders:
        for n in (0, 1, 7, 8, 16, 31, 32, 33, 64, 100, 1000):
            try:
                dec(bytes(rng.randrange(256) for _ in range(n)))
            except VdafError:
                pass
        with pytest.raises(VdafError):
            dec("not bytes" * 40)
    # an over-modulus field element in a correctly sized verifier share
    n = v.flp.VERIFIER_LEN * v.PROOFS
    bad = b"\xff" * (n * v.field.ENCODED_SIZE) + (b"\x00" * 32 if v.flp.JOINT_RAND_LEN else b"")
    with pytest.raises(VdafError):
        v.decode_verifier_share(bad)


def test_round_trip_through_bytes_and_nonce_binding():
    v = Prio3.histogram(5, 2)
    ctx, nonce, rand = b"ctx", bytes(16), bytes(range(v.RAND_SIZE))
    ps, shares = v.shard(ctx, 3, nonce, rand)
    vk = bytes(32)
    res = [v.verify_init(vk, ctx, i, None, nonce, v.decode_public_share(v.encode_public_share(ps)),
                         v.decode_input_share(i, v.encode_input_share(i, s))) for i, s in enumerate(shares)]
    msg = v.verifier_shares_to_message(ctx, None, [r[1] for r in res])
    outs = [v.verify_next(ctx, r[0], msg) for r in res]
    assert v.unshard(None, [v.aggregate(None, [o]) for o in outs], 1) == [0, 0, 0, 1, 0]
    # a different nonce at verification changes the joint randomness part: rejected
    res2 = [v.verify_init(vk, ctx, i, None, b"\x01" * 16, ps, s) for i, s in enumerate(shares)]
    with pytest.raises(VdafError):
        m2 = v.verifier_shares_to_message(ctx, None, [r[1] for r in res2])
        for r in res2:
            v.verify_next(ctx, r[0], m2)


def test_shard_argument_checks():
    v = Prio3.count()
    with pytest.raises(ValueError, match="nonce"):
        v.shard(b"", 1, bytes(15), bytes(v.RAND_SIZE))
    with pytest.raises(ValueError, match="rand"):
        v.shard(b"", 1, bytes(16), bytes(3))
    with pytest.raises(ValueError):
        v.shard(b"", 2, bytes(16), bytes(v.RAND_SIZE))
    assert v.is_valid(None, []) and not v.is_valid(None, [None])


def test_batched_transforms_match_scalar_path():
    from protocols.vdaf.field import dft_rows
    from protocols.vdaf.flp import ParallelSum

    rng = random.Random(11)
    for F in (Field64, Field128):
        lag = Lagrange(F)
        for n in (1, 2, 16):
            rows = [[rng.randrange(F.MODULUS) for _ in range(n)] for _ in range(6)]
            assert [list(r) for r in dft_rows(F, rows)] == [F.ntt(r, n) for r in rows]
            assert [list(r) for r in dft_rows(F, rows, twist=True)] == [F.ntt(r, n, True) for r in rows]
            assert [list(r) for r in dft_rows(F, rows, inverse=True)] == [F.inv_ntt(r, n) for r in rows]
            assert [list(r) for r in lag.double_evaluations_rows(rows)] == [lag.double_evaluations(r) for r in rows]
        wires = [[rng.randrange(F.MODULUS) for _ in range(8)] for _ in range(6)]
        scalar = [0] * 16
        for i in range(3):
            scalar = [(a + b) % F.MODULUS for a, b in zip(scalar, lag.poly_mul(wires[2 * i], wires[2 * i + 1]))]
        assert ParallelSum(Mul(), 3).eval_poly(F, wires) == scalar
