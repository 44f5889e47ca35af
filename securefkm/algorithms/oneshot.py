"""One-shot federated k-means: k-FED and the child/parent method.

Both take one round: every client computes local centres on its own records and sends them
(set-fields); the server runs one k-means over the union of all local centres.

* ``variant="kfed"`` -- k-FED (Dennis, Li & Smith 2021, "Heterogeneity for the Win:
  One-Shot Federated Clustering", Algorithm 1 in its plain form): client i runs k-means with
  ``k' = local_k`` clusters (:func:`~securefkm.algorithms._kmeans.local_kmeans`); the server
  runs k-means with ``k`` clusters over all local centres, unweighted as in k-FED
  (``weighted=True`` weights each centre by its cluster size, Garst & Reinders' eq. 1).
  The server k-means is :func:`~securefkm.algorithms._kmeans.weighted_kmeans`, the same
  function the DWF ``init="kfed"`` seeding uses, so both are the same algorithm. The
  paper's Awasthi-Sheffet style farthest-point server initialisation is not implemented;
  the server uses k-means++ with restarts.
* ``variant="child-parent"`` -- the "Federated K-Means" notebook (child servers = studies,
  one parent server): each child splits its records 75:25 with ``np.split`` *taking the first
  25 % as the update set* (as the notebook's ``np.split(df, [int(.25*len(df))])`` does;
  ``shuffle=True`` permutes the records first with the client's generator), runs k-means on
  the other 75 % ("Base k-means"), then folds each update record in order into its nearest
  centre with the online mean ``C <- (C * N + x) / (N + 1)``, ``N <- N + 1`` ("Update",
  steps 2-4); the parent runs k-means over all child centres ("Aggregate & Compute K-means
  run"). Only centres that hold at least one base record take part in the update, as in
  the notebook's maps.

The online update is inherently sequential (each record's nearest centre depends on the
centres moved by the records before it). :func:`online_mean_update` still avoids one Python
step per record: it speculatively assigns a block of records to the current centres,
computes the centres each record would have seen from running sums (vectorised), verifies
every record's nearest centre against them and accepts the block up to the first record
whose choice changed; it then restarts from there. The result equals the record-by-record
loop (the test compares them).

What the server sees (plain): each client's local centres and their sizes, once.
``secure_mode=True`` keeps them on the clients and runs the server k-means as rounds of
secure sums (:mod:`securefkm.algorithms.secure_centres`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..validation import check_choice, check_int
from ..exceptions import InputError
from ..messages import AggregatedUpdate, Broadcast, Update
from . import _seeding
from . import secure_centres as sc
from ._kmeans import assign, local_kmeans, weighted_kmeans
from .base import Algorithm

VARIANTS = ("kfed", "child-parent")


def child_split(X: np.ndarray, update_fraction: float = 0.25, rng: np.random.Generator | None = None):
    """The notebook's split: ``update, base = np.split(X, [int(update_fraction * len(X))])``.

    With ``rng`` the records are permuted first (``shuffle=True``).
    """
    if rng is not None:
        X = X[rng.permutation(len(X))]
    update, base = np.split(X, [int(update_fraction * len(X))])
    return base, update


def online_mean_update(C: np.ndarray, N: np.ndarray, X: np.ndarray, block: int | None = None):
    """Fold the records of ``X`` in order into their nearest centre: C_j <- (C_j N_j + x)/(N_j + 1).

    Equivalent to the notebook's record-by-record loop (steps 2-4 of its "Update"); see the
    module docstring for the block-speculation scheme. Every centre needs ``N_j >= 1``.
    ``block`` bounds the speculative block (default: about 2e6 / (k d) records, so the
    (block, k, d) work array stays near 16 MB). Returns (centres, sizes).
    """
    C = np.array(C, dtype=np.float64, copy=True)
    N = np.array(N, dtype=np.float64, copy=True)
    k = len(C)
    if np.any(N < 1):
        raise InputError("online_mean_update needs every centre to hold at least one record (N >= 1).")
    if block is None:
        block = int(max(1, min(512, 2_000_000 // max(1, k * C.shape[1]))))
    S = C * N[:, None]  # running coordinate sums: C_j = S_j / N_j
    start = 0
    while start < len(X):
        Xb = X[start : start + block]
        b = len(Xb)
        guess, _ = assign(Xb, C)
        onehot = np.zeros((b, k))
        onehot[np.arange(b), guess] = 1.0
        # state seen by record i: counts/sums after records 0..i-1 of the block
        cnt_before = np.cumsum(onehot, axis=0) - onehot
        sum_before = np.cumsum(onehot[:, :, None] * Xb[:, None, :], axis=0) - onehot[:, :, None] * Xb[:, None, :]
        seen = (S[None] + sum_before) / (N[None, :] + cnt_before)[:, :, None]
        d2 = np.einsum("bkd,bkd->bk", seen - Xb[:, None, :], seen - Xb[:, None, :])
        actual = np.argmin(d2, axis=1)
        wrong = np.flatnonzero(actual != guess)
        accept = b if len(wrong) == 0 else int(wrong[0])
        if accept == 0:  # the first record's centres are exact: take its true choice
            j = actual[0]
            S[j] += Xb[0]
            N[j] += 1
            C[j] = S[j] / N[j]
            start += 1
            continue
        lab = guess[:accept]
        np.add.at(S, lab, Xb[:accept])
        N += np.bincount(lab, minlength=k)
        nz = N > 0
        C[nz] = S[nz] / N[nz, None]
        start += accept
    return C, N


def child_parent_local(X: np.ndarray, k: int, rng: np.random.Generator, *, shuffle: bool = False, n_init: int = 1):
    """A child's centres and sizes: k-means on the 75 % base part, online update with the rest."""
    base, update = child_split(X, 0.25, rng if shuffle else None)
    centres, sizes = local_kmeans(base, k, rng, n_init=n_init)
    keep = sizes > 0
    centres, sizes = centres[keep], sizes[keep]
    if len(update):
        centres, sizes = online_mean_update(centres, sizes, update)
    return centres, sizes


