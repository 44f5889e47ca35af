"""The datasets of the papers that can be made offline, all seeded.

Generators return ``(X, y)`` pooled, or a :class:`FederatedDataset` where the paper fixes
how the records are distributed. Labels are the index of the generating component.
"""

from __future__ import annotations

import numbers
import random

import numpy as np
from sklearn.datasets import load_digits, make_blobs

from ..validation import check_float, check_int, check_random_state
from ..exceptions import InputError
from .federated import FederatedDataset
from .splitters import _sk_seed, split_distance

__all__ = [
    "triebe_1d",
    "garst_centres",
    "garst_grid",
    "garst_federated",
    "garst_extreme_split",
    "stallmann_motivational",
    "g2",
    "dwf_blobs",
    "digits",
    "GARST_EXTREME_CLUSTERS",
]

#: number of distinct clusters held by the five clients of Garst & Reinders' extreme split
GARST_EXTREME_CLUSTERS = (1, 4, 7, 10, 16)


def triebe_1d(
    n_clients: int = 50,
    n_per_client: int = 10,
    means=(1.0, 2.0, 3.0, 4.0, 5.0),
    scale: float = 0.2,
    random_state=None,
) -> FederatedDataset:
    """Triebe & Rajagopal (2019), section 2.1: 50 non-IID clients, each with 10 one-dimensional
    samples drawn from ONE of 5 Gaussians (means 1..5, scale 0.2) chosen uniformly at random
    per client. Labels: the index of the client's Gaussian."""
    n_clients = check_int(n_clients, "n_clients", minimum=1)
    n_per_client = check_int(n_per_client, "n_per_client", minimum=1)
    scale = check_float(scale, "scale", minimum=0.0)
    means = np.asarray(means, dtype=np.float64)
    if means.ndim != 1 or len(means) == 0 or not np.all(np.isfinite(means)):
        raise InputError(
            f"means must be a non-empty 1-D sequence of finite numbers, got {means!r}."
        )
    rng = check_random_state(random_state)
    comp = rng.integers(len(means), size=n_clients)
    X = rng.normal(means[comp][:, None], scale, size=(n_clients, n_per_client))
    return FederatedDataset(
        [X[i].reshape(-1, 1) for i in range(n_clients)],
        labels=[np.full(n_per_client, comp[i], dtype=np.int64) for i in range(n_clients)],
        name="triebe-1d",
    )


def garst_centres(spacing: float = 5.0) -> np.ndarray:
    """The 16 centres of Garst & Reinders' grid (4 x 4, given spacing, centred at the origin),
    in the authors' order: first coordinate outer, second inner ((-7.5, -7.5), (-7.5, -2.5), ...)."""
    spacing = check_float(spacing, "spacing", minimum=0.0, min_inclusive=False)
    g = (np.arange(4) - 1.5) * spacing
    return np.column_stack([np.repeat(g, 4), np.tile(g, 4)])


def garst_grid(
    points_per_centre: int = 50, std: float = 1.0, spacing: float = 5.0, random_state=None
):
    """Garst & Reinders, section 3: 16 isotropic Gaussians (std ``std``; the paper uses 1 and
    the noise study 1.0 .. 1.5) on a 4 x 4 grid with ``spacing`` 5, ``points_per_centre``
    (50, 100 or 200 in the paper) each. Returns ``(X, y)`` ordered by centre."""
    ppc = check_int(points_per_centre, "points_per_centre", minimum=1)
    std = check_float(std, "std", minimum=0.0)
    rng = check_random_state(random_state)
    C = garst_centres(spacing)
    y = np.repeat(np.arange(16), ppc)
    X = C[y] + rng.normal(0.0, std, size=(16 * ppc, 2))
    return X, y


def garst_federated(
    beta: float,
    n_clients: int = 4,
    points_per_centre: int = 50,
    std: float = 1.0,
    spacing: float = 5.0,
    random_state=None,
) -> FederatedDataset:
    """The grid of :func:`garst_grid` distributed with the distance split of eq. 2
    (:func:`~securefkm.datasets.splitters.split_distance`), client locations uniform in
    ``(-2.5 * spacing, 2.5 * spacing)^2`` = (-12.5, 12.5)^2 as in the paper (section 3).
    The paper's text says four clients, its figure 1 and the authors' code use five; the
    default here follows the text."""
    rng = check_random_state(random_state)
    X, y = garst_grid(points_per_centre, std, spacing, rng)
    half = 2.5 * float(spacing)
    parts = split_distance(
        X, y, n_clients=n_clients, random_state=rng, beta=beta, box=(-half, half)
    )
    return FederatedDataset(
        [X[p] for p in parts], labels=[y[p] for p in parts], name=f"garst-beta{beta:g}"
    )


