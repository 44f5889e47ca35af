"""The attack/defence benchmark: quick mode's guards, every cell present in the CSV
and the HTML report, resume from the cache, parallel output equal to serial."""

import csv
import re

import pytest

from attacks import matrix
from attacks.bench import AUDIT, COLUMNS, BenchConfig, quick_config, read_rows, run_benchmark
from securefkm.exceptions import InputError

pytest.importorskip("protocols")

TIMING = ("fit_seconds", "attack_seconds")


def _rows(rows, **kw):
    return [r for r in rows if all(r[k] == v for k, v in kw.items())]


def _one(rows, **kw):
    (r,) = _rows(rows, **kw)
    return r


def _n(r, key="records_recovered"):
    assert r["status"] == "ok", r["status"]
    return float(r[key])


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    cfg = quick_config(str(out))
    cfg.progress = False
    return cfg, run_benchmark(cfg), out


def test_guard_plaintext_dwf_differencing_recovers_records(quick):
    rows = read_rows(quick[2] / "attacks.csv")
    plain = _one(rows, algorithm="dwf", stack="none", attack="differencing")
    assert _n(plain) >= 5 and float(plain["precision"]) > 0.99
    cc = _one(rows, algorithm="dwf", stack="none", attack="crafted-centroids")
    assert _n(cc) == float(cc["n_records"]) > 0  # the target's records, all of them
    assert float(plain["utility"]) > 0.95 and plain["epsilon"] == ""


def test_guard_masking_gives_no_exact_recovery_to_passive_attacks(quick):
    _, rows, out = quick
    rows = read_rows(out / "attacks.csv")
    masked = [r for r in rows if "masking" in r["stack"] and r["attack"] in matrix.PASSIVE and r["status"] == "ok"]
    assert {r["algorithm"] for r in masked} == {"dwf", "kfed+secure", "fcm-fedavg"}
    assert all(_n(r) == 0 for r in masked)
    # the same attacks do recover records of those algorithms without protection
    for alg in ("dwf", "kfed+secure", "fcm-fedavg"):
        assert _n(_one(rows, algorithm=alg, stack="none", attack="small-cluster")) > 0


def test_guard_binding_stops_model_inconsistency(quick):
    rows = read_rows(quick[2] / "attacks.csv")
    bound = _one(rows, algorithm="dwf", stack="masking", attack="model-inconsistency")
    unbound = _one(rows, algorithm="dwf", stack="masking(unbound)", attack="model-inconsistency")
    assert _n(bound) == 0 and bound["detected"] == "True"
    assert _n(unbound) == float(unbound["n_records"]) > 0 and unbound["detected"] == "False"


def test_guard_dp_audit_stays_below_the_accountant(quick):
    cfg, _, out = quick
    rows = read_rows(out / "attacks.csv")
    audits = _rows(rows, attack=AUDIT)
    dp_stacks = {k for k, v in cfg.stacks.items() if matrix.dp_layers(v)}
    assert {r["stack"] for r in audits} == dp_stacks
    for r in audits:
        # (the game's noise is not seeded yet, so the bound itself varies run to run: ~0.06-0.6 at eps 1)
        assert 0.0 <= float(r["audit_epsilon"]) <= float(r["claimed_epsilon"]) <= float(r["epsilon"]) + 1e-9
    # every DP fit spent at most its target, and no exact record leaks through DP + masking
    for r in rows:
        if r["stack"] == "dp(eps=1)+masking" and r["status"] == "ok" and r["attack"] in matrix.PASSIVE:
            assert 0 < float(r["epsilon"]) <= 1.0 + 1e-9 and _n(r) == 0


def test_every_configured_cell_has_numbers_or_a_reason(quick):
    cfg, _, out = quick
    rows = read_rows(out / "attacks.csv")
    with (out / "attacks.csv").open() as f:
        assert next(csv.reader(f)) == list(COLUMNS)
    want = {(matrix.dataset_label(d), a, s, at, str(seed)) for d in cfg.datasets for a in cfg.algorithms
            for s in cfg.stacks for at in cfg.attacks for seed in cfg.seeds}
    got = {tuple(r[k] for k in ("dataset", "algorithm", "stack", "attack", "seed")) for r in rows if r["attack"] != AUDIT}
    assert got == want and len(rows) == len(want) + len(_rows(rows, attack=AUDIT))
    for r in rows:
        assert r["status"] == "ok" or r["status"].startswith("not applicable: "), r["status"]
        if r["status"] == "ok" and r["attack"] != AUDIT:
            assert r["utility"] and (r["records_recovered"] or r["membership_auc"] or r["poison_displacement"])
    # refusals are explicit and say why
    r = _one(rows, algorithm="kfed", stack="masking", attack="differencing")
    assert r["status"].startswith("not applicable: the stack refuses the algorithm") and "secure_mode" in r["status"]
    assert "fuzzy c-means" in _one(rows, algorithm="dwf", stack="none", attack="fuzzy-equations")["status"]
    # ARI where the data has labels; utility of the secure mode next to the plain one
    assert float(_one(rows, algorithm="kfed+secure", stack="masking", attack="differencing")["ari"]) > 0.5


