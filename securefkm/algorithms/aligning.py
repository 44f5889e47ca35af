"""Federated k-means with cluster alignment (Garst & Reinders, "Federated K-Means Clustering").

Algorithm 1 of the paper, with ``K_g = n_clusters``:

* **Init** (lines 1-5): each client seeds ``K_i = min(K_g, |X_i|)`` centres with k-means++
  on its own records, counts the records nearest to each seed (``S_i``) and sends
  ``(S_i, C_i)``.
* **Server** (lines 7-11): concatenates all local means ``C_l`` and sizes ``S_l`` and runs a
  k-means with ``K_g`` clusters weighted by ``S_l`` until convergence (eq. 1,
  ``F = sum_j S_j min_i ||C_j - C_i||^2``) -> global centres ``C_g``.
* **Client** (lines 12-18): assigns its records to ``C_g``, drops the global clusters that got
  no record (line 15, so ``K_i`` can shrink), runs ONE k-means iteration from the remaining
  global centres (line 17: "not until convergence, to avoid local minima") and sends the
  new ``(S_i, C_i)``.
* Clusters holding fewer than ``p`` records (``min_cluster_size``, the paper uses p = 2) are
  never sent (section 2, "Cluster alignment").

Stopping: the Frobenius movement of ``C_g`` between rounds falls below ``tol``, or
``max_rounds`` training rounds. The server k-means restarts from k-means++ each round (as in
the authors' code), so the new ``C_g`` is re-ordered to match the previous one (Hungarian
matching on squared distances) before the movement is measured; the clustering itself does
not depend on the order.

Two details where the authors' code and the text differ and what this module does:

* ``local_init="seeds"`` (default) sends the k-means++ seeds themselves, as the paper and its
  code do -- the seeds are raw client records. ``local_init="means"`` sends the mean of the
  records nearest to each seed instead (no raw record leaves the client).
* In a training round ``S_i`` counts the records whose assignment produced each new mean,
  so ``S_i * C_i`` is exactly the clusters' coordinate sum (the authors' code re-assigns the
  records to the new means before counting; the difference is one Lloyd half-step).

What the server sees (plain): each participating client's local centres and their sizes
(set-fields), every round. ``secure_mode=True`` replaces the server k-means by rounds of
secure sums (:mod:`securefkm.algorithms.secure_centres`): clients keep their local centres
in their private memory and the server only learns per-global-cluster sums.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from scipy.optimize import linear_sum_assignment

from ..validation import check_choice, check_float, check_int
from ..exceptions import InputError
from ..federation.convergence import frobenius_movement
from ..messages import AggregatedUpdate, Broadcast, Update
from . import _seeding
from . import secure_centres as sc
from ._kmeans import assign, seed_kmeans_plusplus, segment_sums, sq_distances, weighted_kmeans
from .base import Algorithm

LOCAL_INITS = ("seeds", "means")


def fkm_local_init(X: np.ndarray, k: int, rng: np.random.Generator, local_init: str = "seeds"):
    """Algorithm 1, lines 3-4: k-means++ seeds ``C_i`` and the record counts ``S_i`` per seed.

    ``K_i = min(K_g, |X_i|)``. With ``local_init="means"`` each seed is replaced by the mean of
    the records nearest to it. Returns (centres, sizes, exact_means).
    """
    k_i = min(k, len(X))
    seeds = seed_kmeans_plusplus(X, k_i, rng)
    labels, _ = assign(X, seeds)
    sums, sizes = segment_sums(labels, X, k_i)
    if local_init == "means":
        nz = sizes > 0
        return sums[nz] / sizes[nz, None], sizes[nz], True
    return seeds, sizes, False


def fkm_local_step(X: np.ndarray, G: np.ndarray):
    """Algorithm 1, lines 13-17: assign to ``C_g``, drop empty global clusters, one k-means step.

    One assignment and one per-cluster sum: the dropped clusters got no record, so the
    assignment to the remaining centres is the assignment to ``C_g``. Returns the new local
    means and the number of records behind each (so ``sizes * centres`` = coordinate sums).
    """
    labels, _ = assign(X, G)
    sums, counts = segment_sums(labels, X, len(G))
    keep = counts > 0  # line 15: drop empty global clusters
    return sums[keep] / counts[keep, None], counts[keep]


def drop_small(centres: np.ndarray, sizes: np.ndarray, min_cluster_size: int):
    """Section 2: clusters holding fewer than ``p`` records are never sent."""
    keep = sizes >= min_cluster_size
    return centres[keep], sizes[keep]


def match_order(previous: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Re-order ``new`` centres to best match ``previous`` (Hungarian on squared distances)."""
    _, cols = linear_sum_assignment(sq_distances(previous, new))
    return new[cols]


