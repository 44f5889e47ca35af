"""The benchmark matrix: what is run, and the pure cell functions that run it.

A *cell* is a JSON-able dict; the functions here turn one cell into JSON-able rows, read
nothing but the cell and write nothing, so :func:`securefkm.sweep.run_sweep` can run
them in any process, in any order, and cache them by the cell's hash. Three kinds:

* ``central_cell``: best inertia of ``central_runs`` scikit-learn k-means runs on the pooled
  training records of (dataset, seed) -- the utility reference;
* ``fit_cell``: one fit of (dataset, algorithm, stack, seed), then every attack of the cell
  against it; one row per attack, an attack that does not apply gets the row
  ``status = "not applicable: <reason>"`` (decided by :func:`applicability` before any work);
* ``audit_cell``: the DP audit of one DP stack's Gaussian mechanism (one DWF round as a
  distinguishing game, :func:`attacks.audit.gaussian_dp_round_game`), per seed.

Every fit is built by :func:`make_fit` -- the one place the benchmark's ``crypto`` setting
("real" until the ideal functionality lands) reaches the estimators and the active attacks.
"""

from __future__ import annotations

import json
import time

import numpy as np

from securefkm.exceptions import InputError, NoParticipantsError, ProtectionConfigError

PASSIVE = ("small-cluster", "differencing", "aggregate-differencing", "fuzzy-equations")
ACTIVE = ("crafted-centroids", "model-inconsistency", "active-aggregate-differencing", "sybil")
#: malicious clients against the fit (attacks.poisoning), 10% of the clients: the adaptive attack
#: (every lie inside the range checks) and sums scaled out of range (what validation catches)
POISON_KINDS = {"poisoning": "adaptive", "poisoning-out-of-range": "sum-scaling"}
POISONING = tuple(POISON_KINDS)
ATTACKS = PASSIVE + ACTIVE + ("membership",) + POISONING
CRISP = ("dwf", "ewf", "minibatch")
FUZZY = ("fcm", "fcm-fedavg")
#: algorithms whose plain mode sends set-fields; "<name>+secure" is their sum-only mode
SET_VALUED = ("aligning", "kfed", "child-parent", "fcm")
SECURE_SUFFIX = "+secure"

#: declared (public) box of each benchmark dataset: fixed before any fit, never from the data
BOXES = {"blobs-small": (-5.0, 5.0), "dwf-blobs": (-2.0, 2.0), "blobs-large": (-2.0, 2.0),
         "digits-unit": (-1.0, 1.0), "wine": (-1.0, 1.0), "breast-cancer": (-1.0, 1.0)}

STATUS_OK = "ok"


def not_applicable(reason: str) -> str:
    return f"not applicable: {reason}"


# ------------------------------------------------------------------ stacks
def dp_spec(epsilon: float, mode: str = "distributed") -> dict:
    return {"name": "dp", "epsilon": float(epsilon), "delta": 1e-5, "mode": mode, "accountant": "rdp"}


def default_stacks(epsilons=(1.0,)) -> dict:
    """Every stack a user would pick, in order of strength; DP stacks per epsilon."""
    stacks = {
        "none": [],
        "min-cluster(2)": [{"name": "min-cluster", "p": 2}],
        "rounding+cap": [{"name": "rounding", "count_multiple": 5, "decimals": 1}, {"name": "cap", "max_rounds": 8}],
        "masking": ["masking"],
        "paillier": ["paillier"],
        "validated": ["validated"],  # proven-valid inputs (Prio3 with a Helper): poisoning is named
    }
    for e in epsilons:
        stacks[f"dp-local(eps={e:g})"] = [dp_spec(e, "local")]
        stacks[f"dp-central(eps={e:g})"] = [dp_spec(e, "central")]
        stacks[f"dp(eps={e:g})+masking"] = [dp_spec(e), "masking"]
        stacks[f"dp(eps={e:g})+paillier"] = [dp_spec(e), "paillier"]
    stacks["recommended"] = recommended_stack()
    return stacks


