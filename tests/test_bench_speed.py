"""Smoke tests of ``python -m benchmarks speed`` on tiny inputs: its tables must keep running (the
timings themselves are the benchmark's business, not the tests')."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import speed


def test_side_by_side_alternates_warm_batches(monkeypatch):
    """Each side: one warm-up call, then per repeat one untimed call and ``batch`` timed
    calls, after the settling pause; sides alternate."""
    monkeypatch.setattr(speed, "SETTLE_S", 0.0)
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    out = speed.side_by_side(fns, repeats=2, batch=3)
    assert set(out) == {"a", "b"} and all(v >= 0 for v in out.values())
    assert calls == ["a", "b"] + (["a"] * 4 + ["b"] * 4) * 2


def test_rounds_measure_runs_every_algorithm(monkeypatch):
    monkeypatch.setattr(speed, "SETTLE_S", 0.0)
    X = np.random.default_rng(0).normal(size=(3000, 3))
    m = speed.measure(X, 4, n_clients=10, repeats=1, algorithms=tuple(speed.ALGORITHMS))
    for name in ("kernel", *speed.ALGORITHMS):
        assert m[name] > 0
    assert set(m["peak"]) == set(speed.ALGORITHMS) and m["data_bytes"] == X.nbytes


def test_masked_round_counts_its_cryptography():
    """A 20-client masked round: every client makes two key pairs and agrees keys with each
    graph neighbour (complete graph here), for masks and for shares: in one process once
    per pair, and once per client and pair when every client computes its own."""
    r = speed.masked_round(20, repeats=1)
    assert r["counts"]["keygen"] == 2 * 20
    assert r["counts"]["agree"] == 2 * 20 * 19 // 2
    assert r["masked"] > r["plain"] > 0 and r["crypto_s"] > 0
    alone = speed.masked_round(20, repeats=1, alone=True)
    assert alone["counts"]["agree"] == 2 * 20 * 19 and alone["counts"]["keygen"] == 2 * 20
    assert alone["counts"]["kdf"] == r["counts"]["kdf"]  # every client derives its own keys either way


def test_masked_round_as_a_user_gets_it(monkeypatch):
    """The default backend's row: the masked round's clients in worker processes (when the
    machine has two CPUs), the plain round in process."""
    from securefkm.federation import workers

    monkeypatch.setattr(workers, "AUTO_MIN_CLIENTS", 10)
    r = speed.masked_round_default(12, repeats=1)
    two = workers.kernel_threads() >= 2
    assert r["backend_masked"] == ("processes" if two else "local") and r["backend_plain"] == "local"
    assert r["workers"] == (min(workers.kernel_threads(), 12) if two else 0) and r["masked"] > 0 and r["plain"] > 0


def test_speed_diagnostics_run(monkeypatch):
    """The measurements docs/benchmarks.md quotes to explain the tables keep running."""
    from securefkm.algorithms import _cellsums
    from benchmarks import speed_diagnostics as diag

    assert diag.spin(1).startswith("spin:")
    assert "first block of the caller" in diag.timeline(1)
    assert diag.framework(3000, 3, 4, 10, 1).startswith("framework:")
    assert "thread-pool form" in diag.kernel_threads(3000, 3, 4, 10, 2) and _cellsums.POOLED is True
    assert "thread-pool form" in diag.pooled_form(3000, 3, 4, 10, 1) and _cellsums.POOLED is True  # put back
    assert "largest first" in diag.skewed_clients(3000, 3, 4, 10, 2) and _cellsums.POOLED is True
    assert diag.x25519(10).startswith("x25519:")
    assert "ms in process" in diag.auto_backend(sizes=(6,), repeats=1)
    stages = diag.masked_stages(12, rounds=1, backend="processes")
    assert " workers, medians of 1 rounds" in stages and all(f"{s} " in stages for s in ("update", "share", "masked_input", "unmask"))
    assert "nothing to split" in diag.masked_stages(12, rounds=1)  # backend="auto" keeps 12 clients in process
    assert "in place" in diag.local_runs(3000, 3, 4, 10, 1) and _cellsums.LOCAL_RUNS is True
    memory = diag.transcript_memory(n_clients=50, k=3, d=2, rounds=2)
    full, aggregates = (float(memory.split(f"{level} ")[1].split(" MiB")[0]) for level in ("full", "aggregates"))
    assert full > aggregates  # every client message against each round's aggregate
    from securefkm.algorithms import _local

    threshold = _local.LOCAL_JIT_MIN_WORK
    assert "scikit-learn" in diag.local_kmeans(n_clients=3, n=20, d=2, k=3, repeats=1)
    assert _local.LOCAL_JIT_MIN_WORK == threshold  # put back


def test_speed_diagnostics_by_name(monkeypatch, capsys):
    """``python -m benchmarks.speed_diagnostics NAME ...`` runs each named diagnostic
    at its quoted sizes (the parametrised ones too); an unknown name is refused with the
    list of names."""
    from benchmarks import speed_diagnostics as diag

    monkeypatch.setattr(diag, "RUNS", {**diag.RUNS, "framework": [lambda: diag.framework(3000, 3, 4, 10, 1)]})
    diag.run(["framework", "x25519"])
    out = capsys.readouterr().out
    assert out.startswith("framework:") and "x25519:" in out
    with pytest.raises(SystemExit, match="unknown diagnostic 'nope'; choose from spin, timeline"):
        diag.run(["nope"])


def test_big_masked_round_in_a_fresh_process():
    """The 10,000-client rows' path at 20 clients: the in-process rounds as masked_round
    (counted warm-up, then timed rounds), in a spawned process whose peak is reported; the
    default backend's round after a warm-up one."""
    r = speed.big_masked_round(20, repeats=1)
    assert r["counts"]["agree"] == 2 * 20 * 19 // 2 and r["masked"] > 0 and r["crypto_s"] > 0
    assert 0 < r["peak_rss"] < 2**40
    w = speed.big_masked_round(20, backend="auto")
    assert w["masked"] > 0 and w["plain"] > 0 and w["peak_rss"] > 0
