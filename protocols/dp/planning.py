"""DP-aware defaults: the plan a k-means estimator runs when the user gives nothing but
``GaussianDP(epsilon, delta, bounds=box)`` or ``GaussianDP(epsilon, delta, clip=R, centre=c)``
(a ball domain: the box's rules with the ball's centre, radius and diameter in place of the
box's centre, half-diagonal and diagonal).

Everything here is a function of public quantities: k, d, epsilon, delta, the declared box,
the seed, and the number of records n. n is *declared public* by the plan (the estimator
knows it in simulation; ``GaussianDP.report()["plan"]["records_declared_public"]`` says so);
pass ``GaussianDP(n_records=...)`` to declare another, e.g. a rounded public figure.

The rule, and why
-----------------
The current figures, the tuning protocol (paired, seeded noise on seeds 1000-1099 of
FastLloyd's grid and 1000-1039 of ``benchmarks.protocols_dp.off_table_grid``) and the
commands that reproduce them are in docs/protocols/dp-utility.md; the deltas quoted below are
paired loss-ratio differences on those tuning seeds.

*Noise level*: e = z_1 sqrt(d) k / (n sqrt(1 - c)), the expected norm of one cluster mean's
noise relative to the box's half-diagonal when the whole budget is spent on one Lloyd round
(z_1 the noise multiplier of one release at (epsilon, delta), c = 1/(1 + 2 sqrt(d)) the count
share of :func:`protocols.dp.calibration.auto_count_share`, n/k records per cluster). Every
rule below reads e.

*Rounds*: R = 1 when e > E1 = 0.7, otherwise R = 1 + ceil(log2(E1 / e) / 2) within [2, 6]:
each extra round multiplies every round's noise by sqrt(R), so each quartering of e buys one
more round. E1 was read off forced R = 1, 2, 3 on seeds 1000-1019 of FastLloyd's grid.

*Start*: when e >= E_p = 0.1, k data-independent points spread over the inner half of the box
(greedy maximin over 64 k uniform candidates, from the seed; for a ball, candidates uniform in
the concentric ball of half its radius) -- no seeding round, so the whole
budget goes to Lloyd rounds; the first round's Voronoi cells around well-separated points near
the box centre cut the data into k groups as random hyperplanes through the centre would.
When e < E_p, a private seeding round (``init="private"``: noisy counts and sums of grid or
hyperplane buckets, :mod:`securefkm.kernels`; in d <= 3 a grid of clip(0.3 / e, 4, 16) cells
per cluster) weighted R, i.e. given as much of mu^2 as the R weight-1 Lloyd rounds
(``round_weights={"init.private": R}``): with that little noise a few Lloyd rounds from
data-independent points stay in local optima of well-separated data, and a data-dependent
start is worth one more release (private minus spread start: 5-blob sets of 10,000 and 100,000
records at eps 1: -0.35 and -0.23; worse above E_p, e.g. iris eps 1, e = 0.12: +0.07). Half the
budget rather than an equal share per release: on the DWF 5-blob set at eps 1 / 0.5, 1.001 /
1.018 against 1.007 / 1.048.

*Final round*: with R >= 3 the last Lloyd round gets weight R - 1 (``last_round_weights=
{"train": R - 1}``), the earlier ones weight 1: the final round's noise is what stays in the
returned centres, the rounds before it only have to bring the centres near the optimum. A
round's noise variance is proportional to W / w (W the schedule's total weight, w its own):
from a spread start the final round's variance falls from R to 2 and the earlier rounds' rises
by (2R - 2) / R. Two-round plans (e >= 0.19, where the first round's noise decides the cells)
keep equal weights: a heavier second round measured worse there. The weight R - 1 was chosen
on ``off_table_grid`` among 2, 3, R - 1, R and 2 (R - 1).

*Radius*: Lloyd rounds after the first clip every record to FastLloyd's radius
r = diag * 0.8 / (2 k^(1/d)) around its nearest centre, capped at 1.25 times the radius of the
d-ball of volume vol(box) / k (binds from d = 6 on), and noise the sums relative to the centres
(sensitivity r instead of the half-diagonal; :mod:`protocols.dp.radius`).

*Low-count rows in 2-D* (R >= 3, free): in d <= 2 the step shrinkage below is off, and a
cluster whose noisy count is below one count sigma gets a mean that is noise over a count near
0, projected onto a face or corner of the box where the centre would stay without records. Such
rows move next to the clusters with the largest noisy counts (half the radius from their mean,
towards the row's old centre; :meth:`protocols.dp.postprocessing.PostProcessor._relocated`),
so that the next round splits those. Two-round plans keep their rows: there the count noise is
of the order of a cluster's count and relocating measured worse.

*Post-processing* (``shrink="step"``, free): every noisy cluster mean is shrunk towards its
broadcast centre by a plug-in empirical-Bayes factor on the step, and a cluster whose noisy
count is below one count-noise sigma keeps its centre; the first round of a multi-round plan
uses ``"hierarchical"`` (towards the overall mean, itself shrunk towards the box centre), except
when e > E_s = 0.35 (``first_round_prior == "start"``; with the rounds rule, only two-round
plans): then the hierarchical factors are 0 or small for most clusters and the k centres would
collapse onto the overall mean, so the first round also shrinks each step towards its start
point, and a start point whose noisy count is below one count sigma moves to the overall mean
(it drew no records). The start prior wins at high noise (iris eps 0.25, e = 0.40: -0.60 +- 0.12
central) and loses at low noise (iris and breast cancer at eps 1: +0.13 to +0.24); E_s = 0.35
separates them.

*Refinement* (k >= 16 and 4 <= d <= 64): G = 3 candidate-vote rounds (PE-means's generations,
Humphries, Lin & Yekhanin, arXiv 2606.00342; :mod:`securefkm.algorithms._candidate_vote`)
between the start and the Lloyd rounds, each of weight 1 (``round_weights={"refine": 1}``).
Each round releases one count per candidate (the centres and L mutants of each, P = k (L + 1)):
one record adds or removes one vote, so the round is one Gaussian mechanism of L2 sensitivity 1
on the count field and composes with the others as any weight-1 round. L is sized from public
quantities so that a candidate's share of the records, n / P, is about 2 vote-noise sigmas,
sigma ~ z_1 sqrt(W) with W the schedule's total weight (:func:`schedule_weight`, the Gaussian
rounds composing as one Gaussian of weight W), within [2, 32]. With many clusters a few Lloyd
rounds from the private seeding stay in local optima (two centres in one cluster, one between
two); the server's 10-start weighted k-means over the voted candidates undoes them. The
bounds were read off the held-out sets ``blobs-K<K>-D<D>-S2`` / ``-S3`` of
``benchmarks.pe_means`` (seeded noise, seeds 700-703; docs/protocols/dp-pe-means.md): a gain at
every d from 4 to 64, none at d = 128. Every set of FastLloyd's grid and of ``off_table_grid``
has k <= 10: their plans are unchanged by construction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

NOISE_ONE_ROUND = 0.7  # E1: above it, one Lloyd round
NOISE_PRIVATE_START = 0.1  # E_p: below it, a private seeding round instead of the spread start
NOISE_START_PRIOR = 0.35  # E_s: above it, the first of several rounds shrinks towards the start
MAX_ROUNDS = 6
# candidate-vote refinement (see "Refinement" above): where it applies, how many rounds, their
# weight each, and the votes per candidate its population is sized for
REFINE_MIN_CLUSTERS = 16
REFINE_MIN_FEATURES = 4
REFINE_MAX_FEATURES = 64
REFINE_ROUNDS = 3
REFINE_WEIGHT = 1.0
REFINE_VOTES_PER_SIGMA = 2.0
REFINE_MIN_MUTANTS, REFINE_MAX_MUTANTS = 2, 32
RELOCATE_MIN_ROUNDS = 3  # d <= 2: plans of at least 3 rounds relocate their low-count rows
SPREAD = 0.5  # the start's candidates lie in the inner half of the box (per side)
EWF_PRIOR_FACTOR = 4.0  # EWF's prior weight: this many times the records per client per cluster
EWF_NOISE_PRIVATE_START = 0.2  # EWF: below this e (DWF's), a private seeding round instead of the spread start


@dataclass(frozen=True)
class DPPlan:
    """What the estimator runs: Lloyd rounds, the start, and the facts the rule used."""

    rounds: int
    start: np.ndarray | None  # None: the estimator's own init (a rounds-only plan) or private seeding
    noise_level: float  # e above
    one_release_z: float
    n_records: int
    private_start: bool = False  # e < E_p: start from a private seeding round (init="private")
    refine_rounds: int = 0  # G candidate-vote rounds between the start and the Lloyd rounds
    refine_mutants: int = 0  # L mutants per centre in each of them
    refine_candidates: int = 0  # P = k (L + 1) candidates (vote counts) per round
    refine_weight: float = REFINE_WEIGHT  # each refinement round's weight in the schedule
    #: EWF's prior weight m of its local centres (:func:`ewf_prior_weight`); None for other estimators
    prior_weight: float | None = None
    #: the noise level the rounds were planned from when it is not e (EWF: :func:`ewf_round_records`)
    round_noise_level: float | None = None

    @property
    def final_round_weight(self) -> float:
        """Weight of the last Lloyd round (the others 1): R - 1 when R >= 3, else 1."""
        return final_round_weight(self.rounds)

    @property
    def relocate_low_count_rows(self) -> bool:
        """In d <= 2, rows whose noisy count is below one count sigma move next to the largest
        clusters (:meth:`protocols.dp.postprocessing.PostProcessor._relocated`): when R >= 3."""
        return self.rounds >= RELOCATE_MIN_ROUNDS

    @property
    def first_round_prior(self) -> str:
        """What the first of several Lloyd rounds shrinks towards: ``"start"`` when e > E_s and
        the plan has its own start, else ``"overall mean"`` (hierarchical)."""
        high = self.rounds > 1 and self.start is not None and self.noise_level > NOISE_START_PRIOR
        return "start" if high else "overall mean"

    def describe(self) -> dict:
        out = {
            "rounds": self.rounds,
            "first_round_prior": self.first_round_prior,
            "start": ("private seeding (init='private': one more noised release, given half of the budget)"
                      if self.private_start else
                      "the estimator's init (rounds-only plan)" if self.start is None
                      else "spread (data-independent maximin points in the inner half of the domain)"),
            "final_round_weight": self.final_round_weight,
            "relocate_low_count_rows": self.relocate_low_count_rows,
            "noise_level": self.noise_level,
            "one_release_noise_multiplier": self.one_release_z,
            "records_declared_public": self.n_records,
            "refine_rounds": self.refine_rounds,
            "refine_mutants": self.refine_mutants,
            "refine_candidates": self.refine_candidates,
            "refine_weight": self.refine_weight if self.refine_rounds else None,
            "rule": "protocols.dp.planning (R = 1 if e > 0.7 else 1 + ceil(log2(0.7 / e) / 2) in [2, 6]; "
                    "a private seeding start if e < 0.1, else spread points; "
                    "the last of R >= 3 Lloyd rounds weighted R - 1 (as much budget as the rounds before it); "
                    "in d <= 2 with R >= 3, rows below one count sigma moved next to the largest clusters; "
                    "radius-bounded rounds after the first; step shrinkage towards the broadcast centres, "
                    "in the first of several rounds only if e > 0.35; "
                    f"{REFINE_ROUNDS} candidate-vote rounds after the start if k >= {REFINE_MIN_CLUSTERS} and "
                    f"{REFINE_MIN_FEATURES} <= d <= {REFINE_MAX_FEATURES})",
        }
        if self.prior_weight is not None:
            out["prior_weight"] = self.prior_weight
        if self.round_noise_level is not None:
            out["round_noise_level"] = self.round_noise_level
        return out


def spread_start(k: int, low: np.ndarray, high: np.ndarray, seed, spread: float = SPREAD, candidates: int = 64,
                 ball=None):
    """k points in the inner ``spread`` of the box, greedily far apart (maximin); with ``ball``
    (a :class:`securefkm.domain.Ball`), in the concentric ball of ``spread`` times its radius."""
    rng = np.random.default_rng([int(seed) & (2**63 - 1), 20])
    if ball is not None:
        pool = ball.sample(candidates * k, len(low), rng, fraction=spread)
    else:
        centre, half = (low + high) / 2, (high - low) / 2
        pool = centre + rng.uniform(-spread, spread, size=(candidates * k, len(low))) * half
    picked = [0]
    dmin = ((pool - pool[0]) ** 2).sum(axis=1)
    for _ in range(k - 1):
        j = int(dmin.argmax())
        picked.append(j)
        dmin = np.minimum(dmin, ((pool - pool[j]) ** 2).sum(axis=1))
    return pool[picked].copy()


def final_round_weight(rounds: int) -> float:
    """Weight of the last of ``rounds`` Lloyd rounds (the others weight 1): R - 1 for R >= 3, so
    the final round gets as much of the budget as the rounds before it together; 1 for R <= 2."""
    return float(rounds - 1) if rounds >= 3 else 1.0


def lloyd_rounds(noise_level: float) -> int:
    if noise_level > NOISE_ONE_ROUND:
        return 1
    return int(min(MAX_ROUNDS, max(2, 1 + math.ceil(math.log2(NOISE_ONE_ROUND / noise_level) / 2))))


def refine_applies(k: int, d: int) -> bool:
    """Whether the plan runs candidate-vote refinement rounds: many clusters in moderate
    dimension, k >= 16 and 4 <= d <= 64 (public k and d only)."""
    return k >= REFINE_MIN_CLUSTERS and REFINE_MIN_FEATURES <= d <= REFINE_MAX_FEATURES


def schedule_weight(rounds: int, private_start: bool, refine_rounds: int = 0, refine_weight: float = REFINE_WEIGHT):
    """Total weight W of one run's planned rounds: the seeding round's R (if any), the Lloyd
    rounds' (R - 1 + :func:`final_round_weight`) and the refinement rounds' G w."""
    lloyd = rounds - 1 + final_round_weight(rounds)
    return lloyd + (rounds if private_start else 0) + refine_rounds * refine_weight


def refine_mutants(k: int, n_records: int, vote_sigma: float) -> int:
    """L mutants per centre such that the n / (k (L + 1)) records per candidate are about
    ``REFINE_VOTES_PER_SIGMA`` vote-noise sigmas, within [2, 32]: more candidates cover the
    data more finely, but a candidate's votes must stand out of its noise."""
    per_sigma = n_records / (k * REFINE_VOTES_PER_SIGMA * max(vote_sigma, 1e-12))
    return int(np.clip(math.floor(per_sigma) - 1, REFINE_MIN_MUTANTS, REFINE_MAX_MUTANTS))


