"""Simulated clients on a fixed pool of workers: processes on this machine, or Ray actors.

:class:`WorkerTransport` is a :class:`~securefkm.federation.Transport` beside
:class:`~securefkm.federation.LocalTransport` and the Flower transport. The clients are
sharded over ``n_workers`` long-lived workers (contiguous blocks of client ids); each worker
holds its clients' records, keys and :class:`~securefkm.federation.ClientRuntime` state for
the whole fit and answers stage messages with the same loop as the in-process transport
(:func:`~securefkm.federation.client.serve`, so ``update`` requests sharing a broadcast are
still vectorised inside each worker). Only protocol messages cross between the driver and
the workers; the server runs in the driver.

Results do not depend on the backend: dropouts are drawn in the driver exactly as
:class:`LocalTransport` draws them, replies are returned in message order, and a client-side
exception (e.g. an abort raised while a client builds its masking plan) is re-raised in the
driver. Measured on 2 cores (notes/ray.md): one worker per simulated client does not scale
(200 one-client Ray actors took 150 s for 5 trivial rounds), a fixed pool does.

Failures: a worker that dies (or does not answer within ``timeout`` seconds, then it is
killed) loses its clients for the rest of the fit; they are dropouts, which the protocol
recovers from or aborts on, and an abort names the lost clients. Workers are shut down by
:meth:`WorkerTransport.close` (``Federation.close``; estimators call it on every exit path,
Ctrl-C included) and, as a last resort, when the transport is garbage collected or the
interpreter exits. After a fit that ended normally, the worker processes (not Ray's actors)
drop their clients and are kept idle for the next fit's pool, for :data:`KEEP_IDLE_S`
seconds: starting one costs as much as a 100-client masked round.

Backends:

* ``"processes"``: one loky ``ProcessPoolExecutor`` (the one joblib ships; a
  :mod:`concurrent.futures` executor) with a single process per shard, so a shard's state
  stays in one process.
* ``"ray"``: one actor per shard, spread over the cluster's nodes. Joins the running Ray
  instance if ``ray.init`` was already called, the cluster at ``RAY_ADDRESS`` if that is set,
  and otherwise starts a local instance (shut down again by ``close``). Optional extra:
  ``pip install -e ".[ray]"``.
"""

from __future__ import annotations

import atexit
import bisect
import gc
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
import weakref
from concurrent.futures import Future, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from joblib.externals.loky import ProcessPoolExecutor

from .._kernel_threads import affinity_cpus, kernel_threads, set_kernel_threads
from ..datasets.population import ClientPopulation
from ..exceptions import InputError
from ..layers import ClientContext
from .client import ClientRuntime, serve
from .transport import SimulatedTransport, StreamedRuntimes
from .update_stage import UPDATE_STAGE

log = logging.getLogger("securefkm")

BACKENDS = ("auto", "local", "processes", "ray")
#: ``backend="auto"`` puts the clients in worker processes from this many clients per round
#: on, when their aggregator does public-key cryptography each round (``Aggregator.
#: client_public_key_work``). Measured on 2 cores (docs/scaling.md, "The default backend"):
#: a masked round of 50 clients takes ~0.2 s either way, against the 1.2-1.5 s a pool takes
#: to start. Since a process computes each of its pairs' X25519 secrets once (PairSecrets),
#: 2 workers cost up to 90 ms a masked round more than one process at 100 clients, match it
#: at ~300 and pay from ~500 (docs/scaling.md); the threshold serves Paillier too (whose
#: clients share nothing), and with W workers each does (2 - 1/W) / W of the in-process
#: agreements, so more CPUs pay from fewer clients.
AUTO_MIN_CLIENTS = 100
#: seconds one exchange may take before its silent workers are declared dead and killed
DEFAULT_TIMEOUT = 1800.0
_RAY_HINT = 'pip install -e ".[ray]"  (or: pip install "ray==2.60.0")'


