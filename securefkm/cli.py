"""The ``securefkm`` command line.

    securefkm demo                      DWF on the non-IID 5-blob set, 100 clients, no server
    securefkm run DIR --algorithm dwf   cluster a directory of client CSV files (one per client)
    securefkm bench quality|speed|protocols|attacks [--quick]
    securefkm deploy ...                the same run between real processes over Flower
    securefkm provision node-key|directory|local   node identity keys and the public directory
    securefkm authority init|serve      the Paillier key authority as its own process
"""

from __future__ import annotations

import argparse
import json
import sys

from .exceptions import SecureFKMError


def _kv(text: str):
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key, value = text.split("=", 1)
    try:
        value = json.loads(value)
    except json.JSONDecodeError:
        pass
    return key.replace("-", "_"), value


def _protection(text: str):
    """'masking,dp:epsilon=1:delta=1e-5:clip=2' or a JSON list."""
    text = text.strip()
    if not text or text == "none":
        return []
    if text.startswith("["):
        return json.loads(text)
    specs = []
    for part in text.split(","):
        name, *params = part.split(":")
        spec = {"name": name}
        for p in params:
            k, v = _kv(p)
            spec[k] = v
        specs.append(spec)
    return specs


def _add_common(p):
    p.add_argument("--protection", type=_protection, default=[],
                   help="protection layers, e.g. 'masking' or 'dp:epsilon=1:delta=1e-5:clip=2,masking' (default none)")
    p.add_argument("--seed", type=int, default=0, help="random_state (default 0)")