def plan(k: int, d: int, epsilon: float, delta: float, low, high, n_records: int, seed, accountant: str = "prv",
         ball=None, refine_rounds: int | None = None) -> DPPlan:
    """The default DP plan for k-means on n_records records in the box [low, high]^d, or in
    ``ball`` (a :class:`securefkm.domain.Ball`; ``low``, ``high`` its bounding box).
    ``refine_rounds``: G candidate-vote rounds (None: :func:`refine_applies`'s rule)."""

    low = np.broadcast_to(np.asarray(low, dtype=np.float64), (d,))
    high = np.broadcast_to(np.asarray(high, dtype=np.float64), (d,))
    e, z1 = noise_level(k, d, epsilon, delta, n_records, accountant)
    R, private = lloyd_rounds(e), e < NOISE_PRIVATE_START
    G = (REFINE_ROUNDS if refine_applies(k, d) else 0) if refine_rounds is None else int(refine_rounds)
    refine = {}
    if G:
        # a vote count's noise: z1 sqrt(W / w) (the schedule's rounds compose as one Gaussian of
        # weight W, of which a round of weight w gets w)
        sigma = z1 * math.sqrt(schedule_weight(R, private, G) / REFINE_WEIGHT)
        L = refine_mutants(k, n_records, sigma)
        refine = dict(refine_rounds=G, refine_mutants=L, refine_candidates=k * (L + 1))
    start = None if private else spread_start(k, low, high, seed, ball=ball)
    return DPPlan(R, start, e, z1, int(n_records), private_start=private, **refine)


