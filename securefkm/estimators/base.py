"""scikit-learn style estimators over the federation runtime.

Every estimator stores its constructor parameters unchanged (scikit-learn convention) and
validates them in :meth:`fit`. ``fit`` takes

* a :class:`~securefkm.datasets.FederatedDataset` or a list of per-client arrays (numpy arrays,
  nested lists or pandas DataFrames): ``labels_`` follow the pooled order (client 0's records
  first);
* a pooled 2-D array ``X`` with ``groups`` = the client of each record, as scikit-learn passes
  per-sample group labels (so ``GroupKFold`` and metadata routing work): ``labels_`` follow
  the order of ``X``;
* a pooled 2-D array without ``groups``: ONE client (a single data holder). This is the only
  reading that invents nothing -- any split into clients would fabricate a federation whose
  result depends on an arbitrary partition -- and it is what scikit-learn's tools pass
  (Pipeline, GridSearchCV without groups, ``check_estimator``). With one client the
  federated algorithms reduce to their central form; protection layers that need several
  clients (secure aggregation) refuse it with their own message.

The rounds run in process (the simulation transport); ``labels_`` and ``inertia_`` are what
in a deployment each client would compute for itself. ``protection`` takes layer objects or
the CLI's text specs (``"masking"``, ``["dp:epsilon=1,delta=1e-5,clip=2", "masking"]``).

The data domain is declared once: ``init_bounds=(low, high)`` on the estimator or
``GaussianDP(bounds=(low, high))``; either serves both the DP sensitivity and the
data-independent start, and two declarations that disagree are refused.

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
(:mod:`securefkm.federation.workers`, docs/scaling.md). The default, ``backend="auto"``,
runs them in worker processes when their public-key cryptography would otherwise hold the
fit to one core (real ``PairwiseMasking`` or ``Paillier``, at least 100 clients a round,
two CPUs or more: :func:`~securefkm.federation.workers.auto_backend`) and in process
otherwise; ``backend_`` says which it was.

``max_aborted_rounds`` (every estimator; default
:data:`~securefkm.federation.runtime.MAX_ABORTED_ROUNDS` = 10): aborted round attempts
tolerated per run before the fit raises ``TooManyAbortedRoundsError``.
``max_client_faults`` (every estimator; default
:data:`~securefkm.federation.runtime.MAX_CLIENT_FAULTS` = 2, ``None`` never excludes):
faults attributed to a client (a malformed, replayed or wrong message) after which it is
excluded from the rest of the fit; ``client_faults_`` and ``excluded_clients_`` report them
(docs/aborted-rounds.md).

``record`` (every estimator) is what ``transcript_`` keeps (:mod:`securefkm.transcript`):
``"full"`` every message each client sent, what the passive attacks read;
``"aggregates"`` per round only whom the server sampled, who dropped or refused, and the
aggregate it decoded (the aggregate-differencing attack still runs on it); ``"none"`` only
the aborted rounds. A full transcript grows by every sampled client's update each round:
at 10,000 clients of a DWF fit with 50 clusters of 32 features that is 132 MB a round, held
for as long as the estimator lives. The default, ``None``, records in full and warns when
the fit starts if the transcript could exceed :data:`TRANSCRIPT_WARN_BYTES`, naming
``record="aggregates"``; ``record="full"`` records in full without the warning
(docs/scaling.md, "Memory of a fit").

``transcript_path`` (every estimator; default None, in memory): a new file the fit writes its
transcript to round by round, keeping only an index in memory (:mod:`securefkm.transcript_file`;
``transcript_`` reads it lazily, :func:`~securefkm.transcript_file.open_transcript` later).
An existing file is refused, never overwritten: give each fit its own path.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin
from sklearn.utils import metadata_routing
from sklearn.utils.validation import check_is_fitted, validate_data

from ..validation import check_array, check_bounds, check_centres, check_int, check_random_state
from ..algorithms import _seeding
from ..algorithms._kmeans import assign, sq_distances
from ..datasets import ClientPopulation, FederatedDataset, as_federated
from ..datasets.federated import _ndim, from_groups
from ..domain import Ball
from ..exceptions import InputError, ProtectionConfigError
from ..federation import Federation, clone_layers
from ..federation.runtime import MAX_ABORTED_ROUNDS, MAX_CLIENT_FAULTS
from ..protection_report import ProtectionReport
from ..registry import make_protection

#: a fit whose full transcript could hold more than this many bytes of client updates warns
#: at its start (``record``)
TRANSCRIPT_WARN_BYTES = 1 << 30


def resolve_protection(protection) -> list:
    """The layer objects of an estimator's ``protection`` (objects, text specs, dicts or None)."""
    return make_protection(protection)


