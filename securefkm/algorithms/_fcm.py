"""Vectorised fuzzy c-means kernels (Bezdek, Ehrlich & Full 1984; Stallmann & Wilbik 2022).

Stallmann & Wilbik, "On a Framework for Federated Cluster Analysis" (Appl. Sci. 2022),
section 2.1.2:

* objective (eq. 4)   J_m(U, c) = sum_i sum_j u_ij^m ||x_i - c_j||^2,
* memberships (eq. 5) u_ij = 1 / sum_l (d_ij / d_il)^(2/(m-1)),   d_ij = ||x_i - c_j||,
* centres (eq. 6)     c_j = sum_i u_ij^m x_i / sum_i u_ij^m,
* stopping rule       ||U^(t+1) - U^t|| <= eps.

Eq. 5 is printed with squared norms inside the ratio; with the paper's own definition of
the norm that is ambiguous, so we implement Bezdek's form above, which is the stationary
point of eq. 4 (with squared distances D_ij = d_ij^2 the exponent becomes 1/(m-1)).

Choices the paper leaves open (documented in ``docs/algorithms/federated-fuzzy-c-means.md``):

* the membership-change norm is the largest absolute change of any u_ij ("did the
  memberships change by at most eps"), which does not grow with the number of records --
  clients of very different sizes then stop at the same precision;
* a record that coincides with one or more centres (d_ij = 0 exactly) belongs fully to
  those centres, shared equally (the limit of eq. 5);
* the central baseline starts from a random membership matrix (Bezdek's step 1) unless
  ``init`` gives centres or asks for k-means++.

Every kernel works on whole (n, c) arrays: no per-record Python loops.
"""

from __future__ import annotations

import numpy as np

from ..validation import check_array, check_float, check_int, check_random_state
from ..exceptions import InputError
from ._cellsums import compiled, scratch
from ._kmeans import seed_kmeans_plusplus, sq_distances
from ._local import direct_sq_distances

#: relative size below which an expanded squared distance is recomputed exactly
_EXACT_REL = 1e-9


def check_fuzzifier(m, name: str = "m") -> float:
    """The fuzzifier m of eq. 4 must be a finite number > 1."""
    return check_float(m, name, minimum=1.0, min_inclusive=False)


