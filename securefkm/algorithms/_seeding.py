"""How the first global centres are chosen: shared by the iterative algorithms.

=================  ======================================================  =================
``init``           what happens                                            server sees
=================  ======================================================  =================
``"k-means++"``    one random client seeds k centres with k-means++ on     k raw records
                   its own records (DWF paper, Holzer et al. sec. 3.4)
``"random"``       one random client sends k of its records at random      k raw records
``"kfed"``         k-FED (Dennis et al. 2021) as a first round: sampled    local centres
                   clients send local k-means centres, the server runs
                   k-means over them (DWF paper sec. 2.3 suggests it)
``"private"``      one round of *sum-fields*: records fall into buckets    the sum over
                   (a grid, or the Voronoi cells of public random points:  clients of
                   data-independent, from a public seed) and each client   per-bucket
                   returns per-bucket
                   counts and coordinate sums; the server runs weighted    counts/sums
                   k-means over the bucket means. Goes through the same    (protected)
                   protection stack and DP budget as training rounds.
``"uniform"``      k centres uniform in the declared ``init_bounds`` box   nothing
                   (or ball)
array              the given centres                                        nothing
=================  ======================================================  =================

The ``"private"`` seeding follows the idea of LSH-based private clustering (a partition of
space fixed independently of the data, so a bucket histogram with sums has the same per-record
sensitivity as one Lloyd round: one count and one clipped record). Above 3 features, when
there are at least 3^d buckets (3 per axis, as a grid has; with about 6 buckets per cluster:
d = 4 with k >= 11, d = 5 with k >= 22, d = 6 with k >= 86), they are the Voronoi cells of 2^bits public points
drawn uniformly in the declared domain (:func:`seeding_candidates`), not the cones of random
hyperplanes through its centre: a cone holds records at every distance from the centre, so
with many clusters several fall into one bucket and its mean lies between them. With fewer
points per axis the Voronoi cells of random points are themselves cones in effect (the points
lie near the domain's surface) and the hyperplanes are kept. Held-out blob sets
(``benchmarks.pe_means`` names ``blobs-K<K>-D<D>-S<s>``: ``make_blobs(20000, D, centers=K,
random_state=s)`` in the unit ball; ``python -m benchmarks.pe_means --paired <sets>
[--buckets hyperplanes]``), seeded noise paired over seeds 700-707, central DP,
hyperplanes -> Voronoi cells, mean per-point loss at epsilon 0.5 / 2: K = 64, D = 4, s = 2:
0.0185 / 0.0136 -> 0.0152 / 0.0115 (paired standard errors 0.0011 / 0.0006); K = 16, D = 4, s
= 2: 0.0131 / 0.0116 -> 0.0115 / 0.0114; s = 3: 0.0152 / 0.0153 -> 0.0146 / 0.0144. At D = 16
(1.4 points per axis: the hyperplanes kept) Voronoi cells measured no better (K = 16, s = 2:
0.0180 / 0.0162 -> 0.0272 / 0.0219; K = 64: 0.0609 / 0.0431 -> 0.0645 / 0.0404).

The first three send data-derived values in plain; the estimators refuse them under a
protection stack unless the user asks for them explicitly (see
``securefkm.estimators.base``). A client with fewer than k records answers with nothing
and the server asks another random client.
"""

from __future__ import annotations

import numpy as np

from ..domain import Ball
from ..exceptions import InputError
from ..messages import AggregatedUpdate, Broadcast, Update
from ._kmeans import assign, local_kmeans, seed_kmeans_plusplus, uniform_in_bounds, weighted_kmeans

SEEDING_ROUND_INITS = ("k-means++", "random", "kfed", "private")
INIT_CHOICES = SEEDING_ROUND_INITS + ("uniform",)
PLAIN_INITS = ("k-means++", "random", "kfed")  # inits that reveal client data in plain ("private" sends
# protected sum-fields through the stack, like a training round)


