"""Shamir t-of-n secret sharing of byte strings over GF(p), p = 2**31 - 1, vectorised.

Shamir, "How to share a secret", CACM 22(11), 1979. A secret of ``L`` bytes is read as a
big-endian integer and cut into ``m = ceil(8L / 30)`` limbs of 30 bits (each < p). Each
limb is the constant term of its own random polynomial of degree ``t - 1`` whose other
coefficients are drawn uniformly from GF(p) with the OS CSPRNG (``os.urandom``,
rejection-sampled, no modulo bias). All limbs (and several secrets) are evaluated at once
as one matrix product ``V @ C mod p`` (Vandermonde matrix of the holders' points times
the coefficient matrix), computed exactly with float64 BLAS on 16-bit halves (for a
threshold up to 64 only the coefficients are split, one product; a sparse-graph client's
sharing then costs about 0.1 ms instead of 0.25 ms).

Any ``t`` shares determine each limb by Lagrange interpolation at 0; ``t - 1`` shares are
independent of the secret (perfect hiding, limb by limb). Reconstruction also checks that
every limb is below ``2**30``; inconsistent (tampered) shares fail that check with
probability ``1 - 2**-m`` and raise :class:`ShareError`.

A share is a ``bytes`` object (picklable, ready to encrypt): a header ``<IH`` with the
evaluation point ``x`` (1 <= x < p) and the secret length, then the ``m`` limb values as
little-endian ``uint32``.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Sequence

import numpy as np

from securefkm.exceptions import InputError

P = 2**31 - 1
LIMB_BITS = 30
SMALL_INNER = 64  # mulmod_matmul's one-product path: 64 * 2**31 * 2**16 <= 2**53
_HEADER = struct.Struct("<IH")


class ShareError(InputError):
    """Shares that cannot be reconstructed: too few, duplicated, malformed or inconsistent."""


def _fold(a: np.ndarray) -> np.ndarray:
    """Partial reduction mod the Mersenne prime p = 2**31 - 1 of values in [0, 2**62]:
    two folds ``(a & p) + (a >> 31)`` give a value in [0, p + 1] congruent to ``a``
    (shifts and masks instead of a 64-bit division)."""
    a = (a & P) + (a >> 31)
    return (a & P) + (a >> 31)


def _canon(a: np.ndarray) -> np.ndarray:
    """Canonical representative in [0, p) of values in [0, 2**62]."""
    a = _fold(a)
    return np.where(a >= P, a - P, a)


def n_limbs(length: int) -> int:
    return max(1, math.ceil(8 * length / LIMB_BITS))


def _limb_values(secret: bytes) -> list[int]:
    """The secret read as a big-endian integer, cut into 30-bit limbs, least significant first."""
    value, mask = int.from_bytes(secret, "big"), (1 << LIMB_BITS) - 1
    return [(value >> shift) & mask for shift in range(0, LIMB_BITS * n_limbs(len(secret)), LIMB_BITS)]


def _from_limbs(limbs: np.ndarray, length: int) -> bytes:
    return from_limb_rows(np.asarray(limbs)[None, :], length)[0]


def from_limb_rows(limbs: np.ndarray, length: int) -> list[bytes]:
    """The secrets of ``length`` bytes whose limbs are the rows of ``limbs`` (shape
    ``(G, m)``): one range check for all rows, then each row's integer. ``ShareError`` if a
    limb is out of range or a value longer than the secret (inconsistent shares)."""
    if limbs.size and (limbs.max() >= (1 << LIMB_BITS) or limbs.min() < 0):
        raise ShareError("shares are inconsistent (a reconstructed limb is out of range): a share was tampered with or mixed from different secrets.")
    shifts = [LIMB_BITS * i for i in range(limbs.shape[1])]
    limit = 1 << (8 * length)
    out = []
    for row in limbs.tolist():
        value = 0
        for limb, shift in zip(row, shifts):
            value |= limb << shift
        if value >= limit:
            raise ShareError("shares are inconsistent (the reconstructed value is longer than the secret).")
        out.append(value.to_bytes(length, "big"))
    return out


def random_field_elements(shape) -> np.ndarray:
    """Uniform elements of GF(p) from the OS CSPRNG (rejection sampling of 31-bit words)."""
    count = int(np.prod(shape, dtype=np.int64))
    out = np.frombuffer(os.urandom(4 * count), dtype="<u4").astype(np.int64) & 0x7FFFFFFF
    bad = out == P
    while np.any(bad):
        k = int(bad.sum())
        out[bad] = np.frombuffer(os.urandom(4 * k), dtype="<u4").astype(np.int64) & 0x7FFFFFFF
        bad = out == P
    return out.reshape(shape)


def _check_xs(xs) -> np.ndarray:
    try:
        arr = np.asarray([int(x) for x in xs], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"xs must be a sequence of ints in [1, {P - 1}], got {xs!r}.") from None
    if arr.size == 0:
        raise InputError("xs is empty: give one evaluation point per share holder.")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 1 or hi >= P:
        raise InputError(f"xs must lie in [1, {P - 1}] (x = 0 would reveal the secret); got min {lo}, max {hi}.")
    if len(set(arr.tolist())) != arr.size:  # a set: ~10x cheaper than np.unique for a client's ~50 points
        raise InputError("xs contains duplicates; each share holder needs a distinct evaluation point.")
    return arr


def _check_threshold(threshold, n: int) -> int:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, np.integer)):
        raise InputError(f"threshold must be an int, got {threshold!r}.")
    t = int(threshold)
    if not 1 <= t <= n:
        raise InputError(f"threshold={t} must be between 1 and the number of share holders ({n}).")
    return t


def mulmod_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact ``(a @ b) mod p`` for int64 matrices with entries in [0, p), via float64 BLAS:
    :func:`_matmul_split_b` for inner sizes up to ``SMALL_INNER`` (a client's threshold in
    the sparse graph), :func:`_matmul_split_both` above. Both return the exact values."""
    if a.shape[-1] <= SMALL_INNER:
        return _matmul_split_b(a, b)
    return _matmul_split_both(a, b)


