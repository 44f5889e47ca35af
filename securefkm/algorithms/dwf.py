"""Dynamically / equally weighted federated k-means (Holzer, Jacob & Kavane 2023).

Each round the server broadcasts the global centres C^(t); each sampled client runs up to
``max_local_steps`` Lloyd steps from them (Algorithm 2, LocalUpdate), and returns

* DWF (``weighting="dynamic"``): the weights omega_ij = |{x in X_i assigned to c_j^(t)}|
  of eq. 7 and the weighted local centres omega_ij * c_ij;
* EWF (``weighting="equal"``): its local centres c_ij (eq. 8: omega_ij = 1/|I_t|).

With a prior weight m = ``prior_weight`` > 0 (EWF, one local step) the local centre is the
prior-weighted mean c_ij = (S_ij + m C_j) / (n_ij + m) of the n_ij records of client i nearest
C_j (S_ij their sum): m pseudo-records at the broadcast centre. m = 0 is eq. 8 exactly (an empty
cluster reports C_j). One record moves c_ij by (x - c_ij) / (n_ij + m + 1), at most
diameter / (1 + m), which is what record-level DP noises (FieldSpec ``prior_weight``).

The server forms d_j = sum_i lambda_ij c_ij with lambda_ij from eq. 4 -- including its
zero-weight fallback lambda_ij = 1/|I_t| when sum_i omega_ij = 0 -- and moves the centres
with learning rate eta and momentum mu (eq. 6):

    c^(t+1) = c^(t) + eta (d^(t+1) - c^(t)) + mu (c^(t) - c^(t-1)).

Empty clusters are not relocated (sec. 2.4). With one local step, full participation,
eta = 1 and mu = 0 this is exactly Lloyd's algorithm on the pooled data (eq. 2).

Everything the server needs is a sum over clients, so DWF/EWF run under secure
aggregation. With ``max_local_steps=1`` the weighted centres are plain coordinate sums
(FieldSpec kind ``"sum"``), which gives record-level DP a bounded sensitivity; with more
local steps one record can re-assign every record of its client, so the weighted centres
(counts times local centres) have no record-level bound and record-level DP refuses them.
EWF's local centres (and DWF's unweighted ones) are kind ``"mean"``: every row is a point of
the records' domain, so one record moves a row by at most the domain's diameter (over 1 + m with
a prior weight), and after one local step it moves only the row of its own cluster.

Robust aggregation (``aggregation="median"``, DWF only): each client also sends a vote
histogram, the sum-field ``votes`` of shape (k, d, B): for every cluster j it holds records
of, one vote per coordinate e in the bin of ``vote_bins`` equal bins of the declared box
``init_bounds`` that holds its local mean c_ije (weight 1, or its count omega_ij with
``vote_weight="records"``). The sum of the votes is the histogram of the clients' local
means, so the server needs only sums and the option runs under secure aggregation. The
server replaces d_j of eq. 3-4 by the coordinate-wise median of that histogram, each vote
spread uniformly over its bin (:func:`histogram_quantile`), and moves the centres with eq. 6
as before; a cluster without votes keeps eq. 4's fallback. What m malicious clients can do
to it is bounded in :mod:`protocols.influence`. One record can move its client's vote in
every coordinate of its cluster (and every row after several local steps), which no field
kind of :class:`~securefkm.messages.FieldSpec` bounds: the field is kind ``"value"`` and
record-level DP refuses it.

Candidate-vote refinement (``refine_rounds`` G > 0): after the start (a seeding round or given
centres) and before the training rounds, G rounds of action ``"refine"`` run PE-means's
generations (Humphries, Lin & Yekhanin, arXiv 2606.00342; :mod:`._candidate_vote`): the server
broadcasts the centres and ``refine_mutants`` mutants of each, every client returns the count
field ``votes`` (how many of its records are nearest to each candidate; sensitivity 1), and the
server re-clusters the candidates weighted by their thresholded votes into the new centres. The
votes are a plain sum, so the rounds run under secure aggregation and every DP mode.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..validation import check_choice, check_float, check_int
from ..exceptions import InputError
from ..federation.convergence import frobenius_movement, has_converged
from ..messages import AggregatedUpdate, Broadcast, FieldSpec, Update
from . import _candidate_vote, _seeding
from ._kmeans import assign, local_lloyd, per_client_cell_sums
from .base import Algorithm, SeededState

AGGREGATIONS = ("mean", "median")
VOTE_WEIGHTS = ("client", "records")


@dataclass
class WeightedKMeansState(SeededState):
    """Server state of DWF / EWF k-means.

    Parameters
    ----------
    previous_centres : ndarray or None
        The centres before the last training round, ``C_{t-1}`` of the momentum term (eq. 6);
        None before the first training round (no momentum yet).
    """

    previous_centres: np.ndarray | None = None
    #: refinement rounds done and the next one's candidates (phase "refine")
    refined: int = 0
    population: np.ndarray | None = None


def box_arrays(box, d: int) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` of a declared box as two float arrays of length ``d`` (scalars broadcast);
    raises InputError naming ``init_bounds`` unless every ``low < high`` is finite."""
    try:
        low, high = (np.broadcast_to(np.asarray(b, dtype=np.float64), (d,)).copy() for b in box)
    except (TypeError, ValueError):
        raise InputError(f"init_bounds={box!r}: pass (low, high), two scalars or two arrays of length "
                         f"n_features={d}.") from None
    if not (np.isfinite(low).all() and np.isfinite(high).all() and (low < high).all()):
        raise InputError(f"init_bounds={box!r}: every low must be finite and below its high.")
    return low, high


