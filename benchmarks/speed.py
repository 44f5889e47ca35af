"""``python -m benchmarks speed``: the cost of in-process rounds against scikit-learn, and of the
real-crypto masked round against the plain round and against its own cryptography.

Every figure is a ratio of two timings taken side by side in this one run (A and B
alternated, medians), with the same thread count: absolute times on a shared machine are
noise, ratios are not. Three tables:

1. *Rounds vs scikit-learn's Lloyd kernel* (``lloyd_iter_chunked_dense``, the fairest "one
   iteration"; ``KMeans(max_iter=1).fit`` beside it for the DWF round): one training round
   (sampling, every client's update -- vectorised across clients by
   :func:`securefkm.algorithms._kmeans.per_client_cell_sums` --, plain aggregation, the full
   transcript) of DWF, mini-batch and federated fuzzy c-means (fedavg) on the pooled data
   split over 100 or 10,000 clients. Targets: DWF <= 1.5 at 100k x 16 (k=20) and
   1M x 32 (k=50) with 100 clients, <= 2.5 at 1M x 32 with 10,000 clients; the round's peak
   memory (tracemalloc, on top of the clients' data) at most the pooled data's size, i.e.
   data + round <= 2x the data.
2. *Masked round (real crypto) vs plain round*: one DWF round with the default
   ``PairwiseMasking()`` (``graph="auto"``: the SecAgg+ graph of Bell et al. for 1,000
   clients) / the same round unprotected, as a user gets them: the default
   ``backend="auto"`` runs the masked round's clients in one worker process per CPU (their
   key agreements hold the GIL, so in one process they run one at a time) and keeps the
   plain round in process. Target <= 300. The rows below it run both rounds in process
   (``backend="local"``).
3. *Masked round vs its cryptography*: the round's wall time / (its X25519 key
   generations, key agreements and key derivations (SP 800-56C over SHA-256), counted in
   a separate identical round, times their unit costs measured in this run). Target <= 1.5 ("nothing but the
   cryptography costs"), in process. There the sessions of a pair of clients take the
   pair's X25519 secret from one another (:class:`protocols.masking.keys.PairSecrets`: the
   same bytes, each pair's agreement once); a second pair of rows runs the same round with
   every client computing its own agreements, as each client of a deployment does. A
   10,000-client masked round runs in a fresh process that reports its peak RSS (target:
   within 4 GB), over the driver and its workers for the default backend.
"""

from __future__ import annotations

import statistics
import time
import tracemalloc
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

import numpy as np
from sklearn.cluster import KMeans

from securefkm._kernel_threads import kernel_threads
from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
from securefkm.algorithms.fuzzy import FederatedFuzzyCMeansAlgorithm
from securefkm.algorithms.minibatch import MiniBatchFederatedKMeansAlgorithm
from securefkm.federation import Federation

ALGORITHMS = {
    "DWF": lambda k, C: WeightedFederatedKMeansAlgorithm(k, init=C, tol=0.0),
    "mini-batch": lambda k, C: MiniBatchFederatedKMeansAlgorithm(k, init=C, tol=0.0),
    "fuzzy fedavg": lambda k, C: FederatedFuzzyCMeansAlgorithm(k, init=C, averaging="fedavg", validity_round=False),
}


class _SklearnKernel:
    def __init__(self, X, C):
        from sklearn.cluster._k_means_lloyd import lloyd_iter_chunked_dense  # private, timing only
        from sklearn.utils._openmp_helpers import _openmp_effective_n_threads

        self.fn, self.X, self.C = lloyd_iter_chunked_dense, X, C
        self.w = np.ones(len(X))
        self.new, self.wic = np.zeros_like(C), np.zeros(len(C))
        self.labels, self.shift = np.full(len(X), -1, dtype=np.int32), np.zeros(len(C))
        self.n_threads = _openmp_effective_n_threads()

    def __call__(self):
        self.fn(self.X, self.w, self.C, self.new, self.wic, self.labels, self.shift, self.n_threads, update_centers=True)


