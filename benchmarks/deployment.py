"""Per-round overhead of a local Flower deployment against the in-process runtime.

    python -m benchmarks.deployment --clients 10 --rounds 3 --protection none masking \
        --client-processes warm cold

For each protection it fits the same DWF spec (same seed, same client arrays) once in
process and once on a local deployment (SuperLink + one SuperNode per client on
127.0.0.1), checks that the centres are equal, and prints seconds per round and their
ratio. Deployment seconds count only the rounds (from the ServerApp's first to its last
message), not process start-up; start-up is printed separately.

``--client-processes``: ``warm`` forks each message's ClientApp process from a server that
has imported Flower and securefkm once (:mod:`securefkm.flower._superexec`, the default of
:class:`~securefkm.flower.deploy.LocalDeployment`); ``cold`` is Flower's own per-message
``flwr-clientapp`` process. Giving both measures them in one run, one deployment each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from securefkm.flower.deploy import LocalDeployment, write_client_csvs
from securefkm.flower.spec import RunSpec

PROTECTIONS = {
    "none": [],
    "masking": ["masking"],
    "dp+masking": [{"name": "dp", "epsilon": 2.0, "delta": 1e-5, "clip": 15.0}, "masking"],
}


def make_clients(n_clients: int, n_records: int, seed: int = 0):
    from sklearn.datasets import make_blobs

    X, _ = make_blobs(n_records, centers=5, cluster_std=0.6, n_features=2, random_state=seed)
    perm = np.random.default_rng(seed).permutation(len(X))
    return [X[p] for p in np.array_split(perm, n_clients)]


CLIENT_PROCESSES = {"warm": "1", "cold": "0"}


def run(n_clients=10, n_records=5000, rounds=3, protections=("none", "masking"), stage_timeout=120.0,
        fast_poll=True, seed=0, out=sys.stdout, client_processes=("warm",)) -> list[dict]:
    clients = make_clients(n_clients, n_records, seed)
    params = {"n_clusters": 5, "init_bounds": [-12.0, 12.0], "max_rounds": rounds, "tol": 0.0}
    rows = []
    with tempfile.TemporaryDirectory(prefix="securefkm-bench-") as tmp:
        paths = write_client_csvs(clients, os.path.join(tmp, "data"))
        for mode in client_processes:
            rows += _run_deployment(clients, paths, params, protections, stage_timeout, fast_poll, seed,
                                    os.path.join(tmp, f"flower-{mode}"), mode)
    _print(rows, n_clients, out)
    return rows


def _run_deployment(clients, paths, params, protections, stage_timeout, fast_poll, seed, workdir, mode):
    rows = []
    t0 = time.perf_counter()
    env = {"SECUREFKM_WARM_CLIENTS": CLIENT_PROCESSES[mode]}
    with LocalDeployment(paths, workdir=workdir, fast_poll=fast_poll, env=env) as dep:
        startup = time.perf_counter() - t0
        order = dep.client_order()
        for name in protections:
            spec = RunSpec("dwf", params, PROTECTIONS[name], random_state=seed)
            est = spec.estimator()
            t = time.perf_counter()
            est.fit([clients[i] for i in order])
            local_total = time.perf_counter() - t
            n_local = len(est.transcript_)
            t = time.perf_counter()
            res = dep.run(spec, stage_timeout=stage_timeout, timeout=3600)
            wall = time.perf_counter() - t
            per_local = local_total / max(n_local, 1)
            per_dep = res.rounds_seconds / max(res.n_rounds, 1)
            stages = {}
            for _, stage, secs, _, _ in res.timings:
                stages.setdefault(stage, []).append(secs)
            rows.append({
                "protection": name,
                "client_processes": mode,
                "clients": len(clients),
                "rounds": res.n_rounds,
                "in_process_s_per_round": per_local,
                "deployment_s_per_round": per_dep,
                "ratio": per_dep / per_local if per_local > 0 else float("inf"),
                "deployment_run_wall_s": wall,
                "stage_mean_s": {k: float(np.mean(v)) for k, v in stages.items()},
                "centres_equal": bool(np.array_equal(res.centres, est.cluster_centers_)),
                "startup_s": startup,
            })
    return rows


def _print(rows, n_clients, out):
    print(f"{'protection':<12} {'processes':>9} {'clients':>7} {'rounds':>6} {'in-process s/round':>19} "
          f"{'deployment s/round':>19} {'ratio':>9} {'centres equal':>14}", file=out)
    for r in rows:
        print(f"{r['protection']:<12} {r['client_processes']:>9} {r['clients']:>7} {r['rounds']:>6} {r['in_process_s_per_round']:>19.4f} "
              f"{r['deployment_s_per_round']:>19.2f} {r['ratio']:>9.0f} {str(r['centres_equal']):>14}", file=out)
    for r in rows:
        print(f"  {r['protection']} ({r['client_processes']}): mean seconds per stage "
              + ", ".join(f"{k}={v:.2f}" for k, v in r["stage_mean_s"].items()), file=out)
    for mode in dict.fromkeys(r["client_processes"] for r in rows):
        first = next(r for r in rows if r["client_processes"] == mode)
        print(f"deployment start-up, {mode} ClientApp processes (SuperLink + {n_clients} SuperNodes "
              f"registered): {first['startup_s']:.1f} s", file=out)
    by = {(r["protection"], r["client_processes"]): r for r in rows}
    for name in dict.fromkeys(r["protection"] for r in rows):
        if (name, "warm") in by and (name, "cold") in by:
            w, c = by[name, "warm"], by[name, "cold"]
            print(f"{name}: warm / cold deployment seconds per round = "
                  f"{w['deployment_s_per_round'] / c['deployment_s_per_round']:.3f}", file=out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--records", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--protection", nargs="+", default=["none", "masking"], choices=sorted(PROTECTIONS))
    p.add_argument("--stage-timeout", type=float, default=120.0)
    p.add_argument("--plain-supernode", action="store_true",
                   help="start SuperNodes with plain flower-supernode (3 s idle poll) instead of the fast-poll launcher")
    p.add_argument("--client-processes", nargs="+", default=["warm"], choices=sorted(CLIENT_PROCESSES),
                   help="warm: ClientApp processes forked from a pre-imported server (default); "
                        "cold: Flower's own fresh process per message; both: measured side by side")
    p.add_argument("--json", help="also write the rows as JSON to this path")
    a = p.parse_args(argv)
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    rows = run(a.clients, a.records, a.rounds, a.protection, a.stage_timeout, fast_poll=not a.plain_supernode,
               client_processes=a.client_processes)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
