"""Active (malicious server) attacks: they act only through a :class:`ServerPolicy`.

``Attack(...).evaluate(estimator, dataset)`` builds the estimator's algorithm
(``estimator._make_algorithm``), runs a :class:`~securefkm.federation.Federation` over the
dataset with the estimator's protection stack and the attack's malicious policy, drives
the rounds itself (a malicious server decides how many rounds it runs) and scores the
claims. The dataset is used by the simulation (the clients) and for scoring only; the
attack logic sees the transcript records the policy observes.

* :class:`CraftedCentroids` -- slabs by binary search until each cell holds one record.
* :class:`ModelInconsistency` -- Pasquini et al. 2022: crafted centres for the target only.
* :class:`ActiveAggregateDifferencing` -- sample S and S minus {target} with one broadcast.
* :class:`Sybil` -- server-controlled clients with known inputs fill a secure round.
"""

from __future__ import annotations

import numpy as np

from securefkm.exceptions import InputError, RoundAbortedError
from securefkm.federation import Federation, ServerPolicy, clone_layers
from securefkm.messages import Broadcast

from ._cells import cell_fields, integer_counts
from .report import LeakageReport, client_arrays, score_reconstructions

_FAR = 1e6


# ------------------------------------------------------------------ slab search
def slab_positions(thresholds: np.ndarray) -> np.ndarray | None:
    """Positions p_1 < ... < p_{m+1} on a line whose Voronoi boundaries (midpoints) are the
    given thresholds t_1 < ... < t_m, or None if impossible.

    p_{j+1} = 2 t_j - p_j, so p_j = s_j p_1 + c_j; each constraint p_j < t_j bounds p_1.
    """
    t = np.asarray(thresholds, dtype=np.float64)
    m = len(t)
    if m == 0:
        return np.zeros(1)
    lo, hi = -np.inf, np.inf
    s, c = 1.0, 0.0
    coeffs = []
    for j in range(m):
        coeffs.append((s, c))
        if s > 0:
            hi = min(hi, t[j] - c)
        else:
            lo = max(lo, c - t[j])
        s, c = -s, 2 * t[j] - c
    if not lo < hi:
        return None
    if np.isfinite(lo):
        p1 = 0.5 * (lo + hi)
    else:
        p1 = hi - max(1.0, (t[-1] - t[0]))
    p = np.empty(m + 1)
    p[0] = p1
    for j in range(m):
        p[j + 1] = 2 * t[j] - p[j]
    if np.any(np.diff(p) <= 0):
        return None
    return p


