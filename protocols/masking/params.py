"""Degree and threshold of the SecAgg+ graph from Bell et al. 2020's bounds.

Bell, Bonawitz, Gascon, Lepoint & Raykova, "Secure single-server aggregation with
(poly)logarithmic overhead" (CCS 2020), Sec. 3-4: clients mask with, and share their
secrets among, their ``k`` neighbours in a Harary graph ``H(k, n)`` over a random cyclic
order. A degree ``k`` and Shamir threshold ``t`` are acceptable for ``n`` clients, at most
``gamma * n`` of them corrupt (colluding with the server) and at most ``delta * n`` dropping
out, when

1. *security* (``2**-sigma``, split evenly over two bad events): (a) the graph of honest
   survivors stays connected -- removing nodes disconnects ``H(k, n)`` only if two disjoint
   runs of ``k/2`` consecutive ring positions are all corrupt or dropped; a union bound over
   the ``n (n - k - 1) / 2`` pairs of runs with the probability ``C(B, k) / C(n, k)`` that
   ``k`` given positions are among the ``B = (gamma + delta) n`` bad clients must stay below
   ``2**-(sigma + 1)``; (b) no client has ``t`` or more corrupt neighbours, i.e.
   ``P[X_corrupt > t - 1] < 2**-(sigma + 1) / n`` with ``X_corrupt ~ Hypergeom(n, gamma n, k)``;
   against a semi-malicious server (``sign_keys=True``, Sec. 5) the threshold must also
   exceed half of ``k`` plus half the corrupt neighbours (the server cannot obtain both
   shares of an honest client): ``t - 1 >= ceil((t1 + k - 1.25) / 2)``.
2. *correctness* (``2**-eta``): every client keeps at least ``t`` surviving neighbours,
   ``P[X_surviving < t] < 2**-eta / n`` with ``X_surviving ~ Hypergeom(n, (1 - delta) n, k)``.

The search returns the smallest even ``k < n - 1`` with a threshold in ``(t1, t2]`` and
takes ``t = max(t1 + 1, 2)`` (the cheapest reconstruction). This is the procedure of the
authors' reference implementation (Google's ``fcp/secagg`` ``HararyGraphParameterFinder``,
read, not copied); ``tests/test_masking_params.py`` reproduces its table of precomputed
values (sigma = 40, eta = 20) exactly.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy.special import gammaln
from scipy.stats import hypergeom

from securefkm.exceptions import InputError

#: defaults of :class:`PairwiseMasking` (stated in its docstring): 40-bit statistical
#: security and 20-bit correctness as in Bell et al.'s concrete parameters, at most 5% of
#: the sampled clients corrupt and 10% dropping out
SECURITY_BITS = 40.0
CORRECTNESS_BITS = 20.0
CORRUPT_FRACTION = 0.05
DROPOUT_FRACTION = 0.10
_SMALL = 1e-14  # floor/ceil of rate * n must not round a bound in the insecure direction


def check_rates(corrupt_fraction, dropout_fraction, security_bits, correctness_bits, malicious: bool) -> None:
    """Refuse fractions and security levels no graph can meet, naming what to relax."""
    for name, v in (("corrupt_fraction", corrupt_fraction), ("dropout_fraction", dropout_fraction)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not 0.0 <= float(v) < 1.0:
            raise InputError(f"{name} must be a fraction in [0, 1), got {v!r}.")
    for name, v in (("security_bits", security_bits), ("correctness_bits", correctness_bits)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not 0.0 < float(v) <= 256.0:
            raise InputError(f"{name} must be a number of bits in (0, 256], got {v!r}.")
    g, d = float(corrupt_fraction), float(dropout_fraction)
    if malicious and g + 2 * d > 0.9:
        raise InputError(
            f"corrupt_fraction + 2 * dropout_fraction = {g + 2 * d:.3f} > 0.9: no sparse graph is secure against "
            "a malicious server (sign_keys=True) with these rates; lower corrupt_fraction or dropout_fraction, "
            "or use graph='complete'."
        )
    if g + d > 0.9:
        raise InputError(
            f"corrupt_fraction + dropout_fraction = {g + d:.3f} > 0.9: no sparse graph keeps the honest "
            "survivors connected; lower corrupt_fraction or dropout_fraction, or use graph='complete'."
        )


def _tails(total: int, marked: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``P[X <= x]`` and ``P[X >= x]`` for ``x = 0..k``, ``X ~ Hypergeom(total, marked, k)``,
    each summed from its own tail so that tiny probabilities keep their precision."""
    p = np.exp(hypergeom.logpmf(np.arange(k + 1), total, marked, k))
    return np.cumsum(p), np.cumsum(p[::-1])[::-1]


def _log_p_disconnected(n: int, k: int, bad: int) -> float:
    """Log of the union bound on the honest survivors' Harary graph being disconnected."""
    if k > bad:
        return -math.inf
    pairs = math.log(n) + math.log(n - k - 1) - math.log(2)
    return pairs + gammaln(bad + 1) + gammaln(n - k + 1) - gammaln(n + 1) - gammaln(bad - k + 1)


def _threshold_for(n: int, k: int, corrupt: int, bad: int, surviving: int, sigma: float, eta: float, malicious: bool):
    """``t`` for degree ``k`` or ``None`` (Bell et al. bounds 1 and 2 above)."""
    log_sec = -(sigma + 1) * math.log(2)
    if _log_p_disconnected(n, k, bad) >= log_sec:
        return None
    q_sec, q_cor = 2.0 ** -(sigma + 1) / n, 2.0**-eta / n
    _, sf_corrupt = _tails(n, corrupt, k)
    # t1: fewest "corrupt neighbours" with P[X_corrupt > t1] < q_sec
    t1 = int(np.flatnonzero(np.append(sf_corrupt[1:], 0.0) < q_sec)[0])
    cdf_surv, _ = _tails(n, surviving, k)
    # t2: largest t with P[X_surviving < t] < q_cor
    t2 = int(np.flatnonzero(cdf_surv >= q_cor)[0])
    if malicious:
        t1 = math.ceil((t1 + k - 1.25) / 2)
    if t2 <= t1:
        return None
    return max(t1 + 1, 2)


@lru_cache(maxsize=256)
def bell_parameters(
    n: int,
    corrupt_fraction: float = CORRUPT_FRACTION,
    dropout_fraction: float = DROPOUT_FRACTION,
    security_bits: float = SECURITY_BITS,
    correctness_bits: float = CORRECTNESS_BITS,
    malicious: bool = False,
) -> tuple[int, int] | None:
    """Smallest even degree ``k < n - 1`` and its threshold ``t`` meeting Bell et al.'s
    bounds for ``n`` clients, or ``None`` when only the complete graph (``k = n - 1``) does."""
    check_rates(corrupt_fraction, dropout_fraction, security_bits, correctness_bits, malicious)
    n = int(n)
    corrupt = math.floor((corrupt_fraction + _SMALL) * n)
    bad = corrupt + math.floor((dropout_fraction + _SMALL) * n)
    surviving = math.ceil((1 - dropout_fraction - _SMALL) * n)
    for k in range(2, n - 1, 2):
        t = _threshold_for(n, k, corrupt, bad, surviving, float(security_bits), float(correctness_bits), malicious)
        if t is not None:
            return k, t
    return None