def check_backend(backend, n_workers) -> tuple[str, int | None]:
    """Validate ``backend`` / ``n_workers`` (None: decided when the pool starts)."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise InputError(
            f"backend must be one of {BACKENDS} (chosen for the fit, in process, a pool of worker processes, "
            f"a pool of Ray actors), got {backend!r}."
        )
    if n_workers is not None:
        if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
            raise InputError(
                f"n_workers must be an int >= 1 (the number of workers the clients are sharded over) or None "
                f"for the CPUs available, got {n_workers!r}."
            )
    if backend == "ray":
        import_ray()
    return backend, n_workers


def auto_backend(aggregator, clients_per_round: int, fit_objects, n_workers=None) -> tuple[str, int | None]:
    """What ``backend="auto"`` runs a simulated fit on, and with how many workers:
    ``("processes", n_workers or the CPUs counted)`` when that pays, ``("local", None)``
    otherwise.

    Worker processes pay when the clients' work each round is public-key cryptography
    (real pairwise masking: X25519 key agreements; real Paillier: encryptions), because
    ``cryptography`` and ``phe`` hold the GIL while they compute, so in one process those
    clients use one core whatever the threads. The clients' k-means steps need no workers:
    their pooled kernel already uses every core in process. So: ``"processes"`` when the
    aggregator does such work (:attr:`~securefkm.layers.Aggregator.client_public_key_work`),
    a round samples at least :data:`AUTO_MIN_CLIENTS` clients, this process may use two
    CPUs or more (its affinity mask, capped by ``OMP_NUM_THREADS``: a worker of a sweep or
    of a joblib pool is given one; the pool then has one worker per such CPU), and the fit's
    algorithm and layers can be rebuilt in a fresh interpreter: loky's workers do not import
    the parent's ``__main__``, so a class defined in a script or a notebook keeps the fit in
    process. The results are the same either way (tests/test_backends.py).
    """
    local = ("local", None)
    cpus = kernel_threads()  # the CPUs this process may use (_kernel_threads.process_cpus)
    if not getattr(aggregator, "client_public_key_work", False) or clients_per_round < AUTO_MIN_CLIENTS or cpus < 2:
        return local
    try:
        blob = pickle.dumps(fit_objects, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # not picklable: only this process can run the clients
        return local
    return local if b"__main__" in blob else ("processes", n_workers or cpus)


def import_ray():
    try:
        import ray
    except ImportError:
        raise InputError(f"backend='ray' needs Ray, which is not installed; install it with {_RAY_HINT}.") from None
    return ray


# ---------------------------------------------------------------- the worker side
def provisioned_state(client: int, n_records: int, layers) -> dict:
    """The client's initial state after the layers' out-of-band provisioning."""
    context = ClientContext(client_id=client, n_records=n_records)
    for layer in layers:
        layer.provision_client(context)
    return context.state


class Shard:
    """A worker's clients: built once from their ids, records and provisioned states and the
    fit's (algorithm, layers, aggregator, info).

    The layers and aggregator are the driver's objects after ``setup`` (copied once into
    the worker, as a Flower client rebuilds them from the run spec); each client's own
    state lives in its :class:`ClientRuntime` here and never leaves the worker.
    """

    def __init__(self, payload: bytes):
        # a worker has one CPU of the machine's (one process per CPU; Ray: num_cpus <= 1):
        # its clients' pooled k-means kernel runs in its own thread, not one per CPU
        set_kernel_threads(1)
        ids, arrays, states, algorithm, layers, aggregator, info, *rest = pickle.loads(payload)
        policies = rest[0] if rest else {}  # {client: ClientPolicy} of this shard's clients
        if isinstance(arrays, ClientPopulation):  # streamed: this round's clients only, provisioned
            # when first made as the driver provisions resident shards
            self.clients = StreamedRuntimes.of_population(
                arrays, ids, algorithm, layers, aggregator, info, policies,
                provision=lambda i, n_records: provisioned_state(i, n_records, layers))
        else:
            self.clients = {
                i: ClientRuntime(i, X, algorithm, layers, aggregator, info, state=st, policy=policies.get(i))
                for i, X, st in zip(ids, arrays, states)
            }
        self.busy: dict[str, float] = {}  # seconds spent answering each stage, summed

    def exchange(self, stage: str, messages: dict[int, Any]):
        """``("ok", (replies, refused, faults))`` or ``("error", exception)`` for the driver to
        re-raise."""
        start = time.perf_counter()
        try:
            faults: dict[int, str] = {}
            if stage == UPDATE_STAGE and isinstance(self.clients, StreamedRuntimes):
                self.clients.end_round()  # every round opens with the update stage
            replies, refused = serve(self.clients, stage, messages, faults)
            return "ok", (replies, refused, faults)
        except Exception as exc:  # re-raised in the driver, as LocalTransport would raise it
            try:
                pickle.loads(pickle.dumps(exc))
            except Exception:
                exc = RuntimeError(f"{type(exc).__name__}: {exc}")
            return "error", exc
        finally:
            self.busy[stage] = self.busy.get(stage, 0.0) + time.perf_counter() - start

    def stats(self) -> dict:
        """This worker's pid, client count, peak resident memory (MiB), node name, and the
        seconds it spent answering each stage so far (``busy_s``, summed over the fit)."""
        peak = peak_rss_mib()
        node = os.uname().nodename
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():  # a Ray actor: its node id
            node = sys.modules["ray"].get_runtime_context().get_node_id()
        return {"pid": os.getpid(), "clients": len(self.clients), "peak_mib": peak, "node": node,
                "busy_s": dict(self.busy)}


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB since it last loaded a shard (Linux: its
    ``VmHWM``, reset by :func:`_reset_peak_rss`; elsewhere the process's lifetime peak, NaN
    where ``resource`` is missing: Windows)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    try:
        import resource
    except ImportError:
        return float("nan")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 1024**2)


def _reset_peak_rss() -> None:
    """Start this process's peak RSS afresh (Linux; a kept worker's next fit reports its own)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


