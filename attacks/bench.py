"""The attack/defence benchmark: algorithms x protection stacks x attacks, leakage next to utility.

``securefkm bench attacks [--quick] [--out DIR] [--seeds N] [--jobs N --backend processes|ray]``
calls :func:`cli_run`; from Python, :func:`run_benchmark` takes a :class:`BenchConfig` (or a
dict of its fields) and returns the rows (dicts). What is run, and how one cell runs, is in
:mod:`attacks.matrix`; the HTML report in :mod:`attacks.html_report`.

Every row is one (dataset, algorithm, stack, attack, seed):

* leakage: records recovered exactly (within 1e-6 of the data range), the fraction of the
  attacked records, the fraction of attacked clients exposed, precision of the claims, rounds
  the attack read or ran; membership AUC / advantage for ``membership``;
* utility: ``utility`` = (best inertia of ``central_runs`` scikit-learn k-means runs on the
  pooled training records) / (inertia of the federated centres on them): 1 = as good as
  central k-means; ``ari`` against the labels where the data has labels;
* privacy spent: ``privacy_spent_`` (epsilon, delta) of the fit, empty without DP;
* ``status``: ``ok``, ``not applicable: <reason>`` (the attack does not apply, or the stack
  refuses the algorithm) or ``error: <exception>``. No cell is blank.

The DP audit is one row per (DP stack, seed) with ``attack = "dp-audit"``: the empirical
epsilon lower bound of the stack's Gaussian mechanism next to the accounted epsilon.

Resumable and parallel: the cells run through :func:`securefkm.sweep.run_sweep`, cached
in ``<out>/cache/`` by a hash of the cell, so an interrupted run re-run with the same ``--out``
computes only what is missing (and retries cells that ended in an error), and ``--jobs 2``
gives the same CSV as ``--jobs 1``. Written at
the end: ``attacks.csv`` (all rows, configuration order), ``summary.csv`` (mean and standard
error over seeds), ``summary.md`` (the same as markdown, one line per fit: utility and the
records each attack recovered) and ``report.html`` (one self-contained page).
"""

from __future__ import annotations

import csv
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from securefkm.exceptions import InputError

from . import matrix
from .matrix import ATTACKS, default_algorithms, default_stacks, dp_layers

KEY = ("dataset", "algorithm", "stack", "attack", "seed")
COLUMNS = KEY + (
    "status", "records_recovered", "n_records", "fraction_recovered", "clients_exposed", "precision", "rounds_used",
    "detected", "membership_auc", "membership_advantage", "poison_displacement", "poison_utility", "poison_ari",
    "poison_detected", "audit_epsilon", "claimed_epsilon",
    "utility", "ari", "inertia", "central_inertia", "central_ari", "epsilon", "delta",
    "fit_seconds", "attack_seconds",
)
AUDIT = "dp-audit"
CRYPTO = ("real", "ideal")


def _blobs_small():
    return {"name": "blobs-small", "split": "non-iid", "n_clients": 20}


def default_datasets(large: bool = True) -> list[dict]:
    """The DWF 5-blob set; digits, wine, breast cancer (scaled into [-1, 1] by public
    ranges, :mod:`securefkm.datasets.real`) split IID and label-skewed (Dirichlet 0.3); with
    ``large`` the 100,000-record set over 1,000 clients."""
    out = [{"name": "dwf-blobs", "split": "non-iid", "n_clients": 100, "n_clusters": 5}]
    for name, n in (("digits-unit", 50), ("wine", 10), ("breast-cancer", 20)):
        out.append({"name": name, "split": "iid", "n_clients": n})
        out.append({"name": name, "split": "dirichlet", "n_clients": n, "alpha": 0.3})
    if large:
        out.append({"name": "blobs-large", "split": "dirichlet", "n_clients": 1000, "n_samples": 100_000})
    return out


