"""Ways to distribute one pooled dataset over clients.

Every splitter has the signature ``split_<name>(X, y=None, n_clients=..., random_state=None, **kw)``
and returns a list of index arrays that partition ``range(len(X))`` (every record goes to
exactly one client). No client is ever empty: a splitter either rebalances (documented per
splitter) or raises :class:`~securefkm.exceptions.InputError`.

Registry: :data:`SPLITTERS` and :func:`split_indices`.
"""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.cluster import KMeans

from ..validation import check_array, check_float, check_int, check_random_state
from ..exceptions import InputError

__all__ = [
    "SPLITTERS",
    "split_indices",
    "split_iid",
    "split_non_iid",
    "split_half_iid",
    "split_dirichlet",
    "split_distance",
    "split_column",
    "default_location_box",
]


def _check_n_clients(n_clients, n: int, name: str = "n_clients") -> int:
    n_clients = check_int(n_clients, name, minimum=1)
    if n_clients > n:
        raise InputError(
            f"{name}={n_clients} exceeds the number of records ({n}); every client needs a record."
        )
    return n_clients


def _sk_seed(random_state, rng: np.random.Generator) -> int:
    """An int seed for scikit-learn: the user's int itself (so ``random_state=s`` matches the
    DWF authors' ``KMeans(random_state=s)``), otherwise one drawn from ``rng``."""
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        return int(random_state)
    return int(rng.integers(2**31 - 1))


def _finish(parts: list[np.ndarray], n: int, splitter: str, fix: str) -> list[np.ndarray]:
    parts = [np.asarray(p, dtype=np.int64) for p in parts]
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise InputError(f"the {splitter!r} split left client(s) {empty} without records; {fix}.")
    assert sum(len(p) for p in parts) == n
    return parts


def split_iid(X, y=None, n_clients: int = 10, random_state=None) -> list[np.ndarray]:
    """IID split (Holzer et al. 2023, DWF paper section 3.2): a random permutation of the
    records cut into ``n_clients`` chunks of (almost) equal size with ``np.array_split``
    (the first ``n % n_clients`` chunks hold one record more, as in the authors' code)."""
    X = check_array(X, "X")
    n_clients = _check_n_clients(n_clients, len(X))
    rng = check_random_state(random_state)
    return _finish(
        np.array_split(rng.permutation(len(X)), n_clients), len(X), "iid", "use fewer clients"
    )


def _kmeans_parts(X, n_clients, seed, max_iter, n_init):
    km = KMeans(n_clusters=n_clients, max_iter=max_iter, n_init=n_init, random_state=seed)
    labels = km.fit(X).labels_
    order = np.argsort(labels, kind="stable")
    return np.split(order, np.cumsum(np.bincount(labels, minlength=n_clients))[:-1])


def split_non_iid(
    X, y=None, n_clients: int = 10, random_state=None, max_iter: int = 5, n_init: int = 5
) -> list[np.ndarray]:
    """Non-IID split (DWF paper section 3.2): k-means with ``k = n_clients``, at most 5
    Lloyd steps and ``n_init=5`` on the pooled records; cluster ``i`` is client ``i``.

    Exactly the authors' call ``KMeans(n_clusters=n_clients, max_iter=5, n_init=5,
    random_state=seed)``. The authors silently drop clusters left empty; here an empty
    cluster raises (it needs fewer distinct records than clients).
    """
    X = check_array(X, "X")
    n_clients = _check_n_clients(n_clients, len(X))
    if len(np.unique(X, axis=0)) < n_clients:
        raise InputError(f"non-iid split needs at least n_clients={n_clients} distinct records.")
    rng = check_random_state(random_state)
    parts = _kmeans_parts(X, n_clients, _sk_seed(random_state, rng), max_iter, n_init)
    return _finish(parts, len(X), "non-iid", "use fewer clients")