class SlabSearch:
    """Binary search on a random direction until every cell holds one record.

    State: atoms = consecutive intervals of the projection z = v.x with their known count
    and coordinate sum. Each round proposes up to ``n_cells - 1`` thresholds (the mean of
    the largest unresolved atoms first: a split at an atom's mean projection always
    separates a non-constant atom), realised by collinear centres (:func:`slab_positions`).
    The observed per-slab counts and sums resolve the new pieces left to right.
    """

    def __init__(self, n_features: int, n_cells: int, rng: np.random.Generator):
        if n_cells < 1:
            raise InputError(f"the attack needs at least one usable centre, got {n_cells}.")
        v = rng.standard_normal(n_features)
        self.v = v / np.linalg.norm(v)
        self.d = n_features
        self.n_cells = n_cells
        self.atoms: list[list] | None = None  # [lo, hi, n, S]
        self.records: list[np.ndarray] = []
        self.thresholds = np.zeros(0)
        self.pending_split: dict[int, float] = {}

    @property
    def done(self) -> bool:
        return self.atoms is not None and not self.atoms

    def propose(self) -> np.ndarray:
        """Positions along v of the usable centres for the next round."""
        if self.atoms is None:
            self.thresholds = np.zeros(0)
            return slab_positions(self.thresholds)
        order = sorted(range(len(self.atoms)), key=lambda i: -self.atoms[i][2])
        cands = []
        for i in order:
            lo, hi, n, S = self.atoms[i]
            mu = float(self.v @ S) / n
            cands.append((0, mu))
        for i in order:
            lo, hi, n, S = self.atoms[i]
            mu = float(self.v @ S) / n
            if np.isfinite(lo):
                cands.append((1, 0.5 * (lo + mu)))
            if np.isfinite(hi):
                cands.append((1, 0.5 * (mu + hi)))
        cands.sort(key=lambda x: x[0])
        chosen: list[float] = []
        for _, t in cands:
            if len(chosen) >= self.n_cells - 1:
                break
            trial = np.sort(np.array(chosen + [t]))
            if np.any(np.diff(trial) <= 1e-12 * (1 + abs(t))):
                continue
            if slab_positions(trial) is not None:
                chosen.append(t)
        self.thresholds = np.sort(np.array(chosen))
        return slab_positions(self.thresholds)

    def observe(self, counts: np.ndarray, sums: np.ndarray) -> None:
        """Per-slab counts (m,) and sums (m, d) of the target for the last proposal."""
        counts = integer_counts(counts)
        sums = np.asarray(sums, dtype=np.float64)
        t = self.thresholds
        if self.atoms is None:
            n = float(counts.sum())
            self.atoms = [[-np.inf, np.inf, n, sums.sum(axis=0)]] if n > 0 else []
            self._harvest()
            return
        # pieces: (atom index, lo, hi, slab); unsplit atoms are known
        pieces = []
        for a, (lo, hi, _n, _S) in enumerate(self.atoms):
            inside = t[(t > lo) & (t < hi)]
            bounds = np.concatenate([[lo], inside, [hi]])
            for b in range(len(bounds) - 1):
                slab = int(np.searchsorted(t, bounds[b + 1], side="left")) if np.isfinite(bounds[b + 1]) else len(t)
                if not np.isfinite(bounds[b + 1]):
                    slab = len(t)
                pieces.append([a, bounds[b], bounds[b + 1], slab, None, None, len(inside) == 0])
        for p in pieces:
            if p[6]:
                p[4], p[5] = self.atoms[p[0]][2], self.atoms[p[0]][3]
        # slab totals: known resolved pieces of atoms that lie in the slab; records in
        # already-resolved (removed) atoms are also in slabs -> subtract known records
        slab_n = counts.astype(np.float64).copy()
        slab_S = sums.copy()
        if self.records:
            R = np.vstack(self.records)
            z = R @ self.v
            lab = np.searchsorted(t, z, side="left")
            slab_n -= np.bincount(lab, minlength=len(t) + 1)[: len(slab_n)]
            np.add.at(slab_S, lab, -R)
        progress = True
        while progress:
            progress = False
            for s in range(len(slab_n)):
                unk = [p for p in pieces if p[3] == s and p[4] is None]
                if len(unk) == 1:
                    kn = [p for p in pieces if p[3] == s and p[4] is not None]
                    unk[0][4] = slab_n[s] - sum(p[4] for p in kn)
                    unk[0][5] = slab_S[s] - sum((p[5] for p in kn), np.zeros(self.d))
                    progress = True
            for a in range(len(self.atoms)):
                mine = [p for p in pieces if p[0] == a]
                unk = [p for p in mine if p[4] is None]
                if len(unk) == 1:
                    kn = [p for p in mine if p[4] is not None]
                    unk[0][4] = self.atoms[a][2] - sum(p[4] for p in kn)
                    unk[0][5] = self.atoms[a][3] - sum((p[5] for p in kn), np.zeros(self.d))
                    progress = True
        new_atoms = []
        for a, (lo, hi, n, S) in enumerate(self.atoms):
            mine = [p for p in pieces if p[0] == a]
            if any(p[4] is None for p in mine):
                new_atoms.append([lo, hi, n, S])
                continue
            split = [p for p in mine if p[4] > 0.5]
            if len(split) == 1 and len(mine) > 1 and n >= 2:
                mu = float(self.v @ S) / n
                if any(abs(p[1] - mu) < 1e-9 * (1 + abs(mu)) or abs(p[2] - mu) < 1e-9 * (1 + abs(mu)) for p in mine):
                    # a split at the mean left every record on one side: all projections
                    # equal the mean, i.e. (w.p. 1 over v) n identical records
                    self.records.extend([S / n] * int(n))
                    continue
            for p in split:
                new_atoms.append([p[1], p[2], float(np.rint(p[4])), p[5]])
        self.atoms = new_atoms
        self._harvest()

    def _harvest(self):
        keep = []
        for atom in self.atoms:
            if atom[2] == 1:
                self.records.append(np.asarray(atom[3], dtype=np.float64).copy())
            elif atom[2] >= 2:
                keep.append(atom)
        self.atoms = keep


