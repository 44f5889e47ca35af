"""Passive (honest-but-curious server) reconstruction attacks: they read only a Transcript.

* :class:`SmallClusterDisclosure` -- a per-client cluster of size one *is* the record.
* :class:`Differencing` -- peeling across rounds of one client's plaintext messages.
* :class:`AggregateDifferencing` -- differences of secure aggregates whose contributor
  sets differ by one client.

All three return a :class:`~attacks.report.LeakageReport` via ``evaluate(transcript, dataset)``;
the dataset is used only to score the claims.
"""

from __future__ import annotations

import hashlib

import numpy as np
from scipy.optimize import linprog

from securefkm.kernels import assign
from securefkm.exceptions import InputError
from securefkm.transcript import RECORD_LEVELS, Transcript

from ._cells import (
    SEEDING_RAW_ACTIONS,
    cell_fields,
    dedup,
    full_data_round,
    integer_counts,
    verify_cells,
)
from .report import LeakageReport, score_reconstructions


def _check_transcript(transcript, needs: str = "full") -> Transcript:
    """The transcript, if it was recorded with at least the level the attack reads: ``"full"``
    for the clients' own messages, ``"aggregates"`` for the decoded aggregates. A transcript
    recorded with less would let the attack find nothing and report no leakage that a full
    record of the same fit would show, so it is refused instead."""
    if not isinstance(transcript, Transcript):
        raise InputError(
            f"transcript must be a securefkm.transcript.Transcript (estimator.transcript_), got {type(transcript).__name__}."
        )
    level = getattr(transcript, "level", "full")
    # RECORD_LEVELS lists the levels from the one that keeps most
    if level in RECORD_LEVELS and RECORD_LEVELS.index(level) > RECORD_LEVELS.index(needs):
        what = "each client's messages" if needs == "full" else "each round's aggregate"
        kept = "only the aggregates" if level == "aggregates" else "no rounds"
        fix = 'record="full" (the default)' if needs == "full" else 'record="aggregates" or "full"'
        raise InputError(
            f"this attack reads {what}, but the transcript was recorded with record={level!r}, "
            f"which keeps {kept}; fit again with {fix}."
        )
    return transcript


def _check_tol(tol, name):
    if not isinstance(tol, (int, float)) or tol < 0:
        raise InputError(f"{name} must be a non-negative number, got {tol!r}.")
    return float(tol)


def crisp_cells(specs):
    """(count field, sum field) of a round whose count field holds whole record counts
    (``FieldSpec.integer``), else None: fuzzy weights sum_i u_ij^m of about 1 are not one
    record, so singleton reading does not apply to them (see :mod:`attacks.fuzzy`)."""
    pair = cell_fields(specs)
    if pair is None:
        return None
    spec = next((s for s in specs if s.name == pair[0]), None)
    return pair if spec is not None and spec.integer else None


def singleton_claims(n, S, centres=None, verify=True):
    """Cells of one message with count 1: (cells, records). Verified against the centres."""
    n = integer_counts(n)
    j = np.flatnonzero(n == 1)
    X = np.asarray(S, dtype=np.float64)[j]
    if verify and centres is not None and len(j):
        ok = verify_cells(X, centres, j)
        j, X = j[ok], X[ok]
    return j, X


