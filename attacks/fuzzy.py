"""Passive equation-solving attack on federated fuzzy c-means messages.

Stallmann & Wilbik (2022), "On a Framework for Federated Cluster Analysis", sec. 2.2.3
name the risk (after Bárcena et al.): what a client sends in FedFCM and FedFuzzDB forms a
system of equations in its records. :class:`FuzzyEquationSolver` solves that system.

For a client l with records x_1..x_N and public broadcast centres c_1..c_K (fuzzifier m),
the memberships u_ij = u_j(x_i; c) are a *known* function of x_i (eq. 5). The server reads,
in plain (no secure aggregator):

* federated-averaging rounds (``train.fedavg``): S_j = sum_i u_ij^m x_i and
  W_j = sum_i u_ij^m (K (d + 1) equations per round);
* FedFCM rounds with k-means averaging (``train.local_fcm``, set-fields): the local
  centres the client's deterministic local FCM (eqs. 5-6 iterated to ``local_tol``) reaches
  from the broadcast centres -- the server re-runs that computation on a candidate X;
* the FedFuzzDB validity round (``validity``): N_l, sum_i u_ij and sum_i ||x_i - c_j||^q.

The unknowns are N d numbers; every round adds K (d + 1) (fedavg) or K d (local FCM)
equations, so for small N the system is heavily over-determined. Solve:

* N is read from the validity round when the server saw it; otherwise N = 1, 2, ...
  ``max_records`` are tried in turn (bounded below by sum_j W_j, since sum_j u_ij^m <= 1);
* N = 1: closed form -- S_j / W_j is the record (exact from one fedavg round), a local FCM
  centre of a one-record client *is* the record, and the validity spreads trilaterate it
  (q = 1: ||x - c_j||^2 = spread_j^2 is linear in x after differencing);
* N >= 2: nonlinear least squares (``scipy.optimize.least_squares``) over up to
  ``max_rounds`` rounds, multi-start from N-subsets of the per-round weighted means
  S_j / W_j and local centres (each a convex combination of the client's records);
* a solution is claimed only if it reproduces **every** observed message of the client
  to ``residual_tol`` (relative to the messages' scale). Exact messages have one solution
  up to the order of the records (generically, for K (d + 1) > N d), so a zero residual
  is the certificate; claims are therefore exact reconstructions, not estimates.

Limits (honest):

* it targets clients with at most ``max_records`` records (the search over starts grows
  with N; for N of tens of records local optima dominate);
* for N >= 2 the multi-start can fail to find the global optimum: a client is then left
  out, never guessed;
* a local FCM round stops at ``local_tol``; if the client's floating-point iteration is
  chaotic near a tie, the re-run on the solution may take a different number of steps;
  such rounds only make the residual non-zero (no claim), not a wrong claim;
* records exactly on a broadcast centre (distance 0) make eq. 5 degenerate: the solver
  uses the library's own membership function, which handles it the way the client did.

When the transcript says the stack perturbs each client's messages (``Rounding``, local or
distributed ``GaussianDP``: ``meta["client_messages_exact"]`` is False, public protocol
knowledge), only the closed forms of one-record clients are tried: no exact solution exists,
and the iterative search would only burn time (minutes a cell on 64-d data).

Defeated by: secure aggregation for the sum-fields (fedavg FCM and the validity round
under ``PairwiseMasking`` / ``Paillier``: no per-client message), DP noise (the system no
longer has an exact solution; a least-squares fit is an estimate, not a claim). *Not* by
masking for FedFCM with k-means averaging: its local centres are set-fields and go to the
server in plain (``secure_mode=True`` moves them into secure sums).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares

from securefkm.kernels import (
    exact_sq_distances,
    fuzzy_memberships,
    local_fcm,
    membership_weights,
)
from securefkm.exceptions import InputError

from .passive import _check_tol, _check_transcript
from .report import LeakageReport, score_reconstructions


def _client_systems(transcript):
    """{client: {"fedavg": [(C, m, S, W)], "local": [(C, params, centres)], "validity": [(C, m, q, n, memb, spread)]}}"""
    out: dict[int, dict] = {}
    for rec in transcript:
        if rec.aborted is not None:
            continue
        plain = rec.plain_sums()
        for c, b in rec.broadcasts.items():
            if b is None or b.centres is None:
                continue
            C = np.asarray(b.centres, dtype=np.float64)
            sys_ = out.setdefault(c, {"fedavg": [], "local": [], "validity": []})
            msg = plain.get(c)
            if b.action == "train.fedavg" and msg is not None and "weighted_sums" in msg:
                sys_["fedavg"].append((C, float(b.params["m"]), np.asarray(msg["weighted_sums"], float),
                                       np.asarray(msg["weights"], float)))
            elif b.action == "validity" and msg is not None and "spread" in msg:
                sys_["validity"].append((C, float(b.params["m"]), float(b.params["q"]), float(msg["n"][0]),
                                         np.asarray(msg["memberships"], float), np.asarray(msg["spread"], float)))
            elif b.action == "train.local_fcm" and not b.params.get("secure"):
                items = rec.items.get(c)
                if items is not None and len(items.get("centres", ())) == len(C):
                    sys_["local"].append((C, dict(b.params), np.asarray(items["centres"], float)))
    return {c: s for c, s in out.items() if s["fedavg"] or s["local"] or s["validity"]}


def _residuals(X, sys_, scale, surrogate=False):
    """Stacked, scale-normalised residuals of every observed message for candidate records X.

    ``surrogate``: for local FCM rounds use the smooth fixed-point equation the returned
    local centres satisfy up to ``local_tol`` (c_j = sum_i u_ij(c)^m x_i / sum_i u_ij(c)^m,
    memberships w.r.t. the returned centres) instead of re-running the client's iterations
    (exact but piecewise: the step count changes with X). Used for the first fit only.
    """
    parts = []
    for C, m, S, W in sys_["fedavg"]:
        U = membership_weights(X, C, m)  # the client's own computation of u_ij^m
        parts.append(((U.T @ X) - S).ravel() / scale)
        parts.append(U.sum(axis=0) - W)
    for C, m, q, _n, memb, spread in sys_["validity"]:
        U = fuzzy_memberships(X, C, m)
        parts.append(U.sum(axis=0) - memb)
        parts.append((np.sqrt(exact_sq_distances(X, C)) ** q).sum(axis=0) / scale**q - spread / scale**q)
    for C, p, local in sys_["local"]:
        if surrogate:
            U = fuzzy_memberships(X, local, p["m"]) ** p["m"]
            w = U.sum(axis=0)
            got = (U.T @ X) / np.maximum(w, 1e-300)[:, None]
        else:
            got, _, _ = local_fcm(X, C, p["m"], p["local_tol"], p["max_local_iter"])
        parts.append((got - local).ravel() / scale)
    return np.concatenate(parts) if parts else np.zeros(0)


def _subsample(sys_, max_rounds):
    """At most ``max_rounds`` observations of each kind, spread over the run (for the fit)."""
    out = {}
    for key, obs in sys_.items():
        if len(obs) > max_rounds:
            idx = np.unique(np.linspace(0, len(obs) - 1, max_rounds).round().astype(int))
            obs = [obs[i] for i in idx]
        out[key] = obs
    return out


def _anchor_points(sys_):
    """Points that are convex combinations of the client's records (start candidates)."""
    pts = []
    for _C, _m, S, W in sys_["fedavg"]:
        nz = W > 1e-12
        pts.append(S[nz] / W[nz, None])
    for _C, _p, local in sys_["local"]:
        pts.append(local)
    return np.vstack(pts) if pts else np.zeros((0, 0))


