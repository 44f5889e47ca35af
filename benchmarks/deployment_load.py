"""Load on loopback: N SuperNodes, pairwise masking, one node killed in every round.

    python -m benchmarks.deployment_load --nodes 20 --rounds 5 [--insecure]

Starts a secure local deployment (run CA, SuperLink TLS + SuperNode authentication), fits
DWF with ``PairwiseMasking`` for ``--rounds`` training rounds, and in round ``r`` SIGKILLs
one more SuperNode when its ``masked_input`` stage starts (after it shared its mask
seeds, so the survivors must recover its masks in ``unmask``). Prints per round: seconds,
sampled / contributing clients, and whether the released aggregate is exact, i.e. equals
the plain sum of the contributors' own updates recomputed here from their data (to the
fixed-point codec's resolution); and the peak resident memory (``VmHWM``) of each kind of
process, sampled from ``/proc`` every 0.2 s (short-lived ClientApp processes can finish
between two samples: their figure is a lower bound).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from securefkm.flower.deploy import LocalDeployment, descendants, write_client_csvs
from securefkm.flower.spec import RunSpec

# (substring of the command line, role); first match wins. Warm ClientApp processes are forked
# from the node's fork server and carry its command line (securefkm.flower._superexec).
ROLES = (("flower-superlink", "SuperLink"), ("securefkm.flower._supernode", "SuperNode"),
         ("flower-supernode", "SuperNode"), ("flwr-serverapp", "ServerApp"), ("flwr-clientapp", "ClientApp"),
         ("securefkm.flower._superexec", "node SuperExec + warm ClientApps"),
         ("multiprocessing.forkserver", "node SuperExec + warm ClientApps"),
         ("flower-superexec", "SuperExec"), ("securefkm.cli authority", "key authority"), ("flwr run", "flwr run"))


def _role(cmd: str) -> str:
    for needle, role in ROLES:
        if needle in cmd:
            return role
    return "other"


class MemorySampler:
    """Peak ``VmHWM`` (kB) per process below this one, sampled in a thread."""

    def __init__(self, interval: float = 0.2):
        self.interval = interval
        self.peak: dict[int, tuple[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _loop(self):
        while not self._stop.is_set():
            for pid in descendants(os.getpid()):
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                m = re.search(r"VmHWM:\s+(\d+)", status)
                if m:
                    kb = int(m.group(1))
                    role = _role(cmd)
                    if kb > self.peak.get(pid, (role, 0))[1]:
                        self.peak[pid] = (role, kb)
            self._stop.wait(self.interval)

    def by_role(self) -> dict[str, dict]:
        out: dict[str, list[int]] = {}
        for role, kb in self.peak.values():
            out.setdefault(role, []).append(kb)
        return {r: {"processes": len(v), "max_mb": max(v) / 1024, "median_mb": float(np.median(v)) / 1024}
                for r, v in sorted(out.items())}


def make_clients(n: int, records: int, seed: int = 0):
    from sklearn.datasets import make_blobs

    X, _ = make_blobs(records * n, centers=4, cluster_std=0.7, n_features=2, random_state=seed)
    return [X[i::n].copy() for i in range(n)]


def exactness(result, spec: RunSpec, clients, order) -> list[float]:
    """Per round: max |released aggregate - plain sum of the contributors' updates|."""
    est = spec.estimator()
    algorithm = est._make_algorithm(clients[0].shape[1], len(clients))
    out = []
    for record in result.transcript:
        worst = 0.0
        for key, released in record.aggregate.items():
            want = sum(np.asarray(algorithm.client_update(clients[order[c]], record.broadcasts[c], None, {}).sums[key],
                                  dtype=float) for c in record.contributors)
            worst = max(worst, float(np.max(np.abs(np.asarray(released, dtype=float) - want))))
        out.append(worst)
    return out