def initial_centres(init, k: int, n_features: int, rng, init_bounds=None):
    """Centres available without a round, or None if a seeding round is needed."""
    if isinstance(init, np.ndarray):
        return init.astype(np.float64, copy=True)
    if init == "uniform":
        if init_bounds is None:
            raise InputError("init='uniform' needs init_bounds=(low, high), the declared data range.")
        return uniform_in_bounds(init_bounds, k, n_features, rng)
    return None


_MORRIS_STEPS = 10
SHRINK = "coordinate"  # shrinkage of the seeding bucket means in >= 3-d: "coordinate" or "vector"
_THRESHOLD_SIGMAS = 3.0  # buckets kept: noisy count >= this many count-noise sigmas
SEEDING_ACTIONS = {"private": "init.private", "k-means++": "init.kmeans++", "random": "init.random", "kfed": "init.kfed"}


def seeding_action(init) -> str | None:
    """The broadcast action of ``init``'s seeding round, or None if it needs no round."""
    if isinstance(init, np.ndarray):
        return None
    return SEEDING_ACTIONS.get(init)


#: the private seeding grids the declared box up to this many features; above, the Voronoi cells
#: of public random points when there are at least VORONOI_PER_AXIS^d of them, else random
#: hyperplanes (module docstring)
GRID_MAX_FEATURES = 3
VORONOI_PER_AXIS = 3
#: most bucket bits above GRID_MAX_FEATURES (about 6 buckets per cluster up to this cap; :func:`lsh_bits`)
MAX_BITS_ABOVE_GRID = 10


def voronoi_buckets(bits: int, n_features: int) -> bool:
    """Whether the 2^bits buckets above 3 features are Voronoi cells of public points: when
    they are at least ``VORONOI_PER_AXIS`` per axis, 2^bits >= 3^d, as a grid's are (module
    docstring)."""
    return n_features > GRID_MAX_FEATURES and (1 << bits) >= VORONOI_PER_AXIS ** n_features


#: with a known noise level e (the DP plan's), a grid has GRID_CELLS_NOISE / e cells per cluster,
#: between 4 and 16 (below)
GRID_CELLS_NOISE = 0.3


def lsh_bits(k: int, n_features: int = 2, noise_level: float | None = None) -> int:
    """Bucket bits for the private seeding.

    Up to 3 features (a grid): about 16 cells per cluster, 6 to 10 bits. Above (Voronoi
    cells or hyperplanes): about 6 buckets per cluster, 4 to 10 bits. Every bucket mean carries
    d-dimensional noise of norm ~ sqrt(d) sigma_sum / count, so in high dimension few, large
    buckets seed better: on digits (d = 64, k = 10) at epsilon 1 (simulation, with the
    shrinkage below) 32-64 buckets gave about 1.45 after one noisy Lloyd round and 128
    buckets 1.50-1.53, and without noise 64 and 256 buckets give the same start
    (docs/protocols/dp-utility.md). Up to 10 bits, not 8 (the cap binds from k = 43 on):
    with 64 clusters, 256 buckets (4 per cluster) left clusters sharing a bucket; on held-out
    ``blobs-K64-D<D>-S2`` sets (``python -m benchmarks.pe_means --paired <sets> [--max-bits 8]
    --paired-seeds 4``; seeded noise paired over seeds 700-703, central DP, mean
    per-point loss at epsilon 2) 8 -> 10 bits gave D = 4: 0.0117 -> 0.0104, D = 16: 0.0447 ->
    0.0350, D = 64: 0.0466 -> 0.0407, D = 128: 0.0535 -> 0.0387 (3 seeds); at epsilon 0.5 D = 4:
    0.0154 -> 0.0142, D = 16: 0.0659 -> 0.0561, D = 64 and 128 equal (their plan starts from spread
    points: no seeding round).

    When the DP plan's noise level e is given (``noise_level``; :mod:`protocols.dp.planning`),
    a grid has B = clip(0.3 / e, 4, 16) cells per cluster, 4 to 10 bits: the noise of a
    bucket mean grows with the cells per cluster, and at 0.02 < e < 0.1 (a few hundred
    records per cluster in 2-D or 3-D) 16-32 cells per cluster gave buckets too noisy to
    seed from. Read off the 2-D and 3-D shapes of ``protocols_dp.off_table_grid`` on tuning
    seeds 1000-1039 (C = 0.2, 0.3, 0.5, 0.8 measured; 0.3 kept), e.g. 250 records, k = 5,
    eps 1 (e = 0.088): 2.97 / 3.46 -> 2.22 / 2.29 (central / distributed; FastLloyd 2.82).
    At the low noise of larger data sets (e <= 0.019) B = 16, as without a plan.
    """
    if n_features <= GRID_MAX_FEATURES:
        if noise_level is not None and noise_level > 0:
            cells = float(np.clip(GRID_CELLS_NOISE / noise_level, 4, 16))
            return int(np.clip(np.ceil(np.log2(cells * k)), 4, 10))
        return int(np.clip(np.ceil(np.log2(16 * k)), 6, 10))
    return int(np.clip(np.ceil(np.log2(6 * k)), 4, MAX_BITS_ABOVE_GRID))