def split_half_iid(
    X, y=None, n_clients: int = 10, random_state=None, max_iter: int = 5, n_init: int = 5
):
    """Half-IID split (DWF paper section 3.2): a random half of the records (``n // 2``) is
    split IID, the other half non-IID (k-means on that half only, as in the authors'
    ``distribute_to_clients(mode="half")``); client ``i`` gets IID chunk ``i`` plus k-means
    cluster ``i``."""
    X = check_array(X, "X")
    n = len(X)
    n_clients = _check_n_clients(n_clients, n)
    if n < 2 * n_clients:
        raise InputError(
            f"half-iid split needs at least 2 * n_clients = {2 * n_clients} records, got {n}."
        )
    rng = check_random_state(random_state)
    perm = rng.permutation(n)
    iid_idx, cl_idx = perm[: n // 2], perm[n // 2 :]
    if len(np.unique(X[cl_idx], axis=0)) < n_clients:
        raise InputError(
            f"half-iid split needs at least n_clients={n_clients} distinct records in each half."
        )
    iid_parts = np.array_split(iid_idx, n_clients)
    cl_parts = _kmeans_parts(X[cl_idx], n_clients, _sk_seed(random_state, rng), max_iter, n_init)
    parts = [np.concatenate([a, cl_idx[b]]) for a, b in zip(iid_parts, cl_parts)]
    return _finish(parts, n, "half-iid", "use fewer clients")


def split_dirichlet(
    X, y=None, n_clients: int = 10, random_state=None, alpha: float = 0.5
) -> list[np.ndarray]:
    """Label-skew split: for every class, client shares ``p ~ Dir(alpha * 1)`` and the
    class's (shuffled) records are cut at the cumulative shares (Hsu, Qi & Brown 2019,
    "Measuring the effects of non-identical data distribution", section 3).

    Small ``alpha`` gives clients dominated by one class, large ``alpha`` approaches IID.
    Rebalancing (our choice): a client left empty receives one random record of the
    currently largest client, repeated until no client is empty.
    """
    X = check_array(X, "X")
    if y is None:
        raise InputError("the 'dirichlet' split needs labels: pass y (one class label per record).")
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != len(X):
        raise InputError(
            f"y must be 1-D with one label per row of X ({len(X)}), got shape {y.shape}."
        )
    n_clients = _check_n_clients(n_clients, len(X))
    alpha = check_float(alpha, "alpha", minimum=0.0, min_inclusive=False)
    rng = check_random_state(random_state)
    owner = np.empty(len(X), dtype=np.int64)
    classes, inverse = np.unique(y, return_inverse=True)
    props = rng.dirichlet(np.full(n_clients, alpha), size=len(classes))
    for c in range(len(classes)):  # loop over classes, not records
        idx = rng.permutation(np.flatnonzero(inverse == c))
        cuts = np.round(np.cumsum(props[c])[:-1] * len(idx)).astype(np.int64)
        owner[idx] = np.repeat(
            np.arange(n_clients), np.diff(np.concatenate([[0], cuts, [len(idx)]]))
        )
    counts = np.bincount(owner, minlength=n_clients)
    for e in np.flatnonzero(counts == 0):
        donor = int(np.argmax(counts))
        moved = rng.choice(np.flatnonzero(owner == donor))
        owner[moved] = e
        counts[donor] -= 1
        counts[e] += 1
    order = np.argsort(owner, kind="stable")
    parts = np.split(order, np.cumsum(counts)[:-1])
    return _finish(parts, len(X), "dirichlet", "use fewer clients")


def default_location_box(X) -> tuple[np.ndarray, np.ndarray]:
    """The box client locations are drawn from when none is given: the data's bounding box
    enlarged about its centre by a factor 5/3, which maps Garst & Reinders' grid of centres
    in [-7.5, 7.5]^2 to their location field (-12.5, 12.5)^2."""
    lo, hi = X.min(axis=0), X.max(axis=0)
    mid, half = (lo + hi) / 2.0, (hi - lo) / 2.0
    half = np.where(half > 0, half, 1.0)
    return mid - half * 5.0 / 3.0, mid + half * 5.0 / 3.0


def split_distance(
    X,
    y=None,
    n_clients: int = 4,
    random_state=None,
    beta: float = 1.0,
    locations=None,
    box=None,
) -> list[np.ndarray]:
    """Distance-based split of Garst & Reinders (section 3, eq. 2).

    Each client ``j`` has a location ``l_j`` (uniform in ``box`` = ``(low, high)``, default
    :func:`default_location_box`, or given as ``locations`` (n_clients, n_features)). Client
    ``j`` claims record ``x`` independently with probability ``P = 1 - exp(-beta / d)``,
    ``d = ||x - l_j||`` (``P = 1`` at ``d = 0``). A record claimed by several clients goes
    to one of them uniformly at random (the paper's rule). Small ``beta``: records go to
    nearby clients (heterogeneous); large ``beta``: every client claims almost everything
    and the split approaches IID.

    Records nobody claims: the paper is silent and the authors' generating notebook was not
    found. We give such a record to the client most likely to claim it, i.e. the nearest
    location (ties: lowest index). This is the rule consistent with the paper and the
    authors' data: their "super diag" set uses beta = 1e-5, where almost no record is ever
    claimed, so unclaimed records cannot have been dropped, and small beta is the paper's
    heterogeneous end (at beta -> 0 the split becomes the Voronoi partition of the
    locations). An empty client raises.
    """
    X = check_array(X, "X")
    n, d = X.shape
    rng = check_random_state(random_state)
    beta = check_float(beta, "beta", minimum=0.0, min_inclusive=False)
    if locations is not None:
        loc = check_array(locations, "locations")
        if loc.shape[1] != d:
            raise InputError(f"locations has {loc.shape[1]} columns but X has {d} features.")
        if n_clients is not None and n_clients != len(loc):
            raise InputError(
                f"locations gives {len(loc)} clients but n_clients={n_clients}; pass one or match them."
            )
        n_clients = len(loc)
    else:
        n_clients = _check_n_clients(n_clients, n)
        if box is None:
            low, high = default_location_box(X)
        else:
            try:
                low, high = (np.broadcast_to(np.asarray(b, dtype=np.float64), (d,)) for b in box)
            except (TypeError, ValueError):
                raise InputError(
                    f"box must be (low, high) scalars or arrays of length {d}, got {box!r}."
                ) from None
            if not np.all(high > low):
                raise InputError(f"box needs high > low in every feature, got {box!r}.")
        loc = rng.uniform(low, high, size=(n_clients, d))
    dist = np.sqrt(((X[:, None, :] - loc[None, :, :]) ** 2).sum(axis=2))
    with np.errstate(divide="ignore"):
        P = -np.expm1(-beta / dist)
    claims = rng.random(P.shape) < P
    keys = np.where(claims, rng.random(P.shape), -1.0)
    owner = keys.argmax(axis=1)
    none = ~claims.any(axis=1)
    owner[none] = dist[none].argmin(axis=1)
    order = np.argsort(owner, kind="stable")
    parts = np.split(order, np.cumsum(np.bincount(owner, minlength=n_clients))[:-1])
    return _finish(parts, n, "distance", "change beta, the client locations or use fewer clients")


def split_column(X, y=None, n_clients=None, random_state=None, column: int = 0, drop: bool = True):
    """One client per distinct value of feature ``column`` (e.g. Stallmann & Wilbik's bank
    data, section 3.2.3, one client per job group), clients in increasing value order.

    ``n_clients`` must be None or the number of distinct values (:func:`split_indices`
    and ``from_pooled`` pass None: the column decides the clients). ``drop`` is honoured by :meth:`FederatedDataset.from_pooled`, which
    removes the column from the features; index arrays are the same either way.
    """
    X = check_array(X, "X")
    column = check_int(column, "column", minimum=-X.shape[1], maximum=X.shape[1] - 1)
    values, inverse = np.unique(X[:, column], return_inverse=True)
    if n_clients is not None and n_clients != len(values):
        raise InputError(
            f"column {column} has {len(values)} distinct values but n_clients={n_clients}; "
            "pass n_clients=None for one client per value."
        )
    order = np.argsort(inverse, kind="stable")
    parts = np.split(order, np.cumsum(np.bincount(inverse))[:-1])
    return _finish(parts, len(X), "column", "unreachable")


SPLITTERS = {
    "iid": split_iid,
    "half-iid": split_half_iid,
    "non-iid": split_non_iid,
    "dirichlet": split_dirichlet,
    "distance": split_distance,
    "column": split_column,
}


def split_indices(name: str, X, y=None, n_clients=10, random_state=None, **kw) -> list[np.ndarray]:
    """Dispatch to the splitter called ``name`` (one of :data:`SPLITTERS`)."""
    if name not in SPLITTERS:
        raise InputError(
            f"split={name!r} is unknown; choose one of {', '.join(map(repr, SPLITTERS))}."
        )
    if name == "column":
        n_clients = None  # one client per distinct value; any n_clients is ignored
    elif n_clients is None:
        raise InputError(f"split={name!r} needs n_clients (an int >= 1).")
    try:
        return SPLITTERS[name](X, y, n_clients=n_clients, random_state=random_state, **kw)
    except TypeError as exc:
        raise InputError(f"split={name!r} got an unexpected option: {exc}.") from None
