"""Benchmark of pairwise masking (protocols.masking): masking cost vs raw keystream,
server unmasking with 10% dropouts, and full simulated secure rounds (sparse graph).

Run: ``python -m benchmarks.protocols_masking`` (or ``python -m benchmarks protocols
--part masking``). Results and the command are recorded in docs/protocols/pairwise-masking.md.

Three tables:

1. *masking / keystream*: one client's masked-input arithmetic (self-mask + one pairwise
   mask per neighbour, expanded with the real ``MaskExpander`` and accumulated with numpy)
   divided by the time this machine takes to produce the same number of keystream bytes
   with the same cipher (one ``Cipher(...).encryptor().update(bytes(n))`` per mask). Target
   <= 1.5. The whole masked-input stage (which also decrypts the neighbours' shares) is
   reported beside it.
2. *server unmasking*: the server's ``result()`` (Shamir reconstruction of the survivors'
   self-mask seeds and of the dropped clients' mask keys, mask removal, decoding) when 10%
   of the clients drop before sending masked input.
3. *full round*: every client and the server simulated in this process, sparse graph,
   10% dropouts; wall seconds, CPU seconds and peak traced memory (tracemalloc).

Configurations whose estimated time exceeds ``time_limit`` seconds are skipped and the
output says so.
"""

from __future__ import annotations

import os
import time
import tracemalloc

import numpy as np

from protocols.masking import PairwiseMasking
from protocols.masking.graph import default_neighbours
from protocols.masking.keys import kdf, x25519_agree, x25519_keypair
from protocols.masking.prg import MaskExpander, keystream_bytes
from securefkm.layers import ClientContext, RoundContext, RunInfo
from securefkm.messages import FieldSpec

STAGES = ("advertise", "share", "masked_input", "unmask")


def _specs(length: int) -> tuple[FieldSpec, ...]:
    # length - 1 words of data + the check slot = length words on the wire
    k = 8
    return (FieldSpec("count", (k,), "count", integer=True), FieldSpec("total", (length - 1 - k,), "sum"))


def _sums(specs, rng):
    return {s.name: (rng.integers(0, 100, s.shape).astype(float) if s.integer else rng.normal(size=s.shape)) for s in specs}


def _degree(n: int, graph: str) -> int:
    if graph == "complete":
        return n - 1
    k = default_neighbours(n)
    return n - 1 if k >= n - 1 else k


def _unit_costs() -> dict:
    """Per-operation costs on this machine (for the time estimates)."""
    sk, _ = x25519_keypair()
    _, pk = x25519_keypair()
    per_pair = per_byte = float("inf")
    seed = os.urandom(32)
    for _ in range(5):  # CPU time, best of 5: robust to other processes on the machine
        t0 = time.process_time()
        for _ in range(100):
            kdf(x25519_agree(sk, pk), b"i")
        per_pair = min(per_pair, (time.process_time() - t0) / 100)
        t0 = time.process_time()
        for _ in range(10):
            keystream_bytes(seed, 8 * 200_000)
        per_byte = min(per_byte, (time.process_time() - t0) / (10 * 8 * 200_000))
    return {"pair": per_pair, "byte": per_byte}


