"""The development benchmarks of securefkm: run from a source checkout, not installed.

    python -m benchmarks quality|speed|protocols|scaling [options]   (python -m benchmarks -h)
    python -m benchmarks.<module> [options]                          (e.g. benchmarks.protocols_dp)

Not run in CI; their commands and outputs are in docs/benchmarks.md. A benchmark imports the
library, never the reverse (tests/test_import_contract.py). The attack/defence benchmark is a
library feature: ``securefkm bench attacks`` (attacks/bench.py).
"""

from __future__ import annotations

import os
from pathlib import Path

#: the checkout's root: put on PYTHONPATH so child processes (sweep workers, Ray tasks, the
#: Flower SuperNodes and app processes, the benchmarks' own subprocesses) import ``benchmarks`` too
ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)


def main(args) -> None:
    """Run the benchmark named by ``args.bench`` (the namespace ``python -m benchmarks`` parses)."""
    if args.bench == "speed":
        from .speed import run

        part = getattr(args, "part", "all")
        if part in ("rounds", "masked", "all"):
            run(repeats=args.repeats, parts=("rounds", "masked") if part == "all" else (part,))
        if part in ("ideal", "all"):
            from .speed_ideal import run as run_ideal

            run_ideal()  # crypto="ideal" vs real vs plain, 100 and 1,000 clients
    elif args.bench == "quality":
        if args.part in ("dwf", "all"):
            from .quality import run

            run(quick=args.quick, runs=args.runs, jobs=args.jobs, backend=args.backend)
        if args.part in ("triebe", "all"):
            from .quality_triebe import run as run_triebe

            run_triebe(quick=args.quick)
        if args.part in ("fuzzy", "all"):
            from .quality_fuzzy import run as run_fuzzy

            run_fuzzy(quick=args.quick)
    elif args.bench == "protocols":
        if args.part in ("masking", "all"):
            from .protocols_masking import run as run_masking

            run_masking(quick=args.quick) if _accepts_quick(run_masking) else run_masking()
            from .protocols_secaggplus import run as run_secaggplus

            run_secaggplus(quick=args.quick)
        if args.part in ("paillier", "all"):
            from .protocols_paillier import run as run_paillier

            run_paillier(quick=args.quick) if _accepts_quick(run_paillier) else run_paillier()
        if args.part in ("dp", "all"):
            from .protocols_dp import run as run_dp

            run_dp(quick=args.quick)  # serial: its cells share each data set's reference fit
        if args.part == "deployment":  # starts a SuperLink and 10 SuperNodes: only when asked for
            from .deployment_secagg import run as run_deployment

            run_deployment(rounds=2 if args.quick else 4, repeats=1 if args.quick else 4)
    elif args.bench == "scaling":
        from .scaling import run

        run(sizes=(1_000,) if args.quick else (1_000, 10_000), with_scale=not args.quick, with_growth=not args.quick)
    else:
        raise ValueError(f"unknown benchmark {args.bench!r}: quality, speed, protocols or scaling")


def _accepts_quick(fn) -> bool:
    import inspect

    return "quick" in inspect.signature(fn).parameters