class SmallClusterDisclosure:
    """A client's cluster of size one reveals the record; size c reveals the mean of c records.

    Threat model: honest-but-curious server reading the per-client messages it receives in
    plain (no secure aggregator): DWF weights + weighted centres (the sum over a cell of
    size 1 is the record), the local clusters with sizes that k-FED, Garst's FKM and the
    child/parent one-shot send as set-fields, the cells of mini-batch federated k-means
    (Triebe et al.). With ``include_seeding`` the raw records that k-means++ / random
    seeding sends to the server are counted too (reported apart in ``extra``).

    Paper: the leak is the one Holzer et al. (2023, DWF) and Stallmann & Wilbik (2022) warn
    about when a client's cluster is small.

    Defeated by: secure aggregation (PairwiseMasking, Paillier) for sum-fields,
    ``MinClusterSize(p)`` (suppresses clusters below p records: no size-one cells), local
    DP noise. Not by rounding alone.

    ``max_mean_size``: cells of 2..max_mean_size records are reported as revealed means in
    ``extra["means_revealed"]`` ({size: count}).
    """

    name = "small-cluster"

    def __init__(self, *, include_seeding: bool = True, max_mean_size: int = 5, tol_exact: float = 1e-6, tol_approx=None):
        if not isinstance(max_mean_size, (int, np.integer)) or max_mean_size < 1:
            raise InputError(f"max_mean_size must be an int >= 1, got {max_mean_size!r}.")
        self.include_seeding = bool(include_seeding)
        self.max_mean_size = int(max_mean_size)
        self.tol_exact = _check_tol(tol_exact, "tol_exact")
        self.tol_approx = None if tol_approx is None else _check_tol(tol_approx, "tol_approx")

    def claims(self, transcript):
        """(claims, extra): claims are (client, record) pairs read from the transcript."""
        transcript = _check_transcript(transcript)
        claims, means = [], {}
        n_seed = 0
        rounds = 0
        for rec in transcript:
            used = False
            pair = crisp_cells(rec.specs)
            plain = rec.plain_sums()
            if pair is not None and plain:
                cn, sn = pair
                for c, msg in plain.items():
                    if cn not in msg or sn not in msg:
                        continue
                    b = rec.broadcasts.get(c)
                    centres = None if b is None else b.centres
                    n = integer_counts(msg[cn])
                    _, X = singleton_claims(n, msg[sn], centres if full_data_round(rec) else None)
                    claims.extend((c, x) for x in X)
                    for size in range(2, self.max_mean_size + 1):
                        hits = int(np.sum(n == size))
                        if hits:
                            means[size] = means.get(size, 0) + hits
                    used = True
            for c, items in rec.items.items():
                cen = items.get("centres")
                if cen is None or len(cen) == 0:
                    continue
                sizes = items.get("sizes")
                if sizes is not None:
                    sizes = integer_counts(sizes)
                    claims.extend((c, x) for x in np.asarray(cen)[sizes == 1])
                    for size in range(2, self.max_mean_size + 1):
                        hits = int(np.sum(sizes == size))
                        if hits:
                            means[size] = means.get(size, 0) + hits
                    used = True
                elif self.include_seeding and rec.action in SEEDING_RAW_ACTIONS:
                    claims.extend((c, x) for x in np.asarray(cen))
                    n_seed += len(cen)
                    used = True
            rounds += used
        return claims, {"means_revealed": means, "seeding_records_claimed": n_seed}, rounds

    def evaluate(self, transcript, dataset) -> LeakageReport:
        claims, extra, rounds = self.claims(transcript)
        return score_reconstructions(
            claims, dataset, attack=self.name, tol_exact=self.tol_exact, tol_approx=self.tol_approx,
            rounds_used=rounds, extra=extra,
        )


def _seeding_records(transcript) -> dict[int, np.ndarray]:
    """Raw records each client sent for k-means++ / random seeding: {client: (m, d)}."""
    out: dict[int, list] = {}
    for rec in transcript:
        if rec.action not in SEEDING_RAW_ACTIONS:
            continue
        for c, items in rec.items.items():
            cen = items.get("centres")
            if cen is not None and len(cen):
                out.setdefault(c, []).append(np.asarray(cen, dtype=np.float64))
    return {c: np.vstack(v) for c, v in out.items()}


