"""FastLloyd (Diaa, Humphries & Kerschbaum, USENIX Security 2025) as a DP baseline, and its
accuracy setting.

Written from the paper's published mechanism (Gaussian variant, "diagonal then fraction"
radius, fold post-processing); not the authors' code. Per iteration t = 0..T-1:

1. each client assigns its records to the nearest current centre c_j and **drops the
   records farther than the radius r_t** from it (r_0 = D / 2, r_t = D * frac for t >= 1,
   D = 2 sqrt(d) the diagonal of [-1, 1]^d, frac = alpha / (2 k^(1/d)), alpha = 0.8; a radius
   >= D is replaced by D);
2. it sends per cluster the count n_j and the **shifted** sum sum (x - c_j) (an empty cluster
   sends count 1 and a zero sum, as the authors' client does); the shifted sum of one record
   has norm <= r_t, the sum sensitivity;
3. the masked sums are added and the server adds Gaussian noise of standard deviation
   ``s sqrt(T) min(D, r_t) sqrt(1 + sqrt(4d)) / (4d)^(1/4)`` per sum coordinate and
   ``s sqrt(T) sqrt(1 + sqrt(4d))`` per count, s the analytic-Gaussian scale (Balle & Wang
   2018) of (epsilon, delta) at sensitivity 1; per round the normalised sensitivity is
   ``1 / (s sqrt(T))`` (the two shares add to 1), so T rounds compose to s: (epsilon, delta)-DP
   with delta = 1 / (N ln N);
4. every client sets c_j' = c_j + T_j / n_j', moves it back to distance r_t from c_j if it went
   farther, and folds it into [-1, 1] (reflection at the box faces).

T = clip(floor(0.016 N^2 / (k^3 eta^2 (1 + sqrt(4d))^2 s^2)), 2, 7) with eta = D * frac (the
paper's rule for the number of iterations). The start is data independent: k points uniform in
the box, at least 2 p apart, p halved until they fit (diffprivlib's KMeans start, p = 1 first).

The setting (FastLloyd's accuracy experiments): iris, wine and breast cancer from
scikit-learn, every feature min-max scaled to [-1, 1], records shuffled (by the seed) over 2
clients, delta = 1/(N ln N), k = 3 / 3 / 2.
"""

from __future__ import annotations

import math

import numpy as np

ALPHA = 0.8
MIN_ITERS, MAX_ITERS = 2, 7
#: name -> (scikit-learn loader, k)
SETTING = {"iris": ("load_iris", 3), "wine": ("load_wine", 3), "breast cancer": ("load_breast_cancer", 2)}


def setting_data(name: str, seed: int, n_clients: int = 2) -> tuple[list[np.ndarray], int]:
    """(client arrays, k): the data set min-max scaled to [-1, 1], shuffled by ``seed`` and split."""
    import sklearn.datasets

    loader, k = SETTING[name]
    X = getattr(sklearn.datasets, loader)().data.astype(np.float64)
    lo, hi = X.min(axis=0), X.max(axis=0)
    X = 2.0 * (X - lo) / np.where(hi > lo, hi - lo, 1.0) - 1.0
    X = X[np.random.default_rng(seed).permutation(len(X))]
    return np.array_split(X, n_clients), k


def setting_delta(n: int) -> float:
    return 1.0 / (n * math.log(n))


def analytic_gaussian_scale(epsilon: float, delta: float) -> float:
    """Smallest sigma with the Gaussian mechanism of sensitivity 1 (epsilon, delta)-DP
    (Balle & Wang 2018, Thm 8): delta(eps) = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s)."""
    from scipy.stats import norm

    def delta_of(s):
        return norm.cdf(0.5 / s - epsilon * s) - math.exp(epsilon) * norm.cdf(-0.5 / s - epsilon * s)

    lo, hi = 1e-3, 1.0
    while delta_of(hi) > delta:
        hi *= 2
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if delta_of(mid) > delta else (lo, mid)
    return hi


def proximity_start(k: int, d: int, rng: np.random.RandomState) -> np.ndarray:
    """k centres uniform in [-1, 1]^d at least 2 p apart (p = 1, halved until they fit)."""
    p = 1.0
    while p > 0:
        centres, retry = [], 0
        while len(centres) < k and retry < 100:
            c = rng.random_sample(d) * (2.0 - 2 * p) - 1.0 + p
            if not centres or np.sqrt(((np.asarray(centres) - c) ** 2).sum(axis=1).min()) >= 2 * p:
                centres.append(c)
                retry = 0
            else:
                retry += 1
        if len(centres) == k:
            return np.asarray(centres)
        p /= 2
    raise RuntimeError("no start found")  # pragma: no cover - p reaches tiny values first


def fold(values: np.ndarray, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    """Reflect values into [low, high] at the faces (FastLloyd's post-processing)."""
    width = high - low
    v = np.mod(values - low, 2 * width)
    return low + np.where(v > width, 2 * width - v, v)


def iterations(n: int, k: int, d: int, scale: float, alpha: float = ALPHA) -> int:
    eta = 2 * math.sqrt(d) * alpha / (2 * k ** (1 / d))
    t = 0.016 * n**2 / (k**3 * eta**2 * (1 + math.sqrt(4 * d)) ** 2 * scale**2)
    return int(max(min(t, MAX_ITERS), MIN_ITERS))


def fastlloyd_fit(clients: list[np.ndarray], k: int, epsilon: float, seed: int, alpha: float = ALPHA) -> np.ndarray:
    """Final centres of FastLloyd's Gaussian mechanism on data in [-1, 1]^d (see module docstring)."""
    d = clients[0].shape[1]
    n = sum(len(X) for X in clients)
    scale = analytic_gaussian_scale(epsilon, setting_delta(n))
    T = iterations(n, k, d, scale, alpha)
    diag = 2 * math.sqrt(d)
    frac = alpha / (2 * k ** (1 / d))
    noise = np.random.default_rng([seed, 7])
    centres = proximity_start(k, d, np.random.RandomState(seed))
    split = math.sqrt(1 + math.sqrt(4 * d))
    for t in range(T):
        r = diag / 2 if t == 0 else diag * frac
        if r >= diag:
            r = diag
        shifted = np.zeros((k, d))
        counts = np.zeros(k)
        for X in clients:
            d2 = ((X[:, None, :] - centres[None]) ** 2).sum(axis=2)
            j = d2.argmin(axis=1)
            keep = d2[np.arange(len(X)), j] <= r * r
            c = np.bincount(j[keep], minlength=k).astype(np.float64)
            s = np.zeros((k, d))
            np.add.at(s, j[keep], X[keep] - centres[j[keep]])
            c[c == 0] = 1.0  # the authors' client: an empty cluster sends count 1, shifted sum 0
            shifted += s
            counts += c
        sigma_sum = scale * math.sqrt(T) * min(diag, r) * split / (4 * d) ** 0.25
        sigma_count = scale * math.sqrt(T) * split
        shifted = shifted + noise.normal(0.0, sigma_sum, size=shifted.shape)
        counts = counts + noise.normal(0.0, sigma_count, size=counts.shape)
        new = centres + shifted / (counts[:, None] + 1e-9)
        step = new - centres
        dist = np.linalg.norm(step, axis=1)
        far = dist > r
        new[far] = centres[far] + r * step[far] / dist[far, None]
        centres = fold(new)
    return centres
