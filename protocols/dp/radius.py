"""Radius-bounded Lloyd rounds (FastLloyd's relative updates: Diaa, Humphries & Kerschbaum,
USENIX Security 2025, sec. 4): the :class:`RadiusBound` a :class:`~protocols.dp.GaussianDP` layer holds.

In a round whose weighted sums are hard nearest-centre sums of the broadcast centres C (the
algorithm declares it: ``Algorithm.nearest_centre_actions``), each client moves every record x
farther than r from its nearest centre c_j onto the sphere of radius r around it,
x' = c_j + (x - c_j) r / ||x - c_j|| (``client_data``: a function of the record and the public C
and r), and the layer noises T_j = S_j - N_j c_j instead of S_j - N_j (box centre). One record
then moves T by at most r: the sum sensitivity is r instead of the box's half-diagonal. x' lies
on the segment from c_j to x, inside c_j's Voronoi cell (convex, and it contains c_j), so the
algorithm still assigns it to c_j, and inside the box whenever c_j is (the box is convex; the
layer projects the released means into it). The sensitivity needs only ||x' - c_j|| <= r; the
box check applies to the records as given, before clipping. The noisy mean
c_j + T'_j / N'_j is projected onto the ball B(c_j, r) (every record's x' lies in it, so the true
mean does: post-processing that can only move the estimate closer).

Clipping, not FastLloyd's dropping of the records beyond r: with dropping, a cluster that lies
beyond r of every centre is left out of every sum and never found (iris at eps 1: setosa without
a centre in 2% of the tuning seeds); a clipped record still pulls its centre towards it by r.
The centre becomes an M-estimate of location (the clipped offsets sum to zero at a fixed point,
as Huber's estimator with threshold r) instead of the truncated mean. On the tuning seeds
1000-1099 of FastLloyd's grid clipping is better than dropping in every cell with a radius
round (iris eps 0.25 -0.36 / -0.32, eps 0.5 -0.18 / -0.11, central / distributed; the current
figures: docs/protocols/dp-utility.md).

The first Lloyd round of a run (``ctx.round == 0``, or the round right after a seeding round)
centres its sums on the domain's centre: the start is not yet near the data. ``radius="auto"``
uses FastLloyd's fraction of the box diagonal, r = diag * alpha / (2 k^(1/d)) with alpha = 0.8,
capped at 1.25 times the radius of the d-ball whose volume is 1/k of the box's, and only when it
is below the half-diagonal (otherwise the box-centre translation is at least as tight). For a
ball domain of radius R (``clip=R``) the diameter 2R takes the diagonal's place,
r = 0.8 R / k^(1/d); the ball's own volume-matched radius R k^(-1/d) is above it, so the cap never
binds.

Why the cap: k evenly spread centres cut the box into cells of volume vol(box) / k, and
FastLloyd's k^(-1/d) is that scaling in k; but its constant (alpha times the half-diagonal)
ignores how fast a d-ball outgrows the box: at d = 30 the ball of radius 0.8 x half-diagonal
holds about 10^5 boxes, so it bounds nothing and the sum sensitivity stays near the
half-diagonal. The volume-matched radius, (vol(box) Gamma(d/2 + 1) / (k pi^(d/2)))^(1/d), is the
same idea with the right constant; it equals FastLloyd's at d = 2 and falls to 0.84 of it at
d = 4, 0.70 at d = 13, 0.65 at d = 30, 0.63 at d = 64. The factor 1.25 keeps FastLloyd's radius
where the two are within 25% (d <= 5 for a cube): on the tuning seeds a smaller radius hurt iris
(d = 4: 0.84 x, +0.22 +- 0.04; 0.92 x, +0.12 +- 0.03), while the cap helped every cell where it
binds (wine, breast cancer, make_blobs k = 2 d = 20, digits; docs/protocols/dp-utility.md).
"""

from __future__ import annotations

import math

import numpy as np

ALPHA = 0.8
VOLUME_FACTOR = 1.25
_INSIDE = 1.0 - 1e-9  # clipped records land this fraction of r from their centre


def volume_radius(sides, k: int) -> float:
    """Radius of the d-ball whose volume is 1/k of the box with these side lengths (all > 0)."""
    sides = np.asarray(sides, dtype=np.float64)
    d = len(sides)
    log_r = (float(np.log(sides).sum()) + math.lgamma(d / 2 + 1) - math.log(k) - d / 2 * math.log(math.pi)) / d
    return math.exp(log_r)


