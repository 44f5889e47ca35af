"""Helpers of benchmarks.deployment_secagg (no deployment is started here; the CPU
accounting test starts two short Python processes)."""

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from benchmarks import deployment_secagg as ds


def test_configurations_match_holders_and_threshold():
    cfgs = ds.configurations(10, neighbours=(4,))
    sparse, complete = cfgs
    assert sparse["num_shares"] == 5 and sparse["threshold"] == 4
    assert sparse["protection"] == [{"name": "masking", "graph": "sparse", "neighbours": 4}]
    assert complete["num_shares"] == 10 and complete["threshold"] == 7
    with pytest.raises(ValueError):
        ds.configurations(10, neighbours=(9,))


def test_threshold_is_the_masking_default():
    from protocols.masking.graph import resolve_threshold

    for m in range(2, 30):
        assert ds.threshold_of(m) == resolve_threshold(None, m)


def test_ewf_spec_masks_exactly_length_values():
    spec = ds.ewf_spec(10_000, 3, ["masking"])
    assert spec.algorithm == "ewf" and spec.params["n_clusters"] * 1000 == 10_000
    assert spec.params["init"] == "uniform" and spec.params["tol"] == 0.0 and spec.params["max_rounds"] == 3
    with pytest.raises(ValueError):
        ds.ewf_spec(10_001, 3, [])


def test_flower_run_config_round_trips_through_toml(tmp_path):
    cfg = ds.flower_run_config(10, 10_000, 5, 4, 3, 0.05, tmp_path / "r.json")
    parsed = tomllib.loads(ds.run_config_toml(cfg))
    assert parsed == cfg
    app = tomllib.loads((ds.FLOWER_APP_DIR / "pyproject.toml").read_text())
    assert set(cfg) <= set(app["tool"]["flwr"]["app"]["config"])  # every key has a default in the app
    with pytest.raises(ValueError):
        ds.flower_run_config(10, 100, 4, 3, 3, 0.05, "r.json")  # even num_shares < n
    with pytest.raises(ValueError):
        ds.flower_run_config(10, 100, 5, 5, 3, 0.05, "r.json")  # threshold must be < num_shares


def test_round_intervals_and_steady():
    events = [{"event": "start", "round": 0, "t": 0.0}, {"event": "end", "round": 0, "t": 1.0},
              {"event": "start", "round": 0, "t": 1.5}, {"event": "start", "round": 1, "t": 4.0},
              {"event": "start", "round": 2, "t": 6.5}]
    assert ds.round_intervals(events) == {0: 4.0, 1: 2.5}
    assert ds.round_stamps(events) == {0: (0.0, 4.0), 1: (4.0, 6.5)}
    assert ds.steady([9.0, 2.0, 4.0]) == 3.0 and ds.steady([5.0]) == 5.0


def test_flower_error_bound():
    # one quantisation level (16 / 2**22) times max_weight / num_examples, up to the rounded ratio
    assert ds.flower_error_bound() == pytest.approx(16 / 2**22 * 1000, rel=1e-3)


