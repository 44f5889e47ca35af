"""``securefkm demo``: DWF on the non-IID 5-blob set with 100 clients, next to central k-means."""

from __future__ import annotations

import time

from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from .datasets import load_dataset
from .estimators.dwf import WeightedFederatedKMeans
from .plotting import plot_clients_and_centres
from .registry import make_protection


def run_demo(n_clients=100, random_state=0, plot_path="securefkm-demo.png", protection=None, verbose=1, out=print):
    data = load_dataset("dwf-blobs", split="non-iid", n_clients=n_clients, random_state=random_state)
    X, y = data.pooled(), data.pooled_labels()
    rows = []

    t = time.perf_counter()
    central = min(
        (KMeans(5, n_init=1, random_state=random_state + s).fit(X) for s in range(10)), key=lambda m: m.inertia_
    )
    rows.append(("central k-means (best of 10, pooled data)", central.inertia_ / len(X),
                 adjusted_rand_score(y, central.labels_), central.n_iter_, time.perf_counter() - t))

    layers = make_protection(protection or [])
    t = time.perf_counter()
    est = WeightedFederatedKMeans(5, protection=layers, random_state=random_state, verbose=verbose,
                                  init_bounds=(-2.0, 2.0) if layers else None).fit(data)
    label = "DWF federated" + (f" + {', '.join(type(x).__name__ for x in layers)}" if layers else "")
    rows.append((label, est.inertia_ / len(X), adjusted_rand_score(y, est.labels_), est.n_iter_, time.perf_counter() - t))

    out(f"DWF k-means on the non-IID 5-blob set: {data.n_clients} clients, {data.n_samples} records, k=5\n")
    out(f"| {'method':<44} | {'score (inertia/n)':>17} | {'ARI':>6} | {'rounds':>6} | {'time (s)':>8} |")
    out(f"|{'-' * 46}|{'-' * 19}|{'-' * 8}|{'-' * 8}|{'-' * 10}|")
    for name, score, ari, rounds, secs in rows:
        out(f"| {name:<44} | {score:>17.5f} | {ari:>6.3f} | {rounds:>6d} | {secs:>8.2f} |")
    ratio = rows[1][1] / rows[0][1]
    out(f"\nfederated / central score: {ratio:.4f}")
    out(est.transcript_.summary())
    if getattr(est, "privacy_spent_", None) is not None:
        out(f"privacy spent: epsilon={est.privacy_spent_[0]:.3f}, delta={est.privacy_spent_[1]:g}")
    if plot_path:
        path = plot_clients_and_centres(
            data, {"DWF (federated)": est.cluster_centers_, "central k-means": central.cluster_centers_}, plot_path
        )
        out(f"plot written to {path}")
    return {"rows": rows, "estimator": est, "central": central, "ratio": ratio}
