"""Estimator for mini-batch federated k-means (Triebe & Rajagopal 2019)."""

from __future__ import annotations

from ..algorithms.minibatch import MiniBatchFederatedKMeansAlgorithm
from ..federation.runtime import MAX_ABORTED_ROUNDS, MAX_CLIENT_FAULTS
from .base import FederatedClusterer, resolve_init

DEFAULT_MAX_ROUNDS = 200


class MiniBatchFederatedKMeans(FederatedClusterer):
    """Federated (mini-batch) k-means of Triebe & Rajagopal (2019), Algorithms 1 and 2.

    Every round a fraction C of the clients runs ``ClientKMeans`` (E epochs of mini-batch
    k-means with client rate beta) from the global centres and returns its cluster sizes and
    size-weighted centres as sum-fields; the server moves the centres towards their
    size-weighted mean with server rate alpha. Runs under secure aggregation.

    Parameters
    ----------
    n_clusters : int
    clients_per_round : int or float
        The paper's C: a client count or a fraction of all clients (m = max(C M, 1)).
    local_epochs : int
        E, local epochs per round.
    batch_size : int or None
        B, the local mini-batch size; None is the paper's B = infinity (full batch).
    server_rate : float
        alpha in (0, 1].
    client_rate : float
        beta in (0, 1].
    max_rounds : int or None
        T, the number of global rounds. None (default): 200 without DP; with a
        ``GaussianDP`` layer that leaves its per-round noise to the budget, the DP plan
        (``dp_plan_``). With E = 1, B = None, beta = alpha = 1 (the defaults: each round is a
        distributed Lloyd round), ``init="auto"`` and every client in every round, that is
        DWF's full plan (:func:`securefkm.estimators._dp_planning.plan_for_estimator`: its start,
        rounds, radius, final-round weight and step shrinkage); otherwise the rounds the DP rule
        picks for that budget (:func:`securefkm.estimators._dp_planning.rounds_plan_for_estimator`).
        Pass a number to opt out.
    tol : float
        Stop early when the centres move less than tol and no cluster is on a small-size streak.
    reassign : bool
        Reassign a cluster smaller than ``reassign_fraction`` of the round's records for
        ``reassign_patience`` consecutive rounds (paper: 1 % and 20 rounds) to a uniform point
        in ``init_bounds`` (or in the box of the current centres).
    reassign_fraction : float
    reassign_patience : int
    init : "auto", "random", "k-means++", "kfed", "uniform" or array (n_clusters, n_features)
        "auto" is "random" without protection (the paper initialises randomly: one random
        client sends k of its records) and "uniform" in ``init_bounds`` under protection.
    init_bounds : (low, high) or None
    protection : list of layers
    dropout_rate : float or dict
    random_state, verbose, crypto, backend, n_workers, max_aborted_rounds, max_client_faults, record, transcript_path
        ``crypto="ideal"`` swaps the secure aggregator for its ideal functionality (same release;
        studies only, see docs/protocols/ideal-functionality.md).
    """

    def __init__(
        self,
        n_clusters=8,
        *,
        clients_per_round=1.0,
        local_epochs=1,
        batch_size=None,
        server_rate=1.0,
        client_rate=1.0,
        max_rounds=None,
        tol=1e-6,
        reassign=True,
        reassign_fraction=0.01,
        reassign_patience=20,
        init="auto",
        init_bounds=None,
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
        self.clients_per_round = clients_per_round
        self.local_epochs = local_epochs
        self.batch_size = batch_size
        self.server_rate = server_rate
        self.client_rate = client_rate
        self.max_rounds = max_rounds
        self.tol = tol
        self.reassign = reassign
        self.reassign_fraction = reassign_fraction
        self.reassign_patience = reassign_patience
        self.init = init
        self.init_bounds = init_bounds
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
        return DEFAULT_MAX_ROUNDS if self.max_rounds is None else self.max_rounds

    def plans_dp_rounds(self) -> bool:
        return True

    def _exact_lloyd(self) -> bool:
        """E = 1, B = None (full batch), beta = 1 and alpha = 1: each round is a distributed
        Lloyd round, the same release as DWF's."""
        return (self.local_epochs == 1 and self.batch_size is None and self.client_rate == 1.0
                and self.server_rate == 1.0)

    def _plan_dp(self, data, layers, seed):
        from ._dp_planning import _client_fraction, plan_for_estimator, rounds_plan_for_estimator

        # with the paper's B = infinity, E = 1 and unit rates every round is a Lloyd round of
        # counts and sums: DWF's full plan applies when every round sums all records (its noise
        # level reads n); otherwise (mini-batches, sampled clients, other rates) the rounds-only
        # plan, whose noise level reads the records a round is expected to sum
        full = self._exact_lloyd() and _client_fraction(self, data) == 1.0 and plan_for_estimator(
            self, data, layers, seed, exact_lloyd=True)
        return full or rounds_plan_for_estimator(self, data, layers, spread_seed=seed)

    def _make_algorithm(self, n_features, n_clients):
        init = resolve_init(
            self.init, self._protection_layers(), self._declared_bounds(n_features), n_clusters=self.n_clusters, n_features=n_features,
            default_plain="random", default_protected="private",
        )
        plan = getattr(self, "dp_plan_", None)
        if plan is not None and plan.private_start:  # the DP plan's private seeding round
            init = "private"
        elif plan is not None and plan.start is not None:  # the DP plan's data-independent start
            init = plan.start
        return MiniBatchFederatedKMeansAlgorithm(
            self.n_clusters,
            local_epochs=self.local_epochs,
            batch_size=self.batch_size,
            server_rate=self.server_rate,
            client_rate=self.client_rate,
            tol=self.tol,
            reassign=self.reassign,
            reassign_fraction=self.reassign_fraction,
            reassign_patience=self.reassign_patience,
            init=init,
            init_bounds=self._declared_bounds(n_features),
        )
