"""backend="processes": the clients on a pool of worker processes give the very same fit.

Ray: tests/test_backends_ray.py. The cases and the comparison: tests/_backend_cases.py.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import numpy as np
import pytest
from _backend_cases import CASES, make_clients, outcome, released, seeded_dp_available
from sklearn.datasets import make_blobs

from protocols import PairwiseMasking
from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
from securefkm.exceptions import InputError, RoundAbortedError
from securefkm.federation import Federation
from securefkm.federation import workers as workers_mod
from securefkm.registry import make_estimator


@pytest.mark.parametrize("case", sorted(CASES))
def test_processes_equal_local(case):
    if "dp-seeded" in case and not seeded_dp_available():
        pytest.skip("GaussianDP(rng='seeded') is not available")
    local = outcome(case, "local")
    procs = outcome(case, "processes", n_workers=2)
    assert (local["error"] is not None) == CASES[case][4], local["error"]
    for key in ("error", "centres", "released", "privacy", "reports"):
        assert procs[key] == local[key], (case, key)


def test_more_workers_and_uneven_shards_change_nothing():
    local = outcome("dwf-masking-dropouts", "local")
    assert outcome("dwf-masking-dropouts", "processes", n_workers=5) == local


def test_local_kmeans_switching_to_compiled_mid_round_changes_nothing(monkeypatch):
    """A k-FED fit whose local k-means run in numpy, compiled from the first client, and in
    worker processes (each on its own share of the work, so switching at its own point):
    the same centres and the same released transcript, bit for bit."""
    pytest.importorskip("numba")
    from securefkm.algorithms import _local

    default = _local.LOCAL_JIT_MIN_WORK  # the workers' own setting: this test cannot change theirs
    X, _ = make_blobs(4000, 12, centers=6, cluster_std=1.0, random_state=4)
    clients = np.array_split(X, 40)

    def fit(backend, threshold):
        monkeypatch.setattr(_local, "LOCAL_JIT_MIN_WORK", threshold)
        est = make_estimator("kfed", n_clusters=6, local_k=20, random_state=2, backend=backend, n_workers=2)
        fed, _ = est.make_federation(clients)
        with fed:
            state = fed.run(0)
        return np.asarray(state.centres).tobytes(), released(fed.transcript)

    numpy_only = fit("local", 1 << 62)
    assert fit("local", 0) == numpy_only
    assert fit("local", 40 * 100 * 20) == numpy_only  # switches half-way through the round
    assert fit("processes", default) == numpy_only


def test_estimator_fit_and_attributes():
    clients = make_clients()
    fits = {b: make_estimator("dwf", n_clusters=3, random_state=3, dropout_rate=0.1, backend=b, n_workers=2).fit(clients)
            for b in ("local", "processes")}
    assert fits["processes"].get_params()["backend"] == "processes"
    assert fits["processes"].cluster_centers_.tobytes() == fits["local"].cluster_centers_.tobytes()
    assert fits["processes"].n_iter_ == fits["local"].n_iter_
    assert fits["processes"].inertia_ == fits["local"].inertia_


def _federation(clients, protection=(), **kw):
    algo = WeightedFederatedKMeansAlgorithm(3, init="uniform", init_bounds=(-2.0, 7.0))
    return Federation(algo, clients, protection=list(protection), random_state=0, max_rounds=6,
                      backend="processes", **kw)


def _dead(pid, within=10.0):
    """The process is gone (or a zombie) within ``within`` seconds."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split(")")[-1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


needs_proc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and sends POSIX signals")


