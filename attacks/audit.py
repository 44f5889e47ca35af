"""Empirical privacy auditing: high-confidence lower bounds on the epsilon a mechanism spends.

Threat model
------------
The auditor plays the differential-privacy *distinguishing game*: it fixes two
neighbouring datasets D_out, D_in = D_out + {canary}, the mechanism is run on one of them
(a fair coin per trial), and an attacker turns each release into a real *score* (high:
"the canary was in"). Any threshold test ``score >= t`` then has a false-positive rate FPR
(out-runs called in) and a false-negative rate FNR (in-runs called out). If the mechanism
is (epsilon, delta)-DP, every test satisfies (Kairouz, Oh & Viswanath 2015)

    FPR + e^epsilon FNR >= 1 - delta   and   FNR + e^epsilon FPR >= 1 - delta,

so observed rates that violate it *refute* the claim. Because the rates are estimated from
finitely many trials, every bound here is computed from one-sided Clopper-Pearson upper
bounds on FPR and FNR and holds with probability at least ``1 - alpha`` over the trials
(union bound over every interval used). A returned ``epsilon_lower_bound`` of 0 means
"nothing refuted", never "the mechanism is private".

Methods (``audit_epsilon(..., method=...)``)
--------------------------------------------
``"clopper-pearson"`` -- Jagielski, Ullman & Oprea (2020), "Auditing Differentially Private
Machine Learning: How Private is Private SGD?" (NeurIPS); Nasr, Song, Thakurta, Papernot &
Carlini (2021), "Adversary Instantiation: Lower Bounds for Differentially Private Machine
Learning" (IEEE S&P). With FPR_ub, FNR_ub the (1 - alpha') CP upper bounds at a threshold,

    eps_lb = max( log((1 - delta - FNR_ub) / FPR_ub), log((1 - delta - FPR_ub) / FNR_ub) ).

Valid for *any* mechanism.

``"gdp"`` -- Nasr, Hayes, Steinke, Balle, Tramer, Jagielski, Carlini & Terzis (2023), "Tight
Auditing of Differentially Private Machine Learning" (USENIX Security). A mu-GDP mechanism
(Dong, Roth & Su 2019) has trade-off curve FNR >= Phi(Phi^-1(1 - FPR) - mu), hence

    mu_lb = Phi^-1(1 - FPR_ub) - Phi^-1(FNR_ub)

and ``eps_lb = gdp_epsilon(mu_lb, delta)`` (:func:`protocols.dp.accounting.gdp_epsilon`,
Dong et al. Cor. 2.13). *Assumption*: the mechanism's privacy profile is that of some
Gaussian mechanism (true of GaussianDP's rounds, Balle & Wang 2018); then the bound is a
valid (1 - alpha) lower bound on the epsilon of that profile at ``delta``. For an arbitrary
mechanism only ``mu_lb`` (a bound on the best-fitting GDP parameter) is meaningful, and
``details["epsilon_cp"]`` holds the assumption-free Clopper-Pearson bound of the same test.

``"one-run"`` -- Steinke, Nasr & Jagielski (2023), "Privacy Auditing with One (1) Training
Run" (NeurIPS). m canaries, each included independently with probability 1/2; the attacker
guesses "in" for its k+ highest scores and "out" for its k- lowest (r = k+ + k- guesses)
and gets v right. Under (epsilon, delta)-DP (their Theorem 3.1 / Appendix D)

    P[V >= v] <= beta(v) + 2 m delta * max_{i=1..v} P[v > B >= v - i] / i,
    beta(v) = P[B >= v],   B ~ Binomial(r, e^eps / (1 + e^eps)),

and eps_lb is the largest epsilon whose p-value is below alpha. The inclusion bits
must be i.i.d. fair coins (``run_dp_game`` draws them so); the scores may come from one
release holding all canaries or, as here, from independent releases, one per canary.

One run under f-DP (:func:`gdp_one_run_epsilon`)
------------------------------------------------
The same guessing game scored against a mu-GDP claim instead of (epsilon, delta): the
p-value of v correct of r guesses is that of the best guesser on m independent Gaussian
channels, an order-statistics integral (derivation in :func:`gdp_one_run_p_value`; Dong,
Roth & Su 2019; the route of Xiang et al. 2025, "Tight Privacy Audit in One Run").
*Assumption*: the evidence is a product over canaries of channels with trade-off >= G_mu.
Used by :func:`attacks.audit_one_run.one_run_audit`, beside the Steinke et al. bound.

Choosing thresholds honestly
----------------------------
``thresholds="split"`` (default): the scores are split at random in two halves; the
threshold (CP/GDP) or the guess counts (one-run) are chosen on the first half, the bound is
computed on the second -- no multiple-testing correction needed (Nasr et al. 2021).
``thresholds=<array>`` / ``guesses=<list of (k+, k-)>``: every candidate is evaluated on all
scores with a Bonferroni correction (alpha / number of candidates, and / 2 for the two
intervals FPR and FNR).

What defeats an audit: nothing makes a *correct* mechanism fail; an audit can only find
epsilon too low (weak attacker, few trials). It flags a *broken* mechanism (missing noise on
a field, clipping not applied, wrong sensitivity) when its empirical epsilon exceeds the
accountant's ``privacy_spent`` -- with probability at most alpha of a false alarm.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special, stats

from securefkm.validation import check_random_state
from securefkm.exceptions import InputError


METHODS = ("clopper-pearson", "gdp", "one-run")
BROKEN = (None, "no_count_noise", "no_clipping", "small_noise", "uncharged_round")


# ---------------------------------------------------------------- validation helpers
def _scores(x, name) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a 1-D array of real scores.") from None
    if a.size == 0:
        raise InputError(f"{name} is empty; the audit needs at least one score of each kind.")
    if not np.all(np.isfinite(a)):
        raise InputError(f"{name} contains NaN or inf; scores must be finite.")
    return a


def _prob(x, name, *, open_low=True, open_high=True) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise InputError(f"{name} must be a number in (0, 1), got {x!r}.")
    x = float(x)
    if not ((0 < x if open_low else 0 <= x) and (x < 1 if open_high else x <= 1)):
        raise InputError(f"{name} must lie in {'(' if open_low else '['}0, 1{')' if open_high else ']'}, got {x}.")
    return x


# ---------------------------------------------------------------- Clopper-Pearson
def clopper_pearson(k, n, alpha: float = 0.05, side: str = "upper"):
    """Exact binomial confidence bound(s) for a proportion (Clopper & Pearson 1934).

    ``k`` successes out of ``n`` (arrays broadcast). ``side="upper"``: the one-sided
    (1 - alpha) upper bound ``Beta^-1(1 - alpha; k + 1, n - k)`` (1 when k = n);
    ``"lower"``: ``Beta^-1(alpha; k, n - k + 1)`` (0 when k = 0); ``"two-sided"``: the
    pair (lower, upper) at alpha / 2 each.
    """
    alpha = _prob(alpha, "alpha")
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n) or np.any(k != np.round(k)) or np.any(n != np.round(n)):
        raise InputError("clopper_pearson: k and n must be integers with 0 <= k <= n and n >= 1.")
    if side == "two-sided":
        return clopper_pearson(k, n, alpha / 2, "lower"), clopper_pearson(k, n, alpha / 2, "upper")
    with np.errstate(invalid="ignore", divide="ignore"):
        if side == "upper":
            out = np.where(k >= n, 1.0, stats.beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1e-300)))
        elif side == "lower":
            out = np.where(k <= 0, 0.0, stats.beta.ppf(alpha, np.maximum(k, 1e-300), n - k + 1))
        else:
            raise InputError(f"side must be 'upper', 'lower' or 'two-sided', got {side!r}.")
    return out if out.ndim else float(out)


def error_counts(scores_in, scores_out, thresholds):
    """(false negatives, false positives) of the tests ``score >= t`` for each threshold t.

    FN = #{in-scores < t}, FP = #{out-scores >= t}; vectorised by sorting.
    """
    sin = np.sort(np.asarray(scores_in, dtype=np.float64))
    sout = np.sort(np.asarray(scores_out, dtype=np.float64))
    t = np.asarray(thresholds, dtype=np.float64)
    fn = np.searchsorted(sin, t, side="left")
    fp = sout.size - np.searchsorted(sout, t, side="left")
    return fn, fp


def cp_epsilon(fnr_ub, fpr_ub, delta: float):
    """Epsilon refuted by upper bounds on (FNR, FPR): the larger of the two DP inequalities."""
    fnr_ub = np.asarray(fnr_ub, dtype=np.float64)
    fpr_ub = np.asarray(fpr_ub, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1 - delta - fnr_ub, 0.0) / fpr_ub)
        b = np.log(np.maximum(1 - delta - fpr_ub, 0.0) / fnr_ub)
    e = np.fmax(np.nan_to_num(a, nan=-np.inf), np.nan_to_num(b, nan=-np.inf))
    return np.maximum(e, 0.0)


def gdp_mu(fnr_ub, fpr_ub):
    """Largest mu a mu-GDP trade-off curve must have to allow (FPR, FNR) at their upper bounds.

    mu_lb = Phi^-1(1 - FPR_ub) - Phi^-1(FNR_ub), clipped at 0 (symmetric in the two rates).
    """
    fnr_ub = np.clip(np.asarray(fnr_ub, dtype=np.float64), 1e-300, 1.0)
    fpr_ub = np.clip(np.asarray(fpr_ub, dtype=np.float64), 1e-300, 1.0)
    return np.maximum(stats.norm.isf(fpr_ub) - stats.norm.ppf(fnr_ub), 0.0)


def gdp_mu_to_epsilon(mu: float, delta: float) -> float:
    """Epsilon of mu-GDP at delta (Dong, Roth & Su 2019, Cor. 2.13); 0 for mu = 0.

    Delegates to :func:`protocols.dp.accounting.gdp_epsilon` (the accountant's own formula).
    """
    from protocols.dp.accounting import gdp_epsilon

    if not np.isfinite(mu):
        return float("inf")
    if mu <= 0:
        return 0.0
    return gdp_epsilon(float(mu), delta)


# ---------------------------------------------------------------- one run (Steinke et al. 2023)
def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P-value of v correct guesses out of r under (epsilon, delta)-DP (Steinke et al. 2023, App. D).

    ``beta + 2 m delta * max_{i=1..v} P[v > B >= v - i] / i`` with B ~ Bin(r, e^eps/(1+e^eps)),
    ``beta = P[B >= v]``; capped at 1.
    """
    if not (0 <= v <= r <= m):
        raise InputError(f"one-run audit needs 0 <= v <= r <= m, got v={v}, r={r}, m={m}.")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    beta = float(stats.binom.sf(v - 1, r, q))
    if delta > 0 and v > 0:
        i = np.arange(1, v + 1)
        cum = np.cumsum(stats.binom.pmf(v - i, r, q))  # P[v > B >= v - i]
        beta += 2 * m * delta * float(np.max(cum / i))
    return min(beta, 1.0)


def one_run_epsilon(m: int, r: int, v: int, delta: float, alpha: float = 0.05, tol: float = 1e-4) -> float:
    """Largest epsilon refuted at confidence 1 - alpha by v of r correct guesses on m canaries.

    Bisection on the (increasing in epsilon) p-value: returns sup{eps : p(eps) < alpha}, 0 if
    even eps = 0 is not refuted.
    """
    alpha = _prob(alpha, "alpha")
    if r == 0 or one_run_p_value(m, r, v, 0.0, delta) >= alpha:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) < alpha:
        lo, hi = hi, 2 * hi
        if hi > 1e3:
            return float(lo)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if one_run_p_value(m, r, v, mid, delta) < alpha else (lo, mid)
    return float(lo)


