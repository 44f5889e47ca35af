"""Exact discrete Gaussian sampling from the OS CSPRNG.

Implements the discrete Gaussian sampler of Canonne, Kamath & Steinke (2020), "The Discrete
Gaussian for Differential Privacy" (NeurIPS 2020; arXiv:2004.00010):

* Algorithm 2 -- discrete Laplace with integer scale t: X = U + t V with U uniform on
  {0..t-1} accepted with probability exp(-U/t), V with P(V >= v) = e^-v, a random sign, and
  the negative zero rejected. U + t V is a geometric count, P(|X| >= g) = exp(-g/t); for
  t < 2^40 it is drawn as m A + B with m = max(1, t >> 16) instead (A geometric of scale
  t/m from one uniform, B nearly uniform on {0..m-1}): the same law in about one pass instead
  of five.
* Algorithm 3 -- discrete Gaussian N_Z(0, sigma^2): Y ~ DLap(t) with t = floor(sigma) + 1,
  accepted with probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)).

Exactness. The paper draws Bernoulli(exp(-gamma)) with its Algorithm 1, a chain of
Bernoulli(rational) coins (about 15 random words and a dozen vectorised passes per draw).
Here every Bernoulli(exp(-gamma)) (gamma rational) is *one* uniform U in [0, 1) compared with
exp(-gamma), and V is one uniform U with V = #{v >= 1 : U < e^-v}: the same laws. U is a real
number revealed 64 bits at a time; its first 64 bits w place it in [w 2^-64, (w+1) 2^-64).
The comparison is decided in floating point only when it is *certain*: exp(-g) from a float g
whose distance to gamma is bounded (rigorously, per use) and numpy's exp (relative error a
few ulps; ``_EXP_REL`` = 2^-40 is assumed, 2^11 times that, and checked in the tests) leave
exp(-gamma) in an interval the whole of U's interval lies on one side of. Otherwise
(probability about 2^-39 per comparison) :class:`_ExactUniform` computes rational bounds
of exp(-gamma) (Taylor series with a bounded tail) and reveals further bits of U until U
is certainly below or above. No decision depends on a rounding, so the output law is exactly
the discrete Gaussian with the requested (rational) variance parameter -- the floating-point
attacks on textbook samplers (Mironov 2012; Jin et al. 2022) do not apply.
``tests/test_dp_sampler_fast.py`` forces every decision through the exact path (the same
draws on the same stream), checks that path against 300-digit arithmetic on near-ties, and
checks the draws against the exact pmf.

Randomness comes from the OS CSPRNG -- per batch of draws, the ChaCha20 keystream under a fresh
256-bit key read from ``os.urandom`` (:func:`os_keyed_stream`) -- or from caller-given byte sources (a
keyed ChaCha20 stream per client and field for reproducible studies,
:func:`protocols.dp.noise.keystream`), never from numpy's generator.

Batches. :func:`sample_discrete_gaussian_batch` draws many requests -- e.g. every client's noise
share of a round, each with its own variance and byte source -- in one vectorised pass: the
loops of Algorithms 2-3 run over all pending draws at once, and each request reads its own
source in exactly the order a request drawn on its own would, so a seeded request gives the
same numbers alone or in any batch. ``python -m protocols.dp.sampler`` prints timings.
Seeded draws are a function of the byte source *and* of this use of it (the one-pass
geometric count, one uniform per coin): the same law drawn another way, e.g. with Algorithm 1's
chains, gives other numbers from the same seed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

from securefkm.exceptions import InputError

_TWO64 = 1 << 64
_INV64 = 2.0**-64
#: |estimate of num/den - num/den| <= 2^-51 relative (int->float conversions and one
#: division, each correctly rounded); U's estimate w 2^-64 is within 2^-53 of w 2^-64 and U
#: itself within 2^-64 of it: decisions at a distance beyond these bounds are certain
_P_SLACK = 2.0**-49
_U_SLACK = 2.0**-52
#: Laplace scales (and so values) stay in int64 below this; larger ones use Python ints
_SMALL_T = 1 << 40
#: |DLap(t)| = m A + B with m = max(1, t >> _SPLIT_BITS): A geometric of scale t/m < 2^17,
#: read off one uniform, B on {0..m-1} kept with probability >= exp(-2^-16). A single
#: geometric of scale t would need its float certificate to resolve gammas 1/t apart against
#: np.exp's assumed 2^-40 error (measured: 6 exact-path draws in 15,000 at t = 2^27, 0.4 ms
#: each; 68 at 2^30)
_SPLIT_BITS = 16

Source = Callable[[int], bytes]


# ---------------------------------------------------------------- uniform randomness
def _words(n: int, source=None) -> np.ndarray:
    """n uniform 64-bit words from ``source`` (a callable n_bytes -> bytes; default the OS CSPRNG)."""
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    return np.frombuffer((source or os.urandom)(8 * n), dtype="<u8").astype(np.uint64)


_ZEROS = bytes(1 << 16)


def os_keyed_stream():
    """A byte source for one batch of draws: the ChaCha20 keystream (RFC 8439; OpenSSL through
    ``cryptography``) under a fresh 256-bit key from ``os.urandom``, zero nonce (one stream per
    key). A CSPRNG like the kernel's own, faster than reading every word from ``os.urandom``
    (a quarter of a round's noise-share time under cProfile); nothing is kept between batches,
    so forked processes and threads never share a stream."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    encryptor = Cipher(algorithms.ChaCha20(os.urandom(32), bytes(16)), mode=None).encryptor()

    def read(n: int) -> bytes:
        return encryptor.update(memoryview(_ZEROS)[:n] if n <= len(_ZEROS) else bytes(n))

    return read



class _Words:
    """Random words for pending draws, each read from its request's own byte source.

    ``starts[g]`` is the first global draw index of request ``g``. Called with ascending
    global indices, a request's words come from its source in the order of its draws, so
    what a request reads does not depend on what else is in the batch.

    Per-request sources (seeded keystreams) are read ahead into one flat buffer, a segment
    per request (about 24 words per draw; a draw takes about 15 on average), so a pass over
    all pending draws is one vectorised gather instead of a source call per request and
    coin. Each request still consumes its own stream in order, so its values are the same;
    a source is read further than it is consumed, which is harmless because every source
    serves one request of one batch (:meth:`GaussianDP._source` makes a fresh keystream
    per (round, owner, field))."""

    READ_AHEAD = 24  # words per draw first read from each source

    def __init__(self, sources: Sequence, starts: np.ndarray, sizes: Sequence[int] | None = None):
        self.sources = list(sources)
        self.os_stream = all(src is None for src in self.sources)  # nothing to reproduce
        if self.os_stream:
            self.sources = [os_keyed_stream()] * len(self.sources)
        self.starts = np.asarray(starts, dtype=np.int64)
        self.shared = len(set(map(id, self.sources))) == 1  # one stream for all (e.g. the OS CSPRNG)
        if not self.shared:
            n = len(self.sources)
            sizes = np.ones(n, dtype=np.int64) if sizes is None else np.asarray(sizes, dtype=np.int64)
            self.cap = self.READ_AHEAD * sizes + 16
            self.seg = np.concatenate([[0], np.cumsum(self.cap)[:-1]]).astype(np.int64)
            self.buf = np.concatenate([_words(int(c), src) for c, src in zip(self.cap, self.sources)] or [_words(0)])
            self.pos = np.zeros(n, dtype=np.int64)

    def _grow(self, need: np.ndarray) -> None:
        """Read more words for the requests whose segment holds fewer than ``need`` unread."""
        short = np.flatnonzero(self.pos + need > self.cap)
        parts, old_seg = [], self.seg
        new_cap = self.cap.copy()
        new_cap[short] = np.maximum(2 * self.cap[short], self.pos[short] + need[short])
        for g in range(len(self.sources)):
            parts.append(self.buf[old_seg[g] : old_seg[g] + self.cap[g]])
            if new_cap[g] > self.cap[g]:
                parts.append(_words(int(new_cap[g] - self.cap[g]), self.sources[g]))
        self.buf = np.concatenate(parts)
        self.cap = new_cap
        self.seg = np.concatenate([[0], np.cumsum(new_cap)[:-1]]).astype(np.int64)

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        if self.shared:
            return _words(ids.size, self.sources[0])
        g = np.searchsorted(self.starts, ids, side="right") - 1
        counts = np.bincount(g, minlength=len(self.sources))
        if np.any(self.pos + counts > self.cap):
            self._grow(counts)
        first = np.cumsum(counts) - counts  # position of each request's first id in ``ids``
        out = self.buf[self.seg[g] + self.pos[g] + (np.arange(ids.size) - first[g])]
        self.pos += counts
        return out


def _single(n: int, source=None) -> tuple[np.ndarray, _Words]:
    return np.arange(n), _Words([source], np.zeros(1, dtype=np.int64))


def _uniform_below(m: np.ndarray, ids: np.ndarray, words: _Words) -> np.ndarray:
    """Exactly uniform integers in [0, m_i) (1 <= m_i < 2^63) by rejection: a word w is
    accepted iff w < 2^64 - (2^64 mod m), so w mod m is exactly uniform."""
    m = np.asarray(m, dtype=np.uint64)
    r = (np.uint64(0) - m) % m  # 2^64 mod m, in wrapping uint64 arithmetic
    cut = np.uint64(0) - r  # 2^64 - r, except that r = 0 (accept every word) wraps to 0
    out = np.zeros(m.shape, dtype=np.uint64)
    todo = np.arange(m.size)
    while todo.size:
        w = words(ids[todo])
        ok = (r[todo] == 0) | (w < cut[todo])
        out[todo[ok]] = w[ok] % m[todo[ok]]
        todo = todo[~ok]
    return out


def uniform_below(m: np.ndarray, source=None) -> np.ndarray:
    """Exactly uniform integers in [0, m_i) for each m_i (1 <= m_i < 2^63), by rejection."""
    m = np.asarray(m, dtype=np.uint64)
    if np.any(m == 0):
        raise InputError("uniform_below needs every bound m >= 1.")
    ids, words = _single(m.size, source)
    return _uniform_below(m, ids, words)


def _ints(x) -> np.ndarray:
    """Integers as int64 when they fit comfortably, else as Python ints (object array)."""
    arr = np.asarray(x)
    if arr.dtype.kind in "iu" and (arr.size == 0 or int(np.abs(arr).max()) < (1 << 62)):
        return arr.astype(np.int64)
    obj = arr.ravel() if arr.dtype == object else np.array([int(v) for v in arr.ravel()], dtype=object)
    if obj.size and int(np.abs(obj).max()) < (1 << 62):
        return obj.astype(np.int64)
    return obj


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """float64 estimate of num/den, relative error below 2^-51 (Python's int / int is
    correctly rounded; so are numpy's int64 -> float64 conversion and division)."""
    if num.dtype == object or den.dtype == object:
        return np.true_divide(num.astype(object), den.astype(object)).astype(np.float64)  # int / int per element
    return num.astype(np.float64) / den.astype(np.float64)


def _bernoulli_rational(num, den, p, ids, words) -> np.ndarray:
    """Coins Bernoulli(num_i / den_i) (0 <= num_i <= den_i) with ``p`` ~ num/den (see module doc)."""
    n = len(num)
    out = np.zeros(n, dtype=bool)
    one = num == den
    out[one] = True
    todo = np.flatnonzero(~one & (num != 0))
    if not todo.size:
        return out
    w = words(ids[todo])
    u = w.astype(np.float64) * _INV64
    pt = p[todo]
    yes = u + _U_SLACK < pt * (1.0 - _P_SLACK)
    no = u - _U_SLACK > pt * (1.0 + _P_SLACK)
    out[todo[yes]] = True
    close = ~(yes | no)
    if close.any():
        out[todo[close]] = _digit_by_digit(num[todo[close]], den[todo[close]], w[close], ids[todo[close]], words)
    return out


def _digit_by_digit(num, den, first: np.ndarray, ids, words) -> np.ndarray:
    """U < num/den decided on the exact binary expansion: digit L of num/den is
    floor(num/den 2^(64 L)) mod 2^64; ``first`` holds U's first 64 bits."""
    rem = [int(v) for v in num]
    den = [int(v) for v in den]
    out = np.zeros(len(rem), dtype=bool)
    todo, w = list(range(len(rem))), [int(v) for v in first]
    while todo:
        nxt = []
        for i, word in zip(todo, w):
            digit, rem[i] = divmod(rem[i] << 64, den[i])
            if word < digit:
                out[i] = True
            elif word == digit and rem[i] > 0:
                nxt.append(i)  # tie on these 64 bits: look at the next 64
        todo = nxt
        if todo:
            w = [int(v) for v in words(ids[np.array(todo)])]
    return out


def bernoulli_rational(num, den, source=None) -> np.ndarray:
    """Exact Bernoulli(num_i / den_i) coins for integers 0 <= num_i <= den_i, den_i >= 1."""
    num, den = _ints(np.asarray(num, dtype=object).ravel()), _ints(np.asarray(den, dtype=object).ravel())
    bad = (den <= 0) | (num < 0) | (num > den)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"bernoulli_rational needs 0 <= num <= den, den >= 1; got {num[i]}/{den[i]}.")
    ids, words = _single(len(num), source)
    return _bernoulli_rational(num, den, _ratio(num, den), ids, words)


