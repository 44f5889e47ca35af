"""Cross-device scale: one DWF round's time and memory as the cohort grows, and a cost model.

``python -m benchmarks.cross_device --crypto ideal --sizes 1000,10000,100000,1000000``
``python -m benchmarks.cross_device --crypto real --sizes 1000,10000,100000``
``python -m benchmarks.cross_device --study 10000000 --cohort 10000 [--crypto real]``

Each figure is one DWF training round (k = 5, d = 2, 10 records per client, every client
sampled, 5% of them dropping at a random stage) under ``GaussianDP(mode="distributed")`` and
``PairwiseMasking()`` (the SecAgg+ graph of Bell et al. for its default 10% dropout allowance),
``record="aggregates"``, measured in a fresh spawned process so that its peak resident set is
the round's (plus its workers'). ``--crypto ideal`` runs the masking's ideal functionality;
``--crypto real`` the protocol with real X25519, and prices the round's own cryptography (its
key generations, agreements and key derivations, counted in the round, at unit costs measured
in the same process) to print round / crypto. Real rounds run in this process
(``backend="local"``): one core, the count of agreements a worker pool would split.

``--study N`` fits ``WeightedFederatedKMeans`` (its DP plan: a private start, then Lloyd
rounds) with ``GaussianDP(epsilon=1, mode="distributed")`` over the masking (ideal, or with
``--crypto real`` the protocol on the default backend's worker processes) on a streamed
population of ``N`` clients (:func:`securefkm.datasets.blob_population`), ``--cohort`` clients a
round, in a fresh process, and prints the fit's wall time, the driver's peak resident set,
rounds, privacy spent and the largest distance of a fitted centre from the nearest generating
centre.

The cost model is a least-squares fit of ``time = a + b n`` and ``memory = c + e n`` over the
sizes measured (medians of ``--repeats``), printed with its extrapolation.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

RECORDS, K, D, DROPOUT = 10, 5, 2, 0.05


def _population(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-4, 4, size=(K, D))
    X = centres[rng.integers(0, K, RECORDS * n)] + rng.normal(scale=0.5, size=(RECORDS * n, D))
    X = np.clip(X, -6.0, 6.0)
    return [X[i * RECORDS:(i + 1) * RECORDS] for i in range(n)], X[rng.choice(len(X), K, replace=False)].copy()


def _one_round(n: int, crypto: str, seed: int, warm_up: bool = True) -> dict:
    from benchmarks.speed import _cost, _count_crypto, _peak_rss, _unit_costs
    from protocols import GaussianDP, PairwiseMasking
    from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
    from securefkm.federation import Federation

    if warm_up:  # compiles the kernels and fills the import caches, outside the timed round
        _one_round(300, crypto, seed, warm_up=False)
    clients, C = _population(n, seed)
    algo = WeightedFederatedKMeansAlgorithm(K, init=C, tol=0.0)
    delta = 1.0 / (RECORDS * n) ** 1.1
    t0 = time.perf_counter()
    fed = Federation(algo, clients, protection=[GaussianDP(1.0, delta, bounds=(-6, 6), mode="distributed"),
                                                PairwiseMasking()],
                     max_rounds=2, random_state=seed, record="aggregates", crypto=crypto, backend="local",
                     dropout_rate=DROPOUT)
    setup = time.perf_counter() - t0
    state = algo.init(n, D, np.random.default_rng(seed))
    counts = {}
    t0 = time.perf_counter()
    if crypto == "real":
        counts = _count_crypto(lambda: fed.run_round(state, round=0))
    else:
        fed.run_round(state, round=0)
    wall = time.perf_counter() - t0
    plan = getattr(fed.aggregator, "_plan_cache", None)
    degree = plan[2].graph.degree if plan is not None and hasattr(plan[2].graph, "degree") else None
    out = {"n": n, "setup": setup, "round": wall, "peak": _peak_rss(), "degree": degree,
           "contributors": len(fed.transcript[-1].contributors)}
    if counts:
        out["crypto"] = _cost(counts, _unit_costs(3)["wall"])
    fed.close()
    return out


def measure(n: int, crypto: str, repeats: int) -> dict:
    """Medians over ``repeats`` rounds, each in a fresh spawned process."""
    runs = []
    for r in range(repeats):
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            runs.append(pool.submit(_one_round, n, crypto, r).result())
    med = {key: statistics.median(run[key] for run in runs) for key in runs[0]
           if isinstance(runs[0][key], (int, float)) and runs[0][key] is not None}
    med["spread"] = (min(run["round"] for run in runs), max(run["round"] for run in runs))
    med["degree"] = runs[0]["degree"]
    return med


def _study(n: int, cohort: int, seed: int = 0, crypto: str = "ideal") -> dict:
    import warnings

    from benchmarks.speed import _peak_rss
    from protocols import GaussianDP, PairwiseMasking
    from securefkm import WeightedFederatedKMeans
    from securefkm.datasets import blob_population

    t0 = time.perf_counter()
    population = blob_population(n, records=RECORDS, n_features=D, n_centres=K, random_state=seed)
    est = WeightedFederatedKMeans(
        n_clusters=K, clients_per_round=cohort, crypto=crypto, record="aggregates",
        protection=[GaussianDP(1.0, 1.0 / population.n_samples ** 1.1, bounds=(-6, 6), mode="distributed"),
                    PairwiseMasking()],
        dropout_rate=DROPOUT, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(population)
    wall = time.perf_counter() - t0
    truth = population.load.centres
    gap = np.sqrt(((est.cluster_centers_[:, None] - truth[None]) ** 2).sum(-1)).min(1).max()
    return {"wall": wall, "peak": _peak_rss(), "rounds": est.n_iter_, "spent": est.privacy_spent_, "gap": float(gap),
            "backend": est.backend_}


def study(n: int, cohort: int, repeats: int, crypto: str = "ideal") -> None:
    print(f"cross_device study: WeightedFederatedKMeans, GaussianDP(1, 1/N^1.1, distributed) + PairwiseMasking "
          f"(crypto={crypto!r}, default backend), "
          f"{n:,} streamed clients of {RECORDS} records, {cohort:,} a round, {DROPOUT:.0%} dropouts")
    print("| seed | wall (s) | driver peak RSS (MB) | rounds | epsilon spent | worst centre error | backend |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for seed in range(repeats):
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            r = pool.submit(_study, n, cohort, seed, crypto).result()
        print(f"| {seed} | {r['wall']:.1f} | {r['peak'] / 2**20:.0f} | {r['rounds']} | {r['spent'][0]:.3f} | "
              f"{r['gap']:.3f} | {r['backend']} |", flush=True)


def fit_line(xs, ys) -> tuple[float, float]:
    """Least squares ``y = a + b x``."""
    b, a = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(a), float(b)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cross_device", description=__doc__.split("\n")[0])
    ap.add_argument("--crypto", choices=("ideal", "real"), default="ideal")
    ap.add_argument("--sizes", default="1000,10000,100000", help="cohort sizes, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--extrapolate", default="1000000,10000000,100000000")
    ap.add_argument("--study", type=int, default=None, help="fit a whole study over this many streamed clients")
    ap.add_argument("--cohort", type=int, default=10_000, help="clients a round of the study samples")
    args = ap.parse_args(argv)
    if args.study:
        study(args.study, args.cohort, args.repeats, args.crypto)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"cross_device: DWF round, GaussianDP(distributed) + PairwiseMasking (crypto={args.crypto!r}), "
          f"{RECORDS} records x {D} features per client, k={K}, {DROPOUT:.0%} dropouts, medians of {args.repeats}")
    print("| clients | degree | setup (s) | round (s) | spread (s) | us / client | peak RSS (MB) |"
          + (" crypto (s) | round / crypto |" if args.crypto == "real" else ""))
    print("|---:|---:|---:|---:|---|---:|---:|" + ("---:|---:|" if args.crypto == "real" else ""))
    rows = []
    for n in sizes:
        m = measure(n, args.crypto, args.repeats)
        rows.append(m)
        line = (f"| {n:,} | {m['degree'] or 'complete'} | {m['setup']:.2f} | {m['round']:.2f} | "
                f"{m['spread'][0]:.2f}-{m['spread'][1]:.2f} | {1e6 * m['round'] / n:.1f} | {m['peak'] / 2**20:.0f} |")
        if args.crypto == "real":
            line += f" {m['crypto']:.2f} | {m['round'] / m['crypto']:.2f} |"
        print(line, flush=True)
    if len(rows) >= 2:
        a, b = fit_line([r["n"] for r in rows], [r["setup"] + r["round"] for r in rows])
        c, e = fit_line([r["n"] for r in rows], [r["peak"] / 2**20 for r in rows])
        print(f"cost model (setup + round): time = {a:.2f} s + {1e6 * b:.2f} us x clients; "
              f"peak = {c:.0f} MB + {1e3 * e:.2f} kB x clients")
        for n in (int(s) for s in args.extrapolate.split(",")):
            print(f"  {n:,} clients: {a + b * n:,.0f} s, {(c + e * n) / 1024:,.1f} GB (one process)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
