"""Secure mode for set-field algorithms: the server k-means over local centres as secure sums.

Garst & Reinders' FKM (Algorithm 1, line 10, eq. 1), k-FED (Dennis et al. 2021) and the
child/parent one-shot method all end a round with a *server-side* k-means over every
client's local centres ``C_l`` with weights ``S_l`` (the set-fields). The server then sees
each client's local centres in plain, which no secure aggregator can hide.

This module replaces that server k-means by Lloyd iterations whose every step is a sum over
clients, so that they run under secure aggregation (pairwise masking, Paillier):

* each client keeps its own local centres ``C_i`` and sizes ``S_i`` in its private
  ``memory`` (:func:`store_local_centres`), never sending them;
* the server broadcasts the current global centres ``G`` (action :data:`SECURE_ACTION`);
* each client assigns its *local centres* to ``G`` and returns, per global cluster j,

      weights_j          = sum_{c in C_i, a(c) = j} S_c
      weighted_centres_j = sum_{c in C_i, a(c) = j} S_c * c
      spread_j           = sum_{c in C_i, a(c) = j} S_c * ||c - G_j||^2

  (:func:`secure_client_update`); these are sum-fields;
* the server sets ``G_j <- sum_i weighted_centres_j / sum_i weights_j`` and keeps ``G_j``
  when the summed weight is zero (:func:`secure_server_step`); it stops when the Frobenius
  movement is below ``tol`` or after ``max_iter`` iterations.

This is exactly Lloyd's algorithm for Garst's weighted objective eq. 1,
``F = sum_j S_j min_i ||C_j - G_i||^2``, over the union of local centres: from the same
starting centres it yields the same iterates as the plain server k-means
(:func:`~securefkm.algorithms._kmeans.weighted_kmeans` with ``init=G``, ``n_init=1``) as long
as no global cluster becomes empty (scikit-learn relocates empty clusters, this mechanism
keeps them, because relocating to a far *local centre* would reveal it).

What changes compared with the plain form: the server no longer sees any client's local
centres, only their per-global-cluster sums (under secure aggregation: only the sum over
all clients). What it costs: the server k-means becomes ``max_iter`` rounds instead of one
local computation, and its starting centres must come from a protected source (declared
``init_bounds`` or given centres), so the plain form's k-means++ restarts over the local
centres (``n_init=10``) are not available: quality can be lower from a poor start (measured
in ``docs/algorithms/aligning-federated-kmeans.md``).

Field kinds (for DP layers): when the stored local centres are exact means of the records
assigned to them and the weights are those record counts (``exact_means=True``),
``weights`` is a per-record ``count`` and ``weighted_centres`` a per-record coordinate
``sum``; otherwise both are ``value`` and record-level DP refuses them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..exceptions import InputError
from ..messages import Broadcast, FieldSpec, Update
from ._kmeans import assign, segment_sums, uniform_in_bounds, weighted_kmeans
from .base import SeededState

#: broadcast action of one secure server-k-means iteration
SECURE_ACTION = "secure.kmeans"
#: key of the client's memory entry holding its local centres and weights
MEMORY_KEY = "secure_centres"


def store_local_centres(memory: dict | None, centres: np.ndarray, weights: np.ndarray, exact_means: bool) -> None:
    """Keep a client's local centres and weights (sizes, or ones for unweighted k-FED) private."""
    if memory is None:
        raise RuntimeError("secure mode needs the client's persistent memory (the runtime passes it)")
    memory[MEMORY_KEY] = {
        "centres": np.asarray(centres, dtype=np.float64).copy(),
        "weights": np.asarray(weights, dtype=np.float64).copy(),
        "exact_means": bool(exact_means),
    }


def secure_broadcast(centres: np.ndarray, *, exact_means: bool, iteration: int) -> Broadcast:
    """The server's request for one secure Lloyd iteration over the local centres.

    All clients are asked (``sample="all"``): the server k-means runs over the union of
    every client's local centres, as in the plain form.
    """
    return Broadcast(
        action=SECURE_ACTION,
        centres=np.asarray(centres, dtype=np.float64),
        params={"exact_means": bool(exact_means), "iteration": int(iteration)},
        sample="all",
    )