class OneShotFederatedKMeansAlgorithm(Algorithm):
    """k-FED or the child/parent one-shot method, plain or in secure mode."""

    uses_set_fields = True  # an instance in secure mode sends none (see __init__)
    secure_mode_param = "secure_mode"
    needs_client_rng = True

    def client_rng_needed(self, broadcast):
        return broadcast.action != sc.SECURE_ACTION

    def __init__(
        self,
        n_clusters: int,
        *,
        variant: str = "kfed",
        local_k: int | None = None,
        weighted: bool = False,
        shuffle: bool = False,
        local_n_init: int = 1,
        server_n_init: int = 10,
        secure_mode: bool = False,
        server_max_iter: int = 300,
        server_tol: float = 1e-6,
        oversample: int = 4,
        init="uniform",
        init_bounds=None,
    ):
        self.n_clusters = check_int(n_clusters, "n_clusters", minimum=1)
        self.variant = check_choice(variant, "variant", VARIANTS)
        self.local_k = self.n_clusters if local_k is None else check_int(local_k, "local_k", minimum=1)
        self.weighted = bool(weighted)
        self.shuffle = bool(shuffle)
        self.local_n_init = check_int(local_n_init, "local_n_init", minimum=1)
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
        self.name = variant + ("-secure" if self.secure_mode else "")

    # ----------------------------------------------------------------- server
    def init(self, n_clients, n_features, rng):
        start, coarse = (None, False)
        if self.secure_mode:
            start, coarse = self.secure.initial_centres(self.init_, self.init_bounds, n_features, rng)
        return sc.SecureCentresState(centres=None, phase="local", rng=rng, n_clients=n_clients,
                                     secure_start=start, secure_coarse=coarse)

    def configure(self, state, round):
        if state.phase == "local":
            return Broadcast(
                action=f"oneshot.{self.variant}",
                params={"k_local": self.local_k, "shuffle": self.shuffle, "n_init": self.local_n_init,
                        "secure": self.secure_mode, "weighted": self.weighted},
            )
        if state.phase == "seed":
            return _seeding.seeding_broadcast(self.init_, self.n_clusters)
        return self.secure.broadcast(state.secure_run, state.secure_total)

    def sum_fields(self, broadcast):
        if broadcast.action == sc.SECURE_ACTION:
            return self.secure.fields(broadcast)
        return ()

    def aggregate(self, state, agg: AggregatedUpdate):
        rng = state.rng
        if state.phase == "local":
            if self.secure_mode:
                if state.secure_start is None:
                    return replace(state, phase="seed")
                return self._start_secure(state, state.secure_start, state.secure_coarse)
            received = [it for it in agg.items.values() if len(it.get("centres", ())) > 0]
            if not received:
                raise InputError("no client sent local centres; check that clients hold records.")
            points = np.vstack([it["centres"] for it in received])
            weights = np.concatenate([it["sizes"] for it in received]) if self.weighted else None
            centres = weighted_kmeans(points, self.n_clusters, rng, weights=weights, n_init=self.server_n_init)
            return replace(state, centres=centres, phase="done", round=1)
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
            return self._start_secure(state, centres, False)
        run, G = self.secure.step(state.secure_run, agg.sums, rng)
        state = replace(state, secure_run=run, secure_total=state.secure_total + 1)
        if G is None:
            return state
        return replace(state, centres=G, phase="done", round=1)

    def _start_secure(self, state, G, coarse):
        # k-means / online-mean centres are exact means of their records; with unweighted
        # k-FED the weights are ones, not record counts.
        run = self.secure.start(G, exact_means=self.weighted, coarse=coarse)
        return replace(state, phase="secure", secure_run=run)

    def close(self, state):
        if state.phase == "done":
            return state
        G = None if state.secure_run is None else state.secure_run.result
        if G is None:
            raise InputError("max_rounds ended before the server k-means finished; raise max_rounds.")
        return replace(state, centres=G, phase="done", round=1)

    def converged(self, state):
        return state.phase == "done"

    def resumable(self, state):
        # the secure iterations read the local centres the clients stored in their memory
        return not (self.secure_mode and state.phase in ("seed", "secure"))

    def planned_rounds(self, max_rounds):
        if not self.secure_mode:
            return 1
        return min(max_rounds, 2 + 2 * self.server_max_iter)

    # ----------------------------------------------------------------- client
    def client_update(self, X, broadcast, rng, memory=None):
        action = broadcast.action
        if action == sc.SECURE_ACTION:
            return sc.secure_client_update(memory, broadcast)
        if action.startswith("init."):
            return _seeding.seeding_client_update(X, broadcast, rng)
        p = broadcast.params
        if action == "oneshot.kfed":
            centres, sizes = local_kmeans(X, p["k_local"], rng, n_init=p["n_init"])
        elif action == "oneshot.child-parent":
            centres, sizes = child_parent_local(X, p["k_local"], rng, shuffle=p["shuffle"], n_init=p["n_init"])
        else:
            raise InputError(f"one-shot client got unknown action {action!r}")
        if p.get("secure"):
            sc.store_local_centres(memory, centres, sizes if p["weighted"] else np.ones(len(centres)), p["weighted"])
            return Update()
        return Update(items={"centres": centres, "sizes": sizes})
