"""Federated fuzzy c-means and the federated cluster-analysis framework of Stallmann & Wilbik.

Stallmann & Wilbik, "On a Framework for Federated Cluster Analysis", Appl. Sci. 2022,
section 2.2.3 ("The complete framework"):

1. decide on a range [K_min, K_max]  -> :func:`suggest_k_range` (the rule of thumb);
2. for each K: FedFCM (sec. 2.2.1) and its FedFuzzDB (sec. 2.2.2)
   -> :class:`FederatedFuzzyCMeans` (``fuzzy_index_``);
3. choose K with the minimum FedFuzzDB, or by the elbow method -> :func:`select_n_clusters`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..validation import check_float, check_int, check_random_state
from ..algorithms._fcm import check_fuzzifier, fuzzy_cmeans, fuzzy_memberships
from ..algorithms.fuzzy import FederatedFuzzyCMeansAlgorithm
from ..datasets import as_federated
from ..exceptions import InputError
from ..federation.runtime import MAX_ABORTED_ROUNDS, MAX_CLIENT_FAULTS
from ..metrics_fuzzy import fuzzy_davies_bouldin
from .aligning import record_level_dp
from .base import FederatedClusterer, resolve_init

DEFAULT_MAX_ROUNDS = 100

#: scikit-learn checks that set n_clusters=1, which fuzzy c-means refuses with a message (see
#: ``_make_algorithm``); declared to ``parametrize_with_checks(expected_failed_checks=...)``
_ONE_CLUSTER = ("the check sets n_clusters=1; fuzzy c-means needs n_clusters >= 2 (with one cluster every "
                "membership is 1 and FedFuzzDB, Stallmann & Wilbik sec. 2.2.2, is undefined) and refuses it")
SKLEARN_EXPECTED_FAILED_CHECKS = {
    name: _ONE_CLUSTER
    for name in ("check_dont_overwrite_parameters", "check_methods_subset_invariance",
                 "check_fit2d_1feature", "check_fit2d_predict1d")
}


class FederatedFuzzyCMeans(FederatedClusterer):
    """Federated fuzzy c-means: FedFCM (k-means averaging) or federated averaging.

    Parameters
    ----------
    n_clusters : int, >= 2
    averaging : {"kmeans", "fedavg"}
        "kmeans": FedFCM of Stallmann & Wilbik (sec. 2.2.1, eq. 17) -- clients run local FCM
        from the global centres to local convergence and send their local centres
        (set-fields); the server runs k-means over all local centres. "fedavg": federated
        averaging FCM (Pedrycz 2022; Bárcena et al. 2021) -- clients send the sums
        sum_i u_ij^m x_i and sum_i u_ij^m (sum-fields, secure-aggregation ready).
    m : float > 1
        Fuzzifier of eq. 4 (the paper: 2).
    local_tol, global_tol : float
        Local stop: largest membership change <= local_tol; global stop:
        sum_k ||c_k^t - c_k^(t+1)|| <= global_tol (the paper: 0.001 both).
    max_local_iter : int
        Cap on a client's local FCM iterations per round.
    max_rounds : int or None
        Cap on training rounds (then the validity round still runs). None (default): 100;
        with ``averaging="fedavg"`` (or ``secure_mode=True``) and a ``GaussianDP`` layer that
        leaves its per-round noise to the budget, the rounds the DP rule picks for that budget
        (``dp_plan_``). With ``init="auto"`` and every client in every round that is DWF's full
        plan (:func:`securefkm.estimators._dp_planning.plan_for_estimator`: its spread start or
        weighted private seeding, heavier last round and step shrinkage; the eq. 6 sums have a
        crisp round's sensitivity, docs/protocols/dp-utility.md), else the rounds only
        (:func:`securefkm.estimators._dp_planning.rounds_plan_for_estimator`).
    centre_weights : {"none", "membership"}
        k-means averaging only: "none" (the paper) sends centres only; "membership" also
        sends each local centre's fuzzy support sum_i u_ij and weights the server k-means.
    server_init : {"warm", "fresh"}
        k-means averaging only: how the server k-means starts after the first round (see
        ``securefkm.algorithms.fuzzy``).
    clients_per_round : int or float
    n_init : int
        Independent runs; the one with the lowest FedFuzzDB is kept.
    init : "auto", "k-means++", "random", "kfed", "uniform" or array (n_clusters, n_features)
        First global centres (the paper leaves this open). "auto" is k-means++ on one
        random client's records without protection and a uniform start within
        ``init_bounds`` under protection.
    init_bounds : (low, high) or None
    secure_mode : bool
        k-means averaging with the server k-means run as rounds of secure sums: clients keep
        their local centres private (``securefkm.algorithms.secure_centres``). Each secure
        k-means iteration is a round: ``max_rounds`` then caps all rounds.
    oversample : int
        Secure mode only: with ``init_bounds``, the first secure server k-means starts from
        ``oversample * n_clusters`` uniform centres and reduces them to ``n_clusters``.
    protection : list of layers
    dropout_rate : float or dict
    random_state, verbose, crypto, backend, n_workers, max_aborted_rounds, max_client_faults, record, transcript_path
        ``crypto="ideal"`` swaps the secure aggregator for its ideal functionality (same release;
        studies only, see docs/protocols/ideal-functionality.md).

    Attributes
    ----------
    cluster_centers_, labels_ (nearest centre = largest membership), inertia_, n_iter_,
    fuzzy_index_ (FedFuzzDB of the fitted centres, from the protected validity round),
    transcript_, privacy_spent_ (under DP).
    """

    def __init__(
        self,
        n_clusters=8,
        *,
        averaging="kmeans",
        m=2.0,
        local_tol=1e-3,
        global_tol=1e-3,
        max_local_iter=300,
        max_rounds=None,
        centre_weights="none",
        server_init="warm",
        clients_per_round=1.0,
        n_init=1,
        init="auto",
        init_bounds=None,
        secure_mode=False,
        oversample=5,
        protection=None,
        dropout_rate=None,
        random_state=None,
        verbose=0,
        crypto="real",
        backend="auto",
        n_workers=None,
        max_aborted_rounds=MAX_ABORTED_ROUNDS,
        max_client_faults=MAX_CLIENT_FAULTS,
        record=None,
        transcript_path=None,
    ):
        self.n_clusters = n_clusters
        self.averaging = averaging
        self.m = m
        self.local_tol = local_tol
        self.global_tol = global_tol
        self.max_local_iter = max_local_iter
        self.max_rounds = max_rounds
        self.centre_weights = centre_weights
        self.server_init = server_init
        self.clients_per_round = clients_per_round
        self.n_init = n_init
        self.init = init
        self.init_bounds = init_bounds
        self.secure_mode = secure_mode
        self.oversample = oversample
        self.protection = protection
        self.dropout_rate = dropout_rate
        self.random_state = random_state
        self.verbose = verbose
        self.crypto = crypto
        self.backend = backend
        self.n_workers = n_workers
        self.max_aborted_rounds = max_aborted_rounds
        self.max_client_faults = max_client_faults
        self.record = record
        self.transcript_path = transcript_path

    def _n_runs(self):
        return check_int(self.n_init, "n_init", minimum=1)

    def _max_rounds(self):
        return DEFAULT_MAX_ROUNDS if self.max_rounds is None else self.max_rounds

    def plans_dp_rounds(self) -> bool:
        # fedavg rounds are sums with Lloyd's sensitivity, and so are the record-level rounds of
        # k-means averaging's secure mode under GaussianDP (record_level_dp); plain k-means
        # averaging sends local centres, which DP refuses
        return (self.averaging == "fedavg" and not self.secure_mode) or record_level_dp(self)

    def _plan_dp(self, data, layers, seed):
        if not self.plans_dp_rounds():
            return None
        from ._dp_planning import _client_fraction, plan_for_estimator, rounds_plan_for_estimator

        # fedavg rounds are count/sum releases of Lloyd's sensitivity: DWF's full plan applies when
        # every round sums all records (its noise level reads n); under client sampling the
        # rounds-only plan, whose noise level reads the records a round is expected to sum
        full = _client_fraction(self, data) == 1.0 and plan_for_estimator(
            self, data, layers, seed, exact_lloyd=True, train_action="train.fedavg")
        return full or rounds_plan_for_estimator(self, data, layers, spread_seed=seed)

    def _make_algorithm(self, n_features, n_clients):
        if check_int(self.n_clusters, "n_clusters", minimum=1) < 2:
            raise InputError(
                f"FederatedFuzzyCMeans needs n_clusters >= 2, got {self.n_clusters}: with one class every "
                "membership is 1 and the fuzzy validity index is undefined; use n_clusters=2 or more."
            )
        init = resolve_init(
            self.init, self._protection_layers(), self._declared_bounds(n_features), n_clusters=self.n_clusters, n_features=n_features,
            default_plain="k-means++", default_protected="private",
        )
        plan = getattr(self, "dp_plan_", None)
        if plan is not None and plan.private_start:  # the DP plan's private seeding round
            init = "private"
        elif plan is not None and plan.start is not None:  # the DP plan's data-independent start
            init = plan.start
        record_level = record_level_dp(self)
        algorithm = FederatedFuzzyCMeansAlgorithm(
            self.n_clusters,
            # record-level DP: the secure mode's rounds are per-record fuzzy sums to the global
            # centres (sum of u^m x and of u^m), i.e. federated-averaging rounds
            averaging="fedavg" if record_level else self.averaging,
            m=self.m,
            local_tol=self.local_tol,
            global_tol=self.global_tol,
            max_local_iter=self.max_local_iter,
            centre_weights=self.centre_weights,
            server_init=self.server_init,
            init=init,
            init_bounds=self._declared_bounds(n_features),
            validity_round=True,
            secure_mode=self.secure_mode and not record_level,
            oversample=self.oversample,
            seeding_noise=plan.noise_level if plan is not None and plan.private_start else None,
        )
        if record_level:
            algorithm.name = "fedfcm-secure-dp"
        return algorithm

    def _set_fitted(self, data, algorithm, federation, state, pooled=None):
        super()._set_fitted(data, algorithm, federation, state, pooled=pooled)
        self.fuzzy_index_ = state.score
        self.m_ = algorithm.m

    def predict_proba(self, X):
        """Fuzzy memberships (n, n_clusters) of new records (eq. 5); rows sum to 1."""
        return fuzzy_memberships(self._check_X(X), self.cluster_centers_, self.m_)

    def membership(self, X):
        """Alias of :meth:`predict_proba`."""
        return self.predict_proba(X)

    def predict(self, X):
        """Cluster of largest membership, i.e. the nearest centre (eq. 5 is decreasing in d_ij)."""
        return super().predict(X)


# --------------------------------------------------------------------- framework
def local_fuzzy_db_scores(
    X, ks, *, m=2.0, tol=1e-3, max_iter=300, random_state=None
) -> dict[int, float]:
    """A client's local-only fuzzy DB curve: central FCM on its own records for each K,
    scored by the fuzzy Davies-Bouldin index (the "Local client" columns of Table 1).
    K larger than the number of records gives NaN."""
    X = np.asarray(X, dtype=np.float64)
    rng = check_random_state(random_state)
    out = {}
    for k in ks:
        if k > len(X) or k < 2:
            out[int(k)] = float("nan")
            continue
        C, U, _ = fuzzy_cmeans(X, k, m=m, tol=tol, max_iter=max_iter, random_state=rng)
        out[int(k)] = fuzzy_davies_bouldin(X, C, m=m)
    return out


def elbow_k(scores: dict[int, float]) -> int:
    """Elbow of a validity curve (lower is better), kneedle-style (Satopää et al. 2011).

    Definition: scale K and the scores to [0, 1] (min-max over the finite points), draw
    the chord from the first point (smallest K) to the last (largest K), and return the K
    whose point lies furthest *below* the chord (vertical distance; for a straight chord
    this orders points like the perpendicular distance). If no point lies strictly below
    the chord, or there are fewer than 3 points, the K with the minimum score is returned.
    """
    items = sorted((int(k), float(v)) for k, v in scores.items() if np.isfinite(v))
    if not items:
        raise InputError("scores has no finite value; the elbow is undefined.")
    ks = np.array([k for k, _ in items], dtype=np.float64)
    vs = np.array([v for _, v in items])
    best = int(ks[np.argmin(vs)])
    if len(items) < 3 or np.ptp(vs) == 0:
        return best
    x = (ks - ks[0]) / (ks[-1] - ks[0])
    y = (vs - vs.min()) / np.ptp(vs)
    chord = y[0] + (y[-1] - y[0]) * x
    below = chord - y
    if below.max() <= 0:
        return best
    return int(ks[np.argmax(below)])


@dataclass
class KSelection:
    """Result of :func:`select_n_clusters`.

    ``scores``: K -> FedFuzzDB of the FedFCM clustering with K clusters; ``best_k``: the
    K of minimum FedFuzzDB (sec. 2.2.3, step 3); ``elbow_k``: :func:`elbow_k` of
    ``scores``; ``centres``: K -> fitted global centres; ``local_scores``: client index
    -> (K -> the client's local-only fuzzy DB); ``local_best_k``: each client's own
    minimum (what it would conclude alone).
    """

    scores: dict[int, float]
    best_k: int
    elbow_k: int
    centres: dict[int, np.ndarray] = field(default_factory=dict)
    local_scores: dict[int, dict[int, float]] = field(default_factory=dict)
    local_best_k: dict[int, int] = field(default_factory=dict)
    n_rounds: dict[int, int] = field(default_factory=dict)


def _k_bounds(k_min, k_max, n_samples):
    k_min = check_int(k_min, "k_min", minimum=2)
    k_max = check_int(k_max, "k_max", minimum=2)
    if k_max < k_min:
        raise InputError(f"k_max={k_max} must be >= k_min={k_min}.")
    if k_max > n_samples:
        raise InputError(
            f"k_max={k_max} is larger than the number of records ({n_samples}); lower k_max."
        )
    return k_min, k_max


def select_n_clusters(
    data, k_min=2, k_max=8, *, local_scores=True, local_k_max=None, **params
) -> KSelection:
    """The complete framework of Stallmann & Wilbik (sec. 2.2.3) over K in [k_min, k_max].

    For each K, fits :class:`FederatedFuzzyCMeans` (``params`` are its parameters, e.g.
    ``averaging``, ``random_state``, ``protection``) and records its FedFuzzDB
    (``fuzzy_index_``, computed in a protected validity round). With ``local_scores=True``
    every client also computes its local-only fuzzy DB curve over K in [k_min,
    ``local_k_max``] (default ``k_max``; the paper's Table 1 uses 5) -- in a deployment each
    client would do this on its own machine and keep it.
    """
    fed = as_federated(data)
    k_min, k_max = _k_bounds(k_min, k_max, fed.n_samples)
    if "n_clusters" in params:
        raise InputError(
            "select_n_clusters chooses n_clusters itself; pass k_min and k_max instead."
        )
    scores, centres, rounds = {}, {}, {}
    for k in range(k_min, k_max + 1):
        est = FederatedFuzzyCMeans(n_clusters=k, **params).fit(fed)
        scores[k] = float(est.fuzzy_index_)
        centres[k] = est.cluster_centers_
        rounds[k] = est.n_iter_
    result = KSelection(
        scores=scores,
        best_k=min(scores, key=lambda k: (scores[k], k)),
        elbow_k=elbow_k(scores),
        centres=centres,
        n_rounds=rounds,
    )
    if local_scores:
        m = check_fuzzifier(params.get("m", 2.0))
        tol = check_float(params.get("local_tol", 1e-3), "local_tol", minimum=0.0)
        seed = params.get("random_state")
        local_hi = (
            k_max if local_k_max is None else check_int(local_k_max, "local_k_max", minimum=k_min)
        )
        for i, X in enumerate(fed.clients):
            curve = local_fuzzy_db_scores(
                X, range(k_min, local_hi + 1), m=m, tol=tol, random_state=seed
            )
            result.local_scores[i] = curve
            finite = {k: v for k, v in curve.items() if np.isfinite(v)}
            if finite:
                result.local_best_k[i] = min(finite, key=lambda k: (finite[k], k))
    return result


@dataclass
class KRange:
    """Result of :func:`suggest_k_range` (Stallmann & Wilbik sec. 2.2.3, rule of thumb).

    ``k_min`` = min_l K_l (the fewest clusters any client finds alone); ``k_max`` =
    min_l K_l + max_l K_l (the paper's "very rough rule of thumb" used in sec. 3.2.3);
    ``k_sum`` = sum_l K_l (the paper's rough upper bound before the unknown "forming" and
    "overlapping" corrections); ``local_k``: client -> K_l; ``local_scores``: client ->
    (K -> local fuzzy DB).
    """

    k_min: int
    k_max: int
    k_sum: int
    local_k: dict[int, int]
    local_scores: dict[int, dict[int, float]]


def suggest_k_range(
    data, k_max, k_min=2, *, method="min", m=2.0, tol=1e-3, max_iter=300, random_state=None
) -> KRange:
    """The paper's rule of thumb for the range of K from the clients' local indices.

    Each client l runs central FCM on its own records for K in [k_min, k_max] and picks its
    local K_l from its fuzzy DB curve -- the minimum (``method="min"``) or the elbow
    (``method="elbow"``, :func:`elbow_k`; the paper's sec. 3.2.3 reads elbows). Then
    (sec. 2.2.3): K_min = min_l K_l and K_max = min_l K_l + max_l K_l. Only the K_l leave
    the clients. Clusters that only form when the data are pooled (the motivational set)
    can lie above this K_max; the paper warns that the range is a rough guess.
    """
    fed = as_federated(data)
    k_min, k_max = _k_bounds(k_min, k_max, fed.n_samples)
    if method not in ("min", "elbow"):
        raise InputError(f"method must be 'min' or 'elbow', got {method!r}.")
    m = check_fuzzifier(m)
    tol = check_float(tol, "tol", minimum=0.0)
    local_k, local_scores = {}, {}
    for i, X in enumerate(fed.clients):
        curve = local_fuzzy_db_scores(
            X, range(k_min, k_max + 1), m=m, tol=tol, max_iter=max_iter, random_state=random_state
        )
        local_scores[i] = curve
        finite = {k: v for k, v in curve.items() if np.isfinite(v)}
        if not finite:
            raise InputError(
                f"client {i} has fewer than k_min={k_min} records; lower k_min or drop the client."
            )
        local_k[i] = (
            min(finite, key=lambda k: (finite[k], k)) if method == "min" else elbow_k(finite)
        )
    lo, hi = min(local_k.values()), max(local_k.values())
    return KRange(
        k_min=lo,
        k_max=lo + hi,
        k_sum=int(sum(local_k.values())),
        local_k=local_k,
        local_scores=local_scores,
    )