class AligningFederatedKMeansAlgorithm(Algorithm):
    """Server and client logic of Garst & Reinders' FKM (Algorithm 1), plain or secure mode."""

    name = "garst-fkm"
    uses_set_fields = True  # an instance in secure mode sends none (see __init__)
    secure_mode_param = "secure_mode"
    needs_client_rng = True

    def client_rng_needed(self, broadcast):
        return broadcast.action in ("fkm.init",) or broadcast.action.startswith("init.")

    def __init__(
        self,
        n_clusters: int,
        *,
        min_cluster_size: int = 2,
        max_rounds: int = 100,
        tol: float = 1e-4,
        local_init: str = "seeds",
        server_n_init: int = 10,
        secure_mode: bool = False,
        server_max_iter: int = 300,
        server_tol: float = 1e-6,
        oversample: int = 4,
        init="uniform",
        init_bounds=None,
    ):
        self.n_clusters = check_int(n_clusters, "n_clusters", minimum=1)
        self.min_cluster_size = check_int(min_cluster_size, "min_cluster_size", minimum=1)
        self.max_rounds = check_int(max_rounds, "max_rounds", minimum=1)
        self.tol = check_float(tol, "tol", minimum=0.0)
        self.local_init = check_choice(local_init, "local_init", LOCAL_INITS)
        self.server_n_init = check_int(server_n_init, "server_n_init", minimum=1)
        self.secure_mode = bool(secure_mode)
        self.uses_set_fields = not self.secure_mode
        self.server_max_iter, self.server_tol, self.oversample = sc.check_secure_params(
            server_max_iter, server_tol, oversample
        )
        if not isinstance(init, np.ndarray):
            check_choice(init, "init", _seeding.INIT_CHOICES)
        self.init_ = init
        self.init_bounds = init_bounds
        self.secure = sc.SecureServerKMeans(
            self.n_clusters, max_iter=self.server_max_iter, tol=self.server_tol, oversample=self.oversample
        )
        if self.secure_mode:
            self.name = "garst-fkm-secure"

    # ----------------------------------------------------------------- server
    def init(self, n_clients, n_features, rng):
        start, coarse = (None, False)
        if self.secure_mode:
            start, coarse = self.secure.initial_centres(self.init_, self.init_bounds, n_features, rng)
        return sc.SecureCentresState(centres=None, phase="init", rng=rng, n_clients=n_clients,
                                     secure_start=start, secure_coarse=coarse)

    def configure(self, state, round):
        if state.phase == "init":
            return Broadcast(
                action="fkm.init",
                params={"k": self.n_clusters, "local_init": self.local_init, "min_cluster_size": self.min_cluster_size, "secure": self.secure_mode},
            )
        if state.phase == "seed":
            return _seeding.seeding_broadcast(self.init_, self.n_clusters)
        if state.phase == "secure":
            return self.secure.broadcast(state.secure_run, state.secure_total)
        return Broadcast(
            action="fkm.train",
            centres=state.centres,
            params={"min_cluster_size": self.min_cluster_size, "secure": self.secure_mode},
        )

    def sum_fields(self, broadcast):
        if broadcast.action == sc.SECURE_ACTION:
            return self.secure.fields(broadcast)
        return ()

    def aggregate(self, state, agg: AggregatedUpdate):
        rng = state.rng
        if state.phase == "seed":
            centres = _seeding.seeding_aggregate(agg, self.n_clusters, rng)
            if centres is None:
                attempts = state.seed_attempts + 1
                if attempts >= 3 * state.n_clients:
                    raise InputError(
                        f"init={self.init_!r}: no sampled client holds n_clusters={self.n_clusters} records; "
                        "use init='uniform' with init_bounds."
                    )
                return replace(state, seed_attempts=attempts)
            return self._start_secure(state, centres, exact=self.local_init == "means")
        if state.phase == "secure":
            run, G = self.secure.step(state.secure_run, agg.sums, rng)
            state = replace(state, secure_run=run, secure_total=state.secure_total + 1)
            return state if G is None else self._new_global(state, G, warm=True)
        if self.secure_mode:  # init or train round: the clients stored their local centres
            if state.phase == "init":
                if state.secure_start is None:
                    return replace(state, phase="seed")
                return self._start_secure(
                    state, state.secure_start, exact=self.local_init == "means", coarse=state.secure_coarse
                )
            return self._start_secure(state, state.centres, exact=True)
        # plain: lines 8-10, weighted k-means over all received local means
        received = [it for it in agg.items.values() if len(it.get("centres", ())) > 0]
        if not received:
            raise InputError(
                "no client sent a local cluster of at least min_cluster_size records; "
                "lower min_cluster_size or n_clusters."
            )
        points = np.vstack([it["centres"] for it in received])
        weights = np.concatenate([it["sizes"] for it in received])
        new = weighted_kmeans(points, self.n_clusters, rng, weights=weights, n_init=self.server_n_init)
        return self._new_global(state, new, warm=False)

    def _start_secure(self, state, G, *, exact, coarse=False):
        run = self.secure.start(G, exact_means=exact, coarse=coarse)
        return replace(state, phase="secure", secure_run=run)

    def _new_global(self, state, new, *, warm):
        """Record a new C_g: the first one after init, or one training round's result.

        A plain server k-means restarts from k-means++, so its centres are re-ordered to
        match the previous C_g; a secure run is warm-started from C_g and keeps its order.
        """
        if state.centres is None:
            return replace(state, centres=new, phase="train")
        if not warm:
            new = match_order(state.centres, new)
        movement = frobenius_movement(state.centres, new)
        movements = state.movements + [movement]
        rounds = state.round + 1
        done = movement < self.tol or rounds >= self.max_rounds
        return replace(state, centres=new, round=rounds, movements=movements, phase="done" if done else "train")

    def close(self, state):
        """The runtime's round cap was reached: keep the last global centres."""
        if state.phase == "done":
            return state
        if state.centres is None:
            G = None if state.secure_run is None else state.secure_run.result
            if G is None:
                raise InputError("max_rounds ended before the first global centres were computed; raise max_rounds.")
            return replace(state, centres=G, phase="done")
        return replace(state, phase="done")

    def converged(self, state):
        return state.phase == "done"

    def resumable(self, state):
        # the secure iterations read the local centres the clients stored in their memory
        return not (self.secure_mode and state.phase in ("seed", "secure"))

    def planned_rounds(self, max_rounds):
        if not self.secure_mode:
            return min(max_rounds, self.max_rounds + 1)
        per_round = 1 + self.server_max_iter
        return min(max_rounds, 2 + self.server_max_iter + self.max_rounds * per_round)

    def round_limit(self, max_rounds):
        if not self.secure_mode:
            return self.planned_rounds(max_rounds)
        # seeding, then per global round its train round and a secure k-means of at most
        # server_max_iter iterations per stage (coarse and fine)
        per_round = 1 + 2 * self.server_max_iter
        return 2 + 2 * self.server_max_iter + max(max_rounds, self.max_rounds) * per_round

    # ----------------------------------------------------------------- client
    def client_update(self, X, broadcast, rng, memory=None):
        action = broadcast.action
        p = broadcast.params.get("min_cluster_size", self.min_cluster_size)
        if action == sc.SECURE_ACTION:
            return sc.secure_client_update(memory, broadcast)
        if action.startswith("init."):
            return _seeding.seeding_client_update(X, broadcast, rng)
        if action == "fkm.init":
            centres, sizes, exact = fkm_local_init(X, broadcast.params["k"], rng, broadcast.params["local_init"])
        elif action == "fkm.train":
            centres, sizes = fkm_local_step(X, broadcast.centres)
            exact = True
        else:
            raise InputError(f"Garst FKM client got unknown action {action!r}")
        centres, sizes = drop_small(centres, sizes, p)
        if broadcast.params.get("secure"):
            sc.store_local_centres(memory, centres, sizes, exact)
            return Update()
        return Update(items={"centres": centres, "sizes": sizes.astype(np.float64)})


# ------------------------------------------------------------------ evaluation helpers
def pooled_ari(centres: np.ndarray, clients, labels) -> float:
    """ARI of the nearest-centre labels of the pooled records against the true labels.

    This is the "pooled-data ARI" (one ARI over all records of all clients).
    """
    from sklearn.metrics import adjusted_rand_score

    X = np.vstack(clients)
    y = np.concatenate(labels)
    return float(adjusted_rand_score(y, assign(X, np.asarray(centres))[0]))


def client_weighted_ari(centres: np.ndarray, clients, labels) -> float:
    """Garst & Reinders' reported score: per-client ARI, averaged with weights |X_i|.

    Each client scores the nearest-centre labels of its own records against its own true
    labels; the mean is weighted by the client sizes (the authors' ``run_V2``).
    """
    from sklearn.metrics import adjusted_rand_score

    scores, sizes = [], []
    for X, y in zip(clients, labels):
        scores.append(adjusted_rand_score(y, assign(X, np.asarray(centres))[0]))
        sizes.append(len(X))
    return float(np.average(scores, weights=sizes))