def size_bounds(sys_, rtol: float = 1e-8) -> tuple[int, int]:
    """(lo, hi): every N for which the client's messages can have an exact solution lies in
    [lo, hi] (hi < lo: none). Necessary conditions, each exact for exact messages:

    * a validity round reads N itself (sum_j sum_i u_ij = N);
    * fedavg round: W_j = sum_i u_ij^m > 0, and with sum_j u_ij = 1 and m >= 1 the power-mean
      inequality gives K^(1-m) <= sum_j u_ij^m <= 1 per record, so
      sum_j W_j <= N <= K^(m-1) sum_j W_j;
    * every anchor (a fedavg mean S_j / W_j or a local FCM centre, eq. 6) is a convex
      combination of the N records, so all anchors of all rounds lie in the records' affine
      hull, of dimension <= N - 1: N >= 1 + the anchors' affine rank.

    Noisy or rounded messages (local DP, Rounding) break these identities; they then prune
    the sizes no exact solution exists for anyway (the solver claims only exact solutions),
    which is what keeps the attack cheap on 64-d data with tens of records per client.
    """
    ns = {int(round(v[3])) for v in sys_["validity"]}
    if len(ns) > 1:
        return 1, 0
    lo, hi = (ns.pop(),) * 2 if ns else (1, np.iinfo(np.int64).max)
    for C, m, _S, W in sys_["fedavg"]:
        if not np.all(np.isfinite(W)) or np.any(W <= 0):
            return 1, 0
        total = float(W.sum())
        lo = max(lo, int(np.ceil(total * (1 - 1e-9))))
        hi = min(hi, int(np.floor(total * len(C) ** (m - 1.0) * (1 + 1e-9))))
    anchors = _anchor_points(sys_)
    if len(anchors) > 1:
        A = anchors - anchors.mean(axis=0)
        sv = np.linalg.svd(A, compute_uv=False)
        scale = max(1.0, float(np.max(np.abs(anchors))))
        rank = int(np.sum(sv > rtol * scale * np.sqrt(len(anchors))))
        lo = max(lo, rank + 1)
    return max(lo, 1), hi


