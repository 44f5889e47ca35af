"""What an idle local deployment costs, and what that does to its rounds.

    python -m benchmarks.deployment_polling --clients 10 --rounds 3 \
        --settings file:0.1 memory:0.1 memory:0.25 memory:0.5 memory:1.0

For each setting ``STATE:POLL`` (``STATE`` = ``file``: the SuperLink's SQLite database in
the work directory, or ``memory``: Flower's in-memory state; ``POLL`` = the SuperNodes'
idle sleep and the SuperExecs' poll interval in seconds, i.e.
:class:`~securefkm.flower.deploy.LocalDeployment`'s ``poll_interval``), one after the other
on one machine: start a deployment of ``--clients`` SuperNodes, wait ``--settle`` seconds
(the warm ClientApp servers import in the background), measure the fraction of all cores
busy over ``--idle`` seconds (``/proc/stat``), fit DWF for ``--rounds`` rounds per
protection, measure the idle fraction again, and print seconds per round.

Linux only (``/proc/stat``). The numbers are for one machine hosting every process; on
separate machines each node's polling costs only its own core.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from securefkm.flower.deploy import LocalDeployment, write_client_csvs
from securefkm.flower.spec import RunSpec
from .deployment import PROTECTIONS, make_clients


def busy_fraction(seconds: float) -> float:
    """Fraction of all cores' time spent busy (not idle/iowait) over ``seconds``."""

    def read():
        with open("/proc/stat") as fh:
            ticks = [int(v) for v in fh.readline().split()[1:]]
        return sum(ticks) - ticks[3] - ticks[4], sum(ticks)

    b0, t0 = read()
    time.sleep(seconds)
    b1, t1 = read()
    return (b1 - b0) / max(1, t1 - t0)


def parse_setting(text: str) -> tuple[str, float]:
    state, _, poll = text.partition(":")
    try:
        seconds = float(poll)
    except ValueError:
        seconds = -1.0
    if state not in ("file", "memory") or not seconds > 0:
        raise argparse.ArgumentTypeError(
            f"setting {text!r}: use STATE:POLL with STATE file or memory and POLL seconds > 0, e.g. memory:0.5")
    return state, seconds


def run(n_clients=10, rounds=3, settings=(("file", 0.1), ("memory", 0.5)), protections=("none", "masking"),
        settle=20.0, idle=8.0, out=sys.stdout) -> list[dict]:
    clients = make_clients(n_clients, 5000, 0)
    params = {"n_clusters": 5, "init_bounds": [-12.0, 12.0], "max_rounds": rounds, "tol": 0.0}
    rows = []
    with tempfile.TemporaryDirectory(prefix="securefkm-polling-") as tmp:
        paths = write_client_csvs(clients, os.path.join(tmp, "data"))
        for i, (state, poll) in enumerate(settings):
            work = os.path.join(tmp, f"deploy-{i}")
            database = os.path.join(work, "state.db") if state == "file" else None
            with LocalDeployment(paths, workdir=work, poll_interval=poll, database=database) as dep:
                time.sleep(settle)
                row = {"state": state, "poll_s": poll, "idle_busy_before": busy_fraction(idle)}
                for prot in protections:
                    spec = RunSpec(algorithm="dwf", params=params, protection=PROTECTIONS[prot], random_state=0)
                    res = dep.run(spec)
                    row[f"{prot}_s_per_round"] = res.rounds_seconds / max(1, res.n_rounds)
                row["idle_busy_after"] = busy_fraction(idle)
            rows.append(row)
            print(f"  {state:>6} poll {poll:g} s: busy while idle {row['idle_busy_before']:.0%} before / "
                  f"{row['idle_busy_after']:.0%} after the runs; "
                  + ", ".join(f"{p} {row[f'{p}_s_per_round']:.2f} s/round" for p in protections), file=out, flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--settings", nargs="+", type=parse_setting, default=[("file", 0.1), ("memory", 0.5)])
    p.add_argument("--protection", nargs="+", default=["none", "masking"], choices=sorted(PROTECTIONS))
    p.add_argument("--settle", type=float, default=20.0, help="seconds between start-up and the first idle measurement")
    p.add_argument("--idle", type=float, default=8.0, help="seconds of each idle measurement")
    a = p.parse_args(argv)
    print(f"[deployment polling] {a.clients} SuperNodes on {os.cpu_count()} cores, DWF {a.rounds} rounds, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    run(a.clients, a.rounds, a.settings, a.protection, a.settle, a.idle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
