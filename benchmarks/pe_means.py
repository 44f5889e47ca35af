"""PE-means (Humphries, Lin & Yekhanin, "PE-means: Improved Differentially Private k-means
Clustering through Private Evolution", arXiv 2606.00342) as a DP baseline, run in its own
protocol, and the library's DWF defaults in the same protocol.

Written from the mechanism as the paper and its published artifact describe it (the artifact's
experiment configuration gives the parameters below); not the authors' code. PE-means keeps a
population of candidate centres inside the public ball of radius r and evolves it for T
generations. Each generation:

1. every record votes for its nearest candidate; the vote histogram (one count per candidate)
   is released with Gaussian noise of standard deviation ``sigma`` per count. Adding or
   removing one record changes one count by 1 (L2 sensitivity 1; replacing one record
   changes two counts, sensitivity sqrt(2), ``neighbouring="replace"``);
2. the noisy counts are thresholded (post-processing): sorted from the largest, the counts
   kept are those down to the one where their running sum first reaches N (N public); the
   rest, and every negative count, become 0;
3. selection: weighted k-means (k clusters, 10 starts) over the candidates, the thresholded
   counts as weights, gives this generation's k centres;
4. variation: each centre is copied L times with a Levy-flight step (Mantegna's algorithm,
   index beta = 1.75, scale 0.01 r), every mutant projected back into the ball; the next
   population is the k centres and their k L mutants;
5. when the released histogram's signal-to-noise ratio ``sum(w^2) / (P sigma^2)`` (w the
   thresholded counts, P the population size) falls below 1, L is halved (at least 4):
   post-processing of the noisy release.

The first population is (L + 1) k points packed into the ball, at least 2 p apart, p = r / 2
halved until they fit (data independent). The output is the last generation's selection.

Privacy: the T histogram releases are T Gaussian mechanisms with the same noise; their
composition is exactly mu-GDP with mu = sqrt(T) * sensitivity / sigma (Dong, Roth & Su 2019),
and sigma is the smallest noise at which that mu is (epsilon, delta)-DP
(:func:`protocols.dp.accounting.gdp_mu`); everything else is post-processing of the releases
and of public quantities (k, d, N, r, epsilon, delta, the seed).

The protocol (the paper's experiments): each data set centred and divided by its largest
record norm (so r = 1), delta = N^-1.1, epsilon in {0.25, 0.5, 1, 2, 4}; T = floor(4 sqrt(d))
generations, times epsilon when epsilon > 1; L = floor(max(N / (5k), 4)). The metric is the
area under the curve of the mean per-point k-means loss (sum of squared distances to the
nearest centre, divided by N) over the epsilon grid, by the trapezoid rule; lower is better.
The paper averages 50 runs per epsilon.

Data sets rebuildable offline: ``iris`` (scikit-learn's, k = 3) and ``blobs-K<K>-D<D>``,
``make_blobs(20000, D, centers=K, random_state=1)`` with k = K, K in {4, 16, 64}, D in
{4, 16, 64, 128}. The paper's own high-dimensional variant (a random projection to 16
dimensions, its HDPE column) is not implemented here.

``python -m benchmarks.pe_means --datasets iris blobs-K4-D4 --runs 10 [--library [--mode distributed]]``
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np

EPSILONS = (0.25, 0.5, 1.0, 2.0, 4.0)
LEVY_BETA = 1.75
STEP_SCALE = 0.01
SNR_THRESHOLD = 1.0
L_REDUCE = 0.5
MIN_L = 4
KMEANS_STARTS = 10

#: The paper's AUC table (50 runs per epsilon): PE-means, Google's DP clustering (LSH) and
#: FastLloyd, each in this protocol.
PUBLISHED = {
    "iris": {"PE-means": 0.2894, "Google": 0.6892, "FastLloyd": 0.3979},
    "blobs-K4-D4": {"PE-means": 0.0778, "Google": 0.1305, "FastLloyd": 0.1777},
    "blobs-K16-D4": {"PE-means": 0.0445, "Google": 0.0979, "FastLloyd": 0.0990},
    "blobs-K64-D4": {"PE-means": 0.0379, "Google": 0.1289, "FastLloyd": 0.0818},
    "blobs-K4-D16": {"PE-means": 0.0955, "Google": 0.1395, "FastLloyd": 0.7110},
    "blobs-K16-D16": {"PE-means": 0.0668, "Google": 0.1596, "FastLloyd": 0.7160},
    "blobs-K64-D16": {"PE-means": 0.1183, "Google": 0.3872, "FastLloyd": 0.7631},
    "blobs-K4-D64": {"PE-means": 0.0993, "Google": 0.1090, "FastLloyd": 1.4623},
    "blobs-K16-D64": {"PE-means": 0.1192, "Google": 0.2258, "FastLloyd": 1.7475},
    "blobs-K64-D64": {"PE-means": 0.3070, "Google": 0.7878, "FastLloyd": 2.2002},
    "blobs-K4-D128": {"PE-means": 0.1333, "Google": 0.1186, "FastLloyd": 1.7604},
    "blobs-K16-D128": {"PE-means": 0.1942, "Google": 0.2838, "FastLloyd": 2.3038},
    "blobs-K64-D128": {"PE-means": 0.5740, "Google": 0.9675, "FastLloyd": 2.7204},
}
#: The paper's HDPE column (PE-means after a random projection to 16 dimensions, d > 32 only;
#: not implemented here).
PUBLISHED_HDPE = {
    "blobs-K4-D64": 0.0974, "blobs-K16-D64": 0.1189, "blobs-K64-D64": 0.4678,
    "blobs-K4-D128": 0.1097, "blobs-K16-D128": 0.1562, "blobs-K64-D128": 0.7190,
}
#: The paper's non-private reference (k-means), same AUC scale (constant over the grid).
PUBLISHED_NON_PRIVATE = {
    "iris": 0.1361, "blobs-K4-D4": 0.0777, "blobs-K16-D4": 0.0459, "blobs-K64-D4": 0.0343,
    "blobs-K4-D16": 0.0950, "blobs-K16-D16": 0.0606, "blobs-K64-D16": 0.0642,
    "blobs-K4-D64": 0.0954, "blobs-K16-D64": 0.0847, "blobs-K64-D64": 0.0823,
    "blobs-K4-D128": 0.1054, "blobs-K16-D128": 0.0919, "blobs-K64-D128": 0.0933,
}


# --------------------------------------------------------------------------- protocol


def preprocess(X: np.ndarray) -> np.ndarray:
    """Centre every feature and divide by the largest record norm: the data lie in the unit ball."""
    X = np.asarray(X, dtype=np.float64)
    Xc = X - X.mean(axis=0)
    return Xc / np.linalg.norm(Xc, axis=1).max()


def load(name: str) -> tuple[np.ndarray, int]:
    """(preprocessed records, k) of ``iris``, ``blobs-K<K>-D<D>`` (the paper's, ``random_state=1``)
    or ``blobs-K<K>-D<D>-S<s>`` (the same shape with ``random_state=s``: held-out sets, not in
    the paper's table)."""
    import sklearn.datasets

    if name == "iris":
        return preprocess(sklearn.datasets.load_iris().data), 3
    if name.startswith("blobs-K"):
        shape, _, state = name[len("blobs-K"):].partition("-S")
        k_part, d_part = shape.split("-D")
        K, D = int(k_part), int(d_part)
        X, _ = sklearn.datasets.make_blobs(n_samples=20000, n_features=D, centers=K,
                                           random_state=int(state) if state else 1)
        return preprocess(X), K
    raise ValueError(f"unknown data set {name!r}: iris, blobs-K<K>-D<D> or blobs-K<K>-D<D>-S<seed>")


def protocol_delta(n: int) -> float:
    return float(n) ** -1.1


def generations(epsilon: float, d: int) -> int:
    base = int(4 * math.sqrt(d))
    return max(int(epsilon * base), 1) if epsilon > 1.0 else max(base, 1)


def mutants_per_centre(n: int, k: int) -> int:
    return int(max(n / (5 * k), MIN_L))


def auc(curve, epsilons=EPSILONS) -> float:
    """Trapezoid area of a per-point loss curve over the epsilon grid."""
    y, x = np.asarray(curve, dtype=np.float64), np.asarray(epsilons, dtype=np.float64)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2.0))