def test_polling_bench_helpers():
    """benchmarks.deployment_polling: settings parse (bad ones name the fix) and the
    /proc/stat busy fraction is a fraction that sees a busy core."""
    import argparse
    import os
    import threading
    import time

    from benchmarks import deployment_polling as dp

    assert dp.parse_setting("memory:0.5") == ("memory", 0.5)
    assert dp.parse_setting("file:0.1") == ("file", 0.1)
    for bad in ("disk:0.5", "memory", "memory:", "memory:fast", "memory:-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="STATE:POLL"):
            dp.parse_setting(bad)
    if not os.path.exists("/proc/stat"):
        pytest.skip("Linux only")
    stop = time.monotonic() + 0.6

    def burn():
        while time.monotonic() < stop:
            pass

    spin = threading.Thread(target=burn)
    spin.start()
    busy = dp.busy_fraction(0.5)
    spin.join()
    assert 0.0 <= busy <= 1.0
    assert busy >= 0.5 / (os.cpu_count() or 1) * 0.5  # at least half of one core of all cores


def test_rows_pool_steady_rounds_of_every_repeat():
    cfg = ds.configurations(10, neighbours=(4,))[0]
    theirs = [{"rounds_s": [30.0, 10.0, 12.0], "rounds_cpu_s": [40.0, 20.0, 22.0], "max_error": 1e-3, "repeat": 0},
              {"rounds_s": [30.0, 14.0, 16.0], "rounds_cpu_s": [40.0, 24.0, 26.0], "max_error": 2e-3, "repeat": 1}]
    ours = [{"rounds_s": [50.0, 5.0, 7.0], "rounds_cpu_s": [60.0, 10.0, 12.0], "centres_equal_in_process": True,
             "max_abs_vs_unprotected": 1e-8, "repeat": 0},
            {"rounds_s": [50.0, 9.0, 11.0], "rounds_cpu_s": [60.0, 14.0, 16.0], "centres_equal_in_process": False,
             "max_abs_vs_unprotected": 2e-8, "repeat": 1}]
    row = ds._row("warm", cfg, 10, 10_000, 0.05, theirs, ours)
    # first rounds skipped, the rest pooled: median(10, 12, 14, 16) = 13, median(5, 7, 9, 11) = 8
    assert row["flower_round_s"] == 13.0 and row["ours_round_s"] == 8.0 and row["ratio"] == 8.0 / 13.0
    assert row["flower_round_cpu_s"] == 23.0 and row["ours_round_cpu_s"] == 13.0
    assert row["ratio_per_repeat"] == [6.0 / 11.0, 10.0 / 15.0] and row["repeats"] == 2
    assert row["ours_exact"] is False and row["flower_max_error"] == 2e-3  # the worst run counts
    no_cpu = ds._row("warm", cfg, 10, 10_000, 0.05, [{**t, "rounds_cpu_s": []} for t in theirs], ours)
    assert "cpu_ratio" not in no_cpu
    # a repeat in which one side failed (here Flower's repeat 0) gives no per-repeat ratio
    tagged = ds._row("warm", cfg, 10, 10_000, 0.05, [theirs[1]], ours)
    assert tagged["ratio_per_repeat"] == [10.0 / 15.0]


def test_tree_cpu_counts_live_and_finished_children():
    import subprocess
    import sys
    import time

    from benchmarks import _tree_cpu

    if not _tree_cpu.available():
        pytest.skip("Linux /proc only")
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < {}: pass\n{}"
    before = _tree_cpu.descendants_cpu_seconds()
    subprocess.run([sys.executable, "-c", burn.format(0.4, "")], check=True)  # finished, reaped by us
    finished = _tree_cpu.descendants_cpu_seconds() - before
    assert 0.35 <= finished <= 5.0
    base = _tree_cpu.descendants_cpu_seconds()
    live = subprocess.Popen([sys.executable, "-c", burn.format(0.4, "time.sleep(30)")])
    try:
        with _tree_cpu.CpuSampler(interval=0.05) as sampler:
            deadline = time.monotonic() + 20
            while sampler.cpu[-1] - base < 0.35 and time.monotonic() < deadline:
                time.sleep(0.05)  # the sleeping child's burnt CPU shows while it is alive
            t_mid = sampler.times[-1]
        assert live.poll() is None and sampler.cpu[-1] - base >= 0.35
        assert sampler.between(sampler.times[0], t_mid) == pytest.approx(sampler.at(t_mid) - sampler.cpu[0])
        assert sampler.at(sampler.times[0] - 10) == sampler.cpu[0] and sampler.at(time.time() + 10) == sampler.cpu[-1]
    finally:
        live.kill()
        live.wait()


def test_cpu_sampler_interpolates_between_samples():
    from benchmarks._tree_cpu import CpuSampler

    s = CpuSampler()
    s.times, s.cpu = [0.0, 1.0, 3.0], [10.0, 12.0, 16.0]
    assert s.at(0.5) == 11.0 and s.at(2.0) == 14.0 and s.between(0.5, 2.0) == 3.0


def test_cli_part_deployment_runs_the_comparison_only_when_named(monkeypatch):
    """`python -m benchmarks protocols --part deployment` runs this benchmark (4 repeats, one with
    --quick); `--part all` does not start a deployment."""
    import argparse

    import benchmarks as bench

    calls = []
    monkeypatch.setattr(ds, "run", lambda **kw: calls.append(kw))
    bench.main(argparse.Namespace(bench="protocols", part="deployment", quick=False))
    bench.main(argparse.Namespace(bench="protocols", part="deployment", quick=True))
    assert calls == [{"rounds": 4, "repeats": 4}, {"rounds": 2, "repeats": 1}]
    from benchmarks import (
        protocols_dp,
        protocols_masking,
        protocols_paillier,
        protocols_secaggplus,
    )

    ran = []
    for mod in (protocols_dp, protocols_masking, protocols_paillier, protocols_secaggplus):
        monkeypatch.setattr(mod, "run", lambda *a, _m=mod.__name__, **kw: ran.append(_m))
    bench.main(argparse.Namespace(bench="protocols", part="all", quick=True))
    assert len(ran) == 4 and len(calls) == 2  # the other parts ran, no deployment started


def test_repeats_must_be_positive(capsys):
    for bad in ("0", "-2", "two"):
        with pytest.raises(SystemExit):
            ds.main(["--repeats", bad])
        assert "--repeats needs a whole number >= 1" in capsys.readouterr().err