def vote_histogram(counts: np.ndarray, local: np.ndarray, low: np.ndarray, high: np.ndarray, bins: int,
                   weight: str = "client") -> np.ndarray:
    """One client's votes (k, d, bins): for each cluster j with ``counts[j] > 0``, in every
    coordinate e a vote in the bin of ``[low_e, high_e]`` (``bins`` equal bins, the last one
    closed; a mean outside the box counts in its end bin) holding ``local[j, e]``; the vote
    weighs 1 (``weight="client"``) or ``counts[j]`` (``"records"``). Clusters without records
    cast no vote."""
    k, d = local.shape
    votes = np.zeros((k, d, bins))
    rows = np.flatnonzero(counts > 0)
    if rows.size:
        idx = np.floor((local[rows] - low) / (high - low) * bins)
        idx = np.clip(np.nan_to_num(idx, nan=0.0), 0, bins - 1).astype(np.intp)
        w = np.ones(rows.size) if weight == "client" else np.asarray(counts, dtype=np.float64)[rows]
        votes[rows[:, None], np.arange(d)[None, :], idx] = w[:, None]
    return votes


def histogram_quantile(votes: np.ndarray, low: np.ndarray, high: np.ndarray, mass, side: str = "left") -> np.ndarray:
    """Quantiles of vote histograms, each vote spread uniformly over its bin.

    ``votes`` (..., d, B) over ``B`` equal bins of ``[low_e, high_e]``; ``mass`` (broadcast to
    ``votes.shape[:-1]``) an absolute vote mass. With F the (continuous, piecewise linear)
    cumulative vote mass, returns ``inf{x : F(x) >= mass}`` (``side="left"``) or
    ``sup{x : F(x) <= mass}`` (``side="right"``), clamped to the box: ``low`` for a mass
    <= 0 on the left, ``high`` for a mass >= the total on the right. The median of a row of
    total V is its left quantile at V / 2 (:meth:`WeightedFederatedKMeansAlgorithm` with
    ``aggregation="median"``).
    """
    votes = np.asarray(votes, dtype=np.float64)
    bins = votes.shape[-1]
    lo = np.broadcast_to(low, votes.shape[:-1])
    width = np.broadcast_to((high - low) / bins, votes.shape[:-1])
    mass = np.broadcast_to(np.asarray(mass, dtype=np.float64), votes.shape[:-1])
    if side == "right":  # reflect the box: sup{x : F(x) <= m} = low + high - inf{y : F_r(y) >= V - m}
        total = votes.sum(axis=-1)
        flipped = histogram_quantile(votes[..., ::-1], low, high, total - mass, "left")
        return np.broadcast_to(low + high, flipped.shape) - flipped
    cum = np.cumsum(votes, axis=-1)
    b = np.minimum((cum < mass[..., None]).sum(axis=-1), bins - 1)  # first bin whose cumulative reaches mass
    before = np.take_along_axis(cum, b[..., None], axis=-1)[..., 0] - np.take_along_axis(votes, b[..., None], -1)[..., 0]
    here = np.take_along_axis(votes, b[..., None], axis=-1)[..., 0]
    frac = np.divide(mass - before, here, out=np.ones_like(here), where=here > 0)
    x = lo + width * (b + np.clip(frac, 0.0, 1.0))
    return np.where(mass <= 0, lo, x)


