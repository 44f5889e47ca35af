"""The attack/defence benchmark: quick mode's table content and resumability."""

import csv

import pytest

from attacks.bench import (
    COLUMNS,
    BenchConfig,
    available_extras,
    quick_config,
    run_benchmark,
)
from securefkm.exceptions import InputError

pytest.importorskip("protocols")


def _rows(rows, **kw):
    return [r for r in rows if all(r[k] == v for k, v in kw.items())]


def _n(r, key="records_recovered"):
    return float(r[key]) if r[key] not in ("", "-") else 0.0


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    cfg = quick_config(str(out))
    cfg.progress = False
    return cfg, run_benchmark(cfg), out


def test_quick_table_content(quick):
    cfg, rows, out = quick
    assert rows and not [r for r in rows if r["error"] and not r["error"].startswith("refused")]
    # DP refuses k-FED's plain set-fields: recorded as refused, not run
    assert all(r["error"].startswith("refused") for r in _rows(rows, algorithm="kfed", stack="dp(eps=1)+masking"))
    # unprotected DWF leaks exact records, with full precision
    plain = _rows(rows, algorithm="dwf", stack="none", attack="differencing")[0]
    assert _n(plain) > 0 and float(plain["precision"]) > 0.99
    # masking: per-client passive attacks on sum-fields recover nothing
    for attack in ("small-cluster", "differencing"):
        for alg in ("dwf", "fcm-fedavg"):
            assert _n(_rows(rows, algorithm=alg, stack="masking", attack=attack)[0]) == 0
    # ...k-FED's set-fields cannot be masked: the stack is refused (not run with a false claim)
    assert all(r["error"].startswith("refused") for r in _rows(rows, algorithm="kfed", stack="masking"))
    assert _n(_rows(rows, algorithm="kfed", stack="none", attack="small-cluster")[0]) > 0
    assert _n(_rows(rows, algorithm="kfed", stack="min-cluster(2)", attack="small-cluster")[0]) == 0
    # the fuzzy equation solver on plain fedavg FCM
    assert _rows(rows, algorithm="fcm-fedavg", stack="none", attack="fuzzy-equations")
    # DP: no exact record by any attack; privacy spent recorded within the target
    dp = [r for r in rows if r["stack"].startswith("dp") and not r["error"]]
    assert dp and all(_n(r) == 0 for r in dp)
    assert all(0 < float(r["epsilon"]) <= 1.0 + 1e-6 for r in dp)
    # utility next to leakage: close to central k-means without DP
    assert float(plain["utility"]) > 0.9
    assert all(r["epsilon"] == "-" for r in _rows(rows, stack="none"))
    # active: crafted centroids on plain DWF recover the target's records
    cc = _rows(rows, algorithm="dwf", stack="none", attack="crafted-centroids")[0]
    assert _n(cc) > 0 and float(cc["precision"]) == 1.0
    # membership inference on the released centres (when attacks.membership exists)
    mi = [r for r in rows if r["attack"] == "membership" and not r["error"]]
    if "membership" in available_extras():
        assert mi and all(0.0 <= float(r["membership_auc"]) <= 1.0 for r in mi)
    md = (out / "attacks.md").read_text()
    assert md.startswith("| dataset | algorithm | stack | attack | seed |") and "differencing" in md
    assert (out / "frontier.png").stat().st_size > 1000 and (out / "reconstruction.png").stat().st_size > 1000


def test_quick_is_resumable(quick):
    cfg, rows, out = quick
    lines = (out / "attacks.csv").read_text().count("\n")
    again = run_benchmark(cfg)
    assert len(again) == len(rows)  # nothing re-run
    assert (out / "attacks.csv").read_text().count("\n") == lines  # nothing appended
    with (out / "attacks.csv").open() as f:
        assert next(csv.reader(f)) == list(COLUMNS)


def test_config_validation(tmp_path):
    with pytest.raises(InputError, match="attack"):
        run_benchmark(BenchConfig(attacks=["nope"], out=str(tmp_path)))
    with pytest.raises(InputError, match="algorithm"):
        run_benchmark({"algorithms": ["nope"], "out": str(tmp_path), "progress": False})