class _Round:
    """One training round of ``algorithm`` on ``clients`` from fixed centres, repeatable."""

    def __init__(self, name, clients, C, protection=None, backend="local"):
        self.algo = ALGORITHMS[name](len(C), C)
        self.C = C
        self.fed = Federation(self.algo, clients, max_rounds=10**6, random_state=0, record="full",
                              protection=protection or [], backend=backend)
        self.state = self.algo.init(len(clients), C.shape[1], np.random.default_rng(0))
        self.r = 0

    def __call__(self):
        self.state.centres = self.C  # the same work every round
        # the round is recorded in full; the records of earlier calls are dropped, so that a
        # call pays for one round and not for the growing history of all calls so far (at
        # 10,000 clients a round's messages are 128 MB: 4 GB after the bench's 30 calls)
        self.fed.transcript.rounds.clear()
        self.fed.run_round(self.state, round=self.r)
        self.r += 1


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


#: idle time before each batch of :func:`side_by_side` (the other side's spinning threads stop)
SETTLE_S = 0.03


def side_by_side(fns: dict, repeats: int, batch: int = 1) -> dict:
    """Median time of each callable, calls alternated (one warm-up each).

    With ``batch`` > 1 a sample is the mean of ``batch`` back-to-back calls after one
    untimed call: each side is timed in its steady state, as in a fit (rounds, or Lloyd
    iterations, one after the other), and not charged for what the other side left running
    -- scikit-learn's OpenMP threads spin for a while after its kernel returns, and
    whatever runs next on a 2-core machine lost a core to them (measured at 100k x 16: a
    round run right after the kernel took 13.2 ms, the same round run after another round
    7.7 ms; with ``OMP_WAIT_POLICY=passive`` 7.7 and 5.7 ms, the kernel's time unchanged).
    They spin for about 9 ms (the process used 7-11 ms of CPU in a 10 ms sleep of its main
    thread right after a kernel call at 100k x 16: ``speed_diagnostics.spin``), longer than
    one untimed round there, so each batch first waits :data:`SETTLE_S` for the previous
    side's threads to go idle."""
    for f in fns.values():
        f()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            if batch == 1:
                times[k].append(_timed(f))
                continue
            time.sleep(SETTLE_S)
            f()
            t = time.perf_counter()
            for _ in range(batch):
                f()
            times[k].append((time.perf_counter() - t) / batch)
    return {k: statistics.median(v) for k, v in times.items()}


def traced_peak(fn) -> int:
    """Peak bytes allocated (tracemalloc) while ``fn`` runs, above what existed before; the
    pooled kernel's threads are stopped first, so their scratch buffers are counted."""
    from securefkm.kernels import shutdown_pools

    shutdown_pools()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    fn()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak


def _split(X, k, n_clients, seed=0):
    """(pooled, clients, centres): the records shuffled once into ``pooled``, the clients
    consecutive slices of it (as a simulation holds a data set: one array, no copy per
    client), and ``k`` centres drawn from the records."""
    rng = np.random.default_rng(seed)
    X = np.ascontiguousarray(X, dtype=np.float64)
    pooled = X[rng.permutation(len(X))]
    clients = np.array_split(pooled, n_clients)
    C = X[rng.choice(len(X), k, replace=False)].copy()
    return pooled, clients, C


def measure(X, k, n_clients=100, repeats=10, seed=0, algorithms=("DWF",), with_fit=False, batch=None):
    """Median round time per algorithm and of the scikit-learn kernel (and fit), alternated
    in batches (:func:`side_by_side`; default: 5 calls per sample up to 100k records, else 2)."""
    pooled, clients, C = _split(X, k, n_clients, seed)
    fns = {"kernel": _SklearnKernel(pooled, C)}
    for a in algorithms:
        fns[a] = _Round(a, clients, C)
    if with_fit:
        fns["fit"] = lambda: KMeans(k, init=C, n_init=1, max_iter=1, algorithm="lloyd").fit(pooled)
    out = side_by_side(fns, repeats, batch or (5 if len(X) <= 100_000 else 2))
    out["peak"] = {a: traced_peak(_Round(a, clients, C)) for a in algorithms}
    out["data_bytes"] = pooled.nbytes
    return out


# ------------------------------------------------------------------ masked rounds
def _unit_costs(repeats: int = 7, calls: int = 1000) -> dict:
    """Median wall and CPU seconds of one X25519 key generation, agreement and key derivation
    (:func:`~protocols.masking.keys.kdf` of a 32-byte key with info as long as a mask seed's),
    each timed over ``repeats`` bursts of ``calls`` calls. (Bursts of 1,000 agreements have
    the median of bursts of 300 and a third of their spread: 31.01 against 31.00 us, standard
    deviation 0.69 against 1.79 us over 12 alternated bursts.)"""
    from protocols.masking import keys

    sk = keys.load_x25519(keys.x25519_keypair()[0])
    pk = keys.x25519_keypair()[1]
    ops = {
        "keygen": keys.x25519_keypair,
        "agree": lambda: keys.x25519_agree(sk, pk),
        "kdf": lambda: keys.kdf(b"s" * 32, b"i" * 96),
    }
    n = int(calls)
    out = {"wall": {}, "cpu": {}}
    for name, f in ops.items():
        wall, cpu = [], []
        for _ in range(repeats):
            t, c = time.perf_counter(), time.process_time()
            for _ in range(n):
                f()
            wall.append((time.perf_counter() - t) / n)
            cpu.append((time.process_time() - c) / n)
        out["wall"][name], out["cpu"][name] = statistics.median(wall), statistics.median(cpu)
    return out


