"""PairwiseMasking over Flower against Flower's own SecAgg+, on the same local deployment.

    python -m benchmarks.deployment_secagg --clients 10 --length 10000 --rounds 3 \
        --client-processes warm cold [--repeats 4]

One :class:`~securefkm.flower.deploy.LocalDeployment` (SuperLink + one SuperNode per client on
127.0.0.1) per ClientApp process mode; on it, back to back, for each configuration:

* **Flower SecAgg+**: the Flower app in ``benchmarks/_flower_secaggplus_app``
  (``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(num_shares, reconstruction_threshold))``
  with ``FedAvg``; ``ClientApp(client_fn, mods=[secaggplus_mod])`` around a ``NumPyClient``
  returning a fixed float32 vector of length ``L``), launched with
  ``flwr run <app> local-deployment --stream --run-config <toml>`` against the deployment's
  ``FLWR_HOME``. The ServerApp times each ``SecAggPlusWorkflow`` call (first message of the
  round to the aggregated result) and checks the FedAvg result against the vector.
* **PairwiseMasking** through securefkm's own app (:meth:`LocalDeployment.run`): EWF
  (equally weighted federated k-means) with ``k = 10`` clusters of ``d = L / k`` features,
  ``init="uniform"`` (no seeding round), ``tol=0`` (no early stop), so its only sum-field is
  the ``k x d`` local centres: the masked vector has ``L + 1`` 64-bit words (``L`` values and
  the check slot). A round is timed from the start of its first stage (``update``) to the
  start of the next round's first stage (server-side progress log), so it includes the
  server's unmasking and aggregation, like Flower's. Checked: the centres equal the
  in-process fit of the same spec bit for bit (the masked sum is exact).

Both sides get the same SuperNodes (0.1 s idle poll), the same server-side poll of the
SuperLink (``--flower-poll``, default 0.05 s = ``FlowerTransport``'s; Flower's own
``send_and_receive`` sleeps 3 s, give ``--flower-poll 0`` to time that too) and the same
ClientApp process mode (``warm``: forked from a pre-imported server, ``cold``: Flower's
fresh ``flwr-clientapp`` per message). Steady state: the first round of each run is skipped;
the round used is the median of the others. Printed: seconds per round and securefkm / Flower.

``--repeats R`` runs every configuration R times in ABBA order (Flower first, then ours first
with the configurations reversed, ...), so drift of the deployment over time favours neither
side, and pools the steady rounds. On Linux each round is also charged the CPU seconds of all
the deployment's processes during it (SuperLink, SuperNodes, SuperExecs, ClientApp and
ServerApp processes; :mod:`benchmarks._tree_cpu`): on a shared machine other jobs move
the wall time of a round but not that CPU time, so ``CPU ours / F`` is the steadier ratio.

Configurations (``n`` nodes): ``sparse`` -- ours ``graph="sparse", neighbours=k`` against
Flower ``num_shares = k + 1`` (each secret has ``k + 1`` holders on both sides), ``complete``
-- ours ``graph="complete"`` against Flower ``num_shares = n``; the reconstruction threshold
is ``floor(2m/3) + 1`` of the ``m`` holders on both sides (our default).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from securefkm.flower.deploy import LocalDeployment, write_client_csvs
from securefkm.flower.spec import RunSpec

#: the Flower app directory of Flower's own SecAgg+ (only a pyproject.toml)
FLOWER_APP_DIR = Path(__file__).resolve().parent / "_flower_secaggplus_app"
CLIENT_PROCESSES = {"warm": "1", "cold": "0"}
N_CLUSTERS = 10


# ------------------------------------------------------------------ pure helpers
def threshold_of(holders: int) -> int:
    """Our default Shamir threshold among ``holders`` (``floor(2m/3) + 1``), used on both sides."""
    return (2 * int(holders)) // 3 + 1


def configurations(n: int, neighbours=(4,), complete: bool = True) -> list[dict]:
    """The compared configurations: label, our protection spec, Flower's num_shares and threshold."""
    out = []
    for k in neighbours:
        k = int(k)
        if not 2 <= k <= n - 2:
            raise ValueError(f"sparse neighbours={k} needs 2 <= k <= n - 2 = {n - 2} (k = n - 1 is the complete graph)")
        out.append({"label": f"sparse k={k}", "protection": [{"name": "masking", "graph": "sparse", "neighbours": k}],
                    "num_shares": k + 1, "threshold": threshold_of(k + 1), "holders": k + 1})
    if complete:
        out.append({"label": "complete", "protection": [{"name": "masking", "graph": "complete"}],
                    "num_shares": n, "threshold": threshold_of(n), "holders": n})
    return out