#: assumed bound on the relative error of numpy's float64 exp: it is a few ulps (~2^-51) in
#: every implementation numpy ships; the margin is 2^11 times that (checked against exact
#: rationals in tests/test_dp_sampler_fast.py). Decisions closer than it take the exact path.
_EXP_REL = 2.0**-40
_TINY = 2.0**-1000  # what a float exp that underflowed to 0 can hide


def _exp_neg_interval(gamma: Fraction, prec: int) -> tuple[Fraction, Fraction]:
    """Rationals lo <= exp(-gamma) <= hi with hi - lo <= 2^-prec: the Taylor series of
    exp(gamma) up to K terms, S, plus a bound on its tail R <= 2 t_K once K + 1 > 2 gamma, so
    exp(-gamma) lies in [1/(S + R), 1/S]; endpoints rounded outwards to the grid 2^-(prec+2)."""
    if gamma > prec:  # exp(-gamma) < e^-prec < 2^-prec
        return Fraction(0), Fraction(1, 1 << prec)
    total, term, k = Fraction(0), Fraction(1), 0
    while True:
        total += term
        k += 1
        term = term * gamma / k
        if k + 1 > 2 * gamma:
            lo, hi = 1 / (total + 2 * term), 1 / total
            if hi - lo <= Fraction(1, 1 << (prec + 1)):
                break
    grid = 1 << (prec + 2)
    return Fraction(math.floor(lo * grid), grid), Fraction(math.ceil(hi * grid), grid)


