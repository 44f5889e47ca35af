import numpy as np
import pytest

from securefkm.datasets import (
    DATASETS,
    GARST_EXTREME_CLUSTERS,
    SPLITTERS,
    FederatedDataset,
    as_federated,
    digits,
    dwf_blobs,
    g2,
    garst_centres,
    garst_extreme_split,
    garst_federated,
    garst_grid,
    load_dataset,
    split_dirichlet,
    split_iid,
    split_indices,
    split_non_iid,
    stallmann_motivational,
    triebe_1d,
)
from securefkm.exceptions import InputError


def _is_partition(parts, n):
    allidx = np.concatenate(parts)
    return (
        len(allidx) == n
        and np.array_equal(np.sort(allidx), np.arange(n))
        and all(len(p) > 0 for p in parts)
    )


@pytest.fixture(scope="module")
def grid():
    return garst_grid(points_per_centre=20, random_state=0)


# ----------------------------------------------------------------- splitters
@pytest.mark.parametrize("name", sorted(SPLITTERS))
def test_every_splitter_partitions(name, grid):
    X, y = grid
    kw = {"column": 0} if name == "column" else {}
    Xc = np.column_stack([y % 3, X]).astype(float) if name == "column" else X
    parts = split_indices(name, Xc, y, n_clients=3 if name == "column" else 5, random_state=1, **kw)
    assert _is_partition(parts, len(X))
    if name == "column":
        assert len(parts) == 3 and all(len(np.unique(Xc[p, 0])) == 1 for p in parts)
    else:
        assert len(parts) == 5
    again = split_indices(name, Xc, y, n_clients=3 if name == "column" else 5, random_state=1, **kw)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_iid_sizes_like_array_split():
    X = np.arange(23.0).reshape(-1, 1)
    parts = split_iid(X, n_clients=5, random_state=0)
    assert [len(p) for p in parts] == [5, 5, 5, 4, 4]


def test_non_iid_clients_are_compact(grid):
    X, _ = grid
    within = lambda parts: np.mean([X[p].var(axis=0).sum() for p in parts])  # noqa: E731
    v_non = within(split_non_iid(X, n_clients=16, random_state=0))
    v_iid = within(split_iid(X, n_clients=16, random_state=0))
    assert v_non < 0.2 * v_iid


def test_half_iid_is_between(grid):
    X, _ = grid
    within = lambda parts: np.mean([X[p].var(axis=0).sum() for p in parts])  # noqa: E731
    v = {
        s: within(split_indices(s, X, n_clients=16, random_state=0))
        for s in ("iid", "half-iid", "non-iid")
    }
    assert v["non-iid"] < v["half-iid"] < v["iid"]


def test_dirichlet_small_alpha_single_label():
    X, y = digits()
    purity = lambda parts: np.mean([np.bincount(y[p]).max() / len(p) for p in parts])  # noqa: E731
    tiny = split_dirichlet(X, y, n_clients=10, random_state=0, alpha=0.01)
    big = split_dirichlet(X, y, n_clients=10, random_state=0, alpha=100.0)
    assert _is_partition(tiny, len(X)) and _is_partition(big, len(X))
    assert purity(tiny) > 0.8
    assert purity(big) < 0.2


def test_dirichlet_needs_labels(grid):
    with pytest.raises(InputError, match="needs labels"):
        split_indices("dirichlet", grid[0], None, n_clients=3, random_state=0)


def test_distance_beta_controls_heterogeneity():
    # small beta: records go to nearby clients (few clusters each); large beta: near IID
    def mean_labels(beta):
        ds = garst_federated(beta, n_clients=4, random_state=3)
        return np.mean([len(np.unique(lab)) for lab in ds.labels])

    assert mean_labels(0.1) < 10
    assert mean_labels(10.0) == 16
    assert mean_labels(0.1) < mean_labels(1.0) <= mean_labels(10.0)


def test_distance_given_locations_voronoi_limit(grid):
    X, y = grid
    loc = np.array([[-5.0, -5.0], [5.0, 5.0]])
    parts = split_indices("distance", X, y, n_clients=2, random_state=0, beta=1e-9, locations=loc)
    owner = np.empty(len(X), int)
    for i, p in enumerate(parts):
        owner[p] = i
    nearest = np.argmin(((X[:, None] - loc[None]) ** 2).sum(2), axis=1)
    assert np.array_equal(owner, nearest)


def test_unknown_split_name(grid):
    with pytest.raises(InputError, match="split='nope'.*'iid'"):
        split_indices("nope", grid[0], n_clients=2)


def test_too_many_clients():
    with pytest.raises(InputError, match="n_clients"):
        split_iid(np.zeros((3, 2)), n_clients=4)


