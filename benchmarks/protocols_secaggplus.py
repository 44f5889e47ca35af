"""PairwiseMasking against Flower 1.41's SecAgg+ on the same n and vector length.

Run: ``python -m benchmarks.protocols_secaggplus`` (or call :func:`run`). Results and
the commands are recorded in docs/protocols/pairwise-masking.md ("Against Flower's SecAgg+").

What is timed, side by side in one run (same machine, same load, back to back):

* **Flower SecAgg+ (simulation)**: Flower's own legacy-Strategy path --
  ``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(num_shares, reconstruction_threshold))``
  with ``FedAvg`` on the server and ``ClientApp(client_fn, mods=[secaggplus_mod])`` with a
  trivial ``NumPyClient`` returning a fixed float32 vector of length ``L`` -- run by
  ``flwr.simulation.run_simulation(num_supernodes=n)`` (Ray backend) in a child process.
  Each round's ``SecAggPlusWorkflow.__call__`` is timed inside the ServerApp; start-up
  (Ray, node registration, initial parameters) is reported separately. The first round
  also pays Ray's actor warm-up, so the steady-state round is the median of rounds 2..R.
* **Flower SecAgg+ (in-process)**: the very same ServerApp workflow and ClientApp (with
  ``secaggplus_mod``) driven by a minimal in-process :class:`flwr.serverapp.Grid` that
  calls the ClientApp directly, one message after the other: Flower's protocol cost
  without Ray or any transport. This is the stricter denominator.
* **PairwiseMasking**: one :class:`~securefkm.federation.Federation` round (update stage +
  advertise/share/masked_input/unmask) with an in-process transport and a sum-only fake
  algorithm whose single sum-field has length ``L``, ``graph="sparse"`` with the same
  neighbourhood as Flower (``num_shares - 1`` neighbours) and with our default degree, and
  ``graph="complete"``.

Not the same protocol, so the table lists what each side does that the other does not.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from securefkm.algorithms.base import Algorithm, AlgorithmState
from securefkm.messages import Broadcast, FieldSpec, Update

DIFFERENCES = """\
What Flower's SecAgg+ does that PairwiseMasking does not:
  * clips every value to +-clipping_range (8) silently and quantises to 2**22 levels in a 2**32
    ring: 32-bit words, half the keystream and additions of our 64-bit words;
  * masks from a 32-bit seed fed to numpy's MT19937 (cheap, not a cryptographic PRG).