def resolve_domain(init_bounds, protection, n_features: int | None = None):
    """The one declared data domain: ``init_bounds`` or a GaussianDP layer's ``bounds``, else
    its ball (``clip`` about ``centre``, a :class:`securefkm.domain.Ball`).

    Either declaration serves both uses (DP sensitivity over the box, data-independent
    start inside it); two boxes that disagree raise :class:`InputError` naming both. With a
    ball, ``init_bounds`` (when given) is the start's box and the ball the sensitivity's.
    """
    from ..domain import check_centre

    own = check_bounds(init_bounds, "init_bounds", n_features)
    for layer in resolve_protection(protection):
        dp = layer.declared_domain() if hasattr(layer, "declared_domain") else None
        if dp is None or (isinstance(dp, Ball) and own is not None):
            continue
        if isinstance(dp, Ball):
            check_centre(dp.centre, "GaussianDP centre", n_features)
            return dp
        if own is None:
            return dp[0].tolist(), dp[1].tolist()
        d = 1 if n_features is None else n_features
        if not all(np.array_equal(np.broadcast_to(a, (d,)), np.broadcast_to(b, (d,))) for a, b in zip(own, dp)):
            raise InputError(
                f"init_bounds={init_bounds!r} and GaussianDP(bounds=({dp[0]}, {dp[1]})) declare different "
                "data domains; declare the domain once (drop init_bounds: GaussianDP's bounds also serve "
                "the start) or make the two equal."
            )
    return None if own is None else init_bounds