def _hyperplanes(params: dict, n_features: int):
    """Public random hyperplanes (Gaussian normals, from the public seed) through the centre
    of the declared box."""
    rng = np.random.default_rng(params["lsh_seed"])
    low = np.broadcast_to(np.asarray(params["low"], dtype=np.float64), (n_features,))
    high = np.broadcast_to(np.asarray(params["high"], dtype=np.float64), (n_features,))
    normals = rng.normal(size=(params["bits"], n_features))
    return normals, normals @ ((low + high) / 2)


def seeding_candidates(params: dict, n_features: int) -> np.ndarray:
    """The 2^bits public points whose Voronoi cells are the buckets above 3 features: uniform in
    the declared ball (``params["radius"]`` about ``params["centre"]``) or box, from the public
    seed (data independent; every client draws the same points)."""
    rng = np.random.default_rng([int(params["lsh_seed"]), 21])
    n = 1 << params["bits"]
    if "radius" in params:
        return Ball(params["centre"], params["radius"]).sample(n, n_features, rng)
    low = np.broadcast_to(np.asarray(params["low"], dtype=np.float64), (n_features,))
    high = np.broadcast_to(np.asarray(params["high"], dtype=np.float64), (n_features,))
    return low + (high - low) * rng.random((n, n_features))


_BUCKET_ROWS = 1 << 15  # records assigned to the candidates per pass (bounds the distance matrix)


def lsh_buckets(X: np.ndarray, params: dict) -> np.ndarray:
    """Bucket of each record: a regular grid over the declared box in up to 3 dimensions, the
    nearest of the public :func:`seeding_candidates` when :func:`voronoi_buckets`, else random
    hyperplanes through the domain's centre."""
    d = X.shape[1]
    if d <= GRID_MAX_FEATURES:
        n_buckets = 1 << params["bits"]
        g = int(np.floor(n_buckets ** (1.0 / d) + 1e-9))
        low = np.broadcast_to(np.asarray(params["low"], dtype=np.float64), (d,))
        high = np.broadcast_to(np.asarray(params["high"], dtype=np.float64), (d,))
        cell = np.clip(((X - low) / (high - low) * g).astype(np.int64), 0, g - 1)
        return cell @ (g ** np.arange(d, dtype=np.int64))
    if voronoi_buckets(params["bits"], d):
        C = seeding_candidates(params, d)
        X = np.asarray(X, dtype=np.float64)
        out = np.empty(len(X), dtype=np.int64)
        for i in range(0, len(X), _BUCKET_ROWS):
            out[i:i + _BUCKET_ROWS] = assign(X[i:i + _BUCKET_ROWS], C)[0]
        return out
    normals, offsets = _hyperplanes(params, d)
    bits = (X @ normals.T > offsets).astype(np.int64)
    return bits @ (1 << np.arange(bits.shape[1], dtype=np.int64))


