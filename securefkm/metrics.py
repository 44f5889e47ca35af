"""Clustering metrics, central and federated.

Each federated metric is computed from per-client *terms* -- small dicts of sums that a
client computes on its own records for given centres (``*_terms``). The server only needs
the sum of the terms over clients (so they are sum-fields: secure aggregation applies) and
``federated_*`` turns that sum into the metric. Summing the terms over any split of the
records gives the central metric on the pooled records (up to floating-point summation
order): this is tested.

Fuzzy Davies-Bouldin and Stallmann & Wilbik's knowledge gap live in
``securefkm.metrics_fuzzy``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import (
    adjusted_rand_score,
    davies_bouldin_score,
    silhouette_score,
    v_measure_score,
)
from sklearn.metrics.cluster import contingency_matrix

from .validation import check_array, check_choice, check_int, check_random_state
from .exceptions import InputError

__all__ = [
    "assign",
    "sse",
    "kmeans_score",
    "kmeans_score_terms",
    "federated_kmeans_score",
    "ari",
    "v_measure",
    "accuracy",
    "silhouette",
    "simplified_silhouette",
    "simplified_silhouette_terms",
    "federated_simplified_silhouette",
    "davies_bouldin",
    "davies_bouldin_terms",
    "federated_davies_bouldin",
    "mean_intra_cluster_distance",
    "federated_mean_intra_cluster_distance",
    "sum_terms",
]


# --------------------------------------------------------------------------- helpers
def _check_X_centres(X, centres, X_name: str = "X", c_name: str = "centres"):
    X = check_array(X, X_name)
    C = check_array(centres, c_name)
    if C.shape[1] != X.shape[1]:
        raise InputError(
            f"{c_name} has {C.shape[1]} features but {X_name} has {X.shape[1]}; "
            f"{c_name} must be (n_clusters, n_features) with the same features as {X_name}."
        )
    return X, C


def _check_label_pair(y_true, y_pred):
    a, b = np.asarray(y_true), np.asarray(y_pred)
    if a.ndim != 1 or b.ndim != 1:
        raise InputError(f"y_true and y_pred must be 1-D, got shapes {a.shape} and {b.shape}.")
    if len(a) != len(b):
        raise InputError(
            f"y_true has {len(a)} labels but y_pred has {len(b)}; they must label the same records."
        )
    if len(a) == 0:
        raise InputError("y_true and y_pred are empty.")
    return a, b


def _sq_dist(X, C):
    """Squared distances (n, k) by the BLAS expansion, used only to choose centres."""
    d = (
        np.einsum("ij,ij->i", X, X)[:, None]
        - 2.0 * (X @ C.T)
        + np.einsum("ij,ij->i", C, C)[None, :]
    )
    return np.maximum(d, 0.0, out=d)


def _nearest(X, C):
    """Nearest centre per record and the exact (difference-based) Euclidean distance to it."""
    labels = np.argmin(_sq_dist(X, C), axis=1)
    return labels, np.sqrt(((X - C[labels]) ** 2).sum(axis=1))


def sum_terms(terms) -> dict:
    """Sum a list of per-client term dicts key by key (a single dict is returned as is)."""
    if isinstance(terms, Mapping):
        return dict(terms)
    if not isinstance(terms, Iterable):
        raise InputError("terms must be a dict of summed terms or a list of per-client term dicts.")
    terms = list(terms)
    if not terms or not all(isinstance(t, Mapping) for t in terms):
        raise InputError(
            "terms must be a non-empty list of per-client term dicts (or one summed dict)."
        )
    keys = set(terms[0])
    for i, t in enumerate(terms):
        if set(t) != keys:
            raise InputError(f"terms[{i}] has keys {sorted(t)}, expected {sorted(keys)}.")
    return {k: sum(np.asarray(t[k], dtype=np.float64) for t in terms) for k in keys}


def _need(terms: dict, keys: tuple[str, ...], what: str) -> dict:
    missing = [k for k in keys if k not in terms]
    if missing:
        raise InputError(f"{what} needs terms with keys {list(keys)}; missing {missing}.")
    return terms


# --------------------------------------------------------------------------- assignment, SSE
def assign(X, centres) -> np.ndarray:
    """Index of the nearest centre of each record (squared Euclidean distance; ties go to the
    lowest index)."""
    X, C = _check_X_centres(X, centres)
    return np.argmin(_sq_dist(X, C), axis=1)


def sse(X, centres) -> float:
    """Sum of squared distances of the records to their nearest centre (the k-means objective,
    Garst & Reinders eq. 3)."""
    X, C = _check_X_centres(X, centres)
    _, d = _nearest(X, C)
    return float(np.sum(d**2))


def kmeans_score(X, centres) -> float:
    """Holzer et al. (2023), DWF paper section 3.3: score(X, C) = SSE / |X|."""
    X, C = _check_X_centres(X, centres)
    return sse(X, C) / len(X)


def kmeans_score_terms(X, centres) -> dict:
    """A client's terms for the federated score: ``{"inertia": SSE_i, "count": n_i}``."""
    X, C = _check_X_centres(X, centres)
    return {"inertia": sse(X, C), "count": float(len(X))}


