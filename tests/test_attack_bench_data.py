"""Real data sets of the attack benchmark: fixed public scaling into [-1, 1], IID and label-skewed splits."""

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_wine

from attacks import matrix
from securefkm.datasets import load_dataset
from securefkm.datasets.real import published_ranges, scale_to_unit


@pytest.mark.parametrize("name,loader,shape,k", [("wine", load_wine, (178, 13), 3),
                                                 ("breast-cancer", load_breast_cancer, (569, 30), 2)])
def test_published_ranges_scale_into_the_unit_box(name, loader, shape, k):
    bunch = loader()
    ranges = published_ranges(bunch.DESCR, shape[1])
    assert ranges.shape == (shape[1], 2) and np.all(ranges[:, 0] < ranges[:, 1])
    X = scale_to_unit(bunch.data, ranges)
    # the fixed map, not one fitted to the data: the published endpoints land at +-1/1.2
    assert np.allclose(scale_to_unit(ranges.T, ranges), [[-1 / 1.2] * shape[1], [1 / 1.2] * shape[1]])
    assert np.all(np.abs(X) <= 1.0)
    data = load_dataset(name, split="iid", n_clients=5, random_state=0)
    assert np.array_equal(np.sort(data.pooled(), axis=0), np.sort(X, axis=0))
    assert len(np.unique(data.pooled_labels())) == k


def test_digits_unit_and_label_skew():
    iid = load_dataset("digits-unit", split="iid", n_clients=20, random_state=0)
    skew = load_dataset("digits-unit", split="dirichlet", n_clients=20, random_state=0, alpha=0.3)
    for d in (iid, skew):
        X = d.pooled()
        assert X.shape == (1797, 64) and X.min() == -1.0 and X.max() == 1.0
    # label skew: the clients' majority-class shares are far higher than under IID
    share = lambda d: np.mean([np.bincount(y).max() / len(y) for y in d.labels])  # noqa: E731
    assert share(skew) > 2 * share(iid)


def test_bench_loader_holds_out_and_declares_the_box():
    data, k, box, held = matrix.load({"name": "wine", "split": "dirichlet", "n_clients": 10, "alpha": 0.3}, 0)
    assert k == 3 and box == (-1.0, 1.0)
    assert data.n_samples + len(held) == 178 and len(held) > 5
    assert all(len(x) == len(y) for x, y in zip(data.clients, data.labels))