_SHARD: Shard | None = None  # the shard of this worker process


def _ignore_sigint():
    # Ctrl-C goes to the whole process group: the driver shuts the workers down itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _load(payload: bytes) -> int:
    global _SHARD
    _SHARD = None  # a kept worker drops its previous fit's clients first
    _reset_peak_rss()
    _SHARD = Shard(payload)
    return os.getpid()


def _unload() -> None:
    """Drop this worker's clients (their records, keys and state) before it is kept idle."""
    global _SHARD
    _SHARD = None
    gc.collect()


def _call(method: str, *args):
    return getattr(_SHARD, method)(*args)


# ---------------------------------------------------------------- pools
class _Lost:
    """Marker result: the worker died or timed out."""

    def __init__(self, why: str):
        self.why = why


#: seconds a worker process is kept idle after a fit that ended normally, for the next
#: fit's pool: starting one (a fresh interpreter importing numpy, scikit-learn and the
#: library) takes 1.2-1.5 s here, as long as a 100-client masked round
#: (docs/scaling.md, "Worker processes between fits")
KEEP_IDLE_S = 300.0
_IDLE: list = []  # [(executor, its expiry timer)]
_IDLE_LOCK = threading.Lock()


def _new_executor() -> ProcessPoolExecutor:
    # loky: fresh interpreters that do not re-import the user's __main__ (no
    # ``if __name__ == "__main__"`` guard needed, unlike spawn/forkserver) and that
    # report a dead worker as a broken pool instead of hanging
    return ProcessPoolExecutor(max_workers=1, initializer=_ignore_sigint)


def _take_idle() -> ProcessPoolExecutor | None:
    with _IDLE_LOCK:
        if not _IDLE:
            return None
        executor, timer = _IDLE.pop()
    timer.cancel()
    return executor


def _keep_idle(executor: ProcessPoolExecutor) -> None:
    timer = threading.Timer(KEEP_IDLE_S, _expire, (executor,))
    timer.daemon = True
    with _IDLE_LOCK:
        _IDLE.append((executor, timer))
    timer.start()


def _expire(executor: ProcessPoolExecutor) -> None:
    with _IDLE_LOCK:
        kept = [i for i, (e, _) in enumerate(_IDLE) if e is executor]
        if not kept:  # taken by a pool meanwhile
            return
        del _IDLE[kept[0]]
    executor.shutdown(wait=False, kill_workers=True)


def shutdown_idle_workers() -> None:
    """End the worker processes kept idle after earlier fits (they also end by themselves
    :data:`KEEP_IDLE_S` seconds after their last fit, and when the interpreter exits)."""
    with _IDLE_LOCK:
        kept = list(_IDLE)
        _IDLE.clear()
    for executor, timer in kept:
        timer.cancel()
        executor.shutdown(wait=True, kill_workers=True)


def _forget_idle_in_child() -> None:
    global _IDLE_LOCK
    _IDLE.clear()  # a forked child does not own its parent's workers
    _IDLE_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_idle_in_child)
atexit.register(shutdown_idle_workers)


