import os
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import make_blobs

os.environ.setdefault("MPLBACKEND", "Agg")

# the development benchmarks (benchmarks/ at the repository root, not installed) import from
# the checkout, whether pytest runs as `python -m pytest` (root on sys.path) or as `pytest`
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


@pytest.fixture(scope="session")
def blobs_noniid():
    """The DWF paper's 5-blob set split non-IID over 100 clients (k-means, 5 steps)."""
    from securefkm.datasets import load_dataset

    data = load_dataset("dwf-blobs", split="non-iid", n_clients=100, random_state=0)
    return data.pooled(), data.clients


@pytest.fixture(scope="session")
def small_blobs():
    X, y = make_blobs(600, centers=4, cluster_std=0.5, random_state=3)
    parts = np.array_split(np.random.default_rng(3).permutation(len(X)), 6)
    return X, y, [X[p] for p in parts]
