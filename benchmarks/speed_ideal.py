"""The ideal functionality against the real protocol and a plain round (part of ``python -m benchmarks speed``).

One in-process DWF training round (100 records per client, k = 5, 2-D, full participation,
transcript on) at 100 and 1,000 clients, under: no protection; PairwiseMasking (real, and
ideal); GaussianDP(distributed) + PairwiseMasking (real, and ideal); Paillier (ideal; its
real round is in ``python -m benchmarks protocols --part paillier``). Rounds of the configurations
alternate (A B C ... A B C ...) and each figure is the median of its repeats, so the machine's
drift falls on every configuration alike. Printed: milliseconds per round and the ratios
ideal / plain (target: at most 3) and real / ideal.

The real complete-graph masking round at 1,000 clients costs about a minute and 1.3 GB;
``real_at_1000`` (default True) measures it once per repeat.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
from securefkm.federation import Federation

BOX = (-6.0, 6.0)


def _stacks():
    from protocols import GaussianDP, Paillier, PairwiseMasking

    def dp():
        return GaussianDP(1.0, 1e-5, bounds=BOX, mode="distributed")

    return {
        "plain": (lambda: [], "real"),
        "masking ideal": (lambda: [PairwiseMasking()], "ideal"),
        "masking real": (lambda: [PairwiseMasking()], "real"),
        "dp+masking ideal": (lambda: [dp(), PairwiseMasking()], "ideal"),
        "dp+masking real": (lambda: [dp(), PairwiseMasking()], "real"),
        "paillier ideal": (lambda: [Paillier()], "ideal"),
    }


def _federation(clients, C, make, crypto, rounds):
    algo = WeightedFederatedKMeansAlgorithm(len(C), init=C, tol=0.0)
    fed = Federation(algo, clients, protection=make(), max_rounds=rounds + 1, random_state=0,
                     record="full", crypto=crypto, backend="local")  # both sides in this process
    state = algo.init(len(clients), C.shape[1], np.random.default_rng(0))
    return fed, state


def measure(n_clients: int, *, repeats: int = 5, real_at_1000: bool = True, seed: int = 0) -> dict[str, float]:
    """Median seconds of one round per configuration, rounds alternated across configurations."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-4, 4, size=(5, 2))
    X = centres[rng.integers(0, 5, 100 * n_clients)] + rng.normal(scale=0.5, size=(100 * n_clients, 2))
    X = np.clip(X, *BOX)
    clients = np.array_split(X, n_clients)
    C = X[rng.choice(len(X), 5, replace=False)].copy()
    stacks = _stacks()
    if n_clients >= 1000 and not real_at_1000:
        stacks = {k: v for k, v in stacks.items() if not k.endswith("real")}
    runs = {name: _federation(clients, C, make, crypto, repeats) for name, (make, crypto) in stacks.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(repeats):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))  # ABBA
        for name in order:
            fed, state = runs[name]
            if n_clients >= 1000 and name.endswith("real") and r >= 1:
                continue  # about a minute each: measured once
            t = time.perf_counter()
            fed.run_round(state, round=r)
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items() if ts}


def run(repeats: int = 5, sizes=(100, 1000), real_at_1000: bool = True, out=print) -> dict:
    out("\nIdeal functionality vs real protocol vs plain: one DWF round (100 records/client, k=5, d=2),")
    out(f"median of {repeats} alternated repeats (the real 1,000-client rounds: one repeat)\n")
    out("| clients | configuration | ms / round | / plain | real / ideal |")
    out("|---:|---|---:|---:|---:|")
    results = {}
    for n in sizes:
        t = measure(n, repeats=repeats, real_at_1000=real_at_1000)
        results[n] = t
        for name, sec in t.items():
            ideal_of = name.replace(" real", " ideal")
            vs = f"{sec / t[ideal_of]:.0f}" if name.endswith("real") and ideal_of in t else ""
            out(f"| {n} | {name} | {1000 * sec:.1f} | {sec / t['plain']:.2f} | {vs} |")
    worst = max(sec / t["plain"] for t in results.values() for name, sec in t.items() if name.endswith("ideal"))
    out(f"\nlargest ideal / plain ratio: {worst:.2f} (target <= 3)")
    return results


if __name__ == "__main__":  # pragma: no cover
    run()
