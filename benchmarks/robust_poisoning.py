"""DWF's robust option against the attack that knows it, under real pairwise masking.

``python -m benchmarks.robust_poisoning --seeds 5``: iris, wine and breast cancer
(scikit-learn), every feature min-max scaled to [0, 1] (the range is treated as public: the
declared box is the unit cube), 10 clients split iid and non-iid
(:func:`securefkm.datasets.splitters.split_indices`), k = the number of classes, every fit
under ``PairwiseMasking`` (real masking), from 3 data-free starts in the box (``init="uniform"``,
``n_init=3``: the run of the lowest federated score is kept) or, with ``--init private``, from
the protected default's seeding round. Per dataset, split and seed:

* the honest plain fit: DWF with ``aggregation="mean"``, no attacker (the reference);
* the robust fit: ``aggregation="median"``, no attacker: its utility is the honest plain
  inertia over its own, on all records;
* each with m = 1 and 3 of the 10 clients malicious, drawn with the seed: the mean against
  ``Poisoning("adaptive")``, the median against ``Poisoning("robust-adaptive")`` (each the
  strongest in-range attack on its aggregation, :mod:`attacks.poisoning`), lying in every
  round (the private seeding round too) or, with ``--attack-rounds train``, in the training
  rounds only.

Printed: medians over seeds of the ARI of each fit's labels against the honest plain fit's
(on all records), of its ARI against the classes, of ``kept`` (its ARI against the classes
over the honest plain fit's, per seed), of its utility and of the largest move of a matched
centre from the honest plain fit. The targets: a poisoned robust fit keeps at least 0.9 of
the honest plain fit's ARI against the classes (``kept``; the stricter reading, an ARI of at
least 0.9 against the honest plain fit's labels, is printed too); the robust fit without an
attacker keeps at least 0.95 of the plain utility. ``--first-seed`` runs other seeds than the
reported ones, ``--splits`` / ``--datasets`` a subset.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

BOX = (0.0, 1.0)
DATASETS = ("iris", "wine", "breast_cancer")
SPLITS = ("iid", "non-iid")


def load(name: str):
    """(X scaled to [0, 1] per feature, y)."""
    from sklearn import datasets

    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    X = (X - X.min(0)) / (X.max(0) - X.min(0))
    return X, y


#: the starts: "uniform" draws N_INIT starts in the box (no data, so nothing a malicious client
#: can poison) and keeps the run of the lowest federated score; "private" is the protected
#: fits' default, one seeding round of bucket counts and sums (a mean a malicious client moves)
INITS = {"uniform": ("uniform", 3), "private": ("auto", 1)}


def _fit(clients, k, seed, aggregation, vote_bins, vote_weight, max_rounds, init="uniform"):
    from securefkm.registry import make_estimator

    start, n_init = INITS[init]
    est = make_estimator("dwf", n_clusters=k, init_bounds=BOX, protection=["masking"], crypto="real",
                         random_state=seed, max_rounds=max_rounds, aggregation=aggregation, vote_bins=vote_bins,
                         vote_weight=vote_weight, init=start, n_init=n_init)
    est.fit(clients)
    if not all("PairwiseMasking" in r.protection for r in est.transcript_):  # the figures are of masked rounds
        raise RuntimeError("a round ran without PairwiseMasking")
    return est


def _scores(centres, reference, X, y, ref_inertia, ref_ari_classes=None):
    from sklearn.metrics import adjusted_rand_score

    from attacks.poisoning import _matched_distances
    from securefkm.kernels import assign

    lab, d2 = assign(X, centres)
    ref_lab, _ = assign(X, reference)
    ari_classes = adjusted_rand_score(y, lab)
    ref_classes = ari_classes if ref_ari_classes is None else ref_ari_classes
    return {"ari_honest": adjusted_rand_score(ref_lab, lab), "ari_classes": ari_classes,
            # the share of the honest plain fit's ARI against the classes this fit keeps (same seed)
            "kept": ari_classes / ref_classes if ref_classes > 0 else float("nan"),
            "utility": ref_inertia / max(float(np.sum(d2)), 1e-300),
            "move": float(_matched_distances(reference, centres).max())}


def run_cell(name, split, seed, m_values=(1, 3), vote_bins=64, vote_weight="client", max_rounds=30, actions=None,
             init="uniform"):
    """Rows of one dataset, split and seed: (aggregation, m) -> scores against the honest plain fit."""
    from attacks.poisoning import Poisoning
    from securefkm.datasets.splitters import split_indices
    from securefkm.kernels import assign

    X, y = load(name)
    k = len(np.unique(y))
    idx = split_indices(split, X, y, 10, random_state=seed)
    clients = [X[i] for i in idx]
    Xa, ya = np.vstack(clients), np.concatenate([y[i] for i in idx])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = _fit(clients, k, seed, "mean", vote_bins, vote_weight, max_rounds, init)
        robust = _fit(clients, k, seed, "median", vote_bins, vote_weight, max_rounds, init)
        ref = plain.cluster_centers_
        ref_inertia = float(np.sum(assign(Xa, ref)[1]))
        rows = {("mean", 0): _scores(ref, ref, Xa, ya, ref_inertia)}
        honest_classes = rows[("mean", 0)]["ari_classes"]
        rows[("median", 0)] = _scores(robust.cluster_centers_, ref, Xa, ya, ref_inertia, honest_classes)
        for m in m_values:
            for agg, est, kind in (("mean", plain, "adaptive"), ("median", robust, "robust-adaptive")):
                report = Poisoning(kind, m, random_state=seed, actions=actions).evaluate(est, clients)
                rows[(agg, m)] = _scores(report.poisoned_centres, ref, Xa, ya, ref_inertia, honest_classes)
    return rows


def table(seeds: int, m_values=(1, 3), vote_bins=64, vote_weight="client", datasets=DATASETS, splits=SPLITS,
          actions=None, init="uniform", first_seed=0):
    """Median over seeds first_seed..first_seed+seeds-1 of every cell's scores:
    {(dataset, split, aggregation, m): scores}."""
    cells: dict = {}
    for name in datasets:
        for split in splits:
            for seed in range(first_seed, first_seed + seeds):
                for key, scores in run_cell(name, split, seed, m_values, vote_bins, vote_weight,
                                            actions=actions, init=init).items():
                    cells.setdefault((name, split, *key), []).append(scores)
    return {key: {f: float(np.median([s[f] for s in runs])) for f in runs[0]} for key, runs in cells.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.robust_poisoning", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per cell (splits, masking, malicious draw)")
    parser.add_argument("--first-seed", type=int, default=0, help="the seeds are first-seed, first-seed + 1, ...")
    parser.add_argument("--splits", default=",".join(SPLITS), help="comma-separated subset of " + ", ".join(SPLITS))
    parser.add_argument("--vote-bins", type=int, default=64, help="bins per coordinate of the median's votes")
    parser.add_argument("--vote-weight", default="client", choices=("client", "records"),
                        help="a vote weighs 1 (client) or the client's count in the cluster (records)")
    parser.add_argument("--attack-rounds", default="all", choices=("all", "train"),
                        help="rounds the malicious clients lie in: all (the seeding round too) or train only")
    parser.add_argument("--init", default="uniform", choices=tuple(INITS),
                        help="uniform: 3 data-free starts in the box, best federated score kept; private: one "
                             "seeding round (which the malicious clients poison too)")
    parser.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated subset of " + ", ".join(DATASETS))
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    datasets = tuple(d for d in args.datasets.split(",") if d)
    bad = [d for d in datasets if d not in DATASETS]
    if bad:
        parser.error(f"--datasets: unknown {bad}; choose from {', '.join(DATASETS)}")
    splits = tuple(x for x in args.splits.split(",") if x)
    if not splits or any(x not in SPLITS for x in splits):
        parser.error(f"--splits: choose from {', '.join(SPLITS)}")
    t0 = time.perf_counter()
    actions = None if args.attack_rounds == "all" else ("train",)
    res = table(args.seeds, vote_bins=args.vote_bins, vote_weight=args.vote_weight, datasets=datasets, splits=splits,
                actions=actions, init=args.init, first_seed=args.first_seed)
    print(f"DWF under PairwiseMasking, 10 clients, box [0, 1]^d, init {args.init}, vote_bins={args.vote_bins}, "
          f"vote_weight={args.vote_weight!r}, attack in {args.attack_rounds} rounds; medians over seeds "
          f"{args.first_seed}..{args.first_seed + args.seeds - 1}")
    print("| data | split | aggregation | attack | malicious | ARI vs honest plain | ARI vs classes | kept | utility "
          "| largest move | targets |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    for (name, split, agg, m), s in res.items():
        attack = "none" if m == 0 else ("adaptive" if agg == "mean" else "robust-adaptive")
        if agg == "mean":
            target = "reference" if m == 0 else "(contrast)"
        elif m == 0:
            target = "utility >= 0.95: " + ("met" if s["utility"] >= 0.95 else "missed")
        else:
            target = ("kept >= 0.9: " + ("met" if s["kept"] >= 0.9 else "missed")
                      + "; ARI vs plain >= 0.9: " + ("met" if s["ari_honest"] >= 0.9 else "missed"))
        print(f"| {name} | {split} | {agg} | {attack} | {m} | {s['ari_honest']:.3f} | {s['ari_classes']:.3f} | "
              f"{s['kept']:.3f} | {s['utility']:.3f} | {s['move']:.3f} | {target} |")
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