def nearest(X: np.ndarray, C: np.ndarray, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """(index of the nearest row of C, squared distance to it) for every row of X."""
    if X.shape[1] <= 8:
        from scipy.spatial import cKDTree

        dist, idx = cKDTree(C).query(X, k=1)
        return idx.astype(np.int64), dist**2
    cc = np.einsum("ij,ij->i", C, C)
    idx = np.empty(len(X), dtype=np.int64)
    d2 = np.empty(len(X))
    for s in range(0, len(X), chunk):
        x = X[s:s + chunk]
        d = cc[None, :] - 2.0 * (x @ C.T)
        j = np.argmin(d, axis=1)
        idx[s:s + chunk] = j
        d2[s:s + chunk] = np.maximum(d[np.arange(len(x)), j] + np.einsum("ij,ij->i", x, x), 0.0)
    return idx, d2


def per_point_loss(X: np.ndarray, centres: np.ndarray) -> float:
    return float(nearest(X, np.asarray(centres, dtype=np.float64))[1].mean())


# --------------------------------------------------------------------------- mechanism


def noise_std(epsilon: float, delta: float, rounds: int, sensitivity: float = 1.0) -> float:
    """Per-count noise at which ``rounds`` histogram releases compose exactly to (epsilon, delta)."""
    from protocols.dp.accounting import gdp_mu

    if math.isinf(epsilon):
        return 0.0
    # 1e-12 relative margin so that re-accounting in floating point never lands above the target
    return math.sqrt(rounds) * sensitivity / gdp_mu(epsilon, delta) * (1.0 + 1e-12)


def spent_epsilon(sigma: float, rounds: int, delta: float, sensitivity: float = 1.0) -> float:
    """The epsilon at ``delta`` of ``rounds`` Gaussian releases of L2 sensitivity ``sensitivity``."""
    from protocols.dp.accounting import gdp_epsilon

    return gdp_epsilon(math.sqrt(rounds) * sensitivity / sigma, delta)


def packed_start(n_points: int, d: int, radius: float, rng: np.random.Generator, retries: int = 100) -> np.ndarray:
    """n_points uniform in the ball of ``radius``, pairwise at least 2 p apart (p = radius / 2,
    halved until they fit), each p-ball inside the ball. Data independent."""
    p = radius / 2.0
    while p > 1e-12:
        pts = np.empty((n_points, d))
        placed, misses = 0, 0
        reach = radius - p
        while placed < n_points and misses < retries:
            v = rng.standard_normal(d)
            v *= reach * rng.random() ** (1.0 / d) / np.linalg.norm(v)
            if placed and np.min(np.sum((pts[:placed] - v) ** 2, axis=1)) < (2 * p) ** 2:
                misses += 1
                continue
            pts[placed] = v
            placed += 1
            misses = 0
        if placed == n_points:
            return pts
        p /= 2.0
    raise RuntimeError("no packing found")  # pragma: no cover


def levy_mutants(centres: np.ndarray, L: int, radius: float, rng: np.random.Generator,
                 beta: float = LEVY_BETA, scale: float = STEP_SCALE) -> np.ndarray:
    """L mutants of every centre: a Levy-flight step (Mantegna) of scale ``scale * radius``,
    projected back into the ball."""
    k, d = centres.shape
    base = np.repeat(centres, L, axis=0)
    if beta >= 2.0:
        step = rng.standard_normal((k * L, d))
    else:
        s_u = (math.gamma(1 + beta) * math.sin(math.pi * beta / 2)
               / (math.gamma((1 + beta) / 2) * beta * 2 ** ((beta - 1) / 2))) ** (1 / beta)
        u = rng.normal(0.0, s_u, (k * L, d))
        v = rng.standard_normal((k * L, d))
        step = u / np.abs(v) ** (1 / beta)
    out = base + scale * radius * step
    norm = np.linalg.norm(out, axis=1, keepdims=True)
    return np.where(norm > radius, out * (radius / np.maximum(norm, 1e-300)), out)


def threshold_counts(noisy: np.ndarray, n: int) -> np.ndarray:
    """Keep the largest noisy counts down to the one where their running sum reaches n; zero the
    rest and every negative count (post-processing)."""
    order = np.sort(noisy)[::-1]
    hit = np.flatnonzero(np.cumsum(order) >= n)  # the first index where the running sum reaches n
    cut = order[hit[0]] if hit.size else 0.0
    return np.where((noisy >= cut) & (noisy > 0), noisy, 0.0)


def weighted_kmeans(points: np.ndarray, weights: np.ndarray, k: int, seed: int) -> np.ndarray:
    from sklearn.cluster import KMeans

    if not np.any(weights > 0):
        weights = np.ones(len(points))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fewer distinct weighted points than k
        km = KMeans(n_clusters=k, n_init=KMEANS_STARTS, random_state=seed).fit(points, sample_weight=weights)
    return km.cluster_centers_


class PEMeansResult:
    def __init__(self, centres, sigma, rounds, sensitivity, delta, losses):
        self.centres = centres
        self.sigma = sigma
        self.rounds = rounds
        self.sensitivity = sensitivity
        self.delta = delta
        self.generation_losses = losses

    @property
    def epsilon_spent(self) -> float:
        if self.sigma == 0:
            return math.inf
        return spent_epsilon(self.sigma, self.rounds, self.delta, self.sensitivity)


def pe_means(X: np.ndarray, k: int, epsilon: float, delta: float, *, seed: int = 0, radius: float = 1.0,
             rounds: int | None = None, L: int | None = None, neighbouring: str = "add-remove",
             track_loss: bool = False) -> PEMeansResult:
    """Central-DP PE-means on records inside the ball of ``radius`` (public); returns the k centres
    and the accounting. ``rounds`` / ``L`` default to the paper's rules. ``epsilon=inf``: no noise."""
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    if neighbouring not in ("add-remove", "replace"):
        raise ValueError("neighbouring: 'add-remove' or 'replace'")
    if np.any(np.linalg.norm(X, axis=1) > radius * (1 + 1e-9)):
        raise ValueError("a record lies outside the declared ball")
    rng = np.random.default_rng(seed)
    T = generations(epsilon, d) if rounds is None else int(rounds)
    L = mutants_per_centre(n, k) if L is None else int(L)
    sens = 1.0 if neighbouring == "add-remove" else math.sqrt(2.0)
    sigma = noise_std(epsilon, delta, T, sens)
    population = packed_start((L + 1) * k, d, radius, rng)
    losses = []
    centres = None
    for gen in range(T):
        votes = np.bincount(nearest(X, population)[0], minlength=len(population)).astype(np.float64)
        noisy = votes + sigma * rng.standard_normal(len(votes)) if sigma > 0 else votes
        w = threshold_counts(noisy, n)
        if sigma > 0 and np.sum(w**2) / (len(w) * sigma**2) < SNR_THRESHOLD:
            L = max(int(L_REDUCE * L), MIN_L)
        centres = weighted_kmeans(population, w, k, int(rng.integers(2**31)))
        if track_loss:
            losses.append(per_point_loss(X, centres))
        if gen == T - 1:
            break
        population = np.vstack([centres, levy_mutants(centres, L, radius, rng)])
    return PEMeansResult(centres, sigma, T, sens, delta, losses)


# --------------------------------------------------------------------------- library defaults


#: the library's public domain per ``--domain``: GaussianDP's keywords and the estimator's
DOMAINS = ("ball", "bounds", "clip")


def library_domain(domain: str, d: int) -> tuple[dict, dict]:
    """(GaussianDP keywords, estimator keywords) of a public domain: ``"ball"`` the unit ball at
    the origin and nothing else (PE-means's public information), ``"bounds"`` the box
    [-1, 1]^d, ``"clip"`` the unit ball for the sensitivity and the box [-1, 1]^d for the start."""
    if domain == "ball":
        return {"clip": 1.0, "centre": 0.0}, {}
    if domain == "bounds":
        return {"bounds": (-np.ones(d), np.ones(d))}, {}
    if domain == "clip":
        return {"clip": 1.0}, {"init_bounds": (-1.0, 1.0)}
    raise ValueError(f"domain: one of {DOMAINS}, got {domain!r}")


def library_fit(X: np.ndarray, k: int, epsilon: float, delta: float, seed: int, domain: str = "ball",
                mode: str = "central") -> tuple:
    """DWF with the library's defaults in this protocol: 2 clients (records shuffled by the seed),
    ``GaussianDP(epsilon, delta, mode=mode, **library_domain(domain))``, under
    ``PairwiseMasking()`` when ``mode="distributed"``, ``crypto="ideal"``. (centres, epsilon spent)."""
    from protocols.dp import GaussianDP
    from protocols.masking import PairwiseMasking

    from securefkm.estimators.dwf import WeightedFederatedKMeans

    Xs = X[np.random.default_rng(seed).permutation(len(X))]
    clients = np.array_split(Xs, 2)
    layer_kw, est_kw = library_domain(domain, X.shape[1])
    protection = [GaussianDP(epsilon, delta, mode=mode, **layer_kw)]
    if mode == "distributed":
        protection.append(PairwiseMasking())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = WeightedFederatedKMeans(k, protection=protection, random_state=seed, crypto="ideal", **est_kw).fit(clients)
    return est.cluster_centers_, float(est.privacy_spent_[0])


# --------------------------------------------------------------------------- runs


def run_grid(name: str, runs: int, method: str = "pe", epsilons=EPSILONS, seed0: int = 0, **kw) -> dict:
    """losses[r][e] (per-point) of ``runs`` independent runs at every epsilon, the AUCs and the
    largest epsilon spent / target. ``method``: "pe" or "library"."""
    X, k = load(name)
    n = len(X)
    delta = protocol_delta(n)
    losses = np.empty((runs, len(epsilons)))
    worst = 0.0
    for r in range(runs):
        for e, eps in enumerate(epsilons):
            seed = seed0 + 1000 * r + e
            if method == "pe":
                res = pe_means(X, k, eps, delta, seed=seed, **kw)
                centres, spent = res.centres, res.epsilon_spent
            else:
                centres, spent = library_fit(X, k, eps, delta, seed, **kw)
            if spent > eps:
                raise AssertionError(f"{name}: epsilon spent {spent} above the target {eps}")
            worst = max(worst, spent / eps)
            losses[r, e] = per_point_loss(X, centres)
    per_run = np.array([auc(row, epsilons) for row in losses])
    return {
        "dataset": name, "k": k, "n": n, "d": X.shape[1], "delta": delta, "runs": runs,
        "losses": losses, "mean_curve": losses.mean(axis=0), "auc": float(per_run.mean()),
        "auc_sd": float(per_run.std(ddof=1)) if runs > 1 else float("nan"),
        "auc_se": float(per_run.std(ddof=1) / math.sqrt(runs)) if runs > 1 else float("nan"),
        "spent_over_target": worst,
    }


def verdict(res: dict, published: float, published_runs: int = 50, published_digits: int = 4) -> tuple[str, float]:
    """Whether our mean AUC reproduces the published one: "yes" if the difference is within one
    run-to-run standard deviation of the per-run AUC (plus the published figure's rounding,
    half a unit of its last digit). Also the z-score of the difference of the two means: our
    standard error, the published mean's estimated from our spread at its 50 runs, and the
    rounding as a uniform error."""
    diff = res["auc"] - published
    sd = res["auc_sd"]
    if not np.isfinite(sd):
        return "n/a", float("nan")
    half_unit = 0.5 * 10.0**-published_digits
    se = math.sqrt(sd**2 / res["runs"] + sd**2 / published_runs + (2 * half_unit) ** 2 / 12)
    return ("yes" if abs(diff) <= sd + half_unit else "no"), diff / se


def _f(v: float) -> str:
    return "-" if v is None or not np.isfinite(v) else f"{v:.4f}"


def paired(names, epsilons=(0.5, 2.0), seeds: int = 8, seed0: int = 700, buckets: str = "voronoi",
           max_bits: int | None = None, out=print) -> dict:
    """The held-out comparisons of the seeding rules: DWF's defaults given the unit ball
    (``GaussianDP(epsilon, N^-1.1, clip=1, rng="seeded")``, 2 clients, ideal masking), seed
    ``seed0 + s`` for run s (its records shuffled by s), so two variants see the same noise.
    ``buckets="hyperplanes"`` turns the Voronoi rule off; ``max_bits`` caps the bucket bits above
    3 features (default: the library's). Prints and returns the mean per-point loss per
    (data set, epsilon)."""
    from protocols.dp import GaussianDP
    from securefkm.algorithms import _seeding
    from securefkm.estimators.dwf import WeightedFederatedKMeans

    saved = _seeding.VORONOI_PER_AXIS, _seeding.MAX_BITS_ABOVE_GRID
    if buckets == "hyperplanes":
        _seeding.VORONOI_PER_AXIS = 1 << 30  # never enough points per axis
    if max_bits is not None:
        _seeding.MAX_BITS_ABOVE_GRID = int(max_bits)
    results = {}
    try:
        for name in names:
            X, k = load(name)
            delta = protocol_delta(len(X))
            for eps in epsilons:
                losses = []
                for s in range(seeds):
                    Xs = X[np.random.default_rng(s).permutation(len(X))]
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        est = WeightedFederatedKMeans(k, protection=[GaussianDP(eps, delta, clip=1.0, rng="seeded")],
                                                      random_state=seed0 + s, crypto="ideal").fit(np.array_split(Xs, 2))
                    losses.append(per_point_loss(X, est.cluster_centers_))
                results[(name, eps)] = losses
                out(f"{name} eps {eps:g} ({buckets}, max bits {_seeding.MAX_BITS_ABOVE_GRID}): mean per-point loss "
                    f"{np.mean(losses):.4f} over seeds {seed0}-{seed0 + seeds - 1}")
    finally:
        _seeding.VORONOI_PER_AXIS, _seeding.MAX_BITS_ABOVE_GRID = saved
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pe_means", description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", nargs="+", default=["iris", "blobs-K4-D4", "blobs-K16-D4", "blobs-K64-D4"])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--library", action="store_true", help="also the library's DWF defaults in the same protocol")
    ap.add_argument("--library-runs", type=int, default=None, help="runs of the library table (default --runs)")
    ap.add_argument("--domain", choices=DOMAINS, default="ball",
                    help="library's public domain: the unit ball at the origin (clip=1, centre=0: PE-means's "
                         "information), the box [-1, 1]^d, or the unit ball with the box for the start")
    ap.add_argument("--mode", choices=("central", "distributed"), default="central",
                    help="the library's DP mode (distributed: under PairwiseMasking)")
    ap.add_argument("--seed0", type=int, default=0, help="first seed of the library runs (run r, epsilon e: "
                    "seed0 + 1000 r + e)")
    ap.add_argument("--neighbouring", choices=("add-remove", "replace"), default="add-remove")
    ap.add_argument("--no-pe", action="store_true", help="skip the PE-means table")
    ap.add_argument("--json", default=None, help="also write every run's per-point losses to this file")
    ap.add_argument("--paired", nargs="+", default=None, metavar="SET",
                    help="instead of the tables: the seeding rules' paired comparison on these (held-out) sets")
    ap.add_argument("--paired-seeds", type=int, default=8)
    ap.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 2.0], help="epsilons of --paired")
    ap.add_argument("--buckets", choices=("voronoi", "hyperplanes"), default="voronoi",
                    help="--paired: the library's Voronoi rule, or random hyperplanes only")
    ap.add_argument("--max-bits", type=int, default=None, help="--paired: cap on the bucket bits above 3 features")
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)  # small k-means fits: thread start-up costs more than it saves
    if args.paired:
        paired(args.paired, tuple(args.epsilons), args.paired_seeds, args.seed0 or 700, args.buckets, args.max_bits)
        return 0
    results = {}
    if not args.no_pe:
        print(f"PE-means, its protocol: eps grid {EPSILONS}, delta = N^-1.1, {args.runs} runs, "
              f"neighbouring {args.neighbouring}; AUC of the mean per-point loss (lower is better)\n")
        print("| data set | N | d | k | ours: AUC +- sd (se) | published PE-means | within 1 sd | z | "
              "Google (pub.) | FastLloyd (pub.) | non-private (pub.) | eps spent/target | time |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name in args.datasets:
            t0 = time.time()
            res = run_grid(name, args.runs, "pe", neighbouring=args.neighbouring)
            results[name] = res
            pub = PUBLISHED.get(name, {})
            ok, z = verdict(res, pub["PE-means"]) if pub else ("n/a", float("nan"))
            print(f"| {name} | {res['n']} | {res['d']} | {res['k']} | {res['auc']:.4f} +- {res['auc_sd']:.2g} "
                  f"({res['auc_se']:.2g}) | {pub.get('PE-means', float('nan')):.4f} | {ok} | {z:+.1f} | "
                  f"{pub.get('Google', float('nan')):.4f} | {pub.get('FastLloyd', float('nan')):.4f} | "
                  f"{PUBLISHED_NON_PRIVATE.get(name, float('nan')):.4f} | {res['spent_over_target']:.6f} | "
                  f"{time.time() - t0:.0f} s |", flush=True)
            print("    mean per-point loss by epsilon: "
                  + ", ".join(f"{e:g}: {v:.4f}" for e, v in zip(EPSILONS, res["mean_curve"])), flush=True)
    if args.library:
        runs = args.library_runs or args.runs
        print(f"\nLibrary defaults (DWF, GaussianDP {args.mode}, {args.domain}, 2 clients, crypto='ideal'), "
              f"same protocol, {runs} runs, seeds {args.seed0} + 1000 r + e\n")
        print("| data set | DWF defaults: AUC +- sd | PE-means (ours) | PE-means (pub.) | HDPE (pub.) | Google (pub.) | "
              "FastLloyd (pub.) | eps spent/target | time |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name in args.datasets:
            t0 = time.time()
            lib = run_grid(name, runs, "library", seed0=args.seed0, domain=args.domain, mode=args.mode)
            results[f"library:{name}"] = lib
            pub = PUBLISHED.get(name, {})
            ours = results.get(name, {}).get("auc", float("nan"))
            print(f"| {name} | {lib['auc']:.4f} +- {lib['auc_sd']:.2g} | {_f(ours)} | "
                  f"{_f(pub.get('PE-means'))} | {_f(PUBLISHED_HDPE.get(name))} | "
                  f"{_f(pub.get('Google'))} | {_f(pub.get('FastLloyd'))} | {lib['spent_over_target']:.6f} | "
                  f"{time.time() - t0:.0f} s |", flush=True)
            print("    mean per-point loss by epsilon: "
                  + ", ".join(f"{e:g}: {v:.4f}" for e, v in zip(EPSILONS, lib["mean_curve"])), flush=True)
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({key: {k2: (v.tolist() if isinstance(v, np.ndarray) else v) for k2, v in res.items()}
                       for key, res in results.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
