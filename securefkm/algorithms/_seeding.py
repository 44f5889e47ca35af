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
``"uniform"``      k centres uniform in the declared ``init_bounds`` box   nothing
array              the given centres                                        nothing
=================  ======================================================  =================

The first three send data-derived values in plain; the estimators refuse them under a
protection stack unless the user asks for them explicitly (see
``securefkm.estimators.base``). A client with fewer than k records answers with nothing
and the server asks another random client.
"""

from __future__ import annotations

import numpy as np

from ..exceptions import InputError
from ..messages import AggregatedUpdate, Broadcast, Update
from ._kmeans import local_kmeans, seed_kmeans_plusplus, uniform_in_bounds, weighted_kmeans

SEEDING_ROUND_INITS = ("k-means++", "random", "kfed")
INIT_CHOICES = SEEDING_ROUND_INITS + ("uniform",)
PLAIN_INITS = SEEDING_ROUND_INITS  # inits that reveal client data in plain


def initial_centres(init, k: int, n_features: int, rng, init_bounds=None):
    """Centres available without a round, or None if a seeding round is needed."""
    if isinstance(init, np.ndarray):
        return init.astype(np.float64, copy=True)
    if init == "uniform":
        if init_bounds is None:
            raise InputError("init='uniform' needs init_bounds=(low, high), the declared data range.")
        return uniform_in_bounds(init_bounds, k, n_features, rng)
    return None


def seeding_broadcast(init: str, k: int) -> Broadcast:
    if init == "k-means++":
        return Broadcast(action="init.kmeans++", params={"k": k}, sample="one")
    if init == "random":
        return Broadcast(action="init.random", params={"k": k}, sample="one")
    if init == "kfed":
        return Broadcast(action="init.kfed", params={"k_local": k})
    raise InputError(f"init={init!r} has no seeding round.")


def seeding_client_update(X: np.ndarray, broadcast: Broadcast, rng: np.random.Generator) -> Update:
    action = broadcast.action
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


def seeding_aggregate(agg: AggregatedUpdate, k: int, rng: np.random.Generator) -> np.ndarray | None:
    """Centres from a seeding round, or None if the asked client could not seed (retry)."""
    received = [items for items in agg.items.values() if len(items.get("centres", ())) > 0]
    if not received:
        return None
    if "sizes" in received[0]:  # k-FED: k-means over all local centres (unweighted, as in k-FED)
        points = np.vstack([it["centres"] for it in received])
        return weighted_kmeans(points, k, rng)
    return np.asarray(received[0]["centres"], dtype=np.float64).copy()
