"""``securefkm demo``: unprotected vs the recommended stack, side by side."""

from __future__ import annotations

import pytest

from securefkm.demo import run_demo


def test_demo_shows_utility_kept_and_attacks_stopped(tmp_path):
    lines = []
    res = run_demo(n_clients=20, plot_path=tmp_path / "demo.png", verbose=0, out=lines.append)
    central, plain, protected = res["rows"]
    assert plain.score / central.score < 1.01 and protected.score / central.score < 1.1
    # the malicious server reads client 0's records one by one in plain, none under masking + DP
    assert plain.active[0] >= 100  # 149 of client 0's 629 records in the 100-round budget (seed 0)
    assert protected.active[0] == 0 and protected.passive[0] == 0
    assert plain.epsilon is None and protected.epsilon == pytest.approx(1.0, rel=0.02)
    table = "\n".join(lines)
    assert "GaussianDP + PairwiseMasking" in table and "passive: records recovered" in table
    assert (tmp_path / "demo.png").stat().st_size > 30_000


@pytest.mark.parametrize("protection, stack", [
    (["masking"], "PairwiseMasking"),
    (["paillier"], "Paillier"),
    ([{"name": "dp", "epsilon": 1, "delta": 1e-5, "bounds": [-2, 2], "mode": "distributed"}, "masking"],
     "GaussianDP + PairwiseMasking"),
    ([{"name": "dp", "epsilon": 1, "delta": 1e-5, "clip": 3, "mode": "central"}], "GaussianDP"),
])
def test_demo_runs_each_documented_protection(protection, stack):
    """The data box comes from GaussianDP's bounds or the demo set's box, never from a
    layer attribute that happens to be called ``bounds``."""
    lines = []
    res = run_demo(n_clients=10, plot_path=None, verbose=0, protection=protection, out=lines.append)
    assert len(res["rows"]) == 3 and f"DWF federated + {stack} " in "\n".join(lines)
    assert res["estimators"][f"DWF federated + {stack}"].transcript_.meta["init_bounds"] == (-2.0, 2.0)
