"""bench scaling's CPU accounting: the workers' CPU is read and the driver's is separate."""

import os

from benchmarks.scaling import _cpu_seconds, backends


def test_cpu_seconds_of_this_process_and_of_a_missing_one():
    assert _cpu_seconds(os.getpid()) > 0
    assert _cpu_seconds(2**22 + 12345) == 0.0  # no such process: 0, not an error


def test_backends_split_driver_and_worker_cpu():
    t = backends(40, repeats=1, kinds=("local", "processes"), out=lambda *_: None)
    assert t["local"]["workers"] == 0.0 and t["local"]["cpu"] == t["local"]["driver"] > 0
    p = t["processes"]
    assert p["workers"] > 0  # the clients' work is counted in the worker processes
    assert p["driver"] < t["local"]["driver"]  # ... and not in the driver
    assert p["cpu"] >= p["driver"] + p["workers"] - 1e-9
