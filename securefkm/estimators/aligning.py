"""Estimator for Garst & Reinders' federated k-means with cluster alignment (FKM)."""

from __future__ import annotations

import numpy as np

from ..algorithms.aligning import AligningFederatedKMeansAlgorithm, client_weighted_ari, pooled_ari
from ..exceptions import InputError
from ..federation.runtime import MAX_ABORTED_ROUNDS, MAX_CLIENT_FAULTS
from .base import FederatedClusterer, resolve_init, resolve_protection

__all__ = ["AligningFederatedKMeans", "pooled_ari", "client_weighted_ari"]

DEFAULT_MAX_ROUNDS = 100


def dp_layer(protection):
    """The ``GaussianDP`` layer of a protection stack, or None."""
    from protocols.dp import GaussianDP

    return next((la for la in resolve_protection(protection) if isinstance(la, GaussianDP)), None)


def record_level_dp(estimator) -> bool:
    """Whether a set-valued estimator runs its record-level secure mode: ``secure_mode=True``
    with a ``GaussianDP`` layer in the stack.

    Under record-level DP the secure mode's rounds are per-record sums: each client returns, per
    global centre, the count and the coordinate sum of its records whose nearest global centre
    it is. Summing the clients' local centres instead (the secure mode without DP) has no
    record-level bound: one record can change a client's local clustering and move a whole
    local cluster from one global centre to another. These rounds are exact distributed Lloyd
    rounds; for Garst's FKM they are its own rounds (a local k-means step from the global
    centres, then one warm-started server iteration with each local centre counted where it was
    formed), for the one-shot methods the local clustering does not enter (docs/protocols/
    differential-privacy.md, "Sensitivity of every algorithm").
    """
    layers = estimator._protection_layers() if hasattr(estimator, "_protection_layers") else estimator.protection
    return bool(getattr(estimator, "secure_mode", False)) and dp_layer(layers) is not None


def record_level_kmeans(estimator, n_features: int, name: str):
    """The algorithm of a set-valued k-means estimator in record-level DP mode: one-step
    dynamically weighted rounds (per-cluster counts and coordinate sums) from the DP plan's start,
    or from the estimator's protected start (``init="auto"``: a private seeding round)."""
    from ..algorithms.dwf import WeightedFederatedKMeansAlgorithm

    plan = getattr(estimator, "dp_plan_", None)
    bounds = estimator._declared_bounds(n_features)
    if plan is not None and plan.private_start:
        init = "private"
    elif plan is not None and plan.start is not None:
        init = plan.start
    else:
        init = resolve_init(estimator.init, estimator.protection, bounds, n_clusters=estimator.n_clusters,
                            n_features=n_features, default_plain="kfed", default_protected="private")
    algorithm = WeightedFederatedKMeansAlgorithm(
        estimator.n_clusters, weighting="dynamic", max_local_steps=1,
        tol=getattr(estimator, "tol", getattr(estimator, "server_tol", 1e-6)), init=init,
        init_bounds=bounds, seeding_noise=plan.noise_level if plan is not None and plan.private_start else None,
    )
    algorithm.name = name
    return algorithm


def plan_record_level(estimator, data, layers, seed):
    """The DP plan of a set-valued estimator in record-level DP mode (the same rule as DWF's:
    its rounds are exact Lloyd rounds), else None."""
    if not record_level_dp(estimator):
        return None
    from ._dp_planning import plan_for_estimator, rounds_plan_for_estimator

    return (plan_for_estimator(estimator, data, layers, seed, exact_lloyd=True)
            or rounds_plan_for_estimator(estimator, data, layers))


def _secure_init(estimator, n_features):
    """The start of the secure server k-means (only used with ``secure_mode=True``).

    "auto" is the data-independent uniform start in ``init_bounds`` when bounds are given
    (protected or not), and k-FED seeding (plain local centres) without protection and
    without bounds. Under protection without bounds ``resolve_init`` raises and says the fix.
    """
    init = estimator.init
    bounds = estimator._declared_bounds(n_features)
    if isinstance(init, str) and init == "auto" and bounds is not None:
        return "uniform"
    return resolve_init(
        init, estimator.protection, bounds, n_clusters=estimator.n_clusters,
        n_features=n_features, default_plain="kfed",
    )