@needs_proc
@pytest.mark.parametrize("settle", [0.0, 1.0], ids=["at-once", "pool-noticed"])
def test_killed_worker_between_rounds_drops_its_clients(caplog, settle):
    """Plain sums recover from dropouts: the fit goes on without the dead worker's clients,
    whether the next round starts at once or after the pool has noticed the death (then
    submitting to it raises instead of the call failing)."""
    clients = make_clients()
    with _federation(clients, n_workers=3) as fed:
        algo = fed.algorithm
        state = algo.init(fed.n_clients, 2, np.random.default_rng(0))
        state = fed.run_round(state, round=0)
        victim = fed.transport.worker_pids()[1]
        os.kill(victim, signal.SIGKILL)
        assert _dead(victim)
        time.sleep(settle)
        with caplog.at_level(logging.WARNING, logger="securefkm"):
            state = fed.run_round(state, round=1)
            state = fed.run_round(state, round=2)
        lost = list(range(4, 8))
        assert fed.transport.lost_clients() == lost
        for record in list(fed.transcript)[1:]:
            assert set(record.stages[0].dropped) == set(lost) & set(record.sampled)
            assert not set(record.contributors) & set(lost)
            assert len(record.contributors) == 8
        assert "worker 1 lost" in caplog.text and "[4, 5, 6, 7]" in caplog.text


@needs_proc
def test_killed_worker_mid_round_aborts_naming_the_lost_clients():
    """Half the clients die after sending masked inputs: unmasking cannot reach the
    threshold, the round aborts, says whom it lost, and nothing is released."""
    clients = make_clients()
    with _federation(clients, protection=[PairwiseMasking()], n_workers=2) as fed:
        transport = fed.transport
        exchange = transport.exchange

        def killing_exchange(stage, messages):
            if stage == "unmask":
                os.kill(transport.worker_pids()[0], signal.SIGKILL)
            return exchange(stage, messages)

        transport.exchange = killing_exchange
        state = fed.algorithm.init(fed.n_clients, 2, np.random.default_rng(0))
        start = time.monotonic()
        with pytest.raises(RoundAbortedError, match=r"lost clients \[0, 1, 2, 3, 4, 5\] with worker 0"):
            fed.run_round(state, round=0)
        assert time.monotonic() - start < 60
        record = list(fed.transcript)[-1]
        assert record.aborted and "lost clients" in record.aborted
        assert not record.aggregate and not record.contributors and record.centres_after is None
        assert record.stages[-1].stage == "unmask" and set(record.stages[-1].dropped) == set(range(6))


@needs_proc
def test_silent_worker_times_out_instead_of_hanging():
    clients = make_clients()
    with _federation(clients, n_workers=2) as fed:
        fed.transport.timeout = 3.0
        stopped = fed.transport.worker_pids()[1]
        os.kill(stopped, signal.SIGSTOP)
        try:
            state = fed.algorithm.init(fed.n_clients, 2, np.random.default_rng(0))
            start = time.monotonic()
            fed.run_round(state, round=0)
            assert time.monotonic() - start < 30
            assert fed.transport.lost_clients() == list(range(6, 12))
            assert "no answer" in fed.transport.abort_note()
        finally:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass


@needs_proc
def test_a_silent_worker_asked_alone_is_the_one_killed():
    """A stage sent to some workers only (the others' clients were not sampled or are lost):
    the worker that timed out is killed, not the one at its position in the call."""
    with _federation(make_clients(), n_workers=2) as fed:
        pool = fed.transport.pool
        first, second = fed.transport.worker_pids()
        os.kill(second, signal.SIGSTOP)
        try:
            out = pool.call({1: ("stats", ())}, 2.0)
            assert isinstance(out[1], workers_mod._Lost) and pool.unsound == {1}
            assert _dead(second) and not _dead(first, within=0.5)
            assert pool.call({0: ("stats", ())}, 30.0)[0]["pid"] == first
        finally:
            try:
                os.kill(second, signal.SIGKILL)
            except ProcessLookupError:
                pass


@needs_proc
def test_workers_shut_down_on_keyboard_interrupt(monkeypatch):
    seen = []
    exchange = workers_mod.WorkerTransport.exchange

    def interrupted(self, stage, messages):
        seen.append(self)
        if len(seen) == 3:
            raise KeyboardInterrupt
        return exchange(self, stage, messages)

    monkeypatch.setattr(workers_mod.WorkerTransport, "exchange", interrupted)
    est = make_estimator("dwf", n_clusters=3, random_state=0, backend="processes", n_workers=2)
    with pytest.raises(KeyboardInterrupt):
        est.fit(make_clients())
    pids = seen[0].worker_pids()
    assert len(pids) == 2 and all(_dead(p) for p in pids)