def ewf_prior_weight(n_records: int, n_clients: int, k: int) -> float:
    """EWF's default prior weight m = 4 n / (clients k) (:data:`EWF_PRIOR_FACTOR` times the public
    number of records a client holds per cluster on average).

    The local centres (S_ij + m C_j) / (n_ij + m) have sensitivity diameter / (1 + m)
    (:class:`securefkm.messages.FieldSpec` ``prior_weight``): the round's average over I clients
    carries the noise of one mean over about 2 (1 + m) I / k records (:func:`ewf_round_records`),
    while a client with n_ij records of a cluster moves its centre n_ij / (n_ij + m) of the way to
    their mean. A larger m trades step length for noise; as m grows the round tends to a Lloyd step
    of length n_j / (I m) (the prior-weighted means' fixed point is then Lloyd's). The factor 4
    was read off factors 1, 2, 4, 8, 16 at epsilon 1 on the four sets of
    ``benchmarks.dp_every_algorithm`` (10 seeds, utility over DWF's: digits 0.59 / 0.68 / 0.72 /
    0.74 / 0.70, wine 0.69 / 0.72 / 0.74 / 0.65 / 0.60, breast cancer 0.74-0.76, the blob set
    0.90 at 1 and 0.96-0.97 above)."""
    return EWF_PRIOR_FACTOR * float(n_records) / (max(1, int(n_clients)) * max(1, int(k)))


