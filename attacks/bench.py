"""The attack/defence benchmark: algorithms x protection stacks x attacks, leakage next to utility.

``securefkm bench attacks [--quick] [--out DIR] [--seeds N]`` calls :func:`cli_run`; from
Python, :func:`run_benchmark` takes a :class:`BenchConfig` (or a dict of its fields) and
returns the rows (dicts). Every row is one (dataset, algorithm, stack, attack, seed):

* leakage: records recovered exactly (within 1e-6 of the data range), the fraction of
  the attacked records, the fraction of attacked clients exposed, precision of the
  claims, rounds the attack read or ran; membership AUC / advantage and the audit's
  empirical epsilon lower bound when ``attacks.membership`` / ``attacks.audit`` exist
  (otherwise those columns are left out);
* utility: ``utility`` = (best inertia of ``central_runs`` scikit-learn k-means runs on the
  pooled data) / (inertia of the federated centres on the pooled data): 1 means as good
  as central k-means, lower is worse;
* privacy spent: ``privacy_spent_`` (epsilon, delta) of the fit, or "-".

Resumable: rows are appended to ``<out>/attacks.csv`` as soon as they finish and a
configuration already present there (without an error, or refused by its stack) is
skipped; one that failed is retried and its new row supersedes the old one. At the end the whole
CSV is rendered as ``attacks.md`` and two PNGs are drawn (matplotlib, Agg backend):
``frontier.png`` (utility against protection / epsilon; marker size and colour = the
largest fraction of records any attack recovered) and ``reconstruction.png`` (the claims
of one attack against the true records, for the first unprotected run that leaked).

Passive attacks read the fitted estimator's ``transcript_``; active attacks run their own
federation through the estimator's protection (``attack.evaluate(estimator, dataset)``).
An attack that does not apply to an algorithm or stack (crafted centres need crisp cells
read in plain; model inconsistency targets secure aggregation; the fuzzy solver targets
FCM) produces no row. An exception inside a fit or an attack is recorded in the ``error``
column (and that configuration is retried on the next call).
"""

from __future__ import annotations

import csv
import importlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from securefkm.exceptions import InputError, ProtectionConfigError

#: result columns in table order (membership / audit columns are dropped when unavailable)
KEY = ("dataset", "algorithm", "stack", "attack", "seed")
COLUMNS = KEY + (
    "records_recovered", "n_records", "fraction_recovered", "clients_exposed", "precision", "rounds_used",
    "membership_auc", "membership_advantage", "audit_epsilon",
    "utility", "inertia", "central_inertia", "epsilon", "delta", "fit_seconds", "attack_seconds", "error",
)
OPTIONAL = {"membership_auc": "membership", "membership_advantage": "membership", "audit_epsilon": "audit"}

PASSIVE = ("small-cluster", "differencing", "aggregate-differencing", "fuzzy-equations")
ACTIVE = ("crafted-centroids", "model-inconsistency", "active-aggregate-differencing", "sybil")
EXTRA = ("membership", "audit")
CRISP = ("dwf", "ewf", "minibatch")
FUZZY = ("fcm", "fcm-fedavg")

#: named protection stacks (lists of registry specs); "bounds" of a dp layer default to the
#: dataset's declared box
STACKS: dict[str, list] = {
    "none": [],
    "min-cluster(2)": [{"name": "min-cluster", "p": 2}],
    "masking": ["masking"],
    "dp(eps=1)+masking": [{"name": "dp", "epsilon": 1.0, "delta": 1e-5, "mode": "distributed", "accountant": "rdp"}, "masking"],
}