class _ExactUniform:
    """One draw's uniform U in [0, 1), its binary expansion revealed 64 bits at a time from
    that draw's own source, compared exactly with exp(-gamma)."""

    def __init__(self, first, gid, words):
        self.bits, self.n_bits, self.gid, self.words = int(first), 64, gid, words

    def below(self, gamma: Fraction) -> bool:
        """U < exp(-gamma), decided on exact rational bounds (never on a rounding)."""
        while True:
            lo, hi = _exp_neg_interval(gamma, self.n_bits + 8)
            scale = 1 << self.n_bits
            if self.bits + 1 <= lo * scale:  # U < (bits + 1) / 2^n <= lo
                return True
            if self.bits >= hi * scale:  # U >= bits / 2^n >= hi
                return False
            self.bits = (self.bits << 64) | int(self.words(np.array([self.gid]))[0])
            self.n_bits += 64


def _certain(w: np.ndarray, g: np.ndarray, err):
    """(yes, no): U < exp(-gamma) certainly / certainly not, for U's first 64 bits ``w`` and a
    float g with |g - gamma| <= err (so exp(-g) is within relative about err + _EXP_REL of
    exp(-gamma); 2 err bounds e^err - 1 for err <= 1). U lies in [w 2^-64, (w + 1) 2^-64)."""
    u = w.astype(np.float64) * _INV64  # within relative 2^-53 of w 2^-64
    u_lo = u * (1.0 - 2.0**-52)
    u_hi = (u + _INV64) * (1.0 + 2.0**-52)
    # g >= 0; capped at 708 so exp stays a normal float (no underflow flag, whatever the
    # caller's np.seterr): a larger estimate of p only makes "yes" (never taken: u_hi >= 2^-64)
    # and "no" more cautious
    p = np.exp(-np.minimum(g, 708.0))
    rel = np.minimum(2.0 * err + _EXP_REL, 1.0)
    return u_hi < p * (1.0 - rel), u_lo > p * (1.0 + rel) + _TINY


