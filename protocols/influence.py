"""How far malicious clients can move DWF's centres in one round, with validated inputs.

Setting (fixed throughout: one round ``t`` and its broadcast centres ``C^(t)``, so every
honest client's assignment, hence its counts and coordinate sums, is fixed). ``m``
malicious clients with declared record counts ``n_i`` (``M = sum n_i``) send anything a
validating aggregator accepts (:class:`protocols.validated.ValidatedAggregation`): per
cluster a whole count ``c_ij >= 0`` with ``sum_j c_ij <= n_i`` and a coordinate sum
``S_ij`` within ``c_ij x box`` (``box = [low, high]``, the declared data box, which the
honest records lie in).

**The mean** (DWF, eq. 3-4 of Holzer et al. 2023). Let ``C_j`` and ``S_j`` be the honest
clients' count and sum of cluster j and ``mu_j = S_j / C_j`` their mean. The malicious
clients add ``M_j = sum_i c_ij <= M`` and ``P_j = sum_i S_ij``; since ``S_ij = c_ij p_ij``
with ``p_ij`` in the box and the box is convex, ``P_j = M_j p`` for a point ``p`` of the
box. The poisoned d_j is then

    d_j = (S_j + P_j) / (C_j + M_j) = C_j / (C_j + M_j) mu_j + M_j / (C_j + M_j) p,

a convex combination of the honest mean and a point of the box, so

    ||d_j - mu_j|| = M_j / (C_j + M_j) ||p - mu_j||
                  <= M / (C_j + M) max_{x in box} ||x - mu_j||  <=  M / (C_j + M) diam(box)

(``t / (C_j + t)`` increases in ``t``; ``mu_j`` lies in the box). With ``C_j = 0`` the
honest round keeps the fallback ``mu_j = c_j^(t)`` and the factor is 1. The maximum over the
box is attained at the corner farthest from ``mu_j``: coordinate-wise
``max(|mu_je - low_e|, |high_e - mu_je|)``; the adaptive attack
(:class:`attacks.poisoning.PoisoningPolicy`, ``kind="adaptive"``) attains the bound when it
aims at the corner farthest from ``mu_j``. The next centre moves by ``learning_rate`` times
this (eq. 6; the momentum term is the same with and without the attack).

**The median** (``aggregation="median"``, :mod:`securefkm.algorithms.dwf`). Per cluster j and
coordinate e the server takes the median of the summed vote histogram, each vote spread
uniformly over its bin (:func:`securefkm.algorithms.dwf.histogram_quantile`). Let ``G`` be the
honest votes' cumulative mass (total ``h``) and ``A`` the malicious votes' (total
``a <= m``: the number of malicious clients, one vote each, or their ``M`` records with
``vote_weight="records"``; this needs every client's votes in a row to be non-negative and
total at most 1, resp. its count, which pairwise masking and Paillier do not check:
``kind="vote-stuffing"`` shows what a malformed histogram does). The median ``x*`` solves
``G(x*) + A(x*) = (h + a) / 2`` with ``0 <= A <= a``, hence

    (h - m) / 2  <=  G(x*)  <=  (h + m) / 2,

so ``x*`` lies between the honest votes' quantiles of masses ``(h - m) / 2`` (its left end)
and ``(h + m) / 2`` (its right end), i.e. between the honest votes' order statistics of ranks
about ``h/2 - m/2`` and ``h/2 + m/2``: m votes move the median by at most m/2 ranks of the
honest votes, whatever they are. With ``m >= h`` the interval is the whole box. All malicious
votes in the extreme bin of one side reach that side's end exactly
(``kind="robust-adaptive"``). The L2 bound on the robust centre's move from the honest
median is the norm over coordinates of the larger of the two gaps.
"""

from __future__ import annotations

import numpy as np

from securefkm.algorithms.dwf import box_arrays, histogram_quantile
from securefkm.exceptions import InputError

__all__ = ["mean_shift_bound", "median_interval", "median_shift_bound", "influence_report", "box_diameter"]


def _nonneg(value, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name}={value!r}: pass a non-negative number.") from None
    if not np.isfinite(v) or v < 0:
        raise InputError(f"{name}={value!r}: pass a finite, non-negative number.")
    return v


def _counts(honest_counts) -> np.ndarray:
    c = np.asarray(honest_counts, dtype=np.float64)
    if c.ndim != 1 or c.size == 0 or not np.isfinite(c).all() or (c < 0).any():
        raise InputError(f"honest_counts: pass the honest clients' per-cluster counts, a non-empty 1-D array of "
                         f"non-negative numbers; got shape {c.shape}.")
    return c


def box_diameter(box, d: int) -> float:
    """The declared box's diameter ``||high - low||`` in ``d`` dimensions."""
    low, high = box_arrays(box, d)
    return float(np.linalg.norm(high - low))