def ewf_spec(length: int, rounds: int, protection, seed: int = 0, n_clusters: int = N_CLUSTERS) -> RunSpec:
    """EWF spec whose masked sum-field (the k x d local centres) has exactly ``length`` values."""
    if length % n_clusters:
        raise ValueError(f"length {length} must be a multiple of n_clusters={n_clusters} (d = length / k)")
    params = {"n_clusters": n_clusters, "init": "uniform", "init_bounds": [-1.0, 1.0], "max_rounds": int(rounds),
              "tol": 0.0}
    return RunSpec("ewf", params, list(protection), random_state=seed)


def flower_run_config(n: int, length: int, num_shares: int, threshold: int, rounds: int, poll: float,
                      result_path, stage_timeout: float = 300.0) -> dict:
    """Run config of the SecAgg+ app (keys of ``_flower_secaggplus_app/pyproject.toml``)."""
    if not 2 < num_shares <= n:
        raise ValueError(f"num_shares={num_shares} must be in (2, n={n}] (Flower refuses <= 2)")
    if not 2 <= threshold < num_shares:
        raise ValueError(f"threshold={threshold} must be in [2, num_shares={num_shares}) (Flower: less than num_shares)")
    if num_shares < n and num_shares % 2 == 0:
        raise ValueError(f"num_shares={num_shares} < n must be odd (Flower adds one to an even value)")
    return {
        "num-nodes": int(n),
        "length": int(length),
        "num-shares": int(num_shares),
        "reconstruction-threshold": int(threshold),
        "num-rounds": int(rounds),
        "poll-interval": float(poll),
        "stage-timeout": float(stage_timeout),
        "result-path": str(result_path),
    }


def run_config_toml(config: dict) -> str:
    """A ``--run-config`` TOML file body: one ``key = value`` line per item (strings JSON-quoted)."""
    lines = []
    for k, v in config.items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise TypeError(f"run config {k!r}: {v!r} is not a str, int or float")
        lines.append(f"{k} = {json.dumps(v) if isinstance(v, str) else repr(v)}\n")
    return "".join(lines)


def flower_error_bound(num_examples: int = 1, max_weight: float = 1000.0, clipping_range: float = 8.0,
                       quantization_range: int = 2**22) -> float:
    """Largest |FedAvg - vector| Flower's SecAgg+ quantisation allows (values inside +-clipping_range).

    ``secaggplus_mod`` scales each update by ``num_examples / max_weight`` (itself rounded to
    ``1 / quantization_range``) and stochastically rounds it to ``quantization_range`` levels
    over ``[-clipping_range, clipping_range]``; the server divides the scale back out, so one
    level, ``2 * clipping_range / quantization_range``, grows by ``max_weight / num_examples``.
    """
    q_ratio = round(num_examples / max_weight * quantization_range)
    return (2.0 * clipping_range / quantization_range) / (q_ratio / quantization_range)


def round_stamps(events) -> dict[int, tuple[float, float]]:
    """``time.time()`` (start, end) of each round but the last from a ``FlowerTransport`` progress
    log: start of the round's first stage to the start of the next round's first stage."""
    starts: dict[int, float] = {}
    for e in events:
        if e.get("event") == "start":
            starts.setdefault(int(e["round"]), float(e["t"]))
    rs = sorted(starts)
    return {r: (starts[r], starts[nxt]) for r, nxt in zip(rs, rs[1:])}


def round_intervals(events) -> dict[int, float]:
    """Seconds of each round but the last (see :func:`round_stamps`)."""
    return {r: t1 - t0 for r, (t0, t1) in round_stamps(events).items()}


def steady(rounds) -> float:
    """Median of the rounds after the first (the first pays warm-up); the only round if just one."""
    rounds = list(rounds)
    if not rounds:
        raise ValueError("no rounds")
    return statistics.median(rounds[1:]) if len(rounds) > 1 else rounds[0]


# ------------------------------------------------------------------ runs
def make_clients(n: int, records: int, d: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.0, 1.0, (records, d)) for _ in range(n)]