def _accept(y, s2, t, ids, words, gamma_of) -> np.ndarray:
    """CKS20 Algorithm 3's acceptance coins Bernoulli(exp(-gamma)), gamma = (|y| - s2/t)^2 / (2 s2),
    from a float gamma with a rigorous bound on its absolute error (|y| < 2^53 and t < 2^40 are
    exact floats; s2 is within relative 2^-53 of sigma^2): |g - gamma| <= g 2^-49 +
    |delta| 2^-50 / t + 2^-100 (delta = |y| - s2/t), used here with a margin of 8."""
    delta = np.abs(y).astype(np.float64) - s2 / t
    g = delta * delta / (2.0 * s2)
    err = (g + np.abs(delta) / t) * 2.0**-46 + 2.0**-90
    return _coins_from(words(ids), g, err, ids, words, gamma_of)


def _coins_from(w, g, err, ids, words, gamma_of) -> np.ndarray:
    """1 iff U < exp(-gamma) for U's first word ``w``: certain in floating point from g with
    |g - gamma| <= err, else exact (:class:`_ExactUniform` on ``gamma_of(i)``)."""
    yes, no = _certain(w, g, err)
    out = yes.copy()
    for i in np.flatnonzero(~(yes | no)):
        out[i] = _ExactUniform(w[i], ids[i], words).below(gamma_of(int(i)))
    return out