def _cost(counts, units) -> float:
    return sum(counts[k] * units[k] for k in counts)


def _count_crypto(fn) -> dict:
    """How many key generations, agreements and key derivations ``fn`` performs."""
    from protocols.masking import keys

    counts = {"keygen": 0, "agree": 0, "kdf": 0}
    originals = {"keygen": keys.x25519_keypair, "agree": keys.x25519_agree, "kdf": keys.kdf}
    attrs = {"keygen": "x25519_keypair", "agree": "x25519_agree", "kdf": "kdf"}

    def counting(name):
        orig = originals[name]

        def wrapper(*a, **kw):
            counts[name] += 1
            return orig(*a, **kw)

        return wrapper

    try:
        for name, attr in attrs.items():
            setattr(keys, attr, counting(name))
        fn()
    finally:
        for name, attr in attrs.items():
            setattr(keys, attr, originals[name])
    return counts


def _masked_setup(n_clients, seed=0, backend="local"):
    from protocols.masking import PairwiseMasking

    X = np.random.default_rng(seed).normal(size=(100 * n_clients, 2))
    _, clients, C = _split(X, 5, n_clients, seed)
    plain = _Round("DWF", clients, C, backend=backend)
    masked = _Round("DWF", clients, C, protection=[PairwiseMasking()], backend=backend)
    return plain, masked


def masked_round_default(n_clients=1000, repeats=3) -> dict:
    """The masked round and the plain round as a user gets them (``backend="auto"``, the
    default), alternated (wall time).

    The masked round's cost is its clients' key agreements, and ``cryptography`` holds the
    GIL while it computes one, so in one process that round uses one core whatever the
    threads; the default backend then runs the clients in one worker process per CPU (each
    holds its shard of clients for the fit), while the plain round stays in this process,
    where its kernel uses every CPU. The protocol and its transcript are the same."""
    plain, masked = _masked_setup(n_clients, backend="auto")
    try:
        plain(), masked()
        wall = {"plain": [], "masked": []}
        for _ in range(repeats):
            for name, f in (("plain", plain), ("masked", masked)):
                wall[name].append(_timed(f))
        transport = masked.fed.transport
        where = {"backend_plain": plain.fed.backend, "backend_masked": masked.fed.backend,
                 "workers": getattr(transport, "n_workers", 0)}
    finally:
        masked.fed.close()
    return {"n": n_clients, **where, "plain": statistics.median(wall["plain"]),
            "masked": statistics.median(wall["masked"])}


@contextmanager
def _each_client_alone(alone: bool = True):
    """With ``alone``: sessions that compute every key agreement themselves, as each client
    of a deployment does, instead of taking the secrets of pairs held in one process from
    one another (:class:`~protocols.masking.keys.PairSecrets`, same bytes)."""
    if not alone:
        yield
        return
    from protocols.masking.client import MaskingClient

    saved = MaskingClient.__dict__["share_pair_secrets"]
    MaskingClient.share_pair_secrets = staticmethod(lambda sessions: None)
    try:
        yield
    finally:
        MaskingClient.share_pair_secrets = saved


