"""Mini-batch federated k-means (Triebe & Rajagopal 2019, Algorithms 1 and 2).

Server (Algorithm 1): each round t a random set of ``m = max(C * M, 1)`` clients
(``clients_per_round``) receives the centres Gamma_{t-1}; each returns its cluster sizes
Lambda^(i) and local centres Gamma^(i) from ``ClientKMeans``; the server forms

    Lambda_t   = sum_i Lambda^(i)
    Gamma*_t   = (1 / Lambda_t) * sum_i Lambda^(i) * Gamma^(i)
    Gamma_t    = Gamma_{t-1} + alpha * (Gamma*_t - Gamma_{t-1})        (server rate alpha)

Client (``ClientKMeans``): the records are split once into batches of size B (B = None:
one full batch); for each of E epochs the sizes Lambda are reset to zero, the batch order is
shuffled, and for each batch b

    c_j = argmin_k ||x_j - mu_k||^2,  Lambda^b = per-cluster counts,  Gamma^b = batch means
    Lambda <- Lambda + Lambda^b
    Gamma  <- Gamma + beta * (Lambda^b / Lambda) * (Gamma^b - Gamma)   (client rate beta)

(a cluster with no record in the batch is not moved). Each batch is one vectorised
assignment and one per-cluster sum; the loops run over batches and epochs, not records.

Sum-fields: the server needs only ``sum_i Lambda^(i)`` and ``sum_i Lambda^(i) Gamma^(i)``, so
the client returns ``sizes`` = Lambda (a per-record ``count``: the last epoch counts each
record once) and ``weighted_centres`` = Lambda * Gamma. With E = 1, B = None and beta = 1
that product is exactly the clusters' coordinate sums (kind ``"sum"``, bounded sensitivity
for record-level DP); otherwise it is kind ``"value"``. Everything runs under secure
aggregation.

Reassignment (section 2.3): "If a cluster has a size smaller than 0.01 * sum_i |P_i| for 20
consecutive rounds, it is randomly reassigned." In a federation the server knows neither
the total number of records nor any record, so:

* the size test uses the round's aggregate: cluster j is small when
  ``Lambda_t[j] < reassign_fraction * sum_j Lambda_t[j]`` (the share among the records of the
  round's participants; with full participation this is the paper's rule exactly);
* the reassigned centre is drawn uniformly in a data-independent box: the declared
  ``init_bounds`` when given, else the bounding box of the current centres (which the
  server already holds). No client data is involved, so this is safe under any protection.

Stopping: the centres move less than ``tol`` (Frobenius norm) while no cluster is on a
small-size streak, or the runtime's ``max_rounds`` (the paper's T).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..validation import check_choice, check_float, check_int
from ..exceptions import InputError
from ..federation.convergence import frobenius_movement
from ..messages import AggregatedUpdate, Broadcast, FieldSpec, Update
from . import _seeding
from ._kmeans import _check_bounds, assign, per_client_cell_sums, segment_sums
from .base import Algorithm, SeededState


def client_kmeans(X: np.ndarray, C: np.ndarray, epochs: int, batch_size: int | None, beta: float, rng):
    """``ClientKMeans`` of Algorithm 1/2: returns (Lambda, Lambda * Gamma) of the last epoch."""
    C = np.array(C, dtype=np.float64, copy=True)
    k = len(C)
    n = len(X)
    if batch_size is None or batch_size >= n:
        bounds = [(0, n)]
    else:
        starts = np.arange(0, n, batch_size)
        bounds = [(int(s), int(min(s + batch_size, n))) for s in starts]
    lam = np.zeros(k)
    for _ in range(epochs):
        lam = np.zeros(k)  # "initialize cluster sizes Lambda to zero"
        order = rng.permutation(len(bounds)) if len(bounds) > 1 else range(1)
        for b in order:
            lo, hi = bounds[b]
            xb = X[lo:hi]
            labels, _ = assign(xb, C)
            sums, counts = segment_sums(labels, xb, k)
            lam += counts
            nz = counts > 0
            gamma_b = sums[nz] / counts[nz, None]
            C[nz] += (beta * counts[nz] / lam[nz])[:, None] * (gamma_b - C[nz])
    return lam, lam[:, None] * C


@dataclass
class MiniBatchState(SeededState):
    """Server state of federated mini-batch k-means.

    Parameters
    ----------
    streak : ndarray of shape (n_clusters,), dtype int64
        Consecutive rounds each cluster received less than ``reassign_fraction`` of the
        records; a cluster is reassigned when its streak reaches ``reassign_patience``.
    reassigned : int
        Clusters reassigned so far.
    """

    streak: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    reassigned: int = 0


class MiniBatchFederatedKMeansAlgorithm(Algorithm):
    """Server and client logic of Triebe & Rajagopal's federated (mini-batch) k-means."""

    name = "minibatch-fkm"
    needs_client_rng = True

    def client_rng_needed(self, broadcast):
        if broadcast.action.startswith("init."):
            return True
        return broadcast.action == "train" and broadcast.params.get("batch_size") is not None

    def __init__(
        self,
        n_clusters: int,
        *,
        local_epochs: int = 1,
        batch_size: int | None = None,
        server_rate: float = 1.0,
        client_rate: float = 1.0,
        tol: float = 1e-6,
        reassign: bool = True,
        reassign_fraction: float = 0.01,
        reassign_patience: int = 20,
        init="random",
        init_bounds=None,
    ):
        self.n_clusters = check_int(n_clusters, "n_clusters", minimum=1)
        self.local_epochs = check_int(local_epochs, "local_epochs", minimum=1)
        self.batch_size = None if batch_size is None else check_int(batch_size, "batch_size", minimum=1)
        self.server_rate = check_float(server_rate, "server_rate", minimum=0.0, maximum=1.0, min_inclusive=False)
        self.client_rate = check_float(client_rate, "client_rate", minimum=0.0, maximum=1.0, min_inclusive=False)
        self.tol = check_float(tol, "tol", minimum=0.0)
        self.reassign = bool(reassign)
        self.reassign_fraction = check_float(reassign_fraction, "reassign_fraction", minimum=0.0, maximum=1.0)
        self.reassign_patience = check_int(reassign_patience, "reassign_patience", minimum=1)
        if not isinstance(init, np.ndarray):
            check_choice(init, "init", _seeding.INIT_CHOICES)
        self.init_ = init
        self.init_bounds = init_bounds

    @property
    def exact_sums(self) -> bool:
        """E = 1, B = None, beta = 1: Lambda * Gamma is the plain coordinate sum."""
        return self.local_epochs == 1 and self.batch_size is None and self.client_rate == 1.0

    @property
    def dp_value_fix(self):
        if self.exact_sums:
            return None
        return ("local_epochs=1, batch_size=None and client_rate=1.0 (the paper's E = 1, B = infinity, "
                "beta = 1: each round then sends the count and coordinate sum of the records nearest each "
                "centre, which central and distributed DP bound)")

    @property
    def nearest_centre_actions(self):
        """With exact sums the round's weighted centres are the hard nearest-centre sums of the
        broadcast centres: GaussianDP(radius=...) may bound them by a radius."""
        return ("train",) if self.exact_sums else ()

    # ----------------------------------------------------------------- server
    n_features_: int = 0

    def planned_rounds(self, max_rounds):
        return len(self.planned_sequence(max_rounds))

    def planned_sequence(self, max_rounds):
        """The actions of one run's rounds in order: the seeding round, if any, then
        ``max_rounds`` training rounds (lets ``GaussianDP(last_round_weights=...)`` find the
        last one)."""
        seeding = _seeding.seeding_action(self.init_)
        return ([seeding] if seeding is not None else []) + ["train"] * int(max_rounds)

    def init(self, n_clients, n_features, rng):
        self.n_features_ = n_features
        centres = _seeding.initial_centres(self.init_, self.n_clusters, n_features, rng, self.init_bounds)
        return MiniBatchState(centres=centres, phase="train" if centres is not None else "init", rng=rng,
                              n_clients=n_clients, streak=np.zeros(self.n_clusters, dtype=np.int64))

    def configure(self, state, round):
        if state.phase == "init":
            return _seeding.seeding_broadcast(
                self.init_, self.n_clusters, init_bounds=self.init_bounds, rng=state.rng,
                n_features=self.n_features_,
            )
        return Broadcast(
            action="train",
            centres=state.centres,
            params={"local_epochs": self.local_epochs, "batch_size": self.batch_size, "client_rate": self.client_rate},
        )

    def sum_fields(self, broadcast):
        if broadcast.action.startswith("init."):
            return _seeding.seeding_sum_fields(broadcast)
        if broadcast.action != "train":
            return ()
        k, d = broadcast.centres.shape
        return (
            FieldSpec("sizes", (k,), "count", integer=True),
            FieldSpec("weighted_centres", (k, d), "sum" if self.exact_sums else "value",
                      weighted_by="sizes" if self.exact_sums else None),
        )

    def aggregate(self, state, agg: AggregatedUpdate):
        rng = state.rng
        if state.phase == "init":
            return _seeding.seeded_state(state, agg, self.init_, self.n_clusters, self.init_bounds)
        C = state.centres
        lam = agg.sums["sizes"]
        star = C.copy()
        nz = lam > 0
        star[nz] = agg.sums["weighted_centres"][nz] / lam[nz, None]  # Gamma*_t
        new = C + self.server_rate * (star - C)  # Gamma_t = Gamma_{t-1} + alpha (Gamma* - Gamma_{t-1})
        streak, reassigned = state.streak, state.reassigned
        if self.reassign:
            small = lam < self.reassign_fraction * lam.sum()
            streak = np.where(small, streak + 1, 0)
            due = np.flatnonzero(streak >= self.reassign_patience)
            if len(due):
                new = new.copy()
                new[due] = self._random_points(new, len(due), rng)
                streak = streak.copy()
                streak[due] = 0
                reassigned += len(due)
        movement = frobenius_movement(C, new)
        movements = state.movements + [movement]
        done = movement < self.tol and not np.any(streak > 0)
        return replace(
            state, centres=new, round=state.round + 1, movements=movements, phase="done" if done else "train",
            streak=streak, reassigned=reassigned,
        )

    def _random_points(self, centres, count, rng):
        """Data-independent reassignment target: uniform in init_bounds or the centres' box."""
        d = centres.shape[1]
        if self.init_bounds is not None:
            low, high = _check_bounds(self.init_bounds, d)
        else:
            low, high = centres.min(axis=0), centres.max(axis=0)
        return low + (high - low) * rng.random((count, d))

    def close(self, state):
        if state.centres is None:
            raise InputError("max_rounds ended before any client could seed the centres.")
        return replace(state, phase="done")

    def converged(self, state):
        return state.phase == "done"

    # ----------------------------------------------------------------- client
    def client_update(self, X, broadcast, rng, memory=None):
        action = broadcast.action
        if action.startswith("init."):
            return _seeding.seeding_client_update(X, broadcast, rng)
        if action != "train":
            raise InputError(f"mini-batch federated k-means client got unknown action {action!r}")
        p = broadcast.params
        if p["local_epochs"] == 1 and p["batch_size"] is None:
            return self.client_updates([X], broadcast, [rng], [memory])[0]
        lam, weighted = client_kmeans(X, broadcast.centres, p["local_epochs"], p["batch_size"], p["client_rate"], rng)
        return Update(sums={"sizes": lam, "weighted_centres": weighted})

    def client_updates(self, datas, broadcast, rngs, memories=None):
        """Full-batch, one-epoch rounds for many clients in one vectorised pass.

        With E = 1 and B = None, ``ClientKMeans`` reduces to Lambda = counts and
        Lambda * Gamma = (1 - beta) * Lambda * mu + beta * sums (exactly the sums when beta = 1).
        """
        p = broadcast.params
        if broadcast.action != "train" or p["local_epochs"] != 1 or p["batch_size"] is not None:
            return [self.client_update(X, broadcast, r, m) for X, r, m in zip(datas, rngs, memories or [None] * len(datas))]
        C = broadcast.centres
        beta = p["client_rate"]
        sums, counts = per_client_cell_sums(datas, C)
        out = []
        for i in range(len(datas)):
            weighted = sums[i] if beta == 1.0 else (1.0 - beta) * counts[i][:, None] * C + beta * sums[i]
            out.append(Update(sums={"sizes": counts[i], "weighted_centres": weighted}))
        return out