class ProcessPool:
    """One single-process executor per shard: a shard's state stays in its process.

    Executors are taken from the workers kept idle after earlier fits when there are some
    (:data:`KEEP_IDLE_S`) and started otherwise; :meth:`close` with ``keep=True`` (a fit
    that ended normally) keeps its sound, idle workers for the next pool."""

    def __init__(self, payloads: list[bytes], timeout: float):
        self.unsound: set[int] = set()  # workers lost or killed: never kept
        kept = [_take_idle() for _ in payloads]
        self.executors = [ex or _new_executor() for ex in kept]
        self.last: list = [None] * len(payloads)
        loads = {w: self._submit(w, _load, p) for w, p in enumerate(payloads)}
        wait([loads[w] for w, ex in enumerate(kept) if ex is not None], timeout=timeout)
        for w, ex in enumerate(kept):
            # a kept worker that died while idle, or that cannot load this fit (it started
            # before the fit's modules were importable: sys.path is copied at start) is
            # replaced by a fresh one; a fresh worker's failure is the fit's, as before
            if ex is not None and loads[w].done() and loads[w].exception() is not None:
                ex.shutdown(wait=False, kill_workers=True)
                self.executors[w] = _new_executor()
                loads[w] = self._submit(w, _load, payloads[w])
        pids = self._gather(loads, timeout, "start")
        self.pids = [pids[w] for w in range(len(payloads))]

    def _submit(self, w: int, fn, *args) -> Future:
        # once loky has noticed a dead worker, submit itself raises: the same loss as a
        # future that fails, so it is reported the same way (_gather)
        try:
            return self.executors[w].submit(fn, *args)
        except BrokenProcessPool as exc:
            failed: Future = Future()
            failed.set_exception(exc)
            return failed

    def _gather(self, futures: dict[int, Future], timeout, what) -> dict[int, Any]:
        """Each worker's result, or a :class:`_Lost` for a worker that died or did not
        answer within ``timeout`` seconds (then it is killed)."""
        done, _ = wait(list(futures.values()), timeout=timeout)
        out: dict[int, Any] = {}
        for w, fut in futures.items():
            if fut not in done:
                self.kill(w)
                out[w] = _Lost(f"no answer to {what} within {timeout:g} s")
                continue
            try:
                out[w] = fut.result()
            except BrokenProcessPool:
                self.unsound.add(w)
                out[w] = _Lost("its process died")
        return out

    def call(self, calls: dict[int, tuple[str, tuple]], timeout: float) -> dict[int, Any]:
        futures = {w: self._submit(w, _call, method, *args) for w, (method, args) in calls.items()}
        for w, fut in futures.items():
            self.last[w] = fut
        return self._gather(futures, timeout, "a stage")

    def kill(self, w: int) -> None:
        self.unsound.add(w)
        self.executors[w].shutdown(wait=False, kill_workers=True)

    def close(self, keep: bool = False) -> None:
        """Shut the workers down, or (``keep``) keep the sound ones idle for the next pool
        once they dropped their clients. A worker still busy (an interrupted stage) is
        killed, not waited for: its shard's state is not needed any more."""
        for w, ex in enumerate(self.executors):
            busy = self.last[w] is not None and not self.last[w].done()
            if keep and not busy and w not in self.unsound:
                try:
                    ex.submit(_unload).result(timeout=60)
                except Exception:  # died or hung meanwhile: not worth keeping
                    pass
                else:
                    _keep_idle(ex)
                    continue
            ex.shutdown(wait=True, kill_workers=True)
        self.executors = []


