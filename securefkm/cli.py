"""The ``securefkm`` command line.

    securefkm demo                      one DWF fit unprotected and protected, side by side, no server
    securefkm run DIR --algorithm dwf   cluster a directory of client CSV files (one per client)
    securefkm algorithms                which protections and DP modes each algorithm runs under
    securefkm bench attacks [--quick]   the attack/defence benchmark (development benchmarks:
                                        python -m benchmarks ..., from a source checkout)
    securefkm deploy ...                the same run between real processes over Flower
    securefkm provision node-key|directory|local   node identity keys and the public directory
    securefkm authority init|serve      the Paillier key authority as its own process
"""

from __future__ import annotations

import argparse
import sys
import warnings

from .exceptions import InputError, SecureFKMError


def _kv(text: str):
    from .specs import parse_kv

    try:
        return parse_kv(text)
    except SecureFKMError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _protection(text: str):
    """'masking,dp:epsilon=1:delta=1e-5:clip=2' or a JSON list (grammar: securefkm.specs)."""
    from .specs import parse_protection

    try:
        return parse_protection(text)
    except SecureFKMError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Parser(argparse.ArgumentParser):
    """Every (sub-)command's help shows each option's default (nested parsers inherit it)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


_COLUMNS_HELP = ("refused unless --label-column or --feature-columns says what it is: a header column named "
                 "label, class, target, y, species, category, group, cluster, outcome or diagnosis, or the one "
                 "integer-coded column with at most 20 distinct values in a file of 50 records or more")


def _columns(text: str) -> list:
    """'a,b,c' -> names (integers stay indices)."""
    return [int(c) if c.strip().lstrip("-").isdigit() else c.strip() for c in text.split(",") if c.strip()]


def _add_common(p, default_protection=()):
    p.add_argument("--protection", type=_protection,
                   default=None if default_protection is None else list(default_protection),
                   help="protection layers, comma-separated, parameters after ':' -- e.g. 'masking' or "
                        "'dp:epsilon=1:delta=1e-5:bounds=[-2,2],masking' (dp without mode= ahead of masking or "
                        "paillier: mode=distributed); [] = none")
    p.add_argument("--seed", type=int, default=0, help="random_state: the same seed gives the same run")


def _add_columns(p):
    p.add_argument("--label-column", default=None,
                   help="column holding labels: scored with ARI, never clustered nor sent (name or index)")
    p.add_argument("--feature-columns", type=_columns, default=None,
                   help="comma-separated columns to cluster (names or indices); default: all but the label. "
                        + _COLUMNS_HELP)


def _add_sweep(p):
    p.add_argument("--jobs", type=int, default=1, help="independent configurations run in parallel (1 = serial)")
    p.add_argument("--backend", choices=["processes", "ray"], default="processes",
                   help="where parallel jobs run: worker processes on this machine, or Ray (optional extra; "
                        "RAY_ADDRESS joins a cluster)")


def build_parser() -> argparse.ArgumentParser:
    from .registry import ALGORITHM_HELP

    parser = _Parser(prog="securefkm", description="Privacy-hardened federated clustering.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="the same DWF fit unprotected and under DP + secure aggregation, side by side: "
                                    "utility vs central k-means, records the attacks recover, epsilon",
                       description="--protection replaces the protected column's stack (default: the recommended "
                                   "'dp:epsilon=1:delta=1e-5:bounds=[-2,2]:mode=distributed,masking').")
    p.add_argument("--clients", type=int, default=100, help="number of simulated clients")
    p.add_argument("--plot", default="securefkm-demo.png", help="PNG path ('' for none)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    _add_common(p, default_protection=None)  # None: the recommended stack; [] = none

    sub.add_parser("algorithms", help="which protections and DP modes each algorithm runs under (read from the code)")
    p = sub.add_parser("run", help="cluster a directory of client CSV files (one file per client)")
    p.add_argument("directory", help="directory with one CSV per client (optional header row)")
    p.add_argument("--algorithm", default="dwf", choices=sorted(ALGORITHM_HELP),
                   help="; ".join(f"{k}: {v}" for k, v in ALGORITHM_HELP.items()))
    p.add_argument("--clusters", "-k", type=int, required=True, help="number of clusters")
    _add_columns(p)
    p.add_argument("--param", type=_kv, action="append", default=[],
                   help="estimator parameter key=value, JSON values (repeat), e.g. init_bounds=[-2,2]")
    p.add_argument("--out", default=None, help="write centres to this CSV")
    p.add_argument("--plot", default=None, help="PNG of clients and centres (2-D data)")
    _add_common(p)

    p = sub.add_parser("bench", help="the attack/defence benchmark: securefkm bench attacks (the development "
                                     "benchmarks are python -m benchmarks ..., from a source checkout)")
    bsub = p.add_subparsers(dest="bench", required=True, metavar="attacks")
    a = bsub.add_parser("attacks", help="algorithms x protections x attacks: leakage next to utility")
    a.add_argument("--quick", action="store_true", help="the small CI matrix (minutes)")
    a.add_argument("--out", default="bench-attacks", help="output directory (CSV, markdown, PNG)")
    a.add_argument("--seeds", type=int, default=None, help="seeds per cell (default: 1 quick, 3 full)")
    a.add_argument("--datasets", type=_columns, default=None,
                   help="comma-separated dataset names or labels to keep (e.g. wine,digits-unit/iid)")
    a.add_argument("--algorithms", type=_columns, default=None,
                   help="comma-separated algorithms to keep (e.g. dwf,kfed+secure)")
    a.add_argument("--stacks", type=_columns, default=None, help="comma-separated stack labels to keep")
    a.add_argument("--no-large", action="store_true", help="full mode without the 100,000-record set")
    a.add_argument("--crypto", choices=["real", "ideal"], default="ideal",
                   help="'ideal': the secure aggregators' ideal functionality (the same release, bit for bit, "
                        "at a fraction of the cost); 'real': run their cryptography")
    _add_sweep(a)
    for moved in MOVED_BENCHMARKS:  # hidden: named only to say where they went
        # (prefix_chars without "-": every option of the old command is taken as text, and refused in _bench)
        bsub.add_parser(moved, add_help=False, prefix_chars="+").add_argument(
            "rest", nargs="*", help=f"moved: python -m benchmarks {moved} ... (from a source checkout)")

    d = sub.add_parser("deploy", help="run over Flower: a local SuperLink and one SuperNode per client CSV")
    d.add_argument("directory", nargs="?", default=None, help="directory of client CSVs (default: demo data)")
    d.add_argument("--algorithm", default="dwf", choices=sorted(ALGORITHM_HELP),
                   help="; ".join(f"{k}: {v}" for k, v in ALGORITHM_HELP.items()))
    d.add_argument("--clusters", "-k", type=int, default=5, help="number of clusters")
    d.add_argument("--clients", type=int, default=3, help="clients when using demo data")
    _add_columns(d)
    d.add_argument("--param", type=_kv, action="append", default=[],
                   help="estimator parameter key=value, JSON values (repeat), e.g. init_bounds=[-2,2]")
    d.add_argument("--timeout", type=float, default=60.0, help="per-stage deadline in seconds")
    d.add_argument("--insecure", action="store_true",
                   help="no TLS and no SuperNode authentication (today's loopback behaviour; debugging only)")
    _add_common(d)

    from .flower import authority_service, provision

    provision.add_cli(sub)
    authority_service.add_cli(sub)
    return parser


def _load_csv_dir(args):
    from .datasets import FederatedDataset

    return FederatedDataset.from_csv_dir(args.directory, label_column=args.label_column,
                                         feature_columns=args.feature_columns)


#: estimator parameters the CLI sets through its own flags, not --param
_FLAG_PARAMS = {"n_clusters": "-k / --clusters", "protection": "--protection", "random_state": "--seed",
                "verbose": "(set by the command)"}


def check_params(algorithm: str, params: dict) -> dict:
    """``--param`` names checked against the estimator's signature; a wrong one is refused
    with the list of valid names (and the closest, if any)."""
    import difflib
    import inspect

    from .registry import estimator_class

    cls, fixed = estimator_class(algorithm)
    valid = [n for n in inspect.signature(cls).parameters if n not in fixed and n not in _FLAG_PARAMS]
    for key in params:
        if key in _FLAG_PARAMS:
            raise InputError(f"--param {key}: set it with {_FLAG_PARAMS[key]}, not --param.")
        if key in fixed:
            raise InputError(f"--param {key}: fixed to {fixed[key]!r} by --algorithm {algorithm}; choose another "
                             "--algorithm to change it.")
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=2)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise InputError(f"--param {key}: {algorithm} ({cls.__name__}) has no parameter {key!r}{hint}; "
                             f"valid --param names: {', '.join(valid)}.")
    return params


def resolve_dp_mode(protection, out=print):
    """A ``dp`` layer spec without ``mode=``: ``mode=distributed`` when a secure aggregator
    (masking, paillier) follows it in the stack, else ``central``; the choice is stated in one
    line. Layer objects and specs that name a mode pass unchanged."""
    if not protection:
        return protection
    names = [spec.get("name") if isinstance(spec, dict) else spec for spec in protection]
    resolved = []
    for i, spec in enumerate(protection):
        if isinstance(spec, str) and spec.strip() == "dp":
            spec = {"name": "dp"}
        if isinstance(spec, dict) and spec.get("name") == "dp" and "mode" not in spec:
            after = [n for n in names[i + 1:] if n in ("masking", "paillier")]
            mode = "distributed" if after else "central"
            spec = {**spec, "mode": mode}
            if after:
                out(f"protection: dp without mode= ahead of {after[0]}: mode=distributed (each client adds a share "
                    "of the noise; the server sees only the noisy secure sum). Pass mode=central for noise added "
                    "after aggregation.")
            else:
                out("protection: dp without mode= and no secure aggregator: mode=central (the server receives "
                    "each client's exact update and adds the noise itself).")
        resolved.append(spec)
    return resolved


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    """``warnings.showwarning`` for the CLI: one line, no source path or line number."""
    text = " ".join(str(message).split())
    name = "" if category in (UserWarning, Warning) else f" ({category.__name__})"
    try:
        print(f"securefkm: warning{name}: {text}", file=sys.stderr if file is None else file)
    except OSError:  # pragma: no cover - a closed stream
        pass


def fit_summary(algorithm, data, centres, *, n_iter, privacy_spent, report=None, transcript=None,
                label_column=None) -> list[str]:
    """The lines `run` and `deploy` print after a fit: data, score, rounds, ARI, privacy."""
    from sklearn.metrics import adjusted_rand_score

    from .algorithms._kmeans import assign

    X = data.pooled()
    labels, d2 = assign(X, centres)
    lines = [f"{algorithm}: {data.n_clients} clients, {data.n_samples} records, {data.n_features} features",
             f"score (inertia/n): {d2.sum() / len(X):.6g}   rounds: {n_iter}"]
    if data.labels is not None:
        against = repr(label_column) if label_column is not None else "the data set's labels"
        lines.append(f"ARI against {against}: {adjusted_rand_score(data.pooled_labels(), labels):.4f}")
    if privacy_spent is not None:
        lines.append(f"privacy spent: epsilon={privacy_spent[0]:.4g}, delta={privacy_spent[1]:g}")
    else:
        lines.append("privacy spent: no differential privacy layer (no epsilon guarantee)")
    if report is not None and hasattr(report, "summary"):
        lines.append(report.summary())
    if transcript is not None:
        lines.append(transcript.summary(rounds=False))
    return lines


def _run(args, out=print):
    import numpy as np

    from .registry import make_estimator

    params = check_params(args.algorithm, dict(args.param))
    data = _load_csv_dir(args)
    protection = resolve_dp_mode(args.protection, out)
    est = make_estimator(args.algorithm, n_clusters=args.clusters, protection=protection,
                         random_state=args.seed, verbose=1, **params)
    est.fit(data)
    for line in fit_summary(args.algorithm, data, est.cluster_centers_, n_iter=est.n_iter_,
                            privacy_spent=est.privacy_spent_, report=est.protection_report_,
                            transcript=est.transcript_, label_column=args.label_column):
        out(line)
    if args.out:
        np.savetxt(args.out, est.cluster_centers_, delimiter=",")
        out(f"centres written to {args.out}")
    if args.plot:
        from .plotting import plot_clients_and_centres

        out(f"plot written to {plot_clients_and_centres(data, {args.algorithm: est.cluster_centers_}, args.plot)}")
    return est


def _deploy(args, out=print):
    """``securefkm deploy``: a local SuperLink and one SuperNode per client CSV on 127.0.0.1.

    The client CSVs are read here (label and feature columns chosen as for ``run``) and each
    node gets its feature columns only; the labels stay in this process for the ARI line.
    """
    import time

    from .flower.deploy import deploy

    params = {"n_clusters": args.clusters, **check_params(args.algorithm, dict(args.param))}
    protection = resolve_dp_mode(args.protection, out)
    if args.directory:
        data = _load_csv_dir(args)
    else:
        from .datasets import load_dataset

        data = load_dataset("dwf-blobs", split="non-iid", n_clients=args.clients, random_state=args.seed)
        if protection and "init" not in params and "init_bounds" not in params:
            # the demo set's public declared box (as in `securefkm demo`): a protected run
            # must not seed from raw records
            params["init_bounds"] = (-2.0, 2.0)
    t0 = time.perf_counter()

    def progress(message: str) -> None:
        out(f"[deploy {time.perf_counter() - t0:6.1f} s] {message}")

    result = deploy(data, algorithm=args.algorithm, params=params, protection=protection,
                    random_state=args.seed, stage_timeout=args.timeout, progress=progress,
                    secure=not args.insecure)
    for line in fit_summary(args.algorithm, data, result.centres, n_iter=result.n_iter,
                            privacy_spent=result.privacy_spent, report=result.protection_report,
                            transcript=result.transcript, label_column=args.label_column):
        out(line)
    for c, err in sorted(result.errors.items()):
        out(f"client {c} failed: {err}")
    return result


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    shown = warnings.showwarning
    warnings.showwarning = _one_line_warning
    try:
        return _main(args)
    finally:
        warnings.showwarning = shown


#: ``securefkm bench X`` before the development benchmarks left the package (CHANGELOG)
MOVED_BENCHMARKS = ("quality", "speed", "protocols", "scaling")


def _bench(args) -> None:
    if args.bench in MOVED_BENCHMARKS:
        raise InputError(f"'securefkm bench {args.bench}' is a development benchmark, no longer installed: run from a "
                         f"source checkout of securefkm, at its root: 'python -m benchmarks {args.bench} ...' "
                         "(docs/benchmarks.md); 'securefkm bench attacks' is the installed benchmark.")
    from attacks.bench import cli_run

    cli_run(quick=args.quick, out=args.out, seeds=args.seeds, jobs=args.jobs, backend=args.backend,
            datasets=args.datasets, algorithms=args.algorithms, stacks=args.stacks, no_large=args.no_large,
            crypto=args.crypto)


def _main(args) -> int:
    try:
        if args.command == "demo":
            from .demo import run_demo

            protection = None if args.protection is None else resolve_dp_mode(args.protection)
            run_demo(n_clients=args.clients, random_state=args.seed, plot_path=args.plot or None,
                     protection=protection, verbose=0 if args.quiet else 1)
        elif args.command == "run":
            _run(args)
        elif args.command == "algorithms":
            from .capabilities import to_markdown

            print(to_markdown(), end="")
        elif args.command == "bench":
            _bench(args)
        elif args.command == "deploy":
            _deploy(args)
        elif args.command == "provision":
            from .flower.provision import run_cli

            run_cli(args)
        elif args.command == "authority":
            from .flower.authority_service import run_cli

            run_cli(args)
    except SecureFKMError as exc:
        print(f"securefkm: error: {exc.for_cli()}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
