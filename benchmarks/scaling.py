"""``python -m benchmarks scaling``: the worker backends against one process.

Every figure comes from this one run; speedups are ratios of medians of rounds timed side by
side with the backends alternated (A B C, then C B A, ...). Three tables:

1. *Backends*: one real-crypto masked DWF round (default ``PairwiseMasking()``, i.e. the
   SecAgg+ graph of Bell et al. at these sizes; 100 records per client, d = 2, k = 5) with the
   clients in this process (``backend="local"``), on 2 worker processes and on 2 Ray actors;
   speedup = local / backend (target 1.7 on a 2-core machine).
2. *Scale*: a 100,000-client DWF fit under masking with ``crypto="ideal"`` and one
   10,000-client real-crypto masked round, both on 2 worker processes, each in a fresh
   process: wall time, peak RSS of the driver and of every worker.
3. *Growth*: an ideal-crypto masked DWF round against clients, records per client and
   workers.

Each worker holds its shard's records, keys and client state for the whole fit; only
protocol messages cross between driver and workers (docs/scaling.md).
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from securefkm.federation.workers import peak_rss_mib

K, D = 5, 2
BOX = (-6.0, 6.0)


def make_clients(n_clients: int, per_client: int = 100, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-4, 4, size=(K, D))
    X = centres[rng.integers(0, K, n_clients * per_client)] + rng.normal(scale=0.5, size=(n_clients * per_client, D))
    return np.array_split(np.clip(X, *BOX), n_clients)


def _federation(clients, backend: str, n_workers: int | None, crypto: str = "real", max_rounds: int = 50):
    from protocols import PairwiseMasking

    from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
    from securefkm.federation import Federation

    algo = WeightedFederatedKMeansAlgorithm(K, init="uniform", init_bounds=BOX, tol=0.0)
    return Federation(algo, clients, protection=[PairwiseMasking()], max_rounds=max_rounds, random_state=0,
                      record="aggregates", crypto=crypto, backend=backend,
                      n_workers=None if backend == "local" else n_workers)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process on this machine (/proc; 0 where unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _worker_pids(fed) -> list[int]:
    return [] if not hasattr(fed.transport, "worker_pids") else fed.transport.worker_pids()


def backends(n_clients: int, repeats: int = 3, kinds=("local", "processes", "ray"), workers: int = 2, out=print) -> dict:
    """Per backend, medians over rounds alternated between backends: ``wall`` seconds of one
    real-crypto masked round, ``driver`` CPU seconds in this process, ``workers`` the CPU
    seconds of the busiest worker, ``cpu`` all CPU seconds of the round.

    ``driver + workers`` is the round's critical path in CPU time: the wall time it takes when
    every process has a core to itself. On a shared machine the wall time also measures the
    others' load; Linux's autogroup scheduler shares the CPU per session, so under load two
    workers of one session do not get more CPU than one process would.
    """
    clients = make_clients(n_clients)
    feds = {}
    for kind in kinds:
        try:
            feds[kind] = _federation(clients, kind, workers)
        except Exception as exc:  # e.g. Ray not installed: say so, measure the others
            out(f"  ({kind}: not measured: {exc})")
    times: dict[str, dict[str, list[float]]] = {k: {"wall": [], "driver": [], "workers": [], "cpu": []} for k in feds}
    try:
        states = {k: f.algorithm.init(f.n_clients, D, np.random.default_rng(0)) for k, f in feds.items()}
        for k, f in feds.items():  # warm-up: worker start, imports, first key generation
            states[k] = f.run_round(states[k], round=0)
        pids = {k: _worker_pids(f) for k, f in feds.items()}
        for r in range(1, repeats + 1):
            order = list(feds) if r % 2 else list(reversed(feds))
            for k in order:
                w0 = [_cpu_seconds(p) for p in pids[k]]
                c0, t = time.process_time(), time.perf_counter()
                states[k] = feds[k].run_round(states[k], round=r)
                wall, driver = time.perf_counter() - t, time.process_time() - c0
                dw = [_cpu_seconds(p) - a for p, a in zip(pids[k], w0)]
                for key, v in (("wall", wall), ("driver", driver), ("workers", max(dw, default=0.0)),
                               ("cpu", driver + sum(dw))):
                    times[k][key].append(v)
    finally:
        for f in feds.values():
            f.close()
    return {k: {key: statistics.median(v) for key, v in m.items()} for k, m in times.items()}


def _scale_case(case: str, workers: int) -> dict:
    """Run in a fresh process so the peak RSS is this case's."""
    if case == "fit-100k-ideal":
        clients = make_clients(100_000, per_client=10)
        fed = _federation(clients, "processes", workers, crypto="ideal", max_rounds=10)
        t = time.perf_counter()
        with fed:
            state = fed.run(0)
            stats = fed.transport.worker_stats()
        return {"wall": time.perf_counter() - t, "rounds": int(state.round), "driver_mib": peak_rss_mib(),
                "workers_mib": [round(s["peak_mib"]) for s in stats], "records": 1_000_000}
    if case == "round-10k-real":
        clients = make_clients(10_000)
        fed = _federation(clients, "processes", workers, crypto="real", max_rounds=3)
        with fed:
            state = fed.algorithm.init(fed.n_clients, D, np.random.default_rng(0))
            t = time.perf_counter()
            fed.run_round(state, round=0)
            wall = time.perf_counter() - t
            stats = fed.transport.worker_stats()
        return {"wall": wall, "rounds": 1, "driver_mib": peak_rss_mib(), "workers_mib": [round(s["peak_mib"]) for s in stats],
                "records": 1_000_000}
    raise ValueError(case)