def _exp_neg_coins(num, den, ids, words) -> np.ndarray:
    """Bernoulli(exp(-num_i/den_i)) coins, one uniform each: 1 iff U < exp(-gamma), decided in
    floating point when certain (all but about 2^-39 of them) and on exact rational bounds of
    exp(-gamma) otherwise (:class:`_ExactUniform`)."""
    if not len(num):
        return np.zeros(0, dtype=bool)
    g = _ratio(num, den)
    return _coins_from(words(ids), g, g * 2.0**-50, ids, words, lambda i: Fraction(int(num[i]), int(den[i])))


def _geometric(ids, words) -> np.ndarray:
    """V with P(V >= v) = e^-v (v = 0, 1, ...), one uniform each: the law of CKS20's count of
    Bernoulli(exp(-1)) successes before the first failure (:func:`_geometric_scaled` at t = m)."""
    one = np.ones(len(ids), dtype=np.int64)
    return _geometric_scaled(one, one, ids, words)


def _geometric_scaled(t: np.ndarray, m: np.ndarray, ids, words) -> np.ndarray:
    """A with P(A >= a) = exp(-a m_i / t_i) (a = 0, 1, ...; integers 1 <= m_i <= t_i < 2^40 with
    t_i / m_i < 2^17), one uniform each: A = #{a >= 1: U < exp(-a m/t)}. The candidate
    floor(-(t/m) ln U) is certified by U < exp(-A m/t) and U >= exp(-(A + 1) m/t) (A m < 2^53
    and t are exact floats, A m / t within relative 2^-53 of the rational; a margin of 8),
    exactly otherwise (:func:`_geometric` is the case m = t). Consecutive gammas
    are m/t >= 2^-17 apart, so about 2^-22 of the draws take the exact path."""
    w = words(ids)
    tf, mf = t.astype(np.float64), m.astype(np.float64)
    a = np.floor(-np.log((w.astype(np.float64) + 0.5) * _INV64) * (tf / mf))  # the argument is >= 2^-65
    a = np.maximum(a, 0.0)
    lo_gamma, hi_gamma = a * mf / tf, (a + 1.0) * mf / tf
    inside, _ = _certain(w, lo_gamma, lo_gamma * 2.0**-50)
    _, above = _certain(w, hi_gamma, hi_gamma * 2.0**-50)
    out = a.astype(np.int64)
    for i in np.flatnonzero(~(inside & above)):
        u = _ExactUniform(w[i], ids[i], words)
        k, ti, mi = int(out[i]), int(t[i]), int(m[i])
        while k > 0 and not u.below(Fraction(k * mi, ti)):
            k -= 1
        while u.below(Fraction((k + 1) * mi, ti)):
            k += 1
        out[i] = k
    return out


def _truncated_geometric(t: np.ndarray, m: np.ndarray, ids, words) -> np.ndarray:
    """B on {0..m_i - 1} with P(B = b) ∝ exp(-b / t_i): B uniform, kept with probability
    exp(-B/t) >= exp(-m/t) (nearly always when m << t), else drawn again. 0 where m = 1."""
    out = np.zeros(t.size, dtype=np.int64)
    todo = np.flatnonzero(m > 1)
    while todo.size:
        gid = ids[todo]
        b = _uniform_below(m[todo].astype(np.uint64), gid, words).astype(np.int64)
        ok = _exp_neg_coins(b, t[todo], gid, words)
        out[todo[ok]] = b[ok]
        todo = todo[~ok]
    return out


