"""scikit-learn style estimators over the federation runtime.

Every estimator stores its constructor parameters unchanged (scikit-learn convention) and
validates them in :meth:`fit`. ``fit`` takes a :class:`~securefkm.datasets.FederatedDataset`
or a list of per-client arrays and runs the rounds in process (the simulation transport);
``labels_`` and ``inertia_`` are then computed for the pooled order of the records (client
0's records first), which in a deployment each client would compute for itself.

``crypto="real"`` (default) runs the secure aggregators' cryptography; ``crypto="ideal"``
replaces each by its ideal functionality, which releases exactly the same sums with the same
aborts at a fraction of the cost (:mod:`protocols.masking.ideal`; utility and leakage
studies, never deployments: docs/protocols/ideal-functionality.md).

Fitted attributes: ``cluster_centers_``, ``labels_``, ``inertia_``, ``n_iter_`` (training
rounds of the chosen run), ``transcript_`` (what the server saw), ``protection_report_``
(per layer, in words, what the server saw and whom the guarantee trusts; ``.summary()``) and
``privacy_spent_`` = (epsilon, delta) under differential privacy, ``None`` without it,
``n_aborted_rounds_`` (round attempts that aborted and were retried, over all runs; the
transcript's ``aborts`` lists each with its cause; docs/aborted-rounds.md).

``backend="processes"|"ray"`` with ``n_workers`` runs the simulated clients on a pool of
worker processes or Ray actors instead of in process, with identical results
(:mod:`securefkm.federation.workers`, docs/scaling.md).

``max_aborted_rounds`` (every estimator; default
:data:`~securefkm.federation.runtime.MAX_ABORTED_ROUNDS` = 10): aborted round attempts
tolerated per run before the fit raises ``TooManyAbortedRoundsError``.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from .._validation import check_array, check_centres, check_int, check_random_state
from ..algorithms import _seeding
from ..algorithms._kmeans import assign, sq_distances
from ..datasets import as_federated
from ..exceptions import InputError, ProtectionConfigError
from ..federation import Federation, clone_layers
from ..federation.runtime import MAX_ABORTED_ROUNDS
from ..protection_report import ProtectionReport


class UnprotectedInitWarning(UserWarning):
    """An init that sends client data in plain was chosen explicitly under protection."""


def resolve_init(
    init, protection, init_bounds, *, n_clusters, n_features, default_plain="k-means++", default_protected="uniform"
):
    """Pick the seeding method, refusing plain-data seeding under protection by default.

    An array ``init`` is checked to be (n_clusters, n_features) and finite.

    ``init="auto"`` means ``default_plain`` without protection and a protected seeding
    with protection: ``default_protected`` over the declared ``init_bounds`` -- "private"
    (a seeding round of per-bucket sums through the same layers and budget) for the
    algorithms that support it, else "uniform" (data-independent). An explicit plain init
    under protection is honoured with a warning: the user asked for it.
    """
    protected = bool(protection)
    if isinstance(init, str) and init == "auto":
        if not protected:
            return default_plain
        if init_bounds is None:
            why = ("under protection the first centres must not come from a client's raw records "
                   "(k-means++ / random / k-FED seeding send exactly that). ")
            raise ProtectionConfigError(
                why + "Pass init_bounds=(low, high) for a data-independent (or, with DP, private) start, "
                "pass init=<array of centres>, or pass init='k-means++' explicitly to accept that leak.",
                cli=why + "Pass --param init_bounds=[low,high] (the public range of every feature) for a "
                "data-independent (or, with DP, private) start, or --param init=k-means++ to accept that leak.",
            )
        return default_protected
    if isinstance(init, str):
        if init not in _seeding.INIT_CHOICES:
            raise InputError(f"init must be 'auto', one of {_seeding.INIT_CHOICES} or an array, got {init!r}.")
        if protected and init in _seeding.PLAIN_INITS:
            warnings.warn(
                f"init={init!r} sends client-derived centres to the server in plain, outside the "
                "protection stack; use init_bounds (init='uniform') for a protected start.",
                UnprotectedInitWarning,
                stacklevel=3,
            )
        return init
    return check_centres(init, n_clusters, n_features)


class FederatedClusterer(ClusterMixin, TransformerMixin, BaseEstimator):
    """Shared machinery: fit through a Federation, then the scikit-learn surface."""

    #: parameters that every estimator has (subclasses add their algorithm's own)
    def _make_algorithm(self, n_features: int, n_clients: int):  # pragma: no cover - abstract
        raise NotImplementedError

    def _n_runs(self) -> int:
        return 1

    def _select_run(self, states):
        """Index of the run to keep (DWF picks the lowest federated score)."""
        scores = [s.score if s.score is not None else np.inf for s in states]
        return int(np.argmin(scores))

    # ------------------------------------------------------------------ fit
    def fit(self, X, y=None, *, server_policy=None, transport=None):
        """Run the federation on ``X`` (a FederatedDataset or a list of per-client arrays).

        ``server_policy`` replaces the honest server's choice of participants and
        broadcasts (used by the active attacks in ``attacks``); ``transport`` replaces the
        in-process simulation (used by the Flower deployment, where ``X`` then only needs
        to describe the clients' number of features, e.g. ``[np.empty((1, d))] * n``).
        """
        data = as_federated(X)
        federation, algorithm = self.make_federation(data, server_policy=server_policy, transport=transport)
        try:
            states = [federation.run(r) for r in range(self._n_runs())]
        finally:  # workers (backend="processes"/"ray") are shut down on every exit path, Ctrl-C included
            federation.close()
        best = states[self._select_run(states)] if len(states) > 1 else states[0]
        self._set_fitted(data, algorithm, federation, best)
        return self

    def make_federation(self, X, *, server_policy=None, transport=None, max_rounds=None):
        """The validated (Federation, Algorithm) pair ``fit`` would run, without running it.

        For callers that drive rounds themselves (active attacks: a malicious server keeps
        going after the honest algorithm would have converged). ``max_rounds`` overrides
        the estimator's. The transcript's ``meta`` records the declared ``init_bounds``:
        the data range the server is told.
        """
        data = as_federated(X)
        n_clusters = check_int(self.n_clusters, "n_clusters", minimum=1)
        if n_clusters > data.n_samples:
            raise InputError(
                f"n_clusters={n_clusters} is larger than the number of records ({data.n_samples}); "
                "lower n_clusters."
            )
        from protocols.dp import check_seeded_noise

        check_seeded_noise(self.protection, self.random_state)  # seeded DP noise needs a seed
        rng = check_random_state(self.random_state)
        seed = int(rng.integers(2**63 - 1))
        verbose = check_int(self.verbose, "verbose", minimum=0)
        layers = clone_layers(self.protection)
        self.dp_plan_ = self._plan_dp(data, layers, seed) if max_rounds is None else None
        algorithm = self._make_algorithm(data.n_features, data.n_clients)
        if max_rounds is None:
            max_rounds = self.dp_plan_.rounds if self.dp_plan_ is not None else self._max_rounds()
        federation = Federation(
            algorithm,
            data.clients,
            protection=layers,
            clients_per_round=self.clients_per_round,
            dropout_rate=self.dropout_rate,
            max_rounds=max_rounds,
            n_runs=self._n_runs(),
            random_state=seed,
            verbose=verbose,
            server_policy=server_policy,
            crypto=getattr(self, "crypto", "real"),
            backend=getattr(self, "backend", "local"),
            n_workers=getattr(self, "n_workers", None),
            max_aborted_rounds=getattr(self, "max_aborted_rounds", MAX_ABORTED_ROUNDS),
            **self._transport_kwargs(transport, data),
        )
        federation.transcript.meta["init_bounds"] = getattr(self, "init_bounds", None)
        return federation, algorithm

    def _max_rounds(self) -> int:
        return self.max_rounds

    def _plan_dp(self, data, layers, seed):
        """The DP default plan (:mod:`protocols.dp.planning`) this estimator runs, or None."""
        return None

    @staticmethod
    def _transport_kwargs(transport, data):
        if transport is None:
            return {}
        return {"transport": transport, "n_features": data.n_features}

    def _set_fitted(self, data, algorithm, federation, state):
        self.cluster_centers_ = np.asarray(state.centres, dtype=np.float64)
        self.n_features_in_ = data.n_features
        self.n_iter_ = int(state.round)
        pooled = data.pooled()
        labels, d2 = assign(pooled, self.cluster_centers_)
        self.labels_ = labels
        self.inertia_ = float(d2.sum())
        self.federated_score_ = state.score
        self.transcript_ = federation.transcript
        self.algorithm_ = algorithm
        self.protection_report_ = ProtectionReport.from_federation(federation)
        #: (epsilon, delta) under differential privacy; None when no layer gives a guarantee
        self.privacy_spent_ = federation.privacy_spent()
        self.n_aborted_rounds_ = federation.n_aborted_rounds

    # -------------------------------------------------------------- predict
    def _check_X(self, X):
        check_is_fitted(self, "cluster_centers_")
        X = check_array(X, "X")
        if X.shape[1] != self.n_features_in_:
            raise InputError(f"X has {X.shape[1]} features, the model was fitted on {self.n_features_in_}.")
        return X

    def predict(self, X):
        """Index of the nearest centre for each record of X (a 2-D array)."""
        return assign(self._check_X(X), self.cluster_centers_)[0]

    def fit_predict(self, X, y=None):
        """Fit on a federation and return ``labels_`` (pooled order)."""
        return self.fit(X).labels_

    def transform(self, X):
        """Euclidean distance of each record to each centre."""
        return np.sqrt(sq_distances(self._check_X(X), self.cluster_centers_))

    def score(self, X, y=None):
        """Opposite of the inertia of X (scikit-learn convention: higher is better)."""
        return -float(assign(self._check_X(X), self.cluster_centers_)[1].sum())