def _stop(proc: subprocess.Popen) -> None:
    """Stop a process we started (its own session) by PID, then its group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # anything left in the group
    except (ProcessLookupError, PermissionError):
        pass


def run_flower(dep: LocalDeployment, config: dict, run_dir: Path, timeout: float) -> dict:
    """One ``flwr run`` of the SecAgg+ app on ``dep``; the ServerApp's result dict."""
    run_dir.mkdir(parents=True, exist_ok=True)
    app_dir = run_dir / "app"
    app_dir.mkdir(exist_ok=True)
    shutil.copy(FLOWER_APP_DIR / "pyproject.toml", app_dir / "pyproject.toml")
    result_path = Path(config["result-path"])
    cfg_path = run_dir / "run_config.toml"
    cfg_path.write_text(run_config_toml(config))
    flwr = shutil.which("flwr", path=dep.environ()["PATH"]) or "flwr"
    log = open(run_dir / "flwr_run.log", "ab")
    try:
        proc = subprocess.Popen([flwr, "run", str(app_dir), "local-deployment", "--stream", "--run-config", str(cfg_path)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=dep.environ(),
                                cwd=dep.workdir, start_new_session=True)
    finally:
        log.close()
    deadline = time.monotonic() + timeout
    exited = None
    try:
        while not result_path.exists():
            if proc.poll() is not None:
                exited = exited or time.monotonic()
                if time.monotonic() - exited > 5.0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"Flower SecAgg+ run did not finish within {timeout:.0f} s; log {run_dir / 'flwr_run.log'}")
            time.sleep(0.1)
    finally:
        _stop(proc)
    if not result_path.exists():
        tail = (run_dir / "flwr_run.log").read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError("Flower SecAgg+ ServerApp wrote no result:\n" + "\n".join(tail))
    res = json.loads(result_path.read_text())
    if not res.get("ok"):
        raise RuntimeError(f"Flower SecAgg+ ServerApp failed: {res.get('error')}\n{res.get('traceback', '')}")
    return res


def run_ours(dep: LocalDeployment, spec: RunSpec, clients, n_features: int, run_dir: Path, stage_timeout: float,
             timeout: float) -> dict:
    """securefkm's app with ``spec`` on ``dep``; per-round seconds and the exactness check."""
    run_dir.mkdir(parents=True, exist_ok=True)
    progress = run_dir / "progress.jsonl"
    res = dep.run(spec, n_features=n_features, stage_timeout=stage_timeout, timeout=timeout, progress_path=progress)
    events = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
    stamps = round_stamps(events)
    order = dep.client_order()
    est = spec.estimator().fit([clients[i] for i in order])
    plain = RunSpec(spec.algorithm, spec.params, [], random_state=spec.random_state).estimator().fit(
        [clients[i] for i in order])
    stages: dict[str, list[float]] = {}
    for _, stage, secs, _, _ in res.timings:
        stages.setdefault(stage, []).append(secs)
    return {
        "rounds_s": [stamps[r][1] - stamps[r][0] for r in sorted(stamps)],
        "rounds_wall": [list(stamps[r]) for r in sorted(stamps)],
        "n_rounds": res.n_rounds,
        "centres_equal_in_process": bool(np.array_equal(res.centres, est.cluster_centers_)),
        "max_abs_vs_unprotected": float(np.max(np.abs(res.centres - plain.cluster_centers_))),
        "errors": dict(res.errors),
        "stage_mean_s": {k: float(np.mean(v)) for k, v in stages.items()},
        "report": res.protection_report,
    }


