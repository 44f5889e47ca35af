"""Fixed-point codec: bit-exact integer sums, bounded float error, no silent clipping."""

import numpy as np
import pytest

from protocols.codec import FixedPointCodec
from securefkm.exceptions import InputError
from securefkm.messages import FieldSpec

SPECS = (
    FieldSpec("count", (3,), "count", integer=True),
    FieldSpec("total", (3, 2), "sum"),
)


def _sums(rng, scale=1000.0):
    return {
        "count": rng.integers(0, 10**6, 3).astype(float),
        "total": rng.normal(size=(3, 2)) * scale,
    }


@pytest.mark.parametrize("n", [1, 3, 50])
def test_sum_of_encodings_decodes_to_plain_sum(n):
    rng = np.random.default_rng(n)
    codec = FixedPointCodec(frac_bits=20)
    clients = [_sums(rng) for _ in range(n)]
    total = np.zeros(9, dtype=np.uint64)
    for s in clients:
        np.add(total, codec.encode(s, SPECS, n), out=total)
    out = codec.decode(total, SPECS)
    plain_count = sum(s["count"] for s in clients)
    plain_total = sum(s["total"] for s in clients)
    assert np.array_equal(out["count"], plain_count)  # bit-exact
    assert np.max(np.abs(out["total"] - plain_total)) <= n * codec.resolution / 2
    assert out["total"].shape == (3, 2)


def test_negative_values_wrap_and_decode():
    codec = FixedPointCodec(frac_bits=8)
    specs = (FieldSpec("x", (2,), "value"),)
    a = codec.encode({"x": np.array([-1.5, 2.25])}, specs, 2)
    b = codec.encode({"x": np.array([-0.5, -3.0])}, specs, 2)
    assert a.dtype == np.uint64
    out = codec.decode(a + b, specs)
    assert np.array_equal(out["x"], [-2.0, -0.75])
    assert np.array_equal(codec.encode_signed({"x": np.array([-1.5, 2.25])}, specs, 2), [-384, 576])


def test_integer_field_is_exact_beyond_float_fraction_range():
    codec = FixedPointCodec(frac_bits=40)
    specs = (FieldSpec("count", (1,), "count", integer=True),)
    big = float(2**52 + 1)
    enc = codec.encode({"count": np.array([big])}, specs, 2)
    assert int(enc.view(np.int64)[0]) == 2**52 + 1


def test_overflow_precheck_names_fix():
    codec = FixedPointCodec(frac_bits=40, bound=1e6)
    with pytest.raises(InputError, match="frac_bits"):
        codec.check_capacity(SPECS, 100)
    FixedPointCodec(frac_bits=20, bound=1e6).check_capacity(SPECS, 100)  # fits


def test_out_of_bound_value_names_field_and_is_not_clipped():
    codec = FixedPointCodec(frac_bits=16, bound=10.0)
    sums = {"count": np.array([1.0, 2.0, 3.0]), "total": np.zeros((3, 2))}
    sums["total"][1, 1] = 10.5
    with pytest.raises(InputError, match="'total'"):
        codec.encode(sums, SPECS, 3)


def test_default_bound_is_max_abs_for_round_size():
    codec = FixedPointCodec(frac_bits=24)
    m = codec.max_abs(1000)
    assert m * 1000 * codec.scale < 2**63
    specs = (FieldSpec("v", (1,), "value"),)
    codec.encode({"v": np.array([m])}, specs, 1000)
    with pytest.raises(InputError, match="'v'"):
        codec.encode({"v": np.array([m * 1.01])}, specs, 1000)
    # worst case: every client at +max_abs does not overflow
    enc = codec.encode({"v": np.array([m])}, specs, 1000)
    total = (enc * np.uint64(1000)).astype(np.uint64)
    assert codec.decode(total, specs)["v"][0] > 0


def test_bad_inputs():
    codec = FixedPointCodec()
    with pytest.raises(InputError, match="NaN"):
        codec.encode({"count": np.zeros(3), "total": np.full((3, 2), np.nan)}, SPECS, 2)
    with pytest.raises(InputError, match="integer"):
        codec.encode({"count": np.array([0.5, 0, 0]), "total": np.zeros((3, 2))}, SPECS, 2)
    with pytest.raises(InputError, match="do not match"):
        codec.encode({"count": np.zeros(3)}, SPECS, 2)
    with pytest.raises(InputError, match="frac_bits"):
        FixedPointCodec(frac_bits=70)
    with pytest.raises(InputError, match="bound"):
        FixedPointCodec(bound=-1)


def test_fast_encode_equals_the_per_field_loop():
    """encode_signed's one-pass path gives the words of the per-field loop (which it falls
    back to for errors), on integer and fractional fields, signs and magnitudes."""

    rng = np.random.default_rng(0)
    specs = (FieldSpec("counts", (4,), "count", integer=True), FieldSpec("sums", (4, 3), "sum"),
             FieldSpec("score", (1,), "score"))
    codec = FixedPointCodec(bound=1e6)
    for _ in range(50):
        sums = {"counts": rng.integers(0, 1000, 4).astype(float), "sums": rng.normal(scale=10 ** rng.uniform(-3, 5), size=(4, 3)),
                "score": rng.uniform(0, 1e5, 1)}
        fast = codec.encode_signed(sums, specs, 10)
        codec_loop = FixedPointCodec(bound=1e6)
        codec_loop._encode_fast = lambda *a: None  # force the per-field loop
        np.testing.assert_array_equal(fast, codec_loop.encode_signed(sums, specs, 10))
    with pytest.raises(InputError, match="'counts' is declared integer"):
        codec.encode_signed({**sums, "counts": np.array([0.5, 1, 2, 3])}, specs, 10)
    with pytest.raises(InputError, match="'sums' contains NaN"):
        codec.encode_signed({**sums, "sums": np.full((4, 3), np.nan)}, specs, 10)


def test_encode_many_equals_client_by_client_and_names_the_first_bad_client():
    """encode_signed_many (the ideal functionalities encode a round's clients in one pass):
    row i is exactly encode_signed of client i; a bad client gets encode_signed's own error."""
    rng = np.random.default_rng(3)
    specs = (FieldSpec("counts", (4,), "count", integer=True), FieldSpec("sums", (4, 3), "sum"))
    codec = FixedPointCodec(bound=1e6)
    batch = [{"counts": rng.integers(0, 1000, 4).astype(float),
              "sums": rng.normal(scale=10 ** rng.uniform(-3, 5), size=(4, 3))} for _ in range(40)]
    many = codec.encode_signed_many(batch, specs, 40)
    assert many.shape == (40, 16)
    for row, sums in zip(many, batch):
        np.testing.assert_array_equal(row, codec.encode_signed(sums, specs, 40))
    assert codec.encode_signed_many([], specs, 40).shape == (0, 16)
    batch[7] = {**batch[7], "sums": np.full((4, 3), 2e6)}
    with pytest.raises(InputError, match="'sums' has \\|value\\| 2e\\+06 above the codec bound"):
        codec.encode_signed_many(batch, specs, 40)
    batch[7] = {"counts": batch[7]["counts"]}  # a missing field: check_sums' error
    with pytest.raises(InputError, match="do not match the declared fields"):
        codec.encode_signed_many(batch, specs, 40)
