"""One-run DP audit of GaussianDP fits (``python -m benchmarks.audit_one_run``).

For each mode (central, distributed under the real PairwiseMasking protocol, local),
each epsilon in ``--epsilons`` (delta 1e-5) and each of ``--seeds`` seeds:
:func:`attacks.audit_one_run.one_run_audit` with ``--canaries`` canaries over ``--rounds``
DWF rounds (4 clients, 2 features, clip 1, canaries at 2 clip, ``--background`` non-canary
records per cluster, noise from the OS CSPRNG).
Prints per row the claim (the layer's ``privacy_spent``), the median over seeds of the
white-box f-DP bound, of Steinke et al.'s bound, of both black-box bounds, the median ratio
f-DP bound / claim, and the seconds per audit; ``--json PATH`` also writes every audit.

Default (about 2.5 minutes on 2 cores): 100,000 canaries, no background records, 3 seeds,
epsilon 1 and 4. ``--canaries 50000 --background 1`` (about 2.5 minutes): half the canaries,
one known non-canary record in every cluster (a better black-box score).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from attacks.audit_one_run import one_run_audit

MODES = ("central", "distributed", "local")
COLUMNS = ("claimed_epsilon", "epsilon_fdp", "epsilon_steinke", "blackbox_epsilon_fdp", "blackbox_epsilon_steinke",
           "ratio")


def _median(results, name: str) -> float:
    """Median over the seeds' audits of one OneRunAudit attribute."""
    return float(np.median([getattr(r, name) for r, _ in results]))


def run(canaries: int, seeds: int, epsilons, rounds: int, background: int = 0, delta: float = 1e-5):
    rows, audits = [], []
    for eps in epsilons:
        for mode in MODES:
            res = []
            for seed in range(seeds):
                t = time.perf_counter()
                r = one_run_audit(mode, eps, delta, canaries, rounds=rounds, background_per_cell=background,
                                  random_state=seed)
                res.append((r, time.perf_counter() - t))
                audits.append({"mode": mode, "epsilon": eps, "seed": seed, "claimed": r.claimed_epsilon,
                               "fdp": r.epsilon_fdp, "steinke": r.epsilon_steinke,
                               "blackbox_fdp": r.blackbox_epsilon_fdp, "blackbox_steinke": r.blackbox_epsilon_steinke,
                               "r_fdp": r.details["white_box"]["r_fdp"], "r_steinke": r.details["white_box"]["r_steinke"]})
            rows.append((mode, eps, *(_median(res, name) for name in COLUMNS), float(np.mean([s for _, s in res]))))
    return rows, audits


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--canaries", type=int, default=100_000, help="canaries per audit (one per cluster)")
    ap.add_argument("--seeds", type=int, default=3, help="audits per row; the table shows medians")
    ap.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0], help="target epsilons (delta 1e-5)")
    ap.add_argument("--rounds", type=int, default=1, help="DWF rounds per fit (all charged, all scored)")
    ap.add_argument("--background", type=int, default=0,
                    help="non-canary records per cluster (0: none, the fit's cost is then the canaries' alone)")
    ap.add_argument("--json", default=None, help="write every audit to this JSON file")
    a = ap.parse_args(argv)
    start = time.perf_counter()
    rows, audits = run(a.canaries, a.seeds, a.epsilons, a.rounds, a.background)
    print(f"one-run audit: {a.canaries} canaries, {a.background} background record(s) per cluster, "
          f"{a.rounds} round(s), {a.seeds} seed(s), delta 1e-5, "
          "confidence 0.95 (medians over seeds)")
    print("| mode | target eps | claimed eps | f-DP (white-box) | Steinke et al. (white-box) | "
          "f-DP (black-box) | Steinke et al. (black-box) | f-DP / claim | s per audit |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, eps, cl, f, s, bf, bs, ratio, sec in rows:
        print(f"| {mode} | {eps:g} | {cl:.3f} | {f:.3f} | {s:.3f} | {bf:.3f} | {bs:.3f} | {ratio:.3f} | {sec:.1f} |")
    print(f"total {time.perf_counter() - start:.0f} s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(audits, fh, indent=1)


if __name__ == "__main__":
    main()