def test_report_html_is_self_contained_and_lists_every_cell(quick):
    cfg, _, out = quick
    page = (out / "report.html").read_text()
    # offline: nothing fetched, one inline script (the table's sorting and filtering)
    assert "src='http" not in page and "<script src" not in page and page.count("<script>") == 1
    imgs = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    # per data set: records recovered, membership, privacy-utility; and the audit figure
    assert len(imgs) == 3 * len(cfg.datasets) + 1 and all(len(i) > 2000 for i in imgs)
    cells = set(re.findall(r"data-cell='([^']*)'", page))
    for d in cfg.datasets:
        for a in cfg.algorithms:
            for s in cfg.stacks:
                for at in cfg.attacks:
                    assert f"{matrix.dataset_label(d)}|{a}|{s}|{at}" in cells
    for s in ("dp-central(eps=1)", "dp(eps=1)+masking"):
        assert f"-|gaussian-dp-round|{s}|{AUDIT}" in cells
    assert "Versions: python" in page and "scikit-learn" in page and "Command:" in page
    summary = list(csv.DictReader((out / "summary.csv").open()))
    assert len(summary) == len(cells)


def test_summary_markdown_has_one_line_per_fit(quick):
    cfg, rows, out = quick
    lines = (out / "summary.md").read_text().splitlines()[2:]
    fits = {(matrix.dataset_label(d), a, s) for d in cfg.datasets for a in cfg.algorithms for s in cfg.stacks}
    assert {tuple(c.strip() for c in line.split("|")[1:4]) for line in lines} == fits and len(lines) == len(fits)
    # the guard's finding, as a reader of the docs sees it: plaintext DWF differencing recovers records
    dwf = next(line for line in lines if "| dwf | none |" in line)
    col = ["dataset", "algorithm", "stack", "utility", "ARI", "eps spent", *[a for a in cfg.attacks if a != AUDIT]]
    assert float(dwf.split("|")[1:-1][col.index("differencing")]) > 0


def test_resume_reads_the_cache(quick, monkeypatch):
    cfg, rows, out = quick
    before = (out / "attacks.csv").read_text()
    calls = []
    real_load = matrix.load
    monkeypatch.setattr(matrix, "load", lambda *a, **k: calls.append(a) or real_load(*a, **k))
    # an interrupted run: one fit cell's result never reached the cache
    victim = next(p for p in (out / "cache").glob("*.json")
                  if '"algorithm":"dwf"' in p.read_text() and '"stack":"masking"' in p.read_text())
    victim.unlink()
    again = run_benchmark(cfg)
    assert len(calls) == 1  # only the missing cell was computed
    strip = lambda text: [{k: v for k, v in r.items() if k not in TIMING} for r in csv.DictReader(text.splitlines())]  # noqa: E731
    assert strip((out / "attacks.csv").read_text()) == strip(before) and len(again) == len(rows)


def test_parallel_sweep_equals_serial(tmp_path):
    cfg = dict(stacks={"none": [], "masking": ["masking"]}, algorithms=["dwf"], attacks=["differencing"],
               seeds=[0, 1], max_rounds=4, audit=False, progress=False, report=False)
    serial = run_benchmark({**cfg, "out": str(tmp_path / "a")})
    parallel = run_benchmark({**cfg, "out": str(tmp_path / "b"), "jobs": 2})
    drop = lambda rows: [{k: v for k, v in r.items() if k not in TIMING} for r in rows]  # noqa: E731
    assert drop(parallel) == drop(serial) and len(serial) == 4


def test_config_validation(tmp_path):
    with pytest.raises(InputError, match="attack"):
        run_benchmark(BenchConfig(attacks=["nope"], out=str(tmp_path)))
    with pytest.raises(InputError, match="algorithm"):
        run_benchmark({"algorithms": ["nope"], "out": str(tmp_path), "progress": False})
    with pytest.raises(InputError, match="secure"):
        run_benchmark({"algorithms": ["dwf+secure"], "out": str(tmp_path), "progress": False})
    with pytest.raises(InputError, match="crypto"):
        run_benchmark({"crypto": "fake", "out": str(tmp_path), "progress": False})


def test_cli_flags_reach_the_sweep(tmp_path, capsys):
    from securefkm.cli import main

    assert main(["bench", "attacks", "--quick", "--out", str(tmp_path), "--jobs", "0"]) == 2
    assert "jobs must be an int >= 1" in capsys.readouterr().err
    assert main(["bench", "attacks", "--quick", "--out", str(tmp_path), "--algorithms", "nope"]) == 2
    assert "left nothing to run" in capsys.readouterr().err
