"""securefkm.sweep: parallel output equals serial, resume skips cached cells, bad input."""

import pytest
from _sweep_cells import logged, native_threads, noisy_mean

from securefkm.exceptions import InputError
from securefkm.sweep import cell_key, run_sweep


def test_parallel_equals_serial_and_order(tmp_path):
    cells = [{"seed": s, "n": 50 + s} for s in (5, 1, 4, 2, 3, 0)]
    serial = run_sweep(noisy_mean, cells, jobs=1, progress=False)
    assert [r["seed"] for r in serial] == [5, 1, 4, 2, 3, 0]
    parallel = run_sweep(noisy_mean, cells, jobs=2, backend="processes", progress=False)
    assert parallel == serial  # bit-identical floats, same order
    cached = run_sweep(noisy_mean, cells, jobs=2, cache_dir=tmp_path, progress=False)
    assert cached == serial
    assert run_sweep(noisy_mean, cells, jobs=1, cache_dir=tmp_path, progress=False) == serial  # from the cache
    assert len(list(tmp_path.glob("*.json"))) == len(cells)


def test_cells_run_single_threaded_whatever_jobs_is(monkeypatch):
    """Every cell runs with CELL_THREADS (1) per native pool, in worker processes and in this
    process alike: no oversubscription with jobs > 1 (jobs=2 was slower than jobs=1), and
    threaded reductions sum in the same order whatever jobs and the machine's cores are."""
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    parallel = run_sweep(native_threads, [{"i": i} for i in range(4)], jobs=2, progress=False)
    assert {r["omp_env"] for r in parallel} == {"1"}
    assert {r["pools"] for r in parallel} == {1}
    serial = run_sweep(native_threads, [{"i": i} for i in range(2)], jobs=1, progress=False)
    assert {r["pools"] for r in serial} == {1}


def test_resume_skips_cached_cells(tmp_path):
    log, flag = tmp_path / "log.txt", tmp_path / "flag"
    flag.write_text("")
    cells = [{"i": i, "fail_at": 3, "log": str(log), "flag": str(flag)} for i in range(6)]
    with pytest.raises(KeyboardInterrupt):
        run_sweep(logged, cells, cache_dir=tmp_path / "cache", progress=False)
    assert log.read_text().split() == ["0", "1", "2", "3"]
    flag.unlink()
    log.write_text("")
    out = run_sweep(logged, cells, cache_dir=tmp_path / "cache", progress=False)
    assert out == [i * i for i in range(6)]
    assert log.read_text().split() == ["3", "4", "5"]  # 0..2 came from the cache
    log.write_text("")
    assert run_sweep(logged, cells, jobs=2, cache_dir=tmp_path / "cache", progress=False) == out
    assert log.read_text() == ""


def test_keys_are_stable_and_order_free():
    assert cell_key(noisy_mean, {"seed": 1, "n": 2}) == cell_key(noisy_mean, {"n": 2, "seed": 1})
    assert cell_key(noisy_mean, {"seed": 1, "n": 2}) != cell_key(logged, {"seed": 1, "n": 2})


def test_bad_input_names_the_argument():
    with pytest.raises(InputError, match="jobs"):
        run_sweep(noisy_mean, [], jobs=0)
    with pytest.raises(InputError, match="backend"):
        run_sweep(noisy_mean, [], backend="threads")
    with pytest.raises(InputError, match="module-level"):
        run_sweep(lambda c: c, [{"a": 1}])
    with pytest.raises(InputError, match="JSON"):
        run_sweep(noisy_mean, [{"seed": object()}])


def test_ray_backend(monkeypatch):
    try:
        import ray  # noqa: F401
    except ImportError:
        import builtins

        real = builtins.__import__

        def no_ray(name, *a, **k):
            if name == "ray":
                raise ImportError(name)
            return real(name, *a, **k)

        monkeypatch.setattr(builtins, "__import__", no_ray)
        with pytest.raises(InputError, match=r"pip install"):
            run_sweep(noisy_mean, [{"seed": 0, "n": 3}], backend="ray", progress=False)
        return
    import ray

    cells = [{"seed": s, "n": 20} for s in range(4)]
    import os

    here = os.path.dirname(os.path.abspath(__file__))  # the workers import _sweep_cells from here
    path = os.pathsep.join([here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        assert run_sweep(noisy_mean, cells, backend="ray", jobs=2, progress=False) == run_sweep(
            noisy_mean, cells, progress=False)
    finally:
        ray.shutdown()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stopped_sweep_leaves_no_worker_running(tmp_path, sig):
    """kill (SIGTERM) or Ctrl-C (SIGINT) of a sweep's driver stops its running cells too: before,
    the executor waited for them and, after SIGTERM, the workers ran on orphaned."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "drive.py"
    stacks = tmp_path / "driver-stacks.txt"
    script.write_text(
        "import faulthandler, signal, sys\n"
        f"faulthandler.register(signal.SIGUSR1, file=open({str(stacks)!r}, 'w'), all_threads=True)\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from _sweep_cells import slow\n"
        "from securefkm.sweep import run_sweep\n"
        "if __name__ == '__main__':\n"
        f"    run_sweep(slow, [{{'i': i, 'dir': {str(tmp_path)!r}, 'seconds': 120}} for i in range(4)], jobs=2,"
        " progress=False)\n"
    )

    def as_from_a_terminal():
        # a driver started from a terminal: a test run launched in the background (`pytest &` in a
        # non-interactive shell) ignores SIGINT, and the driver would inherit that and never stop
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.DEVNULL, preexec_fn=as_from_a_terminal)
    deadline = time.time() + 90
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.time() < deadline:
        time.sleep(0.2)
    pids = [int(p.stem) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2, "the workers did not start"
    proc.send_signal(getattr(signal, sig))
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # say where the driver hangs, then clean up
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        proc.kill()
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        raise AssertionError(f"the driver did not exit after {sig}; its threads:\n{stacks.read_text()}") from None
    assert code != 0

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    deadline = time.time() + 15
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids)