@needs_proc
def test_workers_shut_down_after_a_fit_and_on_errors():
    fed = _federation(make_clients(), protection=[PairwiseMasking()], n_workers=2, max_aborted_rounds=0,
                      dropout_rate={0: {"unmask": list(range(8))}})
    pids = fed.transport.worker_pids()
    with fed, pytest.raises(RoundAbortedError):
        fed.run(0)
    assert all(_dead(p) for p in pids)
    fed.close()  # idempotent


def _fit_seeing_workers(monkeypatch, **kw):
    """Fit a 12-client DWF with worker processes; (the estimator, the pids its pool had)."""
    seen = []
    init = workers_mod.WorkerTransport.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen.append(self.worker_pids())

    monkeypatch.setattr(workers_mod.WorkerTransport, "__init__", recording)
    est = make_estimator("dwf", n_clusters=3, random_state=0, backend="processes", n_workers=2, max_rounds=4, **kw)
    est.fit(make_clients())
    return est, seen[-1]


@needs_proc
def test_a_finished_fit_keeps_its_workers_for_the_next_fit(monkeypatch):
    """Starting a worker costs as much as a 100-client masked round: the workers of a fit
    that ended normally are kept idle (without their clients) and the next fit's pool takes
    them; the fits are the same as in process. They end after KEEP_IDLE_S idle seconds or
    on shutdown_idle_workers()."""
    workers_mod.shutdown_idle_workers()
    first, pids = _fit_seeing_workers(monkeypatch)
    assert len(workers_mod._IDLE) == 2 and not any(_dead(p, within=0.5) for p in pids)
    second, pids2 = _fit_seeing_workers(monkeypatch, protection=[PairwiseMasking()], init_bounds=(-2.0, 7.0))
    assert sorted(pids2) == sorted(pids)
    local = make_estimator("dwf", n_clusters=3, random_state=0, backend="local", max_rounds=4,
                           protection=[PairwiseMasking()], init_bounds=(-2.0, 7.0)).fit(make_clients())
    assert second.cluster_centers_.tobytes() == local.cluster_centers_.tobytes()
    workers_mod.shutdown_idle_workers()
    assert not workers_mod._IDLE and all(_dead(p) for p in pids)


@needs_proc
def test_kept_workers_end_after_their_idle_time(monkeypatch):
    workers_mod.shutdown_idle_workers()
    monkeypatch.setattr(workers_mod, "KEEP_IDLE_S", 0.2)
    _, pids = _fit_seeing_workers(monkeypatch)
    assert all(_dead(p, within=10.0) for p in pids) and not workers_mod._IDLE


@needs_proc
def test_a_kept_worker_that_died_is_replaced(monkeypatch):
    workers_mod.shutdown_idle_workers()
    _, pids = _fit_seeing_workers(monkeypatch)
    os.kill(pids[0], signal.SIGKILL)
    assert _dead(pids[0])
    est, pids2 = _fit_seeing_workers(monkeypatch)
    assert len(pids2) == 2 and pids[0] not in pids2 and pids[1] in pids2
    assert est.cluster_centers_.tobytes() == make_estimator(
        "dwf", n_clusters=3, random_state=0, backend="local", max_rounds=4).fit(make_clients()).cluster_centers_.tobytes()
    workers_mod.shutdown_idle_workers()


