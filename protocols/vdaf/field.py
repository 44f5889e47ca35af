"""Prime fields of the VDAF draft (draft-irtf-cfrg-vdaf-20, Sec. 6.1).

Field elements are plain Python ``int`` values in ``[0, MODULUS)``; a field is a class whose
class methods do the arithmetic, the byte encoding (Sec. 6.1.1: little-endian, ``ENCODED_SIZE``
bytes, a decoded value ``>= MODULUS`` is refused) and the number theoretic transform of an
NTT-friendly field (Sec. 6.1.2). The Lagrange-basis polynomial operations of Sec. 6.1.3 are
in :class:`Lagrange`. Integers keep the arithmetic exact at any size; there is no rounding.
"""
from __future__ import annotations

import operator
from functools import lru_cache

import numpy as np


class FieldDecodeError(ValueError):
    """A byte string is not a canonical encoding of a vector of field elements."""


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` (``n >= 1``)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return 1 << (n - 1).bit_length()


def assert_power_of_2(n: int) -> int:
    """``log2(n)``; raises ValueError if ``n`` is not a power of two."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"length {n} must be a power of two")
    return n.bit_length() - 1


class Field:
    """Base class: a prime field with elements as ints (Sec. 6.1)."""

    MODULUS: int
    ENCODED_SIZE: int
    GEN_ORDER: int = 0
    GENERATOR: int = 0

    @classmethod
    def zeros(cls, length: int) -> list[int]:
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        return [0] * length

    @classmethod
    def inv(cls, x: int) -> int:
        if x % cls.MODULUS == 0:
            raise ZeroDivisionError("inverse of zero")
        return pow(x, cls.MODULUS - 2, cls.MODULUS)

    @classmethod
    def encode_vec(cls, vec) -> bytes:
        size = cls.ENCODED_SIZE
        return b"".join(int(x).to_bytes(size, "little") for x in vec)

    @classmethod
    def decode_vec(cls, encoded: bytes) -> list[int]:
        """Sec. 6.1.1 decode_vec: raises FieldDecodeError on a bad length or a value >= p."""
        size = cls.ENCODED_SIZE
        if len(encoded) % size:
            raise FieldDecodeError(
                f"encoded length {len(encoded)} is not a multiple of {cls.__name__}.ENCODED_SIZE={size}")
        p = cls.MODULUS
        out = [int.from_bytes(encoded[i:i + size], "little") for i in range(0, len(encoded), size)]
        for x in out:
            if x >= p:
                raise FieldDecodeError(f"non-canonical {cls.__name__} element (value >= modulus)")
        return out

    # --- NTT-friendly interface (Sec. 6.1.2) ---------------------------------------------
    @classmethod
    def gen(cls) -> int:
        return cls.GENERATOR

    @classmethod
    def nth_root(cls, n: int) -> int:
        assert_power_of_2(n)
        if n > cls.GEN_ORDER:
            raise ValueError(f"n={n} exceeds GEN_ORDER of {cls.__name__}")
        return pow(cls.GENERATOR, cls.GEN_ORDER // n, cls.MODULUS)

    @classmethod
    def nth_root_powers(cls, n: int) -> list[int]:
        return list(_root_powers(cls, n))

    @classmethod
    def ntt(cls, p: list[int], n: int, set_s: bool = False) -> list[int]:
        """Evaluations ``v[i] = p(Wn**i)`` (or ``p(s * Wn**i)``, ``s = W_{2n}``, if set_s)."""
        if len(p) > n:
            raise ValueError(f"polynomial of length {len(p)} does not fit n={n} points")
        q = cls.MODULUS
        a = list(p) + [0] * (n - len(p))
        if set_s:
            a = [x * f % q for x, f in zip(a, _root_powers(cls, 2 * n))]
        return _dft(cls, a, _root_powers(cls, n))

    @classmethod
    def inv_ntt(cls, v: list[int], n: int) -> list[int]:
        """Coefficients of the polynomial whose values at the powers of ``Wn`` are ``v``."""
        if len(v) != n:
            raise ValueError(f"inv_ntt needs exactly n={n} values, got {len(v)}")
        q = cls.MODULUS
        out = _dft(cls, list(v), _inv_root_powers(cls, n))
        n_inv = cls.inv(n)
        return [x * n_inv % q for x in out]


def dft_rows(field, rows, inverse: bool = False, twist: bool = False):
    """Row-wise NTT of a 2-D object array of ints (exact; numpy object arithmetic).

    Row ``r`` of the result equals ``field.ntt(rows[r], n, set_s=twist)`` (or
    ``field.inv_ntt(rows[r], n)`` if ``inverse``); it batches the butterflies of all rows.
    """
    q = field.MODULUS
    a = np.array(rows, dtype=object)
    if a.ndim != 2:
        raise ValueError("dft_rows needs a 2-D array of rows")
    m, n = a.shape
    log_n = assert_power_of_2(n)
    if twist:
        a = a * np.array(_root_powers(field, 2 * n)[:n], dtype=object) % q
    powers = _inv_root_powers(field, n) if inverse else _root_powers(field, n)
    if n > 1:
        a = a[:, list(_bit_reversal(log_n))]
    length = 2
    while length <= n:
        half = length // 2
        tw = np.array(powers[::n // length][:half], dtype=object)
        b = a.reshape(m, n // length, length)
        u = b[:, :, :half]
        v = b[:, :, half:] * tw % q
        a = np.concatenate([(u + v) % q, (u - v) % q], axis=2).reshape(m, n)
        length *= 2
    if inverse:
        a = a * field.inv(n) % q
    return a


@lru_cache(maxsize=None)
def _root_powers(field, n: int) -> tuple:
    w = field.nth_root(n)
    q = field.MODULUS
    out, x = [], 1
    for _ in range(n):
        out.append(x)
        x = x * w % q
    return tuple(out)


@lru_cache(maxsize=None)
def _inv_root_powers(field, n: int) -> tuple:
    pw = _root_powers(field, n)
    return tuple([pw[0]] + [pw[n - i] for i in range(1, n)])


@lru_cache(maxsize=None)
def _bit_reversal(log_n: int) -> tuple:
    """``perm[j]`` = the index whose bit-reversal is ``j`` (an involution)."""
    return tuple(int(format(i, f"0{log_n}b")[::-1], 2) for i in range(1 << log_n)) if log_n else (0,)


def _dft(field, a: list[int], powers: tuple) -> list[int]:
    """Iterative radix-2 Cooley-Tukey DFT: ``out[i] = sum_j a[j] * w**(i*j)``."""
    n = len(a)
    if n == 1:
        return a
    q = field.MODULUS
    log_n = assert_power_of_2(n)
    out = [a[i] for i in _bit_reversal(log_n)]
    length = 2
    while length <= n:
        half = length // 2
        tw = powers[::n // length][:half]
        if half <= n // length:
            # loop over the butterfly position j; every block's j-th pair at once
            for j in range(half):
                t = tw[j]
                u = out[j::length]
                v = [x * t % q for x in out[j + half::length]]
                out[j::length] = [(x + y) % q for x, y in zip(u, v)]
                out[j + half::length] = [(x - y) % q for x, y in zip(u, v)]
        else:
            for start in range(0, n, length):
                u = out[start:start + half]
                v = [x * t % q for x, t in zip(out[start + half:start + length], tw)]
                out[start:start + half] = [(x + y) % q for x, y in zip(u, v)]
                out[start + half:start + length] = [(x - y) % q for x, y in zip(u, v)]
        length *= 2
    return out


class Field64(Field):
    """p = 2**32 * 4294967295 + 1, generator 7**4294967295 of order 2**32 (Table 3)."""

    MODULUS = 2**32 * 4294967295 + 1
    ENCODED_SIZE = 8
    GEN_ORDER = 2**32
    GENERATOR = pow(7, 4294967295, MODULUS)


class Field128(Field):
    """p = 2**66 * 4611686018427387897 + 1, generator 7**4611686018427387897 of order 2**66."""

    MODULUS = 2**66 * 4611686018427387897 + 1
    ENCODED_SIZE = 16
    GEN_ORDER = 2**66
    GENERATOR = pow(7, 4611686018427387897, MODULUS)


def _batch_inverse(q: int, xs: list[int]) -> list[int]:
    """Inverses of non-zero ``xs`` mod prime ``q`` with one exponentiation."""
    prefix, acc = [], 1
    for x in xs:
        prefix.append(acc)
        acc = acc * x % q
    inv = pow(acc, q - 2, q)
    out = [0] * len(xs)
    for i in range(len(xs) - 1, -1, -1):
        out[i] = prefix[i] * inv % q
        inv = inv * xs[i] % q
    return out


def vec_add(field, left, right):
    if len(left) != len(right):
        raise ValueError(f"mismatched vector sizes {len(left)} and {len(right)}")
    q = field.MODULUS
    return [(x + y) % q for x, y in zip(left, right)]


def vec_sub(field, left, right):
    if len(left) != len(right):
        raise ValueError(f"mismatched vector sizes {len(left)} and {len(right)}")
    q = field.MODULUS
    return [(x - y) % q for x, y in zip(left, right)]


def poly_eval(field, p: list[int], x: int) -> int:
    """Horner evaluation of a monomial-basis polynomial (Sec. 6.1.3.1)."""
    q = field.MODULUS
    out = 0
    for c in reversed(p):
        out = (out * x + c) % q
    return out


class Lagrange:
    """Polynomials as values at the powers of the principal n-th root of unity (Sec. 6.1.3.2)."""

    def __init__(self, field):
        self.field = field

    def poly_mul(self, p: list[int], q_: list[int]) -> list[int]:
        n = len(p)
        assert_power_of_2(n)
        if len(q_) != n:
            raise ValueError("poly_mul operands must have equal length")
        q = self.field.MODULUS
        a, b = self.double_evaluations(p), self.double_evaluations(q_)
        return [x * y % q for x, y in zip(a, b)]

    def poly_eval(self, p: list[int], x: int) -> int:
        return self.poly_eval_batched([p], x)[0]

    def poly_eval_batched(self, polys: list[list[int]], x: int) -> list[int]:
        """Evaluate each polynomial (given by its values at the n-th roots) at ``x`` in O(n).

        Barycentric form at the n-th roots of unity ``w_i``:
        ``p(x) = (x**n - 1) / n * sum_i p_i w_i / (x - w_i)``; the weights are shared by every
        polynomial (one batch inversion), so each costs n products and one reduction.
        """
        n = len(polys[0])
        if any(len(p) != n for p in polys):
            raise ValueError("poly_eval_batched needs polynomials of equal length")
        assert_power_of_2(n)
        F = self.field
        q = F.MODULUS
        x %= q
        nodes = _root_powers(F, n)
        scale = (pow(x, n, q) - 1) % q
        if scale == 0:  # x is a root: the polynomial's value there
            i = nodes.index(x)
            return [p[i] % q for p in polys]
        inv = _batch_inverse(q, [(x - w) % q for w in nodes])
        c = scale * F.inv(n) % q
        weights = [w * iv % q * c % q for w, iv in zip(nodes, inv)]
        mul = operator.mul
        return [sum(map(mul, weights, p)) % q for p in polys]

    def extend_values_to_power_of_2(self, p: list[int], n: int) -> None:
        """Append values of the degree < len(p) polynomial through ``p`` until len(p) == n.

        Same values as the draft's incremental barycentric algorithm (Sec. 6.1.3.2), computed
        by Lagrange interpolation at the missing roots ``x_k`` with the closed-form weights
        of the n-th roots of unity: ``prod_{j != i, j < n} (x_i - x_j) = n / x_i`` (the
        derivative of ``X**n - 1``), divided by the factors of the missing points. O(n * r)
        for r missing values, one field inversion.
        """
        assert_power_of_2(n)
        m = len(p)
        if m > n:
            raise ValueError("polynomial already longer than n")
        if m == n:
            return
        F = self.field
        q = F.MODULUS
        x = _root_powers(F, n)
        missing = range(m, n)
        # w_i = prod_{j < m, j != i} (x_i - x_j) = (n / x_i) / prod_{j >= m} (x_i - x_j)
        den = []
        for i in range(m):
            d = 1
            for j in missing:
                d = d * (x[i] - x[j]) % q
            den.append(d)
        # invert w_i and (x_k - x_i) for all i, k with one inversion (Montgomery's trick)
        # n / x_i = n * x_{n-i}; its inverse times den_i is 1 / w_i
        to_inv = [n * x[(n - i) % n] % q for i in range(m)]
        for k in missing:
            to_inv += [(x[k] - x[i]) % q for i in range(m)]
        inv = _batch_inverse(q, to_inv)
        winv = [inv[i] * den[i] % q for i in range(m)]  # 1 / w_i
        for idx, k in enumerate(missing):
            base = m * (idx + 1)
            lk = 1
            for j in range(m):
                lk = lk * (x[k] - x[j]) % q
            acc = 0
            for i in range(m):
                acc += p[i] * winv[i] % q * inv[base + i]
            p.append(lk * acc % q)

    def double_evaluations_rows(self, rows):
        """:meth:`double_evaluations` of every row of a 2-D array at once (object array)."""
        F = self.field
        rows = np.array(rows, dtype=object)
        odd = dft_rows(F, dft_rows(F, rows, inverse=True), twist=True)
        m, n = rows.shape
        out = np.empty((m, 2 * n), dtype=object)
        out[:, 0::2] = rows
        out[:, 1::2] = odd
        return out

    def double_evaluations(self, p: list[int]) -> list[int]:
        """2n values (at the 2n-th roots) from n values at the n-th roots."""
        n = len(p)
        assert_power_of_2(n)
        F = self.field
        odd = F.ntt(F.inv_ntt(p, n), n, True)
        out = [0] * (2 * n)
        out[0::2] = p
        out[1::2] = odd
        return out
