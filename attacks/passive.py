"""Passive (honest-but-curious server) reconstruction attacks: they read only a Transcript.

* :class:`SmallClusterDisclosure` -- a per-client cluster of size one *is* the record.
* :class:`Differencing` -- peeling across rounds of one client's plaintext messages.
* :class:`AggregateDifferencing` -- differences of secure aggregates whose contributor
  sets differ by one client.

All three return a :class:`~attacks.report.LeakageReport` via ``evaluate(transcript, dataset)``;
the dataset is used only to score the claims.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog

from securefkm.algorithms._kmeans import assign
from securefkm.exceptions import InputError
from securefkm.transcript import Transcript

from ._cells import (
    SEEDING_RAW_ACTIONS,
    cell_fields,
    dedup,
    full_data_round,
    integer_counts,
    verify_cells,
)
from .report import LeakageReport, score_reconstructions


def _check_transcript(transcript) -> Transcript:
    if not isinstance(transcript, Transcript):
        raise InputError(
            f"transcript must be a securefkm.transcript.Transcript (estimator.transcript_), got {type(transcript).__name__}."
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


def _region_nonempty(Ct, a, Cu, b, low, high) -> bool:
    """Is {x in box: x in Voronoi cell a of Ct and in cell b of Cu} non-empty? (an LP)"""
    rows, rhs = [], []
    for C, j in ((Ct, a), (Cu, b)):
        others = np.delete(np.arange(len(C)), j)
        # ||x-c_j||^2 <= ||x-c_m||^2  <=>  2 (c_m - c_j).x <= |c_m|^2 - |c_j|^2
        rows.append(2.0 * (C[others] - C[j]))
        rhs.append(np.einsum("ij,ij->i", C[others], C[others]) - C[j] @ C[j])
    A = np.vstack(rows)
    bvec = np.concatenate(rhs)
    res = linprog(np.zeros(A.shape[1]), A_ub=A, b_ub=bvec - 1e-12 * (1 + np.abs(bvec)),
                  bounds=list(zip(low, high)), method="highs")
    return res.status == 0


def peel(C, N, S, *, bounds=None, max_iter: int = 50, max_gap: int | None = None, agree_rtol: float = 1e-9):
    """Differencing to a fixpoint on one client's per-round cells.

    ``C`` (T, k, d) the centres the client got, ``N`` (T, k) its counts, ``S`` (T, k, d) its
    per-cell coordinate sums; ``bounds`` = (low, high) arrays, a box known to hold the
    client's records. Returns the recovered records (m, d) and the iterations used.

    Each iteration: (1) subtract every known record from the cell it falls in, in every
    round (its cell follows from the public centres); (2) a residual cell with count 1 is a
    record; (3) for a pair of rounds (t, u) -- every pair, or those at most ``max_gap``
    apart -- whose residual counts change by -1 in cell j, +1 in cell l and nowhere else,
    and whose residual sums change in no other cell either (``agree_rtol``) with
    ``S_u[j] - S_t[j] = -(S_u[l] - S_t[l])``: all records that moved between t and u moved
    between j and l (a cell c whose in- and out-flows of records have equal sums has none,
    for records in general position: disjoint sets of distinct real vectors do not have
    equal sums), so ``S_u[l] - S_t[l]`` = (records j -> l) - (records l -> j), one more of
    the former. It is one record **if** no record can go l -> j, i.e. the region {x in
    bounds: x in cell l of C_t and in cell j of C_u} is empty (one linear programme).
    Candidates must also lie in cell j at t and cell l at u.
    Stops at a fixpoint, or when the residuals become inconsistent (a negative count).

    Assumption (stated in the docs): records in general position -- true with probability
    one for continuous data; data on a coarse grid could in principle satisfy a sum
    coincidence and give a wrong claim.
    """
    T, k, d = S.shape
    known = np.zeros((0, d))
    scale = 1.0 + float(np.max(np.abs(S))) if S.size else 1.0
    tol = agree_rtol * scale
    if bounds is None:
        lo = C.reshape(-1, d).min(axis=0)
        hi = C.reshape(-1, d).max(axis=0)
        w = np.maximum(hi - lo, 1e-12)
        bounds = (lo - w, hi + w)
    low, high = (np.broadcast_to(np.asarray(b, dtype=np.float64), (d,)) for b in bounds)
    region_cache: dict = {}
    iu, ju = np.triu_indices(T, 1)
    if max_gap is not None:
        near = ju - iu <= max_gap
        iu, ju = iu[near], ju[near]
    iters = 0
    for it in range(1, max_iter + 1):
        iters = it
        Nr, Sr = N.copy(), S.copy()
        if len(known):
            for t in range(T):
                lab = assign(known, C[t])[0]
                Nr[t] -= np.bincount(lab, minlength=k)
                np.add.at(Sr[t], lab, -known)
        if np.any(Nr < 0):
            break
        cands = []
        # (2) singletons
        tt, jj = np.nonzero(Nr == 1)
        if len(tt):
            X = Sr[tt, jj]
            ok = np.array([assign(X[i : i + 1], C[tt[i]])[0][0] == jj[i] for i in range(len(X))])
            cands.append(X[ok])
        # (3) one record moved between two rounds
        if len(iu):
            dN = Nr[ju] - Nr[iu]
            one_move = (np.sum(dN == -1, axis=1) == 1) & (np.sum(dN == 1, axis=1) == 1) & (np.sum(dN != 0, axis=1) == 2)
            p = np.flatnonzero(one_move)
            if len(p):
                t, u = iu[p], ju[p]
                j = np.argmax(dN[p] == -1, axis=1)
                l_ = np.argmax(dN[p] == 1, axis=1)
                dS = Sr[u] - Sr[t]  # (P, k, d)
                rows = np.arange(len(p))
                x = dS[rows, l_]
                other = np.ones((len(p), k), dtype=bool)
                other[rows, j] = False
                other[rows, l_] = False
                quiet = np.all(np.abs(dS).max(axis=2) * other <= tol, axis=1)
                balanced = np.max(np.abs(x + dS[rows, j]), axis=1) <= tol
                for q in np.flatnonzero(quiet & balanced):
                    tq, uq, jq, lq = int(t[q]), int(u[q]), int(j[q]), int(l_[q])
                    xq = x[q]
                    if assign(xq[None], C[tq])[0][0] != jq or assign(xq[None], C[uq])[0][0] != lq:
                        continue
                    if Nr[tq, lq] > 0 and Nr[uq, jq] > 0:  # someone could have gone l -> j
                        key = (tq, uq, lq, jq)
                        if key not in region_cache:
                            region_cache[key] = _region_nonempty(C[tq], lq, C[uq], jq, low, high)
                        if region_cache[key]:
                            continue
                    cands.append(xq[None])
        new = np.vstack(cands) if cands else np.zeros((0, d))
        if len(new) == 0:
            break
        new = dedup(new, tol)
        if len(known):
            dist = np.min(np.abs(new[:, None, :] - known[None, :, :]).max(axis=2), axis=1)
            new = new[dist > tol]
        if len(new) == 0:
            break
        known = np.vstack([known, new])
    return known, iters


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

    Defeated by: secure aggregation (the per-client messages are masked: nothing to peel),
    local DP noise (counts and sums are no longer exact), and reduced by ``MinClusterSize``
    only for the singleton step, not for the move step.
    """

    name = "differencing"

    def __init__(self, *, data_bounds=None, max_iter: int = 50, max_gap: int | None = 2, include_singletons_only_rounds: bool = True, tol_exact: float = 1e-6, tol_approx=None):
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
        self.tol_exact = _check_tol(tol_exact, "tol_exact")
        self.tol_approx = None if tol_approx is None else _check_tol(tol_approx, "tol_approx")

    def claims(self, transcript):
        transcript = _check_transcript(transcript)
        n_clients = int(transcript.meta.get("n_clients", 0)) or 1 + max(
            (c for r in transcript for c in r.sampled), default=-1
        )
        claims = []
        iters = {}
        for c in range(n_clients):
            obs = _client_observations(transcript, c)
            if obs is None:
                continue
            rec, it = peel(*obs, bounds=self.data_bounds, max_iter=self.max_iter, max_gap=self.max_gap)
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
        transcript = _check_transcript(transcript)
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