def exact_sq_distances(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Squared distances (n, c), exact where a record is (nearly) on a centre.

    The BLAS expansion ||x||^2 - 2x.c + ||c||^2 loses the small distances to rounding; rows
    whose smallest expanded distance is tiny relative to the norms are recomputed from
    the differences, so that d_ij = 0 is detected exactly (the d = 0 case of eq. 5).
    """
    D = sq_distances(X, C)
    scale = np.einsum("ij,ij->i", X, X)[:, None] + np.einsum("ij,ij->i", C, C)[None, :]
    close = np.any(D <= _EXACT_REL * scale, axis=1)
    if np.any(close):
        diff = X[close][:, None, :] - C[None, :, :]
        D[close] = np.einsum("ijk,ijk->ij", diff, diff)
    return D


def memberships_from_sq_distances(D: np.ndarray, m: float = 2.0) -> np.ndarray:
    """Eq. 5 from squared distances D (n, c): u_ij = D_ij^(-1/(m-1)) / sum_l D_il^(-1/(m-1)).

    Rows are scaled by their smallest distance first (ratios in (0, 1], no overflow). A row
    with one or more zero distances gives membership 1/z to each of its z coinciding
    centres and 0 elsewhere. Rows sum to 1.
    """
    D = np.asarray(D, dtype=np.float64)
    zero = D <= 0.0
    has_zero = zero.any(axis=1)
    dmin = D.min(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = dmin / D  # in (0, 1] for rows without zeros
    if m != 2.0:
        ratio = ratio ** (1.0 / (m - 1.0))
    if np.any(has_zero):
        ratio[has_zero] = zero[has_zero]
    U = ratio / ratio.sum(axis=1, keepdims=True)
    return U


def fuzzy_memberships(X: np.ndarray, C: np.ndarray, m: float = 2.0) -> np.ndarray:
    """Membership matrix U (n, c) of records X w.r.t. centres C (Stallmann & Wilbik eq. 5)."""
    return memberships_from_sq_distances(exact_sq_distances(X, C), m)


#: most centres the compiled membership loop handles (numpy's pairwise row sum is one
#: block of 8 interleaved partial sums up to 128 values; above, it splits recursively)
COMPILED_MAX_CENTRES = 128


def membership_weights(X: np.ndarray, C: np.ndarray, m: float = 2.0, fast: bool = False) -> np.ndarray:
    """The weights ``u_ij ** m`` of eq. 6 in a federated-averaging round: eq. 5's memberships
    from :func:`direct_sq_distances` (:func:`memberships_from_sq_distances`) raised to ``m``.

    With ``fast`` (a pooled round's large calls: :func:`._cellsums.use_compiled`), m = 2 and
    at most :data:`COMPILED_MAX_CENTRES` centres, one compiled pass per record
    (``_cellsums_jit.fcm_weights_m2``) instead of numpy's 3 d + 10 passes over (n, k)
    temporaries; it repeats numpy's operations in numpy's order, so both give the same bits
    (the tests compare them). The result is then a per-thread scratch buffer, valid until
    this thread's next call. Other m stay on numpy (its ``power`` may use SIMD code whose
    last bits a compiled ``pow`` does not reproduce)."""
    m = float(m)
    C = np.asarray(C, dtype=np.float64)
    if fast and m == 2.0 and 1 <= len(C) <= COMPILED_MAX_CENTRES and len(X) and X.shape[1]:
        kernel = compiled("fcm_weights_m2")
        if kernel is not None:
            W = scratch("fcm_weights", (len(X), len(C)))
            kernel(np.asarray(X, dtype=np.float64), np.ascontiguousarray(C.T), W)
            return W
    W = memberships_from_sq_distances(direct_sq_distances(X, C), m)
    if m != 1.0:
        W **= m
    return W


def weighted_sums(X: np.ndarray, U: np.ndarray, m: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """Numerators sum_i u_ij^m x_i (c, d) and denominators sum_i u_ij^m (c,) of eq. 6."""
    W = U if m == 1.0 else U**m
    return W.T @ X, W.sum(axis=0)


def centres_from_sums(sums: np.ndarray, weights: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """Eq. 6 as a division; a centre with no positive weight keeps its previous position."""
    new = np.array(previous, dtype=np.float64, copy=True)
    nz = weights > 0
    new[nz] = sums[nz] / weights[nz, None]
    return new


def fcm_step(X: np.ndarray, C: np.ndarray, m: float = 2.0):
    """One FCM step from centres C: memberships w.r.t. C (eq. 5), then new centres (eq. 6).

    Returns (new centres, memberships w.r.t. C).
    """
    U = fuzzy_memberships(X, C, m)
    s, w = weighted_sums(X, U, m)
    return centres_from_sums(s, w, C), U


def local_fcm(X: np.ndarray, C: np.ndarray, m: float = 2.0, tol: float = 1e-3, max_iter: int = 300):
    """FCM iterations from given centres until the memberships change by at most ``tol``.

    This is a client's local computation in FedFCM (Stallmann & Wilbik sec. 2.2.1, step 3:
    "calculates U according to eq. 5 and local centres according to eq. 6 and repeats until
    local convergence"). Returns (centres, memberships w.r.t. the returned centres, n_iter).
    """
    C = np.asarray(C, dtype=np.float64)
    U = fuzzy_memberships(X, C, m)
    n_iter = 0
    while n_iter < max_iter:
        s, w = weighted_sums(X, U, m)
        C = centres_from_sums(s, w, C)
        U_new = fuzzy_memberships(X, C, m)
        n_iter += 1
        delta = float(np.max(np.abs(U_new - U))) if U.size else 0.0
        U = U_new
        if delta <= tol:
            break
    return C, U, n_iter


def fcm_objective(X: np.ndarray, C: np.ndarray, m: float = 2.0) -> float:
    """J_m of eq. 4 at the memberships of eq. 5 for centres C."""
    D = exact_sq_distances(X, C)
    U = memberships_from_sq_distances(D, m)
    return float(np.sum((U**m) * D))


def random_memberships(n: int, c: int, rng: np.random.Generator) -> np.ndarray:
    """Bezdek's random initial U^0: uniform entries, rows normalised to sum 1."""
    U = rng.random((n, c)) + 1e-12
    return U / U.sum(axis=1, keepdims=True)


def fuzzy_cmeans(
    X,
    n_clusters: int,
    m: float = 2.0,
    tol: float = 1e-3,
    max_iter: int = 300,
    random_state=None,
    init="random",
):
    """Central (non-federated) fuzzy c-means, the baseline of Stallmann & Wilbik sec. 2.1.2.

    Steps: initialise U^0 (``init="random"``, Bezdek's step 1) or centres (``"k-means++"``
    or an array of shape (n_clusters, n_features)); compute centres by eq. 6; memberships
    by eq. 5; stop when max_ij |u_ij^(t+1) - u_ij^t| <= ``tol`` or after ``max_iter`` steps.

    Returns
    -------
    centres : (n_clusters, n_features) array
    memberships : (n_records, n_clusters) array, w.r.t. the returned centres
    n_iter : int, number of centre updates
    """
    X = check_array(X, "X")
    c = check_int(n_clusters, "n_clusters", minimum=1)
    if c > len(X):
        raise InputError(
            f"n_clusters={c} is larger than the number of records ({len(X)}); lower n_clusters."
        )
    m = check_fuzzifier(m)
    tol = check_float(tol, "tol", minimum=0.0)
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    rng = check_random_state(random_state)
    if isinstance(init, str) and init == "random":
        U = random_memberships(len(X), c, rng)
        s, w = weighted_sums(X, U, m)
        C = s / w[:, None]
        U = fuzzy_memberships(X, C, m)
        C, U, n_iter = local_fcm(X, C, m, tol, max_iter - 1) if max_iter > 1 else (C, U, 0)
        return C, U, n_iter + 1
    if isinstance(init, str) and init == "k-means++":
        C0 = seed_kmeans_plusplus(X, c, rng)
    elif isinstance(init, str):
        raise InputError(
            f"init must be 'random', 'k-means++' or an array of centres, got {init!r}."
        )
    else:
        C0 = check_array(init, "init")
        if C0.shape != (c, X.shape[1]):
            raise InputError(
                f"init array has shape {C0.shape}, expected (n_clusters, n_features) = ({c}, {X.shape[1]})."
            )
    return local_fcm(X, C0, m, tol, max_iter)


def fedfuzzdb_terms(X: np.ndarray, C: np.ndarray, m: float, q: float) -> dict[str, np.ndarray]:
    """One client's FedFuzzDB sum-fields (Stallmann & Wilbik 2022, sec. 2.2.2): N_l,
    sum_j u_ij and sum_j ||x_j - c_i||^q; ``securefkm.metrics_fuzzy`` checks the inputs."""
    D = exact_sq_distances(X, C)
    U = memberships_from_sq_distances(D, m)
    dist_q = D if q == 2.0 else (np.sqrt(D) if q == 1.0 else np.sqrt(D) ** q)
    return {
        "n": np.array([float(len(X))]),
        "memberships": U.sum(axis=0),
        "spread": dist_q.sum(axis=0),
    }


def fuzzy_db_from_parts(n, membership_sums, spread_sums, C, p, q) -> float:
    """Eqs. 7-13 from N, sum_j u_ij and sum_j ||x_j - c_i||^q (Stallmann & Wilbik 2022; shared by
    the central and the federated index, ``securefkm.metrics_fuzzy``)."""
    U_i = membership_sums / n  # eq. 13 / 16
    mean_dist = np.maximum(spread_sums / n, 0.0)  # DP noise may push a sum below 0
    S = U_i * mean_dist ** (1.0 / q)  # eq. 12 / 14-15
    diff = np.abs(C[:, None, :] - C[None, :, :])
    M = diff.max(axis=-1) if np.isinf(p) else (diff**p).sum(axis=-1) ** (1.0 / p)  # eq. 11
    with np.errstate(divide="ignore", invalid="ignore"):
        R = (S[:, None] + S[None, :]) / M  # eq. 9
    R[M == 0] = np.inf
    np.fill_diagonal(R, -np.inf)
    return float(np.mean(R.max(axis=1)))  # eqs. 7-8
