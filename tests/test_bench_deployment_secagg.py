"""Pure helpers of securefkm.bench.deployment_secagg (no processes are started here)."""

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from securefkm.bench import deployment_secagg as ds


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
    assert ds.steady([9.0, 2.0, 4.0]) == 3.0 and ds.steady([5.0]) == 5.0


def test_flower_error_bound():
    # one quantisation level (16 / 2**22) times max_weight / num_examples, up to the rounded ratio
    assert ds.flower_error_bound() == pytest.approx(16 / 2**22 * 1000, rel=1e-3)


def test_polling_bench_helpers():
    """securefkm.bench.deployment_polling: settings parse (bad ones name the fix) and the
    /proc/stat busy fraction is a fraction that sees a busy core."""
    import argparse
    import os
    import threading
    import time

    from securefkm.bench import deployment_polling as dp

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
