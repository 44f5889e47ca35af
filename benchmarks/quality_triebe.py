"""``python -m benchmarks quality --part triebe``: Triebe & Rajagopal's 1-D setting.

Davies-Bouldin index (lower is better) of mini-batch federated k-means on
``triebe_1d(random_state=seed)`` (50 clients x 10 points), mean over seeds, for several
configurations and client fractions C, next to central scikit-learn k-means with random
initialisation (the paper's baseline). T=200, B=inf, E=1, alpha=beta=1 unless stated.
"""

from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics import davies_bouldin_score

from securefkm.datasets import triebe_1d
from securefkm.estimators.minibatch import MiniBatchFederatedKMeans

CONFIGS = {
    'init="random" (one client\'s records)': {"init": "random"},
    'init="uniform", bounds (0, 6)': {"init": "uniform", "init_bounds": (0.0, 6.0)},
    'init="kfed"': {"init": "kfed"},
    "uniform, E=5, beta=0.5": {"init": "uniform", "init_bounds": (0.0, 6.0), "local_epochs": 5, "client_rate": 0.5},
    "uniform, B=4, E=3": {"init": "uniform", "init_bounds": (0.0, 6.0), "batch_size": 4, "local_epochs": 3},
}


def run(quick: bool = False, seeds: int | None = None, out=print):
    seeds = seeds or (3 if quick else 10)
    central = []
    data = [triebe_1d(random_state=s) for s in range(seeds)]
    for s, ds in enumerate(data):
        X = ds.pooled()
        central.append(davies_bouldin_score(X, KMeans(5, init="random", n_init=1, random_state=s).fit(X).labels_))
    out(f"Triebe 1-D, Davies-Bouldin (lower is better), mean over {seeds} seeds; "
        f"central k-means (random init): {np.mean(central):.3f}\n")
    out("| federated config (T=200) | C=1.0 | C=0.2 |")
    out("|---|---:|---:|")
    rows = {}
    for name, params in CONFIGS.items():
        cells = []
        for c in (1.0, 0.2):
            vals = []
            for s, ds in enumerate(data):
                est = MiniBatchFederatedKMeans(5, clients_per_round=c, max_rounds=200, random_state=s,
                                               record="aggregates", **params).fit(ds)
                vals.append(davies_bouldin_score(ds.pooled(), est.labels_))
            cells.append(float(np.mean(vals)))
        rows[name] = cells
        out(f"| {name} | {cells[0]:.3f} | {cells[1]:.3f} |")
    return {"central": float(np.mean(central)), "rows": rows}