def _crafted_centres(search: SlabSearch, k: int, usable: list[int], rng) -> tuple[np.ndarray, list[int]]:
    """k centres: the usable ones on the search line, the rest far away (decoys)."""
    p = search.propose()
    d = search.d
    C = np.empty((k, d))
    far = rng.standard_normal((k, d))
    far /= np.linalg.norm(far, axis=1, keepdims=True)
    C[:] = _FAR * far
    cells = usable[: len(p)]
    C[cells] = p[:, None] * search.v[None, :]
    return C, cells


def _estimator_setup(estimator, dataset, extra_clients=()):
    if not hasattr(estimator, "_make_algorithm"):
        raise InputError(f"estimator must be a securefkm estimator (FederatedClusterer), got {type(estimator).__name__}.")
    clients = client_arrays(dataset) + [np.asarray(x, dtype=np.float64) for x in extra_clients]
    algorithm = estimator._make_algorithm(clients[0].shape[1], len(clients))
    for name, value in (("tol", 0.0), ("patience", None)):
        if hasattr(algorithm, name):
            setattr(algorithm, name, value)  # the malicious server decides when to stop
    return clients, algorithm


def _run(estimator, clients, algorithm, policy, max_rounds, random_state):
    layers = clone_layers(getattr(estimator, "protection", None))
    domain = estimator.declared_domain(clients[0].shape[1]) if hasattr(estimator, "declared_domain") else None
    for layer in layers:  # as a fit declares it (a validated sum needs the box)
        if domain is not None and hasattr(layer, "declare_domain"):
            layer.declare_domain(domain)
    fed = Federation(
        algorithm,
        clients,
        protection=layers,
        clients_per_round=getattr(estimator, "clients_per_round", 1.0),
        max_rounds=max_rounds,
        random_state=random_state,
        server_policy=policy,
        crypto=getattr(estimator, "crypto", "real"),  # the ideal functionality releases the same
        backend=getattr(estimator, "backend", "auto"),  # where the clients run changes nothing they send
        n_workers=getattr(estimator, "n_workers", None),
    )
    state = algorithm.init(len(clients), clients[0].shape[1], np.random.default_rng(random_state))
    aborted = []
    finished = False
    try:
        for t in range(max_rounds):
            try:
                state = fed.run_round(state, round=t)
            except RoundAbortedError as exc:
                aborted.append(str(exc))  # the runtime already told the policy (on_abort)
                if policy.stop_on_abort:
                    break
            if policy.done or algorithm.converged(state):
                break
        finished = True
    finally:  # the transcript stays; worker processes (backend) go, or are kept for the next fit
        fed.close(keep_workers=finished)
    return fed, aborted


class _AttackPolicy(ServerPolicy):
    stop_on_abort = True

    def __init__(self):
        self.rounds = 0
        self.aborts = 0

    @property
    def done(self) -> bool:
        return False

    def on_abort(self, record, error):
        self.aborts += 1


def _check_target(target, n_clients):
    if isinstance(target, bool) or not isinstance(target, (int, np.integer)) or not 0 <= target < n_clients:
        raise InputError(f"target must be a client id in [0, {n_clients}), got {target!r}.")
    return int(target)


def _check_rounds(max_rounds):
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, (int, np.integer)) or max_rounds < 2:
        raise InputError(f"max_rounds must be an int >= 2, got {max_rounds!r}.")
    return int(max_rounds)


class _SlabPolicy(_AttackPolicy):
    """Shared plumbing: read the target's per-cell counts/sums after each crafted round."""

    def __init__(self, target, k, d, usable, rng):
        super().__init__()
        self.target = target
        self.k = k
        self.rng = rng
        self.search = SlabSearch(d, len(usable), rng)
        self.usable = usable
        self.cells: list[int] = []
        self.crafted = False

    @property
    def done(self):
        return self.search.done

    def target_cells(self, record):  # -> (counts (k,), sums (k, d)) or None
        raise NotImplementedError

    def observe(self, record):
        if not self.crafted:
            return
        self.crafted = False
        got = self.target_cells(record)
        if got is None:
            return
        n, S = got
        self.rounds += 1
        self.search.observe(n[self.cells], S[self.cells])