def seeding_broadcast(init: str, k: int, *, init_bounds=None, rng=None, n_features: int | None = None,
                      noise_level: float | None = None) -> Broadcast:
    """The seeding round's broadcast; ``noise_level``: the DP plan's e, which sizes the
    private seeding's grid (:func:`lsh_bits`)."""
    if init == "private":
        if init_bounds is None:
            raise InputError("init='private' needs init_bounds=(low, high), the declared data range.")
        low, high = init_bounds
        params = {
            "k": k,
            "bits": lsh_bits(k, int(n_features), noise_level),
            "lsh_seed": int(rng.integers(2**63 - 1)),
            "low": np.asarray(low, dtype=np.float64).tolist(),
            "high": np.asarray(high, dtype=np.float64).tolist(),
            "n_features": int(n_features),
        }
        if isinstance(init_bounds, Ball):  # the candidates are drawn in the ball, not its bounding box
            params.update(centre=init_bounds.centre.tolist(), radius=init_bounds.radius)
        return Broadcast(action="init.private", params=params)
    if init == "k-means++":
        return Broadcast(action="init.kmeans++", params={"k": k}, sample="one")
    if init == "random":
        return Broadcast(action="init.random", params={"k": k}, sample="one")
    if init == "kfed":
        return Broadcast(action="init.kfed", params={"k_local": k})
    raise InputError(f"init={init!r} has no seeding round.")


def seeding_sum_fields(broadcast: Broadcast):
    """Sum-fields of a seeding round (only the private seeding has any). Derived from the
    broadcast alone, so a client in another process declares the same layout."""
    from ..messages import FieldSpec

    if broadcast.action != "init.private":
        return ()
    n_buckets = 1 << broadcast.params["bits"]
    n_features = broadcast.params["n_features"]
    return (
        FieldSpec("bucket_counts", (n_buckets,), "count", integer=True),
        FieldSpec("bucket_sums", (n_buckets, n_features), "sum", weighted_by="bucket_counts"),
    )


def seeding_client_update(X: np.ndarray, broadcast: Broadcast, rng: np.random.Generator) -> Update:
    action = broadcast.action
    if action == "init.private":
        from ._kmeans import segment_sums

        n_buckets = 1 << broadcast.params["bits"]
        sums, counts = segment_sums(lsh_buckets(X, broadcast.params), X, n_buckets)
        return Update(sums={"bucket_counts": counts, "bucket_sums": sums})
    if action == "init.kfed":
        centres, sizes = local_kmeans(X, broadcast.params["k_local"], rng)
        return Update(items={"centres": centres, "sizes": sizes})
    k = broadcast.params["k"]
    if len(X) < k:
        return Update(items={"centres": np.empty((0, X.shape[1]))})
    if action == "init.kmeans++":
        return Update(items={"centres": seed_kmeans_plusplus(X, k, rng)})
    if action == "init.random":
        return Update(items={"centres": X[rng.choice(len(X), size=k, replace=False)].copy()})
    raise InputError(f"unknown seeding action {action!r}")


def seeding_aggregate(agg: AggregatedUpdate, k: int, rng: np.random.Generator, init_bounds=None) -> np.ndarray | None:
    """Centres from a seeding round, or None if the asked client could not seed (retry)."""
    if "bucket_counts" in agg.sums:
        return _private_seeding_centres(agg.sums, k, rng, init_bounds)
    received = [items for items in agg.items.values() if len(items.get("centres", ())) > 0]
    if not received:
        return None
    if "sizes" in received[0]:  # k-FED: k-means over all local centres (unweighted, as in k-FED)
        points = np.vstack([it["centres"] for it in received])
        return weighted_kmeans(points, k, rng)
    return np.asarray(received[0]["centres"], dtype=np.float64).copy()