def check_enough_clients(layers, n_clients: int, n_features: int, clients_per_round=None) -> None:
    """Refuse, before any round, a stack whose aggregator cannot complete a round with these
    clients (:meth:`securefkm.layers.Aggregator.fewest_clients`): e.g. secure aggregation of
    one client, whose "sum" would be its own input. The error gives the fixes."""
    from ..layers import RunInfo
    from ..validation import check_fraction_or_count

    aggregator = next((layer for layer in layers if getattr(layer, "side", None) == "aggregator"), None)
    fewest = getattr(aggregator, "fewest_clients", None)
    if fewest is None:
        return
    per_round = check_fraction_or_count(1.0 if clients_per_round is None else clients_per_round,
                                        "clients_per_round", n_clients)
    info = RunInfo(algorithm=None, n_clients=int(n_clients), n_features=int(n_features),
                   clients_per_round=per_round, max_rounds=1, planned_rounds=1)
    need = int(fewest(info))
    if per_round >= need:
        return
    have = (f"{n_clients} client{'s' if n_clients != 1 else ''}" if per_round == n_clients
            else f"clients_per_round={per_round} of {n_clients} clients")
    why = (f"{aggregator.name} needs at least {need} clients in every round (a secure sum of fewer would "
           f"expose a client's input or cannot complete), and this fit has {have}. ")
    raise InputError(
        why + "Fix: a pooled array is ONE client unless you pass groups=<client of each record> to fit; "
        "or give more clients" + (" (or raise clients_per_round)" if per_round < n_clients else "")
        + "; or use a protection without secure aggregation, e.g. GaussianDP(mode='central').",
        cli=why + "Fix: put one CSV per client in the directory (at least " + str(need) + " files)"
        + (", raise clients_per_round" if per_round < n_clients else "")
        + ", or choose a --protection without masking or paillier (e.g. dp:...:mode=central).",
    )

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
    protected = bool(resolve_protection(protection))
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

    def _check_data(self, data) -> None:
        """Algorithm-specific refusals of a dataset (before any round runs)."""

    def _select_run(self, states):
        """Index of the run to keep (DWF picks the lowest federated score)."""
        scores = [s.score if s.score is not None else np.inf for s in states]
        return int(np.argmin(scores))

    # ------------------------------------------------------------------ fit
    # server_policy / transport are runtime hooks, not per-sample metadata: keep them out of
    # scikit-learn's metadata routing (set_fit_request offers ``groups`` only)
    __metadata_request__fit = {"server_policy": metadata_routing.UNUSED, "transport": metadata_routing.UNUSED,
                               "client_policies": metadata_routing.UNUSED}

    def fit(self, X, y=None, groups=None, *, server_policy=None, transport=None, client_policies=None):
        """Run the federation on ``X``; ``y`` is ignored (scikit-learn convention).

        ``X``: a FederatedDataset, a list of per-client arrays, a pooled 2-D array with
        ``groups`` (client label per record; without it the pooled array is one client, see
        the module docstring), or a :class:`~securefkm.datasets.ClientPopulation`, streamed
        round by round (its records are never pooled, so ``labels_`` and ``inertia_`` stay
        unset). ``server_policy`` replaces the honest server's choice of
        participants and broadcasts (used by the active attacks in ``attacks``); ``transport``
        replaces the in-process simulation (used by the Flower deployment, where ``X`` then
        only needs to describe the clients' number of features, e.g. ``[np.empty((1, d))] * n``).
        ``client_policies`` (``{client id: ClientPolicy}``, simulation only) makes those
        clients malicious: each policy rewrites what its client sends
        (:mod:`securefkm.federation.client_policy`; docs/trust-model.md).
        """
        data, pooled = self._fit_input(X, groups)
        federation, algorithm = self.make_federation(data, server_policy=server_policy, transport=transport,
                                                     client_policies=client_policies)
        finished = False
        try:
            states = [federation.run(r) for r in range(self._n_runs())]
            finished = True
        finally:  # workers (backend="processes"/"ray") are shut down on every exit path, Ctrl-C
            # included; after a fit that ended normally, worker processes are kept for the next
            federation.close(keep_workers=finished)
        best = states[self._select_run(states)] if len(states) > 1 else states[0]
        self._set_fitted(data, algorithm, federation, best, pooled=pooled)
        self.backend_ = federation.backend  # where the clients ran ("auto" resolved)
        return self

    def _fit_input(self, X, groups):
        """(FederatedDataset, pooled records in the order labels_ follow); records feature names."""
        # a list of plain rows ([[1.0, 2.0], ...], as X.tolist()) is one pooled array; a list of
        # numpy 1-D arrays stays a (mistaken) list of clients and is refused by as_federated
        rows = isinstance(X, (list, tuple)) and len(X) > 0 and all(
            isinstance(c, (list, tuple)) and _ndim(c) == 1 for c in X
        )
        if isinstance(X, ClientPopulation):  # streamed, never pooled: labels_ and inertia_ stay unset
            if groups is not None:
                raise InputError("groups is given but X is a ClientPopulation, whose clients are already known; "
                                 "drop groups.")
            self._set_feature_names(None)
            return X, None
        if isinstance(X, FederatedDataset) and groups is not None:
            raise InputError("groups is given but X is a FederatedDataset, whose clients are already known; drop groups.")
        if isinstance(X, (list, tuple, FederatedDataset)) and groups is None and not rows:
            data = as_federated(X)
            first = X[0] if isinstance(X, (list, tuple)) else None
            self._set_feature_names(getattr(first, "columns", None))
            return data, data.pooled()
        validate_data(self, check_array(X, "X"), reset=True, skip_check_array=True)  # n_features_in_
        self._set_feature_names(getattr(X, "columns", None))
        if groups is None:
            arr = check_array(X, "X")
            return as_federated(arr, allow_pooled=True), arr
        return from_groups(X, groups)

    def _set_feature_names(self, columns):
        names = None if columns is None else list(columns)
        if names and all(isinstance(c, str) for c in names):
            self.feature_names_in_ = np.asarray(names, dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_

    def _declared_bounds(self, n_features: int | None = None):
        """``init_bounds`` after reconciling it with a GaussianDP ``bounds`` (one domain)."""
        return resolve_domain(getattr(self, "init_bounds", None), self._protection_layers(), n_features)

    def declared_domain(self, n_features: int | None = None):
        """The records' declared box ``(low, high)`` of this estimator's fits (``init_bounds``
        reconciled with the layers' own declarations), or None; for callers that build a
        federation of their own from ``protection`` (the active attacks), to declare it on
        their copies of the layers as a fit does."""
        return self._declared_bounds(n_features)

    def _protection_layers(self) -> list:
        """The layers of ``protection``: while a fit is prepared, the fit's own copies (built
        once per fit, :meth:`_prepare`); otherwise built from ``protection``."""
        layers = self.__dict__.get("_fit_layers")
        return layers if layers is not None else resolve_protection(self.protection)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False  # refused with a message: the updates are dense sums
        return tags

    def make_federation(self, X, *, server_policy=None, transport=None, max_rounds=None, client_policies=None):
        """The validated (Federation, Algorithm) pair ``fit`` would run, without running it.

        For callers that drive rounds themselves (active attacks: a malicious server keeps
        going after the honest algorithm would have converged). ``max_rounds`` overrides
        the estimator's. The transcript's ``meta`` records the declared ``init_bounds``:
        the data range the server is told.
        """
        # a ClientPopulation is planned from its declared facts and streamed, never pooled
        data = X if isinstance(X, ClientPopulation) else as_federated(X)
        n_clusters = check_int(self.n_clusters, "n_clusters", minimum=1)
        if n_clusters > data.n_samples:
            raise InputError(
                f"n_clusters={n_clusters} is larger than the number of records (n_samples={data.n_samples}); "
                "lower n_clusters."
            )
        self._check_data(data)
        layers, seed, domain, algorithm, planned = self._prepare(data, plan=max_rounds is None)
        if max_rounds is None:
            max_rounds = planned
        verbose = check_int(self.verbose, "verbose", minimum=0)
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
            backend=getattr(self, "backend", "auto"),
            n_workers=getattr(self, "n_workers", None),
            max_aborted_rounds=getattr(self, "max_aborted_rounds", MAX_ABORTED_ROUNDS),
            max_client_faults=getattr(self, "max_client_faults", MAX_CLIENT_FAULTS),
            client_policies=client_policies,
            record=self._record(),
            transcript_path=getattr(self, "transcript_path", None),
            **self._transport_kwargs(transport, data),
        )
        # plain values (a transcript is saved in checkpoints): a ball is told as its bounding box
        # and, with its centre and radius, as the declared ball
        federation.transcript.meta["init_bounds"] = tuple(domain) if isinstance(domain, Ball) else domain
        if isinstance(domain, Ball):
            federation.transcript.meta["domain_ball"] = {"centre": domain.centre.tolist(), "radius": domain.radius}
        self._warn_large_transcript(federation, algorithm, data.n_features)
        return federation, algorithm

    def _prepare(self, data, plan: bool = True):
        """``(layers, seed, domain, algorithm, max_rounds)`` of a fit on ``data``: the fit's own
        copies of the layers (the declared domain handed to them, the DP plan applied), the
        seed of its federation, the algorithm and the rounds (the DP plan's, else the
        estimator's). ``data`` needs only its public facts (``n_samples``, ``n_features``,
        ``n_clients``): a deployment plans from declared ones
        (:func:`securefkm.flower.spec.build_federation`), exactly as a fit does. ``plan=False``:
        no DP plan (the caller fixes the rounds)."""
        from protocols.dp import check_seeded_noise

        layers = clone_layers(self.protection)  # the fit's own layers, built once
        self.__dict__["_fit_layers"] = layers  # what _protection_layers() reads until the fit is set up
        try:
            domain = self._declared_bounds(data.n_features)  # refuses two disagreeing declarations
            check_seeded_noise(layers, self.random_state)  # seeded DP noise needs a seed
            rng = check_random_state(self.random_state)
            seed = int(rng.integers(2**63 - 1))
            for layer in layers:  # a GaussianDP without clip/bounds takes the estimator's init_bounds
                if hasattr(layer, "declare_domain"):
                    layer.declare_domain(domain)  # refuses a fit with no domain declared anywhere
            check_enough_clients(layers, data.n_clients, data.n_features, self.clients_per_round)
            self.dp_plan_ = self._plan_dp(data, layers, seed) if plan else None
            algorithm = self._make_algorithm(data.n_features, data.n_clients)
        finally:
            self.__dict__.pop("_fit_layers", None)
        rounds = self.dp_plan_.rounds if self.dp_plan_ is not None else self._max_rounds()
        return layers, seed, domain, algorithm, rounds

    def _record(self) -> str:
        """The transcript level Federation records at (it validates it): the default None
        records in full, with a warning when that could be large."""
        record = getattr(self, "record", None)
        return "full" if record is None else record

    def _warn_large_transcript(self, federation, algorithm, n_features: int) -> None:
        """Under the default ``record=None``, warn when the full transcript could outgrow
        :data:`TRANSCRIPT_WARN_BYTES`: every planned round's sampled clients each send about
        ``n_clusters x (n_features + 1)`` float64 values (the sum-fields of the k-means
        algorithms; masked or encrypted forms are no smaller)."""
        if getattr(self, "record", None) is not None or getattr(self, "transcript_path", None) is not None:
            return  # the level was asked for, or the transcript goes to disk
        rounds = federation.n_runs * algorithm.planned_rounds(federation.max_rounds)
        per_round = federation.clients_per_round * self.n_clusters * (n_features + 1) * 8
        if rounds * per_round > TRANSCRIPT_WARN_BYTES:
            warnings.warn(
                f"the transcript of this fit keeps every client message: up to about "
                f"{rounds * per_round / 2**30:.1f} GiB over {rounds} planned rounds "
                f"({per_round / 2**20:.1f} MiB a round), held by transcript_. Pass record=\"aggregates\" "
                "to keep only each round's aggregate, transcript_path=\"<new file>\" to write them to disk "
                "instead of memory, or record=\"full\" to keep them without this warning "
                "(the passive attacks read them).",
                stacklevel=4,
            )

    def _max_rounds(self) -> int:
        return self.max_rounds

    def _plan_dp(self, data, layers, seed):
        """The DP default plan (:mod:`protocols.dp.planning`) this estimator runs, or None."""
        return None

    def plans_dp_rounds(self) -> bool:
        """Whether, with ``max_rounds`` unset and a budget-led ``GaussianDP`` layer, this
        estimator (with its current options) picks its rounds for the budget."""
        return False

    @staticmethod
    def _transport_kwargs(transport, data):
        if transport is None:
            return {}
        return {"transport": transport, "n_features": data.n_features}

    def _set_fitted(self, data, algorithm, federation, state, pooled=None):
        self.cluster_centers_ = np.asarray(state.centres, dtype=np.float64)
        self.n_features_in_ = data.n_features
        self.n_iter_ = int(state.round)
        if isinstance(data, ClientPopulation):  # its records are made client by client, never pooled
            for name in ("labels_", "inertia_"):
                self.__dict__.pop(name, None)
        else:
            pooled = data.pooled() if pooled is None else pooled
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
        #: faults attributed to each client over the fit (client -> count) and the clients
        #: excluded for them (client -> the last fault's reason); also in transcript_.summary()
        self.client_faults_ = dict(sorted(federation.strikes.items()))
        self.excluded_clients_ = dict(federation.excluded)

    # -------------------------------------------------------------- predict
    def _check_X(self, X):
        check_is_fitted(self, "cluster_centers_")
        arr = check_array(X, "X")
        try:  # feature-count and feature-name consistency with fit, in scikit-learn's words
            validate_data(self, X if hasattr(X, "columns") else arr, reset=False, skip_check_array=True)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        return arr

    def predict(self, X):
        """Index of the nearest centre for each record of X (a 2-D array)."""
        return assign(self._check_X(X), self.cluster_centers_)[0]

    def fit_predict(self, X, y=None, groups=None):
        """Fit (as :meth:`fit`) and return ``labels_`` (the order of ``X``, or pooled client order)."""
        return self.fit(X, groups=groups).labels_

    def transform(self, X):
        """Euclidean distance of each record to each centre."""
        return np.sqrt(sq_distances(self._check_X(X), self.cluster_centers_))

    def score(self, X, y=None, sample_weight=None):
        """Opposite of the (weighted) inertia of X, as ``KMeans.score`` (higher is better)."""
        d2 = assign(self._check_X(X), self.cluster_centers_)[1]
        if sample_weight is None:
            return -float(d2.sum())
        w = np.asarray(sample_weight, dtype=np.float64)
        if w.shape != d2.shape or not np.all(np.isfinite(w)) or np.any(w < 0):
            raise InputError(f"sample_weight must be {len(d2)} finite non-negative numbers, one per row of X.")
        return -float(w @ d2)