class _CraftedPolicy(_SlabPolicy):
    def plan(self, state, round, broadcast, sampled, n_clients):
        if broadcast.action != "train" or broadcast.centres is None or self.search.done:
            return sampled, {c: broadcast for c in sampled}
        C, self.cells = _crafted_centres(self.search, self.k, self.usable, self.rng)
        self.crafted = True
        # the server reads the target's own message: it samples the target alone (the other
        # clients' messages would tell it nothing, and a simulation would pay for them)
        crafted = Broadcast(broadcast.action, centres=C, params=dict(broadcast.params), sample=broadcast.sample)
        return (self.target,), {self.target: crafted}

    def target_cells(self, record):
        pair = cell_fields(record.specs)
        msg = record.plain_sums().get(self.target)
        if pair is None or msg is None:
            return None
        return np.asarray(msg[pair[0]], float), np.asarray(msg[pair[1]], float)


class CraftedCentroids:
    """Malicious server: crafted centres make the target's Voronoi cells slabs, binary-searched
    until each cell holds one record (count 1 => the sum is the record).

    Threat model: the server chooses what each client receives and reads the target's
    per-cell counts and sums in plain (no secure aggregator). Each round it places the
    ``n_usable`` usable centres on a line (random direction v) so that the cell boundaries
    are thresholds at the mean projections of the unresolved intervals
    (:class:`SlabSearch`); the other centres are decoys far from any data. Every round
    separates at least one interval, so at most (records - 1) rounds are needed; about
    records / (n_usable - 1) in practice.

    Paper: the analogue of "trap weights" / malicious-server model manipulation (Boenisch
    et al. 2023, "When the curious abandon honesty"; Fowl et al. 2022) for k-means.

    Defeated by: secure aggregation (the server no longer sees one client's cells; see
    :class:`ModelInconsistency` and :class:`Sybil` for the ways around it), DP noise on the
    counts and sums. ``MinClusterSize`` does *not* stop it: counts of 1 are suppressed but
    the search still converges on cells of >= p records and differences of them (see docs).
    """

    name = "crafted-centroids"

    def __init__(self, target: int = 0, *, n_usable: int | None = None, max_rounds: int = 400, random_state=0,
                 tol_exact: float = 1e-6, tol_approx=None):
        self.target = target
        self.n_usable = n_usable
        self.max_rounds = _check_rounds(max_rounds)
        self.random_state = int(random_state)
        self.tol_exact = tol_exact
        self.tol_approx = tol_approx

    def _usable(self, k):
        n = k if self.n_usable is None else self.n_usable
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 2 <= n <= k:
            raise InputError(f"n_usable must be an int in [2, n_clusters={k}], got {self.n_usable!r}.")
        return list(range(int(n)))

    def _policy(self, target, k, d):
        return _CraftedPolicy(target, k, d, self._usable(k), np.random.default_rng(self.random_state))

    def evaluate(self, estimator, dataset) -> LeakageReport:
        clients, algorithm = _estimator_setup(estimator, dataset)
        target = _check_target(self.target, len(clients))
        k = int(getattr(algorithm, "n_clusters", estimator.n_clusters))
        policy = self._policy(target, k, clients[0].shape[1])
        fed, aborted = _run(estimator, clients, algorithm, policy, self.max_rounds, self.random_state)
        claims = [(target, x) for x in policy.search.records]
        return score_reconstructions(
            claims, dataset, attack=self.name, targets=[target], tol_exact=self.tol_exact, tol_approx=self.tol_approx,
            rounds_used=policy.rounds,
            extra={"completed": policy.search.done, "aborted_rounds": len(aborted), "detected": bool(aborted),
                   "abort_reasons": aborted[:3]},
        )


class _InconsistentPolicy(_SlabPolicy):
    """Target: crafted centres (cell 0 a decoy); everyone else: all records in cell 0."""

    def plan(self, state, round, broadcast, sampled, n_clients):
        if broadcast.action != "train" or broadcast.centres is None or self.search.done:
            return sampled, {c: broadcast for c in sampled}
        C, self.cells = _crafted_centres(self.search, self.k, self.usable, self.rng)
        C[0] = _FAR * np.ones(C.shape[1])  # reserved cell: no target record lands there
        others = np.full_like(C, _FAR)
        others[:] = C  # the far decoys...
        others[0] = 0.0  # ...and one centre near the data: every honest record falls in cell 0
        others[self.usable] = _FAR * (np.arange(len(self.usable))[:, None] + 2.0)
        self.crafted = True
        sampled = tuple(sorted(set(sampled) | {self.target}))
        mk = lambda centres: Broadcast(broadcast.action, centres=centres, params=dict(broadcast.params), sample=broadcast.sample)  # noqa: E731
        b_t, b_o = mk(C), mk(others)
        out = {c: b_o for c in sampled}
        out[self.target] = b_t
        return sampled, out

    def target_cells(self, record):
        pair = cell_fields(record.specs)
        if pair is None or record.aggregate is None:
            return None
        return np.asarray(record.aggregate[pair[0]], float), np.asarray(record.aggregate[pair[1]], float)