def federated_kmeans_score(terms) -> float:
    """Federated k-means score: sum of inertias / sum of counts over clients.

    ``terms`` is a list of :func:`kmeans_score_terms` dicts or their (securely) summed dict.
    DWF's Algorithm 4 ("RequestScore") averages per-client scores with equal weights, which
    differs from the pooled score when clients differ in size; the ratio of sums equals the
    central :func:`kmeans_score` on the pooled data exactly, so that is what we use.
    """
    t = _need(sum_terms(terms), ("inertia", "count"), "federated_kmeans_score")
    if float(t["count"]) <= 0:
        raise InputError("federated_kmeans_score: the summed count is 0 (no records contributed).")
    return float(t["inertia"]) / float(t["count"])


# --------------------------------------------------------------------------- external indices
def ari(y_true, y_pred) -> float:
    """Adjusted Rand index (Hubert & Arabie 1985; used by Garst & Reinders), scikit-learn's."""
    a, b = _check_label_pair(y_true, y_pred)
    return float(adjusted_rand_score(a, b))


def v_measure(y_true, y_pred) -> float:
    """V-measure (Rosenberg & Hirschberg 2007; DWF paper section 3.3), scikit-learn's."""
    a, b = _check_label_pair(y_true, y_pred)
    return float(v_measure_score(a, b))


def accuracy(y_true, y_pred, matching: str = "majority") -> float:
    """Clustering accuracy after mapping predicted clusters to true labels.

    * ``"majority"`` (DWF paper section 3.3 and the authors' ``map_pred_to_true``): each
      predicted cluster is mapped to its most frequent true label; several clusters may map
      to the same label, so it works for any number of clusters and never decreases when
      clusters are split.
    * ``"hungarian"``: the best one-to-one mapping (``scipy.optimize.linear_sum_assignment``
      on the contingency table); clusters left unmatched count as wrong.
    """
    a, b = _check_label_pair(y_true, y_pred)
    check_choice(matching, "matching", ("majority", "hungarian"))
    cont = contingency_matrix(a, b)  # (n_true_labels, n_pred_clusters)
    if matching == "majority":
        correct = cont.max(axis=0).sum()
    else:
        rows, cols = linear_sum_assignment(cont, maximize=True)
        correct = cont[rows, cols].sum()
    return float(correct) / len(a)


# --------------------------------------------------------------------------- silhouettes
def _check_labelling(X, labels, what: str):
    """A data matrix and a 1-D labelling with 2..n-1 clusters (what the central indices need)."""
    X = check_array(X, "X")
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != len(X):
        raise InputError(
            f"labels must be 1-D with one entry per row of X ({len(X)}), got shape {labels.shape}."
        )
    n_lab = len(np.unique(labels))
    if not 2 <= n_lab <= len(X) - 1:
        raise InputError(
            f"{what} needs 2 <= number of clusters <= n_samples - 1, got {n_lab} clusters."
        )
    return X, labels


def silhouette(X, labels, sample_size=None, random_state=None) -> float:
    """Silhouette coefficient (Rousseeuw 1987), scikit-learn's; central only (needs all
    pairwise distances). ``sample_size`` subsamples records, seeded by ``random_state``."""
    X, labels = _check_labelling(X, labels, "silhouette")
    if sample_size is not None:
        sample_size = check_int(sample_size, "sample_size", minimum=2, maximum=len(X))
    rng = check_random_state(random_state)
    return float(
        silhouette_score(
            X, labels, sample_size=sample_size, random_state=int(rng.integers(2**31 - 1))
        )
    )


def _simplified_silhouette_values(X, C):
    if len(C) < 2:
        raise InputError("the simplified silhouette needs at least 2 centres.")
    d2 = _sq_dist(X, C)
    two = np.argpartition(d2, 1, axis=1)[:, :2]
    first_is_a = d2[np.arange(len(X)), two[:, 0]] <= d2[np.arange(len(X)), two[:, 1]]
    own = np.where(first_is_a, two[:, 0], two[:, 1])
    other = np.where(first_is_a, two[:, 1], two[:, 0])
    a = np.sqrt(((X - C[own]) ** 2).sum(axis=1))
    b = np.sqrt(((X - C[other]) ** 2).sum(axis=1))
    m = np.maximum(a, b)
    return np.divide(b - a, m, out=np.zeros_like(m), where=m > 0)