# ----------------------------------------------------------------- generators
def test_triebe_1d():
    ds = triebe_1d(random_state=0)
    assert ds.n_clients == 50 and ds.n_features == 1 and np.all(ds.sizes == 10)
    for X, lab in zip(ds.clients, ds.labels):
        assert len(np.unique(lab)) == 1
        assert abs(X.mean() - (lab[0] + 1)) < 4 * 0.2 / np.sqrt(10)


def test_garst_grid_centres(grid):
    X, y = grid
    C = garst_centres()
    assert C.shape == (16, 2)
    assert np.array_equal(np.unique(C[:, 0]), [-7.5, -2.5, 2.5, 7.5])
    assert np.array_equal(C[:2], [[-7.5, -7.5], [-7.5, -2.5]])
    assert X.shape == (320, 2) and np.array_equal(np.bincount(y), np.full(16, 20))
    means = np.array([X[y == k].mean(0) for k in range(16)])
    assert np.abs(means - C).max() < 1.0
    X2, _ = garst_grid(200, std=1.5, random_state=0)
    assert X2.shape == (3200, 2)
    assert 1.4 < np.std(X2 - C[np.repeat(np.arange(16), 200)]) < 1.6


def test_garst_extreme_split():
    ds = garst_extreme_split(random_state=0)
    assert [len(np.unique(lab)) for lab in ds.labels] == list(GARST_EXTREME_CLUSTERS)
    assert ds.sizes[0] == 10 and ds.n_samples == 800
    sets = [set(np.unique(lab)) for lab in ds.labels]
    assert all(a <= b for a, b in zip(sets, sets[1:]))  # nested


def test_stallmann_motivational():
    ds = stallmann_motivational(random_state=0)
    assert ds.n_clients == 3 and np.all(ds.sizes == 1040)
    counts = [np.bincount(lab, minlength=5).tolist() for lab in ds.labels]
    assert counts == [[500, 500, 0, 0, 40], [0, 500, 0, 500, 40], [0, 0, 500, 500, 40]]
    y = ds.pooled_labels()
    X = ds.pooled()
    assert np.allclose(X[y == 4].mean(0), [0.5, 0.5], atol=0.01)
    assert X[y == 4].std() < 0.02


def test_g2():
    X, y = g2(8, 30.0, random_state=0)
    assert X.shape == (2048, 8) and np.array_equal(np.bincount(y), [1024, 1024])
    assert np.allclose(X[y == 0].mean(0), 500, atol=5) and np.allclose(
        X[y == 1].mean(0), 600, atol=5
    )
    with pytest.raises(InputError, match="even"):
        g2(2, 10.0, n=11)


def test_dwf_blobs_reproduces_authors_data():
    X, y = dwf_blobs()
    assert X.shape == (10100, 2) and X.dtype == np.float64
    assert np.array_equal(np.bincount(y), [2000] * 5 + [100])
    assert np.all(np.abs(X[y == 5]) <= 1)
    # first noise point: Python's random.seed(1); 2 * random.random() - 1
    import random

    r = random.Random(1)
    assert X[10000, 0] == 2 * r.random() - 1 and X[10000, 1] == 2 * r.random() - 1
    centres = np.array([X[y == k].mean(0) for k in range(5)])
    assert np.all(np.abs(centres) < 1.05)
    X2, _ = dwf_blobs()
    assert np.array_equal(X, X2)


def test_digits():
    X, y = digits()
    assert X.shape == (1797, 64) and X.dtype == np.float64 and len(np.unique(y)) == 10


# ----------------------------------------------------------------- registry
def test_registry_defaults_and_errors():
    assert set(DATASETS) == {
        "dwf-blobs",
        "digits",
        "digits-unit",
        "wine",
        "breast-cancer",
        "triebe-1d",
        "garst-grid",
        "garst-extreme",
        "stallmann-motivational",
        "g2",
    }
    ds = load_dataset("g2", dim=4, sigma=20.0, random_state=0)
    assert ds.n_clients == 2 and ds.n_features == 4
    ds = load_dataset("garst-grid", random_state=0, beta=0.1)
    assert ds.n_clients == 4 and ds.n_samples == 800
    ds = load_dataset("digits", split="dirichlet", n_clients=5, alpha=0.3, random_state=0)
    assert ds.n_clients == 5 and ds.n_samples == 1797
    a = load_dataset("triebe-1d", random_state=4)
    b = load_dataset("triebe-1d", random_state=4)
    assert np.array_equal(a.pooled(), b.pooled())
    with pytest.raises(InputError, match="valid names: dwf-blobs"):
        load_dataset("mnist")


