"""Estimator for one-shot federated k-means: k-FED and the child/parent method."""

from __future__ import annotations

from ..algorithms.oneshot import OneShotFederatedKMeansAlgorithm
from ..federation.runtime import MAX_ABORTED_ROUNDS, MAX_CLIENT_FAULTS
from .aligning import _secure_init, plan_record_level, record_level_dp, record_level_kmeans
from .base import FederatedClusterer


class OneShotFederatedKMeans(FederatedClusterer):
    """One-shot federated k-means: one round of local centres, one server k-means over them.

    Parameters
    ----------
    n_clusters : int
    variant : {"kfed", "child-parent"}
        "kfed": local k-means with ``local_k`` clusters, server k-means over all local centres
        (Dennis, Li & Smith 2021). "child-parent": the notebook method -- k-means on 75 % of
        each client's records (the last 75 %, as its ``np.split``), online mean update with the
        first 25 % in order, parent k-means over all child centres.
    local_k : int or None
        k' of k-FED (None: n_clusters); the child/parent method uses it as the child k.
    weighted : bool
        Weight each local centre by its cluster size in the server k-means (k-FED is unweighted).
    shuffle : bool
        child-parent: permute each client's records (client generator) before the 25:75 split.
    local_n_init, server_n_init : int
        k-means restarts on the clients and on the server.
    secure_mode, server_max_iter, server_tol, oversample, init, init_bounds
        As in :class:`~securefkm.estimators.aligning.AligningFederatedKMeans`: the server
        k-means runs as rounds of secure sums over privately kept local centres.
    max_rounds : int or None
        Cap on training rounds (one-shot methods use one; None: one). With ``secure_mode=True``
        under a budget-led ``GaussianDP`` (record-level rounds, see
        :func:`~securefkm.estimators.aligning.record_level_dp`) None means the DP plan's rounds.
    clients_per_round, protection, dropout_rate, random_state, verbose, crypto, backend, n_workers, max_aborted_rounds, max_client_faults, record, transcript_path
    """

    def __init__(
        self,
        n_clusters=8,
        *,
        variant="kfed",
        local_k=None,
        weighted=False,
        shuffle=False,
        local_n_init=1,
        server_n_init=10,
        secure_mode=False,
        server_max_iter=300,
        server_tol=1e-6,
        oversample=4,
        init="auto",
        init_bounds=None,
        max_rounds=None,
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
        self.variant = variant
        self.local_k = local_k
        self.weighted = weighted
        self.shuffle = shuffle
        self.local_n_init = local_n_init
        self.server_n_init = server_n_init
        self.secure_mode = secure_mode
        self.server_max_iter = server_max_iter
        self.server_tol = server_tol
        self.oversample = oversample
        self.init = init
        self.init_bounds = init_bounds
        self.max_rounds = max_rounds
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

    def _max_rounds(self):
        return 1 if self.max_rounds is None else self.max_rounds

    def plans_dp_rounds(self) -> bool:
        return record_level_dp(self)

    def _plan_dp(self, data, layers, seed):
        return plan_record_level(self, data, layers, seed)

    def _make_algorithm(self, n_features, n_clients):
        if record_level_dp(self):
            return record_level_kmeans(self, n_features, f"{self.variant}-secure-dp")
        init = _secure_init(self, n_features) if self.secure_mode else "uniform"
        return OneShotFederatedKMeansAlgorithm(
            self.n_clusters,
            variant=self.variant,
            local_k=self.local_k,
            weighted=self.weighted,
            shuffle=self.shuffle,
            local_n_init=self.local_n_init,
            server_n_init=self.server_n_init,
            secure_mode=self.secure_mode,
            server_max_iter=self.server_max_iter,
            server_tol=self.server_tol,
            oversample=self.oversample,
            init=init,
            init_bounds=self._declared_bounds(n_features),
        )
