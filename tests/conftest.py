import os

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.datasets import make_blobs

os.environ.setdefault("MPLBACKEND", "Agg")


def _dwf_blobs():
    X, y = make_blobs(10000, centers=5, cluster_std=0.2, center_box=(-1, 1), random_state=18042023)
    rng = np.random.default_rng(18042023)
    return np.vstack([X, rng.uniform(-1, 1, (100, 2))]), np.concatenate([y, np.full(100, -1)])


@pytest.fixture(scope="session")
def blobs_noniid():
    """The DWF paper's 5-blob set split non-IID over 100 clients (k-means, 5 steps)."""
    X, _ = _dwf_blobs()
    labels = KMeans(100, max_iter=5, n_init=5, random_state=0).fit(X).labels_
    return X, [X[labels == i] for i in range(100)]


@pytest.fixture(scope="session")
def small_blobs():
    X, y = make_blobs(600, centers=4, cluster_std=0.5, random_state=3)
    parts = np.array_split(np.random.default_rng(3).permutation(len(X)), 6)
    return X, y, [X[p] for p in parts]