def ewf_round_records(k: int, d: int, n_clients: float, prior_weight: float, cells: int = 1) -> float:
    """The records N of a Lloyd round whose cluster mean is as noisy as EWF's eq. 8 average.

    EWF's round releases sum_i c_ij over I clients with L2 sensitivity sqrt(cells) diam / (1 + m),
    diam = 2 R (R the half-diagonal), all of it to one field: the average's noise has expected norm
    z sqrt(d) sqrt(cells) 2 R / ((1 + m) I). A Lloyd round's mean over N / k records has
    z sqrt(d) R k / (N sqrt(1 - c)) (:func:`noise_level`); they are equal at
    N = k (1 + m) I / (2 sqrt(cells) sqrt(1 - c)), so ``noise_level(..., N)`` is EWF's relative noise."""
    from .calibration import auto_count_share

    return k * (1.0 + prior_weight) * n_clients / (2.0 * math.sqrt(cells) * math.sqrt(1.0 - auto_count_share(d)))


def noise_level(k: int, d: int, epsilon: float, delta: float, n_records: int, accountant: str = "prv"):
    """(e, z_1) of the rule above: the relative noise of one cluster mean when the whole
    budget goes to one Lloyd round, and that round's noise multiplier."""
    from .accounting import noise_multiplier_for
    from .calibration import auto_count_share

    z1 = noise_multiplier_for(epsilon, delta, 1, 1.0, accountant=accountant)
    c = auto_count_share(d)
    return z1 * math.sqrt(d) * k / (max(n_records, 1) * math.sqrt(1.0 - c)), z1