class WeightedFederatedKMeansAlgorithm(Algorithm):
    """Server and client logic of DWF / EWF k-means (Holzer et al. 2023, Algorithms 1-4)."""

    name = "dwf"
    needs_client_rng = True  # only seeding rounds draw random numbers

    @property
    def nearest_centre_actions(self):
        """Actions whose weighted sums are hard nearest-centre sums of the broadcast centres
        (one local step, DWF weights): GaussianDP(radius=...) may bound them by a radius."""
        return ("train",) if self.max_local_steps == 1 and self.weighting == "dynamic" else ()

    @property
    def dp_value_fix(self):
        if self.weighting == "equal" or self.max_local_steps == 1:
            return None
        return ("max_local_steps=1 (each round then sends the count and coordinate sum of the records "
                "nearest each centre), or weighting='equal' (EWF's local centres are means, bounded by "
                "the domain)")

    def client_rng_needed(self, broadcast):
        return broadcast.action.startswith("init.")

    def __init__(
        self,
        n_clusters: int,
        *,
        weighting: str = "dynamic",
        learning_rate: float = 1.0,
        momentum: float = 0.0,
        max_local_steps: int = 1,
        local_tol: float = 0.0,
        tol: float = 1e-6,
        patience: int | None = None,
        init="k-means++",
        init_bounds=None,
        score_round: bool = False,
        seeding_noise: float | None = None,
        aggregation: str = "mean",
        vote_bins: int = 64,
        vote_weight: str = "client",
        refine_rounds: int = 0,
        refine_mutants: int = 8,
        refine_records: int | None = None,
        prior_weight: float = 0.0,
    ):
        self.n_clusters = check_int(n_clusters, "n_clusters", minimum=1)
        self.weighting = check_choice(weighting, "weighting", ("dynamic", "equal"))
        self.learning_rate = check_float(learning_rate, "learning_rate", minimum=0.0, maximum=1.0, min_inclusive=False)
        self.momentum = check_float(momentum, "momentum", minimum=0.0, maximum=1.0, max_inclusive=False)
        self.max_local_steps = check_int(max_local_steps, "max_local_steps", minimum=1)
        self.local_tol = check_float(local_tol, "local_tol", minimum=0.0)
        self.tol = check_float(tol, "tol", minimum=0.0)
        self.patience = None if patience is None else check_int(patience, "patience", minimum=1)
        if not isinstance(init, np.ndarray):
            check_choice(init, "init", _seeding.INIT_CHOICES)
        self.init_ = init
        self.init_bounds = init_bounds
        self.score_round = bool(score_round)
        #: the DP plan's noise level e, which sizes the private seeding's grid (_seeding.lsh_bits)
        self.seeding_noise = None if seeding_noise is None else check_float(
            seeding_noise, "seeding_noise", minimum=0.0, min_inclusive=False)
        self.name = "dwf" if weighting == "dynamic" else "ewf"
        self.aggregation = check_choice(aggregation, "aggregation", AGGREGATIONS)
        self.vote_bins = check_int(vote_bins, "vote_bins", minimum=2)
        self.vote_weight = check_choice(vote_weight, "vote_weight", VOTE_WEIGHTS)
        self.refine_rounds = check_int(refine_rounds, "refine_rounds", minimum=0)
        self.refine_mutants = check_int(refine_mutants, "refine_mutants", minimum=1)
        #: the public number of records the votes are thresholded at (None: the votes' own total)
        self.refine_records = None if refine_records is None else check_int(refine_records, "refine_records",
                                                                             minimum=1)
        if self.refine_rounds and self.aggregation == "median":
            raise InputError("refine_rounds > 0 with aggregation='median': the refinement's votes are a plain sum "
                             "that malicious clients can move; use refine_rounds=0 with the median.")
        self.prior_weight = check_float(prior_weight, "prior_weight", minimum=0.0)
        if self.prior_weight and (self.weighting != "equal" or self.max_local_steps != 1):
            # after several steps one record re-assigns others: no bound of diameter / (1 + m)
            raise InputError(f"prior_weight={prior_weight!r} is for EWF with one local step (weighting='equal', "
                             "max_local_steps=1); pass prior_weight=0 otherwise.")
        if self.aggregation == "median":
            if self.weighting != "dynamic":
                raise InputError("aggregation='median' is for weighting='dynamic' (DWF): it votes with the "
                                 "per-cluster counts; use aggregation='mean' with weighting='equal'.")
            if init_bounds is None:
                raise InputError("aggregation='median' needs the declared box its votes are binned in: pass "
                                 "init_bounds=(low, high) (or a GaussianDP layer's bounds, though DP refuses the "
                                 "votes), or use aggregation='mean'.")

    @property
    def robust(self) -> bool:
        return self.aggregation == "median"

    # ----------------------------------------------------------------- server
    def init(self, n_clients, n_features, rng):
        self.n_features_ = n_features
        centres = _seeding.initial_centres(self.init_, self.n_clusters, n_features, rng, self.init_bounds)
        state = WeightedKMeansState(centres=centres, phase="train" if centres is not None else "init", rng=rng,
                                    n_clients=n_clients)
        return self._to_refine(state) if centres is not None else state

    def _to_refine(self, state):
        """``state`` (centres just set by the start) with the first refinement round's
        candidates, or unchanged when there is none."""
        if self.refine_rounds == 0:
            return state
        return replace(state, phase="refine", refined=0, population=_candidate_vote.candidates(
            state.centres, self.refine_mutants, 0, state.rng, self.init_bounds))

    def configure(self, state, round):
        if state.phase == "init":
            return _seeding.seeding_broadcast(
                self.init_, self.n_clusters, init_bounds=self.init_bounds, rng=state.rng,
                n_features=self.n_features_, noise_level=self.seeding_noise,
            )
        if state.phase == "score":
            return Broadcast(action="score", centres=state.centres, sample="all")
        if state.phase == "refine":
            return Broadcast(action="refine", centres=state.population)
        params = {"max_local_steps": self.max_local_steps, "local_tol": self.local_tol, "weighting": self.weighting}
        if self.robust:  # only then: a plain fit's broadcasts (and digests) stay as they were
            params.update(aggregation="median", vote_bins=self.vote_bins, vote_weight=self.vote_weight)
        if self.prior_weight:  # likewise: m = 0 broadcasts stay as they were
            params["prior_weight"] = self.prior_weight
        return Broadcast(action="train", centres=state.centres, params=params)

    def sum_fields(self, broadcast):
        k, d = self.n_clusters, self._d(broadcast)
        if broadcast.action == "train":
            # a client's local centres are points of the records' domain (means of its records, or
            # the broadcast centre for an empty cluster): kind 'mean'; after one step a record
            # changes only the row of its nearest broadcast centre, after several it can change all
            rows_moved = 1 if self.max_local_steps == 1 else k
            if self.weighting == "equal":
                return (FieldSpec("centres", (k, d), "mean", cells=rows_moved,
                                  prior_weight=float(broadcast.params.get("prior_weight", 0.0)) if rows_moved == 1
                                  else 0.0),)
            kind = "sum" if self.max_local_steps == 1 else "value"
            specs = (
                FieldSpec("weights", (k,), "count", integer=True),
                FieldSpec("weighted_centres", (k, d), kind, weighted_by="weights" if kind == "sum" else None),
            )
            if self.max_local_steps > 1:  # eq. 4 fallback needs the unweighted local centres
                specs += (FieldSpec("centres", (k, d), "mean", cells=rows_moved),)
            if broadcast.params.get("aggregation") == "median":
                # whole votes (integer) of no record-level bound the kinds express: 'value';
                # one vote per (cluster, coordinate) with vote_weight="client": one-hot rows
                specs += (FieldSpec("votes", (k, d, int(broadcast.params["vote_bins"])), "value", integer=True,
                                    one_hot=broadcast.params.get("vote_weight", "client") == "client"),)
            return specs
        if broadcast.action == "score":
            return (FieldSpec("inertia", (1,), "score"), FieldSpec("count", (1,), "count", integer=True))
        if broadcast.action == "refine":  # one record, one vote: a count of sensitivity 1
            return (FieldSpec("votes", (broadcast.centres.shape[0],), "count", integer=True),)
        return _seeding.seeding_sum_fields(broadcast)

    @staticmethod
    def _d(broadcast):
        return 0 if broadcast.centres is None else broadcast.centres.shape[1]

    n_features_: int = 0

    def aggregate(self, state, agg: AggregatedUpdate):
        if state.phase == "init":
            seeded = _seeding.seeded_state(state, agg, self.init_, self.n_clusters, self.init_bounds)
            return self._to_refine(seeded) if seeded.phase == "train" else seeded
        if state.phase == "refine":
            return self._refine_aggregate(state, agg)
        if state.phase == "score":
            s = agg.sums
            count = float(s["count"][0])
            score = float(s["inertia"][0]) / count if count > 0 else float("inf")
            return replace(state, score=score, phase="done")
        return self._train_aggregate(state, agg)

    def _train_aggregate(self, state, agg):
        C = state.centres
        C_old = C if state.previous_centres is None else state.previous_centres
        n = agg.n_contributors
        s = agg.sums
        if self.weighting == "equal":
            D = s["centres"] / n  # eq. 8: lambda_ij = 1/|I_t|
        else:
            w = s["weights"]
            D = np.empty_like(C)
            nz = w > 0
            D[nz] = s["weighted_centres"][nz] / w[nz, None]  # eq. 3-4, sum of weights > 0
            # eq. 4 fallback: lambda = 1/|I_t|. With one local step and no relocation an
            # empty cluster's local centre is the broadcast centre, so the mean is C_j.
            D[~nz] = s["centres"][~nz] / n if "centres" in s else C[~nz]
            if self.robust:
                D = self._median_centres(s["votes"], D)
        new = C + self.learning_rate * (D - C) + self.momentum * (C - C_old)  # eq. 6
        movement = frobenius_movement(C, new)
        movements = state.movements + [movement]
        phase = "train"
        if has_converged(movements, self.tol, self.patience):
            phase = "score" if self.score_round else "done"
        return replace(
            state,
            centres=new,
            phase=phase,
            round=state.round + 1,
            movements=movements,
            previous_centres=C,
        )

    def _refine_aggregate(self, state, agg):
        """One generation's selection: threshold the (noisy) votes at the public number of
        records, weighted k-means over the candidates; then the next generation's candidates, or
        the training phase."""
        votes = np.asarray(agg.sums["votes"], dtype=np.float64)
        n = self.refine_records if self.refine_records is not None else max(float(votes.sum()), 0.0)
        weights = _candidate_vote.threshold_counts(votes, n)
        centres = _candidate_vote.select_centres(state.population, weights, self.n_clusters, state.rng,
                                                 state.centres)
        refined = state.refined + 1
        if refined >= self.refine_rounds:
            return replace(state, centres=centres, phase="train", refined=refined, population=None)
        return replace(state, centres=centres, refined=refined, population=_candidate_vote.candidates(
            centres, self.refine_mutants, refined, state.rng, self.init_bounds))

    def _median_centres(self, votes, fallback):
        """The coordinate-wise medians of the summed vote histograms (the robust d_j); a
        cluster that got no vote keeps ``fallback`` (eq. 4's)."""
        low, high = box_arrays(self.init_bounds, votes.shape[1])
        total = votes.sum(axis=-1)
        median = histogram_quantile(votes, low, high, total / 2.0)
        return np.where(total > 0, median, fallback)

    def close(self, state):
        """Called when max_rounds is reached: skip to the score request, if any."""
        if state.phase in ("train", "init", "refine"):
            if state.centres is None:
                raise InputError("max_rounds ended before any client could seed the centres.")
            return replace(state, phase="score" if self.score_round else "done")
        return state

    def converged(self, state):
        return state.phase == "done"

    def planned_rounds(self, max_rounds):
        return len(self.planned_sequence(max_rounds))

    def planned_sequence(self, max_rounds):
        """The actions of one run's rounds in order: the seeding round, if any, the
        ``refine_rounds`` refinement rounds, ``max_rounds`` training rounds, then the score
        round, if any. Lets ``GaussianDP(last_round_weights=...)`` find the last training round."""
        seeding = _seeding.seeding_action(self.init_)
        return ([seeding] if seeding is not None else []) + ["refine"] * self.refine_rounds + (
            ["train"] * int(max_rounds)) + (["score"] if self.score_round else [])

    # ----------------------------------------------------------------- client
    def client_update(self, X, broadcast, rng, memory=None):
        action = broadcast.action
        if action.startswith("init."):
            return _seeding.seeding_client_update(X, broadcast, rng)
        C = broadcast.centres
        if action == "score":
            _, d2 = assign(X, C)
            return Update(sums={"inertia": np.array([d2.sum()]), "count": np.array([float(len(X))])})
        if action == "refine":
            return Update(sums={"votes": _candidate_vote.vote_counts(X, C).astype(np.float64)})
        if action != "train":
            raise InputError(f"DWF client got unknown action {action!r}")
        if broadcast.params["max_local_steps"] == 1:
            return self.client_updates([X], broadcast, [rng], [memory])[0]
        local, counts, _ = local_lloyd(X, C, broadcast.params["max_local_steps"], broadcast.params["local_tol"])
        if self.weighting == "equal":
            return Update(sums={"centres": local})
        sums = {"weights": counts, "weighted_centres": counts[:, None] * local, "centres": local}
        return self._with_votes(Update(sums=sums), counts, local, broadcast)

    def _with_votes(self, update, counts, local, broadcast):
        """``update`` with the client's vote histogram when the broadcast asks for the median."""
        if broadcast.params.get("aggregation") != "median":
            return update
        low, high = box_arrays(self.init_bounds, local.shape[1])
        update.sums["votes"] = vote_histogram(counts, local, low, high, int(broadcast.params["vote_bins"]),
                                              broadcast.params["vote_weight"])
        return update

    def client_updates(self, datas, broadcast, rngs, memories=None):
        """One-step training rounds for many clients in one vectorised pass."""
        if broadcast.action != "train" or broadcast.params["max_local_steps"] != 1:
            return [self.client_update(X, broadcast, r) for X, r in zip(datas, rngs)]
        C = broadcast.centres
        sums, counts = per_client_cell_sums(datas, C)
        if self.weighting != "equal":  # each client's message: its own rows (views, no copy)
            out = [Update(sums={"weights": w, "weighted_centres": s}) for w, s in zip(counts, sums)]
            if broadcast.params.get("aggregation") == "median":
                for u, w, s in zip(out, counts, sums):
                    local = C.copy()
                    nz = w > 0
                    local[nz] = s[nz] / w[nz, None]
                    self._with_votes(u, w, local, broadcast)
            return out
        m = float(broadcast.params.get("prior_weight", 0.0))
        out = []
        for w, s in zip(counts, sums):
            local = C.copy()
            if m:  # (S_ij + m C_j) / (n_ij + m): m > 0, every row defined
                local = (s + m * C) / (w + m)[:, None]
            else:  # eq. 8: the mean of the cell's records, C_j for an empty cell
                nz = w > 0
                local[nz] = s[nz] / w[nz, None]
            out.append(Update(sums={"centres": local}))
        return out