class ModelInconsistency(CraftedCentroids):
    """Pasquini et al. 2022 (CCS), "Eluding Secure Aggregation in Federated Learning via
    Model Inconsistency", for k-means.

    Threat model: malicious server under secure aggregation. The target gets crafted slab
    centres (:class:`CraftedCentroids`) with cell 0 reserved far away; every other sampled
    client gets centres that put all of its records in cell 0 (one centre near the data,
    the rest far away). Cells 1..k-1 of the secure sum are then the target's alone.

    Defeated by: binding the masks to the broadcast (``PairwiseMasking(bind_broadcast=True)``,
    the default): clients with different broadcasts derive different masks, the sum does
    not decode and the round aborts (``RoundAbortedError``) -- the attack is *detected*
    and recovers nothing. Also by DP noise on the aggregate. Not by ``MinClusterSize``
    on its own (the search proceeds on larger cells).
    """

    name = "model-inconsistency"

    def _usable(self, k):
        if k < 3:
            raise InputError(f"model inconsistency needs n_clusters >= 3 (one reserved cell), got {k}.")
        n = (k - 1) if self.n_usable is None else self.n_usable
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 2 <= n <= k - 1:
            raise InputError(f"n_usable must be an int in [2, n_clusters - 1 = {k - 1}], got {self.n_usable!r}.")
        return list(range(1, int(n) + 1))

    def _policy(self, target, k, d):
        return _InconsistentPolicy(target, k, d, self._usable(k), np.random.default_rng(self.random_state))


class _PairPolicy(_SlabPolicy):
    """Two rounds per step with one crafted broadcast for all: sampled S, then S minus {target}."""

    stop_on_abort = True

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.phase = 0
        self.current = None
        self.first = None
        self.first_set = None

    def plan(self, state, round, broadcast, sampled, n_clients):
        if broadcast.action != "train" or broadcast.centres is None or self.search.done:
            return sampled, {c: broadcast for c in sampled}
        if self.phase == 0:
            C, self.cells = _crafted_centres(self.search, self.k, self.usable, self.rng)
            self.current = Broadcast(broadcast.action, centres=C, params=dict(broadcast.params), sample=broadcast.sample)
            base = set(sampled) | {self.target}
            if len(base) < 3:
                base |= set(range(min(n_clients, 3)))
            self.first_set = tuple(sorted(base))
            return self.first_set, {c: self.current for c in self.first_set}
        second = tuple(c for c in self.first_set if c != self.target)
        return second, {c: self.current for c in second}

    def observe(self, record):
        if record.broadcasts and self.current is not None and all(
            b is self.current for b in record.broadcasts.values()
        ):
            pair = cell_fields(record.specs)
            if self.phase == 0:
                self.first = record
                self.phase = 1
                return
            self.phase = 0
            a, b = self.first, record
            if pair is None or a.aggregate is None or b.aggregate is None:
                return
            if set(a.contributors) - set(b.contributors) != {self.target} or not set(b.contributors) < set(a.contributors):
                return  # a dropout spoilt the pair; the next step retries
            n = np.asarray(a.aggregate[pair[0]], float) - np.asarray(b.aggregate[pair[0]], float)
            S = np.asarray(a.aggregate[pair[1]], float) - np.asarray(b.aggregate[pair[1]], float)
            self.rounds += 2
            self.search.observe(n[self.cells], S[self.cells])

    def on_abort(self, record, error):
        super().on_abort(record, error)
        self.phase = 0


class ActiveAggregateDifferencing(CraftedCentroids):
    """The server samples S and S minus {target} with the *same* broadcast, so the difference
    of the two secure sums is the target's message; with crafted slab centres (sent to all
    clients alike, so broadcast binding does not object) the differences drive the slab
    search of :class:`CraftedCentroids` (two rounds per step).

    Threat model: malicious server controlling sampling under secure aggregation
    (PairwiseMasking, Paillier) with or without broadcast binding.

    Paper: differencing on secure aggregation (Pasquini et al. 2022 sec. 2; Lam et al. 2021).

    Defeated by: DP noise on every released sum (the difference is noisy; no exact record
    comes out) together with a minimum number of participants per round (so that the
    server cannot shrink S to the target alone). Masking alone does not help.
    """

    name = "active-aggregate-differencing"

    def _policy(self, target, k, d):
        return _PairPolicy(target, k, d, self._usable(k), np.random.default_rng(self.random_state))