def bernoulli_exp_neg(num, den, source=None) -> np.ndarray:
    """Exact Bernoulli(exp(-num_i/den_i)) coins for rationals gamma_i = num_i/den_i >= 0, vectorised."""
    num, den = _ints(np.asarray(num, dtype=object).ravel()), _ints(np.asarray(den, dtype=object).ravel())
    ids, words = _single(len(num), source)
    return _exp_neg_coins(num, den, ids, words)


# ---------------------------------------------------------------- distributions
def _proposals(pending: int, words: _Words) -> int:
    """Proposals per pending draw in a pass of a rejection loop. A draw takes its *first*
    accepted proposal, which is the rejection sampler run on that sequence of i.i.d. proposals
    (the ones after it are never looked at): the law does not depend on this number, only the
    use of the stream does. So it is 1 for caller-given (seeded) sources, whose draws must be
    the same alone or in any batch; on the OS stream, small remainders get up to 4 proposals,
    which ends the loop in two or three vectorised passes instead of seven or more."""
    if not words.os_stream:
        return 1
    return int(min(4, max(1, 2048 // max(pending, 1))))


def _take_first_accepted(out: np.ndarray, todo: np.ndarray, ok: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """``out[todo[i]]`` = the first accepted of draw i's ``k`` proposals (``ok``, ``y``: ``k``
    consecutive entries per draw); returns the mask of the draws with none accepted."""
    if k == 1:
        out[todo[ok]] = y[ok]
        return ~ok
    ok = ok.reshape(todo.size, k)
    has = ok.any(axis=1)
    first = np.arange(todo.size) * k + ok.argmax(axis=1)
    out[todo[has]] = y[first[has]]
    return ~has


def _discrete_laplace(t: np.ndarray, ids: np.ndarray, words: _Words) -> np.ndarray:
    """Draws of DLap(t_i): P(x) ∝ exp(-|x|/t_i) on Z, a random sign, the negative zero rejected.

    |X| is geometric: P(|X| >= g) = exp(-g/t) before the sign. CKS20's Algorithm 2 builds it as
    U + t V (U uniform on {0..t-1} kept with probability exp(-U/t) >= 1/e, V with
    P(V >= v) = e^-v): about five passes of three coins per draw. For t < 2^40 the split is
    m A + B with m = max(1, t >> 16) instead (any m gives independent A, B with these laws):
    A geometric of scale t/m read off one uniform (:func:`_geometric_scaled`), B uniform on
    {0..m-1} kept with probability exp(-B/t) >= exp(-2^-16) -- the same law in about one pass.
    Wider scales keep Algorithm 2 in Python integers."""
    big = bool(t.size) and int(t.max()) >= _SMALL_T
    out = np.zeros(t.size, dtype=object if big else np.int64)
    wide = np.array([int(v) >= _SMALL_T for v in t], dtype=bool) if big else np.zeros(t.size, dtype=bool)
    todo = np.flatnonzero(~wide)
    small_t = t[todo].astype(np.int64)
    while todo.size:
        # per draw by its own scale only, so a request draws the same alone or in any batch
        k = _proposals(todo.size, words)
        pick = np.repeat(np.arange(todo.size), k)
        gid, tt = ids[todo][pick], small_t[pick]
        m = np.maximum(tt >> _SPLIT_BITS, 1)  # |X| = m A + B, A and B independent
        x = m * _geometric_scaled(tt, m, gid, words) + _truncated_geometric(tt, m, gid, words)
        b = (words(gid) & np.uint64(1)).astype(bool)
        ok = ~(b & (x == 0))
        left = _take_first_accepted(out, todo, ok, np.where(b, -x, x), k)
        todo, small_t = todo[left], small_t[left]
    todo = np.flatnonzero(wide)
    while todo.size:  # wide scales: Algorithm 2 as written (Python ints when big)
        tt, gid = t[todo], ids[todo]
        u = _uniform_below(tt.astype(np.uint64), gid, words).astype(np.int64)
        if big:
            u, tt = u.astype(object), tt.astype(object)
        d = _exp_neg_coins(u, tt, gid, words)  # gamma = u/t < 1
        v = _geometric(gid, words)
        b = (words(gid) & np.uint64(1)).astype(bool)
        x = u + tt * (v.astype(object) if big else v)
        ok = d & ~(b & (x == 0))
        y = np.where(b, -x, x)
        out[todo[ok]] = y[ok]
        todo = todo[~ok]
    return out


def sample_discrete_laplace(t: int, size: int, source=None) -> np.ndarray:
    """``size`` draws of the discrete Laplace P(x) ∝ exp(-|x|/t) on Z (CKS20 Algorithm 2, s=1)."""
    t = int(t)
    if t < 1:
        raise InputError(f"discrete Laplace scale t must be an int >= 1, got {t}.")
    ids, words = _single(int(size), source)
    return _discrete_laplace(np.full(int(size), t, dtype=object if t >= _SMALL_T else np.int64), ids, words)


def _as_fraction(sigma2) -> Fraction:
    try:
        f = Fraction(sigma2)
    except (TypeError, ValueError):
        raise InputError(f"sigma2 must be a positive rational or finite float, got {sigma2!r}.") from None
    if f <= 0:
        raise InputError(f"sigma2 must be > 0, got {sigma2!r}.")
    return f


def sample_discrete_gaussian_batch(
    sigma2s: Sequence, sizes: Sequence[int], sources: Sequence[Source | None] | None = None, *, as_int: bool = False,
    flat: bool = False,
) -> list[np.ndarray] | np.ndarray:
    """Exact draws of N_Z(0, sigma2s[g]), ``sizes[g]`` of them, for every request g at once.

    Request g reads only ``sources[g]`` (a callable n_bytes -> uniform bytes; None: the OS
    CSPRNG) and, for a seeded source, gets exactly what
    ``sample_discrete_gaussian(sigma2s[g], sizes[g], source=sources[g])`` gives on its own.
    One vectorised pass over all requests: a round's noise shares of many clients cost
    little more than one client's. ``flat=True`` returns the requests' draws concatenated in
    request order (one array) instead of one array per request.
    """
    n_req = len(sizes)
    if len(sigma2s) != n_req or (sources is not None and len(sources) != n_req):
        raise InputError("sample_discrete_gaussian_batch: sigma2s, sizes and sources need one entry per request.")
    sizes = [int(z) for z in sizes]
    if any(z < 0 for z in sizes):
        raise InputError(f"sizes must be >= 0, got {sizes}.")
    # a round's requests share a handful of variance objects (one per field): the exact rational
    # work is done once per object, not once per client (keyed by id: ``sigma2s`` keeps every
    # object alive for the call, and hashing a Fraction costs more than the lookup saves)
    law: dict = {}
    index = []  # request -> its law's position
    for s2 in sigma2s:
        key = id(s2)
        if key not in law:
            f = _as_fraction(s2)
            a, b = f.numerator, f.denominator
            law[key] = (len(law), float(f), (a, b), math.isqrt(a * b) // b + 1)  # floor(sigma) + 1, exactly
        index.append(law[key][0])
    laws = list(law.values())
    ts = [laws[i][3] for i in index]
    starts = np.cumsum([0] + sizes[:-1]).astype(np.int64) if n_req else np.zeros(0, dtype=np.int64)
    total = sum(sizes)
    req = np.repeat(np.arange(n_req), sizes)
    big = any(t >= _SMALL_T for t in ts)
    t_e = np.array(ts, dtype=object if big else np.int64)[req]
    # acceptance: gamma = (|Y| - sigma2/t)^2 / (2 sigma2) = (|Y| b t - a)^2 / (2 a b t^2), exact
    # per draw only where the float decision is not certain (and for astronomically wide laws)
    def _gamma(a, b, t):
        return lambda y: Fraction((abs(int(y)) * b * t - a) ** 2, 2 * a * b * t * t)

    gammas = [_gamma(*ab_, t) for _, _, ab_, t in laws]
    law_of = np.array(index, dtype=np.int64)  # exact_gamma of request g: gammas[law_of[g]]
    s2_e = np.array([f for _, f, _, _ in laws])[law_of[req]] if n_req else np.zeros(0)
    words = _Words(sources if sources is not None else [None] * n_req, starts, sizes) if n_req else None
    out = np.zeros(total, dtype=object if (big or as_int) else np.int64)
    todo = np.arange(total)
    while todo.size:
        k = _proposals(todo.size, words)
        pick = np.repeat(todo, k)  # each pending draw's proposals, in order
        y = _discrete_laplace(t_e[pick], pick, words)
        if big:
            gam = [gammas[law_of[req[i]]](v) for i, v in zip(pick, y)]
            ok = _exp_neg_coins(_ints([g.numerator for g in gam]), _ints([g.denominator for g in gam]), pick, words)
        else:
            ok = _accept(y, s2_e[pick], t_e[pick], pick, words, lambda i, y=y, pick=pick: gammas[law_of[req[pick[i]]]](y[i]))
        todo = todo[_take_first_accepted(out, todo, ok, y, k)]
    if not as_int and out.dtype == object:
        out = out.astype(np.int64)
    if flat:
        return out
    return np.split(out, np.cumsum(sizes)[:-1]) if n_req else []


def sample_discrete_gaussian(sigma2, size: int, *, as_int: bool = False, source=None) -> np.ndarray:
    """``size`` exact draws of N_Z(0, sigma2): P(x) ∝ exp(-x^2 / (2 sigma2)) on the integers.

    CKS20 Algorithm 3. ``sigma2`` is an int, :class:`fractions.Fraction` or finite float
    (a float is used at its exact binary value). Returns int64 (or Python ints in an
    object array with ``as_int=True`` when values may exceed 2^63). ``source``: a callable
    n_bytes -> uniform bytes (default ``os.urandom``; :func:`protocols.dp.noise.keystream` gives a
    seeded CSPRNG stream for reproducible studies).
    """
    if int(size) < 0:
        raise InputError(f"size must be >= 0, got {size}.")
    return sample_discrete_gaussian_batch([sigma2], [int(size)], [source], as_int=as_int)[0]


def discrete_gaussian_pmf(sigma2, support: np.ndarray) -> np.ndarray:
    """Exact-up-to-float pmf of N_Z(0, sigma2) on ``support`` (for tests and error bounds)."""
    s2 = float(sigma2)
    half = int(math.ceil(40 * math.sqrt(s2))) + 1
    grid = np.arange(-half, half + 1, dtype=np.float64)
    norm = np.exp(-(grid**2) / (2 * s2)).sum()
    return np.exp(-(np.asarray(support, dtype=np.float64) ** 2) / (2 * s2)) / norm


def lattice_gaussian(sigma: float, size: int, step: float) -> np.ndarray:
    """Noise ``step * N_Z(0, (sigma/step)^2)``: a Gaussian on the lattice ``step * Z``.

    Used for floating-point ("central") noise: the variance parameter is rounded *up* to
    a multiple of 2^-16 in lattice units, so the noise is never smaller than asked for.
    """
    if not (sigma > 0 and step > 0 and math.isfinite(sigma) and math.isfinite(step)):
        raise InputError(f"lattice_gaussian needs finite sigma > 0 and step > 0, got {sigma}, {step}.")
    s2 = round_up_variance((sigma / step) ** 2)
    return sample_discrete_gaussian(s2, size).astype(np.float64) * step


def round_up_variance(v: float, bits: int = 16) -> Fraction:
    """Smallest multiple of 2^-bits that is >= v (exact rational; keeps digits short)."""
    f = Fraction(v)
    scale = 1 << bits
    return Fraction(-((-f.numerator * scale) // f.denominator), scale)


if __name__ == "__main__":  # pragma: no cover - timing helper
    import statistics
    import time

    for s2 in (1.0, 100.0, 1e8, 1e12):
        t0 = time.perf_counter()
        x = sample_discrete_gaussian(s2, 5000)
        dt = time.perf_counter() - t0
        print(f"sigma^2={s2:g}: 5000 draws in {dt:.3f} s, var/sigma^2={x.astype(float).var() / s2:.3f}")
    # a DWF round's noise shares from the OS stream: per client a count field (5 values, small
    # variance) and a sum field (10 values, a share variance of the size distributed mode uses)
    for clients in (100, 1000):
        times = []
        for _ in range(21):
            t0 = time.perf_counter()
            sample_discrete_gaussian_batch([3.0, Fraction(10**15, 7)] * clients, [5, 10] * clients)
            times.append(time.perf_counter() - t0)
        print(f"{clients} clients' shares ({15 * clients} draws): {1000 * statistics.median(times):.2f} ms (median of 21)")