@dataclass
class BenchConfig:
    """What to run. ``datasets``: names (``"blobs-small"`` -- 400 records, 4 blobs, 20
    non-IID clients, made here -- or any :func:`securefkm.datasets.load_dataset` name) or
    dicts ``{"name": ..., **load_dataset kwargs, "n_clusters": k}``; ``algorithms``: registry
    names or dicts ``{"name": ..., **estimator params}``; ``stacks``: {label: list of
    registry specs}; ``attacks``: names from :data:`PASSIVE`, :data:`ACTIVE`, :data:`EXTRA`;
    ``seeds``: ints (fit, split and attack seed); ``max_rounds``: training rounds of every
    fit; ``active_rounds``: cap on an active attack's rounds; ``out``: output directory."""

    datasets: list = field(default_factory=lambda: ["blobs-small"])
    algorithms: list = field(default_factory=lambda: ["dwf", "kfed", "fcm-fedavg"])
    stacks: dict = field(default_factory=lambda: dict(STACKS))
    attacks: list = field(default_factory=lambda: ["small-cluster", "differencing", "aggregate-differencing",
                                                   "fuzzy-equations", "crafted-centroids", "model-inconsistency",
                                                   "membership", "audit"])
    seeds: list = field(default_factory=lambda: [0])
    max_rounds: int = 15
    active_rounds: int = 60
    central_runs: int = 5
    audit_trials: int = 2000
    out: str = "bench-attacks"
    progress: bool = True
    plots: bool = True


def quick_config(out: str = "bench-attacks", seeds: int | None = None) -> BenchConfig:
    """CI size: blobs-small, DWF + k-FED (set-fields) + fedavg FCM, the four stacks of
    :data:`STACKS`, passive attacks everywhere, crafted centroids on plain DWF and model
    inconsistency under masking, membership inference when it exists; one seed."""
    attacks = ["small-cluster", "differencing", "aggregate-differencing", "fuzzy-equations", "crafted-centroids",
               "model-inconsistency", "membership"]  # the audit's DP game costs ~30 s: full mode only
    return BenchConfig(seeds=list(range(seeds or 1)), out=out, max_rounds=10, active_rounds=40, attacks=attacks)


def full_config(out: str = "bench-attacks", seeds: int | None = None) -> BenchConfig:
    """The documented run: blobs-small and the DWF 5-blob set (100 non-IID clients), more
    algorithms, stacks with epsilon 0.5 / 1 / 4, active attacks with more rounds, 2 seeds."""
    dp = lambda e: {"name": "dp", "epsilon": e, "delta": 1e-5, "mode": "distributed", "accountant": "rdp"}  # noqa: E731
    stacks = dict(STACKS)
    stacks["dp(eps=0.5)+masking"] = [dp(0.5), "masking"]
    stacks["dp(eps=4)+masking"] = [dp(4.0), "masking"]
    return BenchConfig(
        datasets=["blobs-small", {"name": "dwf-blobs", "n_clusters": 5}],
        algorithms=["dwf", "kfed", "fcm", "fcm-fedavg"],
        stacks=stacks, seeds=list(range(seeds or 2)), out=out, max_rounds=30, active_rounds=120,
    )


# ------------------------------------------------------------------ datasets
def _load(spec, seed: int):
    from securefkm.datasets import load_dataset
    from securefkm.datasets.federated import FederatedDataset

    params = {"name": spec} if isinstance(spec, str) else dict(spec)
    name = params.pop("name")
    k = params.pop("n_clusters", None)
    if name == "blobs-small":
        from sklearn.datasets import make_blobs

        X, y = make_blobs(400, centers=4, cluster_std=0.4, center_box=(-3, 3), random_state=1)
        data = FederatedDataset.from_pooled(X, y, split="non-iid", n_clients=params.get("n_clients", 20),
                                            random_state=seed, name="blobs-small")
        k = k or 4
    else:
        data = load_dataset(name, random_state=seed, **params)
        if k is None:
            labels = data.pooled_labels()
            k = len(np.unique(labels)) if labels is not None else 5
    X = data.pooled()
    lo, hi = X.min(axis=0), X.max(axis=0)
    clients, held = _hold_out(data.clients, seed)
    data = FederatedDataset(clients, name=data.name)
    pad = 0.05 * (hi - lo) + 1e-9
    box = (float(np.min(lo - pad)), float(np.max(hi + pad)))  # the declared range (a scalar box)
    return _label(spec), data, int(k), box, held