def _one_run_correct(scores_in, scores_out, k_pos: int, k_neg: int, rng) -> int:
    """Correct guesses when the k_pos highest scores are called in and the k_neg lowest out
    (ties broken at random)."""
    s = np.concatenate([scores_in, scores_out])
    truth = np.concatenate([np.ones(scores_in.size, bool), np.zeros(scores_out.size, bool)])
    order = np.lexsort((rng.random(s.size), s))  # ascending score, random tie-break
    low, high = order[:k_neg], order[s.size - k_pos:] if k_pos else order[:0]
    return int(truth[high].sum() + (~truth[low]).sum())


def _default_guesses(m: int):
    fr = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
    out = sorted({(max(1, int(f * m) // 2), max(1, int(f * m) // 2)) for f in fr if int(f * m) >= 2})
    return out or [(m // 2, m - m // 2)]


# ---------------------------------------------------------------- one run under f-DP (Gaussian trade-off)
def _gdp_tail_inverse(u: np.ndarray, a: float) -> np.ndarray:
    """t >= 0 with Phi-bar(t - a) + Phi-bar(t + a) = u (u in (0, 1]), by bisection (vectorised)."""
    lo = np.zeros_like(u)
    hi = np.full_like(u, 40.0 + a)
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        above = special.ndtr(a - mid) + special.ndtr(-a - mid) > u
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    return hi  # the larger end: t(u) is never under-estimated, so q(t) never is


def gdp_one_run_p_value(m: int, r: int, v: int, mu: float, grid: int = 2000) -> float:
    """P[V* >= v] for the best r guesses on m canaries behind independent mu-GDP channels.

    **The model** (Dong, Roth & Su 2019, Gaussian differential privacy): canary i's bit
    S_i ~ Bernoulli(1/2) i.i.d.; the auditor's evidence on canary i is a channel whose
    trade-off curve is at least G_mu (Def. 2.6), independent across canaries. By Blackwell's
    theorem (Dong et al. Thm 2.10) each such channel is a post-processing of the Gaussian
    channel X_i ~ N(mu S_i, 1), so any guesser on the real evidence is a guesser on
    X_1..X_m, and V (correct guesses among r made) is stochastically dominated by the
    V* of the best guesser on X. Given X the bits are independent with MAP-correctness
    sigmoid(mu C_i), C_i = |X_i - mu/2|; choosing the r largest C_i (coordinatewise the
    largest success probabilities) gives a Poisson-binomial that dominates every other
    choice of r, so V* = correct MAP guesses on the r most confident canaries.

    **Order statistics** (Xiang et al. 2025, "Tight Privacy Audit in One Run", take this
    route): C has tail F-bar(t) = Phi-bar(t - mu/2) + Phi-bar(t + mu/2), and since
    sigmoid(mu c) (phi(c - mu/2) + phi(c + mu/2)) = phi(c - mu/2), a guess above the
    threshold t is correct with probability q(t) = Phi-bar(t - mu/2) / F-bar(t). Given the
    (r+1)-th largest confidence T, the r above it are i.i.d. given C > T, so
    V* | T ~ Bin(r, q(T)); U = F-bar(T) ~ Beta(r + 1, m - r). Hence

        P[V* >= v] = int_0^1 P[Bin(r, q(t(u))) >= v] Beta(r + 1, m - r)(du),

    with r = m meaning T = 0 (q = Phi(mu/2)). The integrand decreases in u, so the
    left-endpoint sum over probability cells of the Beta law (``grid`` equal ones, the first
    refined geometrically) is an *upper* bound on the integral: the p-value is never
    under-stated (slack <= 1/grid).
    """
    if not (0 <= v <= r <= m) or r < 1:
        raise InputError(f"the one-run f-DP audit needs 1 <= r <= m and 0 <= v <= r, got m={m}, r={r}, v={v}.")
    if v == 0:
        return 1.0
    a = 0.5 * float(mu)
    if r == m:
        return float(special.bdtrc(v - 1, r, special.ndtr(a)))
    u, cell = _beta_grid(r + 1, m - r, grid)
    q = np.ones_like(u)
    pos = u > 0
    t = _gdp_tail_inverse(u[pos], a)
    q[pos] = special.ndtr(a - t) / (special.ndtr(a - t) + special.ndtr(-a - t))
    return float(min(1.0, np.dot(cell, special.bdtrc(v - 1, r, np.clip(q, 0.0, 1.0)))))


@functools.lru_cache(maxsize=64)
def _beta_grid(a: int, b: int, grid: int):
    """Beta(a, b) quantiles at the left ends of probability cells, and the cells' widths: the
    ``grid`` equal cells, the first one cut geometrically down to width 1e-15 (so that the
    left-endpoint sum bounds p-values far below 1/grid, not only above it)."""
    w = np.unique(np.concatenate([[0.0], np.geomspace(1e-15, 1.0 / grid, 40), np.arange(1, grid + 1) / grid]))
    u = stats.beta.ppf(w[:-1], a, b)
    cell = np.diff(w)
    u.flags.writeable = cell.flags.writeable = False
    return u, cell


def gdp_one_run_mu(m: int, r: int, v: int, alpha: float = 0.05, tol: float = 1e-4) -> float:
    """Largest mu refuted at confidence 1 - alpha: sup{mu : P_mu[V* >= v] < alpha} (0 if none).

    The p-value increases with mu (a G_mu channel is a post-processing of a G_mu' channel for
    mu <= mu'), so bisection applies.
    """
    alpha = _prob(alpha, "alpha")
    if gdp_one_run_p_value(m, r, v, 0.0) >= alpha:
        return 0.0
    lo, hi = 0.0, 0.5
    while gdp_one_run_p_value(m, r, v, hi) < alpha:
        lo, hi = hi, 2 * hi
        if hi > 64:
            return float(lo)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gdp_one_run_p_value(m, r, v, mid) < alpha else (lo, mid)
    return float(lo)


def gdp_one_run_epsilon(m: int, r: int, v: int, delta: float, alpha: float = 0.05) -> float:
    """The epsilon at ``delta`` of the largest refuted mu-GDP curve (Dong et al. Cor. 2.13)."""
    return gdp_mu_to_epsilon(gdp_one_run_mu(m, r, v, alpha), delta)


# ---------------------------------------------------------------- the audit
@dataclass
class AuditResult:
    """An empirical epsilon lower bound with its method, confidence and the evidence.

    ``epsilon_lower_bound`` holds with probability >= ``1 - alpha`` over the audit's trials
    (for ``method="gdp"``: under the GDP-shape assumption, see the module docstring).
    ``claimed_epsilon`` is the accountant's epsilon when the audit came from a game.
    """

    epsilon_lower_bound: float
    method: str
    alpha: float
    delta: float
    details: dict[str, Any] = field(default_factory=dict)
    claimed_epsilon: float | None = None

    @property
    def confidence(self) -> float:
        return 1.0 - self.alpha

    @property
    def violates_claim(self) -> bool | None:
        """True when the audit refutes the claimed epsilon (at the stated confidence)."""
        if self.claimed_epsilon is None:
            return None
        return bool(self.epsilon_lower_bound > self.claimed_epsilon)


def _split(a, frac, rng):
    idx = rng.permutation(a.size)
    c = int(round(frac * a.size))
    return a[idx[:c]], a[idx[c:]]


def _rate_bounds(sin, sout, thr, alpha_each):
    fn, fp = error_counts(sin, sout, thr)
    return clopper_pearson(fn, sin.size, alpha_each), clopper_pearson(fp, sout.size, alpha_each), fn, fp


def _threshold_candidates(sin, sout, max_candidates=400):
    pooled = np.unique(np.concatenate([sin, sout]))
    if pooled.size > max_candidates:
        pooled = np.unique(np.quantile(pooled, np.linspace(0, 1, max_candidates)))
    return np.concatenate([pooled, [np.inf]])


def audit_epsilon(
    scores_in,
    scores_out,
    delta: float,
    alpha: float = 0.05,
    method: str = "clopper-pearson",
    *,
    thresholds="split",
    split_fraction: float = 0.5,
    guesses=None,
    random_state=None,
    claimed_epsilon: float | None = None,
) -> AuditResult:
    """Empirical epsilon lower bound at confidence ``1 - alpha`` from attack scores.

    ``scores_in``: scores of trials where the canary was in (high = "in"); ``scores_out``:
    trials where it was out. ``delta``: the delta of the claim being audited. ``method``:
    "clopper-pearson", "gdp" or "one-run" (module docstring for formulas and papers).
    ``thresholds``: "split" (choose on a random ``split_fraction`` of the scores, bound on
    the rest) or an array of thresholds evaluated on all scores with Bonferroni correction.
    ``guesses`` (one-run): list of (k_pos, k_neg) guess counts, Bonferroni over the list;
    default "split" picks them on the first part. ``claimed_epsilon`` is only recorded.
    """
    sin = _scores(scores_in, "scores_in")
    sout = _scores(scores_out, "scores_out")
    delta = _prob(delta, "delta", open_low=False)
    alpha = _prob(alpha, "alpha")
    if method not in METHODS:
        raise InputError(f"method must be one of {METHODS}, got {method!r}.")
    split_fraction = _prob(split_fraction, "split_fraction")
    rng = check_random_state(random_state)
    details: dict[str, Any] = {"n_in": int(sin.size), "n_out": int(sout.size)}

    if method == "one-run":
        eps, det = _audit_one_run(sin, sout, delta, alpha, thresholds, split_fraction, guesses, rng)
        details.update(det)
        return AuditResult(eps, method, alpha, delta, details, claimed_epsilon)

    def objective(fnr_ub, fpr_ub):
        return gdp_mu(fnr_ub, fpr_ub) if method == "gdp" else cp_epsilon(fnr_ub, fpr_ub, delta)

    if isinstance(thresholds, str):
        if thresholds != "split":
            raise InputError(f"thresholds must be 'split' or an array of thresholds, got {thresholds!r}.")
        if min(sin.size, sout.size) < 4:
            raise InputError("thresholds='split' needs at least 4 scores of each kind; pass thresholds=<array>.")
        sel_in, ev_in = _split(sin, split_fraction, rng)
        sel_out, ev_out = _split(sout, split_fraction, rng)
        cand = _threshold_candidates(sel_in, sel_out)
        fnr_s, fpr_s, _, _ = _rate_bounds(sel_in, sel_out, cand, alpha / 2)
        thr = np.array([cand[int(np.argmax(objective(fnr_s, fpr_s)))]])
        alpha_each = alpha / 2
        ev_in_, ev_out_ = ev_in, ev_out
        details["threshold_strategy"] = f"split (select on {split_fraction:.0%}, bound on the rest)"
    else:
        thr = np.asarray(thresholds, dtype=np.float64).ravel()
        if thr.size == 0 or np.any(np.isnan(thr)):
            raise InputError("thresholds must be a non-empty array of numbers (or 'split').")
        alpha_each = alpha / (2 * thr.size)
        ev_in_, ev_out_ = sin, sout
        details["threshold_strategy"] = f"Bonferroni over {thr.size} thresholds"
    fnr_ub, fpr_ub, fn, fp = _rate_bounds(ev_in_, ev_out_, thr, alpha_each)
    fnr_ub, fpr_ub = np.atleast_1d(fnr_ub), np.atleast_1d(fpr_ub)
    obj = np.atleast_1d(objective(fnr_ub, fpr_ub))
    j = int(np.argmax(obj))
    eps_cp = float(np.max(cp_epsilon(fnr_ub, fpr_ub, delta)))
    details.update(
        threshold=float(thr[j]), fn=int(np.atleast_1d(fn)[j]), fp=int(np.atleast_1d(fp)[j]),
        n_in_eval=int(ev_in_.size), n_out_eval=int(ev_out_.size),
        fnr_ub=float(fnr_ub[j]), fpr_ub=float(fpr_ub[j]), epsilon_cp=eps_cp,
    )
    if method == "gdp":
        mu = float(obj[j])
        details["mu_lower_bound"] = mu
        details["assumption"] = "mechanism has a Gaussian (mu-GDP) trade-off curve"
        eps = gdp_mu_to_epsilon(mu, delta) if delta > 0 else (float("inf") if mu > 0 else 0.0)
    else:
        eps = float(obj[j])
    return AuditResult(float(eps), method, alpha, delta, details, claimed_epsilon)


def _audit_one_run(sin, sout, delta, alpha, thresholds, split_fraction, guesses, rng):
    det: dict[str, Any] = {}
    if guesses is None and thresholds == "split":
        if min(sin.size, sout.size) < 4:
            raise InputError("one-run with the split strategy needs at least 4 scores of each kind; pass guesses=[(k+, k-)].")
        sel_in, ev_in = _split(sin, split_fraction, rng)
        sel_out, ev_out = _split(sout, split_fraction, rng)
        m_sel = sel_in.size + sel_out.size
        best, best_eps = None, -1.0
        for kp, kn in _default_guesses(m_sel):
            v = _one_run_correct(sel_in, sel_out, kp, kn, rng)
            e = one_run_epsilon(m_sel, kp + kn, v, delta, alpha)
            if e > best_eps:
                best, best_eps = (kp, kn), e
        m_ev = ev_in.size + ev_out.size
        frac = m_ev / m_sel
        cand = [(max(0, min(m_ev, round(best[0] * frac))), max(0, min(m_ev, round(best[1] * frac))))]
        if sum(cand[0]) > m_ev:
            cand = [(m_ev // 2, m_ev - m_ev // 2)]
        alpha_each = alpha
        det["threshold_strategy"] = f"split (guess counts chosen on {split_fraction:.0%})"
    else:
        ev_in, ev_out = sin, sout
        m_ev = sin.size + sout.size
        cand = [(int(a), int(b)) for a, b in (guesses or _default_guesses(m_ev))]
        if any(a < 0 or b < 0 or a + b > m_ev or a + b == 0 for a, b in cand):
            raise InputError(f"guesses must be pairs (k_pos, k_neg) >= 0 with 0 < k_pos + k_neg <= m = {m_ev}, got {cand}.")
        alpha_each = alpha / len(cand)
        det["threshold_strategy"] = f"Bonferroni over {len(cand)} guess counts"
    best_eps, best = 0.0, None
    for kp, kn in cand:
        v = _one_run_correct(ev_in, ev_out, kp, kn, rng)
        e = one_run_epsilon(m_ev, kp + kn, v, delta, alpha_each)
        if best is None or e > best_eps:
            best_eps, best = e, {"k_pos": kp, "k_neg": kn, "r": kp + kn, "correct": v, "m": m_ev}
    det.update(best)
    return float(best_eps), det


# ---------------------------------------------------------------- the DP game
@dataclass
class DPGame:
    """A distinguishing game: ``mechanism(data, n)`` returns n independent releases on
    ``data`` (a dict of arrays with a leading axis n); ``score(releases)`` maps them to n
    real scores; ``neighbour_pair = (D_out, D_in)``; ``claimed_epsilon``/``delta`` are the
    accountant's (epsilon, delta) for one release."""

    mechanism: Callable
    neighbour_pair: tuple
    score: Callable
    claimed_epsilon: float
    delta: float
    info: dict = field(default_factory=dict)


@dataclass
class GameScores:
    scores_in: np.ndarray
    scores_out: np.ndarray
    bits: np.ndarray


def run_dp_game(mechanism, neighbour_pair, n_trials: int, *, score=None, random_state=None, batch: int = 4096) -> GameScores:
    """Play ``n_trials`` rounds of the DP game: a fair coin per trial picks D_in or D_out.

    Returns the scores of the in-trials and out-trials (and the coin flips). ``mechanism``
    must accept ``(data, n)`` and return n releases; ``score`` maps releases to scores
    (identity if None). The coins are i.i.d. Bernoulli(1/2), as the one-run audit needs.
    """
    if not callable(mechanism):
        raise InputError("mechanism must be a callable (data, n) -> n releases.")
    try:
        d_out, d_in = neighbour_pair
    except (TypeError, ValueError):
        raise InputError("neighbour_pair must be a pair (D_out, D_in).") from None
    if isinstance(n_trials, bool) or not isinstance(n_trials, (int, np.integer)) or n_trials < 2:
        raise InputError(f"n_trials must be an int >= 2, got {n_trials!r}.")
    rng = check_random_state(random_state)
    bits = rng.random(int(n_trials)) < 0.5
    score = score or (lambda r: np.asarray(r, dtype=np.float64))

    def play(data, n):
        out = []
        for s in range(0, n, batch):
            out.append(np.asarray(score(mechanism(data, min(batch, n - s))), dtype=np.float64).ravel())
        return np.concatenate(out) if out else np.zeros(0)

    return GameScores(play(d_in, int(bits.sum())), play(d_out, int((~bits).sum())), bits)


def gaussian_dp_round_game(
    epsilon: float = 1.0,
    delta: float = 1e-5,
    clip: float = 1.0,
    mode: str = "central",
    broken: str | None = None,
    *,
    score: str = "lr",
    n_clients: int = 4,
    records_per_client: int = 6,
    n_features: int = 2,
    canary_scale: float = 50.0,
    random_state=None,
) -> DPGame:
    """One DWF training round's sum-fields under the real GaussianDP layer, as a DP game.

    The data: ``n_clients`` clients with records inside the ball of radius 0.3 clip; two
    data centres near the origin and a third centre at ``clip * u``. The canary, held by
    client 0, is ``canary_scale * clip * u`` -- far from the data, alone in its own cell; a
    correct layer clips it to norm ``clip`` (the worst case the sensitivity allows). The
    release is one DWF round (:class:`securefkm.algorithms.dwf.WeightedFederatedKMeansAlgorithm`,
    one local step: per-cell counts and coordinate sums) passed through the layer's real
    hooks ``client_data`` -> ``client_update`` -> sum -> ``server_aggregate``; the claim is
    the layer's own ``report()["privacy_spent"]`` after ``after_round``. The layer's
    post-processing of the release (``project_means``) is switched off: the game audits the
    noised release, and post-processing can only lower what an auditor measures.

    ``score``: "lr" (the likelihood-ratio statistic of the claimed Gaussian mechanism,
    count/sigma_w^2 + (sum . u) clip / sigma_S^2 in the canary's cell -- optimal for the
    correct layer), "count" (the cell's released count) or "sum" (its sum along u).
    ``broken``: None, "no_count_noise" (a copy of GaussianDP whose count fields are released
    noise-free), "no_clipping" (clipping disabled; the canary of norm canary_scale * clip
    goes in unclipped) or "small_noise" (every sigma 20% too small); "uncharged_round" (the
    first round not charged) leaves this one-round game with no charge at all and is meant
    for multi-round audits (:func:`attacks.audit_one_run.one_run_audit`). Modes "central" and "local" ("distributed" needs a secure aggregator's
    codec and is not offered here).

    The layer is called with a leading trial axis on the sum-fields (n releases in one
    call); its noise is drawn per entry (``size`` of the array), so each trial gets fresh,
    independent noise of the calibrated sigma.
    """
    from protocols.dp.layer import GaussianDP
    from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
    from securefkm.layers import ClientContext, RoundContext, RunInfo
    from securefkm.messages import AggregatedUpdate, Broadcast, Update

    if broken not in BROKEN:
        raise InputError(f"broken must be one of {BROKEN}, got {broken!r}.")
    if mode not in ("central", "local"):
        raise InputError(f"mode must be 'central' or 'local' in this game, got {mode!r}.")
    if score not in ("lr", "count", "sum"):
        raise InputError(f"score must be 'lr', 'count' or 'sum', got {score!r}.")
    for name, v in (("n_clients", n_clients), ("records_per_client", records_per_client), ("n_features", n_features)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise InputError(f"{name} must be an int >= 1, got {v!r}.")
    if not (isinstance(canary_scale, (int, float)) and canary_scale >= 1):
        raise InputError(f"canary_scale must be a number >= 1, got {canary_scale!r}.")
    rng = check_random_state(random_state)

    cls = _broken_layer(GaussianDP, broken)
    # the game audits the noised release itself: the layer's post-processing of it (projecting
    # the noisy means into the clip ball) can only hide a broken mechanism, never make it private
    layer = cls(epsilon=epsilon, delta=delta, clip=clip, mode=mode, project_means=False)
    d = int(n_features)
    clip = float(layer.clip)
    u = np.zeros(d)
    u[0] = 1.0
    clients = []
    for _ in range(n_clients):
        X = rng.normal(size=(records_per_client, d))
        X *= (0.3 * clip * rng.random(records_per_client) ** (1 / d) / np.linalg.norm(X, axis=1))[:, None]
        X[:, 0] = -np.abs(X[:, 0])  # data on the far side from the canary
        clients.append(X)
    centres = np.vstack([np.full((1, d), -0.15 * clip), np.full((1, d), -0.05 * clip), clip * u[None, :]])
    cell = 2
    canary = canary_scale * clip * u
    algorithm = WeightedFederatedKMeansAlgorithm(3, init=centres)
    broadcast = Broadcast(action="train", centres=centres,
                          params={"max_local_steps": 1, "local_tol": 0.0, "weighting": "dynamic"})
    specs = algorithm.sum_fields(broadcast)
    info = RunInfo(algorithm, n_clients, d, n_clients, 1, 1)
    layer.validate_stack([layer], algorithm)
    layer.setup(info)
    ctx = RoundContext(run=0, round=0, action="train", sampled=tuple(range(n_clients)), specs=specs,
                       info=info, broadcast=broadcast)
    cctx = [ClientContext(i, len(X) + (i == 0)) for i, X in enumerate(clients)]

    def exact_updates(with_canary: bool):
        datas = [np.vstack([X, canary]) if (i == 0 and with_canary) else X for i, X in enumerate(clients)]
        datas = [layer.client_data(X, cctx[i], ctx) for i, X in enumerate(datas)]
        return algorithm.client_updates(datas, broadcast, [None] * n_clients)

    pair = (exact_updates(False), exact_updates(True))

    def mechanism(updates, n):
        total = {s.name: np.zeros((n,) + s.shape) for s in specs}
        for i, upd in enumerate(updates):
            batched = Update(sums={k: np.broadcast_to(v, (n,) + np.shape(v)).copy() for k, v in upd.sums.items()})
            out = layer.client_update(batched, cctx[i], ctx)
            for k in total:
                total[k] += out.sums[k]
        agg = AggregatedUpdate(sums=total, items={}, contributors=ctx.sampled, specs=specs)
        return layer.server_aggregate(agg, ctx).sums

    # one (unused) release so that the layer reports the sigmas, then the accounting
    mechanism(pair[0], 1)
    layer.after_round(ctx, AggregatedUpdate(sums={}, items={}, contributors=ctx.sampled, specs=specs))
    rep = layer.report()
    claimed = float(rep["privacy_spent"][0])
    sig_w = float(rep["field_sigmas"]["weights"])
    sig_s = float(rep["field_sigmas"]["weighted_centres"])

    def score_fn(rel):
        w = rel["weights"][:, cell]
        s = rel["weighted_centres"][:, cell, :] @ u
        if score == "count":
            return w
        if score == "sum":
            return s
        return w / sig_w**2 + s * clip / sig_s**2

    return DPGame(
        mechanism=mechanism, neighbour_pair=pair, score=score_fn, claimed_epsilon=claimed, delta=float(delta),
        info={"broken": broken, "mode": mode, "score": score, "noise_multiplier": rep["noise_multiplier"],
              "field_sigmas": rep["field_sigmas"], "canary_norm": float(np.linalg.norm(canary)),
              "claimed_mu": float(1.0 / rep["noise_multiplier"]), "layer": layer},
    )


def _broken_layer(base, broken):
    """A subclass of GaussianDP with one injected bug (the original class is untouched)."""
    if broken is None:
        return base
    if broken == "no_clipping":
        class NoClipping(base):
            def client_data(self, X, client, ctx):  # bug: records pass unclipped
                return X
        return NoClipping
    if broken == "small_noise":
        class SmallNoise(base):  # bug: every field's noise 20% below its calibrated sigma
            def field_sigmas(self, *args, **kwargs):
                return {k: (0.8 * sig, step, delta) for k, (sig, step, delta) in super().field_sigmas(*args, **kwargs).items()}
        return SmallNoise
    if broken == "uncharged_round":
        class UnchargedRound(base):  # bug: the run's first noised round is left out of the accountant
            _skipped = False

            def after_round(self, ctx, agg):
                if not self._skipped and self._noised_specs(ctx.specs):
                    self._skipped = True
                    return
                super().after_round(ctx, agg)
        return UnchargedRound

    class NoCountNoise(base):  # bug: count fields released without noise
        def _restore(self, before, after, specs):
            sums = dict(after.sums)
            for s in specs:
                if s.kind == "count":
                    sums[s.name] = np.asarray(before.sums[s.name], dtype=np.float64).copy()
            return sums

        def client_update(self, update, client, ctx):
            out = super().client_update(update, client, ctx)
            if out is None or self.mode != "local":
                return out
            return type(out)(sums=self._restore(update, out, ctx.specs), items=out.items)

        def server_aggregate(self, agg, ctx):
            out = super().server_aggregate(agg, ctx)
            if self.mode != "central":
                return out
            return type(out)(sums=self._restore(agg, out, agg.specs or ctx.specs), items=out.items,
                             contributors=out.contributors, specs=out.specs)
    return NoCountNoise


def audit_dp_game(game: DPGame, n_trials: int = 2000, method: str = "clopper-pearson", alpha: float = 0.05,
                  *, random_state=None, **kw) -> AuditResult:
    """Play ``game`` for ``n_trials`` and audit the scores against its claimed epsilon."""
    if not isinstance(game, DPGame):
        raise InputError(f"game must be a DPGame (e.g. gaussian_dp_round_game(...)), got {type(game).__name__}.")
    rng = check_random_state(random_state)
    gs = run_dp_game(game.mechanism, game.neighbour_pair, n_trials, score=game.score, random_state=rng)
    res = audit_epsilon(gs.scores_in, gs.scores_out, game.delta, alpha, method, random_state=rng,
                        claimed_epsilon=game.claimed_epsilon, **kw)
    res.details["n_trials"] = int(n_trials)
    return res