def auto_radius(diagonal: float, k: int, d: int, alpha: float = ALPHA, sides=None) -> float:
    """FastLloyd's radius for the rounds after the first, diag * alpha / (2 k^(1/d)), capped at
    ``VOLUME_FACTOR`` times :func:`volume_radius` when the box's ``sides`` are given (all > 0)."""
    r = diagonal * alpha / (2 * k ** (1.0 / d))
    if sides is not None and np.all(np.asarray(sides) > 0):
        r = min(r, VOLUME_FACTOR * volume_radius(sides, k))
    return r


def first_bounded_round(algo, max_rounds, actions) -> int:
    """Index of a run's first round of ``actions`` (its first Lloyd round, which the bound skips):
    from the algorithm's ``planned_sequence`` (after a seeding round and any refinement rounds),
    else 1 after a seeding round and 0 without."""
    try:
        seq = list(algo.planned_sequence(max_rounds)) if callable(getattr(algo, "planned_sequence", None)) else []
        first = next((i for i, a in enumerate(seq) if a in actions), None)
        if first is not None:
            return first
        planned = getattr(algo, "planned_actions", None)
        seeding = any(a.startswith("init.") for a in (planned(max_rounds) if callable(planned) else {}))
    except Exception:  # noqa: BLE001 - an algorithm without a usable schedule: radius from round 1
        seeding = False
    return 1 if seeding else 0


class RadiusBound:
    """The fit's radius bound: r, the actions whose rounds it bounds, and the first round it
    applies in (after a seeding round, the second). Inactive (``value`` None) by default."""

    def __init__(self, value: float | None = None, actions: tuple[str, ...] = (), first_train: int = 0):
        self.value = value
        self.actions = tuple(actions)
        self.first_train = first_train

    @classmethod
    def for_fit(cls, radius, info, diameter: float, centred_radius: float, sides=None) -> RadiusBound:
        """The bound a fit's rounds use: ``radius`` (a float, ``"auto"`` or None) for the
        algorithm's ``nearest_centre_actions``, kept only below the domain's centred radius
        (otherwise the domain-centre translation is at least as tight). ``sides``: the box's
        side lengths (they cap ``"auto"``), None for a ball."""
        if radius is None:
            return cls()
        algo = info.algorithm
        actions = tuple(getattr(algo, "nearest_centre_actions", ()) or ())
        if not actions:
            return cls()
        d = info.n_features
        if radius == "auto":
            k = int(getattr(algo, "n_clusters", 0) or 0)
            if k < 1:
                return cls(None, actions)
            # a ball's volume-matched radius R k^(-1/d) is above FastLloyd's: no cap
            r = auto_radius(diameter, k, d, sides=sides)
        else:
            r = float(radius)
        return cls(r if r < centred_radius else None, actions, first_bounded_round(algo, info.max_rounds, actions))

    def round_radius(self, ctx) -> float | None:
        """r for this round, or None (domain-centre translation)."""
        r = self.value
        if r is None or ctx is None or ctx.action not in self.actions or ctx.round <= self.first_train:
            return None
        centres = getattr(ctx.broadcast, "centres", None)
        return r if centres is not None else None

    def row_centres(self, ctx, pairs) -> np.ndarray | None:
        """The broadcast centres (rows of the weighted sums) in a radius round, else None."""
        if self.round_radius(ctx) is None:
            return None
        return np.asarray(ctx.broadcast.centres, dtype=np.float64) if pairs else None

    def clip(self, X: np.ndarray, ctx) -> np.ndarray:
        """Each record farther than r from its nearest broadcast centre moved onto the sphere of
        radius r around that centre (a new array; unchanged outside radius rounds)."""
        r = self.round_radius(ctx)
        if r is None or len(X) == 0:
            return X
        C = np.asarray(ctx.broadcast.centres, dtype=np.float64)
        d2 = (X * X).sum(axis=1)[:, None] - 2 * X @ C.T + (C * C).sum(axis=1)[None, :]
        nearest = C[d2.argmin(axis=1)]
        offset = X - nearest
        norms = np.sqrt(np.einsum("ij,ij->i", offset, offset))
        far = norms > r * _INSIDE
        out = X.copy()
        # a hair inside the sphere: a record on a Voronoi boundary whose nearest centre the
        # algorithm's own distance computation resolves differently is still within r of it
        out[far] = nearest[far] + offset[far] * (r * _INSIDE / norms[far])[:, None]
        return out

    @staticmethod
    def project(means: np.ndarray, centres: np.ndarray, r: float) -> np.ndarray:
        """Each row of ``means`` projected onto the ball of radius r about its row of ``centres``."""
        step = means - centres
        dist = np.linalg.norm(step, axis=1)
        far = dist > r
        out = means.copy()
        out[far] = centres[far] + step[far] * (r / dist[far])[:, None]
        return out