def scale(workers: int = 2, cases=("fit-100k-ideal", "round-10k-real")) -> dict:
    out = {}
    for case in cases:
        with ProcessPoolExecutor(max_workers=1) as ex:
            out[case] = ex.submit(_scale_case, case, workers).result()
    return out


def growth(repeats: int = 3) -> list[tuple]:
    """(clients, records per client, workers, ms per ideal masked round)."""
    rows = []
    for n, per, w in ((1_000, 100, 1), (1_000, 100, 2), (10_000, 100, 2), (10_000, 10, 2), (1_000, 1_000, 2)):
        clients = make_clients(n, per_client=per)
        fed = _federation(clients, "processes", w, crypto="ideal")
        with fed:
            state = fed.algorithm.init(fed.n_clients, D, np.random.default_rng(0))
            state = fed.run_round(state, round=0)
            ts = []
            for r in range(1, repeats + 1):
                t = time.perf_counter()
                state = fed.run_round(state, round=r)
                ts.append(time.perf_counter() - t)
        rows.append((n, per, w, 1000 * statistics.median(ts)))
    return rows


def _cell(t: dict, kind: str) -> str:
    if kind not in t:
        return "- | - | -"
    b, loc = t[kind], t["local"]
    return f"{b['wall']:.2f} | {loc['wall'] / b['wall']:.2f} | {loc['cpu'] / (b['driver'] + b['workers']):.2f}"


def run(sizes=(1_000, 10_000), repeats: int = 3, with_scale: bool = True, with_growth: bool = True, out=print) -> dict:
    out(f"\nBackends: one real-crypto masked DWF round (100 records/client, d={D}, k={K}), median of {repeats} "
        f"alternated rounds after a warm-up (1 at 10,000 clients); {os.cpu_count()} CPUs; load "
        f"{os.getloadavg()[0]:.2f}. Wall speedup = local wall / backend wall; CPU-bound speedup = local CPU / "
        f"(driver CPU + busiest worker's CPU), the speedup with a free core per process\n")
    out("| clients | local (s) | local CPU (s) | processes x2 (s) | wall speedup | CPU-bound speedup "
        "| ray x2 (s) | wall speedup | CPU-bound speedup |")
    out("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    result = {"backends": {}}
    for n in sizes:
        t = backends(n, repeats=repeats if n <= 1_000 else 1, out=out)
        result["backends"][n] = t
        out(f"| {n:,} | {t['local']['wall']:.2f} | {t['local']['cpu']:.2f} | {_cell(t, 'processes')} | {_cell(t, 'ray')} |")
        for k, m in t.items():
            out(f"    {k}: driver CPU {m['driver']:.2f} s, busiest worker CPU {m['workers']:.2f} s, all CPU {m['cpu']:.2f} s")
    if with_scale:
        out("\nScale, 2 worker processes, each case in a fresh process:\n")
        out("| case | records | wall (s) | rounds | driver peak (MiB) | worker peaks (MiB) |")
        out("|---|---:|---:|---:|---:|---|")
        result["scale"] = scale()
        for case, r in result["scale"].items():
            out(f"| {case} | {r['records']:,} | {r['wall']:.1f} | {r['rounds']} | {r['driver_mib']:.0f} | "
                f"{', '.join(map(str, r['workers_mib']))} |")
    if with_growth:
        out("\nGrowth: one ideal-crypto masked DWF round on worker processes (median of 3):\n")
        out("| clients | records/client | workers | ms / round |")
        out("|---:|---:|---:|---:|")
        result["growth"] = growth()
        for n, per, w, ms in result["growth"]:
            out(f"| {n:,} | {per:,} | {w} | {ms:.0f} |")
    out(f"\nload after: {os.getloadavg()[0]:.2f}")
    return result


if __name__ == "__main__":  # pragma: no cover
    run()