class RayPool:
    """One Ray actor per shard, spread over the cluster's nodes."""

    def __init__(self, payloads: list[bytes], timeout: float, cpus: float, owned: bool):
        ray = import_ray()
        self.ray, self.owned = ray, owned
        actor = ray.remote(Shard)
        # never ask for more CPUs than the cluster has: a pool larger than it would wait forever
        opts = {"num_cpus": min(1.0, cpus / len(payloads)), "scheduling_strategy": "SPREAD", "max_restarts": 0}
        self.actors = [actor.options(**opts).remote(ray.put(p)) for p in payloads]
        self.pids = [s.get("pid") if isinstance(s, dict) else s for s in self._gather(
            {w: a.stats.remote() for w, a in enumerate(self.actors)}, timeout, "start").values()]

    def _gather(self, refs: dict[int, Any], timeout, what):
        ray = self.ray
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
        ready = set(ready)
        out = {}
        for w, ref in refs.items():
            if ref not in ready:
                self.kill(w)
                out[w] = _Lost(f"no answer to {what} within {timeout:g} s")
                continue
            try:
                out[w] = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as exc:
                out[w] = _Lost(f"its Ray actor died ({type(exc).__name__})")
        return out

    def call(self, calls: dict[int, tuple[str, tuple]], timeout: float) -> dict[int, Any]:
        refs = {w: getattr(self.actors[w], method).remote(*args) for w, (method, args) in calls.items()}
        return self._gather(refs, timeout, "a stage")

    def kill(self, w: int) -> None:
        try:
            self.ray.kill(self.actors[w], no_restart=True)
        except Exception:  # already gone
            pass

    def close(self, keep: bool = False) -> None:
        """Kill the actors (``keep`` is ignored: Ray's workers are the cluster's own)."""
        for w in range(len(self.actors)):
            self.kill(w)
        self.actors = []
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()


def _probe_ray_address(address: str, timeout: float = 10.0) -> None:
    """Fail fast when nothing listens at ``host:port``: ``ray.init`` retries an unreachable
    GCS for about ten minutes before giving up (measured here), which reads as a hang."""
    if address in ("auto", "local"):
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return  # a form Ray resolves itself; let ray.init judge it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {host}:{port} ({exc})") from None


def connect_ray(n_workers: int | None) -> tuple[bool, float]:
    """Join the running Ray instance / ``RAY_ADDRESS`` cluster, or start a local one.

    Returns (whether we started it, the cluster's CPUs).
    """
    ray = import_ray()
    owned = False
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        try:
            if address:
                _probe_ray_address(address)
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=n_workers or affinity_cpus(), include_dashboard=False, log_to_driver=False)
        except (ConnectionError, TimeoutError, RuntimeError, ValueError) as exc:
            where = f"the Ray cluster at RAY_ADDRESS={address!r}" if address else "a local Ray instance"
            raise InputError(
                f"backend='ray' could not connect to {where}: {exc}. Start the cluster (`ray start --head` on "
                "the head node, `ray start --address=HEAD:6379` on the others), fix RAY_ADDRESS, or unset it to "
                "start a local Ray instance."
            ) from exc
        owned = True
    return owned, float(ray.cluster_resources().get("CPU", 1.0))


