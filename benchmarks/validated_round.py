"""A validated round against a pairwise-masked round (``python -m benchmarks.validated_round``).

One DWF training round (k clusters, d features, ``records`` records per client, every client
sampled) is run under ``ValidatedAggregation`` (real Prio3 reports, HPKE, signatures, the
Helper) and under ``PairwiseMasking`` (real key agreements and masks, its default graph),
alternating the two ``--repeats`` times on the same data; each figure is the median wall time
of a whole fit of one round (setup included) and the ratio validated / masked is printed.
Both use the library's default backend, so the clients' work spreads over the machine's
cores alike. Also checks that the validated release equals its ideal functionality's.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np


def _data(n_clients: int, records: int, k: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.15, 0.85, size=(k, d))
    return [np.clip(centres[rng.integers(k, size=records)] + rng.normal(scale=0.05, size=(records, d)), 0, 1)
            for _ in range(n_clients)], centres


def _fit(protection, data, start, crypto="real"):
    from securefkm import WeightedFederatedKMeans

    est = WeightedFederatedKMeans(len(start), init=start, init_bounds=(0.0, 1.0), max_rounds=1, random_state=0,
                                  crypto=crypto, protection=protection)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        est.fit(data)
        return time.perf_counter() - t0, est


def measure(n_clients=1000, records=10, k=5, d=4, repeats=5, out=print) -> dict:
    from protocols import PairwiseMasking
    from protocols.validated import ValidatedAggregation

    data, centres = _data(n_clients, records, k, d)
    start = np.clip(centres + 0.05, 0, 1)
    times = {"validated": [], "masked": []}
    for i in range(repeats):
        order = ("validated", "masked") if i % 2 == 0 else ("masked", "validated")
        for name in order:
            layer = ValidatedAggregation() if name == "validated" else PairwiseMasking()
            t, est = _fit([layer], data, start)
            times[name].append(t)
            if name == "validated" and i == 0:
                _, ideal = _fit([ValidatedAggregation()], data, start, crypto="ideal")
                same = np.array_equal(est.cluster_centers_, ideal.cluster_centers_)
                out(f"validated release equals its ideal functionality's: {same}")
        out(f"  repeat {i + 1}: validated {times['validated'][-1]:.2f} s, masked {times['masked'][-1]:.2f} s")
    med = {name: statistics.median(v) for name, v in times.items()}
    ratio = med["validated"] / med["masked"]
    out(f"{n_clients} clients x {records} records, k={k}, d={d}: median validated {med['validated']:.2f} s, "
        f"masked {med['masked']:.2f} s, ratio {ratio:.2f} (target <= 3)")
    return {"median": med, "ratio": ratio, "times": times}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--records", type=int, default=10)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--d", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    measure(a.clients, a.records, a.k, a.d, a.repeats)


if __name__ == "__main__":
    main()