@needs_proc
def test_a_kept_worker_that_cannot_load_the_next_fit_is_replaced(monkeypatch, tmp_path):
    """A kept worker copied sys.path when it started: a fit whose layer lives in a module made
    importable later cannot be rebuilt there, so a fresh worker takes its place."""
    workers_mod.shutdown_idle_workers()
    _, pids = _fit_seeing_workers(monkeypatch)
    (tmp_path / "late_layer.py").write_text(
        "from protocols import PairwiseMasking\n\nclass LateMasking(PairwiseMasking):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from late_layer import LateMasking

    est, pids2 = _fit_seeing_workers(monkeypatch, protection=[LateMasking()], init_bounds=(-2.0, 7.0))
    assert not set(pids2) & set(pids)
    local = make_estimator("dwf", n_clusters=3, random_state=0, backend="local", max_rounds=4,
                           protection=[PairwiseMasking()], init_bounds=(-2.0, 7.0)).fit(make_clients())
    assert est.cluster_centers_.tobytes() == local.cluster_centers_.tobytes()
    workers_mod.shutdown_idle_workers()


def test_worker_stats_report_memory_per_worker():
    with _federation(make_clients(), n_workers=2) as fed:
        stats = fed.transport.worker_stats()
    assert [s["clients"] for s in stats] == [6, 6]
    assert all(s["peak_mib"] > 10 for s in stats)
    assert len({s["pid"] for s in stats}) == 2 and os.getpid() not in {s["pid"] for s in stats}
    assert all(s["busy_s"] == {} for s in stats)  # no stage answered yet


def test_worker_stats_sum_the_time_spent_on_each_stage():
    with _federation(make_clients(), protection=[PairwiseMasking()], n_workers=2) as fed:
        state = fed.algorithm.init(fed.n_clients, 2, np.random.default_rng(0))
        fed.run_round(state, round=0)
        once = fed.transport.worker_stats()
        fed.run_round(state, round=1)
        twice = fed.transport.worker_stats()
    stages = {"update", "advertise", "share", "masked_input", "unmask"}
    for a, b in zip(once, twice):
        assert set(a["busy_s"]) == set(b["busy_s"]) == stages
        assert all(0 < a["busy_s"][s] < b["busy_s"][s] for s in stages)


def test_n_workers_capped_by_clients():
    with _federation(make_clients(3, 30), n_workers=8) as fed:
        assert fed.transport.n_workers == 3


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"backend": "threads"}, r"backend must be one of \('auto', 'local', 'processes', 'ray'\)"),
        ({"backend": "processes", "n_workers": 0}, "n_workers must be an int >= 1"),
        ({"backend": "processes", "n_workers": 1.5}, "n_workers must be an int >= 1"),
        ({"backend": "processes", "n_workers": True}, "n_workers must be an int >= 1"),
    ],
)
def test_bad_backend_arguments(kw, match):
    est = make_estimator("dwf", n_clusters=3, random_state=0, **kw)
    with pytest.raises(InputError, match=match):
        est.fit(make_clients())


def test_ray_missing_is_refused_with_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    est = make_estimator("dwf", n_clusters=3, random_state=0, backend="ray")
    with pytest.raises(InputError, match=r"needs Ray.*pip install -e \"\.\[ray\]\""):
        est.fit(make_clients())


def test_backend_and_transport_are_exclusive():
    from securefkm.federation import LocalTransport
    from securefkm.federation.sampling import Dropouts

    algo = WeightedFederatedKMeansAlgorithm(3, init="uniform", init_bounds=(-2.0, 7.0))
    with pytest.raises(InputError, match="cannot be combined with a transport"):
        Federation(algo, None, transport=LocalTransport([], Dropouts(), np.random.default_rng(0)),
                   n_features=2, backend="processes")


# ---------------------------------------------------------------- backend="auto" (the default)
two_cpus = pytest.mark.skipif(workers_mod.kernel_threads() < 2, reason="auto keeps a one-CPU process's clients local")


@pytest.fixture
def low_auto_threshold(monkeypatch):
    """backend="auto" chooses workers from 10 clients a round (12-client fits stay fast)."""
    monkeypatch.setattr(workers_mod, "AUTO_MIN_CLIENTS", 10)