@dataclass
class BenchConfig:
    """What to run. ``datasets``: dicts ``{"name", "split", "n_clients", ...}`` (names:
    :data:`attacks.matrix.BOXES`; other keys go to the loader); ``algorithms``: registry
    names, ``"<name>+secure"`` for the secure mode of a set-valued one; ``stacks``: {label:
    list of registry specs}; ``attacks``: :data:`attacks.matrix.ATTACKS`; ``audit``: run the
    DP audit on every DP stack; ``seeds``; ``max_rounds`` of every fit; ``active_rounds``:
    cap on an active attack's rounds; ``crypto``: "ideal" (default: the secure aggregators'
    ideal functionality, proven to release the same as the real protocol by tests/test_ideal.py,
    docs/protocols/ideal-functionality.md) or "real"; ``jobs`` / ``backend``: parallel sweep; ``out``: output directory."""

    datasets: list = field(default_factory=lambda: [_blobs_small()])
    algorithms: list = field(default_factory=lambda: ["dwf", "kfed", "kfed+secure", "fcm-fedavg"])
    stacks: dict = field(default_factory=lambda: default_stacks())
    attacks: list = field(default_factory=lambda: list(ATTACKS))
    audit: bool = True
    seeds: list = field(default_factory=lambda: [0])
    max_rounds: int = 15
    active_rounds: int = 60
    central_runs: int = 5
    audit_trials: int = 20000
    crypto: str = "ideal"
    jobs: int = 1
    backend: str = "processes"
    out: str = "bench-attacks"
    progress: bool = True
    report: bool = True
    command: str = ""


def quick_config(out: str = "bench-attacks", seeds: int | None = None) -> BenchConfig:
    """CI size (<= 3 minutes): blobs-small (20 non-IID clients); DWF, k-FED plain and secure,
    fedavg FCM; stacks none / MinClusterSize / masking / masking without broadcast binding
    (to show what binding stops) / central DP / distributed DP + masking; passive attacks,
    crafted centroids, model inconsistency, membership; the DP audit with 20,000 trials."""
    stacks = {
        "none": [],
        "min-cluster(2)": [{"name": "min-cluster", "p": 2}],
        "masking": ["masking"],
        "masking(unbound)": [{"name": "masking", "bind_broadcast": False}],
        "dp-central(eps=1)": [matrix.dp_spec(1.0, "central")],
        "dp(eps=1)+masking": [matrix.dp_spec(1.0), "masking"],
    }
    attacks = ["small-cluster", "differencing", "aggregate-differencing", "fuzzy-equations", "crafted-centroids",
               "model-inconsistency", "membership", "poisoning", "poisoning-out-of-range"]
    return BenchConfig(stacks=stacks, attacks=attacks, seeds=list(range(seeds or 1)), out=out, max_rounds=10,
                       active_rounds=40, audit_trials=20000)


def full_config(out: str = "bench-attacks", seeds: int | None = None) -> BenchConfig:
    """The documented run: :func:`default_datasets`, every algorithm (set-valued ones also
    secure), :func:`attacks.matrix.default_stacks` at epsilon 0.5 / 1 / 4, every attack,
    the DP audit, 3 seeds."""
    return BenchConfig(datasets=default_datasets(), algorithms=default_algorithms(),
                       stacks=default_stacks(epsilons=(0.5, 1.0, 4.0)), seeds=list(range(seeds or 3)), out=out,
                       max_rounds=30, active_rounds=120)


def _check_config(config) -> BenchConfig:
    if isinstance(config, dict):
        config = BenchConfig(**config)
    if not isinstance(config, BenchConfig):
        raise InputError(f"config must be a BenchConfig or a dict of its fields, got {type(config).__name__}.")
    for a in config.attacks:
        if a not in ATTACKS:
            raise InputError(f"unknown attack {a!r} in config.attacks; choose from {', '.join(ATTACKS)}.")
    if not isinstance(config.stacks, dict) or not config.stacks:
        raise InputError("config.stacks must be a non-empty dict {label: list of layer specs}.")
    if config.crypto not in CRYPTO:
        raise InputError(f"config.crypto must be one of {CRYPTO}, got {config.crypto!r}.")
    from securefkm.registry import estimator_class

    for alg in config.algorithms:
        estimator_class(matrix.split_algorithm(alg)[0])  # unknown names fail before any work
    for ds in config.datasets:
        if not isinstance(ds, dict) or ds.get("name") not in matrix.BOXES:
            raise InputError(f"config.datasets: {ds!r} is not a dict with a known 'name' ({', '.join(matrix.BOXES)}).")
    return config


