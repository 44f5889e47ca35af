"""``python -m benchmarks quality|speed|protocols|scaling [options]``, from a source checkout.

The grouped commands that were ``securefkm bench quality|speed|protocols|scaling`` before the
development benchmarks left the installed package; each module also runs alone
(``python -m benchmarks.<module>``). The attack/defence benchmark is ``securefkm bench attacks``.
"""

from __future__ import annotations

import argparse
import sys

from securefkm.exceptions import SecureFKMError


def _add_sweep(p) -> None:
    p.add_argument("--jobs", type=int, default=1,
                   help="independent configurations run in parallel (1 = serial): quality --part dwf (the other parts "
                        "run serially)")
    p.add_argument("--backend", choices=["processes", "ray"], default="processes",
                   help="where parallel jobs run: worker processes on this machine, or Ray (optional extra; "
                        "RAY_ADDRESS joins a cluster)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                     description="securefkm's development benchmarks (not run in CI; outputs in "
                                                 "docs/benchmarks.md). Run from a source checkout.")
    bsub = parser.add_subparsers(dest="bench", required=True)
    fmt = {"formatter_class": argparse.ArgumentDefaultsHelpFormatter}
    q = bsub.add_parser("quality", help="DWF paper Table 1, Triebe 1-D, Stallmann Table 1 / G2 detection", **fmt)
    q.add_argument("--quick", action="store_true", help="fewer runs and smaller data (minutes, for CI)")
    q.add_argument("--runs", type=int, default=None, help="runs per configuration (default: the papers')")
    q.add_argument("--part", choices=["dwf", "triebe", "fuzzy", "all"], default="all", help="which comparison")
    _add_sweep(q)
    s = bsub.add_parser("speed", help="rounds (DWF, mini-batch, fuzzy; 100 and 10,000 clients) / one scikit-learn "
                                      "Lloyd iteration; masked / plain round and / its cryptography; ideal vs real crypto",
                        **fmt)
    s.add_argument("--repeats", type=int, default=50, help="timed repeats per figure (medians are reported)")
    s.add_argument("--part", choices=["rounds", "masked", "ideal", "all"], default="all",
                   help="rounds: table 1 (vs scikit-learn's Lloyd kernel; 100 and 10,000 clients); masked: tables "
                        "2-3 (real crypto, 1,000 and 10,000 clients: minutes); ideal: crypto='ideal' vs real vs plain")
    pr = bsub.add_parser("protocols", help="masking, Paillier and DP costs and utility", **fmt)
    pr.add_argument("--quick", action="store_true", help="fewer sizes and seeds")
    pr.add_argument("--part", choices=["masking", "paillier", "dp", "deployment", "all"], default="all",
                    help="'all' = masking, paillier, dp; 'deployment' (PairwiseMasking vs Flower's SecAgg+ on a "
                         "local Flower deployment, 21 processes, ~35 min; --quick: one repeat) only when named")
    _add_sweep(pr)
    sc = bsub.add_parser("scaling", help="worker processes and Ray vs one process: masked rounds at 1,000 and 10,000 "
                                         "clients, a 100,000-client fit, cost against clients / records / workers",
                         **fmt)
    sc.add_argument("--quick", action="store_true", help="1,000 clients only, no scale and growth tables")
    return parser


def main(argv=None) -> int:
    from . import main as run_benchmark

    args = build_parser().parse_args(argv)
    try:
        run_benchmark(args)
    except SecureFKMError as exc:
        print(f"python -m benchmarks: error: {exc.for_cli()}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
