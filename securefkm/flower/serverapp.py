"""The securefkm ServerApp: the federation runtime driving Flower SuperNodes.

The ServerApp reads the run spec from the run config, waits until ``num-nodes`` SuperNodes
are connected, maps their sorted node ids to client ids ``0..n-1`` and runs the very same
:class:`~securefkm.federation.Federation` as an in-process fit, with a
:class:`~securefkm.flower.transport.FlowerTransport` instead of the in-process transport.
The result (centres, transcript, privacy spent, per-stage timings, the errors clients
reported) is pickled to the run config's ``result-path`` if one is given.

Run config keys (defaults in ``securefkm/flower/app/pyproject.toml``):

===================  ==========================================================
``spec``             JSON :class:`~securefkm.flower.spec.RunSpec`
``num-nodes``        number of SuperNodes (= clients) to wait for
``n-features``       number of columns of every client's CSV
``stage-timeout``    seconds per protocol stage before silent clients drop
``suspect-timeout``  extra seconds for a node that already missed a deadline
``node-wait-timeout`` seconds to wait for ``num-nodes`` nodes to connect
``poll-interval``    seconds between polls of the SuperLink for replies
``result-path``      where to write the result pickle ("" = do not write)
``progress-path``    JSON-lines progress log ("" = none)
===================  ==========================================================
"""

from __future__ import annotations

import logging
import os
import pickle
import time
import traceback

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ..exceptions import InputError
from .spec import RunSpec, build_federation
from .transport import FlowerTransport

log = logging.getLogger("securefkm.flower")

app = ServerApp()


def wait_for_nodes(grid, n_nodes: int, timeout: float, poll: float = 0.2) -> list[int]:
    """Sorted ids of exactly ``n_nodes`` connected SuperNodes, waiting up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        ids = sorted(int(n) for n in grid.get_node_ids())
        if len(ids) >= n_nodes or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    if len(ids) < n_nodes:
        raise InputError(
            f"only {len(ids)} of num-nodes={n_nodes} SuperNodes connected within {timeout:.0f} s; "
            "start the missing nodes or lower num-nodes."
        )
    if len(ids) > n_nodes:
        raise InputError(
            f"{len(ids)} SuperNodes are connected but num-nodes={n_nodes}; every connected node "
            "is a client, so set num-nodes to the number of nodes (or stop the extra ones)."
        )
    return ids


def run_federation(grid, spec: RunSpec, *, n_nodes: int, n_features: int, stage_timeout: float = 60.0,
                   suspect_timeout: float = 3.0, node_wait_timeout: float = 120.0,
                   poll_interval: float = 0.05, progress_path: str | None = None) -> dict:
    """Run the spec's fit over the Grid and return the result dict (see module docstring)."""
    t0 = time.perf_counter()
    node_ids = wait_for_nodes(grid, n_nodes, node_wait_timeout)
    transport = FlowerTransport(
        grid, node_ids, stage_timeout=stage_timeout, suspect_timeout=suspect_timeout,
        poll_interval=poll_interval, progress_path=progress_path,
    )
    est, federation = build_federation(spec, len(node_ids), n_features, transport)
    t_rounds = time.perf_counter()
    states = [federation.run(r) for r in range(est._n_runs())]
    best = states[est._select_run(states)] if len(states) > 1 else states[0]
    return {
        "ok": True,
        "centres": best.centres,
        "n_iter": int(best.round),
        "federated_score": best.score,
        "transcript": federation.transcript,
        "privacy_spent": federation.privacy_spent(),
        "protection_report": {layer.name: layer.report() for layer in federation.layers},
        "node_ids": node_ids,
        "errors": dict(transport.errors),
        "timings": list(transport.timings),
        "rounds_seconds": time.perf_counter() - t_rounds,
        "total_seconds": time.perf_counter() - t0,
        "spec": spec.to_json(),
    }


def _write_result(path: str, result: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        pickle.dump(result, fh, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    result_path = str(cfg.get("result-path", "") or "")
    try:
        result = run_federation(
            grid,
            RunSpec.from_json(str(cfg["spec"])),
            n_nodes=int(cfg["num-nodes"]),
            n_features=int(cfg["n-features"]),
            stage_timeout=float(cfg.get("stage-timeout", 60.0)),
            suspect_timeout=float(cfg.get("suspect-timeout", 3.0)),
            node_wait_timeout=float(cfg.get("node-wait-timeout", 120.0)),
            poll_interval=float(cfg.get("poll-interval", 0.05)),
            progress_path=str(cfg.get("progress-path", "") or "") or None,
        )
    except Exception as exc:
        log.error("securefkm run failed: %s: %s", type(exc).__name__, exc)
        if result_path:
            _write_result(result_path, {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "error_type": type(exc).__name__,
                "traceback": traceback.format_exc(),
            })
        raise
    if result_path:
        _write_result(result_path, result)
    log.info("securefkm run finished: %d rounds, privacy_spent=%s, client errors=%s",
             len(result["transcript"]), result["privacy_spent"], result["errors"])
