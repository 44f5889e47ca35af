"""Validity circuits: the draft's Prio3 variants (draft-irtf-cfrg-vdaf-20, Sec. 7.4) and
:class:`ClusterValidity`, the clustering-update circuit of this library.

All circuits follow the ``Valid`` interface of Sec. 7.3.2 (:class:`protocols.vdaf.flp.Valid`)
so :class:`protocols.vdaf.prio3.Prio3` runs them unchanged.
"""
from __future__ import annotations

import operator

import numpy as np

from .field import Field64, Field128
from .flp import Mul, ParallelSum, PolyEval, Valid


def encode_range_checked_int(field, value: int, max_measurement: int) -> list[int]:
    """Sec. 7.4.2: bits with weights 1, 2, ..., 2**(b-2) and a last weight making the total
    ``max_measurement``; every value in ``[0, max_measurement]`` (and only those) has one."""
    value = int(value)
    if value < 0:
        raise ValueError(f"measurement {value} is negative; it must be in [0, {max_measurement}]")
    if value > max_measurement:
        raise ValueError(f"measurement {value} exceeds max_measurement={max_measurement}")
    bits = max_measurement.bit_length()
    rest_all_ones = 2 ** (bits - 1) - 1
    last_weight = max_measurement - rest_all_ones
    if value <= rest_all_ones:
        rest, last = value, 0
    else:
        rest, last = value - last_weight, 1
    return [(rest >> i) & 1 for i in range(bits - 1)] + [last]


def decode_range_checked_int(field, encoded: list[int], max_measurement: int) -> int:
    """The linear inverse of :func:`encode_range_checked_int` (works on shares)."""
    bits = max_measurement.bit_length()
    last_weight = max_measurement - (2 ** (bits - 1) - 1)
    q = field.MODULUS
    out = sum((1 << i) * b for i, b in enumerate(encoded[:bits - 1]))
    return (out + last_weight * encoded[bits - 1]) % q


def _range_check(valid, meas, joint_rand, num_shares, chunk_length, n_calls) -> int:
    """SumVec's batched bit check: sum_i ParallelSum_i(r_i**j * x - x * (x - 1/shares))."""
    F = valid.field
    q = F.MODULUS
    shares_inv = F.inv(num_shares)
    out = 0
    g = valid.GADGETS[0]
    for i in range(n_calls):
        r = joint_rand[i]
        xs = list(meas[i * chunk_length:(i + 1) * chunk_length])
        xs += [0] * (chunk_length - len(xs))
        powers = [r] * chunk_length
        for j in range(1, chunk_length):
            powers[j] = powers[j - 1] * r % q
        inputs = [0] * (2 * chunk_length)
        inputs[0::2] = [p * x % q for p, x in zip(powers, xs)]
        inputs[1::2] = [(x - shares_inv) % q for x in xs]
        out += g.eval(F, inputs)
    return out % q


class Count(Valid):
    """Sec. 7.4.1: a 0/1 counter, ``Mul(x, x) - x``."""

    MEAS_LEN = 1
    JOINT_RAND_LEN = 0
    OUTPUT_LEN = 1
    EVAL_OUTPUT_LEN = 1

    def __init__(self, field=Field64):
        self.field = field
        self.GADGETS = [Mul()]
        self.GADGET_CALLS = [1]

    def encode(self, measurement):
        if measurement not in (0, 1, True, False):
            raise ValueError(f"Count measurement must be 0 or 1, got {measurement!r}")
        return [int(measurement)]

    def eval(self, meas, joint_rand, num_shares):
        return [(self.GADGETS[0].eval(self.field, [meas[0], meas[0]]) - meas[0]) % self.field.MODULUS]

    def truncate(self, meas):
        return list(meas)

    def decode(self, output, num_measurements):
        return output[0]


class Sum(Valid):
    """Sec. 7.4.2: an integer in ``[0, max_measurement]`` as range-checked bits, PolyEval x^2-x."""

    JOINT_RAND_LEN = 0
    OUTPUT_LEN = 1

    def __init__(self, field=Field64, max_measurement: int = 1):
        if max_measurement < 1:
            raise ValueError(f"max_measurement must be >= 1, got {max_measurement}")
        self.field = field
        self.max_measurement = max_measurement
        self.bits = max_measurement.bit_length()
        self.GADGETS = [PolyEval([0, -1, 1], self.bits)]
        self.GADGET_CALLS = [self.bits]
        self.MEAS_LEN = self.bits
        self.EVAL_OUTPUT_LEN = self.bits

    def encode(self, measurement):
        return encode_range_checked_int(self.field, measurement, self.max_measurement)

    def eval(self, meas, joint_rand, num_shares):
        return [self.GADGETS[0].eval(self.field, [b]) for b in meas]

    def truncate(self, meas):
        return [decode_range_checked_int(self.field, meas, self.max_measurement)]

    def decode(self, output, num_measurements):
        return output[0]