def _client_observations(transcript, client, pair_for=cell_fields):
    """One client's full-data training rounds: (centres (T,k,d), counts (T,k), sums (T,k,d))."""
    Cs, Ns, Ss = [], [], []
    for rec in transcript:
        if rec.aborted is not None or not full_data_round(rec):
            continue
        pair = pair_for(rec.specs)
        if pair is None:
            continue
        msg = rec.plain_sums().get(client)
        if msg is None:
            continue
        b = rec.broadcasts.get(client)
        Cs.append(np.asarray(b.centres, dtype=np.float64))
        Ns.append(integer_counts(msg[pair[0]]))
        Ss.append(np.asarray(msg[pair[1]], dtype=np.float64))
    if not Cs:
        return None
    shapes = {C.shape for C in Cs}
    if len(shapes) != 1:  # different k across runs: keep the most common shape
        common = max(shapes, key=lambda s: sum(C.shape == s for C in Cs))
        keep = [i for i, C in enumerate(Cs) if C.shape == common]
        Cs, Ns, Ss = [Cs[i] for i in keep], [Ns[i] for i in keep], [Ss[i] for i in keep]
    return np.stack(Cs), np.stack(Ns), np.stack(Ss)


def _cell_halfspaces(C: np.ndarray, j: int):
    """(A, b) with {x: A x <= b} = Voronoi cell j of the centres C."""
    others = np.delete(np.arange(len(C)), j)
    # ||x-c_j||^2 <= ||x-c_m||^2  <=>  2 (c_m - c_j).x <= |c_m|^2 - |c_j|^2
    return 2.0 * (C[others] - C[j]), np.einsum("ij,ij->i", C[others], C[others]) - C[j] @ C[j]


def _shrunk(b: np.ndarray) -> np.ndarray:
    # a region thinner than ~1e-12 counts as empty (a record exactly on a bisector has
    # probability zero); a looser tolerance would only make regions look non-empty
    return b - 1e-12 * (1 + np.abs(b))