def simplified_silhouette(X, centres) -> float:
    """Simplified silhouette (Hruschka, de Castro & Campello 2004; suggested as the federated
    alternative by Garst & Reinders section 3): per record ``a`` = distance to its nearest
    centre, ``b`` = distance to the second-nearest centre, ``s = (b - a) / max(a, b)``
    (0 when both are 0); the mean over records."""
    X, C = _check_X_centres(X, centres)
    return float(_simplified_silhouette_values(X, C).mean())


def simplified_silhouette_terms(X, centres) -> dict:
    """A client's terms: ``{"s_sum": sum of s over its records, "count": n_i}``."""
    X, C = _check_X_centres(X, centres)
    return {"s_sum": float(_simplified_silhouette_values(X, C).sum()), "count": float(len(X))}


def federated_simplified_silhouette(terms) -> float:
    """Summed ``s_sum`` / summed ``count`` = the central simplified silhouette."""
    t = _need(sum_terms(terms), ("s_sum", "count"), "federated_simplified_silhouette")
    if float(t["count"]) <= 0:
        raise InputError("federated_simplified_silhouette: the summed count is 0.")
    return float(t["s_sum"]) / float(t["count"])


# --------------------------------------------------------------------------- Davies-Bouldin
def davies_bouldin(X, labels) -> float:
    """Davies-Bouldin index (Davies & Bouldin 1979) of a labelling, scikit-learn's (cluster
    centres are the means of the labelled records)."""
    X, labels = _check_labelling(X, labels, "Davies-Bouldin")
    return float(davies_bouldin_score(X, labels))


def davies_bouldin_terms(X, centres) -> dict:
    """A client's terms for the federated Davies-Bouldin index and mean intra-cluster
    distance: per centre ``i``, ``dist_sum[i]`` = sum of ``||x - c_i||`` over the client's
    records assigned to ``i`` and ``count[i]`` = their number."""
    X, C = _check_X_centres(X, centres)
    labels, d = _nearest(X, C)
    k = len(C)
    return {
        "dist_sum": np.bincount(labels, weights=d, minlength=k),
        "count": np.bincount(labels, minlength=k).astype(np.float64),
    }


def federated_davies_bouldin(terms, centres) -> float:
    """Davies-Bouldin index from summed terms (Davies & Bouldin 1979 with q = 1, p = 2):

    ``S_i = dist_sum_i / count_i`` (mean distance of cluster i's records to its centre),
    ``M_ij = ||c_i - c_j||``, ``R_ij = (S_i + S_j) / M_ij``, ``DB = mean_i max_{j != i} R_ij``.

    Empty clusters (summed count 0) are skipped, as if their centre did not exist. As in
    scikit-learn, coinciding centres give ``R_ij = 0`` and the index is 0 when all ``S_i``
    or all ``M_ij`` are 0. With centres equal to the means of their assigned records (a
    k-means fixed point) this equals ``davies_bouldin(X, assign(X, centres))`` (tested).
    """
    C = check_array(centres, "centres")
    t = _need(sum_terms(terms), ("dist_sum", "count"), "federated_davies_bouldin")
    ds, cnt = np.asarray(t["dist_sum"], dtype=np.float64), np.asarray(t["count"], dtype=np.float64)
    if ds.shape != (len(C),) or cnt.shape != (len(C),):
        raise InputError(
            f"terms dist_sum/count have shapes {ds.shape}/{cnt.shape} but centres has {len(C)} rows; "
            "compute the terms with the same centres."
        )
    keep = cnt > 0
    if keep.sum() < 2:
        raise InputError("Davies-Bouldin needs at least 2 non-empty clusters.")
    S = ds[keep] / cnt[keep]
    Ck = C[keep]
    M = np.sqrt(((Ck[:, None, :] - Ck[None, :, :]) ** 2).sum(axis=2))
    if np.allclose(S, 0) or np.allclose(M, 0):
        return 0.0
    M[M == 0] = np.inf
    R = (S[:, None] + S[None, :]) / M
    np.fill_diagonal(R, -np.inf)
    return float(R.max(axis=1).mean())


def mean_intra_cluster_distance(X, centres) -> float:
    """Triebe & Rajagopal (2019) section 2.2: mean Euclidean distance of the records to their
    assigned (nearest) centre."""
    X, C = _check_X_centres(X, centres)
    return float(_nearest(X, C)[1].mean())


def federated_mean_intra_cluster_distance(terms) -> float:
    """Mean intra-cluster distance from summed :func:`davies_bouldin_terms`:
    ``sum(dist_sum) / sum(count)``."""
    t = _need(sum_terms(terms), ("dist_sum", "count"), "federated_mean_intra_cluster_distance")
    total = float(np.sum(t["count"]))
    if total <= 0:
        raise InputError("federated_mean_intra_cluster_distance: the summed count is 0.")
    return float(np.sum(t["dist_sum"])) / total
