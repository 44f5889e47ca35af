"""DP utility of every algorithm against DWF's, at the same epsilon on the same data.

    python -m benchmarks.dp_every_algorithm [--seeds 10] [--epsilon 1] [--jobs 2] [--datasets ...] [--algorithms ...]

For each data set (the DWF blob set, wine, breast cancer, digits scaled to [-1, 1]), each
algorithm (its secure, sum-only mode where its default mode sends set-fields) and each DP
mode (central; distributed under pairwise masking), the mean over seeds of the utility
``best central inertia / federated inertia`` (1: as good as scikit-learn's k-means on the
pooled records) and the largest ``privacy_spent_``. Seed s splits the records
(``load_dataset(name, random_state=s)``) and keys the fit and its noise
(``GaussianDP(rng="seeded")``), so a re-run reproduces the table exactly. The ratio column is the algorithm's
utility over DWF's in the same cell; the target is at least 0.8. Seeds run in parallel with
joblib (loky).
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np

DATASETS = {"dwf-blobs": ((-2.0, 2.0), 5), "wine": ((-1.0, 1.0), 3), "breast-cancer": ((-1.0, 1.0), 2),
            "digits-unit": ((-1.0, 1.0), 10)}
ALGORITHMS = ("dwf", "ewf", "minibatch", "aligning", "kfed", "child-parent", "fcm", "fcm-fedavg")
SECURE = ("aligning", "kfed", "child-parent", "fcm")
MODES = {"central": lambda dp: [dp], "distributed+masking": lambda dp: [dp, "masking"]}


def _inertia(X, C):
    d = ((X[:, None, :] - C[None, :, :]) ** 2).sum(-1)
    return float(d.min(1).sum())


def _best(X, k):
    from sklearn.cluster import KMeans

    return _inertia(X, KMeans(k, n_init=10, random_state=0).fit(X).cluster_centers_)


def cell(dataset: str, algorithm: str, mode: str, epsilon: float, seed: int) -> tuple[float, float]:
    """(utility, epsilon spent) of one fit."""
    from protocols.dp import GaussianDP
    from securefkm.datasets import load_dataset
    from securefkm.registry import make_estimator

    box, k = DATASETS[dataset]
    data = load_dataset(dataset, random_state=seed)  # the seed's own split of the records
    X = np.vstack(data.clients)
    # noise keyed by the estimator's seed: a re-run reproduces every cell, and the algorithms of
    # one (data set, mode, seed) see the same split
    dp = GaussianDP(epsilon, 1e-5, bounds=box, mode="central" if mode == "central" else "distributed", rng="seeded")
    params = {"secure_mode": True} if algorithm in SECURE else {}
    est = make_estimator(algorithm, n_clusters=k, protection=MODES[mode](dp), crypto="ideal", random_state=seed,
                         **params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(data)
    return _best(X, k) / _inertia(X, est.cluster_centers_), float(est.privacy_spent_[0])


def main(argv=None) -> None:
    from joblib import Parallel, delayed

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--datasets", nargs="*", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--algorithms", nargs="*", default=list(ALGORITHMS), choices=list(ALGORITHMS),
                   help="algorithms to run (DWF, the ratios' reference, is always run)")
    args = p.parse_args(argv)
    algorithms = ["dwf"] + [a for a in args.algorithms if a != "dwf"]
    tasks = [(d, a, m, s) for d in args.datasets for a in algorithms for m in MODES for s in range(args.seeds)]
    out = Parallel(n_jobs=args.jobs)(delayed(cell)(d, a, m, args.epsilon, s) for d, a, m, s in tasks)
    res: dict = {}
    for (d, a, m, _), (u, e) in zip(tasks, out):
        res.setdefault((d, a, m), []).append((u, e))
    print(f"utility = best central inertia / federated inertia, mean of {args.seeds} seeds, epsilon {args.epsilon:g}")
    print("| data set | algorithm | mode | utility | / DWF's | max epsilon spent |")
    print("|---|---|---|---:|---:|---:|")
    for d in args.datasets:
        for m in MODES:
            base = np.mean([u for u, _ in res[(d, "dwf", m)]])
            for a in algorithms:
                us, es = zip(*res[(d, a, m)])
                print(f"| {d} | {a} | {m} | {np.mean(us):.3f} | {np.mean(us) / base:.2f} | {max(es):.4g} |")


if __name__ == "__main__":
    main()