def _matmul_split_b(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(a @ b) mod p`` for inner sizes up to ``SMALL_INNER``: only ``b`` is split into
    16-bit halves, side by side in one float64 matrix, so one product gives both partial
    results; each is a sum of at most 64 products below ``2**31 * 2**16``, i.e. below
    ``2**53`` (exact in float64), and the two are recombined modulo p."""
    if a.shape[-1] > SMALL_INNER:
        raise InputError(f"_matmul_split_b supports inner dimensions up to {SMALL_INNER}.")
    m = b.shape[-1]
    halves = np.empty(b.shape[:-1] + (2 * m,), dtype=np.float64)
    halves[..., :m] = b >> 16
    halves[..., m:] = b & 0xFFFF
    r = (a.astype(np.float64) @ halves).astype(np.int64)
    return (r[..., :m] % P * 65536 + r[..., m:]) % P


def _matmul_split_both(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(a @ b) mod p`` for inner sizes below ``2**20``: both operands are split into
    16-bit halves, so every partial product is below ``2**32`` and every float64 dot product
    below ``2**52`` (exact); the four partial products are recombined modulo p
    (``2**32 = 2 mod p``)."""
    if a.shape[-1] >= 2**20:
        raise InputError("mulmod_matmul supports inner dimensions below 2**20.")
    ah, al = (a >> 16).astype(np.float64), (a & 0xFFFF).astype(np.float64)
    bh, bl = (b >> 16).astype(np.float64), (b & 0xFFFF).astype(np.float64)
    hh = _fold((ah @ bh).astype(np.int64))
    mid = _fold((ah @ bl).astype(np.int64) + (al @ bh).astype(np.int64))
    ll = _fold((al @ bl).astype(np.int64))
    return _canon(hh * 2 + mid * 65536 + ll)


def vandermonde(xs: np.ndarray, t: int) -> np.ndarray:
    """``V[i, j] = xs[i]**j mod p`` for j < t, in about ``2 sqrt(t)`` vector steps: the
    first block of ``b ~ sqrt(t)`` powers column by column, then each further block as the
    previous one times ``x**b`` (products of two values below p stay below ``2**62``)."""
    n = xs.size
    b = math.isqrt(max(t - 1, 0)) + 1
    nb = -(-t // b)
    v = np.empty((n, nb * b), dtype=np.int64)
    v[:, 0] = 1
    for j in range(1, b):
        np.remainder(v[:, j - 1] * xs, P, out=v[:, j])
    step = v[:, b - 1] * xs % P  # x**b
    for k in range(1, nb):
        np.remainder(v[:, (k - 1) * b : k * b] * step[:, None], P, out=v[:, k * b : (k + 1) * b])
    return v[:, :t]


def _evaluate(coeffs: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Evaluate polynomials ``coeffs`` (shape (t, m), coeffs[0] = constant terms) at ``xs``."""
    return mulmod_matmul(vandermonde(xs, coeffs.shape[0]), coeffs)


def _secret_limbs(secrets: Sequence[bytes]) -> tuple[list[bytes], list[int], np.ndarray]:
    secrets = [bytes(s) for s in secrets]
    for s in secrets:
        if not 1 <= len(s) <= 0xFFFF:
            raise InputError(f"each secret must be 1..65535 bytes, got {len(s)}.")
    limbs = [_limb_values(s) for s in secrets]  # one array for all: no per-secret numpy call
    return secrets, [len(x) for x in limbs], np.array([v for x in limbs for v in x], dtype=np.int64)


def _serialise(secrets: list[bytes], sizes: list[int], xs_arr: np.ndarray, ys: np.ndarray) -> list[list[bytes]]:
    """``out[j][i]``: the share of ``secrets[j]`` at ``xs_arr[i]`` from the limb values ``ys``
    (the columns of the secrets' limbs, in order)."""
    offsets = np.cumsum([0] + sizes)
    return [_serialise_joined([s], [m], xs_arr, ys[:, offsets[j] : offsets[j] + m])
            for j, (s, m) in enumerate(zip(secrets, sizes))]


def _serialise_joined(secrets: list[bytes], sizes: list[int], xs_arr: np.ndarray, ys: np.ndarray) -> list[bytes]:
    """``out[i]``: the shares of all ``secrets`` at ``xs_arr[i]``, concatenated in order, from
    one record array: per secret a header "<IH" (x, length) and its limbs, the byte layout
    of ``_HEADER.pack(x, len) + limbs.tobytes()``."""
    fields = []
    for j, m in enumerate(sizes):
        fields += [(f"x{j}", "<u4"), (f"len{j}", "<u2"), (f"ys{j}", "<u4", (m,))]
    rec = np.empty(xs_arr.size, dtype=np.dtype(fields))
    ys, offset = ys.astype("<u4"), 0
    for j, (s, m) in enumerate(zip(secrets, sizes)):
        rec[f"x{j}"], rec[f"len{j}"], rec[f"ys{j}"] = xs_arr, len(s), ys[:, offset : offset + m]
        offset += m
    raw, size = rec.tobytes(), rec.dtype.itemsize
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def share_many(secrets: Sequence[bytes], threshold: int, xs: Sequence[int]) -> list[list[bytes]]:
    """Share several secrets at once; returns ``out[j][i]`` = share of ``secrets[j]`` for ``xs[i]``.

    One matrix product evaluates every limb of every secret at every point, so sharing two
    32-byte secrets among 1000 holders is one ``(1000, t) @ (t, 18)`` product.
    """
    xs_arr = _check_xs(xs)
    t = _check_threshold(threshold, xs_arr.size)
    secrets, sizes, consts = _secret_limbs(secrets)
    coeffs = np.empty((t, consts.size), dtype=np.int64)
    coeffs[0] = consts
    if t > 1:
        coeffs[1:] = random_field_elements((t - 1, consts.size))
    return _serialise(secrets, sizes, xs_arr, _evaluate(coeffs, xs_arr))


def share_rows(xs_rows, threshold: int, secret_rows, chunk_elems: int = 1 << 20) -> list[list[bytes]]:
    """Many dealers' sharings at once: dealer ``i`` shares its secrets ``secret_rows[i]``
    (the same number and lengths for every dealer) ``threshold``-of-``m`` at its row of
    points ``xs_rows[i]`` (shape ``(N, m)``). ``out[i][j]``: dealer ``i``'s shares at its
    ``j``-th point in ascending order, one per secret, concatenated -- the bytes of
    ``b"".join(share_many(secret_rows[i], threshold, sorted(xs_rows[i]))[s][j] for s)`` had
    ``share_many`` drawn the same coefficients.

    The random parts ``sum_{j=1}^{t-1} a_j x**j mod p`` of all rows are computed together:
    one Vandermonde matrix and one product when every row holds the same points (the
    complete graph), else chunks of rows as stacked products (the sparse graph: every
    client's holders differ); then the secrets' limbs are added and every share of every
    dealer is serialised from one record array per chunk of rows.
    """
    xs_rows = np.asarray(xs_rows)
    if xs_rows.ndim != 2 or xs_rows.shape[1] == 0:
        raise InputError("xs_rows must be a non-empty 2-D array: one row of points per dealer.")
    xs_rows = np.sort(xs_rows.astype(np.int64), axis=1)
    n, m = xs_rows.shape
    if n and (xs_rows.min() < 1 or xs_rows.max() >= P):
        raise InputError(f"xs must lie in [1, {P - 1}] (x = 0 would reveal the secret).")
    if m > 1 and np.any(xs_rows[:, 1:] == xs_rows[:, :-1]):
        raise InputError("xs contains duplicates; each share holder needs a distinct evaluation point.")
    t = _check_threshold(threshold, m)
    if len(secret_rows) != n:
        raise InputError(f"secret_rows has {len(secret_rows)} rows for {n} rows of points: one per dealer.")
    if not n:
        return []
    limbs = [_secret_limbs(row) for row in secret_rows]
    secrets, sizes, _ = limbs[0]
    if any([len(x) for x in row] != [len(x) for x in secrets] for row, _, _ in limbs):
        raise InputError("secret_rows: every dealer must share as many secrets as the others, of the same lengths.")
    consts = np.stack([c for _, _, c in limbs])  # (N, width)
    width = consts.shape[1]
    same = n > 1 and bool(np.all(xs_rows == xs_rows[0]))
    out: list[list[bytes]] = []
    step = max(1, chunk_elems // (m * width))  # rows per chunk: bounded scratch memory
    for s in range(0, n, step):
        rows = xs_rows[s : s + step]
        ys = _random_parts(rows, t, width, chunk_elems, same).astype(np.int64)
        ys += consts[s : s + step, None, :]
        ys %= P
        flat = _serialise_joined(secrets, sizes, rows.reshape(-1), ys.reshape(-1, width))
        out += [flat[i : i + m] for i in range(0, len(flat), m)]
    return out


def _random_parts(xs_rows: np.ndarray, t: int, width: int, chunk_elems: int, same: bool) -> np.ndarray:
    """``(N, m, width)``: each row's fresh random polynomials' values minus their constant
    terms at its points (``same``: every row holds the same points)."""
    n, m = xs_rows.shape
    parts = np.zeros((n, m, width), dtype=np.uint32)
    if t > 1 and n:
        if same:
            v = vandermonde(xs_rows[0], t)[:, 1:]  # (m, t - 1): x**1 .. x**(t-1)
            step = max(1, chunk_elems // ((t - 1) * width + m * width))
            for s in range(0, n, step):
                c = min(step, n - s)
                coeffs = random_field_elements((t - 1, c * width))  # column block r: dealer s + r
                parts[s : s + c] = mulmod_matmul(v, coeffs).reshape(m, c, width).transpose(1, 0, 2)
        else:
            step = max(1, chunk_elems // (m * max(t, 2 * width)))
            for s in range(0, n, step):
                rows = xs_rows[s : s + step]
                c = len(rows)
                v = vandermonde(rows.reshape(-1), t)[:, 1:].reshape(c, m, t - 1)
                parts[s : s + c] = mulmod_matmul(v, random_field_elements((c, t - 1, width)))
    return parts


def share(secret: bytes, threshold: int, xs: Sequence[int]) -> list[bytes]:
    """Split ``secret`` into ``len(xs)`` shares, any ``threshold`` of which reconstruct it."""
    return share_many([secret], threshold, xs)[0]


def parse_share(sh: bytes) -> tuple[int, int, np.ndarray]:
    """``(x, secret_length, limb values)`` of one share."""
    if not isinstance(sh, (bytes, bytearray)) or len(sh) < _HEADER.size:
        raise ShareError("a share must be bytes produced by protocols.shamir.share.")
    x, length = _HEADER.unpack_from(sh)
    ys = np.frombuffer(sh, dtype="<u4", offset=_HEADER.size).astype(np.int64)
    if ys.size != n_limbs(length) or not 1 <= x < P or np.any(ys >= P):
        raise ShareError("malformed share (wrong size, x or limb values).")
    return x, length, ys


def _prod_mod(a: np.ndarray) -> np.ndarray:
    """Product modulo p along the last axis, by pairwise (tree) reduction."""
    a = a % P
    while a.shape[-1] > 1:
        if a.shape[-1] % 2:
            a = np.concatenate([a, np.ones(a.shape[:-1] + (1,), dtype=np.int64)], axis=-1)
        a = a[..., 0::2] * a[..., 1::2] % P
    return a[..., 0]


def _inv_mod(values: np.ndarray) -> np.ndarray:
    """Modular inverses by batch inversion (one exponentiation for the whole vector)."""
    vals = [int(v) for v in values.tolist()]
    prefix, acc = [], 1
    for v in vals:
        prefix.append(acc)
        acc = acc * v % P
    inv_acc = pow(acc, P - 2, P)
    out = [0] * len(vals)
    for i in range(len(vals) - 1, -1, -1):
        out[i] = inv_acc * prefix[i] % P
        inv_acc = inv_acc * vals[i] % P
    return np.asarray(out, dtype=np.int64)


def parse_shares(shares: Sequence[bytes]) -> tuple[np.ndarray, int, np.ndarray]:
    """Bulk-parse shares of one secret: ``(xs, secret_length, ys of shape (len, m))``."""
    shares = list(shares)
    if not shares:
        raise ShareError("too few shares: none given.")
    first = shares[0]
    if not isinstance(first, (bytes, bytearray)) or len(first) < _HEADER.size:
        raise ShareError("a share must be bytes produced by protocols.shamir.share.")
    length = _HEADER.unpack_from(first)[1]
    m = n_limbs(length)
    size = _HEADER.size + 4 * m
    if any(not isinstance(s, (bytes, bytearray)) or len(s) != size for s in shares):
        raise ShareError("shares of different secrets were mixed or a share is malformed (sizes differ).")
    dt = np.dtype([("x", "<u4"), ("len", "<u2"), ("ys", "<u4", (m,))])
    rec = np.frombuffer(b"".join(shares), dtype=dt)
    if np.any(rec["len"] != length):
        raise ShareError("shares of different secrets were mixed (different secret lengths).")
    xs = rec["x"].astype(np.int64)
    ys = rec["ys"].astype(np.int64).reshape(len(shares), m)
    if np.any(xs < 1) or np.any(xs >= P) or np.any(ys >= P):
        raise ShareError("malformed share (x or limb value out of range).")
    return xs, length, ys


def lagrange_at_zero(xs: Sequence[int]) -> np.ndarray:
    """Lagrange coefficients ``l_i = prod_{j != i} x_j / (x_j - x_i) mod p`` (interpolation at 0)."""
    x = np.asarray(xs, dtype=np.int64)
    diff = (x[None, :] - x[:, None]) % P  # diff[i, j] = x_j - x_i
    np.fill_diagonal(diff, 1)
    den = _prod_mod(diff)
    num = _prod_mod(x[None, :])[0] * _inv_mod(x) % P
    return num * _inv_mod(den) % P


def combine(lam: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """``sum_i lam_i * ys[i] mod p`` for ``ys`` of shape (t, M), exactly."""
    return mulmod_matmul(np.asarray(lam, dtype=np.int64)[None, :], np.asarray(ys, dtype=np.int64))[0]


def reconstruct(shares: Sequence[bytes], threshold: int) -> bytes:
    """Recover the secret from at least ``threshold`` shares (uses the first ``threshold``)."""
    return reconstruct_many([shares], threshold)[0]


def reconstruct_many(groups: Sequence[Sequence[bytes]], threshold: int) -> list[bytes]:
    """Reconstruct several secrets; shares held at the same points share one Lagrange solve."""
    t = _check_threshold(threshold, max(1, threshold))
    out: list[bytes | None] = [None] * len(groups)
    by_points: dict[tuple[int, ...], list[tuple[int, int, np.ndarray]]] = {}
    for gi, group in enumerate(groups):
        xs, length, ys = parse_shares(group)
        if np.unique(xs).size != xs.size:
            raise ShareError("duplicate shares: two shares have the same evaluation point x.")
        if xs.size < t:
            raise ShareError(f"too few shares: {xs.size} given, threshold {t} needed.")
        order = np.argsort(xs, kind="stable")[:t]
        key = tuple(xs[order].tolist())
        by_points.setdefault(key, []).append((gi, length, ys[order]))
    for key, items in by_points.items():
        lam = lagrange_at_zero(key)
        stacked = np.concatenate([ys for _, _, ys in items], axis=1)
        limbs = combine(lam, stacked)
        offset = 0
        for gi, length, ys in items:
            m = ys.shape[1]
            out[gi] = _from_limbs(limbs[offset : offset + m], length)
            offset += m
    return out  # type: ignore[return-value]
