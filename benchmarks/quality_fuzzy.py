"""Quality benchmark of federated fuzzy c-means against Stallmann & Wilbik (2022).

* :func:`motivational_table` -- Tables 1 and 2 (sec. 3.2.1): fuzzy DB of central FCM,
  FedFuzzDB of the federated run (k-means or federated averaging) and each client's
  local-only fuzzy DB, for K = 2..8 (local: 2..5), plus the knowledge gap at K = 5.
* :func:`g2_detection` -- Table 3 (sec. 3.2.2): the fraction of G2 sets (two Gaussians,
  dimensions D, spreads sigma) on which the minimum (Fed)FuzzyDB over K = 2..6 picks the
  true K = 2, for the central baseline and P = 2, 5, 10 IID clients. Reported over all
  sets and, as in the paper, over the sets whose index at K = 2 is below 1.3.

Run ``python -m benchmarks.quality_fuzzy [--quick]``; prints markdown tables.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from securefkm.algorithms._fcm import fuzzy_cmeans
from securefkm.datasets import g2, stallmann_motivational
from securefkm.estimators.fuzzy import FederatedFuzzyCMeans, local_fuzzy_db_scores
from securefkm.metrics_fuzzy import fuzzy_davies_bouldin, knowledge_gap

MU = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.5, 0.5]])


def _fmt(v):
    return "" if v is None or not np.isfinite(v) else f"{v:.4f}"


def motivational_table(averaging="kmeans", k_max=8, local_k_max=5, random_state=0, data_seed=0):
    """One of Tables 1 / 2: rows K, columns central / federated / local client 1..3.

    Returns (rows, gaps) with rows[K] = dict of the columns and gaps = knowledge gap at K=5
    of the central and federated centres against the five generating means.
    """
    ds = stallmann_motivational(random_state=data_seed)
    X = ds.pooled()
    rows, gaps = {}, {}
    local = [
        local_fuzzy_db_scores(Xi, range(2, local_k_max + 1), random_state=random_state)
        for Xi in ds.clients
    ]
    for k in range(2, k_max + 1):
        C, U, _ = fuzzy_cmeans(X, k, random_state=random_state)
        est = FederatedFuzzyCMeans(k, averaging=averaging, random_state=random_state).fit(ds)
        rows[k] = {
            "central": fuzzy_davies_bouldin(X, C, memberships=U),
            "federated": est.fuzzy_index_,
        }
        for i, curve in enumerate(local):
            rows[k][f"client {i + 1}"] = curve.get(k)
        if k == 5:
            gaps = {
                "central": knowledge_gap(C, MU, X),
                "federated": knowledge_gap(est.cluster_centers_, MU, X),
            }
    return rows, gaps


def motivational_markdown(rows, gaps, title):
    cols = list(next(iter(rows.values())))
    best = {
        c: min((k for k in rows if rows[k].get(c) is not None), key=lambda k: rows[k][c])
        for c in cols
    }
    lines = [f"**{title}**", "", "| K | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for k, r in rows.items():
        cells = [(f"**{_fmt(r[c])}**" if best[c] == k else _fmt(r[c])) for c in cols]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"Knowledge gap at K=5 vs the generating means: central {gaps['central']:.4f}, "
        f"federated {gaps['federated']:.4f}."
    )
    return "\n".join(lines)


def _split_iid(X, P, rng):
    return [X[p] for p in np.array_split(rng.permutation(len(X)), P)]


def g2_detection(
    dims=(2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
    sigmas=(10, 20, 30, 40, 50, 60, 70, 80, 90, 100),
    clients=(2, 5, 10),
    averagings=("kmeans", "fedavg"),
    runs=20,
    k_range=(2, 6),
    threshold=1.3,
    random_state=0,
):
    """Detection rates of K=2 on G2 sets (Table 3). Returns {column: (rate_all, rate_below, n_below, n)}.

    For each (D, sigma, run) a fresh G2 set is drawn and split uniformly at random over P
    clients (sec. 3.2.2); the guess is the K in ``k_range`` with minimum (Fed)FuzzyDB.
    "below" counts only sets whose index at K=2 is below ``threshold`` (the paper's filter).
    """
    rng = np.random.default_rng(random_state)
    ks = range(k_range[0], k_range[1] + 1)
    hits = {}
    for d in dims:
        for s in sigmas:
            for _ in range(runs):
                seed = int(rng.integers(2**31 - 1))
                X, _ = g2(d, s, random_state=seed)
                scores = {
                    k: fuzzy_davies_bouldin(X, fuzzy_cmeans(X, k, random_state=seed)[0]) for k in ks
                }
                hits.setdefault("central", []).append((min(scores, key=scores.get) == 2, scores[2]))
                for P in clients:
                    parts = _split_iid(X, P, np.random.default_rng(seed))
                    for avg in averagings:
                        sc = {
                            k: FederatedFuzzyCMeans(k, averaging=avg, random_state=seed)
                            .fit(parts)
                            .fuzzy_index_
                            for k in ks
                        }
                        hits.setdefault(f"{avg} P={P}", []).append(
                            (min(sc, key=sc.get) == 2, sc[2])
                        )
    out = {}
    for col, h in hits.items():
        ok = np.array([a for a, _ in h])
        below = np.array([b < threshold for _, b in h])
        out[col] = (
            ok.mean(),
            ok[below].mean() if below.any() else float("nan"),
            int(below.sum()),
            len(h),
        )
    return out


def g2_markdown(result, title):
    lines = [
        f"**{title}**",
        "",
        "| setting | correct K=2 (all sets) | correct K=2 (FedFuzzDB(K=2) < 1.3) | sets < 1.3 / all |",
        "|---|---|---|---|",
    ]
    for col, (a, b, nb, n) in result.items():
        lines.append(f"| {col} | {a:.1%} | {b:.1%} | {nb} / {n} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small G2 grid, one run per set")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    for avg, table in (
        ("kmeans", "Table 1 (k-means averaging)"),
        ("fedavg", "Table 2 (federated averaging)"),
    ):
        rows, gaps = motivational_table(avg)
        print(motivational_markdown(rows, gaps, f"Motivational set, {table}"))
        print()
    if args.quick:
        res = g2_detection(dims=(2, 8, 64), sigmas=(10, 50, 90), clients=(2, 5, 10), runs=1)
        title = "G2 detection rates (quick: D in {2, 8, 64}, sigma in {10, 50, 90}, 1 run)"
    else:
        res = g2_detection(dims=(2, 4, 8, 16, 32, 64), sigmas=(10, 30, 50, 70, 90), runs=2)
        title = "G2 detection rates (D in {2..64}, sigma in {10, 30, 50, 70, 90}, 2 runs)"
    print(g2_markdown(res, title))
    print(f"\n(total {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