def masked_round(n_clients=1000, repeats=3, alone=False) -> dict:
    """Masked / plain DWF round and masked round / its cryptography, side by side; with
    ``alone`` every simulated client computes its own agreements (:func:`_each_client_alone`).

    Wall and CPU time (``process_time``) both: on a shared machine the CPU-time ratio is the
    robust one (the round is single-threaded, so on an idle machine the two agree)."""
    with _each_client_alone(alone):
        plain, masked = _masked_setup(n_clients)
        counts = _count_crypto(masked)  # also the warm-up
        plain()
        wall = {"plain": [], "masked": []}
        cpu = {"plain": [], "masked": []}
        units = [_unit_costs()]
        for _ in range(repeats):
            for name, f in (("plain", plain), ("masked", masked)):
                t, c = time.perf_counter(), time.process_time()
                f()
                wall[name].append(time.perf_counter() - t)
                cpu[name].append(time.process_time() - c)
            units.append(_unit_costs(3))  # interleaved: the machine's load drifts
        unit = {kind: {k: statistics.median(u[kind][k] for u in units) for k in counts} for kind in ("wall", "cpu")}
        med = statistics.median
        return {"n": n_clients, "plain": med(wall["plain"]), "masked": med(wall["masked"]),
                "plain_cpu": med(cpu["plain"]), "masked_cpu": med(cpu["masked"]), "counts": counts,
                "crypto_s": _cost(counts, unit["wall"]), "crypto_cpu": _cost(counts, unit["cpu"])}