def mean_shift_bound(malicious_records, honest_counts, box, honest_centres=None) -> np.ndarray:
    """Per-cluster bound on ``||d_j - mu_j||`` for DWF's mean (module docstring).

    ``malicious_records``: the malicious clients' declared record counts in total (``M``);
    ``honest_counts`` (k,): the honest clients' counts ``C_j`` under the round's broadcast
    centres; ``box``: the declared ``(low, high)``; ``honest_centres`` (k, d): the honest
    ``mu_j`` (the broadcast centre where ``C_j = 0``); without them the bound uses
    ``diam(box)``, which needs the box's dimension from ``box`` (arrays) or ``honest_centres``.
    Returns ``M / (C_j + M) * max_{x in box} ||x - mu_j||`` (or ``* diam(box)``), 0 where M = 0.
    """
    m = _nonneg(malicious_records, "malicious_records")
    c = _counts(honest_counts)
    if honest_centres is None:
        d = np.size(np.asarray(box[0])) if np.ndim(box[0]) else np.size(np.asarray(box[1]))
        reach = np.full(c.shape, box_diameter(box, max(int(d), 1)))
    else:
        mu = np.asarray(honest_centres, dtype=np.float64)
        if mu.ndim != 2 or mu.shape[0] != c.size or not np.isfinite(mu).all():
            raise InputError(f"honest_centres: pass the (k, d) honest means, k={c.size} as in honest_counts; "
                             f"got shape {mu.shape}.")
        low, high = box_arrays(box, mu.shape[1])
        reach = np.linalg.norm(np.maximum(np.abs(mu - low), np.abs(high - mu)), axis=1)
    frac = np.divide(m, c + m, out=np.zeros_like(c), where=(c + m) > 0)
    return frac * reach


def _votes(honest_votes) -> np.ndarray:
    v = np.asarray(honest_votes, dtype=np.float64)
    if v.ndim != 3 or v.shape[-1] < 2 or not np.isfinite(v).all() or (v < 0).any():
        raise InputError(f"honest_votes: pass the honest clients' summed vote histograms, shape (k, d, bins) with "
                         f"bins >= 2 and non-negative entries; got shape {v.shape}.")
    return v


def median_interval(malicious_votes, honest_votes, box) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi), each (k, d): where the robust centre can lie when ``malicious_votes`` votes
    (``m``: malicious clients, or their records with ``vote_weight="records"``) join the
    honest ``honest_votes`` (k, d, bins): the honest votes' left quantile at mass
    ``(h - m)/2`` and right quantile at ``(h + m)/2``, per row of total ``h``."""
    m = _nonneg(malicious_votes, "malicious_votes")
    v = _votes(honest_votes)
    low, high = box_arrays(box, v.shape[1])
    h = v.sum(axis=-1)
    lo = histogram_quantile(v, low, high, (h - m) / 2.0, "left")
    hi = histogram_quantile(v, low, high, (h + m) / 2.0, "right")
    return np.where(h > m, lo, low), np.where(h > m, hi, high)  # m >= h: the whole box


def median_shift_bound(malicious_votes, honest_votes, box) -> np.ndarray:
    """Per-cluster bound on the robust centre's move from the honest votes' median: the norm
    over coordinates of ``max(hi - median, median - lo)`` with :func:`median_interval`."""
    v = _votes(honest_votes)
    low, high = box_arrays(box, v.shape[1])
    lo, hi = median_interval(malicious_votes, v, box)
    med = histogram_quantile(v, low, high, v.sum(axis=-1) / 2.0, "left")
    return np.linalg.norm(np.maximum(hi - med, med - lo), axis=1)


def influence_report(n_malicious, malicious_records, honest_counts, box, *, honest_centres=None,
                     honest_votes=None, vote_weight: str = "client", learning_rate: float = 1.0) -> dict:
    """The bound in words for a protection report.

    Returns ``{"mean": per-cluster bound, "max": its largest entry, "box_diameter": ...,
    "lines": [...]}`` and, with ``honest_votes``, ``"median"`` and ``"median_max"`` for the
    robust option. Bounds are per round and scaled by ``learning_rate`` (eq. 6).
    """
    n = int(n_malicious)
    if n < 0 or n != n_malicious:
        raise InputError(f"n_malicious={n_malicious!r}: pass a non-negative int.")
    eta = _nonneg(learning_rate, "learning_rate")
    mean = eta * mean_shift_bound(malicious_records, honest_counts, box, honest_centres)
    if honest_centres is not None:
        d = np.asarray(honest_centres).shape[1]
    elif honest_votes is not None:
        d = np.asarray(honest_votes).shape[1]
    else:
        d = max(int(np.size(np.asarray(box[0]))), int(np.size(np.asarray(box[1]))))
    diam = box_diameter(box, d)
    m_rec = int(round(_nonneg(malicious_records, "malicious_records")))
    out = {"n_malicious": n, "malicious_records": m_rec, "box_diameter": diam, "mean": mean, "max": float(mean.max()),
           "lines": [f"{n} malicious client{'s' if n != 1 else ''} of declared {m_rec} records "
                     f"move{'' if n != 1 else 's'} a centre by at "
                     f"most {mean.max():.2g} per round (box diameter {diam:.2g})"]}
    if honest_votes is not None:
        if vote_weight not in ("client", "records"):
            raise InputError(f"vote_weight={vote_weight!r}: choose 'client' or 'records'.")
        mass = n if vote_weight == "client" else m_rec
        med = eta * median_shift_bound(mass, honest_votes, box)
        out.update(median=med, median_max=float(med.max()))
        out["lines"].append(f"with aggregation='median': at most {med.max():.2g} per round "
                            f"({mass} malicious vote{'s' if mass != 1 else ''} per coordinate against the honest votes)")
    return out