class _SybilPolicy(_SlabPolicy):
    def __init__(self, target, k, d, usable, rng, sybils, sybil_data, algorithm):
        super().__init__(target, k, d, usable, rng)
        self.sybils = tuple(sybils)
        self.sybil_data = sybil_data
        self.algorithm = algorithm
        self.current = None

    def plan(self, state, round, broadcast, sampled, n_clients):
        if broadcast.action != "train" or broadcast.centres is None or self.search.done:
            return sampled, {c: broadcast for c in sampled}
        C, self.cells = _crafted_centres(self.search, self.k, self.usable, self.rng)
        self.current = Broadcast(broadcast.action, centres=C, params=dict(broadcast.params), sample=broadcast.sample)
        self.crafted = True
        chosen = tuple(sorted((self.target,) + self.sybils))
        return chosen, {c: self.current for c in chosen}

    def target_cells(self, record):
        pair = cell_fields(record.specs)
        if pair is None or record.aggregate is None:
            return None
        if set(record.contributors) != {self.target, *self.sybils}:
            return None
        ups = self.algorithm.client_updates(self.sybil_data, self.current, [None] * len(self.sybil_data), [{} for _ in self.sybil_data])
        n = np.asarray(record.aggregate[pair[0]], float) - sum(np.asarray(u.sums[pair[0]], float) for u in ups)
        S = np.asarray(record.aggregate[pair[1]], float) - sum(np.asarray(u.sums[pair[1]], float) for u in ups)
        return n, S


class Sybil(CraftedCentroids):
    """Server-controlled clients with known inputs fill a secure round around the target.

    Threat model: the server can enrol ``n_sybils`` fake clients (no client authentication
    beyond the server's own PKI) whose records it chose. Each round it samples only the
    target and its sybils, sends all of them the same crafted slab centres (so broadcast
    binding does not object and the masking threshold is met by the sybils), and subtracts
    the sybils' known contributions from the secure sum: what is left is the target's.

    Paper: Sybil attacks on secure aggregation (Bonawitz et al. 2017 sec. 6 assume a
    bound on server-controlled clients; Pasquini et al. 2022 sec. 2).

    Defeated by: client authentication / admission control the server does not control,
    a minimum number of *honest* participants, DP noise on every sum (the attacker cannot
    remove the honest noise shares). The clients' run floor (a round must sample at least
    the declared cohort less the dropout allowance) makes the server enrol sybils for all
    of the floor but the target, not just a few.
    """

    name = "sybil"

    def __init__(self, target: int = 0, *, n_sybils: int = 3, sybil_records: int = 5, **kw):
        super().__init__(target, **kw)
        if isinstance(n_sybils, bool) or not isinstance(n_sybils, (int, np.integer)) or n_sybils < 1:
            raise InputError(f"n_sybils must be an int >= 1, got {n_sybils!r}.")
        self.n_sybils = int(n_sybils)
        self.sybil_records = int(sybil_records)

    def evaluate(self, estimator, dataset) -> LeakageReport:
        base = client_arrays(dataset)
        target = _check_target(self.target, len(base))
        rng = np.random.default_rng(self.random_state)
        lo = np.min([x.min(axis=0) for x in base if len(x)], axis=0)
        hi = np.max([x.max(axis=0) for x in base if len(x)], axis=0)
        sybil_data = [rng.uniform(lo, hi, (self.sybil_records, len(lo))) for _ in range(self.n_sybils)]
        clients, algorithm = _estimator_setup(estimator, dataset, sybil_data)
        k = int(getattr(algorithm, "n_clusters", estimator.n_clusters))
        sybils = tuple(range(len(base), len(clients)))
        policy = _SybilPolicy(target, k, clients[0].shape[1], self._usable(k), np.random.default_rng(self.random_state),
                              sybils, sybil_data, algorithm)
        fed, aborted = _run(estimator, clients, algorithm, policy, self.max_rounds, self.random_state)
        claims = [(target, x) for x in policy.search.records]
        return score_reconstructions(
            claims, base, attack=self.name, targets=[target], tol_exact=self.tol_exact, tol_approx=self.tol_approx,
            rounds_used=policy.rounds, extra={"completed": policy.search.done, "aborted_rounds": len(aborted), "detected": bool(aborted)},
        )
