"""Benchmarks behind ``securefkm bench``. Not run in CI; their commands and outputs are in docs/."""

from __future__ import annotations


def main(args) -> None:
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
    elif args.bench == "attacks":
        from attacks.bench import cli_run

        cli_run(quick=args.quick, out=args.out, seeds=args.seeds, jobs=args.jobs, backend=args.backend,
                datasets=args.datasets, algorithms=args.algorithms, stacks=args.stacks, no_large=args.no_large,
                crypto=args.crypto)


def _accepts_quick(fn) -> bool:
    import inspect

    return "quick" in inspect.signature(fn).parameters