What PairwiseMasking does that Flower's SecAgg+ does not:
  * exact 64-bit fixed point (24 fractional bits), values out of range refused, not clipped;
  * full-entropy 256-bit seeds (SP 800-56C SHA-256 KDF over X25519, os.urandom) expanded with ChaCha20;
  * dropout recovery at every stage (Flower halts on a dropout during setup or share-keys);
  * masks bound to the broadcast digest + check slot (model inconsistency is detected);
  * honest clients refuse both-share and replayed unmask requests;
  * per-client counts inside the masked vector (Flower sends num_examples in clear)."""


# --------------------------------------------------------------------------- our side
class FixedVectorSum(Algorithm):
    """Sum-only fake algorithm: one ``value`` sum-field of length ``L``, one round."""

    name = "bench-fixed-sum"

    def __init__(self, length: int):
        self.length = int(length)
        self.specs = (FieldSpec("v", (self.length,), "value"),)
        self.vector = np.linspace(-1.0, 1.0, self.length)

    def init(self, n_clients, n_features, rng):
        return AlgorithmState(centres=np.zeros((1, n_features)))

    def configure(self, state, round):
        return Broadcast("sum", centres=state.centres, sample="all")

    def sum_fields(self, broadcast):
        return self.specs

    def client_update(self, X, broadcast, rng, memory=None):
        return Update(sums={"v": self.vector.copy()})

    def aggregate(self, state, agg):
        return AlgorithmState(centres=state.centres, round=state.round + 1, extra={"sum": agg.sums["v"], "contributors": agg.contributors})

    def converged(self, state):
        return state.round >= 1


def masking_round(n: int, length: int, graph: str, neighbours: int | None = None, repeats: int = 3) -> dict:
    """Best-of-``repeats`` wall time of one full PairwiseMasking round through Federation."""
    from protocols.masking import PairwiseMasking
    from securefkm.federation.runtime import Federation

    algo = FixedVectorSum(length)
    data = [np.zeros((1, 1)) for _ in range(n)]
    best = best_cpu = float("inf")
    degree = threshold = None
    for r in range(repeats):
        layer = PairwiseMasking(graph=graph, neighbours=neighbours)
        fed = Federation(algo, data, protection=[layer], random_state=r, record="none", backend="local")
        state = algo.init(n, 1, None)
        t0, c0 = time.perf_counter(), time.process_time()
        new = fed.run_round(state, round=0)
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
        assert len(new.extra["contributors"]) == n
        assert np.allclose(new.extra["sum"], n * algo.vector, atol=1e-5 * n)
        plan = layer._plan_cache[2]
        degree, threshold = plan.graph.degree, plan.t_share
    return {"side": "ours", "graph": graph, "n": n, "length": length, "degree": degree, "threshold": threshold, "round_s": best, "round_cpu_s": best_cpu}


# --------------------------------------------------------------------------- Flower side
def fixed_vector(length: int) -> np.ndarray:
    """The float32 vector every Flower client returns (its FedAvg is the vector itself)."""
    return np.linspace(-1.0, 1.0, int(length)).astype(np.float32)


def fixed_vector_client(length: int):
    """A Flower ``Client`` (``NumPyClient``) whose ``fit`` returns :func:`fixed_vector` with weight 1."""
    from flwr.client import NumPyClient

    vector = fixed_vector(length)

    class FixedClient(NumPyClient):
        def get_parameters(self, config):
            return [np.zeros(len(vector), dtype=np.float32)]

        def fit(self, parameters, config):
            return [vector], 1, {}

    return FixedClient().to_client()


def secaggplus_server_main(grid, context, *, n: int, length: int, num_shares, threshold, num_rounds: int,
                           timings: list, timeout: float | None = None) -> None:
    """ServerApp body: ``num_rounds`` FedAvg rounds over ``SecAggPlusWorkflow``, each round timed.

    Appends to ``timings``: per round its wall seconds (float), ``("cpu", s)``,
    ``("start", perf_counter)``, ``("wall", time_start, time_end)`` (``time.time()`` stamps, to
    attribute the CPU of other processes to the round); at the end
    ``("max_error", |FedAvg - vector|_inf)``.
    """
    from flwr.common import ndarrays_to_parameters
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_PARAMS_RECORD

    class TimedSecAggPlus(SecAggPlusWorkflow):
        def __call__(self, grid, context):
            t0, c0, w0 = time.perf_counter(), time.process_time(), time.time()
            timings.append(("start", t0))
            super().__call__(grid, context)
            timings.append(time.perf_counter() - t0)
            timings.append(("cpu", time.process_time() - c0))
            timings.append(("wall", w0, time.time()))

    strategy = FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=n,
        min_available_clients=n,
        initial_parameters=ndarrays_to_parameters([np.zeros(length, dtype=np.float32)]),
    )
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=num_rounds), strategy=strategy)
    workflow = DefaultWorkflow(fit_workflow=TimedSecAggPlus(num_shares=num_shares, reconstruction_threshold=threshold,
                                                            timeout=timeout))
    workflow(grid, legacy)
    # check: FedAvg of identical vectors through SecAgg+ gives the vector back (up to
    # Flower's 2**22-level quantisation of [-8, 8])
    final = legacy.state.array_records[MAIN_PARAMS_RECORD].to_numpy_ndarrays()[0]
    timings.append(("max_error", float(np.max(np.abs(final - fixed_vector(length))))))


def _flower_apps(n: int, length: int, num_shares: int, threshold: int, num_rounds: int, timings: list):
    """ServerApp + ClientApp: FedAvg over SecAgg+ with a fixed-vector NumPyClient."""
    from flwr.client.mod import secaggplus_mod
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp

    def client_fn(context):
        return fixed_vector_client(length)

    client_app = ClientApp(client_fn=client_fn, mods=[secaggplus_mod])
    server_app = ServerApp()

    @server_app.main()
    def main(grid, context):
        secaggplus_server_main(grid, context, n=n, length=length, num_shares=num_shares, threshold=threshold,
                               num_rounds=num_rounds, timings=timings)

    return server_app, client_app, fixed_vector(length)


def _flower_env(home: str) -> dict:
    env = dict(os.environ)
    env.update(FLWR_HOME=home, FLWR_DISABLE_UPDATE_CHECK="1", FLWR_TELEMETRY_ENABLED="0", RAY_DEDUP_LOGS="0")
    return env


def _child_simulation(n: int, length: int, num_shares: int, threshold: int, num_rounds: int, cpus_per_client: float) -> dict:
    from flwr.simulation import run_simulation

    timings: list = []
    server_app, client_app, _ = _flower_apps(n, length, num_shares, threshold, num_rounds, timings)
    t0 = time.perf_counter()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=n,
        backend_config={"client_resources": {"num_cpus": cpus_per_client, "num_gpus": 0.0}},
    )
    total = time.perf_counter() - t0
    rounds = [t for t in timings if isinstance(t, float)]
    err = [t[1] for t in timings if isinstance(t, tuple) and t[0] == "max_error"]
    cpu = [t[1] for t in timings if isinstance(t, tuple) and t[0] == "cpu"]
    return {"total_s": total, "rounds_s": rounds, "rounds_cpu_s": cpu, "max_error": err[0] if err else None}


# -- in-process Grid: Flower's workflow and ClientApp without Ray or a transport
def _child_inprocess(n: int, length: int, num_shares: int, threshold: int, num_rounds: int) -> dict:
    from flwr.app import Context, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID  # as run_simulation does
    timings: list = []
    server_app, client_app, _ = _flower_apps(n, length, num_shares, threshold, num_rounds, timings)
    grid = _DirectGrid(n, client_app)
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    t0 = time.perf_counter()
    server_app(grid, ctx)
    total = time.perf_counter() - t0
    rounds = [t for t in timings if isinstance(t, float)]
    err = [t[1] for t in timings if isinstance(t, tuple) and t[0] == "max_error"]
    cpu = [t[1] for t in timings if isinstance(t, tuple) and t[0] == "cpu"]
    return {"total_s": total, "rounds_s": rounds, "rounds_cpu_s": cpu, "max_error": err[0] if err else None}


class _DirectGrid:
    """Minimal in-process Grid: delivers each message to the ClientApp and returns its reply."""

    def __new__(cls, n, client_app):
        from flwr.app import Context, RecordDict
        from flwr.serverapp import Grid
        from flwr.supercore.run import Run

        class DirectGrid(Grid):
            def __init__(self):
                self._run = Run.create_empty(1)
                self.node_ids = list(range(1, n + 1))
                self.contexts = {
                    nid: Context(run_id=1, node_id=nid, node_config={}, state=RecordDict(), run_config={})
                    for nid in self.node_ids
                }
                self._counter = 0
                self._pending: dict[str, object] = {}

            def set_run(self, run):
                self._run = run

            @property
            def run(self):
                return self._run

            def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
                from flwr.app import Message

                return Message(content=content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

            def get_node_ids(self):
                return list(self.node_ids)

            def _deliver(self, msg):
                # a transport serialises every message: the client must not share (and
                # mutate) the server's RecordDict, so each delivery gets its own copy
                msg = copy.deepcopy(msg)
                self._counter += 1
                md = msg.metadata
                md.__dict__["_message_id"] = f"m{self._counter}"
                md.__dict__["_run_id"] = 1
                md.__dict__["_src_node_id"] = 0
                reply = client_app(msg, self.contexts[md.dst_node_id])
                rmd = reply.metadata
                rmd.__dict__["_src_node_id"] = md.dst_node_id
                return reply

            def push_messages(self, messages):
                ids = []
                for m in messages:
                    r = self._deliver(m)
                    self._pending[r.metadata.reply_to_message_id] = r
                    ids.append(r.metadata.reply_to_message_id)
                return ids

            def pull_messages(self, message_ids):
                return [self._pending.pop(i) for i in message_ids if i in self._pending]

            def send_and_receive(self, messages, *, timeout=None):
                return [self._deliver(m) for m in messages]

        return DirectGrid()


# --------------------------------------------------------------------------- scale
def scale(ns=(1000, 10_000), length: int = 1000, drop: float = 0.1, timeout: float = 7200.0, out=print) -> list[dict]:
    """Full secure rounds, sparse graph (default degree), ``drop`` of the clients dropping
    before masked input, every client simulated in one child process per ``n``
    (``protocols_masking.simulate_round``). Reports wall and CPU seconds, the server's
    share, and the child's peak resident memory (``ru_maxrss``, whole process)."""
    rows = []
    out(f"\n[scale] full secure round, sparse graph, length {length}, {drop:.0%} dropouts before masked input, "
        f"all clients in one process; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    out(f"{'n':>6} {'k':>4} {'t':>4} {'wall s':>8} {'cpu s':>8} {'server s':>9} {'unmask s':>9} {'peak RSS MB':>12}")
    for n in ns:
        cmd = [sys.executable, "-m", "benchmarks.protocols_secaggplus", "--scale-child", str(n), str(length), str(drop)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            so, se = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
            out(f"{n:>6}  did not finish within {timeout:.0f} s")
            continue
        line = [x for x in so.splitlines() if x.startswith("SCALE_RESULT ")]
        if not line:
            out(f"{n:>6}  failed (exit {proc.returncode}): {se[-2000:]}")
            continue
        r = json.loads(line[0].split(" ", 1)[1])
        rows.append(r)
        out(f"{n:>6} {r['degree']:>4} {r['threshold']:>4} {r['wall_s']:>8.1f} {r['cpu_s']:>8.1f} {r['server_total_s']:>9.2f} "
            f"{r['server_unmask_s']:>9.2f} {r['maxrss_mb']:>12.0f}")
    return rows


def _scale_child(argv) -> None:
    import resource

    from benchmarks.protocols_masking import simulate_round

    n, length, drop = int(argv[0]), int(argv[1]), float(argv[2])
    r = simulate_round(n, length, "sparse", drop=drop)
    r["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    sys.stdout.write("\nSCALE_RESULT " + json.dumps(r) + "\n")


def _child_main(argv) -> None:
    mode, n, length, num_shares, threshold, num_rounds = argv[:6]
    n, length, num_shares, threshold, num_rounds = int(n), int(length), int(num_shares), int(threshold), int(num_rounds)
    if mode == "simulation":
        cpus = float(argv[6]) if len(argv) > 6 else 1.0
        res = _child_simulation(n, length, num_shares, threshold, num_rounds, cpus)
    else:
        res = _child_inprocess(n, length, num_shares, threshold, num_rounds)
    sys.stdout.write("\nSECAGGPLUS_RESULT " + json.dumps(res) + "\n")
    sys.stdout.flush()


def flower_round(
    n: int,
    length: int,
    num_shares: int = 11,
    threshold: int = 8,
    num_rounds: int = 3,
    mode: str = "simulation",
    cpus_per_client: float = 1.0,
    timeout: float = 1800.0,
) -> dict:
    """Flower SecAgg+ round times, in a child process (Ray and Flower's logging stay there)."""
    with tempfile.TemporaryDirectory(prefix="flwr-home-") as home:
        cmd = [sys.executable, "-m", "benchmarks.protocols_secaggplus", "--child", mode, str(n), str(length),
               str(num_shares), str(threshold), str(num_rounds), str(cpus_per_client)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=_flower_env(home), start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
            raise RuntimeError(f"Flower SecAgg+ {mode} n={n} L={length} did not finish within {timeout:.0f} s") from None
        finally:
            try:
                os.killpg(proc.pid, 9)  # Ray helper processes left in the child's session, if any
            except (ProcessLookupError, PermissionError):
                pass
    for line in out.splitlines():
        if line.startswith("SECAGGPLUS_RESULT "):
            res = json.loads(line.split(" ", 1)[1])
            break
    else:
        raise RuntimeError(f"Flower SecAgg+ {mode} child failed (exit {proc.returncode}):\n{err[-3000:]}")
    rounds = res["rounds_s"]
    if len(rounds) != num_rounds:
        raise RuntimeError(f"Flower SecAgg+ {mode}: {len(rounds)} of {num_rounds} rounds completed:\n{err[-3000:]}")
    steady = statistics.median(rounds[1:]) if len(rounds) > 1 else rounds[0]
    return {
        "side": "flower",
        "mode": mode,
        "n": n,
        "length": length,
        "num_shares": num_shares,
        "threshold": threshold,
        "rounds_s": rounds,
        "first_round_s": rounds[0],
        "round_s": steady,
        "startup_s": res["total_s"] - sum(rounds),
        "total_s": res["total_s"],
        "max_error": res.get("max_error"),
        # CPU seconds of the child process per round: the whole protocol in-process, only
        # the ServerApp side in simulation (clients run in Ray worker processes)
        "rounds_cpu_s": res.get("rounds_cpu_s"),
        "round_cpu_s": statistics.median(res["rounds_cpu_s"][1:]) if len(res.get("rounds_cpu_s") or []) > 1 else None,
    }


def flower_available() -> bool:
    try:
        import flwr  # noqa: F401
        from flwr.server.workflow import SecAggPlusWorkflow  # noqa: F401
    except Exception:
        return False
    return True


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except Exception:
        return False
    return True


def run(
    n: int = 100,
    length: int = 10_000,
    num_shares: int = 11,
    threshold: int = 8,
    num_rounds: int = 3,
    modes=("simulation", "inprocess"),
    quick: bool = False,
    same_graph: bool = True,
    out=print,
) -> list[dict]:
    """Print Flower SecAgg+ vs PairwiseMasking round times and their ratios (target <= 0.1).

    ``same_graph``: also time Flower's in-process round with each of our configurations'
    neighbourhood (``num_shares = degree + 1``, ``n`` for the complete graph, and our
    threshold), so every row has a like-for-like denominator besides Flower's ``num_shares``.
    """
    if quick:  # one warm-up round + one timed round, Flower's simulation only
        num_rounds, modes, same_graph = 2, tuple(m for m in modes if m == "simulation") or modes[:1], False
    if not flower_available():
        out("Flower (flwr) is not installed: SecAgg+ comparison skipped (pip install 'flwr[simulation]>=1.41,<1.43').")
        return []
    import flwr

    rows: list[dict] = []
    out(f"\n[SecAgg+] Flower {flwr.__version__} SecAgg+ vs PairwiseMasking: n = {n}, vector length {length}, "
        f"Flower num_shares = {num_shares}, reconstruction_threshold = {threshold}; {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}")
    configs = (("sparse", num_shares - 1), ("sparse", None), ("complete", None))
    # our rounds are timed before and after Flower's (other jobs on a shared machine change
    # the load); the ratio uses the slower of the two, i.e. it is conservative
    before = [masking_round(n, length, g, k) for g, k in configs]
    flower: dict[str, dict] = {}
    for mode in modes:
        if mode == "simulation" and not ray_available():
            out("  Flower simulation skipped: Ray is not installed (pip install 'flwr[simulation]>=1.41,<1.43').")
            continue
        try:
            r = flower_round(n, length, num_shares, threshold, num_rounds, mode=mode)
        except Exception as exc:  # report and go on with the other side
            out(f"  Flower {mode}: failed: {exc}")
            continue
        flower[mode] = r
        rows.append(r)
        out(f"  Flower SecAgg+ {mode:>10}: rounds {', '.join(f'{t:.2f}' for t in r['rounds_s'])} s wall "
            f"(steady round {r['round_s']:.2f} s = median of rounds 2..{num_rounds}; CPU of this process "
            f"{r['round_cpu_s']:.2f} s); start-up/other {r['startup_s']:.1f} s; max |FedAvg - vector| {r['max_error']:.1e}")
    same: dict[int, dict] = {}  # our holders (degree + 1) -> Flower in-process with that many shares
    if same_graph:
        for b in before:
            holders = b["degree"] + 1
            if holders == num_shares or holders in same:
                continue
            try:
                r = flower_round(n, length, holders, b["threshold"], 2, mode="inprocess")
            except Exception as exc:
                out(f"  Flower inprocess num_shares={holders}: failed: {exc}")
                continue
            r["mode"] = f"inprocess, num_shares={holders}"
            same[holders] = r
            rows.append(r)
            out(f"  Flower SecAgg+ inprocess num_shares={holders} t={b['threshold']}: rounds "
                f"{', '.join(f'{t:.2f}' for t in r['rounds_s'])} s wall (CPU {r['round_cpu_s']:.2f} s in round 2); "
                f"max |FedAvg - vector| {r['max_error']:.1e}")
        if "inprocess" in flower:
            same[num_shares] = flower["inprocess"]
    after = [masking_round(n, length, g, k) for g, k in configs]
    ours = []
    for b, a in zip(before, after):
        r = dict(a)
        r["round_before_s"], r["round_after_s"] = b["round_s"], a["round_s"]
        r["round_s"] = max(b["round_s"], a["round_s"])
        r["round_cpu_s"] = max(b["round_cpu_s"], a["round_cpu_s"])
        ours.append(r)
    rows.extend(ours)
    cpu_ratio = "inprocess" in flower
    out(f"\n{'PairwiseMasking':>15} {'k':>4} {'t':>4} {'before s':>9} {'after s':>8} {'CPU s':>6}"
        + "".join(f" {'/ Flower ' + m:>20}" for m in flower) + (f" {'CPU / Flower inproc':>20}" if cpu_ratio else "")
        + (f" {'same graph':>10} {'CPU ratio':>10}" if same_graph else ""))
    for r in ours:
        ratios = ""
        for m, f in flower.items():
            r[f"ratio_{m}"] = r["round_s"] / f["round_s"]
            ratios += f" {r[f'ratio_{m}']:>20.3f}"
        if cpu_ratio:
            r["cpu_ratio_inprocess"] = r["round_cpu_s"] / flower["inprocess"]["round_cpu_s"]
            ratios += f" {r['cpu_ratio_inprocess']:>20.3f}"
        f = same.get(r["degree"] + 1)
        if same_graph:
            r["cpu_ratio_same_graph"] = r["round_cpu_s"] / f["round_cpu_s"] if f else None
            ratios += f" {f['num_shares'] if f else '-':>10} {r['cpu_ratio_same_graph'] or float('nan'):>10.3f}"
        out(f"{r['graph']:>15} {r['degree']:>4} {r['threshold']:>4} {r['round_before_s']:>9.3f} {r['round_after_s']:>8.3f} "
            f"{r['round_cpu_s']:>6.2f}{ratios}")
    out("  (target: ratio <= 0.1; our round = update stage + 4 masking stages through Federation, best of 3,\n"
        "   timed before and after Flower's; the wall ratios divide the slower of the two by Flower's steady round;\n"
        "   the CPU ratio (both sides single-process, so robust to other jobs' load) divides CPU seconds;\n"
        "   'same graph': Flower in-process with num_shares = our holders (degree + 1) and our threshold)")
    out(DIFFERENCES)
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child_main(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--scale-child":
        _scale_child(sys.argv[2:])
    else:
        run()