def _peak_rss() -> int:
    """This process's peak resident set (bytes): ``VmHWM`` of its own address space.
    (``getrusage``'s ``ru_maxrss`` survives ``exec`` on Linux, so a spawned child would
    report its parent's peak.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _big_masked_round(n_clients: int, alone: bool = False, repeats: int = 3) -> dict:
    # as masked_round (a counted warm-up round, then rounds alternated with the plain round
    # and with the unit costs' measurements: the machine's load drifts), in this process
    # alone, so that its peak resident set is the round's
    return {**masked_round(n_clients, repeats, alone), "peak_rss": _peak_rss()}


def _big_masked_round_default(n_clients: int) -> dict:
    plain, masked = _masked_setup(n_clients, backend="auto")
    try:
        masked()  # starts the workers and hands them their clients, once a fit: the warm-up
        wall = _timed(masked)
        plain()  # warm-up, as the in-process table's plain round has one
        p_wall = _timed(plain)
        workers = masked.fed.transport.worker_stats() if masked.fed.backend != "local" else []
        peak = _peak_rss() + sum(w["peak_mib"] for w in workers) * 2**20
        return {"n": n_clients, "masked": wall, "plain": p_wall, "backend_masked": masked.fed.backend,
                "workers": len(workers), "peak_rss": peak}
    finally:
        masked.fed.close()


def big_masked_round(n_clients=10_000, backend="local", alone=False, repeats=3) -> dict:
    """Masked rounds in a fresh process (its peak RSS is the rounds' alone): in process
    (``backend="local"``) as :func:`masked_round`, ``alone``: every client computes its own
    agreements; with ``backend="auto"`` (the default a user gets) one round after a warm-up
    one (which starts the workers), and the peak is the driver's plus its workers'."""
    import multiprocessing

    args = (n_clients, alone, repeats) if backend == "local" else (n_clients,)
    fn = _big_masked_round if backend == "local" else _big_masked_round_default
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def _degree(n):
    from protocols.masking.graph import resolve_graph

    return resolve_graph(n, "auto", None)[1]


def _uptime() -> str:
    with open("/proc/loadavg") as f:
        return "load average " + ", ".join(f.read().split()[:3])


def _kernel_form() -> str:
    """How this process runs the pooled k-means kernel's large calls (``_cellsums.use_pooled``)."""
    from securefkm.algorithms import _cellsums

    if _cellsums.use_pooled(_cellsums.JIT_MIN_WORK):
        return "numba's threads over the clients' pieces, numpy's OpenBLAS on one thread in each"
    return "the calling thread and a pool thread per other CPU, sharing blocks of records"


def run(repeats: int = 10, out=print, big_masked: bool = True, parts=("rounds", "masked")):
    """Print the tables of ``parts`` ("rounds": table 1; "masked": tables 2 and 3)."""
    out(f"benchmarks.speed: medians of {repeats} alternated repeats (table 1: each a batch of back-to-back "
        f"calls after an untimed one), {kernel_threads()} CPUs, same threads "
        f"for both sides (scikit-learn's OpenMP threads; ours: {_kernel_form()}); {_uptime()}\n")
    rows = _rounds_table(repeats, out) if "rounds" in parts else []
    if "masked" in parts:
        rows += _masked_tables(out, big_masked)
    out(f"\n(end: {_uptime()})")
    return rows


def _rounds_table(repeats, out):
    from securefkm.datasets import load_dataset

    rng = np.random.default_rng(1)
    blobs = load_dataset("dwf-blobs", split="iid", n_clients=100, random_state=0).pooled()
    rows = []
    out("[1] one round / one scikit-learn Lloyd iteration (lloyd_iter_chunked_dense) on the pooled data")
    out("| data | n x d, k | clients | round | round (ms) | sklearn kernel (ms) | ratio | target | round peak / data |")
    out("|---|---|---:|---|---:|---:|---:|---:|---:|")
    configs = [
        ("DWF 5-blob set", lambda: blobs, 5, 100, ("DWF", "mini-batch", "fuzzy fedavg"), None),
        ("Gaussian", lambda: rng.normal(size=(100_000, 16)), 20, 100, ("DWF", "mini-batch", "fuzzy fedavg"), 1.5),
        ("Gaussian", lambda: rng.normal(size=(1_000_000, 32)), 50, 100, ("DWF", "mini-batch"), 1.5),
        ("Gaussian", None, 50, 10_000, ("DWF", "mini-batch"), 2.5),
    ]
    X = None
    for name, make, k, n_clients, algos, target in configs:
        X = make() if make is not None else X  # the last row reuses the 1M x 32 data
        m = measure(X, k, n_clients, repeats=max(3, repeats if len(X) <= 100_000 else repeats // 2), algorithms=algos)
        for a in algos:
            ratio = m[a] / m["kernel"]
            tgt = f"<= {target}" if (target is not None and a == "DWF") else ""
            rows.append({"table": "rounds", "data": name, "n": len(X), "d": X.shape[1], "k": k, "clients": n_clients,
                         "algorithm": a, "ratio": ratio, "peak_ratio": m["peak"][a] / m["data_bytes"]})
            out(f"| {name} | {X.shape[0]} x {X.shape[1]}, {k} | {n_clients} | {a} | {m[a] * 1e3:.1f} | "
                f"{m['kernel'] * 1e3:.1f} | {ratio:.2f} | {tgt} | {m['peak'][a] / m['data_bytes']:.2f} |")
    del X
    return rows


def _masked_tables(out, big_masked):
    rows = []
    out("\n[2] + [3] DWF round with PairwiseMasking() (real X25519 and SP 800-56C KDF, SHAKE-256 masks, AES-256-CCM shares, graph='auto'; clients simulated in one process take the X25519 secrets of pairs they both hold from each other), 100 records "
        "x 2 features per client, no dropouts")
    out("| clients | graph degree | time | plain (ms) | masked (s) | masked / plain | target | keygen+agree+KDF | "
        "their cost (s) | masked / crypto | target | peak RSS (MB) |")
    out("|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    sizes = [1000] + ([10_000] if big_masked else [])
    for n in sizes:
        r = masked_round(n, repeats=3) if n <= 1000 else big_masked_round(n)
        rows.append({"table": "masked", **r})
        rss = f"{r['peak_rss'] / 2**20:.0f}" if "peak_rss" in r else ""
        # as a user gets it: the default backend (the peak: this process's and its workers')
        w = masked_round_default(n, repeats=3) if n <= 1000 else big_masked_round(n, backend="auto")
        rows.append({"table": "masked_default", **w})
        where = f"{w['workers']} worker processes" if w["backend_masked"] == "processes" else "this process"
        w_rss = f"{w['peak_rss'] / 2**20:.0f} (all processes)" if "peak_rss" in w else ""
        out(f"| {n} | {_degree(n)} | wall, backend='auto' (masked: clients in {where}) | {w['plain'] * 1e3:.1f} | "
            f"{w['masked']:.2f} | {w['masked'] / w['plain']:.0f} | {'<= 300' if n == 1000 else ''} | (as below) | | | "
            f"| {w_rss} |")
        # the same in process with every client computing its own agreements, as deployed
        a = masked_round(n, repeats=3, alone=True) if n <= 1000 else big_masked_round(n, alone=True)
        rows.append({"table": "masked_alone", **a})
        for run, how in ((r, "backend='local'"), (a, "backend='local', every client its own agreements")):
            c = run["counts"]
            for kind, sfx in (("wall", ""), ("CPU", "_cpu")):
                plain, masked, crypto = run["plain" + sfx], run["masked" + sfx], run["crypto_" + ("cpu" if sfx else "s")]
                out(f"| {n} | {_degree(n)} | {kind}, {how} | {plain * 1e3:.1f} | {masked:.2f} | "
                    f"{masked / plain:.0f} | | {c['keygen']}+{c['agree']}+{c['kdf']} | {crypto:.2f} | "
                    f"{masked / crypto:.2f} | <= 1.5 | {rss if run is r else ''} |")
    return rows