def garst_extreme_split(
    points_per_centre: int = 50, std: float = 1.0, spacing: float = 5.0, random_state=None
):
    """Garst & Reinders, section 3 ("High variability in number of local clusters"): the grid
    data over 5 clients holding data from exactly 1, 4, 7, 10 and 16 clusters.

    Our construction (the paper gives only the counts): a random order of the 16 clusters;
    client ``i`` holds the first ``(1, 4, 7, 10, 16)[i]`` of them (nested sets), and each
    cluster's points are divided evenly (``np.array_split``) among the clients holding it.
    The first cluster is held by all five clients, so the 1-cluster client has
    ``points_per_centre / 5`` = 10 points, as the paper says. Clients are in the order
    1, 4, 7, 10, 16 clusters.
    """
    ppc = check_int(points_per_centre, "points_per_centre", minimum=5)
    rng = check_random_state(random_state)
    X, y = garst_grid(ppc, std, spacing, rng)
    order = rng.permutation(16)
    counts = np.asarray(GARST_EXTREME_CLUSTERS)
    owner = np.empty(len(X), dtype=np.int64)
    for rank, cluster in enumerate(order):  # 16 clusters, not records
        holders = np.flatnonzero(counts > rank)
        idx = np.flatnonzero(y == cluster)
        owner[idx] = np.repeat(holders, [len(c) for c in np.array_split(idx, len(holders))])
    parts = [np.flatnonzero(owner == i) for i in range(len(counts))]
    return FederatedDataset(
        [X[p] for p in parts], labels=[y[p] for p in parts], name="garst-extreme"
    )


def stallmann_motivational(random_state=None) -> FederatedDataset:
    """Stallmann & Wilbik (2022), section 3.2.1 (and 1.1): five Gaussians, three clients.

    Components (label = index): mu1 = (0, 0) and mu3 = (1, 1) with 500 points each,
    mu2 = (0, 1) and mu4 = (1, 0) with 1000 points each, all std 0.2; mu5 = (0.5, 0.5) with
    120 points, std 0.01. Client 1: 500 from mu1, 500 from mu2, 40 from mu5; client 2: 500
    from mu2, 500 from mu4, 40 from mu5; client 3: 500 from mu3, 500 from mu4, 40 from mu5.
    Labels 0..4 stand for mu1..mu5.
    """
    rng = check_random_state(random_state)
    mu = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.5, 0.5]])
    sd = np.array([0.2, 0.2, 0.2, 0.2, 0.01])
    plan = [(0, 1), (1, 3), (2, 3)]
    clients, labels = [], []
    for a, b in plan:
        lab = np.concatenate([np.full(500, a), np.full(500, b), np.full(40, 4)]).astype(np.int64)
        clients.append(mu[lab] + rng.normal(size=(len(lab), 2)) * sd[lab, None])
        labels.append(lab)
    return FederatedDataset(clients, labels=labels, name="stallmann-motivational")


def g2(dim: int, sigma: float, n: int = 2048, random_state=None):
    """The G2 sets (Franti et al., used by Stallmann & Wilbik section 3.2.2): ``n`` points from
    two Gaussians, ``n/2`` each, centred at 500 and 600 in every one of ``dim`` dimensions,
    std ``sigma`` (the paper: D in 2, 4, ..., 1024 and sigma in 10, 20, ..., 100). Generated
    afresh (the published files are one draw of the same model). Returns ``(X, y)``."""
    dim = check_int(dim, "dim", minimum=1)
    sigma = check_float(sigma, "sigma", minimum=0.0)
    n = check_int(n, "n", minimum=2)
    if n % 2:
        raise InputError(f"n must be even (two clusters of n/2 points), got {n}.")
    rng = check_random_state(random_state)
    y = np.repeat(np.arange(2), n // 2)
    X = np.where(y[:, None] == 0, 500.0, 600.0) + rng.normal(0.0, sigma, size=(n, dim))
    return X, y


def dwf_blobs(
    n_samples: int = 10_000,
    n_noise: int = 100,
    std: float = 0.2,
    random_state=18042023,
    noise_seed: int | None = 1,
):
    """The synthetic set of Holzer et al. (2023), DWF paper section 3.2, as the authors'
    ``experiment.py`` builds it:

    * ``make_blobs(n_samples, centers=5, cluster_std=std, center_box=(-1, 1),
      random_state=18042023)`` (an int ``random_state`` is passed to scikit-learn as is);
    * ``n_noise`` uniform points in [-1, 1)^2 appended after the blobs, made with Python's
      ``random.seed(1)`` and ``[[2 * random.random() - 1 for _ in range(2)] for _ in range(n)]``
      (``noise_seed=1``); ``noise_seed=None`` draws them from ``random_state`` instead;
    * the noise points get their own label, 5 (a sixth class), as in the authors' code.
    """
    n_samples = check_int(n_samples, "n_samples", minimum=5)
    n_noise = check_int(n_noise, "n_noise", minimum=0)
    std = check_float(std, "std", minimum=0.0)
    rng = check_random_state(random_state)
    X, y = make_blobs(
        n_samples=n_samples,
        centers=5,
        cluster_std=std,
        center_box=(-1.0, 1.0),
        random_state=_sk_seed(random_state, rng),
    )
    if noise_seed is None:
        noise = rng.uniform(-1.0, 1.0, size=(n_noise, 2))
    else:
        if not isinstance(noise_seed, numbers.Integral) or isinstance(noise_seed, bool):
            raise InputError(f"noise_seed must be an int or None, got {noise_seed!r}.")
        r = random.Random(int(noise_seed))
        noise = (
            np.array([r.random() for _ in range(2 * n_noise)], dtype=np.float64).reshape(n_noise, 2)
            * 2
            - 1
        )
    X = np.concatenate([X.astype(np.float64), noise])
    y = np.concatenate([y.astype(np.int64), np.full(n_noise, 5, dtype=np.int64)])
    return X, y


def digits():
    """scikit-learn's shipped handwritten digits (1797 x 64, values 0..16, 10 classes), float64."""
    X, y = load_digits(return_X_y=True)
    return np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.int64)
