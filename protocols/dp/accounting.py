"""Noise calibration and privacy accounting for repeated Gaussian releases.

Each protected round releases one Gaussian mechanism with L2 sensitivity 1 (after the
layer's normalisation, see :mod:`protocols.dp.layer`) and noise standard deviation
``z`` (the *noise multiplier*), possibly on a Poisson-subsampled population with rate
``q``. The privacy of ``T`` such rounds is computed with opacus's accountants
(imported lazily: opacus pulls in torch):

* ``"prv"`` (default) -- numerical composition of privacy loss random variables
  (Gopi, Lee & Wutschitz 2021, "Numerical Composition of Differential Privacy"); opacus
  returns the *upper* end of its error interval, so the value is a valid bound.
* ``"rdp"`` -- Rényi DP of the subsampled Gaussian (Mironov 2017; Mironov, Talwar & Zhang
  2019) converted to (epsilon, delta); looser but classical.

The CLT-based "gdp" accountant of opacus is deliberately not offered: for subsampled
rounds it is an asymptotic approximation that under-reports epsilon.

For full participation (q = 1) T Gaussian rounds are exactly mu-GDP with
mu = sqrt(T) / z (Dong, Roth & Su 2019, "Gaussian Differential Privacy", Cor. 3.3), and
:func:`gdp_epsilon` gives the exact (epsilon, delta) curve (their Cor. 2.13):

    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2).

So ``"prv"`` evaluates a history whose every round has q = 1 -- heterogeneous noise
multipliers included, mu^2 = sum_i n_i / z_i^2 -- with this closed form instead of the numerical
composition: the same privacy curve without the PRV's discretisation error, whose upper end
costs 1% (epsilon 1) to 9% (epsilon 0.1) more noise at the same target, and without importing
torch. The noise calibration inverts it exactly
(:func:`gdp_mu`). Histories with a subsampled round use opacus's PRV accountant as before.
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache

import numpy as np

from securefkm.validation import check_float, check_int
from securefkm.exceptions import InputError

from . import epsilon_cache

ACCOUNTANTS = ("prv", "rdp")
_MAX_Z = 1e6


def _check_accountant(accountant: str) -> str:
    if accountant == "gdp":
        raise InputError(
            "accountant='gdp' (opacus's CLT Gaussian accountant) under-reports epsilon for "
            "subsampled rounds and is not offered; use accountant='prv' (default) or 'rdp'."
        )
    if accountant not in ACCOUNTANTS:
        raise InputError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}.")
    return accountant


def _check_common(rounds, sample_rate, delta):
    rounds = check_int(rounds, "rounds", minimum=0)
    sample_rate = check_float(sample_rate, "sample_rate", minimum=0.0, maximum=1.0, min_inclusive=False)
    delta = check_float(delta, "delta", minimum=0.0, maximum=1.0, min_inclusive=False, max_inclusive=False)
    return rounds, sample_rate, delta


def _cache_key(history: tuple, delta: float, accountant: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        opacus_version = version("opacus")
    except PackageNotFoundError:  # pragma: no cover - opacus is a dependency
        opacus_version = "?"
    return repr((opacus_version, accountant, float(delta), tuple(tuple(map(float, h)) for h in history)))


@lru_cache(maxsize=4096)
def _epsilon_history(history: tuple, delta: float, accountant: str) -> float:
    """Epsilon of ``history`` from opacus, memoised across processes by
    :mod:`protocols.dp.epsilon_cache` (a pure function of its inputs and the opacus version)."""
    key = _cache_key(history, delta, accountant)
    cached = epsilon_cache.lookup(key)
    if cached is not None:
        return cached
    eps = _epsilon_history_opacus(history, delta, accountant)
    epsilon_cache.store(key, eps)
    return eps


def _epsilon_history_opacus(history: tuple, delta: float, accountant: str) -> float:
    from opacus.accountants import PRVAccountant, RDPAccountant  # lazy: imports torch

    acc = PRVAccountant() if accountant == "prv" else RDPAccountant()
    acc.history = [tuple(h) for h in history]
    with warnings.catch_warnings():
        # opacus warns about log(0) at q = 1 and about the RDP order range; both harmless.
        warnings.simplefilter("ignore")
        with np.errstate(divide="ignore", invalid="ignore"):
            eps = float(acc.get_epsilon(delta=delta))
    return max(eps, 0.0)


def epsilon_for_history(history, delta: float, accountant: str = "prv") -> float:
    """Epsilon of a heterogeneous history ``[(noise_multiplier, sample_rate, steps), ...]``
    (``"prv"`` and every q = 1: the exact mu-GDP curve, see the module docstring)."""
    accountant = _check_accountant(accountant)
    hist = tuple((float(z), float(q), int(n)) for z, q, n in history if int(n) > 0)
    if not hist:
        return 0.0
    if _closed_form(hist, accountant):
        return gdp_epsilon(math.sqrt(sum(n / z**2 for z, _, n in hist)), float(delta))
    return _epsilon_history(hist, float(delta), accountant)


def _closed_form(hist, accountant: str) -> bool:
    """Full participation under ``"prv"``: the composition is exactly mu-GDP."""
    return accountant == "prv" and all(q == 1.0 for _, q, _ in hist)


#: relative slack of the exact calibration below the target epsilon (rounding; see _exact_z)
CALIBRATION_MARGIN = 1e-12


def _exact_z(epsilon: float, delta: float, schedule) -> float:
    """The base noise multiplier whose full-participation schedule ``[(weight, rounds), ...]``
    is exactly (epsilon, delta)-DP: mu^2 = sum_i w_i n_i / z^2 = gdp_mu(epsilon, delta)^2,
    raised by a few ulps until the evaluated epsilon is within the target by a relative
    :data:`CALIBRATION_MARGIN`. The margin is for rounding: the layer later evaluates the
    history it charged -- the same rounds, grouped per noise level and summed in another
    order -- and that sum can differ from this one in its last bits (measured: epsilon
    0.25000000000000094 for a target of 0.25 with a three-level schedule, no margin)."""
    total = sum(w * n for w, n in schedule)
    z = math.sqrt(total) / gdp_mu(epsilon, delta)
    history = schedule_history(z, schedule)
    while epsilon_for_history(history, delta) > epsilon * (1.0 - CALIBRATION_MARGIN):
        z = math.nextafter(z, math.inf) * (1 + 1e-12)
        history = schedule_history(z, schedule)
    return z


def epsilon_for(noise_multiplier: float, rounds: int, sample_rate: float, delta: float, accountant: str = "prv") -> float:
    """Epsilon after ``rounds`` Gaussian rounds with noise multiplier z at sampling rate q.

    Exactly the value opacus's accountant reports for the history ``[(z, q, rounds)]``.
    """
    z = check_float(noise_multiplier, "noise_multiplier", minimum=0.0, min_inclusive=False)
    rounds, q, delta = _check_common(rounds, sample_rate, delta)
    return epsilon_for_history([(z, q, rounds)], delta, accountant)


def noise_multiplier_for(
    epsilon: float, delta: float, rounds: int, sample_rate: float, accountant: str = "prv", tol: float = 0.005
) -> float:
    """Smallest noise multiplier (up to ``tol`` in epsilon) with ``epsilon_for(...) <= epsilon``.

    Bisection on :func:`epsilon_for` (monotone decreasing in z); the returned z is always
    on the safe side: ``epsilon_for(z, ...) <= epsilon``.
    """
    epsilon = check_float(epsilon, "epsilon", minimum=0.0, min_inclusive=False)
    rounds, q, delta = _check_common(rounds, sample_rate, delta)
    rounds = max(rounds, 1)
    accountant = _check_accountant(accountant)
    if _closed_form(((1.0, q, rounds),), accountant):
        return _exact_z(epsilon, delta, [(1.0, rounds)])

    def eps(z):
        return epsilon_for_history([(z, q, rounds)], delta, accountant)

    return _bisect_z(eps, epsilon, tol, f"delta={delta} over {rounds} rounds")


def schedule_history(noise_multiplier: float, schedule) -> list[tuple[float, float, int]]:
    """The accountant history of a weighted schedule ``[(weight, rounds), ...]`` at base noise z:
    a round of weight w is the Gaussian mechanism with noise multiplier ``z / sqrt(w)``
    (sensitivity 1, full participation)."""
    return [(noise_multiplier / math.sqrt(w), 1.0, int(n)) for w, n in schedule if int(n) > 0]


def noise_multiplier_for_schedule(
    epsilon: float, delta: float, schedule, accountant: str = "prv", tol: float = 0.005
) -> float:
    """Smallest base noise multiplier z (up to ``tol`` in epsilon) whose weighted schedule fits.

    ``schedule = [(weight, rounds), ...]``: ``rounds`` rounds with noise multiplier
    ``z / sqrt(weight)`` each (full participation). The composition of these heterogeneous
    Gaussian mechanisms is evaluated by the chosen accountant in one go (the PRV accountant
    composes the privacy loss distributions of different mechanisms numerically), so the
    returned z satisfies ``epsilon_for_history(schedule_history(z, schedule), delta) <= epsilon``.
    Under mu-GDP a round of weight w spends a share ``w / sum_i w_i n_i`` of mu^2.
    """
    epsilon = check_float(epsilon, "epsilon", minimum=0.0, min_inclusive=False)
    delta = check_float(delta, "delta", minimum=0.0, maximum=1.0, min_inclusive=False, max_inclusive=False)
    accountant = _check_accountant(accountant)
    sched = []
    for w, n in schedule:
        w = check_float(w, "round weight", minimum=0.0, min_inclusive=False)
        n = check_int(n, "rounds", minimum=0)
        if n:
            sched.append((w, n))
    if not sched:
        sched = [(1.0, 1)]
    if accountant == "prv":  # schedules are full participation: exact
        return _exact_z(epsilon, delta, sched)

    def eps(z):
        return epsilon_for_history(schedule_history(z, sched), delta, accountant)

    return _bisect_z(eps, epsilon, tol, f"delta={delta} over the schedule {sched}")


def _bisect_z(eps, epsilon: float, tol: float, what: str) -> float:
    lo, hi = 0.0, 1.0
    while eps(hi) > epsilon:
        lo, hi = hi, hi * 2
        if hi > _MAX_Z:
            raise InputError(
                f"epsilon={epsilon} is unreachable for {what} "
                f"(noise multiplier would exceed {_MAX_Z:g}); raise epsilon or lower the rounds."
            )
    # invariant: eps(hi) <= epsilon < eps(lo) (lo = 0 means infinite epsilon)
    while True:
        e_hi = eps(hi)
        if epsilon - e_hi <= tol or hi - lo <= 1e-6 * hi:
            return hi
        mid = 0.5 * (lo + hi)
        if eps(mid) <= epsilon:
            hi = mid
        else:
            lo = mid


def _norm_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def gdp_delta(mu: float, epsilon: float) -> float:
    """delta(eps) of mu-GDP (Dong, Roth & Su 2019, Corollary 2.13)."""
    a = -epsilon / mu + mu / 2
    b = -epsilon / mu - mu / 2
    # e^eps Phi(b) computed in log space to avoid overflow for large eps
    from scipy.special import log_ndtr

    return _norm_cdf(a) - math.exp(epsilon + float(log_ndtr(b)))


def gdp_mu(epsilon: float, delta: float) -> float:
    """The largest mu at which mu-GDP is (epsilon, delta)-DP (delta(eps) grows with mu)."""
    epsilon = check_float(epsilon, "epsilon", minimum=0.0, min_inclusive=False)
    delta = check_float(delta, "delta", minimum=0.0, maximum=1.0, min_inclusive=False, max_inclusive=False)
    from scipy.optimize import brentq

    hi = 1.0
    while gdp_delta(hi, epsilon) < delta:
        hi *= 2
        if hi > 1e6:
            raise InputError(f"no mu-GDP mechanism reaches delta={delta} at epsilon={epsilon}")
    return float(brentq(lambda m: gdp_delta(m, epsilon) - delta, 1e-12, hi, xtol=1e-15, rtol=1e-14))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The epsilon at which mu-GDP gives (epsilon, delta)-DP, by root finding on :func:`gdp_delta`.

    For T rounds of the Gaussian mechanism with noise multiplier z and full
    participation, mu = sqrt(T) / z (Dong, Roth & Su 2019, Corollary 3.3).
    """
    mu = check_float(mu, "mu", minimum=0.0, min_inclusive=False)
    delta = check_float(delta, "delta", minimum=0.0, maximum=1.0, min_inclusive=False, max_inclusive=False)
    from scipy.optimize import brentq

    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    hi = 1.0
    while gdp_delta(mu, hi) > delta:
        hi *= 2
    return float(brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi, xtol=1e-12, rtol=1e-12))