def run(n: int = 10, length: int = 10_000, rounds: int = 3, records: int = 50, neighbours=(4,), complete: bool = True,
        client_processes=("warm",), flower_poll=(0.05,), repeats: int = 1, stage_timeout: float = 300.0,
        timeout: float = 1800.0, seed: int = 0, out=print) -> list[dict]:
    """Run every configuration ``repeats`` times on one deployment per process mode; print and
    return one row per (process mode, configuration, Flower poll).

    Repeats alternate the order (ABBA: Flower then ours over the configurations, then ours then
    Flower in reverse), so a deployment that drifts over time favours neither side. Each row
    pools the steady rounds of all repeats (median) and, on Linux, the CPU seconds per round of
    every process of the deployment (:mod:`benchmarks._tree_cpu`), which other jobs on a
    shared machine do not inflate.
    """
    import flwr

    from . import _tree_cpu

    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    d = length // N_CLUSTERS
    clients = make_clients(n, records, d, seed)
    configs = configurations(n, neighbours, complete)
    for c in configs:  # refuse a configuration Flower cannot run before starting anything
        for poll in flower_poll:
            flower_run_config(n, length, c["num_shares"], c["threshold"], rounds, poll, "-", stage_timeout)
    out(f"[deployment SecAgg] Flower {flwr.__version__}: n = {n} SuperNodes, vector length L = {length}; "
        f"securefkm: EWF k = {N_CLUSTERS} x d = {d} (masked vector {length + 1} x 64-bit), {rounds + 1} rounds "
        f"({rounds} timed as start-to-next-start); Flower: FedAvg over SecAgg+, {rounds} rounds, float32; "
        f"{repeats} repeat(s) in ABBA order; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    rows: list[dict] = []
    sampler = _tree_cpu.CpuSampler() if _tree_cpu.available() else None

    def cpu_of(walls) -> list[float]:
        return [sampler.between(t0, t1) for t0, t1 in walls] if sampler is not None else []

    with tempfile.TemporaryDirectory(prefix="securefkm-bench-secagg-") as tmp, (sampler or contextlib.nullcontext()):
        paths = write_client_csvs(clients, Path(tmp) / "data")
        for mode in client_processes:
            t0 = time.perf_counter()
            # (config index, "ours" | Flower poll) -> list of per-run results
            runs: dict[tuple[int, object], list[dict]] = {}
            with LocalDeployment(paths, workdir=Path(tmp) / f"flower-{mode}",
                                 env={"SECUREFKM_WARM_CLIENTS": CLIENT_PROCESSES[mode]}) as dep:
                out(f"\n[{mode} ClientApp processes] deployment up in {time.perf_counter() - t0:.1f} s "
                    f"(load average {os.getloadavg()[0]:.1f})")
                for rep in range(repeats):
                    forward = rep % 2 == 0
                    order = list(enumerate(configs)) if forward else list(enumerate(configs))[::-1]
                    for i, c in order:
                        sides = [*flower_poll, "ours"] if forward else ["ours", *flower_poll]
                        for side in sides:
                            tag = f"{mode}-{i}-{side}-{rep}"
                            if side == "ours":
                                spec = ewf_spec(length, rounds + 1, c["protection"], seed)
                                try:
                                    o = run_ours(dep, spec, clients, d, Path(tmp) / "runs" / tag, stage_timeout, timeout)
                                except Exception as exc:
                                    out(f"  {c['label']}: securefkm PairwiseMasking failed: {exc}")
                                    continue
                                o["rounds_cpu_s"], o["repeat"] = cpu_of(o["rounds_wall"]), rep
                                runs.setdefault((i, "ours"), []).append(o)
                                out(f"  [{rep + 1}/{repeats}] {c['label']:<12} securefkm PairwiseMasking m={c['holders']} "
                                    f"t={c['threshold']}: rounds {_secs(o['rounds_s'])} s{_cpu_note(o['rounds_cpu_s'])}; "
                                    f"centres == in-process fit: {o['centres_equal_in_process']}, max |centres - "
                                    f"unprotected| {o['max_abs_vs_unprotected']:.1e}; stages "
                                    + ", ".join(f"{k}={v:.2f}" for k, v in o["stage_mean_s"].items()))
                                continue
                            cfg = flower_run_config(n, length, c["num_shares"], c["threshold"], rounds, side,
                                                    Path(tmp) / f"flower-{tag}.json", stage_timeout)
                            try:
                                f = run_flower(dep, cfg, Path(tmp) / "runs" / tag, timeout)
                            except Exception as exc:  # report and go on
                                out(f"  {c['label']}: Flower SecAgg+ (poll {side}) failed: {exc}")
                                continue
                            f["rounds_cpu_s"], f["repeat"] = cpu_of(f.get("rounds_wall", [])), rep
                            runs.setdefault((i, side), []).append(f)
                            out(f"  [{rep + 1}/{repeats}] {c['label']:<12} Flower SecAgg+ num_shares={c['num_shares']} "
                                f"t={c['threshold']} poll {_poll_name(side)}: rounds {_secs(f['rounds_s'])} s"
                                f"{_cpu_note(f['rounds_cpu_s'])}; max |FedAvg - vector| {f['max_error']:.1e} "
                                f"(<= quantisation bound {flower_error_bound():.1e}: {f['max_error'] <= flower_error_bound()})")
            for i, c in enumerate(configs):
                ours = runs.get((i, "ours"), [])
                for poll in flower_poll:
                    theirs = runs.get((i, poll), [])
                    if ours and theirs:
                        rows.append(_row(mode, c, n, length, poll, theirs, ours))
    _print(rows, out)
    return rows


def _secs(values) -> str:
    return ", ".join(f"{t:.2f}" for t in values)


def _cpu_note(cpu) -> str:
    return f" (CPU {_secs(cpu)} s)" if cpu else ""


def _pooled(results, key: str) -> list[float]:
    """The steady values (all but each run's first round) of every run, pooled."""
    return [v for r in results for v in (r[key][1:] if len(r[key]) > 1 else r[key])]


def _row(mode: str, c: dict, n: int, length: int, poll, theirs: list[dict], ours: list[dict]) -> dict:
    f_rounds, o_rounds = _pooled(theirs, "rounds_s"), _pooled(ours, "rounds_s")
    f_cpu, o_cpu = _pooled(theirs, "rounds_cpu_s"), _pooled(ours, "rounds_cpu_s")
    flower_of = {f.get("repeat"): f for f in theirs}  # a repeat where one side failed has no ratio
    per_repeat = [steady(o["rounds_s"]) / steady(flower_of[o.get("repeat")]["rounds_s"])
                  for o in ours if o.get("repeat") in flower_of]
    row = {"client_processes": mode, "config": c["label"], "n": n, "length": length,
           "num_shares": c["num_shares"], "threshold": c["threshold"], "flower_poll": poll, "repeats": len(per_repeat),
           "flower_rounds_s": f_rounds, "flower_round_s": statistics.median(f_rounds),
           "flower_max_error": max(f["max_error"] for f in theirs),
           "flower_within_quantisation": all(f["max_error"] <= flower_error_bound() for f in theirs),
           "ours_rounds_s": o_rounds, "ours_round_s": statistics.median(o_rounds),
           "ours_exact": all(o["centres_equal_in_process"] for o in ours),
           "ours_max_abs_vs_unprotected": max(o["max_abs_vs_unprotected"] for o in ours),
           "ratio_per_repeat": per_repeat}
    row["ratio"] = row["ours_round_s"] / row["flower_round_s"]
    if f_cpu and o_cpu:
        row.update(flower_round_cpu_s=statistics.median(f_cpu), ours_round_cpu_s=statistics.median(o_cpu))
        row["cpu_ratio"] = row["ours_round_cpu_s"] / row["flower_round_cpu_s"]
    return row


def _poll_name(poll: float) -> str:
    return "3 s (Flower's own)" if poll <= 0 else f"{poll:g} s"


def _print(rows, out) -> None:
    out(f"\n{'processes':>9} {'config':<12} {'Flower poll':>18} {'Flower s/round':>15} {'ours s/round':>13} "
        f"{'ours / Flower':>14} {'per repeat':>18} {'CPU s/round F / ours':>21} {'CPU ours / F':>13} "
        f"{'ours exact':>11} {'Flower max err':>15}")
    for r in rows:
        cpu = (f"{r['flower_round_cpu_s']:.2f} / {r['ours_round_cpu_s']:.2f}", f"{r['cpu_ratio']:.3f}") \
            if "cpu_ratio" in r else ("-", "-")
        out(f"{r['client_processes']:>9} {r['config']:<12} {_poll_name(r['flower_poll']):>18} {r['flower_round_s']:>15.2f} "
            f"{r['ours_round_s']:>13.2f} {r['ratio']:>14.3f} {' '.join(f'{x:.2f}' for x in r['ratio_per_repeat']):>18} "
            f"{cpu[0]:>21} {cpu[1]:>13} {str(r['ours_exact']):>11} {r['flower_max_error']:>15.1e}")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--repeats needs a whole number >= 1, got {text!r}")
    return value


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--length", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=3, help="Flower rounds (ours: one more); the first is skipped")
    p.add_argument("--records", type=int, default=50, help="records per client (ours)")
    p.add_argument("--neighbours", type=int, nargs="*", default=[4],
                   help="sparse-graph degrees k to compare with Flower num_shares = k + 1 (k even)")
    p.add_argument("--no-complete", action="store_true", help="skip the complete graph / num_shares = n configuration")
    p.add_argument("--client-processes", nargs="+", default=["warm"], choices=sorted(CLIENT_PROCESSES))
    p.add_argument("--flower-poll", type=float, nargs="+", default=[0.05],
                   help="Flower ServerApp's poll of the SuperLink in seconds; 0 = Flower's own send_and_receive (3 s)")
    p.add_argument("--repeats", type=_positive_int, default=1,
                   help="run every configuration this many times, alternating the order (ABBA); rows pool the repeats")
    p.add_argument("--stage-timeout", type=float, default=300.0)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run (each side, each configuration)")
    p.add_argument("--json", help="also write the rows as JSON to this path")
    a = p.parse_args(argv)
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    rows = run(a.clients, a.length, a.rounds, a.records, a.neighbours, not a.no_complete, a.client_processes,
               a.flower_poll, a.repeats, a.stage_timeout, a.timeout)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