def _hold_out(clients, seed, fraction=0.1):
    """Remove ~``fraction`` of the records (never a client's last) before any fit: they are
    the non-members of membership inference; the same data serve every attack."""
    rng = np.random.default_rng(10_000 + seed)
    out, held = [], []
    for X in clients:
        X = np.asarray(X, dtype=np.float64)
        take = rng.random(len(X)) < fraction
        if take.all():
            take[rng.integers(len(X))] = False
        out.append(X[~take])
        held.append(X[take])
    return out, np.vstack(held)


def _label(spec) -> str:
    return spec if isinstance(spec, str) else spec["name"]


def _alg(spec):
    params = {"name": spec} if isinstance(spec, str) else dict(spec)
    return params.pop("name"), params


def _stack_specs(specs, box):
    out = []
    for s in specs:
        if isinstance(s, dict) and s.get("name") == "dp" and "bounds" not in s and "clip" not in s:
            s = {**s, "bounds": box}
        out.append(s)
    return out


def _has(specs, name) -> bool:
    return any((s if isinstance(s, str) else s.get("name")) == name for s in specs)


def _applies(attack: str, alg: str, specs) -> bool:
    secure = _has(specs, "masking") or _has(specs, "paillier")
    if attack == "audit":
        return _has(specs, "dp")
    if attack == "fuzzy-equations":
        return alg in FUZZY
    if attack in ("crafted-centroids",):
        return alg in CRISP and not secure
    if attack in ("model-inconsistency", "active-aggregate-differencing", "sybil"):
        return alg in CRISP and secure
    return True


def _estimator(alg, params, specs, k, box, seed, max_rounds):
    from securefkm.registry import make_estimator

    kw = dict(params)
    kw.setdefault("n_clusters", k)
    kw.setdefault("random_state", seed)
    if specs:
        kw.setdefault("init_bounds", box)
    if alg not in ("kfed", "child-parent"):
        kw.setdefault("max_rounds", max_rounds)
    return make_estimator(alg, protection=specs, **kw)


def _central_inertia(X, k, runs, seed) -> float:
    from sklearn.cluster import KMeans

    return min(KMeans(k, n_init=1, random_state=seed * 1000 + r).fit(X).inertia_ for r in range(runs))