class SumVec(Valid):
    """Sec. 7.4.3: ``length`` integers in ``[0, max_measurement]``; ParallelSum(Mul) bit check."""

    EVAL_OUTPUT_LEN = 1

    def __init__(self, field=Field128, length: int = 1, max_measurement: int = 1, chunk_length: int = 1):
        if length < 1 or max_measurement < 1 or chunk_length < 1:
            raise ValueError("SumVec needs length, max_measurement and chunk_length >= 1")
        self.field = field
        self.length = length
        self.max_measurement = max_measurement
        self.bits = max_measurement.bit_length()
        self.chunk_length = chunk_length
        self.GADGETS = [ParallelSum(Mul(), chunk_length)]
        self.GADGET_CALLS = [(length * self.bits + chunk_length - 1) // chunk_length]
        self.MEAS_LEN = length * self.bits
        self.OUTPUT_LEN = length
        self.JOINT_RAND_LEN = self.GADGET_CALLS[0]

    def encode(self, measurement):
        if len(measurement) != self.length:
            raise ValueError(f"measurement length {len(measurement)} != length={self.length}")
        out = []
        for v in measurement:
            out += encode_range_checked_int(self.field, v, self.max_measurement)
        return out

    def eval(self, meas, joint_rand, num_shares):
        return [_range_check(self, meas, joint_rand, num_shares, self.chunk_length, self.GADGET_CALLS[0])]

    def truncate(self, meas):
        b = self.bits
        return [decode_range_checked_int(self.field, meas[i * b:(i + 1) * b], self.max_measurement)
                for i in range(self.length)]

    def decode(self, output, num_measurements):
        return list(output)


class Histogram(Valid):
    """Sec. 7.4.4: a one-hot vector; bit check plus ``sum - 1 = 0``."""

    EVAL_OUTPUT_LEN = 2

    def __init__(self, field=Field128, length: int = 1, chunk_length: int = 1):
        if length < 1 or chunk_length < 1:
            raise ValueError("Histogram needs length and chunk_length >= 1")
        self.field = field
        self.length = length
        self.chunk_length = chunk_length
        self.GADGETS = [ParallelSum(Mul(), chunk_length)]
        self.GADGET_CALLS = [(length + chunk_length - 1) // chunk_length]
        self.MEAS_LEN = length
        self.OUTPUT_LEN = length
        self.JOINT_RAND_LEN = self.GADGET_CALLS[0]

    def encode(self, measurement):
        if not 0 <= int(measurement) < self.length:
            raise ValueError(f"bucket {measurement} outside [0, length={self.length})")
        out = [0] * self.length
        out[int(measurement)] = 1
        return out

    def eval(self, meas, joint_rand, num_shares):
        F = self.field
        rc = _range_check(self, meas, joint_rand, num_shares, self.chunk_length, self.GADGET_CALLS[0])
        sc = (sum(meas) - F.inv(num_shares)) % F.MODULUS
        return [rc, sc]

    def truncate(self, meas):
        return list(meas)

    def decode(self, output, num_measurements):
        return list(output)


class MultihotCountVec(Valid):
    """Sec. 7.4.5: a 0/1 vector of weight at most ``max_weight`` (weight sent range-checked)."""

    EVAL_OUTPUT_LEN = 2

    def __init__(self, field=Field128, length: int = 1, max_weight: int = 1, chunk_length: int = 1):
        if length < 1 or chunk_length < 1 or not 0 < max_weight <= length:
            raise ValueError("MultihotCountVec needs length >= 1, 0 < max_weight <= length, chunk_length >= 1")
        if field.MODULUS <= length:
            raise ValueError("length is too large for the field")
        self.field = field
        self.length = length
        self.max_weight = max_weight
        self.bits_for_weight = max_weight.bit_length()
        self.chunk_length = chunk_length
        self.GADGETS = [ParallelSum(Mul(), chunk_length)]
        self.GADGET_CALLS = [(length + self.bits_for_weight + chunk_length - 1) // chunk_length]
        self.MEAS_LEN = length + self.bits_for_weight
        self.OUTPUT_LEN = length
        self.JOINT_RAND_LEN = self.GADGET_CALLS[0]

    def encode(self, measurement):
        if len(measurement) != self.length:
            raise ValueError(f"measurement length {len(measurement)} != length={self.length}")
        vec = [int(bool(x)) for x in measurement]
        return vec + encode_range_checked_int(self.field, sum(vec), self.max_weight)

    def eval(self, meas, joint_rand, num_shares):
        F = self.field
        rc = _range_check(self, meas, joint_rand, num_shares, self.chunk_length, self.GADGET_CALLS[0])
        weight = sum(meas[:self.length])
        reported = decode_range_checked_int(F, meas[self.length:], self.max_weight)
        return [rc, (weight - reported) % F.MODULUS]

    def truncate(self, meas):
        return list(meas[:self.length])

    def decode(self, output, num_measurements):
        return list(output)


#: 2**i for the binary digits of any value a circuit decodes
_POW2 = [1 << i for i in range(128)]


def _as_int(x, name: str) -> int:
    """An exact integer from an int-like value (numpy ints, integral floats); else ValueError."""
    if isinstance(x, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer, got a boolean")
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)) and float(x).is_integer():
        return int(x)
    raise ValueError(f"{name} must be an integer, got {x!r}")


def _bits(value: int, n: int) -> list[int]:
    return [(value >> i) & 1 for i in range(n)]


class ClusterValidity(Valid):
    """Validity circuit of one client's clustering update (k clusters, d features).

    Measurement ``(c, t)``: counts ``c`` (k ints) and shifted sums ``t`` (k x d ints,
    ``t[j][e] = s[j][e] - c[j] * lo_e`` in the encoded domain). Valid iff every ``c_j >= 0``,
    ``sum_j c_j <= n_max`` and every ``0 <= t[j][e] <= c_j * widths[e]``.

    Encoding (``MEAS_LEN = k*cb + cb + 2*k*sum_e B_e`` field elements, all 0/1):

    * ``cb = n_max.bit_length()`` binary digits of each ``c_j`` (LSB first);
    * the slack ``n_max - sum_j c_j`` in the draft's range-checked encoding with maximum
      ``n_max`` (Sec. 7.4.2, ``cb`` bits): it represents exactly the integers ``[0, n_max]``;
    * for each ``(j, e)``, ``B_e = (n_max * widths[e]).bit_length()`` binary digits of
      ``t[j][e]`` then ``B_e`` binary digits of the slack ``u = c_j * widths[e] - t[j][e]``.

    Circuit outputs (``EVAL_OUTPUT_LEN = 2 + k*d``; all zero iff valid):

    0. SumVec's batched bit check (Sec. 7.4.3): ``sum_i ParallelSum(Mul)`` over chunks of
       ``r_i**l * x_l * (x_l - 1)`` with joint randomness ``r_i``;
    1. ``sum_j c_j + slack - n_max`` (constant scaled by ``1/num_shares``);
    2. ``t[j][e] + u[j][e] - widths[e] * c_j`` for each ``(j, e)``.

    Soundness: output 0 is zero for a non-bit with probability at most
    ``chunk_length/|F|`` per call (the Schwartz-Zippel bound of BBCGGI19, Thm. 5.2). With all
    digits bits, ``c_j`` and ``slack`` are non-negative integers with
    ``sum c_j + slack <= k*2**cb + n_max < p``, so output 1 being zero mod p means the integer
    equation ``sum c_j + slack = n_max`` holds: ``sum c_j <= n_max`` and each ``c_j`` in
    ``[0, n_max]``. Then ``t + u < 2**(B_e+1) < p`` and ``widths[e] * c_j <= n_max * widths[e]
    < p``, so output 2 being zero means ``t + u = c_j * widths[e]`` over the integers with
    ``t, u >= 0``: ``0 <= t <= c_j * widths[e]``. The constructor checks these bounds.

    ``truncate`` returns ``[c_0..c_{k-1}, t_00..t_{k-1,d-1}]``; summed over ``n`` clients it is
    exact while ``n <= max_clients()`` (``n * n_max * max(widths) < p``).

    ``votes=(V, B)`` adds a vote histogram (DWF's robust aggregation): per cluster j and
    coordinate e, B bits ``v_jeb`` then a slack bit ``s_je``; the circuit checks (all bits by
    output 0) ``sum_b v_jeb + s_je = 1`` (k V outputs: at most one vote per coordinate) and
    ``sum_b v_jeb = sum_b v_j0b`` (k (V - 1) outputs: every coordinate of a cluster votes, or
    none); the measurement is then ``(counts, shifted_sums, votes)`` and ``truncate`` appends
    the k V B vote bits, so the aggregate is the clients' vote histogram.
    """

    EVAL_OUTPUT_LEN: int

    def __init__(self, k: int, d: int, n_max: int, widths, chunk_length: int | None = None, field=Field128,
                 n_clients: int | None = None, votes: tuple[int, int] | None = None):
        k, d, n_max = _as_int(k, "k"), _as_int(d, "d"), _as_int(n_max, "n_max")
        if votes is not None:
            try:
                vd, vb = (_as_int(x, "votes") for x in votes)
            except (TypeError, ValueError):
                raise ValueError(f"votes must be (coordinates, bins), got {votes!r}") from None
            if vd < 1 or vb < 2:
                raise ValueError(f"votes=(coordinates, bins) needs coordinates >= 1 and bins >= 2, got {votes!r}")
            votes = (vd, vb)
        self.votes = votes
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if d < 1:
            raise ValueError(f"d must be >= 1, got {d}")
        if n_max < 1:
            raise ValueError(f"n_max must be >= 1 (the client's record cap), got {n_max}")
        widths = [_as_int(w, "widths[e]") for w in widths]
        if len(widths) != d:
            raise ValueError(f"widths must have d={d} entries, got {len(widths)}")
        if any(w < 0 for w in widths):
            raise ValueError("widths must be non-negative (hi_e - lo_e in the encoded domain)")
        self.field = field
        self.k, self.d, self.n_max, self.widths = k, d, n_max, widths
        self.cb = n_max.bit_length()
        self.tb = [(n_max * w).bit_length() for w in widths]
        p = field.MODULUS
        top = max([n_max * w for w in widths] + [n_max])
        if 2 ** (max(self.tb + [0]) + 1) >= p or k * 2 ** self.cb + n_max >= p:
            raise ValueError(f"n_max={n_max} and widths (max {max(widths)}) are too large for {field.__name__}; "
                             "use a larger field or smaller widths")
        self._top = top
        if n_clients is not None:
            self.check_clients(n_clients)
        self._vote_len = 0 if votes is None else k * votes[0] * (votes[1] + 1)
        self.MEAS_LEN = k * self.cb + self.cb + 2 * k * sum(self.tb) + self._vote_len
        if chunk_length is None:
            chunk_length = self.best_chunk_length(self.MEAS_LEN)
        chunk_length = _as_int(chunk_length, "chunk_length")
        if chunk_length < 1:
            raise ValueError(f"chunk_length must be >= 1, got {chunk_length}")
        self.chunk_length = chunk_length
        self.GADGETS = [ParallelSum(Mul(), chunk_length)]
        self.GADGET_CALLS = [(self.MEAS_LEN + chunk_length - 1) // chunk_length]
        self.JOINT_RAND_LEN = self.GADGET_CALLS[0]
        vd, vb = votes or (0, 0)
        self.OUTPUT_LEN = k + k * d + k * vd * vb
        self.EVAL_OUTPUT_LEN = 2 + k * d + k * vd + k * max(vd - 1, 0)
        # offsets into the encoding
        self._slack_at = k * self.cb
        self._t_at = []
        pos = self._slack_at + self.cb
        for _j in range(k):
            row = []
            for e in range(d):
                row.append(pos)
                pos += 2 * self.tb[e]
            self._t_at.append(row)
        self._v_at = pos  # vote rows (j, e): vb bits then one slack bit each

    @staticmethod
    def best_chunk_length(meas_len: int) -> int:
        """The ParallelSum chunk length giving the shortest proof for ``meas_len`` bits.

        Proof length of one ParallelSum(Mul) gadget: ``2*chunk + 2*(p - 1) + 1`` with
        ``p = next_power_of_2(1 + ceil(meas_len / chunk))`` (Sec. 7.3.2); the draft leaves the
        choice to trial (Sec. 7.4.3.1), this searches every chunk length (ties: the larger,
        whose wire polynomials are shorter).
        """
        best, best_len = 1, None
        for ch in range(1, meas_len + 1):
            calls = -(-meas_len // ch)
            p = 1 << calls.bit_length()  # next_power_of_2(1 + calls)
            length = 2 * ch + 2 * (p - 1) + 1
            if best_len is None or length <= best_len:
                best, best_len = ch, length
        return best

    def max_clients(self) -> int:
        """Most clients whose summed outputs stay below the modulus (exact aggregation)."""
        return (self.field.MODULUS - 1) // self._top

    def check_clients(self, n_clients: int) -> None:
        n = _as_int(n_clients, "n_clients")
        if n * self._top >= self.field.MODULUS:
            raise ValueError(f"n_clients={n} x n_max={self.n_max} x max(widths)={max(self.widths)} wraps around "
                             f"{self.field.__name__}; at most max_clients()={self.max_clients()} clients")

    # --- encoding --------------------------------------------------------------------------
    def _split(self, measurement):
        """``(counts, shifted, votes or None)`` of a measurement of this circuit's form."""
        try:
            parts = tuple(measurement)
        except TypeError:
            parts = ()
        want = 2 if self.votes is None else 3
        if len(parts) != want:
            raise ValueError("measurement must be (counts, shifted_sums)" if self.votes is None else
                             "measurement must be (counts, shifted_sums, votes)")
        votes = None
        if self.votes is not None:
            vd, vb = self.votes
            votes = [[list(b) for b in row] for row in parts[2]]
            if len(votes) != self.k or any(len(r) != vd or any(len(b) != vb for b in r) for r in votes):
                raise ValueError(f"votes must be k x {vd} x {vb} = {self.k} x {vd} x {vb}")
            votes = [[[_as_int(x, "votes[j][e][b]") for x in b] for b in r] for r in votes]
        return parts[0], parts[1], votes

    def _check(self, measurement):
        counts, shifted, votes = self._split(measurement)
        counts = [_as_int(c, "counts[j]") for c in list(counts)]
        if len(counts) != self.k:
            raise ValueError(f"counts must have k={self.k} entries, got {len(counts)}")
        rows = [list(r) for r in list(shifted)]
        if len(rows) != self.k or any(len(r) != self.d for r in rows):
            raise ValueError(f"shifted sums must be k x d = {self.k} x {self.d}")
        rows = [[_as_int(x, "shifted[j][e]") for x in r] for r in rows]
        if any(c < 0 for c in counts):
            raise ValueError("counts must be non-negative")
        if sum(counts) > self.n_max:
            raise ValueError(f"sum of counts {sum(counts)} exceeds n_max={self.n_max}")
        for j in range(self.k):
            for e in range(self.d):
                if not 0 <= rows[j][e] <= counts[j] * self.widths[e]:
                    raise ValueError(f"shifted sum t[{j}][{e}]={rows[j][e]} outside [0, c_j*widths[e]="
                                     f"{counts[j] * self.widths[e]}]")
        if votes is not None:
            for j, row in enumerate(votes):
                totals = [sum(b) for b in row]
                if any(x not in (0, 1) for b in row for x in b) or any(t > 1 for t in totals):
                    raise ValueError(f"votes of cluster {j}: each coordinate holds at most one vote of 1")
                if len(set(totals)) > 1:
                    raise ValueError(f"votes of cluster {j}: every coordinate votes, or none")
        return counts, rows, votes

    def encode(self, measurement) -> list[int]:
        counts, rows, votes = self._check(measurement)
        return self.encode_lenient((counts, rows) if votes is None else (counts, rows, votes))

    def encode_lenient(self, measurement) -> list[int]:
        """The encoding of any integer measurement of the right shape, valid or not.

        Equal to :meth:`encode` for a valid measurement. An integer that its digits cannot
        hold as bits (negative, or at least ``2**digits``) is written as its value in the
        lowest digit and zeros above, so the encoding still satisfies every linear output
        (1 and 2) with the measurement's true values and only the bit check (output 0)
        fails: an invalid measurement then yields a report whose proof is rejected instead
        of an error at the client. A client whose update breaks the predicate (a lie, or a
        bug) is thereby caught where a malicious one would be: at verification.
        """
        counts, shifted, votes = self._split(measurement)
        counts = [_as_int(c, "counts[j]") for c in list(counts)]
        rows = [list(r) for r in list(shifted)]
        if len(counts) != self.k or len(rows) != self.k or any(len(r) != self.d for r in rows):
            raise ValueError(f"measurement must be k={self.k} counts and k x d = {self.k} x {self.d} shifted sums")
        rows = [[_as_int(x, "shifted[j][e]") for x in r] for r in rows]
        q = self.field.MODULUS

        def digits(v: int, b: int) -> list[int]:
            if b == 0:  # a zero-width column holds only 0
                return []
            return _bits(v, b) if 0 <= v < 2**b else [v % q] + [0] * (b - 1)

        out: list[int] = []
        for c in counts:
            out += digits(c, self.cb)
        slack = self.n_max - sum(counts)
        out += (encode_range_checked_int(self.field, slack, self.n_max) if 0 <= slack <= self.n_max
                else [slack % q] + [0] * (self.cb - 1))
        for j in range(self.k):
            for e in range(self.d):
                b = self.tb[e]
                out += digits(rows[j][e], b)
                out += digits(counts[j] * self.widths[e] - rows[j][e], b)
        for row in votes or ():
            for b in row:
                out += [x % q for x in b] + [(1 - sum(b)) % q]  # bits, and the slack 1 - sum
        return out

    def encode_parts(self, counts, rows, count_slack, sum_slacks) -> list[int]:
        """The encoding of given integers, unchecked; each is written with its digit count
        modulo 2**digits (``count_slack`` outside ``[0, n_max]`` is written as 0 bits). Used to
        build invalid encodings in tests; honest clients call :meth:`encode`."""
        out: list[int] = []
        for c in counts:
            out += _bits(int(c) % 2 ** self.cb, self.cb)
        if 0 <= count_slack <= self.n_max:
            out += encode_range_checked_int(self.field, count_slack, self.n_max)
        else:
            out += [0] * self.cb
        for j in range(self.k):
            for e in range(self.d):
                b = self.tb[e]
                out += _bits(int(rows[j][e]) % 2 ** b, b)
                out += _bits(int(sum_slacks[j][e]) % 2 ** b, b)
        return out

    # --- circuit ---------------------------------------------------------------------------
    def _counts(self, meas) -> list[int]:
        q, cb = self.field.MODULUS, self.cb
        pw = _POW2[:cb]
        return [sum(map(operator.mul, pw, meas[j * cb:(j + 1) * cb])) % q for j in range(self.k)]

    def _value(self, meas, pos, b) -> int:
        return sum(map(operator.mul, _POW2[:b], meas[pos:pos + b])) % self.field.MODULUS

    def eval(self, meas, joint_rand, num_shares):
        F = self.field
        q = F.MODULUS
        out = [_range_check(self, meas, joint_rand, num_shares, self.chunk_length, self.GADGET_CALLS[0])]
        counts = self._counts(meas)
        slack = decode_range_checked_int(F, meas[self._slack_at:self._slack_at + self.cb], self.n_max)
        out.append((sum(counts) + slack - self.n_max * F.inv(num_shares)) % q)
        for j in range(self.k):
            for e in range(self.d):
                b, pos = self.tb[e], self._t_at[j][e]
                t = self._value(meas, pos, b)
                u = self._value(meas, pos + b, b)
                out.append((t + u - self.widths[e] * counts[j]) % q)
        if self.votes is not None:
            vd, vb = self.votes
            one = F.inv(num_shares)
            pos = self._v_at
            totals = []
            for j in range(self.k):
                row = []
                for _e in range(vd):
                    total = sum(meas[pos:pos + vb]) % q
                    out.append((total + meas[pos + vb] - one) % q)  # sum of votes + slack = 1
                    row.append(total)
                    pos += vb + 1
                totals.append(row)
            for row in totals:  # every coordinate of a cluster votes, or none
                out += [(t - row[0]) % q for t in row[1:]]
        return out

    def truncate(self, meas):
        out = self._counts(meas)
        for j in range(self.k):
            for e in range(self.d):
                out.append(self._value(meas, self._t_at[j][e], self.tb[e]))
        if self.votes is not None:
            vd, vb = self.votes
            for r in range(self.k * vd):
                pos = self._v_at + r * (vb + 1)
                out += list(meas[pos:pos + vb])
        return out

    def decode(self, output, num_measurements: int):
        """``(counts, shifted_sums)`` as int64 arrays (object arrays when a value could exceed int64)."""
        n = _as_int(num_measurements, "num_measurements")
        self.check_clients(n)
        dtype = np.int64 if n * self._top < 2**63 else object
        counts = np.array([int(x) for x in output[:self.k]], dtype=dtype)
        end = self.k + self.k * self.d
        sums = np.array([int(x) for x in output[self.k:end]], dtype=dtype).reshape(self.k, self.d)
        if self.votes is None:
            return counts, sums
        return counts, sums, np.array([int(x) for x in output[end:]], dtype=dtype).reshape(self.k, *self.votes)