# ----------------------------------------------------------------- FederatedDataset
def test_dataset_basics():
    a, b = np.arange(6.0).reshape(3, 2), np.ones((2, 2))
    ds = FederatedDataset([a, b], labels=[[0, 1, 1], [2, 2]])
    assert ds.n_clients == 2 and ds.n_features == 2 and ds.n_samples == 5
    assert ds.client_ids == ["client-0", "client-1"]
    assert np.array_equal(ds.sizes, [3, 2])
    assert ds[0] is a  # float64 input is not copied
    assert np.array_equal(ds.client_of_record(), [0, 0, 0, 1, 1])
    assert np.array_equal(ds.pooled_labels(), [0, 1, 1, 2, 2])
    assert len(ds) == 2 and [c.shape for c in ds] == [(3, 2), (2, 2)]
    assert "n_clients=2" in repr(ds)


@pytest.mark.parametrize(
    "clients, match",
    [
        ([np.array([[1.0, np.nan]])], r"clients\[0\] contains NaN"),
        ([np.ones((2, 2)), np.array([[np.inf, 1.0]])], r"clients\[1\] contains NaN or inf"),
        ([np.ones(3)], r"clients\[0\] must be 2-D"),
        ([[[1.0, 2.0], [3.0]]], r"clients\[0\].*Ragged"),
        ([np.ones((2, 2)), np.ones((0, 2))], r"clients\[1\] has no rows.*drop empty clients"),
        ([np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 3))], r"clients\[2\] has 3 features"),
    ],
)
def test_dataset_bad_input(clients, match):
    with pytest.raises(InputError, match=match):
        FederatedDataset(clients)


def test_dataset_bad_labels_and_ids():
    with pytest.raises(InputError, match=r"labels\[1\] has 1 entries"):
        FederatedDataset([np.ones((2, 1)), np.ones((2, 1))], labels=[[0, 1], [0]])
    with pytest.raises(InputError, match="client_ids must be unique"):
        FederatedDataset([np.ones((2, 1)), np.ones((2, 1))], client_ids=["a", "a"])


def test_as_federated():
    ds = FederatedDataset([np.ones((2, 2))])
    assert as_federated(ds) is ds
    assert as_federated([np.ones((2, 2)), np.zeros((1, 2))]).n_clients == 2
    for bad in (np.ones((4, 2)), np.ones(4), [np.ones(3)], [[1.0, 2.0], [3.0, 4.0]]):
        with pytest.raises(InputError, match="list of per-client 2-D arrays.*from_pooled"):
            as_federated(bad)


def test_from_pooled_and_column_drop():
    X = np.column_stack([np.repeat([3.0, 1.0, 2.0], 4), np.arange(12.0)])
    ds = FederatedDataset.from_pooled(X, np.arange(12), split="column", column=0)
    assert ds.n_clients == 3 and ds.n_features == 1
    assert np.array_equal(ds[0].ravel(), [4, 5, 6, 7])  # value 1.0 first
    ds2 = FederatedDataset.from_pooled(X, split="iid", n_clients=4, random_state=0)
    assert np.array_equal(np.sort(ds2.pooled()[:, 1]), np.arange(12.0))


def test_csv_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    clients = [rng.normal(size=(n, 3)) * 10.0 ** rng.integers(-5, 5) for n in (4, 1, 7)] + [
        rng.normal(size=(2, 3))
    ] * 9
    labels = [rng.integers(0, 5, size=len(c)) for c in clients]
    ds = FederatedDataset(clients, labels=labels)
    ds.to_csv_dir(tmp_path / "h")
    back = FederatedDataset.from_csv_dir(tmp_path / "h", label_column="label")
    assert back.client_ids == ds.client_ids  # natural order: client-2 before client-10
    assert all(np.array_equal(a, b) for a, b in zip(ds.clients, back.clients))
    assert all(np.array_equal(a, b) for a, b in zip(ds.labels, back.labels))
    ds.to_csv_dir(tmp_path / "n", header=False)
    back = FederatedDataset.from_csv_dir(tmp_path / "n", label_column=-1)
    assert all(np.array_equal(a, b) for a, b in zip(ds.clients, back.clients))
    plain = FederatedDataset.from_csv_dir(tmp_path / "n")
    assert plain.n_features == 4 and plain.labels is None


def test_csv_errors(tmp_path):
    (tmp_path / "a.csv").write_text("x,city\n1.0,paris\n")
    with pytest.raises(InputError, match=r"a.csv: column 'city' is not numeric"):
        FederatedDataset.from_csv_dir(tmp_path)
    with pytest.raises(InputError, match="label_column='y' not found"):
        FederatedDataset.from_csv_dir(tmp_path, label_column="y")
    ok = FederatedDataset.from_csv_dir(tmp_path, label_column="city")
    assert ok.labels[0].tolist() == ["paris"]
    (tmp_path / "b.csv").write_text("x,city\n")
    with pytest.raises(InputError, match="b.csv: only a header row"):
        FederatedDataset.from_csv_dir(tmp_path, label_column="city")
    with pytest.raises(InputError, match="no files match"):
        FederatedDataset.from_csv_dir(tmp_path, pattern="*.tsv")