class PrivacyAccountant:
    """Tracks the Gaussian rounds actually run against a target (epsilon, delta).

    ``step(sample_rate)`` records one round with the accountant's noise multiplier (or with
    ``noise_multiplier=`` for a heterogeneous history, e.g. a weighted round schedule);
    ``spent()`` returns the (epsilon, delta) of the history; ``would_exceed(sample_rate)``
    says whether one more such round would take epsilon past the target.

    A fast path avoids recomputing the PRV: a history of n steps with rates <= q_max and
    noise multipliers >= z_min is dominated by n steps at (z_min, q_max) (the subsampled
    Gaussian's epsilon grows with q, with 1/z and with the number of steps), so if that bound is within the target no exact evaluation
    is needed. ``spent()`` reports the smaller of the exact value and that bound (both
    are valid upper bounds).
    """

    def __init__(self, noise_multiplier: float, target_epsilon: float, target_delta: float, accountant: str = "prv"):
        self.noise_multiplier = check_float(noise_multiplier, "noise_multiplier", minimum=0.0, min_inclusive=False)
        self.target_epsilon = check_float(target_epsilon, "target_epsilon", minimum=0.0, min_inclusive=False)
        self.target_delta = check_float(target_delta, "target_delta", minimum=0.0, maximum=1.0, min_inclusive=False)
        self.accountant = _check_accountant(accountant)
        self.history: list[tuple[float, float, int]] = []

    @property
    def steps(self) -> int:
        return sum(n for _, _, n in self.history)

    def _with(self, sample_rate: float, noise_multiplier: float | None = None):
        hist = [list(h) for h in self.history]
        z = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        if hist and hist[-1][0] == z and hist[-1][1] == sample_rate:
            hist[-1][2] += 1
        else:
            hist.append([z, sample_rate, 1])
        return [tuple(h) for h in hist]

    def _epsilon(self, history) -> float:
        if not history:
            return 0.0
        if len(history) == 1:
            return epsilon_for_history(history, self.target_delta, self.accountant)
        q_max = max(q for _, q, _ in history)
        z_min = min(z for z, _, _ in history)
        n = sum(n for _, _, n in history)
        bound = epsilon_for_history([(z_min, q_max, n)], self.target_delta, self.accountant)
        if bound <= self.target_epsilon:
            return bound
        exact = epsilon_for_history(history, self.target_delta, self.accountant)
        return min(exact, bound)

    def would_exceed(self, sample_rate: float = 1.0, noise_multiplier: float | None = None) -> bool:
        """True if one more round at ``sample_rate`` (noise multiplier: the accountant's, or the
        one given) would spend more than the target epsilon."""
        q = check_float(sample_rate, "sample_rate", minimum=0.0, maximum=1.0, min_inclusive=False)
        return self._epsilon(self._with(q, noise_multiplier)) > self.target_epsilon

    def step(self, sample_rate: float = 1.0, noise_multiplier: float | None = None) -> None:
        """Record one round (noise multiplier: the accountant's, or the one given)."""
        q = check_float(sample_rate, "sample_rate", minimum=0.0, maximum=1.0, min_inclusive=False)
        self.history = self._with(q, noise_multiplier)

    def spent(self) -> tuple[float, float]:
        """(epsilon, delta) spent so far; (0, 0) before any round."""
        if not self.history:
            return (0.0, 0.0)
        return (self._epsilon(self.history), self.target_delta)