def build_parser() -> argparse.ArgumentParser:
    from .registry import ALGORITHM_HELP

    parser = argparse.ArgumentParser(prog="securefkm", description="Privacy-hardened federated clustering.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="DWF on the non-IID 5-blob set with 100 in-process clients")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--plot", default="securefkm-demo.png", help="PNG path ('' for none)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_common(p)

    p = sub.add_parser("run", help="cluster a directory of client CSV files (one file per client)")
    p.add_argument("directory")
    p.add_argument("--algorithm", default="dwf", choices=sorted(ALGORITHM_HELP),
                   help="; ".join(f"{k}: {v}" for k, v in ALGORITHM_HELP.items()))
    p.add_argument("--clusters", "-k", type=int, required=True)
    p.add_argument("--label-column", default=None, help="column holding labels (scored with ARI, not clustered)")
    p.add_argument("--param", type=_kv, action="append", default=[], help="estimator parameter key=value (JSON values)")
    p.add_argument("--out", default=None, help="write centres to this CSV")
    p.add_argument("--plot", default=None, help="PNG of clients and centres (2-D data)")
    _add_common(p)

    p = sub.add_parser("bench", help="benchmarks (not run in CI)")
    bsub = p.add_subparsers(dest="bench", required=True)
    q = bsub.add_parser("quality", help="DWF paper Table 1, Triebe 1-D, Stallmann Table 1 / G2 detection")
    q.add_argument("--quick", action="store_true")
    q.add_argument("--runs", type=int, default=None)
    q.add_argument("--part", choices=["dwf", "triebe", "fuzzy", "all"], default="all")
    s = bsub.add_parser("speed", help="one DWF round (100 clients) / one scikit-learn Lloyd iteration")
    s.add_argument("--repeats", type=int, default=50)
    pr = bsub.add_parser("protocols", help="masking, Paillier and DP costs and utility")
    pr.add_argument("--quick", action="store_true")
    pr.add_argument("--part", choices=["masking", "paillier", "dp", "deployment", "all"], default="all",
                    help="'all' = masking, paillier, dp; 'deployment' (PairwiseMasking vs Flower's SecAgg+ on a "
                         "local Flower deployment, 21 processes, ~35 min; --quick: one repeat) only when named")
    a = bsub.add_parser("attacks", help="algorithms x protections x attacks: leakage next to utility")
    a.add_argument("--quick", action="store_true")
    a.add_argument("--out", default="bench-attacks", help="output directory (CSV, markdown, PNG)")
    a.add_argument("--seeds", type=int, default=None)

    d = sub.add_parser("deploy", help="run over Flower: a local SuperLink and one SuperNode per client CSV")
    d.add_argument("directory", nargs="?", default=None, help="directory of client CSVs (default: demo data)")
    d.add_argument("--algorithm", default="dwf", choices=sorted(ALGORITHM_HELP))
    d.add_argument("--clusters", "-k", type=int, default=5)
    d.add_argument("--clients", type=int, default=3, help="clients when using demo data")
    d.add_argument("--param", type=_kv, action="append", default=[])
    d.add_argument("--timeout", type=float, default=60.0, help="per-stage deadline in seconds")
    _add_common(d)

    from .flower import authority_service, provision

    provision.add_cli(sub)
    authority_service.add_cli(sub)
    return parser


def _run(args, out=print):
    import numpy as np
    from sklearn.metrics import adjusted_rand_score

    from .datasets import FederatedDataset
    from .registry import make_estimator

    data = FederatedDataset.from_csv_dir(args.directory, label_column=args.label_column)
    params = dict(args.param)
    est = make_estimator(args.algorithm, n_clusters=args.clusters, protection=args.protection,
                         random_state=args.seed, verbose=1, **params)
    est.fit(data)
    X = data.pooled()
    out(f"{args.algorithm}: {data.n_clients} clients, {data.n_samples} records, {data.n_features} features")
    out(f"score (inertia/n): {est.inertia_ / len(X):.6g}   rounds: {est.n_iter_}")
    if data.labels is not None:
        out(f"ARI against {args.label_column!r}: {adjusted_rand_score(data.pooled_labels(), est.labels_):.4f}")
    if getattr(est, "privacy_spent_", None) is not None:
        out(f"privacy spent: epsilon={est.privacy_spent_[0]:.4g}, delta={est.privacy_spent_[1]:g}")
    out(est.transcript_.summary())
    if args.out:
        np.savetxt(args.out, est.cluster_centers_, delimiter=",")
        out(f"centres written to {args.out}")
    if args.plot:
        from .plotting import plot_clients_and_centres

        out(f"plot written to {plot_clients_and_centres(data, {args.algorithm: est.cluster_centers_}, args.plot)}")
    return est


def _deploy(args, out=print):
    """``securefkm deploy``: a local SuperLink and one SuperNode per client CSV on 127.0.0.1."""
    from .flower.deploy import deploy

    params = {"n_clusters": args.clusters, **dict(args.param)}
    if args.directory:
        result = deploy(csv_dir=args.directory, algorithm=args.algorithm, params=params,
                        protection=args.protection, random_state=args.seed, stage_timeout=args.timeout)
    else:
        from .datasets import load_dataset

        data = load_dataset("dwf-blobs", split="non-iid", n_clients=args.clients, random_state=args.seed)
        if args.protection and "init" not in params and "init_bounds" not in params:
            # the demo set's public declared box (as in `securefkm demo`): a protected run
            # must not seed from raw records
            params["init_bounds"] = (-2.0, 2.0)
        result = deploy(data, algorithm=args.algorithm, params=params, protection=args.protection,
                        random_state=args.seed, stage_timeout=args.timeout)
    out(result.summary())
    return result


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            from .demo import run_demo

            run_demo(n_clients=args.clients, random_state=args.seed, plot_path=args.plot or None,
                     protection=args.protection, verbose=0 if args.quiet else 1)
        elif args.command == "run":
            _run(args)
        elif args.command == "bench":
            from .bench import main as bench_main

            bench_main(args)
        elif args.command == "deploy":
            _deploy(args)
        elif args.command == "provision":
            from .flower.provision import run_cli

            run_cli(args)
        elif args.command == "authority":
            from .flower.authority_service import run_cli

            run_cli(args)
    except SecureFKMError as exc:
        print(f"securefkm: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