def secure_fields(k: int, d: int, *, exact_means: bool) -> tuple[FieldSpec, ...]:
    """Sum-field layout of one secure iteration (see the module docstring for the kinds)."""
    return (
        FieldSpec("weights", (k,), "count" if exact_means else "value", integer=exact_means),
        FieldSpec("weighted_centres", (k, d), "sum" if exact_means else "value",
                  weighted_by="weights" if exact_means else None),
        FieldSpec("spread", (k,), "value"),
    )


def secure_client_update(memory: dict | None, broadcast: Broadcast) -> Update:
    """A client's sums for one secure iteration: its *local centres* assigned to ``G``.

    Vectorised over the client's local centres (one distance product, one bincount per
    column). A client that holds no local centres (never sampled, or every cluster below
    the minimum size) contributes zeros.
    """
    G = broadcast.centres
    k, d = G.shape
    stored = (memory or {}).get(MEMORY_KEY)
    if stored is None or len(stored["centres"]) == 0:
        return Update(sums={"weights": np.zeros(k), "weighted_centres": np.zeros((k, d)), "spread": np.zeros(k)})
    C, w = stored["centres"], stored["weights"]
    labels, d2 = assign(C, G)
    sums, weights = segment_sums(labels, C, k, weights=w)
    spread = np.bincount(labels, weights=w * d2, minlength=k)
    return Update(sums={"weights": weights, "weighted_centres": sums, "spread": spread})


def secure_server_step(G: np.ndarray, sums: dict[str, np.ndarray]) -> tuple[np.ndarray, float]:
    """New global centres from the summed fields (Lloyd update for eq. 1) and the movement.

    A global cluster whose summed weight is zero keeps its centre (no relocation).
    """
    w = sums["weights"]
    new = np.array(G, dtype=np.float64, copy=True)
    nz = w > 0
    new[nz] = sums["weighted_centres"][nz] / w[nz, None]
    return new, float(np.linalg.norm(new - G))


def secure_objective(sums: dict[str, np.ndarray]) -> float:
    """Eq. 1 evaluated at the broadcast centres: sum_j S_j ||C_j - G_{a(j)}||^2."""
    return float(np.sum(sums["spread"]))


def check_secure_params(server_max_iter, server_tol, oversample):
    """Validated (server_max_iter, server_tol, oversample) of the secure server k-means,
    shared by every algorithm with a ``secure_mode``."""
    from ..validation import check_float, check_int

    return (
        check_int(server_max_iter, "server_max_iter", minimum=1),
        check_float(server_tol, "server_tol", minimum=0.0),
        check_int(oversample, "oversample", minimum=1),
    )


@dataclass(frozen=True)
class SecureKMeansRun:
    """Progress of one secure server k-means run (kept in the algorithm's state).

    Parameters
    ----------
    centres : ndarray of shape (m, n_features)
        The current global centres ``G`` (``m = oversample * k`` in the coarse stage).
    iteration : int
        Iterations done in the current stage.
    stage : {"coarse", "fine"}
        ``"coarse"``: Lloyd over the oversampled start, reduced to ``k`` centres when it
        ends; ``"fine"``: Lloyd over ``k`` centres, whose end is the run's result.
    exact_means : bool
        Whether the clients' stored local centres are exact means weighted by record counts
        (it decides the fields' kinds, see :func:`secure_fields`).
    objective : float or None
        Eq. 1 at the last broadcast centres (None before the first iteration).
    """

    centres: np.ndarray
    iteration: int = 0
    stage: str = "fine"
    exact_means: bool = False
    objective: float | None = None

    @property
    def result(self) -> np.ndarray | None:
        """The centres a run cut short may end with: the fine stage's, or None in the coarse stage."""
        return None if self.stage == "coarse" else self.centres