def recommended_stack(epsilon: float = 1.0) -> list:
    """The default secure stack the benchmark recommends: distributed DP at epsilon 1 under
    pairwise masking with broadcast binding (the masking default), MinClusterSize(2) on
    what the clients send and a participation cap."""
    return [dp_spec(epsilon), {"name": "min-cluster", "p": 2}, {"name": "cap", "max_rounds": 20}, "masking"]


def _names(specs) -> set:
    from securefkm.specs import layer_specs

    return {s.name for s in layer_specs(specs)}


def _secure_aggregator(specs) -> bool:
    return bool(_names(specs) & {"masking", "paillier"})


def dp_layers(specs) -> list[dict]:
    from securefkm.specs import layer_specs

    return [dict(s) for s in layer_specs(specs) if s.name == "dp"]


# ------------------------------------------------------------------ algorithms
def split_algorithm(label: str) -> tuple[str, dict]:
    """'kfed+secure' -> ('kfed', {'secure_mode': True}); registry names pass through."""
    if label.endswith(SECURE_SUFFIX):
        base = label[: -len(SECURE_SUFFIX)]
        if base not in SET_VALUED:
            raise InputError(f"{label!r}: only {', '.join(SET_VALUED)} have a secure (sum-only) mode.")
        return base, {"secure_mode": True}
    return label, {}


def default_algorithms() -> list[str]:
    """Every registry algorithm, the set-valued ones also in their secure mode."""
    from securefkm.registry import ALGORITHMS

    out = []
    for name in ALGORITHMS:
        out.append(name)
        if name in SET_VALUED:
            out.append(name + SECURE_SUFFIX)
    return out


def applicability(attack: str, algorithm: str, specs, k: int) -> str | None:
    """None when ``attack`` applies to (algorithm, stack, k), else the reason it does not."""
    base, params = split_algorithm(algorithm)
    secure = _secure_aggregator(specs)
    if attack in POISONING:
        if base == "ewf":
            return "EWF sends per-cell means without counts; the poisoning attacks rewrite (count, sum) pairs"
        if base in SET_VALUED and not params.get("secure_mode"):
            return ("the plain mode sends local centres and sizes (set-fields); the poisoning attacks rewrite "
                    "(count, sum) pairs, which its secure mode sends")
        return None
    if attack == "fuzzy-equations" and base not in FUZZY:
        return "the fuzzy equation solver reads fuzzy c-means memberships"
    if attack in ACTIVE and base == "ewf":
        return "EWF sends per-cell means without counts; the slab search reads per-cell counts and sums (DWF, mini-batch)"
    if attack == "crafted-centroids":
        if base not in CRISP:
            return "needs server-chosen centres in Lloyd training rounds (crisp DWF/EWF/mini-batch)"
        if secure:
            return "reads per-client cell sums, hidden by the secure aggregator (see model-inconsistency)"
    if attack in ("model-inconsistency", "active-aggregate-differencing", "sybil"):
        if base not in CRISP:
            return "needs server-chosen centres in Lloyd training rounds (crisp DWF/EWF/mini-batch)"
        if not secure:
            return "targets secure aggregation; without it crafted-centroids reads the client directly"
        if attack == "model-inconsistency" and k < 3:
            return f"needs n_clusters >= 3 (one reserved cell), the data has k={k}"
    return None


# ------------------------------------------------------------------ data
def load(spec: dict, seed: int):
    """(FederatedDataset of training records, labels per client or None, k, box, held-out
    records) for a dataset spec ``{"name", "split", "n_clients", ...}``.

    Memoised per process (a worker runs many cells of one dataset and seed; the non-IID
    splits run k-means): the arrays are made read-only, so a fit or an attack that wrote
    into the shared records would fail loudly instead of changing the next cell's data."""
    key = json.dumps([spec, seed], sort_keys=True)
    if key not in _LOADED:
        if len(_LOADED) >= 4:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = _load(spec, seed)
    return _LOADED[key]