# ------------------------------------------------------------------ attacks
def _optional(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def available_extras() -> set[str]:
    """Which of membership inference / auditing are importable in this tree."""
    out = set()
    if _optional("attacks.membership", "MembershipInference") is not None:
        out.add("membership")
    if _optional("attacks.audit", "audit_dp_game") is not None:
        out.add("audit")
    return out


def _passive(name):
    from . import passive

    if name == "fuzzy-equations":
        from .fuzzy import FuzzyEquationSolver

        return FuzzyEquationSolver()
    return {"small-cluster": passive.SmallClusterDisclosure, "differencing": passive.Differencing,
            "aggregate-differencing": passive.AggregateDifferencing}[name]()


def _active(name, rounds, seed):
    from . import active

    cls = {"crafted-centroids": active.CraftedCentroids, "model-inconsistency": active.ModelInconsistency,
           "active-aggregate-differencing": active.ActiveAggregateDifferencing, "sybil": active.Sybil}[name]
    return cls(0, max_rounds=rounds, random_state=seed)


def _run_attack(name, est, data, cfg, seed, held=None):
    """(LeakageReport or None, extra columns dict)."""
    if name in PASSIVE:
        return _passive(name).evaluate(est.transcript_, data), {}
    if name in ACTIVE:
        return _active(name, cfg.active_rounds, seed).evaluate(est, data), {}
    if name == "membership":
        # distance attack on the released centres: held-out records (removed before the fit)
        # against as many training records drawn at random
        pooled = data.pooled()
        rng = np.random.default_rng(20_000 + seed)
        members = pooled[rng.choice(len(pooled), size=min(len(held), len(pooled)), replace=False)]
        rep = _optional("attacks.membership", "MembershipInference")("distance").evaluate(est, data, members, held)
        return rep, {"membership_auc": rep.auc, "membership_advantage": rep.membership_advantage}
    if name == "audit":
        # attacks.audit audits one GaussianDP DWF round as a distinguishing game: calibrated
        # to the stack's epsilon/delta, played n_trials times, Clopper-Pearson bound
        layer = next(lay for lay in est.protection if type(lay).__name__ == "GaussianDP")
        game = _optional("attacks.audit", "gaussian_dp_round_game")(epsilon=layer.epsilon, delta=layer.delta,
                                                                      random_state=seed)
        res = _optional("attacks.audit", "audit_dp_game")(game, n_trials=cfg.audit_trials, random_state=seed)
        return None, {"audit_epsilon": float(res.epsilon_lower_bound)}
    raise InputError(f"unknown attack {name!r}; choose from {PASSIVE + ACTIVE + EXTRA}.")


# ------------------------------------------------------------------ CSV
def _key(row) -> tuple:
    return tuple(str(row[k]) for k in KEY)


def read_rows(path) -> list[dict]:
    """Rows of a benchmark CSV; a configuration appended again (a retried error) keeps its
    last row."""
    path = Path(path)
    if not path.exists():
        return []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    last = {_key(r): i for i, r in enumerate(rows)}
    return [r for i, r in enumerate(rows) if last[_key(r)] == i]


def _append(path: Path, row: dict) -> None:
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow({k: _fmt(row.get(k)) for k in COLUMNS})
        f.flush()
        os.fsync(f.fileno())


def _fmt(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.6g}"
    return v


def _check_config(config) -> BenchConfig:
    if isinstance(config, dict):
        config = BenchConfig(**config)
    if not isinstance(config, BenchConfig):
        raise InputError(f"config must be a BenchConfig or a dict of its fields, got {type(config).__name__}.")
    for a in config.attacks:
        if a not in PASSIVE + ACTIVE + EXTRA:
            raise InputError(f"unknown attack {a!r} in config.attacks; choose from {PASSIVE + ACTIVE + EXTRA}.")
    if not isinstance(config.stacks, dict) or not config.stacks:
        raise InputError("config.stacks must be a non-empty dict {label: list of layer specs}.")
    return config


# ------------------------------------------------------------------ driver
def run_benchmark(config) -> list[dict]:
    """Run every configuration not yet in ``<out>/attacks.csv``; return all rows of the CSV
    (old and new, as strings as read back) and write ``attacks.md`` and the plots."""
    from securefkm.registry import estimator_class

    cfg = _check_config(config)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "attacks.csv"
    done = {_key(r) for r in read_rows(path) if not r.get("error") or r["error"].startswith("refused")}
    extras = available_extras()
    attacks = [a for a in cfg.attacks if a not in EXTRA or a in extras]
    jobs = []
    for ds in cfg.datasets:
        for alg_spec in cfg.algorithms:
            alg, _ = _alg(alg_spec)
            estimator_class(alg)  # unknown names fail before any work
            for label, specs in cfg.stacks.items():
                for seed in cfg.seeds:
                    todo = [a for a in attacks if _applies(a, alg, specs)
                            and (_label(ds), alg, label, a, str(seed)) not in done]
                    if todo:
                        jobs.append((ds, alg_spec, label, specs, seed, todo))
    bar = None
    if cfg.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(len(j[-1]) for j in jobs), desc="bench attacks", unit="attack")
    central_cache: dict = {}
    for ds, alg_spec, label, specs, seed, todo in jobs:
        name, data, k, box, held = _load(ds, seed)
        alg, params = _alg(alg_spec)
        full_specs = _stack_specs(specs, box)
        base = {"dataset": name, "algorithm": alg, "stack": label, "seed": seed}
        ckey = (name, seed, k)
        if ckey not in central_cache:
            central_cache[ckey] = _central_inertia(data.pooled(), k, cfg.central_runs, seed)
        fit = {"central_inertia": central_cache[ckey]}
        est, fit_error = None, ""
        t0 = time.perf_counter()
        try:
            est = _estimator(alg, params, full_specs, k, box, seed, cfg.max_rounds)
            est.fit(data)
            fit["inertia"] = float(est.inertia_)
            fit["utility"] = fit["central_inertia"] / fit["inertia"] if fit["inertia"] > 0 else 1.0
            spent = getattr(est, "privacy_spent_", None)
            fit["epsilon"], fit["delta"] = (float(spent[0]), float(spent[1])) if spent is not None else ("-", "-")
        except (ProtectionConfigError, InputError) as exc:  # the stack refuses this algorithm: final
            fit_error = f"refused: {type(exc).__name__}: {exc}"[:300]
        except Exception as exc:  # noqa: BLE001 - recorded, retried next time
            fit_error = f"fit: {type(exc).__name__}: {exc}"[:300]
        fit["fit_seconds"] = time.perf_counter() - t0
        for attack in todo:
            row = {**base, **fit, "attack": attack}
            if fit_error:
                row["error"] = fit_error
            else:
                t1 = time.perf_counter()
                try:
                    rep, cols = _run_attack(attack, est, data, cfg, seed, held)
                    row.update(cols)
                    if rep is not None and attack != "membership":
                        row.update(records_recovered=rep.records_recovered, n_records=rep.n_records,
                                   fraction_recovered=rep.fraction_recovered, clients_exposed=rep.clients_exposed,
                                   precision=rep.precision, rounds_used=rep.rounds_used)
                except Exception as exc:  # noqa: BLE001 - one broken attack must not stop the table
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                row["attack_seconds"] = time.perf_counter() - t1
            _append(path, row)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    rows = read_rows(path)
    columns = [c for c in COLUMNS if c not in OPTIONAL or OPTIONAL[c] in extras]
    (out / "attacks.md").write_text(to_markdown(rows, columns))
    if cfg.plots and rows:
        plot_frontier(rows, out / "frontier.png")
        _plot_one_reconstruction(cfg, rows, out / "reconstruction.png")
    return rows