# ---------------------------------------------------------------- the transport
class WorkerTransport(SimulatedTransport):
    """Simulated clients sharded over a pool of workers (see the module docstring).

    Parameters
    ----------
    backend : "processes" or "ray"
    n_workers : int or None
        Workers in the pool (None: the CPUs available, or the Ray cluster's CPUs), at most
        one per client.
    clients : list of arrays
        The clients' records; client ``i`` is ``clients[i]``.
    algorithm, layers, aggregator, info
        The fit's algorithm and protection stack after ``setup``, and its RunInfo.
    dropouts, rng
        Simulated dropouts, drawn in the driver as :class:`LocalTransport` draws them.
    timeout : float
        Seconds one exchange may take before a silent worker is declared dead.
    policies : dict or None
        ``{client: ClientPolicy}``: copied into the worker that holds the client, where each
        keeps its state for the whole fit (:mod:`securefkm.federation.client_policy`).
    """

    def __init__(self, backend, n_workers, clients, algorithm, layers, aggregator, info, dropouts, rng,
                 *, timeout: float = DEFAULT_TIMEOUT, policies: dict | None = None):
        super().__init__(dropouts, rng)
        policies = dict(policies or {})
        self.faults = {}
        self.backend = backend
        self.timeout = float(timeout)
        self.n_clients = len(clients)
        owned, cpus = (False, float(affinity_cpus()))
        if backend == "ray":
            owned, cpus = connect_ray(n_workers)
        n = min(n_workers or max(1, int(cpus)), self.n_clients)
        bounds = [round(w * self.n_clients / n) for w in range(n + 1)]
        self._starts = bounds[1:-1]  # client c is in shard bisect_right(starts, c)
        self.shards = [range(bounds[w], bounds[w + 1]) for w in range(n)]
        if isinstance(clients, ClientPopulation):  # streamed: each worker makes its shard's clients per round
            try:
                pickle.dumps(clients.load, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                raise InputError(
                    f"backend={backend!r} sends the ClientPopulation to its workers, but its load function cannot be "
                    f"pickled ({type(exc).__name__}: {exc}); define load at module level (a function or a class "
                    "instance), or use backend='local'.") from None
            payloads = [
                pickle.dumps((s, clients, None, algorithm, layers, aggregator, info,
                              {c: policies[c] for c in policies if c in s}), protocol=pickle.HIGHEST_PROTOCOL)
                for s in self.shards
            ]
        else:
            states = [provisioned_state(c, len(X), layers) for c, X in enumerate(clients)]
            payloads = [
                pickle.dumps((list(s), [clients[c] for c in s], [states[c] for c in s], algorithm, layers, aggregator,
                              info, {c: policies[c] for c in s if c in policies}), protocol=pickle.HIGHEST_PROTOCOL)
                for s in self.shards
            ]
        self.lost: dict[int, str] = {}  # worker -> why
        self.pool = None
        try:
            if backend == "ray":
                self.pool = RayPool(payloads, self.timeout, cpus, owned)
            else:
                self.pool = ProcessPool(payloads, self.timeout)
        except BaseException:
            if owned:
                import_ray().shutdown()
            raise
        self._finalizer = weakref.finalize(self, self.pool.close)
        for w, pid in enumerate(self.pool.pids):
            if isinstance(pid, _Lost):
                self.close()
                raise RuntimeError(f"worker {w} of backend={backend!r} did not start: {pid.why}")

    def owner(self, client: int) -> int:
        """The worker whose shard holds ``client`` (shards are contiguous id ranges)."""
        return bisect.bisect_right(self._starts, int(client))

    @property
    def n_workers(self) -> int:
        return len(self.shards)

    def client_ids(self):
        return list(range(self.n_clients))

    def worker_pids(self) -> list[int]:
        """Process ids of the workers (tests kill one to simulate a crash)."""
        return list(self.pool.pids)

    def worker_stats(self) -> list[dict]:
        """Per live worker: pid, number of clients, peak resident memory (MiB), node name and
        the seconds it spent answering each stage (``busy_s``)."""
        calls = {w: ("stats", ()) for w in range(self.n_workers) if w not in self.lost}
        return [s for s in self.pool.call(calls, self.timeout).values() if not isinstance(s, _Lost)]

    def lost_clients(self) -> list[int]:
        return sorted(c for w in self.lost for c in self.shards[w])

    def abort_note(self) -> str:
        if not self.lost:
            return ""
        workers = ", ".join(f"worker {w} ({why})" for w, why in sorted(self.lost.items()))
        return f"lost clients {self.lost_clients()} with {workers}"

    def exchange(self, stage, messages):
        live = self._live(stage, messages)
        calls: dict[int, dict[int, Any]] = {}
        for c, m in live.items():
            w = self.owner(c)
            if w not in self.lost:
                calls.setdefault(w, {})[c] = m
        results = self.pool.call({w: ("exchange", (stage, msgs)) for w, msgs in calls.items()}, self.timeout)
        merged: dict[int, Any] = {}
        refused: dict[int, str] = {}
        error = None
        for w in sorted(results):
            out = results[w]
            if isinstance(out, _Lost):
                self.lost[w] = out.why
                log.warning("backend=%s: worker %d lost at stage %r (%s); its clients %s drop out for the rest of "
                            "the fit", self.backend, w, stage, out.why, list(self.shards[w]))
                continue
            status, value = out
            if status == "error":
                error = error or value  # the first shard's, in client order
                continue
            merged.update(value[0])
            refused.update(value[1])
            for c, why in value[2].items():
                self.faults.setdefault(c, why)
        if error is not None:
            raise error
        self._refused(refused)
        return {c: merged[c] for c in messages if c in merged}, refused

    #: :meth:`close` can keep the workers for the next fit (``Federation.close``)
    can_keep_workers = True

    def close(self, keep_workers: bool = False):
        """Shut the workers down; with ``keep_workers`` (a fit that ended normally) keep the
        sound worker processes idle for the next fit's pool (:data:`KEEP_IDLE_S`)."""
        if self.pool is None or not self._finalizer.alive:
            return
        if keep_workers:
            self._finalizer.detach()
            self.pool.close(keep=True)
        else:
            self._finalizer()  # runs pool.close once
