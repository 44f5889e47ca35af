"""Fuzzy validity: the (federated) fuzzy Davies-Bouldin index and the knowledge gap.

Stallmann & Wilbik, "On a Framework for Federated Cluster Analysis" (Appl. Sci. 2022).

Fuzzy Davies-Bouldin (sec. 2.1.3, eqs. 7-13; Vergani & Binaghi 2018)::

    U_i    = (1/N) sum_j u_ij                                  (eq. 13)
    S_i^f  = U_i * ((1/N) sum_j ||x_j - c_i||^q)^(1/q)         (eq. 12, the fuzzy spread)
    M_ij   = (sum_k |c_i[k] - c_j[k]|^p)^(1/p)                  (eq. 11)
    R_ij   = (S_i^f + S_j^f) / M_ij,  R_i = max_{j != i} R_ij    (eqs. 8-9)
    DB     = (1/K) sum_i R_i                                    (eq. 7)

The paper uses p = 2, q = 1 throughout (sec. 2.1.3, 3.2). Lower is better.

Federated version (sec. 2.2.2, eqs. 14-16): S_i^f only needs, summed over clients l,
N_l, sum_j ||x_j^(l) - c_i||^q and sum_j u_ij^(l). Each is a plain sum over records, so
the server can receive them through secure aggregation and never learns a single N_l
(the paper's suggested defence against the nonlinear-system attack of Barcena et al.).
Given the pooled data and the same centres the federated index equals the central one.

Knowledge gap (sec. 3.1, eq. 18)::

    gap = sum_k sum_i (c~_k[i] - c_k[i])^2 / Var(x[i])

The paper does not say how the two sets of centres are paired; we pair them by the
assignment that minimises the gap (Hungarian algorithm), so the measure does not depend
on the order in which an algorithm happens to list its centres.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from .validation import check_array, check_float
from .algorithms._fcm import check_fuzzifier, exact_sq_distances, fuzzy_db_from_parts
from .algorithms._fcm import fedfuzzdb_terms as _terms
from .exceptions import InputError

#: names of the sum-fields one client sends for FedFuzzDB (sec. 2.2.2)
FEDFUZZDB_TERMS = ("n", "memberships", "spread")


def _check_pq(p, q):
    p = check_float(p, "p", minimum=1.0)
    q = check_float(q, "q", minimum=0.0, min_inclusive=False)
    return p, q


def _check_centres(centres, n_features=None, name="centres"):
    C = check_array(centres, name)
    if n_features is not None and C.shape[1] != n_features:
        raise InputError(
            f"{name} has {C.shape[1]} features, X has {n_features}; pass centres fitted on X."
        )
    if len(C) < 2:
        raise InputError(
            f"{name} must hold at least 2 centres: the Davies-Bouldin index compares pairs of clusters."
        )
    return C


def federated_fuzzy_davies_bouldin_terms(
    X, centres, m: float = 2.0, q: float = 1.0
) -> dict[str, np.ndarray]:
    """What one client sends for FedFuzzDB (Stallmann & Wilbik sec. 2.2.2, eqs. 14-16).

    Returns the sum-fields ``{"n": [N_l], "memberships": sum_j u_ij (K,), "spread":
    sum_j ||x_j - c_i||^q (K,)}`` of this client's records w.r.t. ``centres``.
    Summing these dicts over clients and passing the result to
    :func:`federated_fuzzy_davies_bouldin` gives the index.
    """
    X = check_array(X, "X")
    C = _check_centres(centres, X.shape[1])
    m = check_fuzzifier(m)
    _, q = _check_pq(2.0, q)
    return _terms(X, C, m, q)


def federated_fuzzy_davies_bouldin(
    summed_terms: dict, centres, p: float = 2.0, q: float = 1.0
) -> float:
    """FedFuzzDB from the clients' summed terms and the server's centres (sec. 2.2.2).

    ``summed_terms`` holds ``n`` (total records), ``memberships`` (K,) and ``spread`` (K,),
    each summed over clients (e.g. the decoded aggregate of a secure round). Duplicate
    centres (M_ij = 0) give an infinite index.
    """
    C = _check_centres(centres)
    p, q = _check_pq(p, q)
    missing = [k for k in FEDFUZZDB_TERMS if k not in summed_terms]
    if missing:
        raise InputError(
            f"summed_terms lacks {missing}; pass the sum over clients of "
            "federated_fuzzy_davies_bouldin_terms(X_l, centres)."
        )
    n = float(np.asarray(summed_terms["n"], dtype=np.float64).ravel()[0])
    u = np.asarray(summed_terms["memberships"], dtype=np.float64).ravel()
    s = np.asarray(summed_terms["spread"], dtype=np.float64).ravel()
    if u.shape != (len(C),) or s.shape != (len(C),):
        raise InputError(
            f"summed_terms 'memberships' and 'spread' must have shape ({len(C)},) to match centres, "
            f"got {u.shape} and {s.shape}."
        )
    if not n > 0:
        raise InputError(f"summed_terms['n'] must be a positive record count, got {n}.")
    return fuzzy_db_from_parts(n, u, s, C, p, q)


def fuzzy_davies_bouldin(
    X, centres, m: float = 2.0, p: float = 2.0, q: float = 1.0, memberships=None
) -> float:
    """Central fuzzy Davies-Bouldin index (Vergani & Binaghi; Stallmann & Wilbik eqs. 7-13).

    ``memberships`` (n, K) may be given (e.g. from :func:`~securefkm.algorithms._fcm.fuzzy_cmeans`);
    by default they are computed from ``centres`` with fuzzifier ``m`` (eq. 5). p = 2, q = 1
    are the paper's choice. Lower is better.
    """
    X = check_array(X, "X")
    C = _check_centres(centres, X.shape[1])
    m = check_fuzzifier(m)
    p, q = _check_pq(p, q)
    if memberships is None:
        t = _terms(X, C, m, q)
        return fuzzy_db_from_parts(t["n"][0], t["memberships"], t["spread"], C, p, q)
    U = check_array(memberships, "memberships")
    if U.shape != (len(X), len(C)):
        raise InputError(
            f"memberships has shape {U.shape}, expected (n_records, n_clusters) = {(len(X), len(C))}."
        )
    D = exact_sq_distances(X, C)
    dist_q = D if q == 2.0 else np.sqrt(D) ** q
    return fuzzy_db_from_parts(float(len(X)), U.sum(axis=0), dist_q.sum(axis=0), C, p, q)


def knowledge_gap(centres, reference_centres, X=None, *, variance=None) -> float:
    """Stallmann & Wilbik's knowledge gap (sec. 3.1, eq. 18) between two sets of K centres.

    gap = sum_k sum_i (c~_k[i] - c_k[i])^2 / Var(x[i]), with Var the per-feature variance of
    the (pooled) data ``X`` or given directly as ``variance`` (d,). Centres are paired by
    the assignment minimising the gap (the paper leaves the pairing open). 0 means the
    same centres; the paper reads it against ground-truth centres.
    """
    C = check_array(centres, "centres")
    R = check_array(reference_centres, "reference_centres")
    if C.shape != R.shape:
        raise InputError(
            f"centres {C.shape} and reference_centres {R.shape} must have the same shape "
            "(the knowledge gap compares K centres with K reference centres)."
        )
    if variance is None:
        if X is None:
            raise InputError(
                "knowledge_gap needs X (the pooled data) or variance=(per-feature variances)."
            )
        X = check_array(X, "X")
        if X.shape[1] != C.shape[1]:
            raise InputError(f"X has {X.shape[1]} features, centres have {C.shape[1]}.")
        var = X.var(axis=0)
    else:
        var = np.asarray(variance, dtype=np.float64).ravel()
        if var.shape != (C.shape[1],) or not np.all(np.isfinite(var)):
            raise InputError(
                f"variance must be {C.shape[1]} finite per-feature variances, got shape {var.shape}."
            )
    if np.any(var <= 0):
        raise InputError(
            "variance has a zero (constant feature); drop constant features before the knowledge gap."
        )
    cost = (((C[:, None, :] - R[None, :, :]) ** 2) / var).sum(axis=-1)
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].sum())