def _auto(clients, protection=(), **kw):
    algo = WeightedFederatedKMeansAlgorithm(3, init="uniform", init_bounds=(-2.0, 7.0))
    return Federation(algo, clients, protection=list(protection), random_state=0, max_rounds=6, **kw)


def test_auto_is_the_default_and_keeps_small_or_plain_fits_in_process():
    assert make_estimator("dwf", n_clusters=3).get_params()["backend"] == "auto"
    clients = make_clients()
    with _auto(clients, [PairwiseMasking()]) as fed:  # 12 clients < AUTO_MIN_CLIENTS
        assert fed.backend == "local"
    est = make_estimator("dwf", n_clusters=3, random_state=0, max_rounds=3).fit(clients)
    assert est.backend_ == "local" and est.get_params()["backend"] == "auto"


@two_cpus
def test_auto_puts_public_key_clients_in_worker_processes(low_auto_threshold):
    clients = make_clients()
    with _auto(clients, [PairwiseMasking()]) as fed:
        assert fed.backend == "processes"
        assert fed.transport.n_workers == min(workers_mod.kernel_threads(), len(clients))
    for case in ("dwf-masking-dropouts", "dwf-paillier"):  # the same fit as in process, bit for bit
        assert outcome(case, "auto", n_workers=None) == outcome(case, "local"), case
    est = make_estimator("dwf", n_clusters=3, random_state=0, max_rounds=3, protection=[PairwiseMasking()],
                         init_bounds=(-2.0, 7.0))
    assert est.fit(clients).backend_ == "processes"


@two_cpus
@pytest.mark.parametrize("why", ["plain", "ideal", "one-cpu", "omp-one", "transport"])
def test_auto_stays_in_process_when_workers_do_not_pay(low_auto_threshold, monkeypatch, why):
    from securefkm import _kernel_threads

    clients = make_clients()
    kw = {"protection": [PairwiseMasking()]}
    if why == "plain":
        kw = {}
    elif why == "ideal":  # the ideal functionality does no cryptography
        kw["crypto"] = "ideal"
    elif why == "one-cpu":  # e.g. a worker of a sweep (sweep._pin_threads gives it one)
        monkeypatch.setattr(_kernel_threads, "_DEFAULT", 1)
    elif why == "omp-one":  # e.g. a joblib worker: started with OMP_NUM_THREADS=1
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        monkeypatch.setattr(_kernel_threads, "_CPUS", None)  # read again, as a fresh process would
    elif why == "transport":  # a deployment's clients are where they are
        class Remote:  # stands for the Flower transport: only its client ids are read here
            def client_ids(self):
                return list(range(12))

            def close(self):
                pass

        kw.update(transport=Remote(), n_features=2)
        clients = None
    with _auto(clients, **kw) as fed:
        assert fed.backend == "local"


@two_cpus
def test_auto_stays_in_process_for_a_class_a_worker_cannot_import(low_auto_threshold):
    """loky's workers do not import the parent's __main__: a layer defined in a script or
    notebook could not be rebuilt there, so auto keeps the fit in process."""
    namespace = {"__name__": "__main__"}
    exec("from protocols import PairwiseMasking\nclass MyMasking(PairwiseMasking):\n    pass\n", namespace)
    my_masking = namespace["MyMasking"]
    import __main__

    __main__.MyMasking = my_masking  # picklable by reference from __main__, as in a script
    try:
        with _auto(make_clients(), [my_masking()]) as fed:
            assert fed.backend == "local"
    finally:
        delattr(__main__, "MyMasking")


def test_sweep_workers_give_the_kernels_one_thread(monkeypatch):
    from securefkm import _kernel_threads, sweep

    monkeypatch.setattr(_kernel_threads, "_DEFAULT", None)
    for var in sweep._THREAD_VARS:
        monkeypatch.setenv(var, os.environ.get(var, ""))  # restored after the test
    from threadpoolctl import threadpool_limits

    with threadpool_limits():  # restores the native pools' limits on exit
        sweep._pin_threads(1)
    assert _kernel_threads.kernel_threads() == 1
