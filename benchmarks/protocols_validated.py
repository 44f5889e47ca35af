"""Benchmark of validated aggregation's cryptographic core (protocols.vdaf): Prio3 over the
ClusterValidity circuit, per client.

Run: ``python -m benchmarks.protocols_validated`` (``--clients N`` reports per configuration,
``--masked`` to also time a simulated pairwise-masked round of 1,000 clients, sparse graph,
with the same vector length for comparison).

For each configuration (k clusters, d features, n_max = 1000, 16-bit widths) it prints the
median per-client time of ``shard`` (the client's prove), each aggregator's ``verify_init``
(query), ``verifier_shares_to_message`` (decide) and ``verify_next``, and the sizes of the
messages each client's report puts on the wire.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from protocols.vdaf import ClusterValidity, Prio3

CONFIGS = ((5, 4), (8, 16))


def measure(k: int, d: int, n_max: int = 1000, width_bits: int = 16, clients: int = 20, seed: int = 0) -> dict:
    import random

    rng = random.Random(seed)
    valid = ClusterValidity(k=k, d=d, n_max=n_max, widths=[2**width_bits] * d)
    v = Prio3.for_circuit(valid, num_proofs=1)
    ctx, vk = b"benchmark", os.urandom(v.VERIFY_KEY_SIZE)
    t_shard, t_v0, t_v1, t_dec, t_next = [], [], [], [], []
    sizes = None
    for _ in range(clients):
        c = [rng.randrange(n_max // k + 1) for _ in range(k)]
        t = [[rng.randrange(c[j] * 2**width_bits + 1) for _ in range(d)] for j in range(k)]
        nonce, rand = os.urandom(v.NONCE_SIZE), os.urandom(v.RAND_SIZE)
        a = time.perf_counter()
        public, shares = v.shard(ctx, (c, t), nonce, rand)
        b = time.perf_counter()
        st0, vs0 = v.verify_init(vk, ctx, 0, None, nonce, public, shares[0])
        c_ = time.perf_counter()
        st1, vs1 = v.verify_init(vk, ctx, 1, None, nonce, public, shares[1])
        d_ = time.perf_counter()
        msg = v.verifier_shares_to_message(ctx, None, [vs0, vs1])
        e = time.perf_counter()
        v.verify_next(ctx, st0, msg)
        v.verify_next(ctx, st1, msg)
        f = time.perf_counter()
        t_shard.append(b - a)
        t_v0.append(c_ - b)
        t_v1.append(d_ - c_)
        t_dec.append(e - d_)
        t_next.append(f - e)
        sizes = {
            "public_share": len(v.encode_public_share(public)),
            "leader_input_share": len(v.encode_input_share(0, shares[0])),
            "helper_input_share": len(v.encode_input_share(1, shares[1])),
            "verifier_share": len(v.encode_verifier_share(vs0)),
            "verifier_message": len(v.encode_verifier_message(msg)),
            "agg_share": len(v.encode_agg_share(v.agg_init(None))),
        }
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    return {"k": k, "d": d, "meas_len": valid.MEAS_LEN, "proof_len": v.flp.PROOF_LEN,
            "chunk_length": valid.chunk_length, "shard_ms": ms(t_shard), "verify_leader_ms": ms(t_v0),
            "verify_helper_ms": ms(t_v1), "decide_ms": ms(t_dec), "verify_next_ms": ms(t_next),
            "total_ms": ms(t_shard) + ms(t_v0) + ms(t_v1) + ms(t_dec) + ms(t_next), **sizes}


def masked_round_ms(length: int, n: int = 1000) -> float:
    """Per-client wall ms of a simulated pairwise-masked round (benchmarks.protocols_masking)."""
    from benchmarks.protocols_masking import simulate_round

    return 1000 * simulate_round(n, length, "sparse")["wall_s"] / n


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=20, help="reports timed per configuration (median taken)")
    ap.add_argument("--masked", action="store_true",
                    help="also time a simulated 1,000-client pairwise-masked round of the same length")
    args = ap.parse_args(argv)
    print("Prio3 + ClusterValidity, n_max=1000, 16-bit widths, 1 proof, Field128; median per client")
    hdr = ("k", "d", "MEAS_LEN", "PROOF_LEN", "chunk", "shard ms", "verify L ms", "verify H ms", "decide ms",
           "total ms", "leader B", "helper B", "public B", "vshare B")
    print(" | ".join(hdr))
    for k, d in CONFIGS:
        r = measure(k, d, clients=args.clients)
        print(" | ".join(str(x) for x in (
            r["k"], r["d"], r["meas_len"], r["proof_len"], r["chunk_length"], f"{r['shard_ms']:.1f}",
            f"{r['verify_leader_ms']:.1f}", f"{r['verify_helper_ms']:.1f}", f"{r['decide_ms']:.2f}",
            f"{r['total_ms']:.1f}", r["leader_input_share"], r["helper_input_share"], r["public_share"],
            r["verifier_share"])))
        if args.masked:
            print(f"  pairwise-masked round, 1000 clients, length {k + k * d}: "
                  f"{masked_round_ms(k + k * d):.1f} ms per client (wall)")


if __name__ == "__main__":
    main()
