"""``python -m benchmarks quality`` (DWF part): the layout of Table 1 of Holzer et al. 2023.

k-means (central, pooled data), EWF, DWF and k-FED; the synthetic 5-blob set (k=5) and
scikit-learn's digits (k=20, standing in for MNIST, which cannot be downloaded here);
IID / half-IID / non-IID splits over 100 clients with full participation, a fresh split per
run; mean, min and std of the score (inertia / n), mean and max of accuracy (majority
matching, as in the paper) and v-measure. The paper keeps the best 50 of 100 runs per cell;
``keep_best`` does the same with the runs made here.
"""

from __future__ import annotations

import time

import numpy as np
from sklearn.cluster import KMeans

from securefkm import metrics
from securefkm.datasets import load_dataset
from securefkm.registry import make_estimator
from securefkm.sweep import run_sweep

METHODS = ("k-means", "EWF", "DWF", "k-FED")


def _fit(method, data, k, seed):
    X = data.pooled()
    if method == "k-means":
        return KMeans(k, n_init=1, random_state=seed).fit(X).cluster_centers_
    name = {"EWF": "ewf", "DWF": "dwf", "k-FED": "kfed"}[method]
    params = {"max_rounds": 300} if name in ("dwf", "ewf") else {}
    # only the centres are read: the transcript keeps each round's aggregate, not every message
    return make_estimator(name, n_clusters=k, random_state=seed, record="aggregates", **params).fit(data).cluster_centers_


def _cell(cell: dict) -> list[float]:
    """One run of one (dataset, split, method): [score, accuracy, v-measure] (a sweep cell)."""
    r = cell["run"]
    data = load_dataset(cell["name"], split=cell["split"], n_clients=100, random_state=r)
    X, y = data.pooled(), data.pooled_labels()
    C = _fit(cell["method"], data, cell["k"], seed=r)
    pred = metrics.assign(X, C)
    return [metrics.kmeans_score(X, C), metrics.accuracy(y, pred), metrics.v_measure(y, pred)]


def run(quick: bool = False, runs: int | None = None, keep_best: float = 0.5, out=print, jobs: int = 1,
        backend: str = "processes"):
    """The table; ``jobs``/``backend``: the independent runs go through :func:`.sweep.run_sweep`
    (same table for any number of jobs)."""
    runs = runs or (4 if quick else 20)
    datasets = (("synthetic", "dwf-blobs", 5), ("digits", "digits", 20))
    splits = ("iid", "half-iid", "non-iid")
    rows = []
    start = time.perf_counter()
    cells = [{"name": name, "k": k, "split": split, "method": method, "run": r}
             for _, name, k in datasets for split in splits for method in METHODS for r in range(runs)]
    values = run_sweep(_cell, cells, jobs=jobs, backend=backend, desc="quality")
    results: dict = {}
    for (label, name, _), split, method in ((d, s, m) for d in datasets for s in splits for m in METHODS):
        vals = [v for c, v in zip(cells, values) if (c["name"], c["split"], c["method"]) == (name, split, method)]
        vals = np.array(sorted(vals, key=lambda v: v[0])[: max(1, int(round(keep_best * runs)))])
        results[(label, split, method)] = vals
    out(f"DWF paper Table 1 layout: {runs} runs per cell, best {int(keep_best * 100)}% kept by score, "
        f"100 clients, full participation ({time.perf_counter() - start:.0f} s)\n")
    for metric, col, agg in (("score", 0, ("mean", "min", "std")), ("accuracy", 1, ("mean", "max", "std")),
                             ("v-measure", 2, ("mean", "max", "std"))):
        out(f"\n**{metric}**\n")
        out("| data | split | value | " + " | ".join(METHODS) + " |")
        out("|---|---|---|" + "---:|" * len(METHODS))
        for label, _, _ in datasets:
            for split in splits:
                for a in agg:
                    cells_txt = []
                    for method in METHODS:
                        v = results[(label, split, method)][:, col]
                        x = {"mean": v.mean(), "min": v.min(), "max": v.max(), "std": v.std()}[a]
                        cells_txt.append(f"{x:.4f}")
                        rows.append((metric, label, split, a, method, x))
                    out(f"| {label} | {split} | {a} | " + " | ".join(cells_txt) + " |")
    return rows