# ------------------------------------------------------------------ cells
def _cells(cfg: BenchConfig):
    central = [{"dataset": ds, "seed": s, "runs": cfg.central_runs} for ds in cfg.datasets for s in cfg.seeds]
    audits = []
    if cfg.audit:
        for label, specs in cfg.stacks.items():
            for layer in dp_layers(specs):
                for s in cfg.seeds:
                    audits.append({"stack": label, "layer": {k: layer[k] for k in ("epsilon", "delta", "mode")},
                                   "seed": s, "trials": cfg.audit_trials})
    return central, audits


def _fit_cells(cfg: BenchConfig, central: dict) -> list[dict]:
    cells = []
    for ds in cfg.datasets:
        for alg in cfg.algorithms:
            for label, specs in cfg.stacks.items():
                for s in cfg.seeds:
                    cells.append({"dataset": ds, "algorithm": alg, "stack": label, "specs": specs, "seed": s,
                                  "attacks": list(cfg.attacks), "max_rounds": cfg.max_rounds,
                                  "active_rounds": cfg.active_rounds, "crypto": cfg.crypto,
                                  "central": central[(matrix.dataset_label(ds), s)]})
                    if matrix.plans_dp_rounds(alg, specs):  # only these cells' keys change
                        cells[-1]["dp_planned"] = True
    return cells


def run_benchmark(config) -> list[dict]:
    """Run (or read from the cache) every cell; write ``attacks.csv``, ``summary.csv``,
    ``summary.md`` (one markdown line per fit, for docs) and ``report.html`` in ``config.out``;
    return the rows."""
    from securefkm.sweep import run_sweep

    cfg = _check_config(config)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "cache"
    _forget_errors(cache)
    sweep = {"jobs": cfg.jobs, "backend": cfg.backend, "cache_dir": cache, "progress": cfg.progress}
    t0 = time.perf_counter()
    central_cells, audit_cells = _cells(cfg)
    refs = run_sweep(matrix.central_cell, central_cells, desc="central k-means", **sweep)
    central = {(matrix.dataset_label(c["dataset"]), c["seed"]): r for c, r in zip(central_cells, refs)}
    fit_cells = _fit_cells(cfg, central)
    rows = [r for rs in run_sweep(matrix.fit_cell, fit_cells, desc="bench attacks", **sweep) for r in rs]
    for c, r in zip(audit_cells, run_sweep(matrix.audit_cell, audit_cells, desc="dp audit", **sweep)):
        rows.append({"dataset": "-", "algorithm": "gaussian-dp-round", "stack": c["stack"], "attack": AUDIT,
                     "seed": c["seed"], "status": matrix.STATUS_OK, "epsilon": c["layer"]["epsilon"],
                     "delta": c["layer"]["delta"], "audit_epsilon": r["audit_epsilon"],
                     "claimed_epsilon": r["claimed_epsilon"], "attack_seconds": r["audit_seconds"]})
    write_csv(out / "attacks.csv", rows)
    from .html_report import (
        stack_order,
        summarise,
        summary_markdown,
        write_report,
        write_summary_csv,
    )

    summary = summarise(rows)
    write_summary_csv(out / "summary.csv", summary)
    (out / "summary.md").write_text(summary_markdown(summary, [a for a in cfg.attacks if a != AUDIT],
                                                     stack_order(cfg.stacks)))
    if cfg.report:
        write_report(out / "report.html", rows, summary, cfg_dict(cfg), wall_seconds=time.perf_counter() - t0,
                     membership_candidates=membership_candidate_counts(cfg, cache))
    return rows