def to_markdown(rows, columns=None) -> str:
    """The table: one line per row, the columns of :data:`COLUMNS` (or those given)."""
    columns = list(columns or COLUMNS)
    short = [c for c in columns if c not in ("central_inertia", "fit_seconds", "attack_seconds")]
    lines = ["| " + " | ".join(short) + " |", "|" + "---|" * len(short)]
    for r in rows:
        cells = []
        for c in short:
            v = r.get(c, "")
            v = "" if v is None else str(v)
            if c in ("fraction_recovered", "clients_exposed", "precision", "utility") and v not in ("", "-"):
                try:
                    v = f"{float(v):.3f}"
                except ValueError:
                    pass
            cells.append(v.replace("|", "/")[:80] or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _num(v, default=np.nan) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def plot_frontier(rows, path) -> None:
    """Utility against protection (x: the stack, annotated with epsilon where spent); one
    point per (dataset, algorithm, stack), size and colour = largest fraction recovered."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict = {}
    for r in rows:
        if r.get("error") and not r.get("utility"):
            continue
        g = groups.setdefault((r["dataset"], r["algorithm"], r["stack"]), {"u": [], "f": [0.0], "eps": r.get("epsilon")})
        g["u"].append(_num(r.get("utility")))
        g["f"].append(_num(r.get("fraction_recovered"), 0.0))
    spent = {}  # stack -> smallest epsilon spent (DP stacks only)
    for k, g in groups.items():
        if g["eps"] not in (None, "", "-"):
            spent[k[2]] = min(spent.get(k[2], math.inf), _num(g["eps"]))
    # plain stacks in configuration order, then the DP stacks from the smallest budget up
    stacks = sorted(dict.fromkeys(k[2] for k in groups), key=lambda st: (st in spent, spent.get(st, 0.0)))
    algs = list(dict.fromkeys((k[0], k[1]) for k in groups))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (ds, alg) in enumerate(algs):
        xs, ys, fs = [], [], []
        for j, s in enumerate(stacks):
            g = groups.get((ds, alg, s))
            if g is None or not np.isfinite(np.nanmean(g["u"])):
                continue
            xs.append(j + 0.08 * (i - len(algs) / 2))
            ys.append(float(np.nanmean(g["u"])))
            fs.append(max(g["f"]))
        if not xs:
            continue
        ax.plot(xs, ys, "-", color="grey", lw=0.6, alpha=0.6)
        sc = ax.scatter(xs, ys, s=30 + 600 * np.asarray(fs), c=fs, cmap="Reds", vmin=0, vmax=max(0.05, max(fs)),
                        edgecolors="k", label=f"{ds} / {alg}")
    labels = [s.replace(")+", ")+\n") + (f"\nspent {spent[s]:.2g}" if s in spent else "") for s in stacks]
    ax.set_xticks(range(len(stacks)), labels, fontsize=8)
    ax.set_ylabel("utility (best central inertia / federated inertia)")
    ax.set_title("privacy-utility frontier (marker size/colour: largest fraction of records recovered)")
    if algs:
        ax.legend(fontsize=7, loc="lower left")
        if "sc" in locals():
            fig.colorbar(sc, ax=ax, label="fraction recovered")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_one_reconstruction(cfg, rows, path) -> None:
    """Re-run the first unprotected passive attack that leaked and plot its claims."""
    leaked = [r for r in rows if r["stack"] in cfg.stacks and not cfg.stacks[r["stack"]]
              and r["attack"] in PASSIVE and _num(r.get("records_recovered"), 0) > 0]
    if not leaked:
        return
    r = max(leaked, key=lambda r: _num(r["records_recovered"], 0))
    ds = next(d for d in cfg.datasets if _label(d) == r["dataset"])
    alg_spec = next(a for a in cfg.algorithms if _alg(a)[0] == r["algorithm"])
    seed = int(r["seed"])
    name, data, k, box, _ = _load(ds, seed)
    alg, params = _alg(alg_spec)
    est = _estimator(alg, params, [], k, box, seed, cfg.max_rounds)
    est.fit(data)
    attack = _passive(r["attack"])
    claims, _, _ = attack.claims(est.transcript_)
    plot_reconstruction(data, claims, path, title=f"{r['attack']} on {alg}, {name}, no protection (seed {seed})")


def plot_reconstruction(data, claims, path, title="") -> None:
    """True records (grey; exposed clients' in blue) and the attack's claims (red x), first
    two features."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients = getattr(data, "clients", data)
    X = np.vstack(clients)
    fig, ax = plt.subplots(figsize=(6, 6))
    ax.scatter(X[:, 0], X[:, 1], s=4, c="lightgrey", label="records")
    exposed = sorted({int(c) for c, _ in claims})
    if exposed:
        E = np.vstack([clients[c] for c in exposed])
        ax.scatter(E[:, 0], E[:, 1], s=6, c="tab:blue", label="records of exposed clients")
    if claims:
        V = np.vstack([np.asarray(v) for _, v in claims])
        ax.scatter(V[:, 0], V[:, 1], s=40, marker="x", c="tab:red", label=f"reconstructions ({len(V)})")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cli_run(quick: bool = False, out: str = "bench-attacks", seeds: int | None = None) -> list[dict]:
    """``securefkm bench attacks``: quick (CI) or full configuration; prints the table."""
    cfg = quick_config(out, seeds) if quick else full_config(out, seeds)
    t0 = time.perf_counter()
    rows = run_benchmark(cfg)
    print((Path(out) / "attacks.md").read_text())
    print(f"{len(rows)} rows in {Path(out) / 'attacks.csv'} ({time.perf_counter() - t0:.1f} s this call); "
          f"plots: {Path(out) / 'frontier.png'}, {Path(out) / 'reconstruction.png'}")
    return rows


__all__ = ["BenchConfig", "COLUMNS", "STACKS", "cli_run", "full_config", "plot_frontier", "plot_reconstruction",
           "quick_config", "read_rows", "run_benchmark", "to_markdown"]