_LOADED: dict = {}


def _load(spec: dict, seed: int):
    from securefkm.datasets import load_dataset
    from securefkm.datasets.federated import FederatedDataset

    params = dict(spec)
    name = params.pop("name")
    k = params.pop("n_clusters", None)
    if name == "blobs-small":
        from sklearn.datasets import make_blobs

        X, y = make_blobs(400, centers=4, cluster_std=0.4, center_box=(-3, 3), random_state=1)
        data = FederatedDataset.from_pooled(X, y, split=params.get("split", "non-iid"),
                                            n_clients=params.get("n_clients", 20), random_state=seed)
        k = k or 4
    elif name == "blobs-large":
        from securefkm.datasets.generators import dwf_blobs

        X, y = dwf_blobs(n_samples=params.get("n_samples", 100_000), random_state=7)
        data = FederatedDataset.from_pooled(X, y, split=params.get("split", "dirichlet"),
                                            n_clients=params.get("n_clients", 1000), random_state=seed)
        k = k or 5
    else:
        data = load_dataset(name, random_state=seed, **params)
        if k is None:
            labels = data.pooled_labels()
            k = len(np.unique(labels)) if labels is not None else 5
    if name not in BOXES:
        raise InputError(f"dataset {name!r} has no declared box; add it to attacks.matrix.BOXES.")
    labels = data.labels
    clients, client_labels, held = _hold_out(data.clients, labels, seed)
    for a in [*clients, *(client_labels or []), held]:
        a.setflags(write=False)
    data = FederatedDataset(clients, labels=client_labels, name=data.name)
    return data, int(k), BOXES[name], held


def _hold_out(clients, labels, seed, fraction=0.1):
    """Remove ~``fraction`` of the records (never a client's last) before any fit: they are
    the non-members of membership inference; the same data serve every attack."""
    from .evaluate import split_held_out

    return split_held_out(clients, labels, np.random.default_rng(10_000 + seed), fraction)


def dataset_label(spec: dict) -> str:
    """'wine/dirichlet': name and split (the report lists the other parameters)."""
    return spec["name"] + (f"/{spec['split']}" if "split" in spec else "")


# ------------------------------------------------------------------ fits
def with_box(specs, box) -> list:
    """A dp or validated spec without ``bounds``/``clip`` gets the dataset's declared box, and seeded noise
    (``rng="seeded"``: the same cell gives the same release, so cached and parallel results
    equal a serial run) where this tree's GaussianDP offers it."""
    from securefkm.specs import LayerSpec

    out = []
    for s in specs:
        if LayerSpec.of(s).name == "validated" and "bounds" not in dict(LayerSpec.of(s)):
            s = {**dict(LayerSpec.of(s)), "bounds": list(box)}  # the fits active attacks build carry no init_bounds
        if LayerSpec.of(s).name == "dp":
            s = dict(LayerSpec.of(s))
            if "bounds" not in s and "clip" not in s:
                s = {**s, "bounds": list(box)}
            if "rng" not in s and _dp_takes_rng():
                s = {**s, "rng": "seeded"}
        out.append(s)
    return out


def _dp_takes_rng() -> bool:
    import inspect

    from protocols.dp import GaussianDP

    return "rng" in inspect.signature(GaussianDP).parameters


def plans_dp_rounds(algorithm: str, specs) -> bool:
    """True when the cell's estimator plans its own rounds for a DP stack (its ``_plan_dp``,
    :mod:`protocols.dp.planning`, applies only with ``max_rounds`` unset): the benchmark then
    leaves ``max_rounds`` to it -- the rounds a user of the defaults gets under that budget."""
    from securefkm.registry import make_estimator

    if not dp_layers(specs):
        return False
    base, kw = split_algorithm(algorithm)
    return make_estimator(base, **kw).plans_dp_rounds()