def membership_candidate_counts(cfg: BenchConfig, cache=None) -> dict:
    """{dataset label: [candidates per side, one per seed]} of the membership attack (the
    records held out of the fit; as many members are drawn), for the report's chance levels.
    Cached like the cells (``cache``: the run's cache directory), so a resumed run loads no data."""
    from securefkm.sweep import run_sweep

    if "membership" not in cfg.attacks:
        return {}
    cells = [{"dataset": ds, "seed": s} for ds in cfg.datasets for s in cfg.seeds]
    counts = run_sweep(held_out_count_cell, cells, cache_dir=cache, progress=False)
    out: dict = {}
    for c, n in zip(cells, counts):
        out.setdefault(matrix.dataset_label(c["dataset"]), []).append(int(n))
    return out


def held_out_count_cell(cell: dict) -> int:
    """Records held out of the fits of (dataset, seed): the membership attack's non-members."""
    return len(matrix.load(cell["dataset"], cell["seed"])[3])


def _forget_errors(cache: Path) -> None:
    """Cells whose rows recorded an ``error: ...`` are retried on the next call: their cache
    entries are removed (refusals and not-applicable cells are final and stay cached)."""
    if not cache.is_dir():
        return
    for path in cache.glob("*.json"):
        text = path.read_text()
        if '"status":"error' in text:
            path.unlink()


def cfg_dict(cfg: BenchConfig) -> dict:
    d = asdict(cfg)
    d["datasets"] = [matrix.dataset_label(ds) for ds in cfg.datasets]
    return d


# ------------------------------------------------------------------ CSV
def _fmt(v):
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.6g}"
    return v


def write_csv(path, rows) -> None:
    with Path(path).open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(r.get(k)) for k in COLUMNS})


def read_rows(path) -> list[dict]:
    """Rows of a benchmark CSV, as strings."""
    with Path(path).open(newline="") as f:
        return list(csv.DictReader(f))


def cli_run(quick: bool = False, out: str = "bench-attacks", seeds: int | None = None, jobs: int = 1,
            backend: str = "processes", datasets=None, algorithms=None, stacks=None, no_large: bool = False,
            crypto: str = "ideal") -> list[dict]:
    """``securefkm bench attacks``: quick (CI) or full configuration, optionally narrowed to
    some datasets (names or labels), algorithms or stacks; prints where the report is."""
    cfg = quick_config(out, seeds) if quick else full_config(out, seeds)
    if no_large:
        cfg.datasets = [d for d in cfg.datasets if d["name"] != "blobs-large"]
    if datasets:
        cfg.datasets = [d for d in cfg.datasets if d["name"] in datasets or matrix.dataset_label(d) in datasets]
    if algorithms:
        cfg.algorithms = [a for a in cfg.algorithms if a in algorithms]
    if stacks:
        cfg.stacks = {k: v for k, v in cfg.stacks.items() if k in stacks}
    if not (cfg.datasets and cfg.algorithms and cfg.stacks):
        raise InputError("--datasets / --algorithms / --stacks left nothing to run; check the names "
                         f"(algorithms: {', '.join(default_algorithms())}).")
    cfg.jobs, cfg.backend, cfg.crypto = jobs, backend, crypto
    cfg.command = "securefkm " + " ".join(sys.argv[1:]) if sys.argv[1:] else "securefkm bench attacks"
    t0 = time.perf_counter()
    rows = run_benchmark(cfg)
    n_na = sum(r["status"].startswith("not applicable") for r in rows)
    n_err = sum(r["status"].startswith("error") for r in rows)
    print(f"{len(rows)} rows ({n_na} not applicable, {n_err} errors) in {Path(out) / 'attacks.csv'}; "
          f"summary.csv, summary.md, report.html beside it; {time.perf_counter() - t0:.1f} s this call")
    return rows


__all__ = ["AUDIT", "BenchConfig", "COLUMNS", "cli_run", "default_datasets", "full_config", "quick_config",
           "read_rows", "run_benchmark", "write_csv"]
