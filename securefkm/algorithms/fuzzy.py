"""Federated fuzzy c-means (Stallmann & Wilbik 2022) with k-means or federated averaging.

Stallmann & Wilbik, "On a Framework for Federated Cluster Analysis", Appl. Sci. 12 (2022)
10455, section 2.2.

``averaging="kmeans"`` -- FedFCM (sec. 2.2.1, eq. 17)
    The server broadcasts the global centres c_1..c_K; each client l runs fuzzy c-means
    on its own records *from those centres* until its memberships change by at most
    ``local_tol`` (eqs. 5-6, step 3) and returns its local centres c_1^(l)..c_K^(l)
    (set-fields). The server's averaging function is k-means over all P*K local centres
    (eq. 17), with K clusters. As in the paper the local centres are unweighted
    (``centre_weights="none"``: only centres are shared); ``"membership"`` also sends
    each local centre's fuzzy support sum_i u_ij (Bárcena et al. / Pedrycz weights) and
    runs weighted k-means.

``averaging="fedavg"`` -- federated averaging FCM (sec. 2.1.4; Pedrycz 2022, Bárcena et al.
2021)
    Each client computes its memberships w.r.t. the broadcast centres (eq. 5) and returns
    the sum-fields sum_i u_ij^m x_i (kind ``"sum"``) and sum_i u_ij^m (kind ``"count"``);
    the server divides (eq. 6 on the pooled data). Sum-only: runs under secure aggregation
    and distributed DP. With all clients taking part this is exactly one central FCM
    step per round.

Both modes stop when sum_k ||c_k^t - c_k^(t+1)|| <= ``global_tol`` (sec. 2.2.1, the
paper's global criterion) or after ``max_rounds``.

A final ``"validity"`` round (``validity_round=True``) asks every client for the FedFuzzDB
sum-fields of sec. 2.2.2 (N_l, sum_j u_ij, sum_j ||x_j - c_i||^q); it runs through the same
protection stack, and the server stores the index in ``state.score``.

Choices the paper leaves open:

* Initial centres: the paper only says "the server initialises K global centres"; we
  reuse the library's seeding phase (``securefkm.algorithms._seeding``).
* Server k-means (eq. 17) on the first training round: scikit-learn k-means++ with
  ``server_n_init`` restarts over the local centres; the result is paired with the
  previous centres by a minimum-cost matching. Later rounds (``server_init="warm"``,
  default): k-means started from the current global centres, so centre k keeps its
  identity and the convergence criterion compares like with like. A fresh k-means++ every
  round (``server_init="fresh"``, then matched) can jump between k-means optima from round
  to round and never meet the criterion: on the motivational set with K=3 it cycles with
  a constant movement of 0.53 for 100 rounds, while the warm start converges in 5.
* Local stopping: largest absolute membership change <= ``local_tol`` (see ``_fcm``).

``secure_mode=True`` (k-means averaging only) hides every client's local centres: clients
keep them in their private ``memory`` and the server k-means of eq. 17 runs as rounds of
secure sums (``securefkm.algorithms.secure_centres``: each client assigns its stored local
centres to the current global centres and returns per-global-cluster weighted sums), warm
started from the current global centres. Each server k-means iteration is one round, so
``max_rounds`` then caps all rounds (training + secure iterations). Local FCM centres are
not means of records, so these sum-fields have kind ``"value"``: secure aggregation
applies, record-level DP refuses them. The plain mode's first server k-means uses
k-means++ restarts over the local centres, which secure sums cannot do; with
``oversample > 1`` and ``init_bounds`` the first secure k-means instead starts from
``oversample * K`` uniform centres in the declared box and reduces the non-empty
aggregated centres to K (``SecureServerKMeans``'s coarse stage); otherwise it starts from
the current global centres.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import linear_sum_assignment

from ..validation import check_choice, check_float, check_int
from ..exceptions import InputError
from ..messages import AggregatedUpdate, Broadcast, FieldSpec, Update
from . import _seeding
from . import secure_centres as sc
from ._cellsums import use_compiled
from ._fcm import (
    centres_from_sums,
    check_fuzzifier,
    fedfuzzdb_terms,
    fuzzy_db_from_parts,
    local_fcm,
    membership_weights,
)
from ._kmeans import map_blocks, weighted_kmeans
from .base import Algorithm

AVERAGING = ("kmeans", "fedavg")
CENTRE_WEIGHTS = ("none", "membership")
SERVER_INITS = ("warm", "fresh")


@dataclass
class FuzzyState(sc.SecureCentresState):
    """Server state of FedFCM / federated-averaging FCM.

    Parameters
    ----------
    validity_terms : dict of str to ndarray, or None
        The summed terms of the closing validity round (``n``, ``memberships``,
        ``spread``), from which ``score`` (the federated fuzzy Davies-Bouldin index) is
        computed; None before that round.
    """

    validity_terms: dict[str, np.ndarray] | None = None


def centre_movement(old: np.ndarray, new: np.ndarray) -> float:
    """sum_k ||c_k^t - c_k^(t+1)|| -- the global convergence criterion of sec. 2.2.1."""
    return float(np.linalg.norm(np.asarray(new) - np.asarray(old), axis=1).sum())


def match_to(previous: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Reorder ``new`` centres so that row k is the one closest to ``previous[k]`` overall
    (minimum total squared distance, Hungarian algorithm)."""
    cost = ((previous[:, None, :] - new[None, :, :]) ** 2).sum(axis=-1)
    rows, cols = linear_sum_assignment(cost)
    out = np.empty_like(new)
    out[rows] = new[cols]
    return out