def run(nodes: int = 20, rounds: int = 5, records: int = 200, stage_timeout: float = 120.0, secure: bool = True,
        seed: int = 0, out=sys.stdout) -> dict:
    clients = make_clients(nodes, records, seed)
    params = {"n_clusters": 4, "init": "uniform", "init_bounds": [-12.0, 12.0], "max_rounds": rounds, "tol": 0.0}
    # a majority threshold: the protocol must survive the `rounds` nodes killed one per round
    spec = RunSpec("dwf", params, [{"name": "masking", "threshold": nodes // 2 + 1}], random_state=seed)
    killed: dict[int, int] = {}
    with tempfile.TemporaryDirectory(prefix="securefkm-load-") as tmp, MemorySampler() as mem:
        paths = write_client_csvs(clients, Path(tmp) / "data")
        t0 = time.perf_counter()
        with LocalDeployment(paths, workdir=Path(tmp) / "flower", secure=secure) as dep:
            startup = time.perf_counter() - t0

            def on_progress(ev):
                r = ev.get("round", -1)
                if ev["event"] == "start" and ev["stage"] == "masked_input" and r >= 0 and r not in killed:
                    victim = len(killed)  # csv index: nodes 0, 1, 2, ... die in rounds 0, 1, 2, ...
                    dep.kill_node(victim)
                    killed[r] = victim

            t = time.perf_counter()
            result = dep.run(spec, stage_timeout=stage_timeout, timeout=3600, on_progress=on_progress)
            wall = time.perf_counter() - t
            order = dep.client_order()
    errors = exactness(result, spec, clients, order)
    per_round: dict[int, float] = {}
    for rnd, _stage, secs, _n, _r in result.timings:
        if rnd >= 0:
            per_round[rnd] = per_round.get(rnd, 0.0) + secs
    rows = []
    for i, record in enumerate(result.transcript):
        rows.append({"round": record.round, "seconds": per_round.get(i, float("nan")), "sampled": len(record.sampled),
                     "contributors": len(record.contributors), "killed_csv": killed.get(i),
                     "max_abs_error": errors[i], "exact": errors[i] <= 1e-6})
    summary = {"nodes": nodes, "rounds": len(rows), "secure": secure, "startup_s": startup, "run_wall_s": wall,
               "rows": rows, "memory": mem.by_role()}
    _print(summary, out)
    return summary


def _print(s: dict, out) -> None:
    print(f"{s['nodes']} SuperNodes, masking, {'TLS + SuperNode auth' if s['secure'] else 'insecure'}; "
          f"start-up {s['startup_s']:.1f} s, run {s['run_wall_s']:.1f} s", file=out)
    print(f"{'round':>5} {'seconds':>8} {'sampled':>7} {'contrib':>7} {'killed':>6} {'max|err|':>10} {'exact':>5}", file=out)
    for r in s["rows"]:
        k = "-" if r["killed_csv"] is None else f"csv{r['killed_csv']}"
        print(f"{r['round']:>5} {r['seconds']:>8.1f} {r['sampled']:>7} {r['contributors']:>7} {k:>6} "
              f"{r['max_abs_error']:>10.2e} {str(r['exact']):>5}", file=out)
    print("peak resident memory (VmHWM) per kind of process:", file=out)
    for role, m in s["memory"].items():
        print(f"  {role:<14} {m['processes']:>4} process(es)  max {m['max_mb']:7.1f} MB  median {m['median_mb']:7.1f} MB",
              file=out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--records", type=int, default=200, help="records per node")
    p.add_argument("--stage-timeout", type=float, default=120.0)
    p.add_argument("--insecure", action="store_true", help="no TLS / SuperNode authentication")
    p.add_argument("--json", help="also write the summary as JSON here")
    a = p.parse_args(argv)
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    s = run(a.nodes, a.rounds, a.records, a.stage_timeout, secure=not a.insecure)
    if a.json:
        Path(a.json).write_text(json.dumps(s, indent=1, default=str))
    return 0 if all(r["exact"] for r in s["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