def seeded_state(state, agg: AggregatedUpdate, init, k: int, init_bounds=None):
    """The server state after a seeding round: centres set and phase "train", or -- if the
    asked client could not seed -- the same phase with one more attempt counted (the next
    round asks another random client). Shared by every algorithm with a seeding phase.
    """
    from dataclasses import replace

    centres = seeding_aggregate(agg, k, state.rng, init_bounds)
    if centres is None:
        attempts = state.seed_attempts + 1
        if attempts >= 3 * state.n_clients:
            raise InputError(
                f"init={init!r}: no sampled client holds n_clusters={k} records; lower n_clusters, "
                "or use init='kfed', init='private' or init='uniform' with init_bounds."
            )
        return replace(state, seed_attempts=attempts)
    return replace(state, centres=centres, phase="train")


def _private_seeding_centres(sums, k, rng, init_bounds):
    """Weighted k-means over the (possibly noisy) bucket means.

    Buckets whose (noisy) count is below ``max(2, 3 * sigma_hat)`` are ignored: their mean
    is dominated by noise (if fewer than k pass, the k largest positive counts are kept). ``sigma_hat`` is the count noise estimated from the released
    counts themselves (post-processing, no extra privacy cost): a true count is never
    negative, so the negative noisy counts come from (nearly) empty buckets and their root
    mean square estimates the noise standard deviation; without noise there are none and
    the threshold stays 2.
    In 3 or more dimensions the kept means are shrunk towards the overall mean
    (``SHRINK = "coordinate"``: coordinate-wise empirical Bayes, :func:`shrink_coordinates`;
    ``"vector"``: the positive-part James-Stein :func:`shrink_means`), with the per-coordinate sum
    noise estimated the same way: the sum rows of the buckets with a negative noisy count are
    (nearly) pure noise; their median absolute value / 0.6745 estimates sigma_sum.
    Means are kept inside the declared domain (noise can push a small bucket's mean out): clipped
    to the box, or projected onto the ball (:class:`securefkm.domain.Ball`, whose bounding box
    carries the grid and in which the Voronoi candidates are drawn). Missing centres are drawn
    uniformly in the domain.
    """
    counts, bsums = sums["bucket_counts"], sums["bucket_sums"]
    neg = counts < 0
    negative = counts[neg]
    sigma_hat = float(np.sqrt(np.mean(negative**2))) if len(negative) >= 3 else 0.0
    keep = counts >= max(2.0, _THRESHOLD_SIGMAS * sigma_hat)
    if keep.sum() < k:
        # too few buckets clear the threshold: take the k largest noisy counts (their shrunk
        # means below sit near the overall mean, far better than uniform points of the box)
        keep = np.zeros_like(keep)
        keep[np.argsort(-counts, kind="stable")[:k]] = True
        keep &= counts > 0
    low, high = init_bounds
    d = bsums.shape[1]
    low = np.broadcast_to(np.asarray(low, dtype=np.float64), (d,))
    high = np.broadcast_to(np.asarray(high, dtype=np.float64), (d,))
    points = bsums[keep] / counts[keep, None]
    if d >= 3 and len(negative) >= 3 and np.any(keep):
        sigma_sum = float(np.median(np.abs(bsums[neg]))) / 0.6745
        total = float(counts.sum())
        if sigma_sum > 0 and total > 0:
            target = bsums.sum(axis=0) / total
            if SHRINK == "coordinate":
                points = shrink_coordinates(points, counts[keep], sigma_sum, target, sigma_hat)
            else:
                points = shrink_means(points, counts[keep], sigma_sum, target)
    points = init_bounds.project(points) if isinstance(init_bounds, Ball) else np.clip(points, low, high)
    domain = init_bounds if isinstance(init_bounds, Ball) else (low, high)
    if len(points) == 0:
        return uniform_in_bounds(domain, k, d, rng)
    if len(points) < k:
        extra = uniform_in_bounds(domain, k - len(points), d, rng)
        return np.vstack([points, extra])
    return weighted_kmeans(points, k, rng, weights=counts[keep])


