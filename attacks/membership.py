"""Membership inference against released cluster centres.

Threat model
------------
The adversary sees the *released model* -- the final centres (``cluster_centers_``), which
every algorithm publishes whatever the protection stack -- and holds candidate records; it
must tell which candidates were in some client's training data. It never reads client data;
the dataset passed to :meth:`MembershipInference.evaluate` serves the LiRA shadow runs (the
adversary is assumed to know the rest of the training data, or a sample from the same
distribution -- the strong adversary of differential privacy) and the ground truth is only
the split ``candidates_in`` / ``candidates_out``.

Attacks
-------
``method="distance"`` -- score = minus the distance from a candidate to its nearest released
centre. A centre is the mean of its cell, so a member pulls one centre towards itself by
(x - c)/n_cell: the effect is large for small clusters (Shokri et al. 2017's generalisation
gap, here in its simplest geometric form).

``method="lira"`` -- the online likelihood-ratio attack of Carlini, Chien, Nasr, Song, Terzis &
Tramer (2022), "Membership Inference Attacks From First Principles" (IEEE S&P). ``n_shadow``
shadow models are fitted with the same algorithm (``fit``: a factory) on the known records
plus each candidate with probability 1/2; for each candidate the statistic (minus its
distance to the nearest centre) is modelled as N(mu_in, s_in^2) over the shadows that held
it and N(mu_out, s_out^2) over those that did not (``fixed_variance``: one variance per
side pooled over candidates, Carlini et al.'s choice for few shadows); the score is the log
likelihood ratio of the target's statistic.

Metrics (in the :class:`~attacks.report.LeakageReport`): ``membership_advantage`` = max over
thresholds of TPR - FPR (Yeom et al. 2018), ``auc`` (Mann-Whitney, ties count 1/2),
``tpr_at_1pct_fpr`` (Carlini et al.'s low-FPR metric); ``extra["roc"]`` holds the curve.
These are *point estimates* over the given candidates; for a statistically valid privacy
statement feed the scores to :func:`attacks.audit.audit_epsilon`.

What defeats it: record-level differential privacy (``GaussianDP``) bounds every test by
TPR <= e^eps FPR + delta (:func:`dp_roc_violation` checks it with a DKW confidence band);
larger clusters (fewer centres per record) shrink the pull of one record; ``MinClusterSize``
hides the smallest cells only if the released centres are computed without them. Secure
aggregation alone does *not* help: the centres are released anyway.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from securefkm.validation import check_random_state
from securefkm.kernels import sq_distances
from securefkm.exceptions import InputError

from .report import LeakageReport, client_arrays

METHODS = ("distance", "lira")


# ---------------------------------------------------------------- ROC utilities
def roc_curve(scores_in, scores_out):
    """(fpr, tpr, thresholds) of the tests ``score >= t`` over every distinct score (+inf)."""
    sin = np.sort(np.asarray(scores_in, dtype=np.float64))
    sout = np.sort(np.asarray(scores_out, dtype=np.float64))
    thr = np.concatenate([[-np.inf], np.unique(np.concatenate([sin, sout])), [np.inf]])
    tpr = 1.0 - np.searchsorted(sin, thr, side="left") / sin.size
    fpr = 1.0 - np.searchsorted(sout, thr, side="left") / sout.size
    return fpr, tpr, thr


def auc_score(scores_in, scores_out) -> float:
    """P[score_in > score_out] + P[tie]/2 (Mann-Whitney U / (n_in n_out)), via ranks."""
    sin = np.asarray(scores_in, dtype=np.float64)
    sout = np.asarray(scores_out, dtype=np.float64)
    ranks = stats.rankdata(np.concatenate([sin, sout]))
    u = ranks[: sin.size].sum() - sin.size * (sin.size + 1) / 2
    return float(u / (sin.size * sout.size))


def membership_metrics(scores_in, scores_out) -> dict:
    """advantage (max TPR - FPR), auc, tpr_at_1pct_fpr and the roc (fpr, tpr, thresholds)."""
    fpr, tpr, thr = roc_curve(scores_in, scores_out)
    ok = fpr <= 0.01
    return {
        "membership_advantage": float(np.max(tpr - fpr)),
        "auc": auc_score(scores_in, scores_out),
        "tpr_at_1pct_fpr": float(np.max(tpr[ok])) if np.any(ok) else 0.0,
        "roc": {"fpr": fpr, "tpr": tpr, "thresholds": thr},
    }


def chance_levels(n_in: int, n_out: int, *, n_runs: int = 1, level: float = 0.95, n_sim: int = 4000,
                  random_state=0) -> dict:
    """What an attack with *no* signal scores on ``n_in`` members and ``n_out`` non-members.

    Monte Carlo under the null (every score drawn from one continuous distribution, so the
    two sets are exchangeable): ``n_sim`` draws of the mean over ``n_runs`` independent runs
    (seeds) of the AUC and of the advantage (max TPR - FPR). Returns ``auc_low`` /
    ``auc_high`` (the central ``level`` interval of the mean AUC), ``advantage_high`` (its
    ``level`` quantile: the advantage is a maximum over thresholds, so it is positive even
    without signal), ``advantage_mean`` (its mean under the null) and ``auc_sd`` (the null
    standard deviation of the mean AUC, sqrt((n_in + n_out + 1) / (12 n_in n_out n_runs))
    asymptotically). An AUC outside [auc_low, auc_high] or an advantage above
    ``advantage_high`` is a signal at that level; inside them it is indistinguishable from
    chance with this many candidates.
    """
    for name, v in (("n_in", n_in), ("n_out", n_out), ("n_runs", n_runs), ("n_sim", n_sim)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise InputError(f"{name} must be an int >= 1, got {v!r}.")
    if not 0 < level < 1:
        raise InputError(f"level must lie in (0, 1), got {level!r}.")
    rng = check_random_state(random_state)
    n_in, n_out = int(n_in), int(n_out)
    aucs = np.zeros(n_sim)
    advs = np.zeros(n_sim)
    for _ in range(int(n_runs)):
        # ranks of the members among n_in + n_out exchangeable scores
        member = np.argsort(rng.random((n_sim, n_in + n_out)), axis=1) < n_in
        # walking the scores from the highest down: TPR - FPR after each step
        step = np.where(member, 1.0 / n_in, -1.0 / n_out)
        advs += np.maximum(np.cumsum(step, axis=1).max(axis=1), 0.0)
        ranks = np.nonzero(member)[1].reshape(n_sim, n_in)  # 0 = highest score
        u = (n_in + n_out - 1 - ranks).sum(axis=1) - n_in * (n_in - 1) / 2
        aucs += u / (n_in * n_out)
    aucs /= n_runs
    advs /= n_runs
    lo, hi = np.quantile(aucs, [(1 - level) / 2, (1 + level) / 2])
    return {"auc_low": float(lo), "auc_high": float(hi), "auc_sd": float(aucs.std()),
            "advantage_high": float(np.quantile(advs, level)), "advantage_mean": float(advs.mean()),
            "n_in": n_in, "n_out": n_out, "n_runs": int(n_runs), "level": float(level)}


def dp_roc_violation(scores_in, scores_out, epsilon: float, delta: float, alpha: float = 0.05) -> float:
    """How far the empirical ROC goes beyond what (epsilon, delta)-DP allows, beyond sampling error.

    DP bounds every test: TPR <= e^eps FPR + delta and 1 - FPR <= e^eps (1 - TPR) + delta
    (Kairouz, Oh & Viswanath 2015). With DKW bands (Massart 1990) of half-width
    s = sqrt(log(4/alpha) / (2n)) on each empirical CDF, both hold simultaneously for the true
    rates with probability >= 1 - alpha. Returns the largest
    ``TPR_hat - s_in - e^eps (FPR_hat + s_out) - delta`` (and its mirror) over thresholds:
    a value > 0 refutes (epsilon, delta)-DP at confidence 1 - alpha *when candidates are
    independent draws* (one record each, i.i.d.); <= 0 means consistent.
    """
    sin = np.asarray(scores_in, dtype=np.float64).ravel()
    sout = np.asarray(scores_out, dtype=np.float64).ravel()
    if sin.size == 0 or sout.size == 0:
        raise InputError("scores_in and scores_out must be non-empty.")
    if not (0 < alpha < 1):
        raise InputError(f"alpha must lie in (0, 1), got {alpha}.")
    fpr, tpr, _ = roc_curve(sin, sout)
    s_in = np.sqrt(np.log(4 / alpha) / (2 * sin.size))
    s_out = np.sqrt(np.log(4 / alpha) / (2 * sout.size))
    e = np.exp(epsilon)
    v1 = (tpr - s_in) - e * (fpr + s_out) - delta
    v2 = (1 - fpr - s_out) - e * (1 - tpr + s_in) - delta
    return float(max(v1.max(), v2.max()))


# ---------------------------------------------------------------- the attack
def _centres_of(obj, name="target_estimator_or_centres") -> np.ndarray:
    C = getattr(obj, "cluster_centers_", obj)
    try:
        C = np.asarray(C, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a fitted estimator (cluster_centers_) or an array of centres.") from None
    if C.ndim != 2 or C.shape[0] == 0 or not np.all(np.isfinite(C)):
        raise InputError(f"{name}: centres must be a finite non-empty 2-D array, got shape {C.shape}.")
    return C


def _candidates(x, d, name) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a 2-D array of records.") from None
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] != d or not np.all(np.isfinite(a)):
        raise InputError(f"{name} must be a finite non-empty array of shape (n, {d}), got shape {a.shape}.")
    return a


def distance_statistic(candidates, centres) -> np.ndarray:
    """Minus the Euclidean distance of each candidate to its nearest centre (high = member)."""
    return -np.sqrt(np.maximum(sq_distances(candidates, centres).min(axis=1), 0.0))


class MembershipInference:
    """Membership inference on released centres: ``evaluate(...) -> LeakageReport``.

    Parameters
    ----------
    method : "distance" or "lira" (module docstring: threat model, papers, defences).
    n_shadow : int
        LiRA shadow fits (each candidate is in about half of them).
    fit : callable or None
        LiRA factory ``fit(FederatedDataset) -> fitted estimator or centres``; default: a
        clone of the target estimator (``sklearn.base.clone``) with a fresh random_state.
    fixed_variance : bool
        LiRA: one IN and one OUT variance pooled over candidates (robust with few shadows).
    random_state : int, Generator or None
    """

    def __init__(self, method: str = "distance", n_shadow: int = 8, *, fit=None, fixed_variance: bool = True,
                 random_state=None):
        if method not in METHODS:
            raise InputError(f"method must be one of {METHODS}, got {method!r}.")
        if isinstance(n_shadow, bool) or not isinstance(n_shadow, (int, np.integer)) or n_shadow < 2:
            raise InputError(f"n_shadow must be an int >= 2, got {n_shadow!r}.")
        if fit is not None and not callable(fit):
            raise InputError("fit must be a callable FederatedDataset -> fitted estimator (or centres), or None.")
        self.method = method
        self.n_shadow = int(n_shadow)
        self.fit = fit
        self.fixed_variance = bool(fixed_variance)
        self.random_state = random_state

    @property
    def name(self) -> str:
        return f"membership-{self.method}"

    def scores(self, target_estimator_or_centres, dataset, candidates_in, candidates_out, *, fit=None):
        """(scores_in, scores_out, extra): the attack scores of the two candidate sets."""
        C = _centres_of(target_estimator_or_centres)
        d = C.shape[1]
        cin = _candidates(candidates_in, d, "candidates_in")
        cout = _candidates(candidates_out, d, "candidates_out")
        if self.method == "distance":
            return distance_statistic(cin, C), distance_statistic(cout, C), {}
        factory = fit or self.fit or _clone_factory(target_estimator_or_centres)
        clients = client_arrays(dataset)
        return self._lira(C, clients, cin, cout, factory)

    def evaluate(self, target_estimator_or_centres, dataset, candidates_in, candidates_out, *, fit=None) -> LeakageReport:
        """Score the candidates and summarise the ROC in a :class:`LeakageReport`."""
        sin, sout, extra = self.scores(target_estimator_or_centres, dataset, candidates_in, candidates_out, fit=fit)
        m = membership_metrics(sin, sout)
        clients = client_arrays(dataset)
        return LeakageReport(
            attack=self.name,
            n_records=int(sum(len(X) for X in clients)),
            n_clients=len(clients),
            membership_advantage=m["membership_advantage"],
            auc=m["auc"],
            tpr_at_1pct_fpr=m["tpr_at_1pct_fpr"],
            rounds_used=0,
            extra={"roc": m["roc"], "scores_in": sin, "scores_out": sout, **extra},
        )

    # ------------------------------------------------------------ LiRA
    def _lira(self, C, clients, cin, cout, factory):
        from securefkm.datasets import FederatedDataset

        rng = check_random_state(self.random_state)
        pooled = np.vstack(clients)
        # the known records: the training data minus the members under test
        is_cand = np.zeros(len(pooled), bool)
        D = sq_distances(pooled, cin)
        hit = D.min(axis=1) <= 1e-18 * (1 + np.abs(pooled).max() ** 2)
        is_cand |= hit
        base = pooled[~is_cand]
        cand = np.vstack([cin, cout])
        n_c, n_cl = len(cand), len(clients)
        stat = np.empty((self.n_shadow, n_c))
        incl = rng.random((self.n_shadow, n_c)) < 0.5
        for s in range(self.n_shadow):
            recs = np.vstack([base, cand[incl[s]]])
            owner = rng.permutation(np.arange(len(recs)) % n_cl)
            parts = [recs[owner == i] for i in range(n_cl)]
            shadow = factory(FederatedDataset(parts))
            stat[s] = distance_statistic(cand, _centres_of(shadow, "the shadow fit's result"))
        target = distance_statistic(cand, C)
        mu_in, mu_out, sd_in, sd_out = _gaussian_fits(stat, incl, self.fixed_variance)
        score = stats.norm.logpdf(target, mu_in, sd_in) - stats.norm.logpdf(target, mu_out, sd_out)
        extra = {"n_shadow": self.n_shadow, "shadow_in_counts": incl.sum(axis=0)}
        return score[: len(cin)], score[len(cin):], extra


def _gaussian_fits(stat, incl, fixed_variance):
    """Per-candidate IN/OUT means and standard deviations of the shadow statistic."""
    n_in = incl.sum(axis=0)
    n_out = (~incl).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu_in = np.where(incl, stat, 0).sum(axis=0) / n_in
        mu_out = np.where(~incl, stat, 0).sum(axis=0) / n_out
    gap = np.nanmean(mu_in - mu_out) if np.any(np.isfinite(mu_in - mu_out)) else 0.0
    mu_in = np.where(n_in > 0, mu_in, mu_out + gap)
    mu_out = np.where(n_out > 0, mu_out, mu_in - gap)
    r_in = np.where(incl, stat - mu_in, np.nan)
    r_out = np.where(~incl, stat - mu_out, np.nan)
    floor = 1e-6 * (np.nanstd(stat) + 1e-12)
    if fixed_variance:
        sd_in = np.full(stat.shape[1], np.sqrt(np.nanmean(r_in**2)) if np.any(incl) else 1.0)
        sd_out = np.full(stat.shape[1], np.sqrt(np.nanmean(r_out**2)) if np.any(~incl) else 1.0)
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            sd_in = np.sqrt(np.nansum(r_in**2, axis=0) / np.maximum(n_in - 1, 1))
            sd_out = np.sqrt(np.nansum(r_out**2, axis=0) / np.maximum(n_out - 1, 1))
    return mu_in, mu_out, np.maximum(np.nan_to_num(sd_in, nan=1.0), floor), np.maximum(np.nan_to_num(sd_out, nan=1.0), floor)


def _clone_factory(target):
    if not hasattr(target, "get_params"):
        raise InputError(
            "method='lira' needs fit=<callable FederatedDataset -> fitted estimator> when the target "
            "is an array of centres (it cannot re-run the algorithm)."
        )
    from sklearn.base import clone

    counter = iter(range(10**9))

    def factory(data):
        est = clone(target)
        if "random_state" in est.get_params():
            rs = est.get_params()["random_state"]
            est.set_params(random_state=(0 if rs is None else int(rs) if isinstance(rs, (int, np.integer)) else 0) + 1 + next(counter))
        return est.fit(data)

    return factory