def masking_ratio(n: int, length: int, graph: str, cipher: str = "chacha20", repeats: int = 3) -> dict:
    d = _degree(n, graph)
    seeds = [os.urandom(32) for _ in range(d + 1)]
    vector = np.zeros(length, dtype=np.uint64)
    exp = MaskExpander(length, cipher)
    best_mask = best_ks = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        y = vector.copy()
        exp.add(y, seeds[0], +1)
        for i, s in enumerate(seeds[1:]):
            exp.add(y, s, +1 if i % 2 else -1)
        best_mask = min(best_mask, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for s in seeds:
            keystream_bytes(s, 8 * length, cipher)
        best_ks = min(best_ks, time.perf_counter() - t0)
    return {
        "table": "masking",
        "n": n,
        "graph": graph,
        "length": length,
        "masks": d + 1,
        "mask_s": best_mask,
        "keystream_s": best_ks,
        "ratio": best_mask / best_ks,
    }


def simulate_round(n: int, length: int, graph: str, drop: float = 0.1, trace: bool = False, seed: int = 0) -> dict:
    """One secure round with every client in this process; 10% drop before masked input."""
    rng = np.random.default_rng(seed)
    specs = _specs(length)
    info = RunInfo(algorithm=None, n_clients=n, n_features=1, clients_per_round=n, max_rounds=1, planned_rounds=1)
    ctx = RoundContext(0, 0, "bench", tuple(range(n)), specs, info, b"\x00" * 32)
    layer = PairwiseMasking(graph=graph)
    layer.setup(info)
    dropped = set(rng.choice(n, size=int(drop * n), replace=False).tolist())
    if trace:
        tracemalloc.start()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    layer.before_round(ctx)
    server = layer.server_session(ctx)
    clients = {c: layer.client_session(ClientContext(c, 1), ctx, _sums(specs, rng)) for c in range(n)}
    alive = tuple(range(n))
    stage_client: dict[str, float] = {}
    stage_server: dict[str, float] = {}
    for stage in STAGES:
        t0 = time.perf_counter()
        msgs = server.messages(stage, alive)
        t_srv = time.perf_counter() - t0
        gone = dropped if stage == "masked_input" else set()
        t0 = time.perf_counter()
        replies = {c: clients[c].respond(stage, m) for c, m in msgs.items() if c not in gone}
        stage_client[stage] = (time.perf_counter() - t0) / max(1, len(replies))
        t0 = time.perf_counter()
        server.receive(stage, replies)
        stage_server[stage] = t_srv + time.perf_counter() - t0
        alive = tuple(c for c in alive if c in replies)
    t0 = time.perf_counter()
    sums, contributors = server.result()
    t_result = time.perf_counter() - t0
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    peak = None
    if trace:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert len(contributors) == n - len(dropped)
    return {
        "table": "round",
        "n": n,
        "graph": graph,
        "length": length,
        "degree": server.plan.graph.degree,
        "threshold": server.plan.t_share,
        "dropped": len(dropped),
        "wall_s": wall,
        "cpu_s": cpu,
        "server_unmask_s": t_result,
        "server_total_s": sum(stage_server.values()) + t_result,
        "client_share_s": stage_client["share"],
        "client_masked_input_s": stage_client["masked_input"],
        "peak_mb": None if peak is None else peak / 2**20,
    }


def _estimate_round(n: int, length: int, graph: str, costs: dict) -> float:
    d = _degree(n, graph)
    pairs = n * d * 1.6  # c and s agreements per client (+ server recomputation, KDF, AEAD)
    keystream = n * (d + 2) * 8 * length * costs["byte"]
    return 2.5 * (pairs * costs["pair"] + keystream)


def run(
    n_list=(10, 100, 1000),
    lengths=(1_000, 100_000),
    graphs=("complete", "sparse"),
    full_round=(1000, 10000),
    full_length: int = 1000,
    time_limit: float = 600.0,
    quick: bool = False,
    out=print,
) -> list[dict]:
    if quick:
        n_list, lengths, full_round, time_limit = (10, 100), (1_000,), (1000,), 120.0
    costs = _unit_costs()
    out(
        f"unit costs on this machine: X25519+KDF {costs['pair'] * 1e6:.1f} us/pair, "
        f"ChaCha20 keystream {1 / costs['byte'] / 1e9:.2f} GB/s; time limit {time_limit:.0f} s per configuration"
    )
    rows: list[dict] = []
    out("\n[1] per-client masking time / keystream time (same bytes, same cipher; target <= 1.5)")
    out(f"{'n':>6} {'graph':>8} {'length':>8} {'masks':>6} {'mask ms':>9} {'keystream ms':>12} {'ratio':>6}")
    for n in n_list:
        for graph in graphs:
            for length in lengths:
                r = masking_ratio(n, length, graph)
                rows.append(r)
                out(f"{n:>6} {graph:>8} {length:>8} {r['masks']:>6} {r['mask_s'] * 1e3:>9.2f} {r['keystream_s'] * 1e3:>12.2f} {r['ratio']:>6.2f}")
    out("\n[2] simulated rounds, 10% of clients drop before masked input: server unmasking and per-client stage times")
    out(f"{'n':>6} {'graph':>8} {'length':>8} {'k':>5} {'t':>5} {'unmask s':>9} {'server s':>9} {'cl share ms':>11} {'cl mask ms':>10} {'round s':>8}")
    for n in n_list:
        for graph in graphs:
            for length in lengths:
                est = _estimate_round(n, length, graph, costs)
                if est > time_limit:
                    out(f"{n:>6} {graph:>8} {length:>8}  skipped: estimated {est:.0f} s > limit {time_limit:.0f} s")
                    rows.append({"table": "round", "n": n, "graph": graph, "length": length, "skipped": est})
                    continue
                r = simulate_round(n, length, graph)
                rows.append(r)
                out(
                    f"{n:>6} {graph:>8} {length:>8} {r['degree']:>5} {r['threshold']:>5} {r['server_unmask_s']:>9.3f} "
                    f"{r['server_total_s']:>9.3f} {r['client_share_s'] * 1e3:>11.2f} {r['client_masked_input_s'] * 1e3:>10.2f} {r['wall_s']:>8.2f}"
                )
    out(f"\n[3] full secure round, sparse graph, length {full_length}, 10% dropouts, all clients simulated in one process")
    out(f"{'n':>6} {'k':>5} {'t':>5} {'wall s':>8} {'cpu s':>8} {'server s':>9} {'peak MB':>8}")
    for n in full_round:
        est = _estimate_round(n, full_length, "sparse", costs) * 1.5  # tracemalloc overhead
        if est > time_limit:
            out(f"{n:>6}  skipped: estimated {est:.0f} s > limit {time_limit:.0f} s")
            rows.append({"table": "full", "n": n, "skipped": est})
            continue
        r = simulate_round(n, full_length, "sparse", trace=True)
        r["table"] = "full"
        rows.append(r)
        out(f"{n:>6} {r['degree']:>5} {r['threshold']:>5} {r['wall_s']:>8.1f} {r['cpu_s']:>8.1f} {r['server_total_s']:>9.2f} {r['peak_mb']:>8.1f}")
    return rows


if __name__ == "__main__":
    run()
