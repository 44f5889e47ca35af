"""Candidate-vote refinement: the operators of PE-means (Humphries, Lin & Yekhanin, "PE-means:
Improved Differentially Private k-means Clustering through Private Evolution", arXiv
2606.00342) as federated rounds of DWF (``action="refine"``).

One refinement round (one PE-means generation):

1. **Variation** (server, post-processing): the population is the current centres and ``L``
   mutants of each (:func:`candidates`), a Gaussian step whose size is a fraction of the
   centre's distance to its nearest other centre, halved every generation
   (:func:`step_sizes`), projected into the declared domain. Everything it reads is released
   (the centres) or public (the domain, the seed, the generation).
2. **Vote** (clients): every record votes for its nearest candidate; a client returns the
   vote histogram (:func:`vote_counts`), a count field of shape (P,). Adding or removing one
   record changes one count by 1: L2 sensitivity 1, as PE-means's histogram.
3. **Threshold** (server, post-processing of the noisy sum): the largest noisy counts down to
   the one where their running sum reaches the public number of records N are kept, the rest
   and every negative count become 0 (:func:`threshold_counts`, PE-means's rule).
4. **Selection** (server): weighted k-means (k clusters, 10 k-means++ starts, the server's
   seeded generator) over the candidates, the thresholded counts as weights: the new centres
   (:func:`select_centres`). The restarts re-cluster the whole weighted population, so a centre
   left between two clusters and two centres sharing one are undone when the candidates cover
   the data -- the local optima a few Lloyd rounds stay in.

Unlike PE-means the rounds start from the library's start (private seeding or spread points)
and are followed by Lloyd rounds, so a few generations and a few mutants per centre suffice;
the DP plan (:mod:`protocols.dp.planning`) fixes their number and budget share.
"""

from __future__ import annotations

import numpy as np

from ..domain import Ball
from ._kmeans import assign, weighted_kmeans

#: a mutant's step norm as a fraction of its centre's nearest-centre distance, in generation 0
#: (halved in each later generation: :func:`step_sizes`)
STEP_FRACTION = 0.5
DEFAULT_MUTANTS = 8  # L of refinement rounds asked for outside the DP plan
SELECTION_STARTS = 10  # k-means++ starts of the selection (PE-means's 10)
_VOTE_ROWS = 1 << 13  # records assigned per pass (bounds the (rows, P) distance matrix)


def step_sizes(centres: np.ndarray, generation: int, fraction: float | None = None) -> np.ndarray:
    """Per centre, the norm of its mutants' steps: ``fraction * 2^-generation`` times its
    distance to the nearest other centre (released centres only; a lone centre uses the
    largest pairwise distance, 0 if all coincide)."""
    C = np.asarray(centres, dtype=np.float64)
    if len(C) < 2:
        return np.zeros(len(C))
    fraction = STEP_FRACTION if fraction is None else fraction
    d2 = ((C[:, None, :] - C[None, :, :]) ** 2).sum(axis=-1)
    np.fill_diagonal(d2, np.inf)
    nearest = np.sqrt(d2.min(axis=1))
    return fraction * 0.5 ** int(generation) * np.where(np.isfinite(nearest), nearest, 0.0)


def project(points: np.ndarray, domain) -> np.ndarray:
    """Points moved into the declared domain: onto a :class:`Ball`, or clipped to a box (low,
    high); unchanged without one (``None``)."""
    if domain is None:
        return points
    if isinstance(domain, Ball):
        return domain.project(points)
    low, high = domain
    return np.clip(points, low, high)


def candidates(centres: np.ndarray, mutants: int, generation: int, rng: np.random.Generator, domain) -> np.ndarray:
    """The population of a refinement round, ``(k (L + 1), d)``: the centres, then ``L =
    mutants`` mutants of each, centre j's displaced by an isotropic Gaussian step of expected
    squared norm ``step_sizes(...)[j]^2`` (per-coordinate sd ``s_j / sqrt(d)``), projected into
    the domain (PE-means's variation step, with a Gaussian instead of a Levy step)."""
    C = np.asarray(centres, dtype=np.float64)
    k, d = C.shape
    s = step_sizes(C, generation)
    steps = rng.standard_normal((k, int(mutants), d)) * (s / np.sqrt(d))[:, None, None]
    return np.vstack([C, project((C[:, None, :] + steps).reshape(-1, d), domain)])


def vote_counts(X: np.ndarray, population: np.ndarray) -> np.ndarray:
    """One client's votes: how many of its records have each candidate as their nearest (ties to
    the lowest index), chunked over the records; sums to ``len(X)``."""
    X = np.asarray(X, dtype=np.float64)
    P = len(population)
    votes = np.zeros(P, dtype=np.int64)
    for i in range(0, len(X), _VOTE_ROWS):
        votes += np.bincount(assign(X[i:i + _VOTE_ROWS], population)[0], minlength=P)
    return votes


def threshold_counts(noisy: np.ndarray, n_records: float) -> np.ndarray:
    """PE-means's threshold: keep the largest noisy counts down to the one where their running
    sum first reaches ``n_records`` (all positive ones if it never does); the rest and every
    negative count become 0."""
    noisy = np.asarray(noisy, dtype=np.float64)
    order = np.sort(noisy)[::-1]
    hit = np.flatnonzero(np.cumsum(order) >= n_records)
    cut = order[hit[0]] if hit.size else 0.0
    return np.where((noisy >= cut) & (noisy > 0), noisy, 0.0)


def select_centres(population: np.ndarray, weights: np.ndarray, k: int, rng: np.random.Generator,
                   fallback: np.ndarray) -> np.ndarray:
    """Weighted k-means over the population (the selection); ``fallback`` (the current centres)
    when fewer than k candidates kept a positive weight."""
    keep = weights > 0
    if keep.sum() < k:
        return np.asarray(fallback, dtype=np.float64).copy()
    return weighted_kmeans(population[keep], k, rng, weights=weights[keep], n_init=SELECTION_STARTS)