def shrink_means(
    means: np.ndarray, counts: np.ndarray, sigma_sum: float, target: np.ndarray, plug_in: bool = False
) -> np.ndarray:
    """Positive-part James-Stein shrinkage of noisy means towards ``target``.

    Row j is sum_j / count_j with sum_j carrying N(0, sigma_sum^2) noise per coordinate, so
    its noise variance per coordinate is v_j = (sigma_sum / count_j)^2. For d >= 3 the
    estimator ``target + max(0, 1 - (d - 2) v_j / ||m_j - target||^2) (m_j - target)`` has
    a lower expected squared error than m_j for every true mean (James & Stein 1961; the
    positive part improves on it further). ``plug_in=True`` uses d instead of d - 2 (the
    moment estimate ||m_j - t||^2 - d v_j of the signal: the plug-in Wiener factor), which
    shrinks harder when the noise dominates and applies in any d. Post-processing of released
    values only.
    """
    means = np.asarray(means, dtype=np.float64)
    d = means.shape[1]
    if d < 3 and not plug_in:
        return means.copy()
    diff = means - target
    norm2 = np.einsum("ij,ij->i", diff, diff)
    v = (sigma_sum / np.maximum(np.asarray(counts, dtype=np.float64), 1.0)) ** 2
    dof = d if plug_in else d - 2
    factor = np.where(norm2 > 0, np.clip(1.0 - dof * v / np.where(norm2 > 0, norm2, 1.0), 0.0, 1.0), 0.0)
    return target + factor[:, None] * diff


def shrink_coordinates(
    means: np.ndarray, counts: np.ndarray, sigma_sum: float, target: np.ndarray, sigma_count: float = 0.0
) -> np.ndarray:
    """Coordinate-wise empirical-Bayes shrinkage of noisy means towards ``target``.

    Row j is (S_j + e_S) / (n_j + e_n) with e_S ~ N(0, sigma_sum^2) per coordinate and
    e_n ~ N(0, sigma_count^2): coordinate p of the mean carries noise of variance about
    v_jp = (sigma_sum^2 + m_jp^2 sigma_count^2) / n_j^2. Across the rows, coordinate p of the
    true means is modelled as target_p + N(0, A_p); A_p is estimated by moments,
    A_p = max(0, sum_j w_jp ((m_jp - target_p)^2 - v_jp) / sum_j w_jp) with Morris's weights
    w_jp = 1 / (A_p + v_jp)^2 (a few fixed-point steps from w = 1 / v: a bucket or cluster with
    a small count has a large v and must not swamp the estimate), and each entry is shrunk by the
    posterior factor A_p / (A_p + v_jp) (Efron & Morris 1973, one prior variance per
    coordinate). Coordinates in which the rows hardly differ (e.g. the border pixels of
    digits) are pulled almost fully to the target, informative ones hardly at all -- unlike
    :func:`shrink_means`, which applies one factor to the whole row. With fewer than 4 rows
    the moments are too noisy and :func:`shrink_means` is used. Post-processing of released
    values and public noise levels only.
    """
    means = np.asarray(means, dtype=np.float64)
    if means.ndim != 2 or len(means) < 4:
        return shrink_means(means, counts, sigma_sum, target) if means.ndim == 2 and len(means) else means.copy()
    n = np.maximum(np.asarray(counts, dtype=np.float64), 1.0)[:, None]
    v = (sigma_sum**2 + (means * sigma_count) ** 2) / n**2
    if not np.all(v > 0):
        return means.copy()  # no noise (or no noise estimate): nothing to shrink
    diff = means - np.asarray(target, dtype=np.float64)
    excess = diff**2 - v
    prior = np.maximum(np.sum(excess / v, axis=0) / np.sum(1.0 / v, axis=0), 0.0)
    for _ in range(_MORRIS_STEPS):  # weights 1 / (A_p + v_jp)^2: rows of small counts (large v) count little
        w = 1.0 / (prior + v) ** 2
        prior = np.maximum(np.sum(w * excess, axis=0) / np.sum(w, axis=0), 0.0)
    factor = np.divide(prior, prior + v, out=np.zeros_like(v), where=(prior + v) > 0)
    return target + factor * diff