def make_fit(algorithm: str, specs, k: int, box, seed: int, max_rounds: int, crypto: str = "ideal",
             dp_planned: bool = False):
    """The estimator of one cell; ``crypto`` ("ideal" by default: the same release as the real
    protocol, bit for bit, tests/test_ideal.py) goes to the estimator; ``dp_planned``
    (:func:`plans_dp_rounds`) leaves ``max_rounds`` to the estimator's DP planner."""
    from securefkm.registry import make_estimator

    base, kw = split_algorithm(algorithm)
    kw.update(n_clusters=k, random_state=seed)
    if specs:
        kw["init_bounds"] = tuple(box)
    if base not in ("kfed", "child-parent") and not dp_planned:
        kw["max_rounds"] = max_rounds
    kw["crypto"] = crypto
    kw["record"] = "full"  # the passive attacks read every client message
    return make_estimator(base, protection=with_box(specs, box), **kw)


def central_cell(cell: dict) -> dict:
    """{"inertia": best central k-means inertia, "ari": its ARI (None without labels)}."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    data, k, _, _ = load(cell["dataset"], cell["seed"])
    X = data.pooled()
    best = min((KMeans(k, n_init=1, random_state=cell["seed"] * 1000 + r).fit(X) for r in range(cell["runs"])),
               key=lambda m: m.inertia_)
    y = data.pooled_labels()
    return {"inertia": float(best.inertia_),
            "ari": None if y is None else float(adjusted_rand_score(y, best.labels_))}


def fit_cell(cell: dict) -> list[dict]:
    """Rows of one (dataset, algorithm, stack, seed): the fit's utility, then one row per
    attack in ``cell["attacks"]`` (numbers, ``not applicable: ...`` or ``error: ...``)."""
    from sklearn.metrics import adjusted_rand_score

    from securefkm.kernels import assign

    seed, specs, alg = cell["seed"], cell["specs"], cell["algorithm"]
    data, k, box, held = load(cell["dataset"], seed)
    base = {"dataset": dataset_label(cell["dataset"]), "algorithm": alg, "stack": cell["stack"], "seed": seed,
            "central_inertia": cell["central"]["inertia"], "central_ari": cell["central"]["ari"]}
    fit: dict = {}
    est, fit_status = None, STATUS_OK
    t0 = time.perf_counter()
    try:
        est = make_fit(alg, specs, k, box, seed, cell["max_rounds"], cell.get("crypto", "ideal"),
                       cell.get("dp_planned", False))
        est.fit(data)
        X = data.pooled()
        labels, d2 = assign(X, est.cluster_centers_)
        fit["inertia"] = float(d2.sum())
        fit["utility"] = base["central_inertia"] / fit["inertia"] if fit["inertia"] > 0 else 1.0
        y = data.pooled_labels()
        fit["ari"] = None if y is None else float(adjusted_rand_score(y, labels))
        spent = getattr(est, "privacy_spent_", None)
        fit["epsilon"], fit["delta"] = (float(spent[0]), float(spent[1])) if spent is not None else (None, None)
    except (ProtectionConfigError, InputError) as exc:  # the stack refuses this algorithm
        fit_status = not_applicable(f"the stack refuses the algorithm: {exc}")[:400]
    except NoParticipantsError as exc:  # a participation cap spent before the algorithm had centres
        fit_status = not_applicable(f"the stack's participation cap ends the fit too early: {exc}")[:400]
    except Exception as exc:  # noqa: BLE001 - recorded in the row, the sweep goes on
        fit_status = f"error: fit: {type(exc).__name__}: {exc}"[:400]
    fit["fit_seconds"] = time.perf_counter() - t0
    rows = []
    for attack in cell["attacks"]:
        row = {**base, **fit, "attack": attack, "status": fit_status}
        reason = applicability(attack, alg, specs, k)
        if reason is not None:
            row["status"] = not_applicable(reason)
        elif fit_status == STATUS_OK:
            t1 = time.perf_counter()
            try:
                row.update(_attack(attack, est, data, cell, held, box))
            except Exception as exc:  # noqa: BLE001 - one broken attack must not stop the table
                row["status"] = f"error: {type(exc).__name__}: {exc}"[:400]
            row["attack_seconds"] = time.perf_counter() - t1
        rows.append(row)
    return rows


def _attack(name, est, data, cell, held, box=None) -> dict:
    from . import active, passive

    seed = cell["seed"]
    if name in POISONING:
        # 10% of the clients: the strongest in-range attack, or sums scaled far out of range
        from .poisoning import Poisoning

        m = max(1, len(data.clients) // 10)
        rep = Poisoning(POISON_KINDS[name], m, box=box, random_state=30_000 + seed).evaluate(est, data)
        if rep.attacked_rounds == 0:  # no (count, sum) pair in any round: the "poisoned" fit is the honest one
            return {"status": not_applicable("no round of this fit sends a (count, sum) pair (its sums are "
                                             "'value' fields), which is what the poisoning attacks rewrite")}
        caught = set(rep.detected) | set(rep.excluded) | set(rep.refused)
        return {"poison_displacement": rep.displacement_max, "poison_utility": rep.utility, "poison_ari": rep.ari,
                "poison_detected": len(caught & set(rep.malicious)) / len(rep.malicious)}
    if name == "membership":
        # distance attack on the released centres: held-out records (removed before the fit)
        # against as many training records drawn at random
        from .evaluate import membership_candidates
        from .membership import MembershipInference

        members, held = membership_candidates(data, held, random_state=20_000 + seed)
        rep = MembershipInference("distance").evaluate(est, data, members, held)
        return {"membership_auc": rep.auc, "membership_advantage": rep.membership_advantage}
    if name in PASSIVE:
        if name == "fuzzy-equations":
            from .fuzzy import FuzzyEquationSolver

            attack = FuzzyEquationSolver()
        else:
            attack = {"small-cluster": passive.SmallClusterDisclosure, "differencing": passive.Differencing,
                      "aggregate-differencing": passive.AggregateDifferencing}[name]()
        rep = attack.evaluate(est.transcript_, data)
    else:
        cls = {"crafted-centroids": active.CraftedCentroids, "model-inconsistency": active.ModelInconsistency,
               "active-aggregate-differencing": active.ActiveAggregateDifferencing, "sybil": active.Sybil}[name]
        rep = cls(0, max_rounds=cell["active_rounds"], random_state=seed).evaluate(est, data)
    out = {"records_recovered": int(rep.records_recovered), "n_records": int(rep.n_records),
           "fraction_recovered": float(rep.fraction_recovered), "clients_exposed": float(rep.clients_exposed),
           "precision": None if rep.precision is None else float(rep.precision), "rounds_used": int(rep.rounds_used)}
    if getattr(rep, "extra", None) and rep.extra.get("detected") is not None:
        out["detected"] = bool(rep.extra["detected"])
    return out


def audit_cell(cell: dict) -> dict:
    """The audit's epsilon lower bound for one DP layer spec (central and local games; a
    distributed layer is audited as its central equivalent: the clients' noise shares sum to
    the central sigma, which is what the server's aggregate carries)."""
    from .audit import audit_dp_game, gaussian_dp_round_game

    layer = cell["layer"]
    mode = "local" if layer.get("mode") == "local" else "central"
    t0 = time.perf_counter()
    game = gaussian_dp_round_game(epsilon=layer["epsilon"], delta=layer["delta"], mode=mode,
                                  random_state=cell["seed"])
    res = audit_dp_game(game, n_trials=cell["trials"], random_state=cell["seed"])
    return {"audit_epsilon": float(res.epsilon_lower_bound),
            "claimed_epsilon": None if res.claimed_epsilon is None else float(res.claimed_epsilon),
            "audited_mode": mode, "audit_seconds": time.perf_counter() - t0}