class FederatedFuzzyCMeansAlgorithm(Algorithm):
    """Server and client logic of FedFCM (k-means averaging) and federated-averaging FCM."""

    name = "fedfcm"
    needs_client_rng = True  # only seeding rounds draw random numbers
    secure_mode_param = "secure_mode"  # k-means averaging's sum-only variant

    def client_rng_needed(self, broadcast):
        return broadcast.action.startswith("init.")

    def __init__(
        self,
        n_clusters: int,
        *,
        averaging: str = "kmeans",
        m: float = 2.0,
        local_tol: float = 1e-3,
        global_tol: float = 1e-3,
        max_local_iter: int = 300,
        centre_weights: str = "none",
        server_n_init: int = 10,
        server_init: str = "warm",
        init="k-means++",
        init_bounds=None,
        validity_round: bool = True,
        p: float = 2.0,
        q: float = 1.0,
        secure_mode: bool = False,
        server_max_iter: int = 100,
        server_tol: float = 1e-6,
        oversample: int = 5,
        seeding_noise: float | None = None,
    ):
        self.n_clusters = check_int(n_clusters, "n_clusters", minimum=1)
        self.averaging = check_choice(averaging, "averaging", AVERAGING)
        self.m = check_fuzzifier(m)
        self.local_tol = check_float(local_tol, "local_tol", minimum=0.0)
        self.global_tol = check_float(global_tol, "global_tol", minimum=0.0)
        self.max_local_iter = check_int(max_local_iter, "max_local_iter", minimum=1)
        self.centre_weights = check_choice(centre_weights, "centre_weights", CENTRE_WEIGHTS)
        self.server_n_init = check_int(server_n_init, "server_n_init", minimum=1)
        self.server_init = check_choice(server_init, "server_init", SERVER_INITS)
        if not isinstance(init, np.ndarray):
            check_choice(init, "init", _seeding.INIT_CHOICES)
        self.init_ = init
        self.init_bounds = init_bounds
        self.validity_round = bool(validity_round)
        if self.validity_round and self.n_clusters < 2:
            raise InputError(
                "n_clusters must be >= 2 for the validity round (the Davies-Bouldin index compares "
                "pairs of clusters); pass validity_round=False to fit a single cluster."
            )
        self.p = check_float(p, "p", minimum=1.0)
        self.q = check_float(q, "q", minimum=0.0, min_inclusive=False)
        self.secure_mode = bool(secure_mode)
        self.server_max_iter, self.server_tol, self.oversample = sc.check_secure_params(
            server_max_iter, server_tol, oversample
        )
        if self.secure_mode and self.averaging != "kmeans":
            raise InputError(
                "secure_mode=True applies to averaging='kmeans' only; averaging='fedavg' is "
                "already sum-only and runs under secure aggregation as it is."
            )
        if self.secure_mode and self.centre_weights != "none":
            raise InputError(
                "secure_mode=True supports centre_weights='none' only (the paper's unweighted "
                "k-means averaging); drop centre_weights or set secure_mode=False."
            )
        # the DP plan's noise level e, which sizes the private seeding's grid (_seeding.lsh_bits)
        self.seeding_noise = None if seeding_noise is None else check_float(
            seeding_noise, "seeding_noise", minimum=0.0, min_inclusive=False)
        self.secure = sc.SecureServerKMeans(
            self.n_clusters,
            max_iter=self.server_max_iter,
            tol=self.server_tol,
            oversample=self.oversample,
        )
        self.uses_set_fields = self.averaging == "kmeans" and not self.secure_mode
        self.name = "fedfcm" if self.averaging == "kmeans" else "fedavg-fcm"
        if self.secure_mode:
            self.name = "fedfcm-secure"

    # ----------------------------------------------------------------- server
    n_features_: int = 0

    def init(self, n_clients, n_features, rng):
        self.n_features_ = n_features
        centres = _seeding.initial_centres(
            self.init_, self.n_clusters, n_features, rng, self.init_bounds
        )
        phase = "train" if centres is not None else "init"
        return FuzzyState(centres=centres, phase=phase, rng=rng, n_clients=n_clients)

    def _train_params(self, state):
        return {
            "secure": self.secure_mode,
            "train_round": state.round,
            "m": self.m,
            "local_tol": self.local_tol,
            "max_local_iter": self.max_local_iter,
            "centre_weights": self.centre_weights,
        }

    def configure(self, state, round):
        if state.phase == "init":
            return _seeding.seeding_broadcast(
                self.init_, self.n_clusters, init_bounds=self.init_bounds, rng=state.rng,
                n_features=self.n_features_, noise_level=self.seeding_noise,
            )
        if state.phase == "secure":
            b = self.secure.broadcast(state.secure_run, state.secure_total)
            return replace(b, params={**b.params, "train_round": state.round})
        if state.phase == "validity":
            return Broadcast(
                action="validity",
                centres=state.centres,
                params={"m": self.m, "q": self.q},
                sample="all",
            )
        if self.averaging == "kmeans":
            return Broadcast(
                action="train.local_fcm", centres=state.centres, params=self._train_params(state)
            )
        return Broadcast(action="train.fedavg", centres=state.centres, params={"m": self.m})

    def sum_fields(self, broadcast):
        if broadcast.action.startswith("init."):
            return _seeding.seeding_sum_fields(broadcast)
        if broadcast.centres is None:
            return ()
        if broadcast.action == sc.SECURE_ACTION:
            return self.secure.fields(broadcast)
        k, d = broadcast.centres.shape
        if broadcast.action == "train.fedavg":
            return (FieldSpec("weighted_sums", (k, d), "sum", weighted_by="weights"), FieldSpec("weights", (k,), "count"))
        if broadcast.action == "validity":
            # n: one per record; memberships: each record adds u_ij, sum_j u_ij = 1;
            # spread: each record adds u_ij^m ||x - c_i||^q <= (2R)^q to every one of the k
            # cells, so its L2 sensitivity is sqrt(k) (2R)^q (FieldSpec.cells = k).
            return (
                FieldSpec("n", (1,), "count", integer=True),
                FieldSpec("memberships", (k,), "count"),
                FieldSpec("spread", (k,), {1.0: "distance", 2.0: "score"}.get(self.q, "value"), cells=k),
            )
        return ()

    def aggregate(self, state, agg: AggregatedUpdate):
        rng = state.rng
        if state.phase == "init":
            return _seeding.seeded_state(state, agg, self.init_, self.n_clusters, self.init_bounds)
        if state.phase == "validity":
            return self._validity_aggregate(state, agg)
        if state.phase == "secure":
            run, G = self.secure.step(state.secure_run, agg.sums, rng)
            state = replace(state, secure_run=run, secure_total=state.secure_total + 1)
            return state if G is None else self._new_centres(state, G)
        if self.secure_mode:  # the clients stored their local centres: secure server k-means
            start, coarse = state.centres, False
            if state.round == 0 and self.oversample > 1 and self.init_bounds is not None:
                # protected replacement of the plain mode's k-means++ restarts (module doc)
                start, coarse = self.secure.initial_centres(
                    "uniform", self.init_bounds, state.centres.shape[1], rng
                )
            run = self.secure.start(start, exact_means=False, coarse=coarse)
            return replace(state, phase="secure", secure_run=run)
        if self.averaging == "kmeans":
            new = self._kmeans_average(state.centres, agg, rng, first=state.round == 0)
        else:
            s = agg.sums
            new = centres_from_sums(s["weighted_sums"], s["weights"], state.centres)  # eq. 6
        return self._new_centres(state, new)

    def _new_centres(self, state, new):
        """Record one training round's new global centres and apply the global criterion."""
        movement = centre_movement(state.centres, new)
        movements = state.movements + [movement]
        phase = "train"
        if movement <= self.global_tol:
            phase = "validity" if self.validity_round else "done"
        return replace(state, centres=new, phase=phase, round=state.round + 1, movements=movements)

    def _kmeans_average(self, C, agg, rng, first=False):
        """Eq. 17: k-means over all received local centres, paired with the old centres."""
        received = [it for it in agg.items.values() if len(it.get("centres", ())) > 0]
        if not received:
            return C.copy()
        points = np.vstack([np.asarray(it["centres"], dtype=np.float64) for it in received])
        weights = None
        if self.centre_weights == "membership":
            weights = np.concatenate([np.asarray(it["sizes"], dtype=np.float64) for it in received])
            keep = weights > 0
            points, weights = points[keep], weights[keep]
            if len(points) == 0:
                return C.copy()
        if self.server_init == "warm" and not first:
            return weighted_kmeans(points, self.n_clusters, rng, weights=weights, init=C)
        new = weighted_kmeans(
            points, self.n_clusters, rng, weights=weights, n_init=self.server_n_init
        )
        return match_to(C, new)

    def _validity_aggregate(self, state, agg):
        s = agg.sums
        n = float(s["n"][0])
        score = (
            fuzzy_db_from_parts(n, s["memberships"], s["spread"], state.centres, self.p, self.q)
            if n > 0
            else float("inf")
        )
        terms = {k: np.array(v, copy=True) for k, v in s.items()}
        return replace(state, score=score, phase="done", validity_terms=terms)

    def close(self, state):
        """Called when max_rounds is reached: go on to the validity round, if any."""
        if state.phase in ("train", "init", "secure"):
            if state.centres is None:
                raise InputError("max_rounds ended before any client could seed the centres.")
            return replace(state, phase="validity" if self.validity_round else "done")
        return state

    def converged(self, state):
        return state.phase == "done"

    def resumable(self, state):
        # the secure iterations read the local centres the clients stored in their memory
        return not (self.secure_mode and state.phase in ("secure",))

    def planned_rounds(self, max_rounds):
        seeding = (
            not isinstance(self.init_, np.ndarray) and self.init_ in _seeding.SEEDING_ROUND_INITS
        )
        return max_rounds + int(self.validity_round) + int(seeding)  # secure: max_rounds caps all

    def planned_sequence(self, max_rounds):
        """Federated averaging's rounds in order (the seeding round, if any, ``max_rounds``
        training rounds, the validity round, if any): lets ``GaussianDP(last_round_weights=...)``
        find the last training round. k-means averaging's round count is not known ahead."""
        if self.averaging != "fedavg":
            return ()
        seeding = _seeding.seeding_action(self.init_)
        return (([seeding] if seeding is not None else []) + ["train.fedavg"] * int(max_rounds)
                + (["validity"] if self.validity_round else []))

    # ----------------------------------------------------------------- client
    def client_update(self, X, broadcast, rng, memory=None):
        action = broadcast.action
        if action.startswith("init."):
            return _seeding.seeding_client_update(X, broadcast, rng)
        C = broadcast.centres
        params = broadcast.params
        if action == sc.SECURE_ACTION:
            stored = (memory or {}).get("fedfcm_round")
            # a client not sampled in this training round holds stale centres: send zeros
            mem = memory if stored == params.get("train_round") else {}
            return sc.secure_client_update(mem, broadcast)
        if action == "train.local_fcm":
            local, U, _ = local_fcm(
                X, C, params["m"], params["local_tol"], params["max_local_iter"]
            )
            if params.get("secure"):
                sc.store_local_centres(memory, local, np.ones(len(local)), exact_means=False)
                memory["fedfcm_round"] = params["train_round"]
                return Update()
            items = {"centres": local}
            if params.get("centre_weights") == "membership":
                items["sizes"] = U.sum(axis=0)
            return Update(items=items)
        if action == "train.fedavg":  # the same blocked kernel as many clients at once
            return self.client_updates([X], broadcast, [rng], [memory])[0]
        if action == "validity":
            return Update(sums=fedfuzzdb_terms(X, C, params["m"], params["q"]))
        raise InputError(f"federated fuzzy c-means client got unknown action {action!r}")

    def client_updates(self, datas, broadcast, rngs, memories=None):
        """Federated-averaging rounds for many clients in one blocked membership pass
        (:func:`._kmeans.map_blocks`: threads over client-aligned blocks, no copy of the
        pooled records); each client's sums equal the ones it computes alone bit for bit."""
        if broadcast.action != "train.fedavg":
            memories = memories or [None] * len(datas)
            return [
                self.client_update(X, broadcast, r, mem) for X, r, mem in zip(datas, rngs, memories)
            ]
        m = broadcast.params["m"]
        C = np.asarray(broadcast.centres, dtype=np.float64)
        k, d = C.shape
        fast = use_compiled(sum(len(X) for X in datas) * k)

        def block_sums(block):
            block = block.tolist()
            parts = [datas[c][a:b] for c, a, b in block]
            Xb = parts[0] if len(parts) == 1 else np.concatenate(parts)
            W = membership_weights(Xb, C, m, fast)  # u_ij^m; with fast, a per-thread scratch
            out, off = [], 0
            for c, a, b in block:
                Wi, Xi = W[off : off + b - a], Xb[off : off + b - a]
                off += b - a
                out.append((c, Wi.T @ Xi, Wi.sum(axis=0)))
            return out

        sums: list = [None] * len(datas)
        weights: list = [None] * len(datas)
        for part in map_blocks(datas, block_sums):
            for c, s, w in part:  # a client cut into pieces: its pieces added in order
                sums[c] = s if sums[c] is None else sums[c] + s
                weights[c] = w if weights[c] is None else weights[c] + w
        return [
            Update(sums={"weighted_sums": np.zeros((k, d)) if s is None else s,
                         "weights": np.zeros(k) if w is None else w})
            for s, w in zip(sums, weights)
        ]
