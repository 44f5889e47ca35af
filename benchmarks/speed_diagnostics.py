"""Where the time of ``python -m benchmarks speed``'s rounds goes: the measurements that
docs/benchmarks.md quotes to explain its tables (``python -m benchmarks.speed_diagnostics``;
about a minute). Each prints one line; none is a target.

* ``spin``: CPU time the process spends in the 50 ms after a scikit-learn Lloyd kernel call,
  and after a pooled kernel call, while its main thread sleeps (their OpenMP threads spin,
  taking a core from whatever runs next).
* ``timeline``: one pooled kernel call in its thread-pool form at 100k x 16 (k=20, 100
  clients): when the calling thread and the pool thread start their first block, and the
  median block time.
* ``framework``: a DWF round with the kernel replaced by its stored result -- the federation's
  own work (requests, sessions, checks, plain sum, transcript) -- at 100 and 10,000 clients.
* ``kernel_threads``: the pooled kernel call (100k x 16, k=20, 100 clients) in both its
  forms (one compiled parallel loop, :func:`~securefkm.algorithms._cellsums.pooled_cell_sums`,
  the default; blocks on a thread pool) and scikit-learn's Lloyd kernel, on one thread and
  on two, each in a tight loop: the kernels alone.
* ``pooled_form``: the pooled kernel call as one compiled parallel loop (the default) and in
  its thread-pool form, alternated, at 100k x 16 (k=20, 100 clients) and 1M x 32 (k=50,
  10,000 clients).
* ``skewed_clients``: the pooled kernel call on 100 clients of very different sizes (a
  Pareto draw, the largest first; 100k x 16, k=20) in both forms, on one thread and on two:
  how much the second thread gains when clients are not of one size.
* ``local_runs`` (the thread-pool form): the pooled kernel call with the compiled loop adding a client's runs of
  records into a local copy of its rows (the default, :data:`~securefkm.algorithms._cellsums.LOCAL_RUNS`)
  and adding every record in place, alternated, at 100k x 16 (k=20, 100 clients) and
  1M x 32 (k=50, 10,000 clients).
* ``transcript_memory``: the memory a DWF fit's transcript keeps per round at 10,000
  clients (k=50, d=32; 20 records each) under each ``record`` level and in full on disk
  (``transcript_path``; tracemalloc, after two rounds and after four more), with the median
  round time of each and the bytes the file grows by: what docs/scaling.md, "Memory of a
  fit", quotes.
* ``local_kmeans``: the k-FED seeding round's client work (a local k-means on each of 200
  clients of 100 x 32, k=50) with the numpy reference, the compiled loops
  (:mod:`~securefkm.algorithms._local`) and scikit-learn's ``KMeans(n_init=1)``, alternated.
* ``x25519``: key agreements in two threads against the same number in one: ``cryptography``
  holds the GIL while it computes one.
* ``auto_backend``: the masked DWF round (``PairwiseMasking()``, 100 records of 2 features a
  client) in process and with its clients in worker processes, alternated, and the time a
  pool of workers takes to start: what :data:`~securefkm.federation.workers.AUTO_MIN_CLIENTS`
  (where ``backend="auto"`` starts using workers) rests on.
  ``python -m benchmarks.speed_diagnostics auto_backend`` runs it alone.
* ``masked_stages``: a 1,000-client masked DWF round with the default backend, stage by
  stage: the driver's wall time for each exchange against the busiest worker's time
  answering it, the driver's own work, and what the agreements alone cost the busiest worker.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import threading
import time

import numpy as np

from securefkm.algorithms import _kmeans, dwf
from .speed import _Round, _SklearnKernel, _split, _timed, side_by_side


@contextlib.contextmanager
def _kernel_form(pooled: bool):
    """The pooled kernel in its parallel-loop form (True) or its thread-pool form (False)
    while the block runs; the setting is put back after it."""
    from securefkm.algorithms import _cellsums

    saved, _cellsums.POOLED = _cellsums.POOLED, pooled
    try:
        yield
    finally:
        _cellsums.POOLED = saved


def spin(repeats: int = 5) -> str:
    X = np.random.default_rng(1).normal(size=(100_000, 16))
    pooled, clients, C = _split(X, 20, 100, 0)
    kernels = {"scikit-learn's kernel": _SklearnKernel(pooled, C),
               "the pooled kernel (parallel loop)": functools.partial(_kmeans.per_client_cell_sums, clients, C)}
    cells = []
    for name, kernel in kernels.items():
        for _ in range(5):
            kernel()
        cpu = []
        for _ in range(repeats):
            kernel()
            c = time.process_time()
            time.sleep(0.05)
            cpu.append((time.process_time() - c) * 1e3)
        cells.append(f"after {name} {[round(v, 1) for v in cpu]}")
    return f"spin: CPU ms used in a 50 ms sleep of the main thread (100k x 16): {'; '.join(cells)}"


def timeline(repeats: int = 20) -> str:
    X = np.random.default_rng(1).normal(size=(100_000, 16))
    _, clients, C = _split(X, 20, 100, 0)
    events = []
    original = _kmeans._block_sums

    def traced(*args):
        t = time.perf_counter()
        original(*args)
        events.append((threading.current_thread() is threading.main_thread(), t, time.perf_counter()))

    _kmeans._block_sums = traced
    try:
        with _kernel_form(False):  # the blocks of the thread-pool form
            for _ in range(10):
                _kmeans.per_client_cell_sums(clients, C)
            caller, pool, blocks = [], [], []
            for _ in range(repeats):
                events.clear()
                t = time.perf_counter()
                _kmeans.per_client_cell_sums(clients, C)
                caller.append(min(s for main, s, _ in events if main) - t)
                pool.append(min((s for main, s, _ in events if not main), default=float("nan")) - t)
                blocks += [e - s for _, s, e in events]
    finally:
        _kmeans._block_sums = original
    med = statistics.median
    return (f"timeline (100k x 16, k=20, 100 clients, {len(events)} blocks): first block of the caller at "
            f"{med(caller) * 1e3:.2f} ms, of the pool thread at {med(pool) * 1e3:.2f} ms; median block {med(blocks) * 1e3:.2f} ms")


def framework(n: int, d: int, k: int, n_clients: int, repeats: int) -> str:
    X = np.random.default_rng(1).normal(size=(n, d))
    _, clients, C = _split(X, k, n_clients, 0)
    stored = _kmeans.per_client_cell_sums(clients, C)
    original = dwf.per_client_cell_sums
    dwf.per_client_cell_sums = lambda datas, centres: stored
    try:
        rnd = _Round("DWF", clients, C)
        for _ in range(3):
            rnd()
        times = []
        for _ in range(repeats):
            times.append(_timed(rnd))
    finally:
        dwf.per_client_cell_sums = original
    return f"framework: DWF round without its kernel, {n_clients} clients of {n} x {d} (k={k}): {statistics.median(times) * 1e3:.2f} ms"


def _kernel_variants(n: int, d: int, k: int, n_clients: int, repeats: int, variants: dict) -> dict:
    """Median ms of the pooled kernel call under each variant ({name: {``_cellsums``
    attribute: value}}), alternated as the bench alternates (:func:`~benchmarks.speed.side_by_side`:
    each sample the mean of 5 calls after an untimed one and after idling, as the parallel
    loop's OpenMP threads spin for about 9 ms after a call: ``spin``); the attributes are
    put back afterwards."""
    from securefkm.algorithms import _cellsums

    X = np.random.default_rng(1).normal(size=(n, d))
    _, clients, C = _split(X, k, n_clients, 0)
    saved = {attr: getattr(_cellsums, attr) for settings in variants.values() for attr in settings}

    def variant(settings):
        def call():
            for attr, value in settings.items():
                setattr(_cellsums, attr, value)
            _kmeans.per_client_cell_sums(clients, C)

        return call

    try:
        med = side_by_side({name: variant(settings) for name, settings in variants.items()}, repeats, batch=5)
    finally:
        for attr, value in saved.items():
            setattr(_cellsums, attr, value)
    return {name: v * 1e3 for name, v in med.items()}


def kernel_threads(n: int = 100_000, d: int = 16, k: int = 20, n_clients: int = 100, repeats: int = 100) -> str:
    """The pooled kernel call and scikit-learn's Lloyd kernel, each on one thread and on two,
    back to back in a tight loop (each side ``repeats`` calls after one untimed): the kernels
    alone, without the round around ours or the bench's alternation."""
    from threadpoolctl import threadpool_limits

    X = np.random.default_rng(1).normal(size=(n, d))
    pooled, clients, C = _split(X, k, n_clients, 0)
    med = {}
    for threads in (1, 2):
        sk = _SklearnKernel(pooled, C)
        sk.n_threads = threads
        ours = functools.partial(_kmeans.per_client_cell_sums, clients, C, n_threads=threads)
        for name, f, pooled_form in (("scikit-learn", sk, True), ("ours", ours, True), ("thread pool", ours, False)):
            with _kernel_form(pooled_form), threadpool_limits(threads, user_api="openmp"):
                f()
                med[(name, threads)] = statistics.median(_timed(f) for _ in range(repeats)) * 1e3
            time.sleep(0.05)  # the OpenMP threads stop spinning
    cells = "; ".join(f"{t} thread{'s' if t > 1 else ''}: scikit-learn {med[('scikit-learn', t)]:.2f} ms, "
                      f"ours {med[('ours', t)]:.2f} ms (thread-pool form {med[('thread pool', t)]:.2f} ms)"
                      for t in (1, 2))
    return f"kernel_threads ({n_clients} clients of {n} x {d}, k={k}; medians of {repeats}): {cells}"


def local_runs(n: int, d: int, k: int, n_clients: int, repeats: int) -> str:
    med = _kernel_variants(n, d, k, n_clients, repeats,
                           {"local rows": {"LOCAL_RUNS": True, "POOLED": False},
                            "in place": {"LOCAL_RUNS": False, "POOLED": False}})
    return (f"local_runs ({n_clients} clients of {n} x {d}, k={k}; medians of {repeats}): local rows "
            f"{med['local rows']:.2f} ms, in place {med['in place']:.2f} ms")


def pooled_form(n: int, d: int, k: int, n_clients: int, repeats: int) -> str:
    med = _kernel_variants(n, d, k, n_clients, repeats, {
        "parallel loop (default)": {"POOLED": True}, "thread-pool form": {"POOLED": False}})
    cells = ", ".join(f"{name} {ms:.2f} ms" for name, ms in med.items())
    return f"pooled_form ({n_clients} clients of {n} x {d}, k={k}; medians of {repeats}): {cells}"


def skewed_clients(n: int = 100_000, d: int = 16, k: int = 20, n_clients: int = 100, repeats: int = 60) -> str:
    rng = np.random.default_rng(0)
    sizes = np.sort(rng.pareto(1.2, n_clients) + 0.05)[::-1]
    sizes = np.maximum(1, (sizes * (n / sizes.sum())).astype(int))
    X = rng.normal(size=(int(sizes.sum()), d))
    clients, C = np.split(X, np.cumsum(sizes)[:-1]), X[rng.choice(len(X), k, replace=False)].copy()
    med = {}
    for _ in range(2):  # alternated
        for form, pooled in (("parallel loop", True), ("thread-pool form", False)):
            with _kernel_form(pooled):
                for threads in (1, 2):
                    f = functools.partial(_kmeans.per_client_cell_sums, clients, C, n_threads=threads)
                    f()
                    med.setdefault((form, threads), []).extend(_timed(f) for _ in range(repeats // 2))
    cells = "; ".join(f"{form} {statistics.median(med[(form, 1)]) * 1e3:.2f} ms on 1 thread, "
                      f"{statistics.median(med[(form, 2)]) * 1e3:.2f} ms on 2 "
                      f"(x{statistics.median(med[(form, 1)]) / statistics.median(med[(form, 2)]):.2f})"
                      for form in ("parallel loop", "thread-pool form"))
    return (f"skewed_clients ({n_clients} clients of {len(X)} x {d}, k={k}, {sizes.max()} to {sizes.min()} records, "
            f"largest first; medians of {repeats}): {cells}")


def transcript_memory(n_clients: int = 10_000, k: int = 50, d: int = 32, rounds: int = 4) -> str:
    import gc
    import os
    import tempfile
    import tracemalloc

    from securefkm.federation import Federation

    rng = np.random.default_rng(0)
    clients = [rng.normal(size=(20, d)) for _ in range(n_clients)]
    C = rng.normal(size=(k, d))
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        for level, on_disk in (("full", False), ("aggregates", False), ("none", False), ("full", True)):
            path = os.path.join(tmp, f"{level}.sfkt") if on_disk else None
            tracemalloc.start()
            try:
                algo = dwf.WeightedFederatedKMeansAlgorithm(k, init=C, tol=0.0)
                fed = Federation(algo, clients, max_rounds=10**6, random_state=0, record=level, backend="local",
                                 transcript_path=path)
                state = algo.init(n_clients, d, np.random.default_rng(0))
                times = []
                for r in range(2 + rounds):
                    if r == 2:  # the last round's messages stay alive until the next: count from here
                        gc.collect()
                        before = tracemalloc.get_traced_memory()[0]
                        written = os.path.getsize(path) if on_disk else 0
                    state.centres = C
                    t0 = time.perf_counter()
                    fed.run_round(state, round=r)
                    times.append(time.perf_counter() - t0)
                gc.collect()
                kept = (tracemalloc.get_traced_memory()[0] - before) / rounds
            finally:
                tracemalloc.stop()
            name = "full on disk" if on_disk else level
            extra = f", {(os.path.getsize(path) - written) / rounds / 2**20:.1f} MiB written" if on_disk else ""
            cells.append(f"{name} {kept / 2**20:.2f} MiB ({statistics.median(times[2:]):.2f} s a round{extra})")
            fed.close()
            del fed, algo, state
    return f"transcript_memory (DWF, {n_clients} clients, k={k}, d={d}; kept per round): " + ", ".join(cells)


def local_kmeans(n_clients: int = 200, n: int = 100, d: int = 32, k: int = 50, repeats: int = 5) -> str:
    """One pass of the k-FED seeding round's client work (a local k-means per client) with
    the numpy reference, the compiled loops and scikit-learn's ``KMeans(k, n_init=1)``
    (k-means++, Lloyd, its default tolerance), passes alternated; ms per client."""
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    from securefkm.algorithms import _local

    X = np.random.default_rng(1).normal(size=(n_clients * n, d))
    clients = np.array_split(X, n_clients)

    def ours(threshold):
        def run():
            saved, _local.LOCAL_JIT_MIN_WORK = _local.LOCAL_JIT_MIN_WORK, threshold
            try:
                for i, Xc in enumerate(clients):
                    _kmeans.local_kmeans(Xc, k, np.random.default_rng(i))
            finally:
                _local.LOCAL_JIT_MIN_WORK = saved
        return run

    def sklearn():
        with threadpool_limits(1):  # one small client: as our loops, one thread
            for i, Xc in enumerate(clients):
                KMeans(k, n_init=1, random_state=i).fit(Xc)

    passes = {"numpy": ours(1 << 62), "compiled": ours(0), "scikit-learn": sklearn}
    times: dict = {name: [] for name in passes}
    for f in passes.values():
        f()
    for _ in range(repeats):
        for name, f in passes.items():
            times[name].append(_timed(f) / n_clients)
    cells = ", ".join(f"{name} {statistics.median(v) * 1e3:.3f}" for name, v in times.items())
    return f"local_kmeans ({n_clients} clients of {n} x {d}, k={k}; ms a client, medians of {repeats}): {cells}"


def x25519(n: int = 5000) -> str:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    sk, pk = X25519PrivateKey.generate(), X25519PrivateKey.generate().public_key()

    def work():
        for _ in range(n):
            sk.exchange(pk)

    t = time.perf_counter()
    work(), work()
    one = time.perf_counter() - t
    threads = [threading.Thread(target=work) for _ in range(2)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    two = time.perf_counter() - t
    return f"x25519: 2 x {n} agreements in one thread {one:.3f} s, in two threads {two:.3f} s"


def auto_backend(sizes=(50, 100, 200, 400), repeats: int = 5) -> str:
    from .speed import _masked_setup

    cells = []
    for n in sizes:
        t = time.perf_counter()
        _, workers = _masked_setup(n, backend="processes")
        start = time.perf_counter() - t
        try:
            _, local = _masked_setup(n, backend="local")
            workers(), local()
            times: dict = {"local": [], "workers": []}
            for _ in range(repeats):
                for name, f in (("local", local), ("workers", workers)):
                    times[name].append(_timed(f))
            n_workers = workers.fed.transport.n_workers
        finally:
            workers.fed.close()
        med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
        cells.append(f"{n} clients {med['local']:.0f} ms in process, {med['workers']:.0f} ms in {n_workers} "
                     f"workers (start {start:.2f} s)")
    return f"auto_backend (masked DWF round, medians of {repeats}): " + "; ".join(cells)


def masked_stages(n_clients: int = 1000, rounds: int = 5, backend: str = "auto") -> str:
    """Where a masked DWF round's wall time goes with the default backend (its clients in
    worker processes): per stage, the driver's wall time for the exchange and the busiest
    worker's time answering it (``worker_stats()["busy_s"]``), the driver's own work (the
    round's time outside the exchanges: the server's messages, receipt and result), and
    what the agreements alone cost the busiest worker in the last round (two per client and
    neighbour in another worker, one per client and neighbour in its own: the sessions of a
    pair in one process compute its secrets once, :class:`protocols.masking.keys.PairSecrets`),
    at the unit cost measured here."""
    from .speed import _masked_setup, _unit_costs

    _, masked = _masked_setup(n_clients, backend=backend)
    transport = masked.fed.transport
    walls: dict[str, list[float]] = {}
    exchange = transport.exchange

    def timed_exchange(stage, messages):
        start = time.perf_counter()
        try:
            return exchange(stage, messages)
        finally:
            walls.setdefault(stage, []).append(time.perf_counter() - start)

    try:
        masked()  # starts the workers
        if masked.fed.backend == "local":
            return f"masked_stages: {n_clients} clients run in process (backend={backend!r}); nothing to split"
        transport.exchange = timed_exchange
        before = transport.worker_stats()
        walls.clear()
        totals = [_timed(masked) for _ in range(rounds)]
        after = transport.worker_stats()
    finally:
        masked.fed.close()
    # each worker's seconds per stage and round, over the timed rounds
    spent = [{stage: (a["busy_s"][stage] - b["busy_s"].get(stage, 0.0)) / rounds for stage in walls}
             for a, b in zip(after, before)]
    total = statistics.median(totals)
    med = {stage: statistics.median(w) for stage, w in walls.items()}
    # the last round's graph (the driver's copy of the public plan) over the workers' shards
    graph = masked.fed.aggregator._plan_cache[2].graph
    per_worker = [sum(2 if transport.owner(v) != w else 1 for c in shard for v in graph.neighbours(c))
                  for w, shard in enumerate(transport.shards)]
    busiest = int(np.argmax([sum(w.values()) for w in spent]))
    clients, agreements = len(transport.shards[busiest]), per_worker[busiest]
    agree = _unit_costs(5)["wall"]["agree"]
    cells = ", ".join(f"{stage} {med[stage] * 1e3:.0f}/{max(w[stage] for w in spent) * 1e3:.0f}" for stage in walls)
    return (f"masked_stages ({n_clients} clients, {len(after)} workers, medians of {rounds} rounds): round "
            f"{total:.3f} s; per stage, exchange / busiest worker (ms): {cells}; busiest worker in all "
            f"{max(sum(w.values()) for w in spent):.3f} s; the driver's own work {total - sum(med.values()):.3f} s; "
            f"the busiest worker's {clients} clients' {agreements:,} agreements at "
            f"{agree * 1e6:.1f} us: {agreements * agree:.3f} s")


#: what each name runs: its diagnostics at the sizes docs/benchmarks.md quotes
RUNS = {
    "spin": [spin],
    "timeline": [timeline],
    "framework": [lambda: framework(100_000, 16, 20, 100, 300), lambda: framework(1_000_000, 32, 50, 10_000, 10)],
    "kernel_threads": [kernel_threads],
    "skewed_clients": [skewed_clients],
    "pooled_form": [lambda: pooled_form(100_000, 16, 20, 100, 30), lambda: pooled_form(1_000_000, 32, 50, 10_000, 5)],
    "local_runs": [lambda: local_runs(100_000, 16, 20, 100, 100), lambda: local_runs(1_000_000, 32, 50, 10_000, 15)],
    "transcript_memory": [transcript_memory],
    "local_kmeans": [local_kmeans],
    "x25519": [x25519],
    "auto_backend": [auto_backend],
    "masked_stages": [masked_stages],
}


def run(names=None, out=print) -> None:
    """Print the diagnostics ``names`` (default: all, in the order of :data:`RUNS`)."""
    for name in names or RUNS:
        if name not in RUNS:
            raise SystemExit(f"unknown diagnostic {name!r}; choose from {', '.join(RUNS)}")
        for diagnostic in RUNS[name]:
            out(diagnostic())


if __name__ == "__main__":  # python -m benchmarks.speed_diagnostics [name ...]
    import sys

    run(sys.argv[1:])