class AligningFederatedKMeans(FederatedClusterer):
    """Federated k-means with cluster alignment (Garst & Reinders, Algorithm 1).

    Clients seed K_g local centres with k-means++ and send them with their sizes; each round
    the server runs a size-weighted k-means over all local centres (eq. 1), the clients
    assign their records to the global centres, drop the empty ones, run one local k-means
    iteration and send their new local centres and sizes. Clusters with fewer than
    ``min_cluster_size`` records are never sent.

    Parameters
    ----------
    n_clusters : int
        K_g.
    min_cluster_size : int
        p of the paper (2): smaller local clusters are not sent.
    max_rounds : int or None
        Training rounds (the paper's communication rounds; its code uses 100). None (default):
        100, or with ``secure_mode=True`` under a budget-led ``GaussianDP`` the rounds of the DP
        plan (``dp_plan_``).
    tol : float
        Stop when the global centres move less than tol between rounds.
    local_init : {"seeds", "means"}
        "seeds" sends the k-means++ seeds (raw records, as the paper); "means" the mean of the
        records nearest to each seed.
    server_n_init : int
        Restarts of the plain server k-means (k-means++).
    secure_mode : bool
        Run the server k-means as rounds of secure sums over the clients' privately kept
        local centres (``securefkm.algorithms.secure_centres``), so the protocol runs under
        PairwiseMasking / Paillier; the server never sees a client's local centres. With a
        ``GaussianDP`` layer the secure mode's rounds are record-level sums (per global centre, a
        client's count and coordinate sum of the records nearest to it: see ``record_level_dp``),
        the form every DP mode can bound.
    server_max_iter, server_tol : int, float
        Iterations and tolerance of each secure server k-means.
    oversample : int
        Secure mode with a uniform start: ``oversample * n_clusters`` uniform centres are
        refined first and reduced to n_clusters by the server (see secure_centres).
    init : "auto", "uniform", "k-means++", "random", "kfed" or array
        Start of the secure server k-means (ignored in plain mode). "auto" = "uniform" when
        ``init_bounds`` is given, else "kfed" without protection.
    init_bounds : (low, high) or None
    clients_per_round, protection, dropout_rate, random_state, verbose, crypto, backend, n_workers, max_aborted_rounds, max_client_faults, record, transcript_path
    """

    def __init__(
        self,
        n_clusters=8,
        *,
        min_cluster_size=2,
        max_rounds=None,
        tol=1e-4,
        local_init="seeds",
        server_n_init=10,
        secure_mode=False,
        server_max_iter=300,
        server_tol=1e-6,
        oversample=4,
        init="auto",
        init_bounds=None,
        clients_per_round=1.0,
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
        self.min_cluster_size = min_cluster_size
        self.max_rounds = max_rounds
        self.tol = tol
        self.local_init = local_init
        self.server_n_init = server_n_init
        self.secure_mode = secure_mode
        self.server_max_iter = server_max_iter
        self.server_tol = server_tol
        self.oversample = oversample
        self.init = init
        self.init_bounds = init_bounds
        self.clients_per_round = clients_per_round
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

    def _check_data(self, data):
        # no local cluster could ever be sent: say so in terms of the data, before any round
        if int(data.sizes.max()) < self.min_cluster_size:
            raise InputError(
                f"every client has fewer than min_cluster_size={self.min_cluster_size} records "
                f"(n_samples={data.n_samples}, largest client {int(data.sizes.max())}); lower min_cluster_size."
            )

    def _max_rounds(self):
        return DEFAULT_MAX_ROUNDS if self.max_rounds is None else self.max_rounds

    def plans_dp_rounds(self) -> bool:
        return record_level_dp(self)

    def _plan_dp(self, data, layers, seed):
        return plan_record_level(self, data, layers, seed)

    def _make_algorithm(self, n_features, n_clients):
        if record_level_dp(self):
            return record_level_kmeans(self, n_features, "garst-fkm-secure-dp")
        init = _secure_init(self, n_features) if self.secure_mode else "uniform"
        return AligningFederatedKMeansAlgorithm(
            self.n_clusters,
            min_cluster_size=self.min_cluster_size,
            max_rounds=self._max_rounds(),
            tol=self.tol,
            local_init=self.local_init,
            server_n_init=self.server_n_init,
            secure_mode=self.secure_mode,
            server_max_iter=self.server_max_iter,
            server_tol=self.server_tol,
            oversample=self.oversample,
            init=init if isinstance(init, (str, np.ndarray)) else np.asarray(init),
            init_bounds=self._declared_bounds(n_features),
        )