def clip_polygon(P: np.ndarray, A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Convex polygon P (m, 2), vertices in order, clipped by the half-planes A x <= b."""
    for a, beta in zip(A, b):
        v = P @ a - beta
        inside = v <= 0
        if inside.all():
            continue
        if not inside.any():
            return P[:0]
        out = []
        m = len(P)
        for i in range(m):
            j = (i + 1) % m
            if inside[i]:
                out.append(P[i])
            if inside[i] != inside[j]:
                out.append(P[i] + (v[i] / (v[i] - v[j])) * (P[j] - P[i]))
        P = np.asarray(out)
    return P


class _Witnesses:
    """Points known to lie in the box, with their Voronoi cell in every round: a region that
    contains one of them is non-empty without a linear programme. Shared by the regions of
    one attack run (same centres); holds the move candidates of a peel step (mostly real
    records, which lie in the regions a moving record would) and the interior points the
    LPs find."""

    MAX = 4096

    def __init__(self, C):
        self.C = C
        self.points = np.zeros((0, C.shape[2]))
        self.labels = np.zeros((0, C.shape[0]), dtype=np.intp)
        self.answers: dict = {}  # (box, cells) -> non-empty? (regions recur across peel steps)

    def add(self, X) -> None:
        X = np.asarray(X, dtype=np.float64).reshape(-1, self.C.shape[2])
        if not len(X):
            return
        lab = np.stack([assign(X, self.C[t])[0] for t in range(len(self.C))], axis=1)
        self.points = np.vstack([self.points, X])[-self.MAX :]
        self.labels = np.vstack([self.labels, lab])[-self.MAX :]

    def inside(self, cells, A, b, low, high) -> bool:
        """True when a stored point lies in every cell of ``cells`` and (checked exactly) in
        {A x <= b} and the box."""
        if not len(self.points) or not cells:
            return False
        t, j = np.array(cells).T
        for i in np.flatnonzero(np.all(self.labels[:, t] == j, axis=1))[:4]:
            x = self.points[i]
            if np.all(A @ x <= b) and np.all(x >= low) and np.all(x <= high):
                return True
        return False


class _Region:
    """Polytopes {x in box: x in cell j_1 of C_{t_1}, ..., cell j_n of C_{t_n}}: is one empty?

    2-D: exact clipping of the box polygon (fast); otherwise a stored point that lies in the
    region (:class:`_Witnesses`), or one linear programme."""

    def __init__(self, C, low, high, witnesses: _Witnesses | None = None):
        self.C, self.low, self.high = C, low, high
        self._rows: dict = {}
        self.base_rows = np.zeros((0, C.shape[2])), np.zeros(0)
        self.base_cells: list = []
        self.base_poly = self._box() if C.shape[2] == 2 else None
        self.n_checks = 0
        self.witnesses = witnesses if witnesses is not None else _Witnesses(C)

    def _box(self):
        lo, hi = self.low, self.high
        return np.array([[lo[0], lo[1]], [hi[0], lo[1]], [hi[0], hi[1]], [lo[0], hi[1]]], dtype=np.float64)

    def rows(self, cells):
        """Stacked (A, b) of the cells [(t, j), ...]."""
        parts = []
        for key in cells:
            if key not in self._rows:
                self._rows[key] = _cell_halfspaces(self.C[key[0]], key[1])
            parts.append(self._rows[key])
        if not parts:
            return np.zeros((0, self.C.shape[2])), np.zeros(0)
        return np.vstack([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def confine(self, cells):
        """Every region below is also inside these cells (a known confinement)."""
        A, b = self.rows(cells)
        self.base_rows = A, b
        self.base_cells = list(cells)
        if self.base_poly is not None:
            self.base_poly = clip_polygon(self._box(), A, _shrunk(b)) if len(A) else self._box()

    def nonempty(self, cells) -> bool:
        self.n_checks += 1
        A, b = self.rows(cells)
        if self.base_poly is not None:
            return len(self.base_poly) > 0 and len(clip_polygon(self.base_poly, A, _shrunk(b))) > 0
        A = np.vstack([self.base_rows[0], A])
        b = _shrunk(np.concatenate([self.base_rows[1], b]))
        all_cells = sorted(set(self.base_cells) | set(cells))
        key = (self.low.tobytes(), self.high.tobytes(), tuple(all_cells))
        if key not in self.witnesses.answers:
            self.witnesses.answers[key] = self._nonempty(all_cells, A, b)
        return self.witnesses.answers[key]

    def _nonempty(self, cells, A, b) -> bool:
        # in 64-d nearly every region checked is non-empty, and a stored point proves it
        # without an LP; emptiness still needs the LP
        if self.witnesses.inside(cells, A, b, self.low, self.high):
            return True
        # feasibility as the Chebyshev-centre LP (max r: A x + r |A_i| <= b, r >= 0): the same
        # answer, and the point it returns lies deep inside, a witness for later regions
        d = A.shape[1]
        A_r = np.hstack([A, np.linalg.norm(A, axis=1)[:, None]])
        c = np.zeros(d + 1)
        c[-1] = -1.0
        res = linprog(c, A_ub=A_r, b_ub=b, bounds=[*zip(self.low, self.high), (0, float(np.max(self.high - self.low)))],
                      method="highs")
        if res.status == 0:
            self.witnesses.add(res.x[:d])
        return res.status == 0


def _groups(F: np.ndarray, tol: float) -> np.ndarray:
    """Group id of each row of F: rows equal within tol (after a lexicographic sort) share one."""
    order = np.lexsort(F.T[::-1])
    same = np.all(np.abs(np.diff(F[order], axis=0)) <= tol, axis=1)
    g = np.empty(len(F), dtype=np.intp)
    g[order] = np.concatenate([[0], np.cumsum(~same)])
    return g


def _subtract_known(C, N, S, known):
    Nr, Sr = N.copy(), S.copy()
    k = N.shape[1]
    for t in range(len(C)):
        lab = assign(known, C[t])[0]
        Nr[t] -= np.bincount(lab, minlength=k)
        np.add.at(Sr[t], lab, -known)
    return Nr, Sr


def peel(C, N, S, *, bounds=None, known=None, max_iter: int = 50, max_gap: int | None = None, agree_rtol: float = 1e-9,
         witnesses: _Witnesses | None = None):
    """Differencing to a fixpoint on one client's per-round cells.

    ``C`` (T, k, d) the centres the client got, ``N`` (T, k) its counts, ``S`` (T, k, d) its
    per-cell coordinate sums; ``bounds`` = (low, high) arrays, a box known to hold the
    client's records; ``known`` (m, d) records of this client already known (e.g. the raw
    records its k-means++ seeding sent). Returns all known records (m', d) and the
    iterations used.

    Each iteration works on the *residual* cells (every known record subtracted from the
    cell it falls in, in every round -- its cell follows from the public centres) and:

    1. groups rounds into *states*: rounds whose residual cells have equal counts and sums
       hold the same records in every cell (records in general position: two different
       sets of records do not have equal sums), and per cell the rounds in which that cell
       holds the same records;
    2. confines the unknown records: in a state with a single non-empty cell they all lie in
       that cell in every round of the state (an intersection of Voronoi cells);
    3. reads a residual cell of count 1 as a record;
    4. for every ordered pair of states (a, b) and every cell l that holds one record more
       at b than at a: the cell gained I and lost O with |I| - |O| = 1 and
       ``S_b[l] - S_a[l] = sum(I) - sum(O)``. If no unknown record can have left l, i.e.
       for every cell m whose content changed between a and b (a cell whose count and sum
       did not change gained and lost nothing, general position again) the region {x in
       the confinement: in cell l in every round where l holds what it holds at a, in cell
       m in every round where m holds what it holds at b} is empty, then O is empty, I is
       one record, and the sum difference is that record. Cheap necessary conditions (the
       candidate lies in l at b, outside l at a, and in a non-empty residual cell in every
       state) filter candidates before the region test.

    ``max_gap``: compare only states with rounds at most ``max_gap`` apart (None: all
    pairs). Stops at a fixpoint, or when the residuals become inconsistent (a negative
    count).

    Assumption (stated in the docs): records in general position -- true with probability
    one for continuous data; data on a coarse grid could in principle satisfy a sum
    coincidence and give a wrong claim.
    """
    T, k, d = S.shape
    known = np.zeros((0, d)) if known is None else np.asarray(known, dtype=np.float64).reshape(-1, d)
    scale = 1.0 + float(np.max(np.abs(S))) if S.size else 1.0
    tol = agree_rtol * scale
    if bounds is None:
        lo = C.reshape(-1, d).min(axis=0)
        hi = C.reshape(-1, d).max(axis=0)
        w = np.maximum(hi - lo, 1e-12)
        bounds = (lo - w, hi + w)
    low, high = (np.broadcast_to(np.asarray(b, dtype=np.float64), (d,)) for b in bounds)
    witnesses = _Witnesses(C) if witnesses is None else witnesses
    iters = 0
    for it in range(1, max_iter + 1):
        iters = it
        Nr, Sr = _subtract_known(C, N, S, known) if len(known) else (N.copy(), S.copy())
        if np.any(Nr < 0) or not np.any(Nr > 0):
            break
        new = _peel_step(C, Nr, Sr, low, high, tol, max_gap, witnesses)
        if len(new) == 0:
            break
        new = dedup(new, tol)
        if len(known):
            dist = np.min(np.abs(new[:, None, :] - known[None, :, :]).max(axis=2), axis=1)
            new = new[dist > tol]
        if len(new) == 0:
            break
        known = np.vstack([known, new])
        if d > 2:
            witnesses.add(new)
    return known, iters


def _peel_step(C, Nr, Sr, low, high, tol, max_gap, witnesses=None):
    """One peel iteration on residual cells: the records it certifies (see :func:`peel`)."""
    T, k, d = Sr.shape
    sid = _groups(np.hstack([Nr, Sr.reshape(T, -1)]), tol)
    n_states = int(sid.max()) + 1
    members = [np.flatnonzero(sid == s) for s in range(n_states)]
    rep = np.array([m[0] for m in members])
    Ns, Ss = Nr[rep], Sr[rep]
    occ = Ns > 0
    cell_gid = np.stack([_groups(np.hstack([Nr[:, j : j + 1], Sr[:, j]]), tol) for j in range(k)], axis=1)

    def same_content(t, j):  # rounds in which cell j holds what it holds in round t
        return [(int(u), j) for u in np.flatnonzero(cell_gid[:, j] == cell_gid[t, j])]

    region = _Region(C, low, high, witnesses)
    single = np.flatnonzero(occ.sum(axis=1) == 1)
    region.confine([(int(t), int(np.argmax(occ[s]))) for s in single for t in members[s]])
    found = []
    # (3) singletons
    ss, jj = np.nonzero(Ns == 1)
    if len(ss):
        X = Ss[ss, jj]
        ok = np.array([assign(X[i : i + 1], C[rep[ss[i]]])[0][0] == jj[i] for i in range(len(X))])
        found.append(X[ok])
    # (4) one record more in cell l at state b than at state a, and none can have left l
    ia, ib = np.nonzero(~np.eye(n_states, dtype=bool))
    if max_gap is not None and len(ia):
        # closest rounds of the two states (a state's rounds need not be contiguous)
        near = np.array([np.min(np.abs(members[a][:, None] - members[b][None, :])) <= max_gap for a, b in zip(ia, ib)])
        ia, ib = ia[near], ib[near]
    pp, ll = np.nonzero(Ns[ib] - Ns[ia] == 1)
    if len(pp):
        a, b = ia[pp], ib[pp]
        X = Ss[b, ll] - Ss[a, ll]
        lab_a = np.empty(len(X), dtype=np.intp)
        lab_b = np.empty(len(X), dtype=np.intp)
        for s in np.unique(np.concatenate([a, b])):
            qa, qb = a == s, b == s
            lab_a[qa] = assign(X[qa], C[rep[s]])[0]
            lab_b[qb] = assign(X[qb], C[rep[s]])[0]
        ok = (lab_b == ll) & (lab_a != ll)
        for s in range(n_states):  # a record lies in a non-empty residual cell in every state
            if not ok.any():
                break
            ok[ok] &= occ[s, assign(X[ok], C[rep[s]])[0]]
        a, b, ll, X = a[ok], b[ok], ll[ok], X[ok]
        if d > 2:
            region.witnesses.add(X)  # mostly real records: they lie in the regions moves would
        order = np.lexsort(X.T[::-1])
        value = np.empty(len(X), dtype=np.intp)  # one certificate per distinct candidate value
        value[order] = np.concatenate([[0], np.cumsum(~np.all(np.abs(np.diff(X[order], axis=0)) <= tol, axis=1))]) if len(X) else []
        certified = set()
        cache: dict = {}
        for q in order:
            if value[q] in certified:
                continue
            aq, bq, lq = int(a[q]), int(b[q]), int(ll[q])
            changed = (Ns[bq] != Ns[aq]) | (np.abs(Ss[bq] - Ss[aq]).max(axis=1) > tol)
            clean = True
            if occ[aq, lq]:  # otherwise nothing was in l at a: nothing can have left
                for m in np.flatnonzero(changed & occ[bq]):
                    if m == lq:
                        continue
                    key = (cell_gid[rep[aq], lq], lq, cell_gid[rep[bq], m], int(m))
                    if key not in cache:
                        cache[key] = region.nonempty(same_content(rep[aq], lq) + same_content(rep[bq], int(m)))
                    if cache[key]:
                        clean = False
                        break
            if clean:
                found.append(X[q][None])
                certified.add(value[q])
    return np.vstack(found) if found else np.zeros((0, d))


class Differencing:
    """Peeling on per-client plaintext messages across rounds (honest-but-curious server).

    Threat model: the server reads each client's per-cell counts and coordinate sums in
    plain over many rounds (DWF / EWF with one local step; Triebe's (Lambda, Gamma) and
    fuzzy numerators where every record enters every round). A record that moves between
    cells from one round to another changes its old cell's count and sum by exactly -1 and
    -x and its new cell's by +1 and +x; once a record is known its cell in every round
    follows from the public centres, and it is subtracted everywhere, which exposes further
    singletons and moves. Iterated to a fixpoint (:func:`peel`).

    Paper: differencing / "peeling" attacks on aggregate statistics (Dinur & Nissim 2003
    style reconstruction); the DWF paper (Holzer et al. 2023) notes that clients' weights
    and centres are sent in plain.

    ``data_bounds`` = (low, high): a box the server knows holds the records (under
    protection users declare it as ``init_bounds``); default: the box of all broadcast
    centres widened by its own width on each side (an assumption, stated in the report).
    ``max_gap``: compare only states (groups of rounds with equal cells) whose rounds are
    at most this far apart; None (default): every pair. ``use_seeding``: the raw records a
    client sent for k-means++ / random seeding are claimed and seed that client's peeling
    (known records are subtracted everywhere).

    Defeated by: secure aggregation (the per-client messages are masked: nothing to peel),
    local DP noise (counts and sums are no longer exact), and reduced by ``MinClusterSize``
    only for the singleton step, not for the move step.
    """

    name = "differencing"

    def __init__(self, *, data_bounds=None, max_iter: int = 50, max_gap: int | None = None, include_singletons_only_rounds: bool = True, use_seeding: bool = True, tol_exact: float = 1e-6, tol_approx=None):
        for name, v in (("max_iter", max_iter), ("max_gap", 1 if max_gap is None else max_gap)):
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise InputError(f"{name} must be an int >= 1, got {v!r}.")
        if data_bounds is not None:
            if not (isinstance(data_bounds, (tuple, list)) and len(data_bounds) == 2):
                raise InputError(f"data_bounds must be (low, high) or None, got {data_bounds!r}.")
            if np.any(np.asarray(data_bounds[0], float) >= np.asarray(data_bounds[1], float)):
                raise InputError("data_bounds: low must be below high in every feature.")
        self.data_bounds = data_bounds
        self.max_iter = int(max_iter)
        self.max_gap = None if max_gap is None else int(max_gap)
        self.include_singletons_only_rounds = bool(include_singletons_only_rounds)
        self.use_seeding = bool(use_seeding)
        self.tol_exact = _check_tol(tol_exact, "tol_exact")
        self.tol_approx = None if tol_approx is None else _check_tol(tol_approx, "tol_approx")

    def claims(self, transcript):
        transcript = _check_transcript(transcript)
        n_clients = int(transcript.meta.get("n_clients", 0)) or 1 + max(
            (c for r in transcript for c in r.sampled), default=-1
        )
        claims = []
        iters = {}
        seeded = _seeding_records(transcript) if self.use_seeding else {}
        pools: dict = {}  # witness points per sequence of centres, shared by the clients that got it
        for c in range(n_clients):
            obs = _client_observations(transcript, c)
            if obs is None:
                claims.extend((c, x) for x in seeded.get(c, ()))
                continue
            rec, it = peel(*obs, bounds=self.data_bounds, known=seeded.get(c), max_iter=self.max_iter, max_gap=self.max_gap,
                           witnesses=pools.setdefault(hashlib.sha1(obs[0].tobytes()).hexdigest(), _Witnesses(obs[0])))
            iters[c] = it
            claims.extend((c, x) for x in rec)
        if self.include_singletons_only_rounds:
            # rounds that are not full-data (mini-batch, multi-step, set-fields): singletons only
            small, _, _ = SmallClusterDisclosure(include_seeding=False).claims(transcript)
            claims.extend(small)
        rounds = sum(1 for r in transcript if r.plain_sums() or r.items)
        return claims, {"peel_iterations_max": max(iters.values(), default=0)}, rounds

    def evaluate(self, transcript, dataset) -> LeakageReport:
        claims, extra, rounds = self.claims(transcript)
        return score_reconstructions(
            claims, dataset, attack=self.name, tol_exact=self.tol_exact, tol_approx=self.tol_approx,
            rounds_used=rounds, extra=extra,
        )


def isolate_by_aggregates(transcript):
    """Per-client sum-fields recovered from pairs of rounds with the same broadcast whose
    contributor sets differ by exactly one client (and from single-contributor rounds).

    Returns {client: [(record, sums dict)]}.
    """
    groups: dict[bytes, list] = {}
    for rec in transcript:
        if rec.aborted is not None or not rec.aggregate or not rec.contributors:
            continue
        digests = {b.digest() for c, b in rec.broadcasts.items() if c in rec.contributors}
        if len(digests) != 1:
            continue
        groups.setdefault(digests.pop(), []).append(rec)
    out: dict[int, list] = {}
    for recs in groups.values():
        sets = [frozenset(r.contributors) for r in recs]
        for a, ra in enumerate(recs):
            if len(sets[a]) == 1:
                (c,) = sets[a]
                out.setdefault(c, []).append((ra, {k: np.asarray(v) for k, v in ra.aggregate.items()}))
            for b, rb in enumerate(recs):
                if a == b or len(sets[a]) != len(sets[b]) + 1 or not sets[b] < sets[a]:
                    continue
                (c,) = sets[a] - sets[b]
                diff = {k: np.asarray(ra.aggregate[k]) - np.asarray(rb.aggregate[k]) for k in ra.aggregate}
                out.setdefault(c, []).append((ra, diff))
    return out


class AggregateDifferencing:
    """Differences of secure aggregates: two rounds with the same broadcast whose
    participant sets differ by one client reveal that client's sums.

    Threat model: honest-but-curious server under secure aggregation (PairwiseMasking,
    Paillier). It learns each round's sum and who contributed (dropouts and sampling are
    visible). When the same broadcast is answered by S and by S minus {c} (a dropout after a
    converged model, repeated requests, a final score request), the difference is client
    c's message, to which :class:`SmallClusterDisclosure` applies. The active version
    (:class:`attacks.active.ActiveAggregateDifferencing`) makes the server sample such pairs.

    Paper: differencing attacks on secure aggregation, e.g. Lam et al. 2021 ("Gradient
    disaggregation"), Pasquini et al. 2022 (sec. 2).

    Defeated by: DP noise on the aggregate (the difference is noisy), a minimum number of
    participants together with DP; not by masking alone.
    """

    name = "aggregate-differencing"

    def __init__(self, *, targets=None, tol_exact: float = 1e-6, tol_approx=None):
        self.targets = targets
        self.tol_exact = _check_tol(tol_exact, "tol_exact")
        self.tol_approx = None if tol_approx is None else _check_tol(tol_approx, "tol_approx")

    def claims(self, transcript):
        transcript = _check_transcript(transcript, needs="aggregates")
        isolated = isolate_by_aggregates(transcript)
        claims = []
        for c, entries in isolated.items():
            for rec, sums in entries:
                pair = crisp_cells(rec.specs)
                if pair is None:
                    continue
                b = rec.broadcasts.get(c)
                centres = b.centres if (b is not None and full_data_round(rec)) else None
                _, X = singleton_claims(sums[pair[0]], sums[pair[1]], centres)
                claims.extend((c, x) for x in X)
        extra = {"isolated_clients": sorted(isolated)}
        return claims, extra, len(transcript)

    def evaluate(self, transcript, dataset) -> LeakageReport:
        claims, extra, rounds = self.claims(transcript)
        return score_reconstructions(
            claims, dataset, attack=self.name, targets=self.targets, tol_exact=self.tol_exact,
            tol_approx=self.tol_approx, rounds_used=rounds, extra=extra,
        )