def _trilaterate(C, spread, q):
    """One record from its distances to K >= d + 1 centres (q = 1 spreads of a one-record client)."""
    if q != 1.0 or len(C) < C.shape[1] + 1:
        return None
    r2 = spread**2
    A = 2.0 * (C[1:] - C[0])
    b = r2[0] - r2[1:] + np.einsum("ij,ij->i", C[1:], C[1:]) - C[0] @ C[0]
    x, *_ = np.linalg.lstsq(A, b, rcond=None)
    return x[None]


class _OverBudget(Exception):
    pass


class FuzzyEquationSolver:
    """Solve a client's FedFCM / fedavg-FCM / FedFuzzDB messages for its records (passive).

    ``max_records``: largest client size attacked; ``max_rounds``: observations of each
    kind used in the least-squares fit (all of them are used in the final check);
    ``n_starts``: multi-start budget per (client, N); ``residual_tol``: largest relative
    residual accepted as an exact solution; ``max_evaluations``: residual evaluations (one
    pass over a client's observed messages, finite-difference columns included) a client's
    search may use before it is given up -- deterministic, so results do not depend on the
    machine; the clients given up are listed in the report's ``clients_over_budget``. Exact
    messages of small clients are solved in a few hundred to a few thousand evaluations;
    messages coarsened by ``Rounding`` have no exact solution and used to cost minutes a
    client in 64 dimensions. See the module docstring for the equations,
    the paper and the limits.
    """

    name = "fuzzy-equations"

    def __init__(self, *, max_records: int = 3, max_rounds: int = 20, n_starts: int = 30, residual_tol: float = 1e-8,
                 max_evaluations: int = 20_000, random_state=0, tol_exact: float = 1e-6, tol_approx=None):
        for name, v, lo in (("max_records", max_records, 1), ("max_rounds", max_rounds, 1), ("n_starts", n_starts, 1),
                            ("max_evaluations", max_evaluations, 1)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise InputError(f"{name} must be an int >= {lo}, got {v!r}.")
        self.max_records = int(max_records)
        self.max_rounds = int(max_rounds)
        self.n_starts = int(n_starts)
        self.max_evaluations = int(max_evaluations)
        self.residual_tol = _check_tol(residual_tol, "residual_tol")
        self.random_state = random_state
        self.tol_exact = _check_tol(tol_exact, "tol_exact")
        self.tol_approx = None if tol_approx is None else _check_tol(tol_approx, "tol_approx")

    # ------------------------------------------------------------------ one client
    def _sizes(self, sys_):
        """The client sizes N for which an exact solution can exist (see :func:`size_bounds`)."""
        lo, hi = size_bounds(sys_, self.residual_tol)
        return list(range(lo, min(hi, self.max_records) + 1))

    def solve_client(self, sys_, rng, exact_messages: bool = True):
        """Records (N, d) that reproduce every message of the client, or None (also when the
        client's search used up ``max_evaluations``: :attr:`over_budget` says so)."""
        self.over_budget = False
        self._evaluations = 0
        try:
            return self._solve_client(sys_, rng, exact_messages)
        except _OverBudget:
            self.over_budget = True
            return None

    def _count(self, k: int = 1) -> None:
        self._evaluations += k
        if self._evaluations > self.max_evaluations:
            raise _OverBudget

    def _solve_client(self, sys_, rng, exact_messages=True):
        scale = 1.0
        for C, *_ in sys_["fedavg"] + sys_["local"] + sys_["validity"]:
            scale = max(scale, float(np.max(np.abs(C))))
        local_only = not sys_["fedavg"] and not sys_["validity"]
        # re-running local FCM is costly and without a count the sizes are guessed: fewer
        # rounds in the fit and fewer starts (the final check still uses every round)
        fit_sys = _subsample(sys_, self.max_rounds)
        fit_sys["local"] = _subsample({"local": sys_["local"]}, min(self.max_rounds, 3))["local"]
        n_starts = min(self.n_starts, 8) if local_only else self.n_starts
        anchors = _anchor_points(sys_)
        d = next(iter(sys_["fedavg"] + sys_["local"] + sys_["validity"]))[0].shape[1]
        # rounded or client-noised messages (transcript meta): no exact solution exists, so only
        # the closed forms of one-record clients are tried, not the iterative search
        for n in [n for n in self._sizes(sys_) if exact_messages or n == 1]:
            starts = []
            if n == 1:
                if len(anchors):
                    starts.append(anchors[:1])
                for C, _m, q, _n, _memb, spread in sys_["validity"]:
                    x = _trilaterate(C, spread, q)
                    if x is not None:
                        starts.append(x)
            if n >= 2 and len(anchors) >= n:
                # the anchors are convex combinations of the records: the most spread-out
                # subset (greedy farthest points) starts near the records themselves
                idx = [int(np.argmax(np.linalg.norm(anchors - anchors.mean(axis=0), axis=1)))]
                while len(idx) < n:
                    dist = np.min(np.linalg.norm(anchors[:, None] - anchors[idx][None], axis=2), axis=1)
                    idx.append(int(np.argmax(dist)))
                starts.append(anchors[idx].copy())
            pool = anchors if len(anchors) else None
            for _ in range(n_starts):
                if pool is not None and len(pool) >= n:
                    X0 = pool[rng.choice(len(pool), n, replace=False)] + 1e-3 * scale * rng.standard_normal((n, d))
                else:
                    X0 = scale * rng.uniform(-1, 1, (n, d))
                starts.append(X0)
            for X0 in starts:
                X = self._fit(X0, fit_sys, scale)
                if X is None:
                    continue
                self._count()
                r = _residuals(X, sys_, scale)
                if r.size and np.max(np.abs(r)) <= self.residual_tol:
                    return X
        return None

    def _fit(self, X0, sys_, scale):
        n, d = X0.shape
        self._count()
        first = _residuals(X0, sys_, scale)
        if first.size and np.max(np.abs(first)) <= 1e-14:
            return X0
        if first.size < n * d:
            return None
        def lm(x, surrogate):
            tol = 1e-10 if surrogate else 1e-15  # the surrogate is only right to ~local_tol
            def f(v):
                self._count()
                return _residuals(v.reshape(n, d), sys_, scale, surrogate)

            return least_squares(f, x, method="lm",
                                 xtol=tol, ftol=tol, gtol=tol, max_nfev=(30 if surrogate else 200) * (n * d + 1))

        x = X0.ravel()
        try:
            if sys_["local"]:
                # exact stage from the better of the start and the surrogate's solution (the
                # surrogate is degenerate when local centres sit on records); skip hopeless starts
                cands = [x, lm(x, True).x]
                self._count(2)
                errs = [np.max(np.abs(_residuals(c.reshape(n, d), sys_, scale))) for c in cands]
                if min(errs) > 1e-2:
                    return None
                x = cands[int(np.argmin(errs))]
            x = lm(x, False).x
        except (ValueError, FloatingPointError):
            return None
        return x.reshape(n, d)

    # ------------------------------------------------------------------ attack
    def claims(self, transcript):
        transcript = _check_transcript(transcript)
        rng = np.random.default_rng(self.random_state)
        systems = _client_systems(transcript)
        claims, solved, over = [], [], []
        exact = bool(transcript.meta.get("client_messages_exact", True))
        for c in sorted(systems):
            X = self.solve_client(systems[c], rng, exact)
            if self.over_budget:
                over.append(c)
            if X is not None:
                solved.append(c)
                claims.extend((c, x) for x in X)
        rounds = sum(1 for r in transcript if r.action in ("train.fedavg", "train.local_fcm", "validity"))
        return claims, {"clients_solved": solved, "clients_with_plain_messages": len(systems),
                        "clients_over_budget": over, "exact_messages": exact}, rounds

    def evaluate(self, transcript, dataset) -> LeakageReport:
        claims, extra, rounds = self.claims(transcript)
        return score_reconstructions(
            claims, dataset, attack=self.name, tol_exact=self.tol_exact, tol_approx=self.tol_approx,
            rounds_used=rounds, extra=extra,
        )