@dataclass
class SecureCentresState(SeededState):
    """State of an algorithm with a secure mode (the server k-means as secure sums).

    Parameters
    ----------
    secure_run : SecureKMeansRun or None
        The secure server k-means in progress (None outside the secure phase's first run).
    secure_total : int
        Secure iterations over the whole fit (the broadcasts' iteration counter).
    secure_start : ndarray or None
        The first secure run's protected start (None: a seeding round must provide it).
    secure_coarse : bool
        Whether ``secure_start`` is an oversampled start that a coarse stage reduces.
    """

    secure_run: SecureKMeansRun | None = None
    secure_total: int = 0
    secure_start: np.ndarray | None = None
    secure_coarse: bool = False


class SecureServerKMeans:
    """The server k-means over local centres, run as secure-sum rounds (a reusable phase).

    An algorithm embeds one of these and keeps its progress in a
    :class:`SecureCentresState`: :meth:`start` begins a run from given centres,
    :meth:`broadcast` / :meth:`fields` give the round's request and layout, :meth:`step`
    consumes the round's sums and returns the final global centres when the run has
    converged (else ``None``).

    Protected start with ``oversample > 1`` (used when the start is uniform in declared
    ``init_bounds``): the first stage runs Lloyd with ``oversample * k`` uniform centres;
    the server then reduces the non-empty aggregated centres -- sums over all clients, not
    any client's own centre -- to ``k`` with a weighted k-means++ / Lloyd of its own
    (weights = aggregated sizes), and a second stage refines those ``k`` centres with secure
    Lloyd. Plain uniform starts fall into poor local minima (measured in the docs); this
    start needs no client-derived value beyond the aggregates.
    """

    def __init__(self, n_clusters: int, *, max_iter: int = 300, tol: float = 1e-6, oversample: int = 1):
        self.n_clusters = n_clusters
        self.max_iter = max_iter
        self.tol = tol
        self.oversample = oversample

    def initial_centres(self, init, init_bounds, n_features: int, rng: np.random.Generator):
        """(centres, coarse) of the first run, or (None, False) if a seeding round must come first.

        ``init="uniform"`` draws ``oversample * k`` centres in ``init_bounds`` (a coarse stage);
        an array is used as given.
        """
        if isinstance(init, np.ndarray):
            return init.astype(np.float64, copy=True), False
        if init == "uniform":
            if init_bounds is None:
                raise InputError("init='uniform' needs init_bounds=(low, high), the declared data range.")
            m = self.n_clusters * self.oversample
            return uniform_in_bounds(init_bounds, m, n_features, rng), self.oversample > 1
        return None, False

    def start(self, G: np.ndarray, *, exact_means: bool, coarse: bool = False) -> SecureKMeansRun:
        """A new run from centres ``G`` (``coarse``: G is oversampled)."""
        return SecureKMeansRun(np.asarray(G, dtype=np.float64).copy(), stage="coarse" if coarse else "fine",
                               exact_means=bool(exact_means))

    def broadcast(self, run: SecureKMeansRun, total: int = 0) -> Broadcast:
        return secure_broadcast(run.centres, exact_means=run.exact_means, iteration=total)

    @staticmethod
    def fields(broadcast: Broadcast) -> tuple[FieldSpec, ...]:
        k, d = broadcast.centres.shape
        return secure_fields(k, d, exact_means=broadcast.params["exact_means"])

    def step(self, run: SecureKMeansRun, sums: dict[str, np.ndarray], rng: np.random.Generator):
        """Apply one iteration; returns (the run's new progress, final centres or None)."""
        G, movement = secure_server_step(run.centres, sums)
        run = replace(run, centres=G, iteration=run.iteration + 1, objective=secure_objective(sums))
        if movement >= self.tol and run.iteration < self.max_iter:
            return run, None
        if run.stage == "coarse":
            w = sums["weights"]
            nz = w > 0
            reduced = weighted_kmeans(G[nz], self.n_clusters, rng, weights=w[nz])
            return replace(run, centres=reduced, iteration=0, stage="fine"), None
        return run, G
