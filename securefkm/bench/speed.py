"""``securefkm bench speed``: the cost of one in-process DWF round against scikit-learn.

Measured side by side in one run, on the same pooled data (the DWF paper's 5-blob set,
10,100 records, k=5, and a wider set), the time of one DWF training round with 100
clients (full participation, one local step, no protection: sampling, every client's
update, plain aggregation, the transcript) divided by one scikit-learn Lloyd iteration on
the pooled records. Two scikit-learn baselines are printed: its Cython Lloyd kernel alone
(``lloyd_iter_chunked_dense``, the fairest "one iteration"), and ``KMeans(max_iter=1).fit``
(what a user calls). Target: at most 2 against the kernel.
"""

from __future__ import annotations

import time

import numpy as np
from sklearn.cluster import KMeans

from ..algorithms.dwf import WeightedFederatedKMeansAlgorithm
from ..federation import Federation


def _sklearn_kernel_time(X, C, repeats):
    from sklearn.cluster._k_means_lloyd import lloyd_iter_chunked_dense  # private, timing only
    from sklearn.utils._openmp_helpers import _openmp_effective_n_threads

    w = np.ones(len(X))
    new, wic = np.zeros_like(C), np.zeros(len(C))
    labels, shift = np.full(len(X), -1, dtype=np.int32), np.zeros(len(C))
    n_threads = _openmp_effective_n_threads()
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        lloyd_iter_chunked_dense(X, w, C, new, wic, labels, shift, n_threads, update_centers=True)
        best = min(best, time.perf_counter() - t)
    return best


def _round_time(clients, C, repeats):
    algo = WeightedFederatedKMeansAlgorithm(len(C), init=C, tol=0.0)
    fed = Federation(algo, clients, max_rounds=repeats + 1, random_state=0, record="full")
    state = algo.init(len(clients), C.shape[1], np.random.default_rng(0))
    best = np.inf
    for r in range(repeats):
        t = time.perf_counter()
        state = fed.run_round(state, round=r)
        best = min(best, time.perf_counter() - t)
        state.centres = C  # keep the work per round identical
    return best


def measure(X, k, n_clients=100, repeats=50, seed=0):
    rng = np.random.default_rng(seed)
    X = np.ascontiguousarray(X, dtype=np.float64)
    clients = np.array_split(X[rng.permutation(len(X))], n_clients)
    C = X[rng.choice(len(X), k, replace=False)].copy()
    t_round = _round_time(clients, C, repeats)
    t_kernel = _sklearn_kernel_time(X, C, repeats)
    t_fit = min(
        _timed(lambda: KMeans(k, init=C, n_init=1, max_iter=1, algorithm="lloyd").fit(X)) for _ in range(max(3, repeats // 5))
    )
    return t_round, t_kernel, t_fit


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(repeats: int = 50, out=print):
    from ..datasets import load_dataset

    blobs = load_dataset("dwf-blobs", split="iid", n_clients=100, random_state=0).pooled()
    wide = np.random.default_rng(1).normal(size=(100_000, 16))
    out("One in-process DWF round (100 clients, full participation, plain sums, transcript on)")
    out("divided by one scikit-learn Lloyd iteration on the pooled data; best of "
        f"{repeats} repeats each, measured side by side.\n")
    out("| data | n x d, k | DWF round (ms) | sklearn kernel (ms) | ratio | KMeans(max_iter=1).fit (ms) | ratio |")
    out("|---|---|---:|---:|---:|---:|---:|")
    rows = []
    for name, X, k in (("DWF 5-blob set", blobs, 5), ("Gaussian 100k x 16", wide, 20)):
        t_round, t_kernel, t_fit = measure(X, k, repeats=repeats)
        rows.append((name, t_round / t_kernel, t_round / t_fit))
        out(f"| {name} | {X.shape[0]} x {X.shape[1]}, {k} | {t_round * 1e3:.3f} | {t_kernel * 1e3:.3f} | "
            f"{t_round / t_kernel:.2f} | {t_fit * 1e3:.3f} | {t_round / t_fit:.2f} |")
    return rows
